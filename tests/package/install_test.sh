#!/usr/bin/env bash
# install_test.sh CMAKE BUILD WORK CONSUMER PYTHON PYPATH -- the installed tree works:
# cmake --install BUILD into WORK/prefix; a separate CMake project (CONSUMER) finds it with
# find_package(k4), links k4::golden and runs a step; pkg-config gives its flags; the
# installed k4 runs; the installed Python package imports (when PYPATH is given).
set -euo pipefail
cmake=$1 build=$2 work=$3 consumer=$4 python=$5 pypath=${6:-}
rm -rf "$work"
"$cmake" --install "$build" --prefix "$work/prefix" >/dev/null
"$work/prefix/bin/k4" --version
"$cmake" -S "$consumer" -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
"$cmake" --build "$work/consumer" >/dev/null
"$work/consumer/k4_consumer"
PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" pkg-config --cflags --libs k4 | grep -q -- "-lk4_golden"
echo "pkg-config k4: ok"
if [[ -n "$pypath" ]]; then
  (cd "$work" && PYTHONPATH="$pypath" "$python" -c 'import k4, os; assert k4.__file__.startswith(os.environ["PYTHONPATH"]), k4.__file__; s = k4.golden("tiny", tokens=1, context="100"); print("python k4 from the prefix:", s, k4.tool_version())')
fi
echo "package_install: ok"
