"""A stand-in for tests/gpu/ddp_train.py on the fake CUDA driver (tests/c/build/libcuda.so.1).

  python fake_ddp.py --nproc N --rounds R --kernel-us US --nvtest PATH [--out FILE]

Starts one nvtest process per rank, rank K on the K-th GPU of CUDA_VISIBLE_DEVICES (UUIDs), each
running R rounds of the fake driver's collective (its "barrier" kernel: a round ends only when every
rank launched it), as a DDP job's all-reduces would. Writes the JSON that ddp_train.py writes, so
bench/two_gpu_proof.py reads both alike: the training phase's start and end, the world size, every
rank's pid, and "losses": one entry per round that rank 0 reported done (fixed by the arguments, as
a seeded training's losses are). Exits non-zero when a rank failed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--kernel-us", type=int, default=20000)
    ap.add_argument("--nvtest", required=True)
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    if args.nproc < 1:
        ap.error("--nproc must be at least 1")
    group = f"/nvshare-proof-{os.environ.get('SLURM_JOB_ID', os.getpid())}"
    env = dict(os.environ, FAKE_CUDA_BARRIER=group)
    # The fake driver lists every FAKE_CUDA_DEVICES entry and ignores CUDA_VISIBLE_DEVICES; the
    # real one shows a job only the GPUs Slurm's TaskProlog made visible, device K the K-th of
    # them. Do what it does, so that rank K runs on the job's K-th GPU, not on the node's.
    visible = [u for u in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if u]
    sizes = dict(entry.rsplit(":", 1) for entry in os.environ.get("FAKE_CUDA_DEVICES", "").split(",")
                 if ":" in entry)
    if visible and all(u in sizes for u in visible):
        env["FAKE_CUDA_DEVICES"] = ",".join(f"{u}:{sizes[u]}" for u in visible)
    elif visible:
        print(f"fake_ddp: CUDA_VISIBLE_DEVICES={','.join(visible)} names GPUs that "
              f"FAKE_CUDA_DEVICES does not list", file=sys.stderr)
        return 1
    if visible and len(visible) < args.nproc:
        print(f"fake_ddp: {args.nproc} ranks but {len(visible)} visible GPU(s)", file=sys.stderr)
        return 1
    start = time.time()
    ranks = [subprocess.Popen([args.nvtest, "init", f"ctx:{rank}",
                               f"barrier:{args.kernel_us}:{args.rounds}:{args.nproc}:{rank}"],
                              env=env, stdout=subprocess.PIPE, text=True)
             for rank in range(args.nproc)]
    outputs = [proc.communicate()[0] for proc in ranks]
    end = time.time()
    try:
        os.unlink(f"/dev/shm{group}")
    except FileNotFoundError:
        pass
    failed = [(i, p.returncode) for i, p in enumerate(ranks) if p.returncode != 0]
    if failed:
        print(f"fake_ddp: ranks {failed} failed:\n" + "\n".join(outputs), file=sys.stderr)
        return 1
    done = [int(line.split("=", 1)[1]) for line in outputs[0].splitlines()
            if line.startswith("barrier ok rounds=")]
    losses = [f"round {i}" for i in range(done[0] if done else 0)]
    result = {"world": args.nproc, "losses": losses,
              "loss_digest": hashlib.sha256(" ".join(losses).encode()).hexdigest()[:16],
              "checksums": [0.0] * args.nproc, "pids": [p.pid for p in ranks],
              "gpus": ["fake"] * args.nproc, "start": start, "end": end,
              "train_seconds": end - start, "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}
    text = json.dumps(result)
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
