"""Optional torch interop: torch tensors in (their bits), k4.Tensor out as torch views.

torch is not a dependency (Debian's python3-torch 1.13 has neither float8 dtypes nor, on
these machines, an install): everything here works without it and is used only when a
torch tensor is given. bf16 is viewed as torch.bfloat16, f32 as torch.float32, e4m3 as
torch.float8_e4m3fn where torch has it; the other dtypes (and e4m3 without float8) are
integer tensors of the storage type.
"""
import numpy as np


def _torch():
    try:
        import torch  # noqa: F401
        return torch
    except ImportError:
        return None


def is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


_INT_VIEW = {"bfloat16": ("int16", np.uint16), "float16": ("int16", np.uint16), "float32": ("int32", np.uint32),
             "float8_e4m3fn": ("uint8", np.uint8), "float8_e5m2": ("uint8", np.uint8)}


def to_numpy(x):
    """A torch tensor as a numpy array of its bits (bf16 -> uint16, float32 -> uint32 bits,
    float8 -> uint8); anything else through np.asarray."""
    if not is_torch(x):
        return x
    torch = _torch()
    t = x.detach().cpu().contiguous()
    name = str(t.dtype).replace("torch.", "")
    if name in _INT_VIEW:
        iname, np_type = _INT_VIEW[name]
        return t.view(getattr(torch, iname)).numpy().view(np_type)
    if name in ("int16", "int32"):  # a user's integer view of bits
        return t.numpy().view(np.uint16 if name == "int16" else np.int32)
    return t.numpy()


def to_torch(tensor):
    """A k4.Tensor as a torch tensor over the same bits (a view type where torch has one)."""
    torch = _torch()
    if torch is None:
        raise ImportError("torch is not importable")
    bits = np.ascontiguousarray(tensor.bits)
    d = tensor.k4_dtype
    if d == "bf16":
        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    if d == "f32":
        return torch.from_numpy(bits.view(np.float32))
    if d == "e4m3" and hasattr(torch, "float8_e4m3fn"):
        return torch.from_numpy(bits).view(torch.float8_e4m3fn)
    if bits.dtype == np.uint16:
        return torch.from_numpy(bits.view(np.int16))
    return torch.from_numpy(bits)
