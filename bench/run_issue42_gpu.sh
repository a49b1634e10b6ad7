#!/bin/bash
# Issue 42 on the GPU machine: `bash bench/run_issue42_gpu.sh PART OUT`, after `. scripts/gpu-setup.sh`.
# Each part fits one device call (at most 10 minutes):
#   serve   bench_mixes.py serve-gen, serve-gengraph and serve-cnn: a PyTorch server (bench/serve_torch.py:
#           model.generate of a random-weight decoder; the same decoded by CUDA-graph replays; a batch-1
#           ResNet-18-like CNN) beside gpu_bench's W1 PyTorch training, each job its own uid, arms serial
#           (each alone), colocate, mps and nvshare, a 6 s window per arm. Targets: server p99 <= 1.2 x
#           alone, the training >= 0.95 of its steps/s under co-location.
# OUT gets the table (table.md), results.json, one latency figure per mix (latency_<mix>.svg), the run's
# log (serve.log) and every job's log with the timelines (logs.tgz): 7 files.
set -u
part=$1 out=$2
mkdir -p "$out"
cd "$(dirname "$0")/.."
case $part in
  serve)
    work=$(mktemp -d /tmp/issue42-XXXXXX)
    timeout 555 python3 bench/bench_mixes.py --out "$work" --mixes serve-gen,serve-gengraph,serve-cnn \
        --arms serial,colocate,mps,nvshare --uids --seconds 6 >"$out/serve.log" 2>&1
    cp "$work"/table.md "$work"/results.json "$work"/latency_*.svg "$out"/ 2>/dev/null
    tar czf "$out/logs.tgz" -C "$work" logs $(cd "$work" && ls timeline_*.svg 2>/dev/null)
    tail -12 "$out/serve.log" ;;
  *) echo "usage: $0 serve OUT" >&2; exit 2 ;;
esac
