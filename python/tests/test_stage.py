"""k4.stage.<name>: each stage of the reference on given tensors reproduces its stage of a golden."""
import numpy as np
import pytest

import k4

OUTPUTS = {
    "index": ["sparse_table", "blocks", "n_ctx", "long_row"],
    "split": ["q8", "o", "m", "l"],
    "merge": ["attn", "attn8", "x_scale"],
    "oproj": ["partial", "a", "h_mid"],
    "router": ["xn", "xn8", "xsc", "rstd", "logit", "sig", "key"],
    "moe": ["route_ids", "route_weights", "gate", "up", "mid", "mid8", "midsc", "partial", "ar_out"],
}


@pytest.fixture(scope="module")
def long_step():
    # q_len 2 (a request of two rows), a long row (split candidates) and a pad row
    return k4.golden("tiny", seed=5, tokens=6, q_len=2, context="long,900,300", pad_rows=[5])


@pytest.fixture(scope="module")
def selected_golden(tmp_path_factory, long_step):
    """The same step as a file with only the selected KV pages stored (page_ids)."""
    return k4.open(long_step.save(tmp_path_factory.mktemp("sel") / "sel.h5", kv_form="selected"))


@pytest.mark.parametrize("stage", list(OUTPUTS))
@pytest.mark.parametrize("rank", [0, 3])
def test_stage_reproduces_the_golden(long_step, stage, rank):
    out = getattr(k4.stage, stage)(long_step, rank=rank)
    assert sorted(out) == sorted(OUTPUTS[stage])
    for name, t in out.items():
        k4.assert_bitexact(t, long_step[f"rank{rank}/{stage}/outputs/{name}"], name=f"rank{rank}/{stage}/outputs/{name}")
    nonzero = [n for n, t in out.items() if np.any(t.bits != 0)]
    assert nonzero, f"{stage}: every output is all zero (a trivial test)"


@pytest.mark.parametrize("stage", list(OUTPUTS))
def test_stage_from_a_file_with_selected_pages(selected_golden, stage):
    assert "/rank1/split/inputs/page_ids" in selected_golden
    out = getattr(k4.stage, stage)(selected_golden, rank=1)
    for name, t in out.items():
        k4.assert_bitexact(t, selected_golden[f"rank1/{stage}/outputs/{name}"], name=f"rank1/{stage}/outputs/{name}")


def test_an_overridden_input_changes_only_its_token(long_step):
    o = long_step["rank0/merge/inputs/o"].copy()
    o[3, 2, 17] ^= np.uint16(1 << 9)
    out = k4.stage.merge(long_step, rank=0, o=o)
    gold = long_step["rank0/merge/outputs/attn"]
    diff_rows = np.nonzero(np.any(out["attn"].bits != gold.bits, axis=1))[0]
    assert list(diff_rows) == [3]
    with pytest.raises(k4.BitExactError, match=r"token 3, dim 17"):
        k4.assert_bitexact(out["attn"], gold, name="rank0/merge/outputs/attn")


def test_every_input_given_without_a_step(long_step):
    given = {n: long_step[f"rank2/merge/inputs/{n}"] for n in ("o", "m", "l")}
    out = k4.stage.merge(config=long_step.config, **given)
    k4.assert_bitexact(out["x_scale"], long_step["rank2/merge/outputs/x_scale"], name="rank2/merge/outputs/x_scale")


def test_bad_stage_inputs_are_refused(long_step):
    with pytest.raises(ValueError, match="input 'm' is missing"):
        k4.stage.merge(config=long_step.config, o=long_step["rank0/merge/inputs/o"])
    with pytest.raises(ValueError, match="is not an input of the stage"):
        k4.stage.merge(long_step, bogus=1)
    m = long_step["rank0/merge/inputs/m"]
    with pytest.raises(ValueError, match="f32 is stored as uint32 bits, got a float32 array"):
        k4.stage.merge(long_step, m=m.decoded())  # values are never taken for bits
    with pytest.raises(ValueError, match=r"shape \(6,8\), expected \(6,8,"):
        k4.stage.merge(long_step, m=m.bits[:, :, 0].copy())


def test_torch_tensors_in_and_out(long_step):
    torch = pytest.importorskip("torch")
    o = k4.torchx.to_torch(long_step["rank0/merge/inputs/o"])
    assert o.dtype == torch.bfloat16
    out = k4.stage.merge(long_step, rank=0, o=o)
    assert out["attn"].dtype == torch.bfloat16
    assert torch.equal(out["attn"].view(torch.int16), k4.torchx.to_torch(long_step["rank0/merge/outputs/attn"]).view(torch.int16))


def test_router_on_the_f32_gate():
    """router.gate = f32 (V1a): the step lists router/inputs/w_gate_f32 and k4.stage.router reads
    it; the seed's step does not list it; the logits differ from the bf16 gate's."""
    f32 = k4.golden("tiny", tp=2, variant="router.gate=f32,router.round_logit=false", seed=3, tokens=4)
    seed = k4.golden("tiny", tp=2, seed=3, tokens=4)
    assert "/rank1/router/inputs/w_gate_f32" in f32
    assert "/rank1/router/inputs/w_gate_f32" not in seed
    assert "/rank1/router/inputs/w_gate_f32" in f32.paths()
    out = k4.stage.router(f32, rank=1)
    for name in OUTPUTS["router"]:
        k4.assert_bitexact(out[name], f32[f"rank1/router/outputs/{name}"], name=f"rank1/router/outputs/{name}")
    assert np.any(out["logit"].bits != seed["rank1/router/outputs/logit"].bits)
    # without the F32 gate the stage cannot run the variant
    with pytest.raises(Exception, match="w_gate_f32"):
        k4.stage.router(config=f32.config, **{n: f32[f"rank1/router/inputs/{n}"] for n in ("a", "h_in", "g_post", "w_gate", "bias")})


@pytest.mark.parametrize("variant", ["moe.shared_fp8=on", "moe.experts=mxfp8"])
def test_moe_on_the_mxfp8_tables(variant, tmp_path):
    """moe.shared_fp8 (the shared expert from sh_w13 .. sh_s2) and moe.experts = mxfp8 (E4M3
    w13 / w2): k4.stage.moe reproduces the golden's stage, in memory and from the file."""
    step = k4.golden("tiny", tp=2, variant=variant, seed=4, tokens=4, context="1000,short,300,2000")
    f = k4.open(step.save(tmp_path / "g.h5"))
    for src in (step, f):
        out = k4.stage.moe(src, rank=1)
        for name in OUTPUTS["moe"]:
            k4.assert_bitexact(out[name], step[f"rank1/moe/outputs/{name}"], name=f"rank1/moe/outputs/{name}")


def test_moe_without_pad_rows_in_the_wide_experts(tmp_path):
    """moe.wide_live_rows = exclude_pad (V2, aiter): a wide step (S = 6) with a pad row. The stage
    reads its live rows from moe/inputs/seq_lens (a link to /inputs/seq_lens, held only under
    exclude_pad) and reproduces the golden, in memory and from the file; with every row live
    (seq_lens of no pad row) the pad row's routed slots are computed and the outputs differ."""
    step = k4.golden("tiny", tp=2, variant="aiter", seed=6, tokens=6, context="1000,300,2000,900,short,700", pad_rows=[2])
    seed = k4.golden("tiny", tp=2, seed=6, tokens=6, context="1000,300,2000,900,short,700", pad_rows=[2])
    assert "/rank1/moe/inputs/seq_lens" in step.paths()
    assert "/rank1/moe/inputs/seq_lens" not in seed.paths()
    f = k4.open(step.save(tmp_path / "g.h5"))
    assert "/rank1/moe/inputs/seq_lens" in f
    for src in (step, f):
        out = k4.stage.moe(src, rank=1)
        for name in OUTPUTS["moe"]:
            k4.assert_bitexact(out[name], step[f"rank1/moe/outputs/{name}"], name=f"rank1/moe/outputs/{name}")
    every_row = np.asarray(step["rank1/moe/inputs/seq_lens"]).copy()
    every_row[2] = 1
    moved = k4.stage.moe(step, rank=1, seq_lens=every_row)
    assert np.any(moved["gate"].bits != step["rank1/moe/outputs/gate"].bits)
