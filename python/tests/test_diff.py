"""k4.diff / k4.replay / k4.assert_bitexact: the C++ report, the same as k4 diff's."""
import json

import numpy as np
import pytest

import k4
from conftest import cli


def planted_dump(step, path, tensor="rank1/split/outputs/o", flat=35, bit=6):
    """Every stage output of `step` into a dump, one bit of `tensor` flipped."""
    with k4.DumpWriter(path, step.config, step.tokens) as w:
        for p in step.outputs():
            t = step[p]
            if p == "/" + tensor:
                t = t.copy()
                t.reshape(-1)[flat] ^= t.dtype.type(1 << bit)
            w.add(p, t)
    return path


def test_a_clean_dump_from_python_matches(tmp_path, tiny_step, tiny_golden, k4_bin):
    d = planted_dump(tiny_step, tmp_path / "clean.h5", bit=0, flat=0, tensor="none")
    rep = k4.diff(tiny_golden, d)
    assert not rep.any_mismatch() and rep.exit_code() == 0 and not rep.first
    assert rep.tensors_compared == len(tiny_step.outputs())
    assert cli(k4_bin, "diff", tiny_golden, d).returncode == 0


def test_planted_bit_is_located_where_k4_diff_locates_it(tmp_path, tiny_step, tiny_golden, k4_bin):
    d = planted_dump(tiny_step, tmp_path / "bit.h5", flat=2 * 2048 * 8 + 517, bit=6)
    rep = k4.diff(tiny_golden, d)
    r = cli(k4_bin, "diff", tiny_golden, d, "--json", "-")
    assert r.returncode == 1
    fd = json.loads(r.stdout)["first_divergence"]
    f = rep.first
    assert f.found and (f.rank, f.stage, f.tensor) == (fd["rank"], fd["stage"], fd["tensor"]) == (1, "split", "o")
    assert f.index == fd["index"] and f.flat == 2 * 2048 * 8 + 517
    assert f.named_index == {"token": 2, "split": 0, "dim": 517}
    text = cli(k4_bin, "diff", tiny_golden, d)
    assert str(rep) == text.stdout  # exactly k4 diff's text
    assert rep.to_json() == r.stdout
    o = [t for s in rep.stages if (s.stage, s.rank) == ("split", 1) for t in s.tensors if t.name == "o"][0]
    assert (o.status, o.mismatches, o.elements) == ("mismatch", 1, 4 * 8 * 2048)
    assert o.first[0].expected_bits ^ o.first[0].actual_bits == 1 << 6
    assert sum(o.ulp_histogram.values()) == 1
    html = rep.to_html()
    assert html.startswith("<!DOCTYPE html>") and "<svg" in html


def test_replay_names_the_stage_that_is_wrong(tmp_path, tiny_step, tiny_golden, k4_bin):
    d = planted_dump(tiny_step, tmp_path / "bit.h5", flat=517, bit=6)
    rep = k4.replay(tiny_golden, d)
    verdicts = {(s.stage, s.rank): s.verdict for s in rep.stages}
    assert verdicts[("split", 1)] == "this stage is wrong"
    assert verdicts[("split", 0)] == "match"
    assert str(rep) == cli(k4_bin, "replay", tiny_golden, d).stdout


def test_diff_of_a_step_in_memory(tmp_path, tiny_step, tiny_golden):
    d = planted_dump(tiny_step, tmp_path / "bit.h5", tensor="rank0/merge/outputs/attn", flat=9, bit=0)
    rep = k4.diff(tiny_step, d)  # the step is saved to a temporary golden
    assert (rep.first.stage, rep.first.rank, rep.first.tensor, rep.first.flat) == ("merge", 0, "attn", 9)


def test_assert_bitexact_message_is_the_divergence(tiny_step):
    attn = tiny_step["rank0/merge/outputs/attn"]
    k4.assert_bitexact(attn.copy(), attn, name="rank0/merge/outputs/attn")
    bad = attn.copy()
    bad[1, 3] ^= np.uint16(0x8000)  # the sign bit
    with pytest.raises(k4.BitExactError) as e:
        k4.assert_bitexact(bad, attn, name="rank0/merge/outputs/attn")
    assert isinstance(e.value, AssertionError)
    msg = str(e.value)
    assert msg.startswith("rank0/merge/outputs/attn: 1 of 8192 elements differ")
    assert "first divergence: rank 0, stage merge, tensor attn, element [token 1, dim 3] (flat 2051)" in msg
    assert e.value.report.first.named_index == {"token": 1, "dim": 3}
    # plain numpy arrays carry no dims: the schema path names them
    with pytest.raises(k4.BitExactError) as e:
        k4.assert_bitexact(np.asarray(bad), np.asarray(attn), name="rank0/merge/outputs/attn")
    assert "element [token 1, dim 3] (flat 2051)" in str(e.value)


def test_assert_bitexact_is_bits_not_values():
    z = np.array([0.0], np.float32)
    with pytest.raises(k4.BitExactError, match="-0 vs"):
        k4.assert_bitexact(-z, z, name="x")  # -0 != +0
    nan = np.array([np.nan], np.float32)
    k4.assert_bitexact(nan, nan.copy(), name="x")  # the same NaN bits are equal
    with pytest.raises(k4.BitExactError, match="NaN"):
        k4.assert_bitexact(nan.view(np.uint32) | np.uint32(1), nan.view(np.uint32), name="x")
    with pytest.raises(k4.BitExactError, match="shape"):
        k4.assert_bitexact(np.zeros(3, np.uint16), np.zeros(4, np.uint16), name="y")
