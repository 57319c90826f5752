#!/usr/bin/env bash
# build-device.sh -- build the device binaries for NVIDIA sm_90 (H200) with nvcc into
# build-cuda/ (ignored), linked so that they run on the GPU machine (Ubuntu 24.04, no HDF5):
# HDF5 (libhdf5.a libsz.a libaec.a libz.a), libgomp, libstdc++ and libgcc static, the CUDA
# runtime static; host code with -mfma (same bits, faster reference math).
#
#   scripts/build-device.sh                 k4_device_all: k4_device_lib, k4_gpu_tests, k4_device
#   scripts/build-device.sh --all           also the CPU targets (k4, k4_tests) the same way
#   scripts/build-device.sh TARGET...       just those targets
#
# Then, on the GPU machine (with build-cuda/ copied there):  build-cuda/k4_gpu_tests
# Environment: CUDACXX / K4_NVCC (default /usr/local/cuda/bin/nvcc), K4_CUDA_ARCH (90),
# K4_BUILD_JOBS (ninja's default).
set -euo pipefail
cd "$(dirname "$0")/.."

nvcc=${K4_NVCC:-${CUDACXX:-/usr/local/cuda/bin/nvcc}}
arch=${K4_CUDA_ARCH:-90}
dir=build-cuda
[[ -x $nvcc ]] || { echo "build-device.sh: nvcc not found at $nvcc (set K4_NVCC)" >&2; exit 1; }

targets=(k4_device_all)
if [[ $# -gt 0 ]]; then
  if [[ $1 == --all ]]; then targets=(all); else targets=("$@"); fi
fi

cmake -S . -B "$dir" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DK4_CUDA=ON \
  -DK4_STATIC_RUNTIME=ON \
  -DK4_HOST_FMA=ON \
  -DCMAKE_CUDA_COMPILER="$nvcc" \
  -DCMAKE_CUDA_ARCHITECTURES="$arch"
jobs=()
[[ -n ${K4_BUILD_JOBS:-} ]] && jobs=(-j "$K4_BUILD_JOBS")
cmake --build "$dir" "${jobs[@]}" --target "${targets[@]}"

# Check what the GPU machine will need: nothing beyond glibc (libcuda comes from the driver
# and is opened at run time by the static CUDA runtime).
status=0
for exe in "$dir"/k4_gpu_tests "$dir"/k4_device "$dir"/k4 "$dir"/k4_tests; do
  [[ -x $exe ]] || continue
  bad=$(ldd "$exe" | grep -E -v 'linux-vdso|ld-linux|/libc\.so|/libm\.so|/libdl\.so|/libpthread\.so|/librt\.so' || true)
  if [[ -n $bad ]]; then
    echo "build-device.sh: $exe links dynamically against more than glibc:" >&2
    echo "$bad" >&2
    status=1
  else
    echo "build-device.sh: ok  $exe ($(du -h "$exe" | cut -f1), glibc only)"
  fi
done
exit $status
