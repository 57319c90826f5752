#!/usr/bin/env bash
# same-sass.sh -- is the working tree's GPU machine code the same as a commit's?
#
#   scripts/same-sass.sh [REV]      (REV: default HEAD)
#
# Compiles every device/*.cu to an sm_90 cubin (nvcc -cubin, the flags of scripts/build-device.sh
# that change code) twice, from REV (a temporary worktree) and from the working tree, and compares
# each kernel's code, constant, info and shared-memory sections byte for byte, their names with
# the anonymous-namespace hash nvcc derives from the path taken out. Prints one line a file and
# exits 1 when any kernel differs. A change of the host emulation, comments or host code leaves
# the GPU verification of REV's device code valid only when this says "identical" (k4_device's
# .nv_fatbin changes with line numbers alone). Needs nvcc (K4_NVCC) and python3-pyelftools.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
nvcc=${K4_NVCC:-/usr/local/cuda/bin/nvcc}
[[ -x $nvcc ]] || { echo "same-sass.sh: nvcc not found at $nvcc (set K4_NVCC)" >&2; exit 2; }
/usr/bin/python3 -c "import elftools" 2>/dev/null || { echo "same-sass.sh: needs python3-pyelftools (apt-get install python3-pyelftools)" >&2; exit 2; }
work=$(mktemp -d)
trap 'git worktree remove --force "$work/old" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/old" "$rev" >/dev/null 2>&1 || { echo "same-sass.sh: no commit '$rev'" >&2; exit 2; }
flags=(-cubin -arch=sm_90 -O3 -DNDEBUG --fmad=false -ftz=false -prec-div=true -prec-sqrt=true -std=c++17
       -isystem=/usr/include/eigen3 -isystem=/usr/include/hdf5/serial -Xcompiler=-ffp-contract=off -I.)
status=0
for f in device/*.cu; do
  b=$(basename "$f" .cu)
  if [[ ! -f $work/old/$f ]]; then echo "$b: new file (no $rev version)"; continue; fi
  (cd "$work/old" && "$nvcc" "${flags[@]}" "$f" -o "$work/$b.old.cubin") &
  "$nvcc" "${flags[@]}" "$f" -o "$work/$b.new.cubin"
  wait $!
  /usr/bin/python3 - "$work/$b.old.cubin" "$work/$b.new.cubin" "$b" <<'PY' || status=1
import re, sys
from elftools.elf.elffile import ELFFile
def sections(path):
    norm = lambda n: re.sub(r'_GLOBAL__N__[0-9a-f]{8}_', '_GLOBAL__N__', n)
    with open(path, 'rb') as f:
        return {norm(s.name): s.data() for s in ELFFile(f).iter_sections()
                if s.name.startswith(('.text', '.nv.constant', '.nv.info', '.nv.shared', '.nv.global'))}
old, new, name = sections(sys.argv[1]), sections(sys.argv[2]), sys.argv[3]
kernels = sum(1 for k in new if k.startswith('.text.'))
diff = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
print(f"{name}: {kernels} kernel(s), " + ("identical" if not diff else f"{len(diff)} section(s) differ: " + " ".join(diff)[:300]))
sys.exit(1 if diff else 0)
PY
done
exit $status
