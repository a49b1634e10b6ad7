#!/bin/bash
# Issue 15's proof on the GPU machine: DDP jobs sharing the same GPUs through a one-node Slurm.
#
#   . scripts/gpu-setup.sh && bash scripts/gpu-two-gpu-proof.sh OUTDIR            # 2 GPUs (nvidia-h200-x2)
#   . scripts/gpu-setup.sh && bash scripts/gpu-two-gpu-proof.sh OUTDIR --gpus 1 --steps 300   # one GPU
#   bash scripts/gpu-two-gpu-proof.sh OUTDIR --fake                               # CPU: fake driver, 2 fake GPUs
#
# Slurm comes unpacked from the carried .slurmdeb/ (as scripts/gpu-slurm-e2e.sh does) unless
# /opt/slurmroot holds it already, or with --fake from this machine's /usr/sbin. nvshare-slurm runs
# from this checkout (gpu-setup.sh's PYTHONPATH). bench/two_gpu_proof.py does the rest and says
# what it checks; every option after OUTDIR goes to it. Writes OUTDIR/proof.log (this console),
# result.json, results.md, timeline.txt and logs.tar.gz. Exit status 0 when every check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: gpu-two-gpu-proof.sh OUTDIR [--gpus N] [--fake] [options of bench/two_gpu_proof.py]}
shift
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
exec > >(tee "$OUT/proof.log") 2>&1
TEE_PID=$!
say() { echo "gpu-two-gpu-proof: $*"; }
fail() { say "$*"; exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null; exit 1; }
FAKE= MUNGED_STARTED=
for arg in "$@"; do [ "$arg" = --fake ] && FAKE=1; done
# NVLink multicast stays off in everything started from here (the machine's rule).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

[ "$(id -u)" = 0 ] || fail "run as root (slurmctld, slurmd and munged are started)"
PY=${NVSHARE_PROOF_PYTHON:-$(command -v python3)} || fail "no python3"
if [ -n "$FAKE" ]; then
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  [ -x tests/c/build/nvtest ] || make -s -C tests/c || fail "building the fake driver failed"
  [ -f nvshare_slurm/libnvshare.so ] || fail "nvshare_slurm/libnvshare.so not built (setup.py build_ext --inplace)"
  [ -x /usr/sbin/slurmd ] && [ -f /etc/munge/munge.key ] || fail "--fake needs Slurm and munge installed"
  SLURM_ROOT=/
else
  nvidia-smi -L 2>/dev/null | sed 's/^/gpu-two-gpu-proof: /' || fail "no NVIDIA GPU (nvidia-smi)"
  timeout 120 "$PY" -c 'import nvshare_slurm.wire.proto, torch, pynvml' \
    || fail "$PY cannot import nvshare_slurm, torch, pynvml: run '. scripts/gpu-setup.sh' first"
  [ -f nvshare_slurm/libnvshare.so ] || fail "nvshare_slurm/libnvshare.so not built: run '. scripts/gpu-setup.sh' first"
  SLURM_ROOT=/opt/slurmroot
  if [ ! -x "$SLURM_ROOT/usr/sbin/slurmd" ]; then
    [ -f .slurmdeb/gpu-machine-slurm.sh ] || fail "no $SLURM_ROOT and no .slurmdeb/ to unpack it from"
    pgrep -x munged >/dev/null || MUNGED_STARTED=1
    say "unpacking Slurm: .slurmdeb/gpu-machine-slurm.sh install .slurmdeb"
    timeout 180 bash .slurmdeb/gpu-machine-slurm.sh install .slurmdeb || fail "unpacking Slurm failed"
  fi
  [ -x "$SLURM_ROOT/usr/sbin/slurmd" ] && [ -f "$SLURM_ROOT/env.sh" ] || fail "Slurm is not in $SLURM_ROOT"
  # shellcheck disable=SC1091
  . "$SLURM_ROOT/env.sh"
fi
say "python $PY; PYTHONPATH=${PYTHONPATH:-}; Slurm in $SLURM_ROOT"
NVSHARE_SLURM_ROOT=$SLURM_ROOT "$PY" bench/two_gpu_proof.py "$OUT" "$@"
RC=$?
if [ -n "$MUNGED_STARTED" ] && [ -f /run/munge/munged.pid ]; then
  kill "$(cat /run/munge/munged.pid)" 2>/dev/null   # the munged that the unpacking started
fi
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null   # proof.log complete before the caller collects it
exit $RC
