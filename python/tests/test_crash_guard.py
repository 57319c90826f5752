"""The crash guard in the module: k4.open and k4.diff do their reads in a forked child first
(golden/io/crash_guard.hpp probe_in_child), so that a file on which libhdf5 itself crashes
(tests/fuzz/libhdf5, docs/reliability.md L2) is a k4.FormatError with the message the tools
print, and the interpreter goes on. Whether libhdf5's use-after-free faults depends on the
process's memory layout (in this build `k4 diff` faults on these files, the module's process
need not), so the crash path is planted deterministically with K4_GUARD_SELFTEST, as the tools'
own test does (tests/cpu/test_crash_guard.cpp)."""
import os
import pathlib
import subprocess
import sys

import pytest

import k4

FUZZ = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fuzz" / "libhdf5"
CORRUPT = (r"libhdf5 \S+ crashed \(SIGSEGV, Segmentation fault\) on HDF5 file '{}': "
           r"the file is corrupt \(libhdf5 crashes on some damaged files before it can report an error\)\.")


def py(code, **env):
    """CODE in a fresh interpreter with ENV: (returncode, stdout, stderr)."""
    r = subprocess.run([sys.executable, "-c", "import k4\n" + code], env=dict(os.environ, **env), capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


OPEN = """
try:
    k4.open({path!r})
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
print("the interpreter goes on:", k4.open({path!r}).tp if {again} else "")
"""


def test_a_crash_inside_libhdf5_is_a_format_error_and_the_interpreter_goes_on(tiny_golden, k4_bin):
    rc, out, err = py(OPEN.format(path=str(tiny_golden), again=False), K4_GUARD_SELFTEST="libhdf5")
    assert rc == 0, err
    first, alive = out.splitlines()
    assert first.startswith("FormatError: ") and alive.startswith("the interpreter goes on")
    msg = first[len("FormatError: "):]
    assert __import__("re").fullmatch(CORRUPT.format("K4_GUARD_SELFTEST"), msg), msg
    # the tools' message, word for word
    r = subprocess.run([k4_bin, "inspect", tiny_golden], env=dict(os.environ, K4_GUARD_SELFTEST="libhdf5"), capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == "k4 inspect: error: " + msg


def test_a_crash_in_k4_s_own_code_is_a_runtime_error_naming_the_file(tiny_golden):
    rc, out, err = py(OPEN.format(path=str(tiny_golden), again=False), K4_GUARD_SELFTEST="k4")
    assert rc == 0, err
    first = out.splitlines()[0]
    assert first.startswith("RuntimeError: k4 crashed (SIGSEGV, Segmentation fault) outside libhdf5 reading HDF5 file "
                            f"'{tiny_golden}': a bug in k4"), first


def test_k4_diff_is_guarded_too(tiny_golden):
    rc, out, err = py(f"""
try:
    k4.diff({str(tiny_golden)!r}, {str(tiny_golden)!r})
except k4.FormatError as e:
    print("FormatError", e)
""", K4_GUARD_SELFTEST="libhdf5")
    assert rc == 0 and out.startswith("FormatError libhdf5 "), (out, err)


def test_k4_no_guard_probes_nothing(tiny_golden):
    """K4_NO_GUARD=1: no child, no self-test: the file opens (the knob the tools have)."""
    rc, out, err = py(OPEN.format(path=str(tiny_golden), again=True), K4_GUARD_SELFTEST="libhdf5", K4_NO_GUARD="1")
    assert rc == 0 and out.strip() == f"the interpreter goes on: {k4.open(tiny_golden).tp}", (out, err)


@pytest.mark.parametrize("name", ["uaf_h5aexists.h5", "segv_h5aexists.h5", "heap_overflow_h5aexists.h5"])
def test_the_files_that_crash_libhdf5_never_end_the_interpreter(tmp_path, k4_bin, name):
    """The fuzzer's files against the golden they were found with: k4.open and k4.diff give a
    k4.FormatError where libhdf5 faulted (the guard's message), else HDF5's own error (k4.FormatError
    or k4.HDF5Error, an OSError), as the tools exit 2 either way."""
    g = tmp_path / "g.h5"
    assert subprocess.run([k4_bin, "golden", "--preset", "tiny", "--tp", "1", "--tokens", "2", "--context", "300",
                           "--out", g], capture_output=True).returncode == 0
    bad = FUZZ / name
    rc, out, err = py(f"""
for f in (lambda: k4.open({str(bad)!r}).paths(), lambda: k4.diff({str(g)!r}, {str(bad)!r})):
    try:
        f()
        print("no error")
    except (k4.FormatError, OSError) as e:
        print(type(e).__name__, e)
""")
    assert rc == 0, err[-2000:]
    for line in out.splitlines():
        assert line.split(" ")[0] in ("FormatError", "HDF5Error") or line == "no error", line
        if " crashed (" in line:
            assert __import__("re").search(CORRUPT.format(".*" + name), line), line


LAZY = """
import os
g = k4.open({path!r})                              # the header: probed with no self-test set
os.environ["K4_GUARD_SELFTEST"] = "libhdf5"        # every later probe's child crashes in libhdf5
for read in (lambda: g["rank0/merge/outputs/attn"], lambda: k4.stage.merge(g)):
    try:
        read()
        print("no error")
    except Exception as e:
        print(type(e).__name__ + ": " + str(e))
del os.environ["K4_GUARD_SELFTEST"]
print("the interpreter goes on:", g["rank0/merge/outputs/attn"].shape)
"""


def test_a_tensor_read_later_and_a_stage_are_guarded_too(tiny_golden):
    rc, out, err = py(LAZY.format(path=str(tiny_golden)))
    assert rc == 0, err
    lines = out.splitlines()
    assert len(lines) == 3, out
    for line in lines[:2]:
        kind, msg = line.split(": ", 1)
        assert kind == "FormatError", line
        assert __import__("re").fullmatch(CORRUPT.format("K4_GUARD_SELFTEST"), msg), msg
    assert lines[2].startswith("the interpreter goes on: (4, ")
