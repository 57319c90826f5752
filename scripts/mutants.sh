#!/usr/bin/env bash
# mutants.sh -- the kernel mutants' kill table in host emulation (no GPU): builds k4_emu_mutants
# (device/*.cu with every mutant of device/mutants.hpp compiled in, chosen at run time) in the
# CPU build, runs its kill table (tests/gpu/test_mutants_gpu.cpp) and writes it as markdown.
#
#   scripts/mutants.sh               every mutant; the table in $K4_EMU_BUILD/mutants.md
#   scripts/mutants.sh 60,67         only these mutants
# Environment: K4_EMU_BUILD (the CPU build, default build/), K4_MUTANT_TABLE (the table's file).
# Exit status: the test's (non-zero when a mutant survives that the registry does not argue
# equivalent, or an "equivalent" one is killed). The GPU's table: scripts/gpu-suite.sh mutants.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${K4_EMU_BUILD:-build}
[[ -f $dir/CMakeCache.txt ]] || cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$dir" --target k4_emu_mutants
if [[ $# -gt 0 ]]; then export K4_MUTANT_IDS=$1; fi
export K4_MUTANT_TABLE=${K4_MUTANT_TABLE:-$dir/mutants.md}
OMP_WAIT_POLICY=passive "$dir/k4_emu_mutants" -ts=gpu_mutants --no-colors=true
echo "mutants.sh: the table is in $K4_MUTANT_TABLE"
