"""Named scenario sets for pytest's parametrize: k4 golden's scenario options by name.

    @pytest.mark.parametrize("scenario", k4.pytest_plugin.scenario_params("smoke"))
    def test_x(k4_golden, scenario): step = k4_golden(preset="tiny", **scenario)

Each entry is a dict of k4.inputs options; its id (scenario_id) reads like the options:
"S4-ctx1000,short,300,2000", "S2-special_q".
"""

SETS = {
    # one short row; four rows of mixed contexts; a long request (split candidates) with q_len 2
    "smoke": [
        dict(tokens=1, context="1000"),
        dict(tokens=4, context="1000,short,300,2000"),
        dict(tokens=6, q_len=2, context="long,900,300", pad_rows=[5]),
    ],
    # every token count of a decode step (narrow MoE up to 4, wide from 5; all-reduce RS+AG from 12)
    "tokens": [dict(tokens=s, context="short") for s in range(1, 17)],
    "contexts": [dict(tokens=2, context=c) for c in ("1", "127", "128", "129", "short", "medium", "long")],
    # the values the contract defines: NaN, Inf, -0, ties, pad and zero rows
    "special": [
        dict(tokens=2, context="1000", special_q=True),
        dict(tokens=4, context="1000", special_h_in=True),
        dict(tokens=2, context="1000", special_kv=True),
        dict(tokens=4, context="2000", ties=True, nan_scores=2, neg_zero_scores=2, inf_scores=2),
        dict(tokens=4, context="1000,short,300,2000", pad_rows=[1], zero_rows=[2], zero_attn_rows=[3]),
        dict(tokens=3, context="1000", nan_kv_rows=[1]),
        dict(tokens=4, context="short", special_weights=True),
    ],
}

_SHORT = {"tokens": "S", "context": "ctx", "q_len": "q"}


def scenario_id(opts):
    """'S4-ctx1000,short-q2-pad_rows=5-special_q': the options, readable."""
    parts = []
    for k, v in opts.items():
        if isinstance(v, (list, tuple)):
            v = ",".join(map(str, v))
        if k in _SHORT:
            parts.append(f"{_SHORT[k]}{v}")
        elif v is True:
            parts.append(k)
        else:
            parts.append(f"{k}={v}")
    return "-".join(parts)


def scenario_set(name):
    if name not in SETS:
        raise KeyError(f"no scenario set '{name}' (sets: {', '.join(SETS)})")
    return [dict(s) for s in SETS[name]]
