"""K4's stage 2 (merge) in plain numpy: what a user's own implementation looks like.

The LSE-weighted merge of the n_split partitions of every token and head, the bf16 round,
and the per-token FP8 quant (the seed's merge_token, seed:L883-L944; docs/numerics.md states
each rule). numpy's float32 operations are IEEE single operations, one rounding each, like
the kernel's; the order of every sum is the seed's. The approximate hardware instructions
(hw_exp2) and the FP8 convert come from k4.policy, the contract's portable definitions.

    attn, attn8, x_scale = merge(o_bits, m_bits, l_bits)   # storage arrays in, storage arrays out
"""
import numpy as np

import k4

F32 = np.float32
LOG2E = F32(k4.policy.LOG2E)             # the seed's log2(e) as an f32 immediate
INV_FP8_MAX = F32(k4.policy.INV_FP8_MAX)  # f32(1 / 448)


def bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_round_bits(x):
    """f32 -> bf16 bits, round to nearest even; NaN -> 0x7FC0 (the contract's canonical NaN)."""
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), r)


def ieee_max(a, b):
    """fx.max: NaN propagates, -0 orders below +0."""
    both_zero = (a == 0) & (b == 0)
    m = np.where(a > b, a, b)
    m = np.where(both_zero, np.where(np.signbit(a), b, a), m)
    return np.where(np.isnan(a) | np.isnan(b), F32(np.nan), m).astype(F32)


@np.errstate(all="ignore")  # IEEE arithmetic is the contract: Inf and NaN are values, not warnings
def merge(o_bits, m_bits, l_bits):
    """o (S, n_split, o_k) bf16 bits; m, l (S, n_split, heads) f32 bits ->
    attn (S, o_k) bf16 bits, attn8 (S, o_k) E4M3 bits, x_scale (S,) f32 bits."""
    o = bf16_to_f32(np.asarray(o_bits))
    m = np.asarray(m_bits).view(np.float32)
    l = np.asarray(l_bits).view(np.float32)
    S, NS, OK = o.shape
    H = m.shape[2]
    D = OK // H
    gm = m[:, 0, :]
    for i in range(1, NS):                      # the partitions' maximum, in partition order
        gm = ieee_max(gm, m[:, i, :])
    sl = [l[:, i, :] * k4.policy.exp2((m[:, i, :] - gm) * LOG2E) for i in range(NS)]
    gs = sl[0]
    for i in range(1, NS):                      # the exp-sums, in partition order
        gs = gs + sl[i]
    gs = np.where(gs > 0, gs, F32(1)).astype(F32)
    av = np.zeros((S, H, D), F32)
    for i in range(NS):                         # the weighted outputs, in partition order
        wi = sl[i] / gs                         # a true division, like the seed's `/`
        av = av + wi[:, :, None] * o[:, i, :].reshape(S, H, D)
    attn = bf16_round_bits(av.reshape(S, OK))
    a = bf16_to_f32(attn)
    amax = np.max(np.abs(a), axis=1)            # NaN propagates (block_max)
    x_scale = amax * INV_FP8_MAX
    inv = np.where(amax == 0, F32(0), F32(1) / x_scale).astype(F32)  # hw_rcp is correctly rounded
    attn8 = k4.policy.e4m3((a * inv[:, None]).astype(F32), saturate=False)
    return attn, attn8, k4.policy.canon_nan(x_scale.astype(F32)).view(np.uint32)
