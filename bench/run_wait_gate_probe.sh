#!/bin/bash
# bench/wait_gate_probe.cu's arms, one after another on the GPU machine (5 s each):
#   bash bench/run_wait_gate_probe.sh OUT
set -u
out=${1:-/tmp}
cd "$(dirname "$0")/.."
nvcc -O2 -arch=sm_90 -o /tmp/wait_gate_probe bench/wait_gate_probe.cu -lcuda || exit 1
P=/tmp/wait_gate_probe F=/dev/shm/wait_gate_flag S=${SECONDS_EACH:-5}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "server alone";              $P server $F $S 0 20 20
echo "trainer alone";             $P trainer $F $S 0 1
echo "trainer alone, waits seg 1"; $P trainer $F $S 1 1
for arm in "0 0 1" "1 1 1" "1 1 4" "1 0 1"; do
  set -- $arm
  echo "pair: trainer gate $1 seg $3, server gate $2"
  $P trainer $F $((S + 1)) $1 $3 & tp=$!
  sleep 0.5
  $P server $F $S $2 20 20
  wait $tp
done
