"""k4.Weights.from_tensors: a layer from per-rank tensors by schema name, checked against the
schema; weights taken from a golden's own tensors give that golden's bytes again."""
import subprocess

import numpy as np
import pytest

import k4
from conftest import TINY


def weight_paths(step):
    """The weight rows of the schema (stage inputs of oproj / router / moe stored in the file)."""
    rows = {(r["group"], r["name"]) for r in k4.schema()
            if r["group"] in ("oproj/inputs", "router/inputs", "moe/inputs") and r["link"] == ""}
    out = []
    for p in step.paths():
        q = p.lstrip("/")
        if q.startswith("rank"):
            rank, group = q.split("/", 1)
            g, name = group.rsplit("/", 1)
            if (g, name) in rows:
                out.append(q)
    return out


@pytest.fixture(scope="module")
def golden_tensors(tiny_golden):
    g = k4.open(tiny_golden)
    return g, {p: g[p] for p in weight_paths(g)}


def test_a_golden_s_weights_give_its_bytes(tmp_path, tiny_golden, golden_tensors):
    g, tensors = golden_tensors
    assert len(tensors) == g.tp * 10  # w_o s_o g_post w_gate bias expert_ids w13 s13 w2 s2
    w = k4.Weights.from_tensors(g.config, tensors, source="synthetic", seed=1)
    k4.run(w, k4.inputs(w, seed=3, **TINY)).save(tmp_path / "again.h5")
    assert subprocess.run(["cmp", tmp_path / "again.h5", tiny_golden]).returncode == 0
    # plain numpy arrays of the storage type (no k4.Tensor), f32 given as float32 values
    plain = {p: (np.asarray(t).view(np.float32) if t.k4_dtype == "f32" else np.asarray(t)) for p, t in tensors.items()}
    w2 = k4.Weights.from_tensors(g.config, plain)
    assert w2.source == "tensors"
    step = k4.run(w2, k4.inputs(w2, seed=3, **TINY))
    assert not k4.diff(tiny_golden, step).any_mismatch()


def test_a_changed_bit_changes_the_step(golden_tensors, tiny_golden):
    """The weights given are the ones run: one bit of rank 2's w_o moves its o_proj output."""
    g, tensors = golden_tensors
    t = dict(tensors)
    w_o = np.array(t["rank2/oproj/inputs/w_o"])
    w_o[5, 7] ^= 0x01
    t["rank2/oproj/inputs/w_o"] = w_o
    w = k4.Weights.from_tensors(g.config, t)
    rep = k4.diff(tiny_golden, k4.run(w, k4.inputs(w, seed=3, **TINY)))
    assert rep.any_mismatch()
    assert "rank 2, stage oproj" in str(rep.first) or rep.first.rank == 2


def expect(msg, cfg, tensors):
    with pytest.raises(ValueError) as e:
        k4.Weights.from_tensors(cfg, tensors)
    assert msg in str(e.value), str(e.value)


def test_bad_tensors_are_refused_naming_them(golden_tensors):
    g, tensors = golden_tensors
    cfg = g.config
    t = dict(tensors)
    t["rank1/router/inputs/g_post"] = k4.Tensor(tensors["rank1/router/inputs/g_post"], "bf16").decoded()  # float32 values
    expect("rank1/router/inputs/g_post: bf16 is stored as uint16 bits, got a float32 array", cfg, t)
    t = dict(tensors)
    t["rank0/oproj/inputs/w_o"] = np.ascontiguousarray(np.asarray(tensors["rank0/oproj/inputs/w_o"])[:, :-1])
    expect("rank0/oproj/inputs/w_o has shape (2048,2047), expected dtype e4m3, shape (2048,2048) (hidden,dim)", cfg, t)
    t = dict(tensors)
    del t["rank3/router/inputs/bias"]
    expect("rank3/router/inputs/bias is missing", cfg, t)
    t = dict(tensors)
    t["rank0/merge/outputs/attn"] = np.zeros((4, 512), np.uint16)
    expect("'rank0/merge/outputs/attn' is not a weight", cfg, t)
    t = dict(tensors)
    t["rank4/oproj/inputs/s_o"] = tensors["rank0/oproj/inputs/s_o"]
    expect("rank 4 is outside 0..3", cfg, t)
    t = dict(tensors)
    t["rank0/oproj/inputs/w_o"] = k4.Tensor(np.asarray(tensors["rank0/oproj/inputs/w_o"]), "u8")
    expect("rank0/oproj/inputs/w_o: a u8 tensor where e4m3 is expected", cfg, t)
    t = dict(tensors)
    ids = np.array(tensors["rank0/moe/inputs/expert_ids"])
    ids[0] = ids[1]
    t["rank0/moe/inputs/expert_ids"] = ids
    expect(f"rank0/moe/inputs/expert_ids[1] = {ids[1]} is listed twice", cfg, t)
    t = dict(tensors)
    t["rank0/moe/inputs/sh_w13"] = np.zeros((1, 256, 2048), np.uint8)
    expect("stores no sh_w13 (moe.shared_fp8 only", cfg, t)


def test_an_expert_not_given_is_named_when_the_step_routes_to_it(golden_tensors):
    g, tensors = golden_tensors
    t = dict(tensors)
    ids = np.asarray(tensors["rank1/moe/inputs/expert_ids"])
    drop = int(ids[0])  # a routed expert (the shared one is last)
    for name in ("expert_ids", "w13", "s13", "w2", "s2"):
        t[f"rank1/moe/inputs/{name}"] = np.ascontiguousarray(np.asarray(tensors[f"rank1/moe/inputs/{name}"])[1:])
    w = k4.Weights.from_tensors(g.config, t)
    with pytest.raises(ValueError, match=f"routes rank 1 to expert {drop}, which rank1/moe/inputs/expert_ids does not list"):
        k4.run(w, k4.inputs(w, seed=3, **TINY))


@pytest.mark.parametrize("variant", ["moe.shared_fp8=on", "moe.experts=mxfp8", "router.gate=f32"])
def test_the_variant_tables_round_trip(variant, tmp_path):
    """The MXFP8 shared expert (sh_w13 .. sh_s2), MXFP8 experts (E4M3 w13 / w2) and the F32
    router gate (w_gate_f32) too."""
    opts = dict(tokens=2, context="1000,short")
    first = k4.golden("tiny", tp=2, variant=variant, seed=6, **opts)
    first.save(tmp_path / "first.h5")
    g = k4.open(tmp_path / "first.h5")
    tensors = {p: g[p] for p in weight_paths(g)}
    assert any("/sh_w13" in p for p in tensors) == (variant == "moe.shared_fp8=on")
    assert any("/w_gate_f32" in p for p in tensors) == (variant == "router.gate=f32")
    for p, t in tensors.items():  # the step in memory holds what its file holds
        assert first[p].k4_dtype == t.k4_dtype and np.array_equal(np.asarray(first[p]), np.asarray(t)), p
    # the config's dtypes, in memory and from the file (E4M3 w13 / w2 under moe.experts = mxfp8)
    want = "e4m3" if variant == "moe.experts=mxfp8" else "e2m1x2"
    assert first["rank1/moe/inputs/w13"].k4_dtype == g["rank1/moe/inputs/w13"].k4_dtype == want
    assert first["rank1/moe/inputs/w2"].k4_dtype == g["rank1/moe/inputs/w2"].k4_dtype == want
    with k4.DumpWriter(tmp_path / "dump.h5", g.config, g.tokens) as dw:
        dw.add("rank1/moe/inputs/w13", g["rank1/moe/inputs/w13"])
    assert k4.open(tmp_path / "dump.h5")["rank1/moe/inputs/w13"].k4_dtype == want
    w = k4.Weights.from_tensors(g.config, tensors, source="synthetic", seed=1)
    k4.run(w, k4.inputs(w, seed=6, **opts)).save(tmp_path / "again.h5")
    assert subprocess.run(["cmp", tmp_path / "again.h5", tmp_path / "first.h5"]).returncode == 0
