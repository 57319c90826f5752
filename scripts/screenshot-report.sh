#!/usr/bin/env bash
# screenshot-report.sh -- render an HTML report (k4 diff --html) in headless Chromium and
# save a PNG of the first screen, to check that it renders (tests/cpu/test_report.cpp).
#
#   scripts/screenshot-report.sh REPORT.html OUT.png [WIDTH,HEIGHT]     (default 1200,900)
#
# Chromium runs offline: no sandbox (containers), no GPU, no QUIC, no first-run, no
# background networking, component updates or sync, a fresh throw-away profile.
# Exit 0 with OUT.png written; 3 when chromium is not installed (scripts/setup.sh
# --chromium installs it); 1 when it ran but wrote no PNG (its log is printed).
set -euo pipefail

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '2,11p' "$0"
  exit 0
fi
if [[ $# -lt 2 ]]; then
  echo "usage: scripts/screenshot-report.sh REPORT.html OUT.png [WIDTH,HEIGHT]" >&2
  exit 2
fi
report=$1
out=$2
size=${3:-1200,900}

chromium=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $chromium ]]; then
  echo "screenshot-report.sh: chromium is not installed (scripts/setup.sh --chromium)" >&2
  exit 3
fi
[[ -f $report ]] || { echo "screenshot-report.sh: no such report '$report'" >&2; exit 2; }

abs=$(realpath "$report")
out_abs=$(realpath -m "$out")
profile=$(mktemp -d)
log=$(mktemp)
trap 'rm -rf "$profile" "$log"' EXIT
rm -f "$out_abs"

timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --screenshot="$out_abs" --window-size="$size" \
  "file://$abs" >"$log" 2>&1 || true

if [[ ! -s $out_abs ]]; then
  echo "screenshot-report.sh: chromium wrote no screenshot; its log:" >&2
  cat "$log" >&2
  exit 1
fi
echo "screenshot-report.sh: wrote $out_abs ($size) from $abs"
