#!/usr/bin/env bash
# fuzz.sh -- the libFuzzer targets of tests/fuzz (clang, ASan + UBSan), built in build-fuzz/.
#
#   scripts/fuzz.sh build                      configure + build build-fuzz (-DK4_FUZZ=ON, clang)
#   scripts/fuzz.sh run [SECONDS] [TARGET...]  fuzz each target for SECONDS (default 600),
#                                              K4_FUZZ_PARALLEL (default 1) at a time; TARGETs:
#                                              safetensors golden_reader scenario hdf5_bytes (all
#                                              by default)
#   scripts/fuzz.sh ci                         build + run each default target K4_FUZZ_CI_SECONDS
#                                              (default 45) from the seeds only (its own,
#                                              emptied work directory build-fuzz/fuzz-ci/),
#                                              nproc targets at a time: the brief CI run
#   scripts/fuzz.sh list                       the targets
#
# A run of TARGET uses build-fuzz/fuzz-work/TARGET/: corpus/ (the working corpus: what the
# fuzzer adds; tests/fuzz/corpus/TARGET/ is read as seeds and never written), artifacts/
# (crash-, leak-, timeout-, oom- files of this run; the previous run's are moved to
# artifacts.prev/), fuzz.log. libFuzzer first runs the whole working corpus, however long (a
# grown golden_reader corpus takes minutes at ~3 inputs/s), then fuzzes for SECONDS.
# libFuzzer options: -max_total_time=SECONDS -timeout=10 -rss_limit_mb=2048 (also the malloc
# limit) -print_final_stats=1, the target's dictionary tests/fuzz/TARGET.dict, -max_len 4096.
# hdf5_bytes: -max_len 32768, and libhdf5's malloc may fail as in production
# (ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=2048, no libFuzzer malloc
# limit; C++ new still reports). It runs
# in fork mode (-fork=1): a crash inside libhdf5 is handled as the k4 tools handle it
# (golden/io/crash_guard.hpp): the job saves the input into fuzz-work/hdf5_bytes/handled/ and
# ends, libFuzzer starts the next. ASan / LSan reports from inside libhdf5 are suppressed
# (tests/fuzz/libhdf5/{asan,lsan}.supp). After the run every handled input goes through the
# production `k4 diff` (K4_BIN, default build/k4) against a tiny golden: it must exit 2 with
# "the file is corrupt", or 0 / 1 / 2 without a crash; a signal is a finding.
# Per target it prints executions, exec/s, coverage (cov: edges, ft: features), corpus size
# and findings; it exits 1 when any target had a finding (reproduce one: build-fuzz/fuzz_TARGET
# FILE; K4_FUZZ_VERBOSE=1 prints what the input does and every expected error).
# Every fuzzer runs under `nice -n 10` with OMP_NUM_THREADS=1.
# Environment: K4_FUZZ_CXX (clang++), K4_FUZZ_JOBS (build jobs, default 2), K4_FUZZ_CI_SECONDS,
# K4_FUZZ_FRESH=1 (start from the seeds only: the working corpus is emptied first),
# K4_FUZZ_KEEP_GOING=1 (-fork=1 -ignore_crashes=1 ...: run the whole time and collect every
# finding in one run instead of stopping at the first).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build-fuzz
cxx=${K4_FUZZ_CXX:-clang++}
jobs=${K4_FUZZ_JOBS:-2}
work_root=$dir/fuzz-work
default_targets=(safetensors golden_reader scenario hdf5_bytes)
all_targets=(safetensors golden_reader scenario hdf5_bytes)

build() {
  command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (scripts/setup.sh installs clang)" >&2; exit 1; }
  cmake -S . -B "$dir" -G Ninja -DK4_FUZZ=ON -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="${cxx/clang++/clang}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only"
  nice -n 10 cmake --build "$dir" -j "$jobs" --target k4_fuzz_all
}

# The value of libFuzzer's "stat::NAME: V" final line, or "?".
stat() { local v; v=$(grep -aE "^stat::$1:" "$2" | tail -1 | awk '{print $2}'); echo "${v:-?}"; }

run_one() {  # run_one TARGET SECONDS -> prints one summary line; returns 1 on a finding
  local t=$1 secs=$2
  local exe=$dir/fuzz_$t work=$work_root/$t seeds=tests/fuzz/corpus/$t
  [[ -x $exe ]] || { echo "fuzz.sh: $exe is not built (scripts/fuzz.sh build)" >&2; return 2; }
  mkdir -p "$work/corpus" "$work/artifacts"
  [[ ${K4_FUZZ_FRESH:-0} == 1 ]] && find "$work/corpus" -type f -delete
  rm -rf "$work/artifacts.prev"
  mv "$work/artifacts" "$work/artifacts.prev"
  mkdir -p "$work/artifacts"
  local args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
              -artifact_prefix="$work/artifacts/")
  [[ -f tests/fuzz/$t.dict ]] && args+=(-dict="tests/fuzz/$t.dict")
  # keep going past findings (fork mode: one child process at a time, each finding a file)
  if [[ ${K4_FUZZ_KEEP_GOING:-0} == 1 ]]; then
    args+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  elif [[ $t == hdf5_bytes ]]; then
    args+=(-fork=1)  # a job that met a libhdf5 crash ends; the next one starts
  fi
  local asan=${ASAN_OPTIONS:-} lsan=${LSAN_OPTIONS:-}
  local handled=$work/handled
  rm -rf "$handled"
  if [[ $t == hdf5_bytes ]]; then
    # libhdf5 sizes buffers from the corrupt bytes and handles a failed malloc (NULL): so does
    # the production build; ASan would abort on a terabyte request instead. C++ new in our
    # code still reports (ASan) and the RSS limit still holds.
    args+=(-max_len=32768 -malloc_limit_mb=1000000000)
    # max_allocation_size_mb: a larger request fails (NULL) instead of costing ASan's shadow
    # for it (a corrupt length made libhdf5 ask for gigabytes: 2.1 GB RSS under ASan, 12 MB in
    # the production k4, which never touches the memory: tests/fuzz/libhdf5/huge_alloc_h5fopen.h5)
    asan=${ASAN_OPTIONS:-allocator_may_return_null=1:max_allocation_size_mb=2048:suppressions=$PWD/tests/fuzz/libhdf5/asan.supp}
    lsan=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/libhdf5/lsan.supp}
    mkdir -p "$handled"
  else
    args+=(-max_len=4096)
  fi
  local dirs=("$work/corpus")
  [[ -d $seeds ]] && dirs+=("$seeds")
  echo "fuzz.sh: $t for ${secs} s: $exe ${args[*]} ${dirs[*]}" >&2
  local rc=0
  env OMP_NUM_THREADS=1 UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} ASAN_OPTIONS="$asan" \
    LSAN_OPTIONS="$lsan" K4_FUZZ_HANDLED_DIR="$PWD/$handled" \
    nice -n 10 "$exe" "${args[@]}" "${dirs[@]}" >"$work/fuzz.log" 2>&1 || rc=$?
  local log=$work/fuzz.log
  local execs rate units cov ft last
  execs=$(stat number_of_executed_units "$log")
  rate=$(stat average_exec_per_sec "$log")
  last=$(grep -aE "^#[0-9]+" "$log" | grep -aE "cov: " | tail -1 || true)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  if [[ $execs == "?" && $last =~ ^#([0-9]+):\ cov: ]]; then  # fork mode: "#N: cov: C ft: F corp: U exec/s R ..."
    execs=${BASH_REMATCH[1]}
    rate=$(sed -nE 's/.* exec\/s ([0-9]+).*/\1/p' <<<"$last")
  fi
  units=$(find "$work/corpus" -type f | wc -l)
  local bytes
  bytes=$(find "$work/corpus" -type f -printf '%s\n' | awk '{s+=$1} END {print s+0}')
  local findings
  findings=$(find "$work/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort)
  local n_find
  n_find=$(grep -c . <<<"$findings" || true)
  printf '%-14s %9s execs %7s exec/s  cov %-6s ft %-7s corpus %5s units %8s bytes  findings %s  (exit %d)\n' \
    "$t" "$execs" "$rate" "${cov:-?}" "${ft:-?}" "$units" "$bytes" "$n_find" "$rc"
  [[ $t == hdf5_bytes ]] && { check_handled "$handled" "$work" || n_find=$((n_find + 1)); }
  if [[ $n_find -gt 0 ]]; then
    sed 's/^/    /' <<<"$findings"
    grep -aE "ERROR: |FINDING|SUMMARY: " "$log" | head -5 | sed 's/^/    /'
    return 1
  fi
  if [[ $rc -ne 0 ]]; then
    echo "    libFuzzer exited $rc without an artifact: see $log"
    tail -5 "$log" | sed 's/^/    /'
    return 1
  fi
  return 0
}

# check_handled DIR WORK: the inputs hdf5_bytes saw crash libhdf5, through the production k4.
# Prints one line; returns 1 if k4 died of a signal (or exited past 2) on any of them.
check_handled() {
  local dir=$1 work=$2 k4=${K4_BIN:-build/k4}
  local n
  n=$(find "$dir" -type f | wc -l)
  if [[ $n -eq 0 ]]; then echo "    libhdf5 crashes handled: 0"; return 0; fi
  if [[ ! -x $k4 ]]; then
    echo "    libhdf5 crashes handled: $n inputs in $dir, NOT checked: no $k4 (build it, or set K4_BIN)"
    return 0
  fi
  local g=$work/pristine.h5
  [[ -f $g ]] || "$k4" golden --preset tiny --tp 1 --tokens 2 --context 300 --out "$g" >/dev/null 2>&1 ||
    { echo "    fuzz.sh: could not make $g with $k4" >&2; return 1; }
  local corrupt=0 clean=0 bad=0 f rc err
  for f in "$dir"/*; do
    rc=0
    err=$(K4_NO_GUARD= "$k4" diff "$g" "$f" 2>&1 >/dev/null) || rc=$?
    if [[ $rc -eq 2 && $err == *"the file is corrupt"* ]]; then corrupt=$((corrupt + 1))
    elif [[ $rc -le 2 ]]; then clean=$((clean + 1))
    else bad=$((bad + 1)); echo "    FINDING: $k4 diff $g $f: exit $rc: ${err:0:300}"; fi
  done
  echo "    libhdf5 crashes handled: $n inputs in $dir; $k4 diff: $corrupt 'the file is corrupt' (exit 2), $clean other errors without a crash, $bad crashed"
  [[ $bad -eq 0 ]]
}

run() {  # run [SECONDS] [TARGET...]
  local secs=600
  if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then secs=$1; shift; fi
  local targets=("$@")
  [[ ${#targets[@]} -eq 0 ]] && targets=("${default_targets[@]}")
  for t in "${targets[@]}"; do
    [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t' (${all_targets[*]})" >&2; exit 2; }
  done
  # K4_FUZZ_PARALLEL targets at a time (each fuzzer is one process on one core); their reports
  # are printed in the targets' order once each has ended
  local par=${K4_FUZZ_PARALLEL:-1} failed=0 summary=() out
  [[ $par =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: K4_FUZZ_PARALLEL must be a positive integer, got '$par'" >&2; exit 2; }
  out=$(mktemp -d)
  local i=0 pids=()
  for t in "${targets[@]}"; do
    (rc=0; run_one "$t" "$secs" >"$out/$i.line" || rc=$?; echo "$rc" >"$out/$i.rc") &
    pids+=($!)
    i=$((i + 1))
    if [[ ${#pids[@]} -ge $par ]]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  done
  wait
  for ((i = 0; i < ${#targets[@]}; i++)); do
    cat "$out/$i.line"
    summary+=("$(head -1 "$out/$i.line")")
    [[ $(cat "$out/$i.rc" 2>/dev/null || echo 1) -ne 0 ]] && failed=1
  done
  rm -rf "$out"
  printf '\nfuzz.sh: summary (%d s a target)\n' "$secs"
  printf '%s\n' "${summary[@]}" | grep -E "execs" || true
  return "$failed"
}

case ${1:-} in
  build) build ;;
  run) shift; run "$@" ;;
  ci) build; work_root=$dir/fuzz-ci K4_FUZZ_FRESH=1 K4_FUZZ_PARALLEL=${K4_FUZZ_PARALLEL:-$(nproc)} \
        run "${K4_FUZZ_CI_SECONDS:-45}" "${default_targets[@]}" ;;
  list) printf '%s\n' "${all_targets[@]}" ;;
  -h|--help|"") sed -n '2,/^set -euo/p' "$0" | sed '$d'; [[ -n ${1:-} ]] ;;
  *) echo "fuzz.sh: unknown command '$1' (build, run, ci, list)" >&2; exit 2 ;;
esac
