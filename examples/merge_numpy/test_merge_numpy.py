"""The numpy merge (merge_numpy.py) checked bit for bit against the reference's goldens.

    PYTHONPATH=build/python /usr/bin/python3 -m pytest -p k4.pytest_plugin examples/merge_numpy
"""
import os
import sys

import numpy as np
import pytest

import k4
import k4.pytest_plugin as kp

sys.path.insert(0, os.path.dirname(__file__))
from merge_numpy import merge  # noqa: E402


@pytest.mark.parametrize("scenario", kp.scenario_params("smoke") + kp.scenario_params("special"))
def test_merge_is_bitexact(k4_golden, scenario):
    step = k4_golden(preset="tiny", **scenario)
    for rank in range(step.tp):
        st = step.rank(rank).merge
        attn, attn8, x_scale = merge(st.inputs["o"], st.inputs["m"], st.inputs["l"])
        assert k4.bits(attn, "bf16") == k4.bits(st.outputs["attn"])
        assert k4.bits(attn8, "e4m3") == k4.bits(st.outputs["attn8"])
        assert k4.bits(x_scale, "f32") == k4.bits(st.outputs["x_scale"])


def test_merge_into_a_dump_diffed_at_teardown(k4_golden, k4_dump):
    step = k4_golden(preset="tiny", tokens=4, context="1000,short,300,2000")
    dump = k4_dump(step)  # diffed against the golden when the test ends; the HTML report kept on a mismatch
    for rank in range(step.tp):
        st = step.rank(rank).merge
        attn, attn8, x_scale = merge(st.inputs["o"], st.inputs["m"], st.inputs["l"])
        dump.add(f"rank{rank}/merge/outputs/attn", attn)
        dump.add(f"rank{rank}/merge/outputs/attn8", k4.Tensor(attn8, "e4m3"))
        dump.add(f"rank{rank}/merge/outputs/x_scale", x_scale)


def test_a_wrong_merge_is_caught(k4_golden):
    step = k4_golden(preset="tiny", tokens=4, context="1000,short,300,2000")
    st = step.rank(1).merge
    l_wrong = st.inputs["l"].bits.copy()
    l_wrong[3, 3, 5] ^= np.uint32(1 << 22)  # the top mantissa bit of one partition's exp-sum
    attn, _, _ = merge(st.inputs["o"], st.inputs["m"], l_wrong)
    with pytest.raises(AssertionError) as e:
        assert k4.bits(attn, "bf16") == k4.bits(st.outputs["attn"])
    assert "first divergence" in str(e.value) and "token 3" in str(e.value)
