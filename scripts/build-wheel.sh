#!/bin/bash
# Build the release wheel into dist/ (or $1): libnvshare.so compiled by zig against glibc 2.17, so the
# wheel is tagged manylinux_2_17_<arch>.manylinux2014_<arch> and its hook loads with every glibc from
# 2.17 (EL7) on, in containers' images too; then auditwheel shows what it needs. Its own
# throw-away build virtualenv; needs python3 (3.10+) and PyPI. (setup.py itself fails a build whose
# library needs a newer glibc; this checks the tag the wheel got.)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-dist}")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q setuptools wheel ziglang auditwheel
NVSHARE_HOOK_CC=zig "$WORK/venv/bin/pip" wheel -q --no-deps --no-build-isolation -w "$OUT" .
wheel=$(ls -t "$OUT"/nvshare_slurm-*.whl | head -1)
case $wheel in
  *manylinux_2_17_*) ;;
  *) echo "build-wheel.sh: $wheel is not tagged manylinux_2_17: its libnvshare.so needs a newer glibc"; exit 1 ;;
esac
"$WORK/venv/bin/auditwheel" show "$wheel"
echo "build-wheel.sh: $wheel"
