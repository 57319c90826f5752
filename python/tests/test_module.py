"""k4 module: configs, steps in memory and from files, the CLI's bytes, storage types."""
import json
import subprocess
import threading

import numpy as np
import pytest

import k4
from conftest import TINY, cli


def test_config_presets_and_json():
    assert set(k4.Config.preset_names()) >= {"minimax-m3-tp4", "small", "tiny"}
    full = k4.Config.preset("minimax-m3-tp4")
    assert (full.hidden, full.heads, full.n_routed, full.tp, full.o_k) == (6144, 16, 128, 4, 2048)
    c = k4.Config.preset("tiny", 2)
    assert c.tp == 2
    again = k4.Config.from_json(c.to_json())
    assert again == c and json.loads(again.to_json())["tp"] == 2
    with pytest.raises(k4.FormatError, match="config lacks field"):
        k4.Config.from_json('{"name": "x"}')
    with pytest.raises(ValueError):
        k4.Config.preset("no-such-preset")


def test_save_is_the_cli_golden(tmp_path, k4_bin, tiny_step, tiny_golden):
    out = tiny_step.save(tmp_path / "py.h5")
    assert subprocess.run(["cmp", str(out), str(tiny_golden)]).returncode == 0


def test_save_matches_the_cli_with_injections(tmp_path, k4_bin):
    opts = dict(tokens=5, q_len=1, context="short,2000,300,long,100", pad_rows=[4], ties=True, special_weights=True)
    step = k4.golden("tiny", tp=2, seed=7, weight_seed=2, **opts)
    step.save(tmp_path / "py.h5")
    r = cli(k4_bin, "golden", "--preset", "tiny", "--tp", 2, "--seed", 7, "--weight-seed", 2, "--tokens", 5, "--q-len", 1,
            "--context", "short,2000,300,long,100", "--pad-rows", 4, "--ties", "--special-weights", "--out", tmp_path / "cli.h5")
    assert r.returncode == 0, r.stderr
    assert subprocess.run(["cmp", str(tmp_path / "py.h5"), str(tmp_path / "cli.h5")]).returncode == 0


def test_memory_and_file_give_the_same_tensors(tiny_step, tiny_golden):
    g = k4.open(tiny_golden)
    assert (g.tp, g.tokens) == (tiny_step.tp, tiny_step.tokens) == (4, 4)
    assert set(tiny_step.paths()) <= set(g.paths())
    for p in tiny_step.paths():
        a, b = tiny_step[p], g[p]
        assert a.k4_dtype == b.k4_dtype and a.dims == b.dims, p
        assert a.dtype == b.dtype and np.array_equal(a.bits, b.bits), p


def test_storage_types_and_decoding(tiny_step):
    kinds = {"bf16": np.uint16, "e4m3": np.uint8, "e8m0": np.uint8, "e2m1x2": np.uint8, "f32": np.uint32, "i32": np.int32,
             "u8": np.uint8}
    seen = set()
    for p in tiny_step.paths():
        t = tiny_step[p]
        assert t.dtype == kinds[t.k4_dtype], p
        seen.add(t.k4_dtype)
    assert seen == set(kinds)
    attn = tiny_step["rank0/merge/outputs/attn"]
    assert attn.dims == ["token", "dim"] and attn.shape == (4, tiny_step.config.o_k)
    v = attn.decoded()
    assert v.dtype == np.float32 and np.isfinite(v).all() and np.abs(v).max() > 0  # not trivial
    assert np.array_equal(v.view(np.uint32) >> 16, attn.bits.astype(np.uint32))   # bf16 = top half of f32
    m = tiny_step["rank0/split/outputs/m"]
    assert np.array_equal(m.decoded().view(np.uint32), m.bits)
    w13 = tiny_step["rank0/moe/inputs/w13"]
    d = w13.decoded()
    assert d.shape[-1] == 2 * w13.shape[-1]
    assert set(np.unique(np.abs(d))) <= {0, 0.5, 1, 1.5, 2, 3, 4, 6}
    assert k4.decode(np.array([0x7F, 0x38], np.uint8), "e4m3")[1] == 1.0


def test_views_by_rank_and_stage(tiny_step):
    st = tiny_step.rank(2).stage("merge")
    assert st.inputs.keys() == ["q8", "o", "m", "l"]
    assert np.array_equal(st.inputs["o"], tiny_step["rank2/split/outputs/o"])  # the link is followed
    assert np.array_equal(tiny_step.rank(2).merge.outputs.attn, tiny_step["/rank2/merge/outputs/attn"])
    with pytest.raises(ValueError, match="the schema has no tensor merge/outputs/nope"):
        tiny_step["rank0/merge/outputs/nope"]
    with pytest.raises(IndexError):
        tiny_step.rank(4)


def test_float32_where_bf16_is_expected_is_refused(tmp_path, tiny_step):
    attn = tiny_step["rank0/merge/outputs/attn"]
    w = k4.DumpWriter(tmp_path / "d.h5", tiny_step.config, tiny_step.tokens)
    with pytest.raises(ValueError, match="bf16 is stored as uint16 bits, got a float32 array"):
        w.add("rank0/merge/outputs/attn", attn.decoded())
    with pytest.raises(ValueError, match=r"shape \(4,8\), expected \(4,"):
        w.add("rank0/merge/outputs/attn", np.zeros((4, 8), np.uint16))
    with pytest.raises(ValueError, match="the schema's dtype is bf16, got a e4m3 tensor"):
        w.add("rank0/merge/outputs/attn", k4.Tensor(np.zeros(attn.shape, np.uint8), "e4m3"))
    with pytest.raises(TypeError):
        k4.Tensor(attn.decoded(), "bf16")
    with pytest.raises(TypeError, match="a e4m3 tensor where bf16 is expected"):
        k4.assert_bitexact(k4.Tensor(np.zeros(attn.shape, np.uint8), "e4m3"), attn, name="rank0/merge/outputs/attn")
    assert not (tmp_path / "d.h5").exists()  # nothing written: close() was never reached


def test_errors_carry_the_cli_message(tmp_path, k4_bin, tiny_golden):
    missing = tmp_path / "none.h5"
    with pytest.raises(k4.FormatError) as e:
        k4.diff(missing, tiny_golden)
    r = cli(k4_bin, "diff", missing, tiny_golden)
    assert r.returncode == 2 and r.stderr.strip() == f"k4 diff: error: {e.value}"
    foreign = tmp_path / "foreign.h5"
    foreign.write_bytes(b"not hdf5 at all" * 100)
    with pytest.raises(k4.FormatError, match="cannot be opened as HDF5"):
        k4.open(foreign)
    with pytest.raises(ValueError, match="unknown scenario option 'tokenz'"):
        k4.golden("tiny", tokenz=3)
    with pytest.raises(ValueError) as e:
        k4.golden("tiny", tokens=3, q_len=2)
    r = cli(k4_bin, "golden", "--preset", "tiny", "--tokens", 3, "--q-len", 2, "--out", tmp_path / "x.h5")
    assert r.returncode == 2 and r.stderr.strip() == f"k4 golden: error: {e.value}"
    with pytest.raises(FileExistsError if False else Exception, match="exists"):
        k4.golden("tiny", **TINY).save(tiny_golden)  # never overwritten without overwrite=True


def test_the_gil_is_released_during_the_model():
    ticks = []
    done = threading.Event()

    def model():
        k4.golden("tiny", tokens=16, context="long")
        done.set()

    t = threading.Thread(target=model)
    t.start()
    while not done.is_set():
        ticks.append(1)
        done.wait(0.001)
    t.join()
    assert len(ticks) > 20  # the main thread ran while the model did


def test_open_reads_a_golden_with_a_weights_file(tmp_path, k4_bin, tiny_golden):
    """k4.open resolves `k4 golden --weights-file` goldens: the same tensors as the self-contained one."""
    ref = tmp_path / "ref.h5"
    r = cli(k4_bin, "golden", "--preset", "tiny", "--tokens", 4, "--context", "1000,short,300,2000", "--seed", 3,
            "--weights-file", tmp_path / "w.h5", "--out", ref)
    assert r.returncode == 0, r.stderr
    a, b = k4.open(tiny_golden), k4.open(ref)
    assert set(a.paths()) == set(b.paths())
    for p in ("rank0/moe/inputs/w13", "rank3/moe/inputs/s2", "rank1/oproj/inputs/w_o", "rank2/moe/outputs/partial"):
        assert np.array_equal(a[p].bits, b[p].bits), p
    assert np.abs(b["rank0/moe/inputs/w13"].bits.astype(np.int64)).sum() > 0  # not the zeros of a missing source
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "ref.h5").write_bytes(ref.read_bytes())
    with pytest.raises(k4.FormatError, match="moved without its weights file"):
        k4.open(moved / "ref.h5")


@pytest.mark.parametrize("variant", [None, "moe.shared_fp8=on"])
def test_save_with_a_weights_file_is_the_cli_golden(tmp_path, k4_bin, variant):
    """Step.save(path, weights_file=FILE): the bytes of `k4 golden --weights-file FILE` with the
    same options, the weights file written (first) and reused (second) alike."""
    opts = ["--preset", "tiny", "--tp", 2, "--tokens", 5, "--context", "long,short,medium,0,2000"]
    if variant:
        opts += ["--variant", variant]
    cli_dir, py_dir = tmp_path / "cli", tmp_path / "py"  # the same names in each: w.h5, g1.h5, g2.h5
    cli_dir.mkdir()
    py_dir.mkdir()
    for seed in (1, 2):  # seed 1 writes the weights file, seed 2 reuses it
        r = cli(k4_bin, "golden", *opts, "--seed", seed, "--weights-file", cli_dir / "w.h5", "--out", cli_dir / f"g{seed}.h5")
        assert r.returncode == 0, r.stderr
        step = k4.golden("tiny", tp=2, variant=variant, seed=seed, tokens=5, context="long,short,medium,0,2000")
        step.save(py_dir / f"g{seed}.h5", weights_file=py_dir / "w.h5")
    for name in ("w.h5", "g1.h5", "g2.h5"):
        assert subprocess.run(["cmp", str(py_dir / name), str(cli_dir / name)]).returncode == 0, name
    assert b'{"path":"w.h5","hash":' in (py_dir / "g2.h5").read_bytes()  # the golden refers to its weights file
    assert np.array_equal(k4.open(py_dir / "g2.h5")["rank1/moe/outputs/partial"].bits,
                          k4.open(cli_dir / "g2.h5")["rank1/moe/outputs/partial"].bits)


def test_save_with_a_weights_file_refuses_other_weights(tmp_path):
    step = k4.golden("tiny", tp=2, seed=1, tokens=4, context="short")
    step.save(tmp_path / "a.h5", weights_file=tmp_path / "w.h5")
    other = k4.golden("tiny", tp=2, seed=1, weight_seed=5, tokens=4, context="short")
    with pytest.raises(ValueError, match="holds other weights than this golden's: weight_seed '1'"):
        other.save(tmp_path / "b.h5", weights_file=tmp_path / "w.h5")
    assert not (tmp_path / "b.h5").exists()
    injected = k4.golden("tiny", tp=2, seed=1, tokens=4, context="short", special_weights=True)
    with pytest.raises(ValueError, match="weights_file: the scenario's weight injections"):
        injected.save(tmp_path / "c.h5", weights_file=tmp_path / "w2.h5")
    assert not (tmp_path / "w2.h5").exists() and not (tmp_path / "c.h5").exists()
