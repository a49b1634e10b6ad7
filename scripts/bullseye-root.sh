#!/bin/bash
# A Debian 11 (bullseye, glibc 2.31) root filesystem for tests/hook/test_glibc_floor.py, which preloads
# the installed libnvshare.so into programs there: an old image, as in a container job. Made once with
# debootstrap (minbase and python3-minimal, installed when missing) and kept under
# $NVSHARE_BULLSEYE_CACHE (default /var/cache/nvshare-bullseye); NVSHARE_BULLSEYE_REFRESH=1 makes it
# anew. scripts/test.sh runs it before pytest; the test skips, naming the log, when there is no root.
# Mirrors tried in order: $NVSHARE_BULLSEYE_MIRROR, else deb.debian.org, then archive.debian.org
# (where bullseye goes when its LTS ends). As root. Exit status 0 when the root is ready.
set -euo pipefail
CACHE=${NVSHARE_BULLSEYE_CACHE:-/var/cache/nvshare-bullseye}
ROOT=$CACHE/root
STAMP=$CACHE/ready
LOG=$CACHE/debootstrap.log
MIRRORS=${NVSHARE_BULLSEYE_MIRROR:-http://deb.debian.org/debian http://archive.debian.org/debian}
PACKAGES=python3-minimal
say() { echo "bullseye-root.sh: $*"; }
[ "$(id -u)" = 0 ] || { say "needs root (debootstrap)"; exit 1; }
mkdir -p "$CACHE"
if [ "${NVSHARE_BULLSEYE_REFRESH:-0}" != 1 ] && [ -f "$STAMP" ] && [ -x "$ROOT/bin/true" ]; then
  say "$ROOT is ready ($(cat "$STAMP"))"
  exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
  say "apt-get install debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
# The test copies into $ROOT/tmp and mounts nothing: a half-made root is simply made again.
rm -f "$STAMP"
rm -rf --one-file-system "$ROOT"
start=$SECONDS
: > "$LOG"
for mirror in $MIRRORS; do
  say "debootstrap bullseye from $mirror into $ROOT (once; later runs reuse it)"
  if debootstrap --variant=minbase --include="$PACKAGES" bullseye "$ROOT" "$mirror" >> "$LOG" 2>&1; then
    echo "bullseye $mirror $PACKAGES" > "$STAMP"
    say "root filesystem ready in $((SECONDS - start)) s ($(du -sh "$ROOT" | cut -f1))"
    exit 0
  fi
  rm -rf --one-file-system "$ROOT"
done
tail -5 "$LOG"
say "debootstrap failed from every mirror ($MIRRORS); log: $LOG"
exit 1
