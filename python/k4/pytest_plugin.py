"""The k4 pytest plugin: goldens, dumps diffed at teardown, scenario sets, bit messages.

Enable it with ``-p k4.pytest_plugin`` or ``pytest_plugins = ["k4.pytest_plugin"]`` in a
conftest.py. It provides:

  k4_golden(preset="tiny", tp=-1, seed=1, weight_seed=1, variant=None, file=False, **scenario)
      a Step of k4 golden with those options, computed once a session for each set of
      parameters (file=True: the step read back from its saved golden, k4.open)
  k4_dump(golden_step)
      a k4.DumpWriter whose dump is diffed against the golden when the test ends: a
      mismatch fails the test with k4 diff's report and leaves the HTML report in the
      report folder (--k4-report-dir, default k4-reports/), named after the test
  k4_report_dir
      that folder (a pathlib.Path)
  scenario_params(name)
      pytest.param entries of a named scenario set (k4.scenarios.SETS) with readable ids
  assert k4.bits(a) == k4.bits(b)
      compares bits; on failure the assertion message is the first-divergence report
      (pytest_assertrepr_compare), not "False"
"""
import os
import pathlib
import re
import shutil
import tempfile

import pytest

import k4
from k4.scenarios import scenario_id, scenario_set


def scenario_params(name):
    return [pytest.param(s, id=scenario_id(s)) for s in scenario_set(name)]


def pytest_addoption(parser):
    parser.addoption("--k4-report-dir", default="k4-reports",
                     help="folder for the HTML reports of failing k4 dumps (default k4-reports)")


def pytest_assertrepr_compare(config, op, left, right):
    if op == "==" and isinstance(left, k4.Bits) and isinstance(right, k4.Bits):
        lines = [l for l in left.explain(right).split("\n") if l.strip()]
        # pytest shows the first lines unless -vv: the divergence and its elements first
        first = [l for l in lines if l.startswith("first divergence")]
        rest = [l for l in lines[1:] if l not in first and not l.startswith(("stage ", "result:"))]
        return [lines[0]] + first + [l for l in rest if not l.startswith(("merge ", "tensor ")) or "/" in l]
    return None


class _Goldens:
    """Steps by their parameters, computed once; saved goldens in one session folder."""

    def __init__(self):
        self.steps, self.files = {}, {}
        self.dir = tempfile.mkdtemp(prefix="k4-goldens-")

    @staticmethod
    def key(params):
        return repr(sorted((k, repr(v)) for k, v in params.items()))

    def get(self, file=False, **params):
        params.setdefault("preset", "tiny")
        key = self.key(params)
        if key not in self.steps:
            self.steps[key] = k4.golden(**params)
            self.steps[key].k4_params = params
        step = self.steps[key]
        return self.file(step) if file else step

    def file(self, step):
        """The step saved as a golden (once), opened through k4.open."""
        if step.path:
            return step
        key = id(step)
        if key not in self.files:
            path = os.path.join(self.dir, f"golden{len(self.files)}.h5")
            self.files[key] = k4.open(step.save(path))
        return self.files[key]

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def _k4_goldens():
    g = _Goldens()
    yield g
    g.close()


@pytest.fixture(scope="session")
def k4_golden(_k4_goldens):
    return _k4_goldens.get


@pytest.fixture(scope="session")
def k4_report_dir(pytestconfig):
    return pathlib.Path(pytestconfig.getoption("--k4-report-dir")).absolute()  # relative: to the working directory


def _brief(text):
    """k4 diff's text less what a partial dump always lacks: the stages and tensors not in it."""
    out, skipping = [], False
    for line in text.split("\n"):
        if line.startswith("not compared ("):
            skipping = True
            continue
        if skipping and line.startswith("  "):
            continue
        skipping = False
        if not line.rstrip().endswith("not in the dump"):
            out.append(line)
    return "\n".join(out)


@pytest.fixture
def k4_dump(request, tmp_path, _k4_goldens, k4_report_dir):
    made = []

    def factory(golden, name="dump.h5"):
        w = k4.DumpWriter(tmp_path / name, golden.config, golden.tokens)
        made.append((w, golden))
        return w

    yield factory
    failures = []
    for w, golden in made:
        if not w.paths():
            failures.append(f"{w.path}: the dump holds no tensor (nothing was added)")
            continue
        w.close()
        gold = _k4_goldens.file(golden)
        rep = k4.diff(gold.path, w.path)
        if rep.any_mismatch():
            k4_report_dir.mkdir(parents=True, exist_ok=True)
            html = k4_report_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid) + ".html")
            html.write_text(rep.to_html())
            failures.append(f"{_brief(str(rep))}\nHTML report: {html}")
    if failures:
        pytest.fail("k4 dump differs from its golden:\n" + "\n".join(failures), pytrace=False)
