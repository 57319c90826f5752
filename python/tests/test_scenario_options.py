"""k4.inputs' scenario options: one a row of the scenario table (scenario_keys()), as k4 golden's.

The options are not listed in the module: a key added to golden/inputs/scenario.cpp's table is
an option of k4.inputs and of these tests with no change here."""
import json
import re
import subprocess

import pytest

import k4
from conftest import cli

KEYS = k4.scenario_keys()


def cli_options(k4_bin):
    """The scenario options in `k4 golden --help` (its "scenario" group)."""
    r = cli(k4_bin, "golden", "--help")
    assert r.returncode == 0, r.stderr
    group = r.stdout[r.stdout.index("[Option Group: scenario]"):]
    return {m.group(1) for m in re.finditer(r"^\s+(--[a-z0-9-]+)", group, re.M)}


def test_the_options_are_the_table_and_the_cli_s(k4_bin):
    assert len(KEYS) >= 24  # the table had 24 rows when this test was written; it only grows
    assert k4.scenario_options() == [k["option"] for k in KEYS]
    for k in KEYS:
        assert k["option"] == k["flag"].lstrip("-").replace("-", "_")
    assert {k["flag"] for k in KEYS} <= cli_options(k4_bin)
    assert "rank_scores" in k4.scenario_options()


def a_value(k):
    """A value of key k for a tiny one-token step: its default, flags set."""
    if k["kind"].startswith("bool"):
        return True
    return k["default"]


def cli_args(k, v):
    """k4 golden's arguments for option k = v."""
    if v is True:
        return [k["flag"]]
    if isinstance(v, list):
        return [k["flag"], ",".join(map(str, v))] if v else []
    if v is False:  # an expert key off: its default, not given
        return []
    return [k["flag"], str(v)]


@pytest.fixture(scope="module")
def tiny_weights():
    """tiny at TP 1: one rank (every key's golden twice: the CLI's and ours)."""
    return k4.Weights.synthetic(k4.Config.preset("tiny", 1), seed=1)


@pytest.mark.parametrize("key", KEYS, ids=[k["option"] for k in KEYS])
def test_every_key_is_accepted_and_recorded(key, tiny_weights):
    v = a_value(key)
    inp = k4.inputs(tiny_weights, seed=2, **{key["option"]: v})
    j = json.loads(inp.scenario_json)
    where = j["inject"] if key["inject"] else j
    if v is True or v is None:
        assert where.get(key["key"]) is True or key["kind"].startswith("bool (absent")
    elif key["key"] in where:  # keys written only when set are absent at their defaults
        got = where[key["key"]]
        want = [int(x) if str(x).isdigit() else x for x in v] if isinstance(v, list) else v
        assert got == want, key


@pytest.mark.parametrize("key", KEYS, ids=[k["option"] for k in KEYS])
def test_every_key_gives_the_cli_golden(key, tmp_path, k4_bin, tiny_weights):
    """k4.inputs(option=value) saved == k4 golden --flag value (cmp), for every key."""
    v = a_value(key)
    args = cli_args(key, v)
    r = cli(k4_bin, "golden", "--preset", "tiny", "--tp", 1, "--seed", 2, *args, "--out", tmp_path / "cli.h5")
    assert r.returncode == 0, r.stderr
    k4.run(tiny_weights, k4.inputs(tiny_weights, seed=2, **{key["option"]: v})).save(tmp_path / "py.h5")
    assert subprocess.run(["cmp", tmp_path / "py.h5", tmp_path / "cli.h5"]).returncode == 0, args


# Keys set away from their defaults, each against the CLI's bytes (rank_scores: every rank's
# own index scores, rank 0's, or a set of blocks of its own); the last item: the keys without
# which the step is another (the test checks that it is).
CASES = {
    "rank_scores_distinct": (2, dict(tokens=2, context="3000,long", rank_scores="distinct"),
                             ["--tokens", 2, "--context", "3000,long", "--rank-scores", "distinct"], ["rank_scores"]),
    "rank_scores_shared": (2, dict(tokens=2, context=[3000, "long"], rank_scores="shared", ties=True),
                           ["--tokens", 2, "--context", "3000,long", "--rank-scores", "shared", "--ties"], ["rank_scores"]),
    "rows_and_expert": (-1, dict(tokens=4, context="short,2000,300,1000", zero_attn_rows=[1], nan_kv_rows="2,3",
                                 repeated_expert="any"),
                        ["--tokens", 4, "--context", "short,2000,300,1000", "--zero-attn-rows", 1, "--nan-kv-rows", "2,3",
                         "--repeated-expert", "any"], ["zero_attn_rows", "nan_kv_rows", "repeated_expert"]),
    "config_flag": (-1, dict(tokens=2, context="2000", static_kv_scale=True, kv_page_stride=16, nan_weight="s2"),
                    ["--tokens", 2, "--context", "2000", "--static-kv-scale", "--kv-page-stride", 16, "--nan-weight", "s2"],
                    ["static_kv_scale", "nan_weight"]),
}


@pytest.mark.parametrize("case", CASES)
def test_set_keys_give_the_cli_golden(case, tmp_path, k4_bin):
    tp, opts, args, needed = CASES[case]
    w = k4.Weights.synthetic(k4.Config.preset("tiny", tp), seed=1)
    k4.run(w, k4.inputs(w, seed=5, **opts)).save(tmp_path / "py.h5")
    r = cli(k4_bin, "golden", "--preset", "tiny", "--tp", tp, "--seed", 5, *args, "--out", tmp_path / "cli.h5")
    assert r.returncode == 0, r.stderr
    assert subprocess.run(["cmp", tmp_path / "py.h5", tmp_path / "cli.h5"]).returncode == 0
    # the keys matter: without them the golden is another
    base = {k: v for k, v in opts.items() if k not in needed}
    k4.run(w, k4.inputs(w, seed=5, **base)).save(tmp_path / "base.h5")
    assert subprocess.run(["cmp", "-s", tmp_path / "py.h5", tmp_path / "base.h5"]).returncode != 0


def test_rank_scores_reach_the_ranks():
    """distinct: the ranks' index scores differ; shared: every rank has rank 0's."""
    w = k4.Weights.synthetic(k4.Config.preset("tiny", 2), seed=1)
    name = "rank{}/index/inputs/index_scores"
    shared = k4.run(w, k4.inputs(w, seed=5, tokens=2, context="3000,long", rank_scores="shared"))
    assert (shared[name.format(0)] == shared[name.format(1)]).all()
    own = k4.run(w, k4.inputs(w, seed=5, tokens=2, context="3000,long", rank_scores="own"))
    assert not (own[name.format(0)] == own[name.format(1)]).all()


def test_bad_options_give_the_cli_s_message(tiny_weights, k4_bin, tmp_path):
    with pytest.raises(ValueError, match=r"unknown scenario option 'rank_score' \(known: tokens, .*rank_scores"):
        k4.inputs(tiny_weights, rank_score="own")
    with pytest.raises(ValueError, match="tokens: True is not an integer"):
        k4.inputs(tiny_weights, tokens=True)
    with pytest.raises(ValueError, match="ties: 1 is not True or False"):
        k4.inputs(tiny_weights, ties=1)
    with pytest.raises(ValueError, match="rank_scores: 3 is not a str"):
        k4.inputs(tiny_weights, rank_scores=3)
    # a value the table's reader refuses: the CLI's message
    for opts, args in [(dict(rank_scores="mine"), ["--rank-scores", "mine"]),
                       (dict(repeated_expert="x"), ["--repeated-expert", "x"])]:
        r = cli(k4_bin, "golden", "--preset", "tiny", "--tp", 1, *args, "--out", tmp_path / "x.h5")
        assert r.returncode != 0
        msg = r.stderr.strip().splitlines()[-1].removeprefix("k4 golden: ").removeprefix("error: ")
        with pytest.raises(ValueError) as e:
            k4.inputs(tiny_weights, **opts)
        assert str(e.value) in r.stderr, (str(e.value), r.stderr)
        assert not (tmp_path / "x.h5").exists()


def test_none_is_not_given(tiny_weights):
    assert k4.inputs(tiny_weights, seed=2, tokens=None, ties=None).scenario_json == k4.inputs(tiny_weights, seed=2).scenario_json
