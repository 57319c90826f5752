"""k4: the K4 reference model (MiniMax-M3's fused decode post-attention kernel) from Python.

Bindings of the project's C++ libraries (no numerics in Python):

    cfg = k4.Config.preset("tiny")
    w = k4.Weights.synthetic(cfg, seed=1)
    inp = k4.inputs(w, seed=1, tokens=4, context="1000")     # k4 golden's scenario options
    step = k4.run(w, inp)                                    # every rank's stage tensors
    step["rank0/merge/outputs/attn"].decoded()
    step.save("golden.h5")                                   # == k4 golden ... --out golden.h5
    g = k4.open("golden.h5")
    rep = k4.diff("golden.h5", "dump.h5"); print(rep)        # == k4 diff's text
    k4.assert_bitexact(actual, expected, name="rank0/merge/outputs/attn")

Tensors are numpy arrays of the storage type (k4.Tensor): uint16 bf16, uint8 e4m3 / e8m0 /
e2m1x2, uint32 f32 bits, int32 i32; ``.decoded()`` gives float32 values.
"""
import os
import shutil
import tempfile

import numpy as np

from . import _k4
from ._k4 import policy, layout
from ._k4 import Config, Weights, Inputs, FormatError, HDF5Error, DiffReport, decode, schema, stage_names, tool_version
from .tensor import Tensor, dtype_of
from .step import Step
from . import scenarios
from . import stage, torchx, testing, kut

__all__ = [
    "Config", "Weights", "Inputs", "Step", "Tensor", "FormatError", "HDF5Error", "BitExactError", "DiffReport",
    "inputs", "run", "golden", "hf_model", "open", "diff", "replay", "assert_bitexact", "DumpWriter", "decode", "schema",
    "stage_names", "tool_version", "scenario_options", "scenario_keys", "stage", "torchx", "bits", "Bits", "policy",
]

scenario_options = _k4.scenario_options
scenario_keys = _k4.scenario_keys


def inputs(weights, seed=1, scenario=None, **options):
    """A step's inputs from a scenario: a scenario JSON file and/or k4 golden's scenario options,
    one a key of the scenario table (golden/inputs/scenario.hpp scenario_keys()), named as
    k4 golden's option without its dashes (tokens, q_len, context, rank_scores, ties, ...:
    k4.scenario_options() lists them, k4.scenario_keys() with their kinds and help). Flags
    take True / False, lists a Python list or the CLI's comma text, None is "not given"."""
    return _k4._make_inputs(weights, int(seed), os.fspath(scenario) if scenario else "", options)


def run(weights, inputs):
    """The reference model's whole step (every rank, every stage) in memory."""
    return Step(_k4._run(weights, inputs))


def golden(preset=None, tp=-1, variant=None, seed=1, weight_seed=1, checkpoint=None, layer=-1, scenario=None,
           mx_scale="even", **options):
    """What `k4 golden` computes, as a Step: the same options (--preset, --tp, --variant,
    --seed, --weight-seed, --checkpoint, --layer, --mx-scale, --scenario and the scenario
    options). preset: "tiny" by default; with a checkpoint whose directory has a config.json
    the shape is its own (a preset given must agree), layer -1 its first K4 layer."""
    if checkpoint:
        cfg = None  # the checkpoint's config.json
        if preset:
            cfg = Config.preset(preset, tp)
        elif (tp != -1 or variant) and _has_hf_config(checkpoint):
            cfg = Config.from_hf_config(os.fspath(checkpoint), tp)
        if cfg is not None and variant:
            cfg.variant = variant
            cfg.validate()
        w = Weights.from_checkpoint(os.fspath(checkpoint), cfg, layer, mx_scale)
    else:
        cfg = Config.preset(preset or "tiny", tp)
        if variant:
            cfg.variant = variant
            cfg.validate()
        w = Weights.synthetic(cfg, weight_seed)
    return run(w, inputs(w, seed, scenario, **options))


def _has_hf_config(path):
    return os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json"))


def hf_model(path, tp=-1):
    """A Hugging Face config.json (a file, or a checkpoint directory's) as a dict: config (a
    k4.Config, validated as k4 golden --checkpoint validates it), num_layers, k4_layers."""
    return _k4.hf_model(os.fspath(path), tp)


def open(path):
    """A golden or dump file, read a tensor at a time through the Step interface."""
    return Step(_k4._open(os.fspath(path)))


class _Saved:
    """A path for a Step in memory (saved to a temporary file, removed afterwards)."""

    def __init__(self, x):
        self.x, self.dir = x, None

    def __enter__(self):
        if isinstance(self.x, Step):
            if self.x.path:
                return self.x.path
            self.dir = tempfile.mkdtemp(prefix="k4-")
            return self.x.save(os.path.join(self.dir, "step.h5"))
        return os.fspath(self.x)

    def __exit__(self, *exc):
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def diff(golden, dump, max=10, replay=False):
    """k4 diff GOLDEN DUMP as a DiffReport: str() is k4 diff's text; .first, .stages,
    .to_json(), .to_html(). Either side may be a path or a Step."""
    with _Saved(golden) as g, _Saved(dump) as d:
        return _k4._diff(g, d, max, replay)


def replay(golden, dump, max=10):
    """k4 replay GOLDEN DUMP: the diff with each stage replayed on the dump's own inputs."""
    return diff(golden, dump, max=max, replay=True)


class BitExactError(AssertionError):
    """Raised by assert_bitexact: the message is the first-divergence report; .report holds it."""

    def __init__(self, report, name=None):
        text = str(report)
        if name is not None:  # two arrays: the report without the file header, sides named
            body = text.split("\n")[4:]
            t = report.stages[0].tensors[0]
            head = f"{name}: {t.mismatches} of {t.elements} elements differ in their bits ({t.status}; golden = expected, dump = actual)"
            if t.why:
                head += f": {t.why}"
            text = "\n".join([head, ""] + body)
        super().__init__(text)
        self.report = report


_STORAGE_GUESS = {np.dtype(np.uint16): "bf16", np.dtype(np.uint32): "f32", np.dtype(np.int32): "i32",
                  np.dtype(np.uint8): "u8", np.dtype(np.float32): "f32"}


def _bits(x, dtype):
    a = np.asarray(torchx.to_numpy(x))
    if a.dtype == np.float32 and dtype == "f32":
        a = a.view(np.uint32)  # f32 values are their bits
    return np.ascontiguousarray(a)


def _schema_dtype(name):
    try:
        return _k4.spec(name)["dtype"]
    except ValueError:
        return None


def _schema_dims(name):
    """The schema row's dimension names of a schema path ("token", "dim"), [] for another name."""
    try:
        return [d for d in _k4.spec(name)["dims"].split(",") if d]
    except ValueError:
        return []


def assert_bitexact(actual, expected, name="tensor", max=10):
    """Bits, not tolerances: raises BitExactError (an AssertionError) with the first-divergence
    report unless every element's bits are equal (-0 != +0; NaN == NaN only with equal bits).

    actual / expected: k4.Tensor, numpy arrays of the storage type (float32 is taken as f32
    only), or Steps / paths (then the whole step is diffed, expected being the golden).
    name: a schema path ("rank0/merge/outputs/attn") fixes the dtype and names the stage."""
    if isinstance(actual, (Step, str, os.PathLike)) or isinstance(expected, (Step, str, os.PathLike)):
        rep = diff(expected, actual, max=max)
        if rep.any_mismatch():
            raise BitExactError(rep)
        return rep
    want = _schema_dtype(name) or dtype_of(expected) or dtype_of(actual)
    for side in (expected, actual):
        got = dtype_of(side)
        if got and want and got != want:
            raise TypeError(f"{name}: a {got} tensor where {want} is expected")
    if want is None:
        a = np.asarray(expected)
        want = _STORAGE_GUESS.get(a.dtype)
        if want is None:
            raise TypeError(f"{name}: {a.dtype} is no storage type (uint16 bf16, uint8, uint32 f32 bits, int32)")
    # the tensors' own dims, else the schema row's (a plain numpy array has none); the report
    # falls back to d0, d1, .. where they do not fit the shape
    dims = getattr(expected, "dims", None) or getattr(actual, "dims", None) or _schema_dims(name)
    rep = _k4._compare_arrays(_bits(expected, want), _bits(actual, want), want, list(dims), name, max)
    if rep.any_mismatch():
        raise BitExactError(rep, name)
    return rep


class Bits:
    """Bits to compare with ``==`` in a plain assert: ``assert k4.bits(a) == k4.bits(b)``.
    Equal when dtype, shape and every element's bits are equal; under pytest with the k4
    plugin a failing assert shows the first-divergence report (explain())."""

    def __init__(self, x, dtype=None, name=None):
        self.dtype = dtype or dtype_of(x) or _STORAGE_GUESS.get(np.asarray(x).dtype)
        if self.dtype is None:
            raise TypeError(f"{np.asarray(x).dtype} is no storage type: give dtype=")
        self.array = _bits(x, self.dtype)
        want = _k4.storage_dtype(self.dtype)
        if self.array.dtype != want:
            raise TypeError(f"a {self.dtype} tensor is stored as {want} bits, got a {self.array.dtype} array")
        self.dims = getattr(x, "dims", None)
        self.name = name or getattr(x, "k4_path", None)

    def __eq__(self, other):
        if not isinstance(other, Bits):
            return NotImplemented
        return (self.dtype == other.dtype and self.array.shape == other.array.shape
                and self.array.tobytes() == other.array.tobytes())

    def explain(self, other):
        """Why the two differ: the report of assert_bitexact(self, other)."""
        if self.dtype != other.dtype:
            return f"a {self.dtype} tensor compared with a {other.dtype} tensor"
        dims = other.dims or self.dims
        mine, theirs = Tensor(self.array, self.dtype, dims), Tensor(other.array, other.dtype, dims)
        try:
            assert_bitexact(mine, theirs, name=other.name or self.name or "tensor")
        except BitExactError as e:
            return str(e)
        return "the bits are equal"

    def __repr__(self):
        return f"k4.bits({self.name or ''} {self.dtype} {self.array.shape})"


def bits(x, dtype=None, name=None):
    """Bits(x): ``assert k4.bits(mine) == k4.bits(step[path])`` compares bits, not values."""
    return Bits(x, dtype, name)


class DumpWriter:
    """A kernel's tensors into a dump in the golden schema (what k4 diff reads). Each tensor is
    checked against the schema's dtype and shape when added; the file is written atomically
    on close() (nothing is left behind when a check fails).

        with k4.DumpWriter("dump.h5", step.config, step.tokens) as w:
            w.add("rank0/merge/outputs/attn", attn_bits)
    """

    def __init__(self, path, config, tokens, overwrite=False):
        self._w = _k4._DumpWriter(os.fspath(path), config, int(tokens), overwrite)

    @property
    def path(self):
        return self._w.path

    def add(self, path, tensor):
        self._w.add(path, np.ascontiguousarray(np.asarray(torchx.to_numpy(tensor))), dtype_of(tensor, ""))
        return self

    def paths(self):
        return self._w.paths()

    def close(self):
        self._w.close()
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *rest):
        if exc_type is None:
            self.close()
