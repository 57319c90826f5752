#!/usr/bin/env bash
# gpu-suite.sh -- the stage kernels' GPU verification: the bit-exactness suite, the planted-
# error variants, compute-sanitizer and the benchmark, in one script.
#
#   scripts/gpu-suite.sh build     HERE (no GPU needed): scripts/build-device.sh, then the six
#                                  planted variants (K4_PLANT_STAGE=0..5: stage N's kernel flips
#                                  one bit of its output), all copied, stripped, into
#                                  build-cuda-suite/ (ignored; ~20 MB: copy it to the GPU
#                                  machine's checkout)
#                                  and k4_gpu_tests_mutants (every kernel mutant of device/mutants.hpp
#                                  compiled in, chosen at run time)
#   scripts/gpu-suite.sh run       ON THE GPU MACHINE, from the repository root:
#                                  everything below, logs and a summary under $OUT (or out/);
#                                  K4_FAST=1: split, o_proj and stage 5 on the tensor-core kernels
#                                  (split.cu's SplitBody<true>, oproj_fast.cu, moe_fast.cu)
#   scripts/gpu-suite.sh mutants   ON THE GPU MACHINE: the kill table (k4_gpu_tests_mutants
#                                  -ts=gpu_mutants): $OUT/mutants-gpu.md, mutants.log, summary.txt
#   scripts/gpu-suite.sh emulate [doctest args]
#                                  HERE: the kernels' host emulation (no GPU; the CMake target
#                                  k4_emu_tests), then ctest -L emulation or the doctest
#                                  arguments given (e.g. -tc="plant probe")
#
# What `run` does, each step with its own time limit so that the whole ends in ~8 minutes:
#   0. k4_gpu_tests -tc="plant probe"       one step through every stage; on failure: memcheck
#                                           of it, then stop
#   1. k4_gpu_tests -ts=gpu_stages          every stage bit for bit vs the reference (the
#                                           sweep's budget: K4_GPU_BUDGET_S, default 270 s)
#      k4_gpu_tests -ts=gpu_exact_mma       the integer tensor-core block dots, every tile
#      k4_gpu_tests -ts=gpu_golden          goldens -> device -> dumps -> diff (gpu::run_golden)
#      k4 golden | k4_device run --diff | k4 diff   the tools end to end, tiny and full preset
#      k4 golden --weights-file | k4_device run --diff   written and reused; moved without it: exit 2
#      k4 synth --layout bf16|mxfp4 + k4 golden --checkpoint | k4_device run --diff   release layouts
#      the crash guard in this static build: K4_GUARD_SELFTEST (exit 2 / 70), k4 diff on
#      tests/fuzz/libhdf5's corrupt dumps (exit 2), k4_device run on a truncated golden (exit 2)
#   2. k4_gpu_tests_plantN -tc="plant probe" for N = 0..5: must FAIL and name stage N
#   3. compute-sanitizer memcheck           on "plant probe" and "sanitizer case"
#      compute-sanitizer racecheck          on "sanitizer case"
#   4. k4_device bench                      full preset, S = 1, 4, 16 -> bench.md
# Exit status: 0 when every step did what it must, 1 otherwise (the summary says which).
set -uo pipefail
cd "$(dirname "$0")/.."

suite=build-cuda-suite
mode=${1:-}

# ------------------------------------------------------------------------------ build
build() {
  set -e
  scripts/build-device.sh k4_gpu_tests k4_device k4 k4_gpu_tests_mutants
  # the kernel-under-test libraries (step 1c): a failure here leaves them out (step 1c then
  # reports it) rather than stopping the build of the rest
  scripts/build-device.sh k4_kut_ours_device k4_kut_wrong_merge_device || echo "gpu-suite.sh build: the kut libraries did not build" >&2
  local nvcc=${K4_NVCC:-/usr/local/cuda/bin/nvcc} arch=${K4_CUDA_ARCH:-90}
  local obj=$suite/obj
  mkdir -p "$suite/plant" "$obj"
  local cxx=(g++ -std=c++17 -O2 -fopenmp -ffp-contract=off -I.)
  local cu=("$nvcc" -std=c++17 -arch=sm_$arch --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -O3 -I.
            -Xcompiler=-ffp-contract=off)
  # the parts every planted variant shares: the reference, the fixtures, the suite, a main
  printf '%s\n' '#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN' '#include <doctest/doctest.h>' >"$obj/main.cpp"
  local common=() pids=()
  for f in reference/*.cpp reference/stages/*.cpp tests/cpu/fixtures.cpp tests/gpu/test_stages_gpu.cpp "$obj/main.cpp"; do
    local o="$obj/$(echo "$f" | tr / _).o"
    "${cxx[@]}" -c "$f" -o "$o" & pids+=($!)
    common+=("$o")
  done
  local devfiles=()  # device/*.cu, as CMake's k4_device_lib globs them
  for f in device/*.cu; do devfiles+=("$(basename "$f" .cu)"); done
  for f in "${devfiles[@]}"; do "${cu[@]}" -c "device/$f.cu" -o "$obj/$f.o" & pids+=($!); done
  local stage_file=(index split merge "oproj oproj_fast" router moe)  # the files of each stage's plant
  # the runner reads the golden schema's table (golden/format): k4_golden as build-device.sh built
  # it, with the static HDF5 that CMake found (K4_STATIC_LIB_* in build-cuda's cache)
  local hdf5=()
  for n in hdf5 sz aec z; do
    hdf5+=("$(sed -n "s/^K4_STATIC_LIB_$n:FILEPATH=//p" build-cuda/CMakeCache.txt)")
  done
  local libs=(build-cuda/libk4_golden.a "${hdf5[@]}" -L/usr/local/cuda/lib64 -lcudart_static -ldl -lpthread -lrt
              -static-libstdc++ -static-libgcc "$(g++ -print-file-name=libgomp.a)")
  for n in 0 1 2 3 4 5; do
    for sf in ${stage_file[$n]}; do
      "${cu[@]}" -DK4_PLANT_STAGE=$n -c "device/$sf.cu" -o "$obj/$sf.plant$n.o" & pids+=($!)
    done
    "${cu[@]}" -DK4_PLANT_STAGE=$n -c device/runner.cu -o "$obj/runner.plant$n.o" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "gpu-suite.sh build: a compile failed" >&2; exit 1; }; done
  for n in 0 1 2 3 4 5; do
    local objs=()
    for f in "${devfiles[@]}"; do
      if [[ " ${stage_file[$n]} " == *" $f "* || $f == runner ]]; then objs+=("$obj/$f.plant$n.o"); else objs+=("$obj/$f.o"); fi
    done
    g++ -fopenmp -o "$suite/plant/k4_gpu_tests_plant$n" "${common[@]}" "${objs[@]}" "${libs[@]}"
    strip "$suite/plant/k4_gpu_tests_plant$n"
  done
  {
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- device tests/gpu scripts/gpu-suite.sh 2>/dev/null || echo ' (+ uncommitted changes)')"
    echo "built $(date -u +%FT%TZ) on $(uname -n) with $("$nvcc" --version | tail -1)"
  } >"$suite/BUILD_INFO"
  cp build-cuda/k4_gpu_tests build-cuda/k4_device build-cuda/k4 build-cuda/k4_gpu_tests_mutants "$suite/"
  # the kernel-under-test libraries of step 1c and the libgomp.so.1 they take (RPATH $ORIGIN:
  # a shared object cannot hold the static libgomp.a, device/kut/CMakeLists.txt)
  mkdir -p "$suite/kut"
  if [[ -f build-cuda/kut/libk4_kut_ours_device.so && -f build-cuda/kut/libk4_kut_wrong_merge_device.so ]]; then
    cp build-cuda/kut/libk4_kut_ours_device.so build-cuda/kut/libk4_kut_wrong_merge_device.so "$(g++ -print-file-name=libgomp.so.1)" "$suite/kut/"
    strip --strip-unneeded "$suite/kut/"libk4_kut_*.so
  fi
  # keep the H5* symbols: the crash guard finds the statically linked libhdf5 by them
  strip -w --keep-symbol='H5*' "$suite/k4_gpu_tests" "$suite/k4_device" "$suite/k4" "$suite/k4_gpu_tests_mutants"
  rm -rf "$obj"
  du -sh "$suite"
  ls -l "$suite" "$suite/plant"
}

# -------------------------------------------------------------------------------- run
run() {
  local out=${OUT:-out}
  mkdir -p "$out"
  local log=$out/gpu-suite.log sum=$out/summary.txt status=0
  : >"$sum"
  note() { echo "$*" | tee -a "$sum"; }
  {
    echo "gpu-suite.sh run: $(date -u +%FT%TZ) on $(hostname)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true
    nproc
  } >>"$log" 2>&1

  cat "$suite/BUILD_INFO" >>"$sum" 2>/dev/null
  note "split, o_proj and stage 5 path: ${K4_FAST:+K4_FAST=$K4_FAST }$([[ ${K4_FAST:-0} == 1 ]] && echo "the integer tensor-core kernels (split.cu SplitBody<true>, oproj_fast.cu, moe_fast.cu)" || echo "the reference kernels (split.cu SplitBody<false>, oproj.cu, moe.cu)")"

  # 0. one step through every stage first: if even that fails, run memcheck on it and stop
  # (a broken build costs a minute of device time, not eight)
  local t0=$SECONDS rc
  timeout 120 "$suite/k4_gpu_tests" -tc="plant probe" --no-colors=true >"$out/probe.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]]; then
    note "probe: FAIL rc=$rc: stopping after a memcheck of it"
    grep -E "MISMATCH|stage|ERROR|error" "$out/probe.log" | head -40 >>"$sum"
    timeout 120 compute-sanitizer --tool memcheck "$suite/k4_gpu_tests" -tc="plant probe" --no-colors=true \
      >"$out/memcheck.log" 2>&1
    grep -m1 "ERROR SUMMARY" "$out/memcheck.log" >>"$sum"
    cat "$sum" >>"$log"
    return 1
  fi
  note "probe: PASS ($((SECONDS - t0)) s)"

  # 1. the suite
  t0=$SECONDS
  K4_GPU_BUDGET_S=${K4_GPU_BUDGET_S:-270} timeout 420 "$suite/k4_gpu_tests" -ts=gpu_stages --no-colors=true \
    >"$out/suite.log" 2>&1
  rc=$?
  grep -E "sweep: [^r]|SKIPPED|MISMATCH|first mismatching|test cases:|assertions:|Status" "$out/suite.log" >>"$sum"
  if [[ $rc -eq 0 ]]; then note "suite: PASS ($((SECONDS - t0)) s)"; else note "suite: FAIL rc=$rc ($((SECONDS - t0)) s)"; status=1; fi

  # 1a. the exact integer tensor-core block dots (device/exact_mma.hpp): every tile through
  # mma.sync and through the shuffle fallback, bit for bit against the model
  t0=$SECONDS
  timeout 120 "$suite/k4_gpu_tests" -ts=gpu_exact_mma --no-colors=true >"$out/exact_mma.log" 2>&1
  rc=$?
  grep -E "gpu_exact_mma|MISMATCH|test cases:|assertions:" "$out/exact_mma.log" | head -20 >>"$sum"
  if [[ $rc -eq 0 ]]; then note "exact mma: PASS ($((SECONDS - t0)) s)"; else note "exact mma: FAIL rc=$rc"; status=1; fi

  # 1b. goldens through the device into dumps (gpu_golden), then the tools themselves: k4 golden,
  # k4_device run --diff (must exit 0), k4 diff of the dump (must exit 0)
  t0=$SECONDS
  timeout 150 "$suite/k4_gpu_tests" -ts=gpu_golden --no-colors=true >"$out/golden.log" 2>&1
  rc=$?
  grep -E "gpu_golden:|MISMATCH|test cases:|assertions:" "$out/golden.log" >>"$sum"
  if [[ $rc -eq 0 ]]; then note "golden suite: PASS ($((SECONDS - t0)) s)"; else note "golden suite: FAIL rc=$rc"; status=1; fi
  local work=${TMPDIR:-/tmp}/k4-gpu-suite.$$
  mkdir -p "$work"
  # (a fourth field: the golden's --variant; index.cp = on (V6.2): 287 / 288 blocks short, 289 up long)
  for spec in "tiny 2 5 20000" "minimax-m3-tp4 4 16 65536" "tiny 4 6 36736,36864,36865,38400,256000,0 index.cp=on"; do
    read -r p tp S ctx var <<<"$spec"
    t0=$SECONDS
    timeout 120 "$suite/k4" golden --preset "$p" --tp "$tp" --tokens "$S" --context "$ctx" ${var:+--variant "$var"} --out "$work/g.h5" --force \
      >>"$out/tools.log" 2>&1 &&
      timeout 120 "$suite/k4_device" run "$work/g.h5" -o "$work/d.h5" --force --diff >>"$out/tools.log" 2>&1 &&
      timeout 120 "$suite/k4" diff "$work/g.h5" "$work/d.h5" >>"$out/tools.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then note "k4 golden + k4_device run --diff + k4 diff, $p tp $tp S $S context $ctx${var:+ variant $var}: match ($((SECONDS - t0)) s)"
    else note "k4 golden + k4_device run + k4 diff, $p tp $tp S $S${var:+ variant $var}: rc=$rc"; status=1; fi
    grep -E "^k4_device run: config|first divergence|tensors" "$out/tools.log" | tail -3 >>"$sum"
  done
  # a golden of `k4 golden --weights-file` (its w_o and expert rows virtual datasets over the
  # weights file beside it; issue 13): k4_device run --diff matches, for the golden that wrote
  # the file and one that reused it; moved without its weights file: exit 2 naming both files,
  # no dump written
  t0=$SECONDS
  local wk=0 wd=$work/wf
  mkdir -p "$wd/moved"
  for s in 1 2; do
    timeout 120 "$suite/k4" golden --preset tiny --tp 2 --tokens 7 --context 20000 --seed $s --weights-file "$wd/layer.weights.h5" \
      --out "$wd/g$s.h5" >>"$out/tools.log" 2>&1 &&
      timeout 120 "$suite/k4_device" run "$wd/g$s.h5" -o "$wd/d$s.h5" --diff >>"$out/tools.log" 2>&1 || wk=1
  done
  cp "$wd/g1.h5" "$wd/moved/g.h5"
  rc=0
  timeout 60 "$suite/k4_device" run "$wd/moved/g.h5" -o "$wd/moved/d.h5" >"$wd/moved.log" 2>&1 || rc=$?
  cat "$wd/moved.log" >>"$out/tools.log"
  [[ $rc -eq 2 && ! -e $wd/moved/d.h5 ]] && grep -q "golden $wd/moved/g.h5: its weights are in the weights file 'layer.weights.h5'.*not at $wd/moved/layer.weights.h5" "$wd/moved.log" || wk=1
  if [[ $wk -eq 0 ]]; then note "weights-file goldens (tiny tp 2 S 7, written + reused): k4_device run --diff match; moved without the weights file: exit 2 naming both files ($((SECONDS - t0)) s)"
  else note "weights-file goldens: FAIL (tools.log; moved run rc=$rc)"; status=1; fi
  tail -1 "$wd/moved.log" | cut -c1-300 >>"$sum"
  # goldens from checkpoints in the releases' layouts (k4 synth --layout, small: hidden 2048,
  # 8 experts, tp 2; no --preset, no --layer; per-rank o_proj scales; issue 13): the BF16
  # layout at S = 16 (wide MoE), the MXFP4 layout with short, ranked and long rows, the MXFP8
  # layout's E4M3 experts (--variant moe.experts=mxfp8, issue 14); k4_device run --diff matches
  t0=$SECONDS
  local rk=0 rd=$work/release
  mkdir -p "$rd"
  for spec in "bf16|--tokens 16 --context 20000 --seed 3" "mxfp4|--tokens 5 --context 1000,short,300,2000,long --seed 2" \
              "mxfp8|--tokens 5 --context 1000,short,300,2000,long --variant moe.experts=mxfp8 --seed 2"; do
    read -r -a gargs <<<"${spec#*|}"
    local l=${spec%%|*}
    timeout 120 "$suite/k4" synth --layout "$l" --out "$rd/$l" >>"$out/tools.log" 2>&1 &&
      timeout 120 "$suite/k4" golden --checkpoint "$rd/$l" "${gargs[@]}" --out "$rd/g-$l.h5" >>"$out/tools.log" 2>&1 &&
      timeout 120 "$suite/k4_device" run "$rd/g-$l.h5" -o "$rd/d-$l.h5" --diff >>"$out/tools.log" 2>&1 || rk=1
  done
  if [[ $rk -eq 0 ]]; then note "release-layout goldens (k4 synth --layout bf16 / mxfp4 / mxfp8, small, no --preset): k4_device run --diff match ($((SECONDS - t0)) s)"
  else note "release-layout goldens (k4 synth --layout, k4 golden --checkpoint, k4_device run --diff): FAIL (tools.log)"; status=1; fi

  # 1c. the kernel-under-test interface on device memory (k4_device run --kut, device/kut):
  # our kernels as a K4_KUT_DEVICE library must match every case; the deliberately wrong merge
  # must be caught, naming the case, rank, stage merge, tensor x_scale and the token
  t0=$SECONDS
  local kk=0 kd=$work/kut
  mkdir -p "$kd"
  for spec in "S4-mixed|--tokens 4 --context 1000,short,300,2000 --seed 3" \
              "S12-tp2-selected|--tp 2 --tokens 12 --context short --seed 7 --kv-form selected" \
              "S6-tp2-shared-fp8|--tp 2 --tokens 6 --context 1000,short,300,2000,long,900 --variant moe.shared_fp8=on --seed 4" \
              "S4-tp2-mxfp8-experts|--tp 2 --tokens 4 --context 1000,short,300,2000 --variant moe.experts=mxfp8 --seed 4" \
              "S6-tp4-index-cp|--tp 4 --tokens 6 --context 36736,36864,36865,38400,256000,0 --variant index.cp=on --seed 8"; do
    read -r -a gargs <<<"${spec#*|}"
    timeout 60 "$suite/k4" golden --preset tiny --force "${gargs[@]}" --out "$kd/${spec%%|*}.h5" >>"$out/kut.log" 2>&1 || kk=1
  done
  timeout 240 "$suite/k4_device" run --kut "$suite/kut/libk4_kut_ours_device.so" "$kd"/*.h5 >"$out/kut-ours.log" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] && grep -q "device memory of" "$out/kut-ours.log" && grep -q "^5 of 5 cases bit-exact" "$out/kut-ours.log" || kk=1
  timeout 120 "$suite/k4_device" run --kut "$suite/kut/libk4_kut_wrong_merge_device.so" "$kd"/*.h5 >"$out/kut-wrong.log" 2>&1
  local rw=$?
  [[ $rw -eq 1 ]] && grep -Eq "^FAIL  S[^:]*\.h5: rank [0-9], stage merge, tensor x_scale, element \[token [0-9]+\]" "$out/kut-wrong.log" || kk=1
  if [[ $kk -eq 0 ]]; then note "kut (k4_device run --kut, device memory): ours 5 of 5 cases bit-exact; wrong merge caught ($((SECONDS - t0)) s)"
  else note "kut (k4_device run --kut): FAIL (ours rc=$rc, wrong merge rc=$rw: kut-ours.log, kut-wrong.log)"; status=1; fi
  cat "$out/kut-ours.log" "$out/kut-wrong.log" | cut -c1-300 | head -16 >>"$sum"

  # the crash guard in the static build (HDF5 linked in): K4_GUARD_SELFTEST's crash inside
  # libhdf5 is "the file is corrupt", exit 2, its crash in k4 exit 70, for k4 and k4_device;
  # the corrupt dumps of tests/fuzz/libhdf5 exit 2 without a signal (whether this libhdf5.a
  # crashes on them depends on its memory layout); k4_device run refuses a truncated golden
  t0=$SECONDS
  local gk=0
  timeout 60 "$suite/k4" golden --preset tiny --tp 1 --tokens 2 --context 300 --out "$work/g1.h5" --force \
    >>"$out/guard.log" 2>&1 || gk=1
  for cmd in "k4 inspect $work/g1.h5" "k4_device run $work/g1.h5 -o $work/x.h5"; do
    read -r -a argv <<<"$cmd"
    rc=0
    K4_GUARD_SELFTEST=libhdf5 timeout 60 "$suite/${argv[0]}" "${argv[@]:1}" >>"$out/guard.log" 2>&1 || rc=$?
    [[ $rc -eq 2 ]] && tail -1 "$out/guard.log" | grep -q "crashed .* on HDF5 file 'K4_GUARD_SELFTEST': the file is corrupt" || gk=1
    rc=0
    K4_GUARD_SELFTEST=k4 timeout 60 "$suite/${argv[0]}" "${argv[@]:1}" >>"$out/guard.log" 2>&1 || rc=$?
    [[ $rc -eq 70 && ! -e $work/x.h5 ]] || gk=1
  done
  for f in uaf_h5aexists segv_h5aexists; do
    rc=0
    timeout 60 "$suite/k4" diff "$work/g1.h5" "tests/fuzz/libhdf5/$f.h5" >>"$out/guard.log" 2>&1 || rc=$?
    [[ $rc -eq 2 ]] || gk=1
  done
  head -c 20000 "$work/g1.h5" >"$work/trunc.h5"
  rc=0
  timeout 60 "$suite/k4_device" run "$work/trunc.h5" -o "$work/t.h5" >>"$out/guard.log" 2>&1 || rc=$?
  [[ $rc -eq 2 && ! -e $work/t.h5 ]] || gk=1
  if [[ $gk -eq 0 ]]; then note "crash guard (static HDF5): self-tests exit 2 / 70 (k4, k4_device), corrupt dumps exit 2, truncated golden: k4_device run exit 2 ($((SECONDS - t0)) s)"
  else note "crash guard (static HDF5): FAIL (guard.log)"; status=1; fi
  tail -4 "$out/guard.log" | cut -c1-300 >>"$sum"
  rm -rf "$work"

  # 2. the planted variants must fail, naming their stage
  for n in 0 1 2 3 4 5; do
    timeout 60 "$suite/plant/k4_gpu_tests_plant$n" -tc="plant probe" --no-colors=true >"$out/plant$n.log" 2>&1
    rc=$?
    if [[ $rc -ne 0 ]] && grep -q "first mismatching stage: $n\$" "$out/plant$n.log"; then
      note "planted stage $n: caught (suite failed, first mismatching stage $n)"
    else
      note "planted stage $n: NOT CAUGHT as stage $n (rc=$rc; $(grep -m1 'first mismatching' "$out/plant$n.log"))"
      status=1
    fi
  done

  # 3. compute-sanitizer
  local cs=compute-sanitizer
  command -v $cs >/dev/null || cs=/usr/local/cuda/bin/compute-sanitizer
  t0=$SECONDS
  timeout 150 $cs --tool memcheck --error-exitcode 9 "$suite/k4_gpu_tests" -tc="plant probe,sanitizer case" \
    --no-colors=true >"$out/memcheck.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then note "memcheck: clean ($(grep -m1 'ERROR SUMMARY' "$out/memcheck.log"), $((SECONDS - t0)) s)"
  else note "memcheck: rc=$rc ($(grep -m1 'ERROR SUMMARY' "$out/memcheck.log"), $((SECONDS - t0)) s)"; status=1; fi
  t0=$SECONDS
  timeout 120 $cs --tool racecheck --racecheck-report all --error-exitcode 9 "$suite/k4_gpu_tests" \
    -tc="sanitizer case" --no-colors=true >"$out/racecheck.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then note "racecheck: clean ($(grep -m1 'RACECHECK SUMMARY\|ERROR SUMMARY' "$out/racecheck.log"), $((SECONDS - t0)) s)"
  else note "racecheck: rc=$rc ($(grep -m1 'RACECHECK SUMMARY\|ERROR SUMMARY' "$out/racecheck.log"), $((SECONDS - t0)) s)"; status=1; fi

  # 4. the benchmark
  t0=$SECONDS
  timeout 150 "$suite/k4_device" bench --tokens 1,4,16 --repeats ${K4_BENCH_REPEATS:-10} --md "$out/bench.md" \
    >"$out/bench.log" 2>&1
  rc=$?
  if [[ $rc -eq 0 ]]; then note "bench: done ($((SECONDS - t0)) s)"; else note "bench: rc=$rc"; status=1; fi
  grep -E "copy|read|step|total" "$out/bench.log" >>"$sum"

  note "gpu-suite: $([[ $status -eq 0 ]] && echo ALL OK || echo FAILURES) (total $SECONDS s)"
  cat "$sum" >>"$log"
  # the per-step logs go into one archive: a few files to copy back
  (cd "$out" && tar czf logs.tar.gz ./*.log && rm -f plant?.log probe.log memcheck.log racecheck.log bench.log golden.log tools.log guard.log exact_mma.log kut*.log)
  return $status
}

# ------------------------------------------------------------------------- mutants
# The kill table on the GPU: every kernel mutant (device/mutants.hpp) against the kill cases
# (tests/gpu/test_mutants_gpu.cpp), each stopped at its first killing case; the table as
# markdown in $OUT/mutants-gpu.md (docs/gpu-verification.md "Mutants" takes its GPU column).
mutants() {
  local out=${OUT:-out}
  mkdir -p "$out"
  local sum=$out/summary.txt rc
  cat "$suite/BUILD_INFO" >"$sum" 2>/dev/null
  local t0=$SECONDS
  K4_MUTANT_TABLE=$out/mutants-gpu.md timeout 560 "$suite/k4_gpu_tests_mutants" -ts=gpu_mutants --no-colors=true \
    >"$out/mutants.log" 2>&1
  rc=$?
  grep -E "^gpu_mutants:|^Kill table|test cases:|assertions:|Status" "$out/mutants.log" >>"$sum"
  echo "gpu-suite mutants: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$sum"
  return $rc
}

# ------------------------------------------------------------------------- emulate
# The kernels' host emulation (cmake/K4Emulation.cmake: device/*.cu compiled as C++ with
# K4_HOST_EMULATION, block bodies run item by item on the CPU): the CMake target k4_emu_tests
# of the CPU build in $K4_EMU_BUILD (default build/, configured if it is not), then the doctest
# arguments given (none: the cases ctest runs, label "emulation"). No GPU: checks the
# kernels' indexing, orders and phase structure, not the GPU's arithmetic.
emulate() {
  set -e
  local dir=${K4_EMU_BUILD:-build}
  [[ -f $dir/CMakeCache.txt ]] || cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
  shift
  if [[ $# -eq 0 ]]; then
    cmake --build "$dir"  # the planted variants too
    ctest --test-dir "$dir" -L emulation --output-on-failure
  else
    cmake --build "$dir" --target k4_emu_tests
    "$dir/k4_emu_tests" "$@"
  fi
}

case $mode in
  build) build ;;
  run) run ;;
  mutants) mutants ;;
  emulate) emulate "$@" ;;
  *) echo "usage: scripts/gpu-suite.sh build|run|mutants|emulate [doctest args]" >&2; exit 2 ;;
esac
