#!/bin/bash
# Issue 39 on the GPU machine (docs/gpu-results.md): `bash bench/run_issue39_gpu.sh PART OUT`, after
# `. scripts/gpu-setup.sh`. Each part fits one device call (at most 10 minutes):
#   soak    bench_soak.py: 10 random mixes of 2-6 jobs, memory 0.5-2.0x the usable (at most 64 GiB
#           beyond it, in host memory), 1.5-4 s each, every other job its own uid, serial and
#           co-location beside nvshare
#   mixes   bench_mixes.py mix4-mem (the issue's node: two 70 GiB jobs that do not fit together) with
#           every job its own uid; then gpu_bench.py's W3g pair of PyTorch trainings whose memory
#           grows over their first steps, 8 s each (target 1.10 of serial)
#   long    the W3g pair with 40 s each (target 1.03 of serial)
#   pair    the W3g pair, 8 s each, at the H200's memory and at an H100's (--memory-reserve-percent
#           46: the daemon leaves 75.7 GiB usable and the jobs are sized to an 80 GB GPU)
#   h100    bench_mixes' swap2 at an H100's memory: two 45 GiB compute jobs, 40 s each
set -u
part=$1 out=$2
mkdir -p "$out"
cd "$(dirname "$0")/.."
case $part in
  soak)
    timeout 560 python3 bench/bench_soak.py --out "$out/soak" --mixes 10 --seed 39 --max-jobs 6 \
        --min-seconds 1.5 --max-seconds 4 --arms serial,colocate --uids --host-budget-gib 64 \
        >"$out/soak.log" 2>&1
    tail -20 "$out/soak.log" ;;
  mixes)
    timeout 300 python3 bench/bench_mixes.py --out "$out/mix4mem" --mixes mix4-mem --mem-gib 70 \
        --arms serial,colocate,nvshare --uids --seconds 4 >"$out/mix4mem.log" 2>&1
    tail -14 "$out/mix4mem.log"
    timeout 260 python3 bench/gpu_bench.py --out "$out/w3g8" --workloads W3g --arms serial,nvshare-auto \
        --solo '' --w3-train-seconds 8 >"$out/w3g8.log" 2>&1
    tail -6 "$out/w3g8.log" ;;
  long)
    timeout 560 python3 bench/gpu_bench.py --out "$out/w3g40" --workloads W3g --arms serial,nvshare-auto \
        --solo '' --w3-train-seconds 40 >"$out/w3g40.log" 2>&1
    tail -6 "$out/w3g40.log" ;;
  pair)
    timeout 270 python3 bench/gpu_bench.py --out "$out/w3g8" --workloads W3g --arms serial,nvshare-auto \
        --solo '' --w3-train-seconds 8 >"$out/w3g8.log" 2>&1
    tail -6 "$out/w3g8.log"
    timeout 270 python3 bench/gpu_bench.py --out "$out/w3g8-80" --workloads W3g \
        --arms serial,nvshare-auto --solo '' --w3-train-seconds 8 --memory-reserve-percent 46 \
        >"$out/w3g8-80.log" 2>&1
    tail -6 "$out/w3g8-80.log" ;;
  h100)
    timeout 400 python3 bench/bench_mixes.py --out "$out/swap2" --mixes swap2 --mem-gib 45 \
        --memory-reserve-percent 46 --arms serial,nvshare --seconds 40 >"$out/swap2.log" 2>&1
    tail -8 "$out/swap2.log" ;;
  *) echo "usage: $0 soak|mixes|long|pair|h100 OUT" >&2; exit 2 ;;
esac
