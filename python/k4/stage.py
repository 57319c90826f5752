"""k4.stage.<name>: one stage of the reference model on given tensors.

    out = k4.stage.merge(step, rank=0)                 # the stage's inputs from a step (golden)
    out = k4.stage.merge(step, rank=0, o=my_o)         # any input overridden
    out = k4.stage.merge(config=cfg, o=o, m=m, l=l)    # or every input given
    out["attn"], out["attn8"], out["x_scale"]          # k4.Tensor outputs by schema name

Inputs are the schema's inputs of the stage (docs/golden-format.md), as k4.Tensor, numpy
arrays of the storage type, or torch tensors (when torch is importable). oproj and moe also
give the all-reduced rows (a, h_mid; ar_out) when every rank's partial rows are known:
`rank_partials` (a list of tp arrays, this rank's entry None) or the step's.
"""
import numpy as np

from . import _k4
from .tensor import from_native
from . import torchx

STAGES = ("index", "split", "merge", "oproj", "router", "moe")


def _input_names(stage):
    return [r["name"] for r in _k4.schema() if r["group"] == f"{stage}/inputs"]


def _gather(stage, step, rank, config, given):
    names = _input_names(stage)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"k4.stage.{stage}: {', '.join(unknown)} is not an input of the stage (inputs: {', '.join(names)})")
    if config is None:
        if step is None:
            raise ValueError(f"k4.stage.{stage}: give a step (its inputs are the defaults) or config=")
        config = step.config
    tensors = {}
    for n in names:
        if n in given:
            tensors[n] = torchx.to_numpy(given[n])
        elif step is not None:
            p = f"/rank{rank}/{stage}/inputs/{n}"
            if p in step:
                tensors[n] = np.asarray(step[p])
    return config, tensors


def _partials(stage, step, rank, config, rank_partials):
    if rank_partials is not None:
        return [None if p is None else torchx.to_numpy(p) for p in rank_partials]
    if step is None:
        return None
    out = []
    for r in range(config.tp):
        p = f"/rank{r}/{stage}/outputs/partial"
        out.append(None if r == rank or p not in step else np.asarray(step[p]))
    return None if any(x is None for i, x in enumerate(out) if i != rank) else out


def _result(native, torch_out):
    out = {k: from_native(v) for k, v in native.items()}
    return {k: torchx.to_torch(v) for k, v in out.items()} if torch_out else out


def _torch_in(given):
    return any(torchx.is_torch(v) for v in given.values())


def index(step=None, rank=0, config=None, q_len=None, **inputs):
    config, t = _gather("index", step, rank, config, inputs)
    if q_len is None:
        q_len = getattr(step._n, "q_len", 1) if step is not None else 1
    return _result(_k4._stage.index(config, t, int(q_len)), _torch_in(inputs))


def split(step=None, rank=0, config=None, **inputs):
    config, t = _gather("split", step, rank, config, inputs)
    return _result(_k4._stage.split(config, t), _torch_in(inputs))


def merge(step=None, rank=0, config=None, **inputs):
    config, t = _gather("merge", step, rank, config, inputs)
    return _result(_k4._stage.merge(config, t), _torch_in(inputs))


def oproj(step=None, rank=0, config=None, rank_partials=None, **inputs):
    config, t = _gather("oproj", step, rank, config, inputs)
    parts = _partials("oproj", step, rank, config, rank_partials)
    return _result(_k4._stage.oproj(config, t, int(rank), parts), _torch_in(inputs))


def router(step=None, rank=0, config=None, **inputs):
    config, t = _gather("router", step, rank, config, inputs)
    return _result(_k4._stage.router(config, t), _torch_in(inputs))


def moe(step=None, rank=0, config=None, rank_partials=None, **inputs):
    config, t = _gather("moe", step, rank, config, inputs)
    parts = _partials("moe", step, rank, config, rank_partials)
    return _result(_k4._stage.moe(config, t, int(rank), parts), _torch_in(inputs))
