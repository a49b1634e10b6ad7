#!/bin/bash
# Install nvshare-slurm on a node, as root: the package (daemon, Slurm glue, libnvshare.so) into the
# virtualenv $NVSHARE_PREFIX. It never installs, replaces or configures Slurm or munge: a site's Slurm
# stays exactly as it is. Where Slurm is missing it says what is missing and how sites install it,
# and installs nvshare-slurm all the same (a build host needs no Slurm).
# What it does install when missing, on Debian/Ubuntu only (apt): gcc, python3-venv, python3-dev.
# On EL8/EL9 it names the dnf packages and stops. docs/admin-guide.md has both.
#   NVSHARE_PREFIX       the virtualenv (default /opt/nvshare)
#   NVSHARE_VENV_PYTHON  the Python 3.10+ that creates it (default python3; EL8/EL9: python3.11)
#   NVSHARE_EDITABLE=1   install the checkout in editable mode (development; the hook is built in place)
#   NVSHARE_EXTRAS       pip extras to add, e.g. test
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${NVSHARE_PREFIX:-/opt/nvshare}
PYTHON=${NVSHARE_VENV_PYTHON:-python3}
say() { echo "install.sh: $*"; }
# An executable file on PATH or in /usr/sbin (bash's `command -v` also reports non-executable ones).
have() {
  local path
  path=$(command -v "$1" 2>/dev/null) && [ -f "$path" ] && [ -x "$path" ] && return 0
  [ -f "/usr/sbin/$1" ] && [ -x "/usr/sbin/$1" ]
}

# --- build prerequisites: a C compiler, a Python 3.10+ with venv (and its headers) ---
# The compiler builds libnvshare.so; setup.py binds it to glibc 2.17's symbol versions, so that it
# loads in containers with older images too, and fails the install when it cannot (admin guide).
need=()
have gcc || have cc || need+=(gcc)
if command -v "$PYTHON" >/dev/null 2>&1 \
    && ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
  say "$PYTHON is $("$PYTHON" --version 2>&1); nvshare-slurm needs 3.10 or newer: install one"
  say "  (EL8/EL9: dnf install python3.11 python3.11-devel) and name it: NVSHARE_VENV_PYTHON=python3.11"
  exit 1
fi
# Every job's TaskProlog runs the venv's interpreter as the job's user: a Python that other users
# cannot run (pyenv's under /root, mode 0700) would fail every task of every job on the node
# (TaskProlog failed status=126), nvshare jobs or not. Refused here, before anything is installed.
runs_for_everyone() {   # $1: an interpreter; as root, tried as nobody
  [ "$(id -u)" = 0 ] && command -v runuser >/dev/null 2>&1 && id nobody >/dev/null 2>&1 || return 0
  runuser -u nobody -- "$1" -c 'import encodings, venv' >/dev/null 2>&1
}
if command -v "$PYTHON" >/dev/null 2>&1; then
  real_python=$("$PYTHON" -c 'import sys; print(sys.executable)')   # what the venv links to
  if ! runs_for_everyone "$real_python"; then
    say "ERROR: other users cannot run $real_python (from $PYTHON): the TaskProlog runs it as"
    say "  each job's user, and every task on this node would fail (TaskProlog failed status=126)."
    say "  Use a Python every user can run, e.g. NVSHARE_VENV_PYTHON=/usr/bin/python3 bash scripts/install.sh"
    exit 1
  fi
fi
command -v "$PYTHON" >/dev/null 2>&1 || need+=(python3)
"$PYTHON" -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
"$PYTHON" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(
    os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null || need+=(python3-dev)
if [ ${#need[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    say "apt-get install ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    say "missing: ${need[*]}. On EL8/EL9 (python3 there is 3.6 or 3.9):"
    say "  dnf install gcc python3.11 python3.11-devel"
    say "  NVSHARE_VENV_PYTHON=python3.11 bash scripts/install.sh"
    exit 1
  fi
fi

# --- Slurm: only looked at, never installed ---
slurm_missing=()
for cmd in slurmd scontrol; do
  have "$cmd" || slurm_missing+=("$cmd")
done
if [ ${#slurm_missing[@]} -gt 0 ]; then
  say "WARNING: this node has no ${slurm_missing[*]}. nvshare-slurm needs a working Slurm node"
  say "  (slurmd and scontrol; munge unless the site uses auth/slurm); this script never installs"
  say "  Slurm. Install your site's Slurm, e.g."
  say "    Debian/Ubuntu:  apt-get install slurmd slurm-client munge"
  say "    EL8/EL9:        dnf install epel-release && dnf install slurm-slurmd munge"
  say "                    (or the RPMs your site builds: rpmbuild -ta slurm-<version>.tar.bz2)"
  say "  then set slurm_bin_dir in /etc/nvshare/nvshare.yaml to where scontrol is."
  say "  For a throw-away local cluster (demo, tests) see scripts/install-demo-slurm.sh."
else
  scontrol_dir=$(dirname "$(command -v scontrol)")
  slurmd=$(command -v slurmd || echo /usr/sbin/slurmd)
  version=$("$slurmd" -V 2>/dev/null || true)   # scontrol --version needs a slurm.conf
  say "found ${version:-Slurm} (scontrol in $scontrol_dir); it is left as it is"
  [ "$scontrol_dir" = /usr/bin ] \
    || say "note: set slurm_bin_dir: $scontrol_dir in /etc/nvshare/nvshare.yaml (the default is /usr/bin)"
fi

# --- nvshare-slurm into its own virtualenv ---
[ -x "$PREFIX/bin/python" ] || "$PYTHON" -m venv "$PREFIX"
"$PREFIX/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
target=.
[ -n "${NVSHARE_EXTRAS:-}" ] && target=".[$NVSHARE_EXTRAS]"
if [ "${NVSHARE_EDITABLE:-0}" = 1 ]; then
  "$PREFIX/bin/python" -m pip install -q -e "$target"
else
  "$PREFIX/bin/python" -m pip install -q "$target"
fi
# The TaskProlog runs before every task as the job's user, who cannot write bytecode: compile the
# package here (an editable install's checkout too), or each task pays ~15 ms more to compile it.
"$PREFIX/bin/python" -m compileall -q "$("$PREFIX/bin/python" -c 'import nvshare_slurm, os; print(os.path.dirname(nvshare_slurm.__file__))')" >/dev/null 2>&1 || true
# The TaskProlog and the hook run as the job's user: everything under the prefix must be readable.
chmod -R a+rX "$PREFIX"
# ... and so must the interpreter the venv points to (an existing venv may predate the check
# above) and, for an editable install, the checkout: tried as nobody, as a job's user would.
if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null 2>&1 && id nobody >/dev/null 2>&1 \
    && ! runuser -u nobody -- "$PREFIX/bin/nvshare-taskprolog" --help >/dev/null 2>&1; then
  say "ERROR: other users cannot run $PREFIX/bin/nvshare-taskprolog (python"
  say "  $(readlink -f "$PREFIX/bin/python")): every task on this node would fail in the TaskProlog."
  say "  Remove $PREFIX and install again with a Python every user can run"
  say "  (NVSHARE_VENV_PYTHON=/usr/bin/python3), from a checkout all users can read."
  exit 1
fi
say "nvshare-slurm installed in $PREFIX ($("$PREFIX/bin/python" --version))"
# An editable install has no data files: the checkout's slurm/ and docs/ are the same files.
if [ -d "$PREFIX/share/nvshare-slurm" ]; then
  say "snippets, systemd unit and example config in $PREFIX/share/nvshare-slurm;" \
    "docs in $PREFIX/share/doc/nvshare-slurm"
fi
