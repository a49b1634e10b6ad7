#!/bin/bash
# Issue 42 on the GPU machine: `bash bench/run_issue42_gpu.sh PART OUT`, after `. scripts/gpu-setup.sh`.
# Each part fits one device call (at most 10 minutes; bench_mixes writes the table of what it measured
# when its timeout stops it). Every arm side by side in one run, each job its own uid (--uids), and
# one variant arm per NAME=VALUE in $VARIANTS (default "NVSHARE_PROMPT_HOLD=host": launches wait on
# the host, the rule before the GPU held a job's queue), the A/B of the change in the same run;
# $HOOK_ENV (NAME=VALUE ...) goes to every nvshare arm's jobs (e.g. NVSHARE_LOG_LEVEL=debug);
# GPU_TIMES=1 gives bench_mixes --gpu-times (the PyTorch members' kernel traces, in logs.tgz's ktrace/);
# DUTY=RUN:IDLE gives --duty (the training steps and idles in turn: each server's p99 beside it stepping
# over beside it idle, in one run and process, whatever the host's pace did meanwhile):
#   serve   bench_mixes.py serve-gengraph, serve-gen and serve-cnn: a PyTorch server (bench/serve_torch.py:
#           the same decoded by CUDA-graph replays; model.generate of a random-weight decoder; a batch-1
#           ResNet-18-like CNN) beside gpu_bench's W1 PyTorch training, arms serial (each alone),
#           colocate, mps and nvshare, a 6 s window per arm. Targets: server p99 <= 1.2 x alone, the
#           training >= 0.95 of its steps/s under co-location.
#   mixes   bench_mixes.py serve2 (burst.c's 3 ms requests beside a compute-bound job: p99 <= 1.2 x
#           alone), mix4 and mix8 (a server among 4 and 8 jobs: p99 <= 1.5 x alone) and mix3 (an
#           interactive probe: p99 within 1 ms of alone), same arms, 4 s windows.
# OUT gets the table (table.md), results.json, one latency figure per mix (latency_<mix>.svg, at most
# 4), the run's log (PART.log) and every job's log with the timelines (logs.tgz), with GPU_TIMES=1 the
# kernel traces (ktrace.tar.xz): at most 8 files.
# TIMEOUT_S (545) bounds the benchmark, to leave a call room for more.
# REPS=N runs it N times in the call, the same arms each time (a p99 of 400 requests moves 1.1-1.7x
# between runs of one build): table.md has each rep's table under its heading, results.json
# {"reps": [...]}, the figures are the first rep's, logs.tgz has rep<r>/ of each.
set -u
part=$1 out=$2
mkdir -p "$out"
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/issue42-XXXXXX)
case $part in
  serve) mixes=serve-gengraph,serve-gen,serve-cnn seconds=6 ;;
  mixes) mixes=serve2,mix4,mix8,mix3 seconds=4 ;;
  *) echo "usage: $0 serve|mixes OUT" >&2; exit 2 ;;
esac
mixes=${MIXES:-$mixes} seconds=${SECONDS_PER_ARM:-$seconds}   # $MIXES, $ARMS: another choice for one call
extra=()
for v in ${VARIANTS-NVSHARE_PROMPT_HOLD=host}; do extra+=(--variant "$v"); done
for v in ${HOOK_ENV-}; do extra+=(--hook-env "$v"); done
[ "${GPU_TIMES:-0}" = 1 ] && extra+=(--gpu-times)
[ -n "${DUTY:-}" ] && extra+=(--duty "$DUTY")
reps=${REPS:-1}
[[ $reps =~ ^[1-9]$ ]] || { echo "REPS=$reps is not a number from 1 to 9" >&2; exit 2; }
: >"$out/$part.log"
for r in $(seq 1 "$reps"); do
  mkdir -p "$work/rep$r"
  timeout $((${TIMEOUT_S:-545} / reps)) python3 bench/bench_mixes.py --out "$work/rep$r" --mixes "$mixes" \
      --arms "${ARMS:-serial,colocate,mps,nvshare}" "${extra[@]}" --uids --seconds "$seconds" \
      >>"$out/$part.log" 2>&1
done
if [ "$reps" = 1 ]; then
  cp "$work"/rep1/table.md "$work"/rep1/results.json "$out"/ 2>/dev/null
else
  for r in $(seq 1 "$reps"); do
    printf '## rep %s of %s\n\n' "$r" "$reps"
    cat "$work/rep$r/table.md" 2>/dev/null || echo "(no table: the rep did not finish)"
    echo
  done >"$out/table.md"
  python3 - "$work" "$reps" >"$out/results.json" <<'PY'
import json, pathlib, sys
work, reps = pathlib.Path(sys.argv[1]), int(sys.argv[2])
out = []
for r in range(1, reps + 1):
    f = work / f"rep{r}" / "results.json"
    out.append(json.loads(f.read_text()) if f.exists() else None)
print(json.dumps({"reps": out}))
PY
fi
cp $(ls "$work"/rep1/latency_*.svg 2>/dev/null | head -4) "$out"/ 2>/dev/null
# kernel traces (GPU_TIMES=1) apart: 20 s of a training is some MB; each file back is at most 16 MiB
tar czf "$out/logs.tgz" --exclude='*.ktrace.json' -C "$work" \
    $(cd "$work" && ls -d rep*/logs rep*/timeline_*.svg 2>/dev/null)
if ls "$work"/rep*/logs/ktrace/*.ktrace.json >/dev/null 2>&1; then
  tar cJf "$out/ktrace.tar.xz" -C "$work" $(cd "$work" && ls rep*/logs/ktrace/*.ktrace.json)
  if [ "$(stat -c %s "$out/ktrace.tar.xz")" -gt $((15 << 20)) ]; then
    rm "$out/ktrace.tar.xz"
    echo "run_issue42_gpu: the kernel traces are over 15 MiB packed: not kept (their rows are in logs.tgz)"
  fi
fi
tail -30 "$out/$part.log"
