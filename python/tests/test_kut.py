"""Kernel-under-test libraries (device/kut/k4_kut.h) from Python: ours and the reference pass
the sweep, the deliberately wrong merge is caught with its case, rank, stage and element."""
import os
import pathlib

import pytest

import k4


def lib(name):
    d = os.environ.get("K4_KUT_DIR") or str(pathlib.Path(k4.__file__).resolve().parents[2] / "kut")
    p = pathlib.Path(d) / f"lib{name}.so"
    if not p.exists():
        pytest.fail(f"{p} is not built (set K4_KUT_DIR)")
    return k4.kut.load(p)


def test_the_reference_library_passes():
    ref = lib("k4_kut_reference")
    assert ref.stages == list(k4.stage_names())
    rep = k4.testing.sweep(ref, scenarios="smoke")
    assert rep.ok, str(rep)
    assert all(c.checked >= 6 * 4 for c in rep.cases)  # every stage's outputs of every rank


def test_our_kernels_pass_through_the_interface():
    ours = lib("k4_kut_ours")  # the device kernels' stage twins (host emulation in the CPU build)
    rep = k4.testing.sweep(ours, scenarios="smoke")
    assert rep.ok, str(rep)
    assert all(c.checked >= 6 * 4 for c in rep.cases)


def test_the_wrong_merge_is_caught():
    wrong = lib("k4_kut_wrong_merge")
    assert wrong.stages == ["merge"]
    rep = k4.testing.sweep(wrong, scenarios="smoke")
    print(rep)
    bad = rep.failures
    assert bad, "the wrong merge passed the sweep"
    for c in bad:
        assert (c.first.stage, c.first.tensor) == ("merge", "x_scale") and "token" in c.first.index
    with pytest.raises(AssertionError, match=r"stage merge, tensor x_scale, element \[token \d+\]"):
        rep.raise_for_failures()


def test_an_implementation_of_no_stage_is_refused():
    with pytest.raises(ValueError, match="provides none of the stages"):
        k4.testing.sweep({}, scenarios="smoke")


def test_a_foreign_library_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot be loaded"):
        k4.kut.load(tmp_path / "none.so")
    with pytest.raises(ValueError, match="exports no k4_kut_get"):
        k4.kut.load("libm.so.6")
