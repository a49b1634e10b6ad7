"""A PyTorch DDP training (NCCL), one process per GPU, for the multi-GPU tests and the two-GPU proof.

  python ddp_train.py --steps 50                       # spawns one process per visible GPU itself
  python -m torch.distributed.run --standalone --nproc_per_node=N ddp_train.py --steps 400 \
      --width 4096 --batch 4096 --out FILE              # one process per GPU started by torchrun

Trains an MLP with DistributedDataParallel. Each rank draws its batches on its GPU from a seeded
generator, so the same arguments and world size give the same losses bit for bit (deterministic
algorithms, no TF32). Prints (or writes to --out) one JSON document: rank 0's losses as float.hex()
strings, their sha256 (`loss_digest`), every rank's final parameter checksum (the ranks must agree:
DDP keeps them in sync through all-reduce), the training phase's start and end on rank 0
(time.time(), after a barrier, so model building and NCCL's set-up are not counted), each rank's pid
and GPU, and the NCCL_NVLS_ENABLE it ran with.
"""
import argparse
import hashlib
import json
import os
import socket
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# Multicast over NVLink stays off on shared machines (it can take the GPUs out of service).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def train(rank: int, world: int, args, device: int | None = None) -> dict:
    """One rank's training in an initialised process group; rank 0's losses and timings. device:
    its GPU (the rank, unless ranks of several nodes each see their own GPUs from 0)."""
    device = rank if device is None else device
    torch.cuda.set_device(device)
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-2, momentum=0.9)
    gen = torch.Generator(device="cuda").manual_seed(100 + rank)
    losses = []
    dist.barrier()   # every rank ready: the training phase starts here
    start = time.time()
    for _ in range(args.steps):
        x = torch.randn(args.batch, args.width, generator=gen, device="cuda")
        y = torch.randint(0, 10, (args.batch,), generator=gen, device="cuda")
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()).hex())
    end = time.time()
    checksum = float(sum(p.double().sum() for p in model.parameters()))
    return {"rank": rank, "losses": losses, "checksum": checksum, "pid": os.getpid(),
            "gpu": torch.cuda.get_device_name(device), "start": start, "end": end}


def summary(world: int, ranks: list[dict]) -> dict:
    ranks = sorted(ranks, key=lambda r: r["rank"])
    losses = ranks[0]["losses"]
    return {"world": world, "losses": losses,
            "loss_digest": hashlib.sha256(" ".join(losses).encode()).hexdigest()[:16],
            "checksums": [r["checksum"] for r in ranks], "pids": [r["pid"] for r in ranks],
            "gpus": [r["gpu"] for r in ranks], "start": ranks[0]["start"], "end": ranks[0]["end"],
            "train_seconds": ranks[0]["end"] - ranks[0]["start"],
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE")}


def spawned_worker(rank: int, world: int, port: int, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    queue.put(train(rank, world, args))
    dist.barrier()
    dist.destroy_process_group()


def emit(result: dict, out: str) -> None:
    text = json.dumps(result)
    if out == "-":
        print(text)
    else:
        with open(out, "w") as fh:
            fh.write(text)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=1, help="hidden layers of --width")
    ap.add_argument("--batch", type=int, default=256, help="samples per rank and step")
    ap.add_argument("--out", default="-")
    args = ap.parse_args()
    if "LOCAL_RANK" in os.environ:   # started by torchrun: this process is one rank
        local, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
        rank = int(os.environ.get("RANK", local))    # global: torchrun over several nodes
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        mine = train(rank, world, args, device=local)
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            emit(summary(world, gathered), args.out)
        return 0
    world = torch.cuda.device_count()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(spawned_worker, args=(world, port, args, queue), nprocs=world, join=True,
                       start_method="spawn")
    emit(summary(world, [queue.get() for _ in range(world)]), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
