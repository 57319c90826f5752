"""k4.Tensor: a numpy array of stored bits that knows its schema dtype and named dims.

The array's numpy type is the storage type (uint16 for bf16, uint8 for e4m3 / e8m0 /
e2m1x2 / u8, uint32 for f32 bits, int32 for i32); ``decoded()`` gives the values as float32
through the C++ decoders (no numerics here).
"""
import numpy as np

from . import _k4


class Tensor(np.ndarray):
    """Stored bits with ``k4_dtype`` ('bf16', 'e4m3', ...) and ``dims`` (['token', 'dim'])."""

    def __new__(cls, bits, k4_dtype, dims=None):
        arr = np.asarray(bits)
        want = _k4.storage_dtype(k4_dtype)
        if arr.dtype != want:
            raise TypeError(
                f"a {k4_dtype} tensor is stored as {want} bits, got a {arr.dtype} array "
                "(give the bits: values are never rounded here)")
        obj = np.ascontiguousarray(arr).view(cls)
        obj.k4_dtype = k4_dtype
        obj.dims = list(dims) if dims is not None else [f"d{i}" for i in range(arr.ndim)]
        return obj

    def __array_finalize__(self, obj):
        if obj is None:
            return
        self.k4_dtype = getattr(obj, "k4_dtype", None)
        self.dims = getattr(obj, "dims", None)
        self.k4_path = getattr(obj, "k4_path", None)

    @property
    def bits(self):
        """The stored bits as a plain numpy array."""
        return np.asarray(self).view(np.ndarray)

    def decoded(self):
        """The values as float32 (e2m1x2: two a byte, the even element first)."""
        return _k4.decode(np.ascontiguousarray(self.bits), self.k4_dtype)

    def __repr__(self):
        return f"k4.Tensor({self.k4_dtype} [{','.join(self.dims or [])}] {tuple(self.shape)})"


def from_native(t):
    arr, dtype, dims = t
    out = arr.view(Tensor)
    out.k4_dtype = dtype
    out.dims = list(dims)
    return out


def dtype_of(x, default=None):
    """The schema dtype of a Tensor, else `default`."""
    return getattr(x, "k4_dtype", None) or default
