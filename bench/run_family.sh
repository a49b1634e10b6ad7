#!/bin/bash
# Issue 12's benchmark family on the GPU machine, in two commands of at most 9 minutes each:
#
#   bash bench/run_family.sh OUTDIR part1     # 14 pairs: busy 10 and 30 %, 60 % with 50 ms steps
#   bash bench/run_family.sh OUTDIR part2     # 4 pairs busy 60 %, 3-4 bursty jobs, compute-bound
#                                             # pair and triple, interactive, launch overhead
# Each takes at most about 8 minutes: 7 of measuring (FAMILY_BUDGET, estimated ~6.5), plus set-up.
#   bash bench/run_family.sh OUTDIR smoke     # the same harness on the CPU (fake driver), ~1 min
#   FAMILY_ARGS="--members ... --arms ... --repeat 6" bash bench/run_family.sh OUTDIR custom
#
# Each part sets up the machine (scripts/gpu-setup.sh), runs bench/bench_family.py under a time
# budget that leaves room to write up (members that do not fit stay listed as pending), and leaves
# in OUTDIR/PART/ four files, as the device tool brings back at most 8: results.json, family.md
# (the table), console.log and logs.tar.gz (every job's output and scheduler log, the timelines).
# Afterwards, on any machine: python3 bench/bench_family.py --report DIR1 DIR2 writes docs/.
# FAMILY_SECONDS (default 3) sets each job's steps alone; FAMILY_BUDGET (default 420) the seconds of
# measuring per part (units that would end past it are left pending; at 40 s past it the run is
# stopped and keeps what it measured).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: run_family.sh OUTDIR part1|part2|custom|smoke}
PART=${2:?usage: run_family.sh OUTDIR part1|part2|custom|smoke}
SECONDS_PER_JOB=${FAMILY_SECONDS:-3}
BUDGET=${FAMILY_BUDGET:-420}
DEST="$OUT/$PART"
WORK=/tmp/nvshare-family-$PART
rm -rf "$WORK" && mkdir -p "$DEST" "$WORK"
exec > >(tee "$DEST/console.log") 2>&1
TEE_PID=$!
T0=$(date +%s)

case $PART in
    part1) ARGS=(--part 1) ;;
    part2) ARGS=(--part 2) ;;
    smoke) ARGS=(--smoke-cpu --members pair-b30-g5-fixed,pair-b10-g50-prop,bursty3-b30-g20-fixed,compute2-g20,interactive-2batch)
           SECONDS_PER_JOB=${FAMILY_SECONDS:-0.6} ;;
    custom) read -ra ARGS <<<"${FAMILY_ARGS:?custom: FAMILY_ARGS holds the bench_family.py selection}" ;;
    *) echo "run_family.sh: unknown part $PART (part1, part2, custom or smoke)"; exit 2 ;;
esac

if [[ $PART == smoke ]]; then
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
    PY=${PYTHON:-python3}
    "$PY" setup.py -q build_ext --inplace >/dev/null && make -s -C tests/c >/dev/null || exit 1
else
    . scripts/gpu-setup.sh || exit 1
    PY=python3
    nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv
fi

if [[ $PART == part2 ]]; then
    # The launch path's cost with the demand sampler on (it is on in every hooked job); bounded.
    BENCH_TIMEOUT=90 PYTHON=$PY bash bench/bench_launch.sh --rounds 5 200000 >"$WORK/launch.txt" 2>&1
    echo "run_family: bench_launch.sh exit $?"; tail -3 "$WORK/launch.txt"
    ARGS+=(--launch-result "$WORK/launch.txt")
fi

timeout --kill-after=10 $((BUDGET + 40)) "$PY" bench/bench_family.py --out "$WORK" "${ARGS[@]}" \
    --seconds "$SECONDS_PER_JOB" --time-budget "$BUDGET"
RC=$?
cp "$WORK/results.json" "$DEST/" 2>/dev/null
cp "$WORK/family.md" "$DEST/" 2>/dev/null
tar -czf "$DEST/logs.tar.gz" -C "$WORK" . --exclude=./results.json 2>/dev/null
echo "run_family: $PART exit $RC after $(( $(date +%s) - T0 )) s; in $DEST: $(ls "$DEST" | tr '\n' ' ')"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
exit $RC
