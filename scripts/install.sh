#!/bin/bash
# Install what nvshare-slurm needs on a fresh Debian/Ubuntu machine, as root:
# Slurm and munge from apt, a C compiler, and nvshare-slurm itself into the virtualenv $NVSHARE_PREFIX.
#   NVSHARE_EDITABLE=1  install the checkout in editable mode (tests: the hook is built in place)
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${NVSHARE_PREFIX:-/opt/nvshare}

need=()
for cmd in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge gcc:gcc make:make; do
  command -v "${cmd%%:*}" >/dev/null 2>&1 || need+=("${cmd#*:}")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
[ -e "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || need+=(python3-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "install.sh: apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # slurm-wlm pulls slurmctld, slurmd and the client commands.
  apt-get install -y -qq --no-install-recommends slurm-wlm "${need[@]}" >/dev/null
fi

if [ ! -x "$PREFIX/bin/python" ]; then
  python3 -m venv "$PREFIX"
fi
"$PREFIX/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if [ "${NVSHARE_EDITABLE:-0}" = 1 ]; then
  "$PREFIX/bin/python" -m pip install -q -e '.[test]'
else
  "$PREFIX/bin/python" -m pip install -q '.[test]'
fi
chmod -R a+rX "$PREFIX"
echo "install.sh: nvshare-slurm installed in $PREFIX ($("$PREFIX/bin/python" --version))"
