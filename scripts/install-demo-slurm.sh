#!/bin/bash
# The demo's and the tests' Slurm, as root on Debian/Ubuntu: Debian's slurm-wlm and munge from apt,
# and make (the tests build the fake CUDA driver with it). Only for scripts/demo.sh and
# scripts/test.sh, which start their own throw-away cluster in a temp dir; a cluster node keeps its
# site's Slurm (scripts/install.sh never installs one). Does nothing when all of it is there already.
set -euo pipefail
need=()
# crun: tests/slurm/test_containers.py runs Slurm OCI containers (srun --container).
for cmd in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge make:make crun:crun; do
  path=$(command -v "${cmd%%:*}" 2>/dev/null) && [ -f "$path" ] && [ -x "$path" ] && continue
  [ -f "/usr/sbin/${cmd%%:*}" ] && [ -x "/usr/sbin/${cmd%%:*}" ] || need+=("${cmd#*:}")
done
[ -e /etc/munge/munge.key ] || need+=(munge)
[ ${#need[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-demo-slurm.sh: missing ${need[*]}; this script installs them on Debian/Ubuntu only."
  echo "  On EL8/EL9: dnf install epel-release && dnf install slurm-slurmctld slurm-slurmd munge make"
  exit 1
fi
echo "install-demo-slurm.sh: apt-get install slurm-wlm ${need[*]} (for the demo and tests only)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# slurm-wlm pulls slurmctld, slurmd and the client commands; munge creates /etc/munge/munge.key.
apt-get install -y -qq --no-install-recommends slurm-wlm "${need[@]}" >/dev/null
