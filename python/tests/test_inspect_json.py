"""k4 inspect --json: one JSON object with every dataset of the file (dtype, shape, dims, stats,
samples), its attributes, groups and links; bad input: the CLI's one-line error, exit 2, no
JSON on stdout."""
import json

import numpy as np
import pytest

import k4
from conftest import cli


def inspect_json(k4_bin, *args):
    r = cli(k4_bin, "inspect", "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_dataset_with_its_dtype_and_shape(k4_bin, tiny_golden):
    j = inspect_json(k4_bin, tiny_golden)
    g = k4.open(tiny_golden)
    ds = {d["path"]: d for d in j["datasets"]}
    assert j["file"] == str(tiny_golden)
    assert j["attributes"]["magic"] == "K4GOLDEN"
    assert j["variant"] == j["attributes"]["variant"] == g.config.variant
    links = {l["path"]: l["target"] for l in j["links"]}
    assert not any(l["dangling"] for l in j["links"])
    paths = g.paths()
    assert len(paths) > 50
    for p in paths:
        t = g[p]
        key = "/" + p.lstrip("/")
        key = links.get(key, key)  # a stage input linked to the output it is: listed with its target
        assert key in ds, key
        d = ds[key]
        assert d["dtype"] == t.k4_dtype, key
        assert d["shape"] == list(t.shape), key
        assert d["dims"] == ",".join(t.dims), key
        st = d["stats"]
        dec = t.decoded().ravel()
        assert st["count"] == dec.size, key
        assert st["nan"] == int(np.isnan(dec).sum()), key
        assert st["inf"] == int(np.isinf(dec).sum()), key
        assert st["zero"] == int((dec == 0).sum()), key
        raw = np.asarray(t).ravel()
        for s in d["samples"]:
            i = s["index"]
            if t.k4_dtype == "e2m1x2":  # a nibble an element, two a byte (even element low)
                assert int(s["bits"], 16) == (int(raw[i // 2]) >> (4 * (i % 2))) & 0xF, key
            else:
                assert int(s["bits"], 16) == int(raw[i]) & 0xFFFFFFFF, key
            if t.k4_dtype in ("i32", "u8"):
                assert s["value"] == int(raw[i]), key
            else:
                v = dec[i]
                assert (s["value"] is None and not np.isfinite(v)) or s["value"] == float(v), key
    # and no dataset the reader does not know
    assert set(ds) == {links.get("/" + p.lstrip("/"), "/" + p.lstrip("/")) for p in paths}


def test_options_path_and_no_stats(k4_bin, tiny_golden):
    j = inspect_json(k4_bin, "--no-stats", "--path", "/rank1/merge", tiny_golden)
    assert j["datasets"] and all(d["path"].startswith("/rank1/merge") for d in j["datasets"])
    assert all("stats" not in d for d in j["datasets"])
    j = inspect_json(k4_bin, "--samples", 0, "--path", "/rank0/merge/outputs/attn", tiny_golden)
    [d] = j["datasets"]  # attn only: not attn8 (whole names)
    assert d["path"] == "/rank0/merge/outputs/attn" and d["samples"] == [] and d["stats"]["count"] > 0
    # a path without its leading / or with a trailing one is the same path
    j2 = inspect_json(k4_bin, "--no-stats", "--path", "rank0/merge/outputs/attn/", tiny_golden)
    assert [d["path"] for d in j2["datasets"]] == ["/rank0/merge/outputs/attn"]
    j1 = inspect_json(k4_bin, "--no-stats", "--path", "/rank0/merge/outputs", tiny_golden)
    want = {"/" + p.lstrip("/") for p in k4.open(tiny_golden).paths() if p.lstrip("/").startswith("rank0/merge/outputs/")}
    assert {d["path"] for d in j1["datasets"]} == want and len(want) >= 3


def test_a_dump_and_its_links(k4_bin, tmp_path, tiny_step):
    """A dump written from Python: the JSON lists what the dump holds."""
    out = tmp_path / "dump.h5"
    with k4.DumpWriter(out, tiny_step.config, tiny_step.tokens) as dw:
        dw.add("rank0/merge/outputs/attn", tiny_step["rank0/merge/outputs/attn"])
    j = inspect_json(k4_bin, out)
    assert [d["path"] for d in j["datasets"]] == ["/rank0/merge/outputs/attn"]
    assert j["attributes"]["kind"] == "dump"


@pytest.mark.parametrize("bad", ["missing", "not_hdf5", "directory"])
def test_bad_input_is_the_cli_error(bad, k4_bin, tmp_path):
    p = tmp_path / "x.h5"
    if bad == "not_hdf5":
        p.write_text("not an HDF5 file\n")
    elif bad == "directory":
        p.mkdir()
    r = cli(k4_bin, "inspect", "--json", p)
    plain = cli(k4_bin, "inspect", p)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == plain.stderr and plain.returncode == 2  # the text form's message
    msg = r.stderr.strip()
    assert msg.count("\n") == 0 and str(p) in msg
    want = {"missing": ": no such file", "not_hdf5": " cannot be opened as HDF5", "directory": ": is a directory, expected a file"}
    assert want[bad] in msg


def test_a_damaged_golden_is_refused_without_output(k4_bin, tmp_path, tiny_golden):
    import shutil
    import subprocess
    g = tmp_path / "damaged.h5"
    shutil.copy(tiny_golden, g)
    # the schema version past the reader's: validated before anything is printed
    subprocess.run(["/usr/bin/python3", "-c", f"import h5py; f = h5py.File('{g}', 'r+'); f.attrs['schema_version'] = 99"],
                   check=False)
    r = cli(k4_bin, "inspect", "--json", g)
    if r.returncode == 0:
        pytest.skip("h5py not available to damage the file")
    assert r.returncode == 2 and r.stdout == "" and str(g) in r.stderr
