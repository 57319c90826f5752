#!/bin/bash
# 20 goldens of one checkpoint's layer, self-contained and with --weights-file; sizes and wall times.
# usage: scripts/weights-file-sweep.sh K4 CKPT OUTDIR "extra golden args"  (OUTDIR is removed first)
# docs/performance.md, "20 goldens of one layer": the figures it printed.
set -e
K=$1; CK=$2; D=$3; EXTRA=$4
rm -rf $D && mkdir -p $D/self $D/wf
t0=$(date +%s.%N)
for s in $(seq 1 20); do $K golden --checkpoint $CK $EXTRA --seed $s --out $D/self/g$s.h5 > /dev/null; done
t1=$(date +%s.%N)
for s in $(seq 1 20); do $K golden --checkpoint $CK $EXTRA --seed $s --weights-file $D/wf/layer.weights.h5 --out $D/wf/g$s.h5 > /dev/null; done
t2=$(date +%s.%N)
for s in 1 20; do $K diff $D/self/g$s.h5 $D/wf/g$s.h5 > /dev/null; done
echo "self-contained: $(du -cb $D/self/*.h5 | tail -1 | cut -f1) bytes, $(echo "$t1 - $t0" | bc) s"
echo "weights file:   $(du -cb $D/wf/*.h5 | tail -1 | cut -f1) bytes (of which the weights file $(stat -c %s $D/wf/layer.weights.h5)), $(echo "$t2 - $t1" | bc) s"
echo "one golden: self $(stat -c %s $D/self/g2.h5) bytes, with weights file $(stat -c %s $D/wf/g2.h5) bytes"
