#!/bin/bash
# The real-Slurm tier (tests/slurm) once more, against Slurm 24.11 and Python 3.13: Debian 13
# (trixie) in a chroot on this Debian 12 machine, as root. scripts/test.sh runs it after its own run
# (Slurm 22.05), so the supported range is tested at both ends.
#   - The root filesystem is made once with debootstrap (installed when missing) and kept under
#     $NVSHARE_TRIXIE_CACHE (default /var/cache/nvshare-trixie); NVSHARE_TRIXIE_REFRESH=1 makes it anew.
#   - /proc, /sys, /dev, /dev/pts are bound in, /tmp is a fresh tmpfs, and the checkout is bound
#     read-only at /checkout and copied to /opt/nvshare-src: the chroot's builds (its gcc and glibc)
#     never land in the host's tree.
#   - The checkout goes into the venv /opt/nvshare-test inside the chroot (pip, editable), readable
#     by the users the tests run jobs as. A munge key is made inside the chroot.
#   - Every mount is undone and every process left inside the chroot ended on exit.
# Arguments go to pytest (default: tests/slurm). Exit status: pytest's, or 1 when the chroot cannot be made.
# `--record DIR` instead records Slurm 24.11's outputs into DIR (tests/slurm/record_outputs.py).
set -euo pipefail
cd "$(dirname "$0")/.."
CHECKOUT=$(pwd)
CACHE=${NVSHARE_TRIXIE_CACHE:-/var/cache/nvshare-trixie}
ROOT=$CACHE/root
MIRROR=${NVSHARE_TRIXIE_MIRROR:-http://deb.debian.org/debian}
# passwd and util-linux (useradd, runuser): tests/slurm/test_users.py runs jobs as other users.
# crun: tests/slurm/test_containers.py (srun --container).
PACKAGES="slurm-wlm munge python3 python3-venv python3-dev gcc libc6-dev make procps passwd
          util-linux ca-certificates crun"
say() { echo "test-slurm-2411.sh: $*"; }
trap 'say "failed at line $LINENO: $BASH_COMMAND"' ERR
[ "$(id -u)" = 0 ] || { say "needs root (debootstrap, chroot, mounts)"; exit 1; }

# ---- the root filesystem, made once ----------------------------------------------------------
STAMP="$CACHE/ready"
want_stamp="trixie $MIRROR $(echo $PACKAGES)"
if [ "${NVSHARE_TRIXIE_REFRESH:-0}" = 1 ] || [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want_stamp" ]; then
  if ! command -v debootstrap >/dev/null 2>&1; then
    say "apt-get install debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  # A half-made root from an interrupted run is made again from nothing; a mount left inside it
  # by a killed run is undone first, so rm never walks into the host's /proc or /dev.
  if [ -d "$ROOT" ]; then
    grep -q " $ROOT/" /proc/mounts && umount -R -l "$ROOT"/{tmp,checkout,dev,sys,proc} 2>/dev/null || true
    mountpoint -q "$ROOT" && umount -l "$ROOT" 2>/dev/null || true
    grep -q " $ROOT/" /proc/mounts && { say "mounts left under $ROOT; not removing it"; exit 1; }
    rm -rf --one-file-system "$ROOT"
  fi
  rm -f "$STAMP"
  mkdir -p "$ROOT"
  start=$SECONDS
  say "debootstrap trixie into $ROOT (once; later runs reuse it)"
  debootstrap --variant=minbase trixie "$ROOT" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log"; say "debootstrap failed (log: $CACHE/debootstrap.log)"; exit 1; }
  # Services never start inside the chroot at install time; the tests start their own daemons.
  printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d"
  chmod 755 "$ROOT/usr/sbin/policy-rc.d"
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  mount -t proc proc "$ROOT/proc"
  if ! chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
      sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends $(echo $PACKAGES)" \
      > "$CACHE/apt.log" 2>&1; then
    umount "$ROOT/proc"
    tail -20 "$CACHE/apt.log"; say "apt-get install in the chroot failed (log: $CACHE/apt.log)"; exit 1
  fi
  umount "$ROOT/proc"
  chroot "$ROOT" apt-get clean
  echo "$want_stamp" > "$STAMP"
  say "root filesystem ready in $((SECONDS - start)) s"
fi

# ---- mounts, undone on exit ------------------------------------------------------------------
cleanup() {
  local pid root
  # Whatever still runs inside the chroot (a slurmstepd, a job) was started by this run.
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    root=$(readlink "/proc/$pid/root" 2>/dev/null) || continue
    [ "$root" = "$ROOT" ] && kill -9 "$pid" 2>/dev/null || true
  done
  for mnt in tmp checkout dev/pts dev sys proc; do
    mountpoint -q "$ROOT/$mnt" && { umount -R "$ROOT/$mnt" 2>/dev/null || umount -R -l "$ROOT/$mnt"; }
  done
  mountpoint -q "$ROOT" && { umount "$ROOT" 2>/dev/null || umount -l "$ROOT"; }
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# The chroot's / a mount point of its own, as a node's / is: crun (tests/slurm/test_containers.py)
# sets the propagation of / in its container's mount namespace, which fails on a plain directory.
# Private, so the mounts below stay under it alone.
mountpoint -q "$ROOT" || { mount --bind "$ROOT" "$ROOT" && mount --make-private "$ROOT"; }
mkdir -p "$ROOT/checkout"
mount -t proc proc "$ROOT/proc"
mount --rbind /sys "$ROOT/sys" && mount --make-rslave "$ROOT/sys"
mount --rbind /dev "$ROOT/dev" && mount --make-rslave "$ROOT/dev"
mountpoint -q "$ROOT/dev/pts" || mount --bind /dev/pts "$ROOT/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$ROOT/tmp"
mount --bind "$CHECKOUT" "$ROOT/checkout" && mount -o remount,bind,ro "$ROOT/checkout"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
cp /etc/hosts "$ROOT/etc/hosts"
# The host's CA bundle (Debian's, plus any site CA in front of PyPI): pip inside trusts what the host does.
[ -s /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/ssl/certs/"

# The checkout's files as git sees them (tracked, and untracked ones it does not ignore): no build
# outputs of the host's.
rm -rf "$ROOT/opt/nvshare-src"
mkdir -p "$ROOT/opt/nvshare-src"
if git -C "$CHECKOUT" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$CHECKOUT" ls-files -z --cached --others --exclude-standard \
    | tar -C "$CHECKOUT" --null --no-recursion --ignore-failed-read -T - -cf - \
    | tar -xf - -C "$ROOT/opt/nvshare-src"
else
  tar -C "$CHECKOUT" --exclude=build --exclude='*.so' --exclude='*.egg-info' --exclude=__pycache__ \
    -cf - . | tar -xf - -C "$ROOT/opt/nvshare-src"
fi
chmod -R a+rX "$ROOT/opt/nvshare-src"

inside() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/opt/nvshare-test/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@"
}
[ -s "$ROOT/etc/munge/munge.key" ] || inside sh -c \
  'mungekey --create --force 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null;
   chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key'
version=$(inside /usr/sbin/slurmd -V)
say "$version, $(inside python3 --version), $(. "$ROOT/etc/os-release" && echo "$PRETTY_NAME") (chroot $ROOT)"
# Only what tests/slurm needs: the package and pytest (not the wheel tier's zig toolchain).
inside sh -c 'cd /opt/nvshare-src && NVSHARE_PREFIX=/opt/nvshare-test NVSHARE_EDITABLE=1 NVSHARE_EXTRAS= \
    NVSHARE_VENV_PYTHON=/usr/bin/python3 bash scripts/install.sh >/tmp/install.log 2>&1 \
  && /opt/nvshare-test/bin/python -m pip install -q "pytest>=7" "pytest-timeout>=2" >>/tmp/install.log 2>&1' \
  || { tail -30 "$ROOT/tmp/install.log"; say "installing the checkout in the chroot failed"; exit 1; }
if [ "${1:-}" = --record ]; then
  # Slurm 24.11's outputs as fixtures (tests/slurm/record_outputs.py), copied out to $2.
  [ -n "${2:-}" ] || { say "--record needs a directory"; exit 2; }
  mkdir -p "$2"
  inside sh -c 'cd /opt/nvshare-src && python -m tests.slurm.record_outputs /tmp/record'
  cp "$ROOT"/tmp/record/* "$2"/
  exit 0
fi
[ $# -gt 0 ] || set -- tests/slurm
trap - ERR
set +e
inside sh -c 'cd /opt/nvshare-src && exec python -m pytest -p no:cacheprovider -ra "$@"' pytest "$@"
rc=$?
set -e
# On success pytest's closing line stays the last line (CI reads it).
[ $rc = 0 ] || say "$version: pytest exit $rc"
exit $rc
