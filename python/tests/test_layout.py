"""k4.layout: the serving stacks' layouts (aiter shuffle_weight(16, 16), shuffle_scale, the KV
page-16 layout) and their exact inverses, from the C++ library; a deployment's shuffled
buffers, unshuffled, give from_tensors the golden's own weights back."""
import subprocess

import numpy as np
import pytest

import k4
from conftest import TINY
from test_weights_tensors import golden_tensors, weight_paths  # noqa: F401 (the fixture)


def test_the_index_maps_are_the_formulas():
    """A few positions against VARIANTS.md 8.5's formulas, written here again."""
    N, Kb = 48, 96
    for n, kb in [(0, 0), (1, 0), (0, 16), (0, 32), (17, 50), (47, 95)]:
        want = ((((n // 16) * (Kb // 32) + kb // 32) * 2 + (kb // 16) % 2) * 16 + n % 16) * 16 + kb % 16
        assert k4.layout.shuffle_weight_index(n, kb, N, Kb) == want
    R, C = 64, 16
    for r, c in [(0, 0), (16, 0), (0, 4), (33, 9), (63, 15)]:
        want = (((((r // 32) * (C // 8) + c // 8) * 4 + c % 4) * 16 + r % 16) * 2 + (c // 4) % 2) * 2 + (r // 16) % 2
        assert k4.layout.shuffle_scale_index(r, c, R, C) == want
    assert k4.layout.kv_page_k_index(3, 20, 128) == 256 + 48 + 4
    assert k4.layout.kv_page_v_index(3, 20, 128) == 16 * 20 + 3


def test_there_and_back_and_where_each_byte_goes():
    rng = np.random.default_rng(1)
    w = rng.integers(0, 256, size=(3, 32, 64), dtype=np.uint8)
    s = k4.layout.shuffle_weight(w)
    assert s.shape == w.shape and np.array_equal(k4.layout.unshuffle_weight(s), w)
    flat = s.reshape(3, -1)
    assert flat[1, k4.layout.shuffle_weight_index(17, 40, 32, 64)] == w[1, 17, 40]
    sc = rng.integers(0, 256, size=(2, 32, 16), dtype=np.uint8)  # [experts, rows, blocks]: one [64, 16] matrix
    ss = k4.layout.shuffle_scale(sc)
    assert np.array_equal(k4.layout.unshuffle_scale(ss), sc)
    assert ss.reshape(-1)[k4.layout.shuffle_scale_index(33, 9, 64, 16)] == sc[1, 1, 9]
    kv = rng.integers(0, 256, size=(4, 16, 128), dtype=np.uint8)
    for v in (False, True):
        pages = k4.layout.kv_to_pages(kv, v=v)
        assert pages.shape == (4, 16 * 128)
        assert np.array_equal(k4.layout.kv_from_pages(pages, 128, v=v), kv)
    assert k4.layout.kv_to_pages(kv)[2, k4.layout.kv_page_k_index(5, 70, 128)] == kv[2, 5, 70]


def test_bad_shapes_and_dtypes_are_refused_named():
    with pytest.raises(ValueError, match="w13: shuffle_weight\\(16, 16\\) needs rows a multiple of 16"):
        k4.layout.unshuffle_weight(np.zeros((8, 32), np.uint8), name="w13")
    with pytest.raises(ValueError, match="w_o"):
        k4.layout.unshuffle_weight(np.zeros((16, 32), np.uint16), name="w_o")
    with pytest.raises(ValueError, match="kv: a \\[pages, 16, head_dim\\]"):
        k4.layout.kv_to_pages(np.zeros((2, 8, 128), np.uint8))


def test_a_deployment_s_shuffled_weights_unshuffled_give_the_golden(tmp_path, tiny_golden, golden_tensors):  # noqa: F811
    """The golden's weights (logical) shuffled as aiter serves them, then unshuffled with
    k4.layout, are the golden's weights: from_tensors gives the golden's bytes."""
    g, tensors = golden_tensors
    t = dict(tensors)
    done = 0
    for p, x in tensors.items():
        name = p.rsplit("/", 1)[1]
        a = np.asarray(x)
        if name in ("w13", "w2", "w_o") and a.shape[-2] % 16 == 0 and a.shape[-1] % 32 == 0:
            served = k4.layout.shuffle_weight(a, name=p)
            assert not np.array_equal(served, a)
            t[p] = k4.layout.unshuffle_weight(served, name=p)
            done += 1
        elif name in ("s13", "s2") and a.shape[-1] % 8 == 0 and (a.size // a.shape[-1]) % 32 == 0:
            t[p] = k4.layout.unshuffle_scale(k4.layout.shuffle_scale(a, name=p), name=p)
            done += 1
    assert done >= g.tp * 3
    w = k4.Weights.from_tensors(g.config, t, source="synthetic", seed=1)
    k4.run(w, k4.inputs(w, seed=3, **TINY)).save(tmp_path / "again.h5")
    assert subprocess.run(["cmp", tmp_path / "again.h5", tiny_golden]).returncode == 0
