"""The goldens' string attributes are variable-length UTF-8, so h5py reads them as str; the readers
(k4 inspect, k4 diff, k4.open) still read the fixed-length form that h5py reads as bytes."""
import h5py
import numpy as np

import k4
from conftest import cli


def string_attrs(path):
    """(object path, attribute name, value) of every string-typed attribute of the file."""
    out = []
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            for a, v in obj.attrs.items():
                if obj.attrs.get_id(a).get_type().get_class() == h5py.h5t.STRING:
                    out.append((name, a, v))
        visit("/", f)
        f.visititems(visit)
    return out


def test_h5py_reads_every_string_attribute_as_str(tiny_golden):
    attrs = string_attrs(tiny_golden)
    assert len(attrs) > 100  # the root's header and every dataset's dtype and dims
    assert any(a == "dtype" and v == "bf16" for _, a, v in attrs)
    bad = [(o, a, type(v).__name__) for o, a, v in attrs if not isinstance(v, str)]
    assert not bad, bad[:5]
    with h5py.File(tiny_golden, "r") as f:
        assert f.attrs["magic"] == "K4GOLDEN"


def fixed_length_copy(src, dst):
    """dst = src with every string attribute rewritten fixed-length NULLPAD (h5py: np.bytes_)."""
    dst.write_bytes(src.read_bytes())
    n = 0
    with h5py.File(dst, "r+") as f:
        objs = [f]
        f.visititems(lambda name, obj: objs.append(obj) if not isinstance(f.get(name, getlink=True), h5py.SoftLink) else None)
        for obj in objs:
            for a in list(obj.attrs):
                v = obj.attrs[a]
                if isinstance(v, str):
                    del obj.attrs[a]
                    obj.attrs[a] = np.bytes_(v.encode())
                    n += 1
    return n


def test_a_golden_with_fixed_length_attributes_still_reads(k4_bin, tiny_golden, tmp_path):
    old = tmp_path / "fixed.h5"
    assert fixed_length_copy(tiny_golden, old) > 100
    attrs = string_attrs(old)
    assert attrs and all(isinstance(v, bytes) for _, _, v in attrs)  # really the old form

    r = cli(k4_bin, "diff", tiny_golden, old)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MATCH" in r.stdout
    r = cli(k4_bin, "inspect", old)
    assert r.returncode == 0, r.stderr
    g_old, g_new = k4.open(old), k4.open(tiny_golden)
    assert g_old.config.to_json() == g_new.config.to_json()
    p = "rank0/merge/outputs/attn"
    assert np.array_equal(g_old[p].bits, g_new[p].bits)
    assert g_old[p].k4_dtype == "bf16"
