"""Shared fixtures of the k4 module's tests: the k4 command beside the module, tiny goldens."""
import os
import pathlib
import subprocess

import pytest

import k4


@pytest.fixture(scope="session")
def k4_bin():
    exe = os.environ.get("K4_BIN") or str(pathlib.Path(k4.__file__).resolve().parents[2] / "k4")
    if not os.path.exists(exe):
        pytest.fail(f"the k4 command is not at {exe} (set K4_BIN)")
    return exe


def cli(k4_bin, *args):
    """Runs `k4 ARGS`; returns the CompletedProcess (text)."""
    return subprocess.run([k4_bin, *map(str, args)], capture_output=True, text=True)


TINY = dict(tokens=4, context="1000,short,300,2000")


@pytest.fixture(scope="session")
def tiny_step():
    return k4.golden("tiny", seed=3, **TINY)


@pytest.fixture(scope="session")
def tiny_golden(tmp_path_factory, k4_bin):
    """The CLI's golden of TINY (seed 3)."""
    path = tmp_path_factory.mktemp("golden") / "tiny.h5"
    r = cli(k4_bin, "golden", "--preset", "tiny", "--tokens", 4, "--context", "1000,short,300,2000", "--seed", 3, "--out", path)
    assert r.returncode == 0, r.stderr
    return path


pytest_plugins = ["pytester"]  # test_plugin.py runs test files through the k4 plugin
