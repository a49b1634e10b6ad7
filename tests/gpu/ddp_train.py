"""A two-process PyTorch DDP training (NCCL), one process per GPU, for the multi-GPU tests.

  python ddp_train.py --steps 50 [--out FILE]

Spawns one process per visible GPU (torch.multiprocessing), trains a small MLP with
DistributedDataParallel, and prints one JSON line: rank 0's losses as float.hex() strings and every
rank's final parameter checksum (the ranks must agree: DDP keeps them in sync through all-reduce).
"""
import argparse
import json
import os
import socket

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# Multicast over NVLink stays off on shared machines (it can take the GPUs out of service).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402


def worker(rank: int, world: int, port: int, steps: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(),
                                torch.nn.Linear(1024, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-2, momentum=0.9)
    gen = torch.Generator(device="cuda").manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(256, 1024, generator=gen, device="cuda")
        y = torch.randint(0, 10, (256,), generator=gen, device="cuda")
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()).hex())
    checksum = float(sum(p.double().sum() for p in model.parameters()))
    queue.put((rank, losses, checksum, os.getpid()))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    world = torch.cuda.device_count()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(world, port, args.steps, queue), nprocs=world, join=True,
                       start_method="spawn")
    results = sorted(queue.get() for _ in range(world))
    print(json.dumps({"world": world, "losses": results[0][1],
                      "checksums": [r[2] for r in results], "pids": [r[3] for r in results]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
