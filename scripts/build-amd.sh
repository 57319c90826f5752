#!/usr/bin/env bash
# build-amd.sh -- compile every device/*.cu and tests/gpu/*.cu (the GPU suite's numerics
# kernels) for an AMD GPU with Debian's hipcc (HIP 5.2, clang-15), to prove the device code
# builds for AMD. Objects go to build-amd/ (ignored).
#
#   scripts/build-amd.sh                   gfx90a
#   K4_AMD_ARCHS="gfx90a gfx940" scripts/build-amd.sh
#   K4_AMD_EXTRA_FLAGS="-Wall -Wextra" scripts/build-amd.sh
#
# Flags: -x hip --offload-arch=<arch> -ffp-contract=off -Werror -std=c++17 -I<repo root>.
# HIP_PLATFORM=amd and HIP_CLANG_PATH are set here: without /usr/bin/clang++ (Debian's
# `clang` package, which hipcc does not depend on) hipcc would otherwise pick nvcc as soon as
# /usr/local/cuda exists. A probe kernel is checked to hold code for the requested arch first.
set -euo pipefail
cd "$(dirname "$0")/.."

archs=${K4_AMD_ARCHS:-gfx90a}
extra=${K4_AMD_EXTRA_FLAGS:-}
out=build-amd
export HIP_PLATFORM=${HIP_PLATFORM:-amd}
if [[ -z ${HIP_CLANG_PATH:-} ]]; then
  for d in /usr/lib/llvm-15/bin /usr/lib/llvm-16/bin /usr/lib/llvm-17/bin; do
    if [[ -x $d/clang ]]; then export HIP_CLANG_PATH=$d; break; fi
  done
fi

command -v hipcc >/dev/null || { echo "build-amd.sh: hipcc not found (scripts/setup.sh installs it)" >&2; exit 1; }
shopt -s nullglob
sources=(device/*.cu tests/gpu/*.cu)
if [[ ${#sources[@]} -eq 0 ]]; then
  echo "build-amd.sh: no device/*.cu or tests/gpu/*.cu to compile"
  exit 0
fi

mkdir -p "$out"
flags=(-ffp-contract=off -Werror -std=c++17 -I.)

# First a probe kernel: proves that hipcc runs clang for AMD (not nvcc) and emits $arch code.
probe="$out/probe.hip"
printf '%s\n' '#include <hip/hip_runtime.h>' '__global__ void k4_probe(float* p) { p[threadIdx.x] += 1.0f; }' >"$probe"
for arch in $archs; do
  hipcc -x hip --offload-arch="$arch" "${flags[@]}" -c "$probe" -o "$out/probe.$arch.o"
  if ! grep -aq "amdgcn-amd-amdhsa--$arch" "$out/probe.$arch.o"; then
    echo "build-amd.sh: hipcc made no $arch code for a probe kernel (HIP_PLATFORM=$HIP_PLATFORM," \
         "HIP_CLANG_PATH=${HIP_CLANG_PATH:-unset}): is it using nvcc?" >&2
    exit 1
  fi
done

fail=0
for arch in $archs; do
  for src in "${sources[@]}"; do
    obj="$out/$(basename "${src%.cu}").$arch.o"
    # shellcheck disable=SC2086
    if hipcc -x hip --offload-arch="$arch" "${flags[@]}" $extra -c "$src" -o "$obj"; then
      if grep -aq "amdgcn-amd-amdhsa--$arch" "$obj"; then
        echo "build-amd.sh: ok   $src -> $obj ($arch)"
      else
        echo "build-amd.sh: ok   $src -> $obj ($arch; host code only, no kernels)"
      fi
    else
      echo "build-amd.sh: FAIL $src ($arch)" >&2
      fail=1
    fi
  done
done
exit $fail
