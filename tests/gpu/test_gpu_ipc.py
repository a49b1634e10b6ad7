"""Tier 4 (issue 10 item 7): CUDA IPC between two processes of one job under the hook, swap on.

The driver refuses cudaIpcGetMemHandle on virtual-memory allocations, which is what cudaMalloc becomes
under the hook; the hook exports such memory itself (csrc/ipc.c). Here a parent shares a tensor with a
spawned child through torch.multiprocessing, and a raw buffer through cudaIpcGetMemHandle on ctypes;
both sides write, while another job makes the parent swap its other memory out (the daemon is told the
GPU has 8 GiB, so the two jobs do not fit together without filling the real card).
NVSHARE_GPU_OUT=DIR leaves the findings there (ipc.json).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


from .conftest import HERE, GpuJobs

MiB = 1 << 20
CONTENDER = """
import sys, time, torch
hold = torch.ones(int(sys.argv[1]) * 2**20 // 4, device="cuda")
x = torch.randn(2048, 2048, device="cuda")
(x @ x).sum().item()
print("started", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    (x @ x).sum().item()
print("hold ok" if bool((hold == 1).all().item()) else "hold changed", flush=True)
"""


def _first_uuid() -> str:
    import pynvml
    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        return uuid.decode() if isinstance(uuid, bytes) else uuid
    finally:
        pynvml.nvmlShutdown()


def _wait(path: Path, proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"ended early ({proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
        assert time.monotonic() < deadline, f"{path.name} never came"
        time.sleep(0.05)


def test_torch_multiprocessing_and_raw_ipc_share_memory_with_swap_on(scheduler_factory, tmp_path):
    sched = scheduler_factory(gpus=[{"uuid": _first_uuid(), "memory": "8G"}], scheduling_mode="concurrent",
                              switch_time_mode="fixed", switch_time_fixed=0.5)
    jobs = GpuJobs(sched, tmp_path)
    (ja, ua), (jb, ub) = jobs.register(), jobs.register()
    folder = tmp_path / "handshake"
    folder.mkdir()
    # Debug lines: the parent's swap-outs and exports are judged from them.
    pair = subprocess.Popen([sys.executable, str(HERE / "ipc_share.py"), "--dir", str(folder),
                             "--big-mib", "4096"],
                            env={**jobs.env(ja, ua), "NVSHARE_LOG_LEVEL": "debug"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    other = None
    out = err = other_out = other_err = ""
    swapped = fixed = 0
    try:
        _wait(folder / "opened", pair, 240)
        # Another job that does not fit beside the pair: the parent's 4 GiB must go to host memory.
        other = jobs.popen([sys.executable, "-c", CONTENDER, "4096", "20"], jb, ub)
        assert other.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not swapped:
            gpu = sched.client().status()["gpus"][0]
            swapped, fixed = gpu["memory_swapped"], max(fixed, gpu["memory_fixed"])
            time.sleep(0.05)
        (folder / "go").touch()
        out, err = pair.communicate(timeout=300)
        other_out, other_err = other.communicate(timeout=120)
    finally:
        for p in (pair, other):
            if p is not None and p.poll() is None:
                p.kill()
    result = json.loads(out.strip().splitlines()[-1]) if pair.returncode == 0 else {}
    folder_out = os.environ.get("NVSHARE_GPU_OUT")
    if folder_out:
        Path(folder_out, "ipc.json").write_text(json.dumps(
            {"result": result, "swapped_seen": swapped, "fixed_seen": fixed, "stderr": err[-4000:],
             "contender": other_out + other_err[-2000:]}, indent=1))
    assert pair.returncode == 0, err[-4000:]
    moved = [float(m) for m in re.findall(r"swapped out ([\d.]+) MiB", err)]
    assert swapped > 0 and moved and max(moved) > 0, \
        "the other job never made the pair swap: the test proved nothing"
    exports = 2 if "raw_get_rc" in result.get("parent", {}) else 1  # torch's tensor, the raw buffer
    assert len(re.findall(r"CUDA IPC: \d+ bytes at 0x[0-9a-f]+ exported", err)) == exports, err[-4000:]
    assert fixed >= exports * 64 * MiB, "the shared buffers were not reported fixed"
    assert result["parent"]["child_writes_seen"] and result["parent"]["own_half_intact"], result
    assert result["parent"]["big_intact"], result
    assert result["child"]["opened_value_ok"] and result["child"]["parent_writes_seen"], result
    assert result["child_exit"] == 0, result
    if "raw_get_rc" in result["parent"]:
        assert result["parent"]["raw_get_rc"] == 0, result
        assert result["child"]["raw_open_rc"] == 0 and result["child"]["raw_opened_value_ok"], result
        assert result["parent"]["raw_child_writes_seen"] and result["child"]["raw_parent_writes_seen"], result
        assert result["child"]["raw_close_rc"] == 0, result
    assert "hold ok" in other_out, other_out + other_err[-2000:]
