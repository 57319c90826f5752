"""k4.testing: a user's callables over the scenario sweep; the first divergence of each case
names the case, rank, stage and element."""
import numpy as np
import pytest

import k4


def test_the_reference_passes_its_own_sweep():
    rep = k4.testing.sweep(k4.testing.reference(), scenarios="smoke")
    assert rep.ok, str(rep)
    assert len(rep.cases) == 3 and all(c.checked > 0 for c in rep.cases)
    assert "3 of 3 cases bit-exact" in str(rep)


def wrong_merge(inputs, config, rank):
    """The reference's merge with one deliberate fault: rank 2's x_scale of token 1 one ulp up
    when a step has 4 tokens or more."""
    out = k4.stage.merge(config=config, **inputs)
    xs = out["x_scale"].bits.copy()
    if rank == 2 and xs.shape[0] >= 4:
        xs[1] += np.uint32(1)
    return {"attn": out["attn"], "attn8": out["attn8"], "x_scale": xs}


def test_a_wrong_implementation_is_caught_with_case_rank_stage_element():
    impl = dict(k4.testing.reference(), merge=wrong_merge)
    rep = k4.testing.sweep(impl, scenarios="smoke", stages=("index", "merge", "router"))
    print(rep)
    assert [c.ok for c in rep.cases] == [True, False, False]
    f = rep.cases[1].first
    assert (f.case, f.rank, f.stage, f.tensor, f.index) == ("tiny-tp" "preset-S4-ctx1000,short,300,2000-seed1", 2, "merge", "x_scale", {"token": 1})
    assert "rank 2, stage merge, tensor x_scale, element [token 1]" in str(rep)
    with pytest.raises(AssertionError, match=r"first divergence: rank 2, stage merge, tensor x_scale, element \[token 1\]"):
        rep.raise_for_failures()


def test_missing_outputs_and_float_values_are_failures():
    def no_attn8(inputs, config, rank):
        out = k4.stage.merge(config=config, **inputs)
        return {"attn": out["attn"], "x_scale": out["x_scale"]}

    rep = k4.testing.sweep({"merge": no_attn8}, scenarios=[dict(tokens=2, context="1000")], ranks=[0])
    assert not rep.ok and "attn8: not returned" in rep.cases[0].first.text

    def values(inputs, config, rank):
        out = k4.stage.merge(config=config, **inputs)
        return {"attn": out["attn"].decoded(), "attn8": out["attn8"], "x_scale": out["x_scale"]}

    rep = k4.testing.sweep({"merge": values}, scenarios=[dict(tokens=2, context="1000")], ranks=[0])
    assert not rep.ok and "a float32 array, expected uint16 bits" in rep.cases[0].first.text
