"""k4.testing: a user's implementation of K4's stages run over a scenario sweep, each stage of
each rank checked bit for bit against the reference's golden.

    def my_merge(inputs, config, rank):          # inputs: the stage's schema inputs (k4.Tensor)
        return {"attn": ..., "attn8": ..., "x_scale": ...}   # bits of the storage type

    rep = k4.testing.sweep({"merge": my_merge}, scenarios="smoke")
    print(rep)                 # one line a case: ok, or the first divergence (rank, stage, element)
    rep.raise_for_failures()   # a BitExactError (AssertionError) naming every failing case

The index stage's inputs also hold "q_len" (an int). `impl` maps stage names to callables (or is an object with methods of those names); stages
it lacks are not tested. A stage is given the golden's own inputs, so each stage is judged
on its own (the replay of k4 replay). oproj and moe may return the all-reduced rows (a,
h_mid; ar_out) too: every output returned is compared, and the outputs of the stage that the
implementation does not return are reported as missing.
"""
from . import _k4, scenarios as _scenarios
from .tensor import dtype_of
from . import torchx

STAGES = ("index", "split", "merge", "oproj", "router", "moe")
_ALL_REDUCED = {"oproj": ("a", "h_mid"), "moe": ("ar_out",)}


class Divergence:
    """The first mismatching element of a case."""

    def __init__(self, case, rank, stage, tensor, index=None, text=""):
        self.case, self.rank, self.stage, self.tensor = case, rank, stage, tensor
        self.index = index or {}
        self.text = text

    def __str__(self):
        where = ", ".join(f"{k} {v}" for k, v in self.index.items())
        return f"{self.case}: rank {self.rank}, stage {self.stage}, tensor {self.tensor}" + (f", element [{where}]" if where else "")


class CaseResult:
    def __init__(self, case, checked, first=None):
        self.case, self.checked, self.first = case, checked, first

    @property
    def ok(self):
        return self.first is None

    def __str__(self):
        return f"ok    {self.case} ({self.checked} tensors bit-exact)" if self.ok else f"FAIL  {self.first}"


class SweepReport:
    def __init__(self, cases):
        self.cases = cases

    @property
    def ok(self):
        return all(c.ok for c in self.cases)

    @property
    def failures(self):
        return [c for c in self.cases if not c.ok]

    def __str__(self):
        lines = [str(c) for c in self.cases]
        n = len(self.failures)
        lines.append(f"{len(self.cases) - n} of {len(self.cases)} cases bit-exact" + (f"; {n} diverge" if n else ""))
        return "\n".join(lines)

    def raise_for_failures(self):
        if not self.ok:
            from . import BitExactError
            details = "\n\n".join(c.first.text for c in self.failures if c.first.text)
            raise _SweepError(str(self) + ("\n\n" + details if details else ""))


class _SweepError(AssertionError):
    pass


def _stage_fn(impl, stage):
    if isinstance(impl, dict) or hasattr(impl, "stages"):  # a mapping, or a k4.kut.Library
        return impl.get(stage)
    return getattr(impl, stage, None)


def _inputs(step, rank, stage):
    pre = f"/rank{rank}/{stage}/inputs/"
    t = {p[len(pre):]: step[p] for p in step.paths() if p.startswith(pre)}
    if stage == "index":
        t["q_len"] = step._n.q_len  # rows a request: the index stage's one non-tensor input
    return t


def _check_case(case, step, impl, stages, ranks):
    from . import assert_bitexact, BitExactError
    checked = 0
    for stage in stages:
        fn = _stage_fn(impl, stage)
        if fn is None:
            continue
        for rank in ranks:
            got = fn(_inputs(step, rank, stage), step.config, rank)
            pre = f"rank{rank}/{stage}/outputs/"
            names = [p.split("/")[-1] for p in step.paths() if p.startswith("/" + pre)]
            for name in names:
                if name not in got:
                    if name in _ALL_REDUCED.get(stage, ()):
                        continue  # the all-reduce is optional for an implementation of one rank
                    return CaseResult(case, checked, Divergence(case, rank, stage, name, text=f"{case}: {pre}{name}: not returned"))
                expected = step[pre + name]
                actual = torchx.to_numpy(got[name])
                if dtype_of(actual) is None and getattr(actual, "dtype", None) != expected.dtype:
                    return CaseResult(case, checked, Divergence(
                        case, rank, stage, name,
                        text=f"{case}: {pre}{name}: a {getattr(actual, 'dtype', type(actual))} array, expected {expected.dtype} bits"))
                try:
                    assert_bitexact(actual, expected, name=pre + name)
                except BitExactError as e:
                    f = e.report.first
                    return CaseResult(case, checked, Divergence(case, rank, stage, name, f.named_index if f else {},
                                                                text=f"case {case}:\n{e}"))
                checked += 1
    return CaseResult(case, checked)


def sweep(impl, scenarios="smoke", preset="tiny", tp=-1, seeds=(1,), stages=STAGES, ranks=None, variant=None):
    """Runs `impl` on every (scenario, seed) case's golden, stage by stage and rank by rank.
    scenarios: a set name of k4.scenarios.SETS or a list of k4.inputs option dicts."""
    from . import golden
    if not any(_stage_fn(impl, s) for s in stages):
        raise ValueError(f"the implementation provides none of the stages {', '.join(stages)}")
    cases = _scenarios.scenario_set(scenarios) if isinstance(scenarios, str) else [dict(s) for s in scenarios]
    results = []
    for opts in cases:
        for seed in seeds:
            case = f"{preset}-tp{tp if tp > 0 else 'preset'}-{_scenarios.scenario_id(opts)}-seed{seed}"
            step = golden(preset, tp=tp, variant=variant, seed=seed, **opts)
            results.append(_check_case(case, step, impl, stages, range(step.tp) if ranks is None else ranks))
    return SweepReport(results)


def reference():
    """The reference's own stages (k4.stage) as an implementation: the sweep's self-check."""
    from . import stage as st

    def wrap(fn):
        return lambda inputs, config, rank: fn(config=config, rank=rank, **inputs)
    return {s: wrap(getattr(st, s)) for s in STAGES}
