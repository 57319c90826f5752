"""A kernel-under-test library (device/kut/k4_kut.h) from Python, through ctypes.

    impl = k4.kut.load("build/kut/libk4_kut_ours.so")     # a K4_KUT_HOST library
    rep = k4.testing.sweep(impl, scenarios="smoke")       # the same sweep as a Python callable

The library's stages become k4.testing callables: the stage's inputs (k4.Tensor) are handed
over as host pointers in the logical layout, the outputs come back in buffers of the golden's
shapes, pre-filled with 0xA5 so that an element left unwritten is caught.
"""
import ctypes

import numpy as np

from . import _k4

ABI_VERSION = 1
_DTYPES = ["bf16", "f32", "i32", "u8", "e4m3", "e8m0", "e2m1x2"]


class _Tensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int), ("shape", ctypes.c_int64 * 4),
                ("dims", ctypes.c_char_p), ("data", ctypes.c_void_p), ("bytes", ctypes.c_size_t)]


class _Call(ctypes.Structure):
    _fields_ = [("stage", ctypes.c_char_p), ("rank", ctypes.c_int), ("tp", ctypes.c_int), ("tokens", ctypes.c_int),
                ("q_len", ctypes.c_int), ("config_json", ctypes.c_char_p), ("inputs", ctypes.POINTER(_Tensor)),
                ("n_inputs", ctypes.c_int), ("outputs", ctypes.POINTER(_Tensor)), ("n_outputs", ctypes.c_int),
                ("stream", ctypes.c_void_p), ("user", ctypes.c_void_p)]


_SUPPORTS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p)
_RUN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Call), ctypes.c_char_p, ctypes.c_size_t)
_RELEASE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Impl(ctypes.Structure):
    _fields_ = [("abi_version", ctypes.c_int), ("name", ctypes.c_char_p), ("memory", ctypes.c_int), ("supports", _SUPPORTS),
                ("run_stage", _RUN), ("prepare", _RUN), ("release", _RELEASE)]


_ALL_REDUCED = {"oproj": ("a", "h_mid"), "moe": ("ar_out",)}


def _descr(name, arr, dtype, dims, keep):
    arr = np.ascontiguousarray(arr)
    keep.append(arr)
    t = _Tensor()
    t.name = name.encode()
    t.dtype = _DTYPES.index(dtype)
    t.ndim = arr.ndim
    for i, n in enumerate(arr.shape):
        t.shape[i] = n
    d = ",".join(dims or []).encode()
    keep.append(d)
    t.dims = d
    t.data = arr.ctypes.data
    t.bytes = arr.nbytes
    return t


class Library:
    """A loaded k4_kut.h library; `lib[stage]` is a k4.testing callable, `lib.stages` those it supports."""

    def __init__(self, path):
        self.path = str(path)
        try:
            self._dll = ctypes.CDLL(self.path)
        except OSError as e:
            raise ValueError(f"kernel library {self.path}: cannot be loaded ({e})") from None
        try:
            get = self._dll.k4_kut_get
        except AttributeError:
            raise ValueError(f"kernel library {self.path}: exports no k4_kut_get (device/kut/k4_kut.h)") from None
        get.restype = ctypes.POINTER(_Impl)
        p = get()
        if not p:
            raise ValueError(f"kernel library {self.path}: k4_kut_get returned NULL")
        self._impl = p.contents
        if self._impl.abi_version != ABI_VERSION:
            raise ValueError(f"kernel library {self.path}: ABI version {self._impl.abi_version}, this module is {ABI_VERSION}")
        if self._impl.memory != 0:
            raise ValueError(f"kernel library {self.path}: wants device memory; k4.kut hands over host memory")
        self.name = self._impl.name.decode()
        self.stages = [s for s in _k4.stage_names() if self._impl.supports(s.encode())]

    def get(self, stage, default=None):
        return self[stage] if stage in self.stages else default

    def __getitem__(self, stage):
        if stage not in self.stages:
            raise KeyError(f"{self.name} does not implement stage {stage}")
        return lambda inputs, config, rank: self.run_stage(stage, inputs, config, rank)

    def run_stage(self, stage, inputs, config, rank, tokens=None):
        """One stage of one rank: inputs by schema name (k4.Tensor or storage arrays) -> outputs."""
        keep = []
        q_len = int(inputs.get("q_len", 1))
        specs = [r for r in _k4.schema() if r["group"] == f"{stage}/inputs"]
        ins = []
        for r in specs:
            if r["name"] in inputs:
                x = inputs[r["name"]]
                ins.append(_descr(r["name"], np.asarray(x), r["dtype"], getattr(x, "dims", None), keep))
        if tokens is None:
            tokens = next(np.asarray(inputs[r["name"]]).shape[0] for r in specs
                          if r["name"] in inputs and r["dims"].startswith("token"))
        outs, arrays = [], {}
        for r in _k4.schema():
            if r["group"] != f"{stage}/outputs" or r["name"] in _ALL_REDUCED.get(stage, ()):
                continue
            shape = _shape(r, config, tokens, inputs)
            st = _k4.storage_dtype(r["dtype"])
            a = np.frombuffer(b"\xa5" * (int(np.prod(shape)) * st.itemsize), dtype=st).reshape(shape).copy()
            arrays[r["name"]] = a
            outs.append(_descr(r["name"], a, r["dtype"], r["dims"].split(","), keep))
        call = _Call()
        call.stage = stage.encode()
        call.rank, call.tp, call.tokens, call.q_len = rank, config.tp, tokens, q_len
        cj = config.to_json().encode()
        keep.append(cj)
        call.config_json = cj
        in_arr = (_Tensor * max(len(ins), 1))(*ins)
        out_arr = (_Tensor * max(len(outs), 1))(*outs)
        call.inputs, call.n_inputs = in_arr, len(ins)
        call.outputs, call.n_outputs = out_arr, len(outs)
        err = ctypes.create_string_buffer(512)
        if self._impl.prepare and self._impl.prepare(ctypes.byref(call), err, 512) != 0:
            raise RuntimeError(f"{self.name}: rank {rank} {stage}: prepare: {err.value.decode()}")
        rc = self._impl.run_stage(ctypes.byref(call), err, 512)
        if self._impl.release and call.user:
            self._impl.release(call.user)
        if rc != 0:
            raise RuntimeError(f"{self.name}: rank {rank} {stage}: {err.value.decode() or f'run_stage returned {rc}'}")
        from .tensor import Tensor
        return {n: Tensor(a, r["dtype"], r["dims"].split(",")) for n, a in arrays.items()
                for r in _k4.schema() if r["group"] == f"{stage}/outputs" and r["name"] == n}


def _shape(row, config, tokens, inputs):
    used = len(inputs["expert_ids"]) if "expert_ids" in inputs else 0
    return tuple(_k4.dim_sizes(config, int(tokens), row["dims"], used_experts=used))


def load(path):
    """A kernel-under-test library as a k4.testing implementation."""
    return Library(path)
