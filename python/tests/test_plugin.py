"""The pytest plugin: cached goldens, dumps diffed at teardown with an HTML report, scenario
sets with readable ids, and assertion messages that show the divergence."""
import numpy as np

import k4
import k4.pytest_plugin as kp

FAILING = '''
import numpy as np
import k4

def test_bits_assert(k4_golden):
    step = k4_golden(preset="tiny", tokens=4, context="1000,short,300,2000")
    attn = step["rank0/merge/outputs/attn"]
    mine = attn.bits.copy()
    mine[2, 77] ^= np.uint16(1)
    assert k4.bits(mine, "bf16") == k4.bits(attn)

def test_dump_at_teardown(k4_golden, k4_dump):
    step = k4_golden(preset="tiny", tokens=4, context="1000,short,300,2000")
    d = k4_dump(step)
    o = step["rank1/split/outputs/o"].bits.copy()
    o[3, 2, 100] ^= np.uint16(1 << 3)
    d.add("rank1/split/outputs/o", o)

def test_passes(k4_golden, k4_dump):
    step = k4_golden(preset="tiny", tokens=4, context="1000,short,300,2000")
    again = k4_golden(tokens=4, context="1000,short,300,2000")
    assert again is step  # cached by its parameters (preset tiny is the default)
    k4_dump(step).add("rank0/merge/outputs/attn", step["rank0/merge/outputs/attn"])
'''


def test_a_failing_run_shows_the_divergence(pytester):
    pytester.makepyfile(test_user=FAILING)
    res = pytester.runpytest_subprocess("-p", "k4.pytest_plugin", "--k4-report-dir", "reports", "-q")
    res.assert_outcomes(passed=2, failed=1, errors=1)  # the dump test passes, its teardown errs
    out = res.stdout.str()
    print(out)  # the failing run's messages (docs/python.md quotes them)
    assert "rank0/merge/outputs/attn: 1 of 8192 elements differ" in out
    assert "first divergence: rank 0, stage merge, tensor attn, element [token 2, dim 77] (flat 4173)" in out
    assert "first divergence: rank 1, stage split, tensor o, element [token 3, split 2, dim 100]" in out
    reports = list((pytester.path / "reports").glob("*.html"))
    assert [r.name for r in reports] == ["test_user.py_test_dump_at_teardown.html"]
    assert "<svg" in reports[0].read_text()


def test_scenario_sets_have_readable_ids():
    ids = [p.id for p in kp.scenario_params("smoke")]
    assert ids == ["S1-ctx1000", "S4-ctx1000,short,300,2000", "S6-q2-ctxlong,900,300-pad_rows=5"]
    assert len(kp.scenario_params("tokens")) == 16
    assert "S2-ctx1000-special_q" in [p.id for p in kp.scenario_params("special")]


def test_every_scenario_of_the_sets_is_valid():
    cfg = k4.Config.preset("tiny")
    w = k4.Weights.synthetic(cfg)
    for name in k4.scenarios.SETS:
        for s in k4.scenarios.scenario_set(name):
            k4.inputs(w, **s)  # raises on an invalid scenario


def test_bits_compare_bits_not_values():
    z = np.zeros(3, np.float32)
    assert k4.bits(z) == k4.bits(z.copy())
    assert not k4.bits(z) == k4.bits(-z)  # -0 is not +0
    nan = np.full(2, np.nan, np.float32)
    assert k4.bits(nan) == k4.bits(nan.copy())
    assert "-0 vs" in k4.bits(-z).explain(k4.bits(z)) or "0 ulp" in k4.bits(-z).explain(k4.bits(z))
