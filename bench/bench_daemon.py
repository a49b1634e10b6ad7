"""Start a real nvshare-scheduler for a benchmark that needs no GPU (bench_scheduler.py,
bench_hostile.py): concurrent mode, fixed switch time, configured GPUs, log level warning."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml


def start_daemon(workdir: Path, uuids: list[str], tree: str | None = None, preexec_fn=None,
                 **settings) -> tuple[subprocess.Popen, str]:
    """The daemon's process and socket path once it listens; config, state and daemon.log in
    workdir (other users may connect: mode 0755). `settings` add to or replace the config's keys;
    with `tree`, the daemon runs from that source tree (PYTHONPATH and cwd)."""
    workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(workdir, 0o755)
    sock = str(workdir / "s.sock")
    cfg = {"socket": sock, "state_dir": str(workdir / "state"), "log_level": "warning",
           "scheduling_mode": "concurrent", "switch_time_mode": "fixed",
           "gpus": [{"uuid": uuid, "memory": "80G"} for uuid in uuids], **settings}
    (workdir / "nvshare.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHARE_")}
    env["NVSHARE_CONFIG"] = str(workdir / "nvshare.yaml")
    if tree is not None:
        env["PYTHONPATH"] = tree
    proc = subprocess.Popen([sys.executable, "-m", "nvshare_slurm.daemon"], env=env, cwd=tree,
                            stderr=open(workdir / "daemon.log", "wb"), preexec_fn=preexec_fn)
    deadline = time.monotonic() + 15
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"daemon did not start:\n{(workdir / 'daemon.log').read_text()}")
        time.sleep(0.05)
    return proc, sock
