"""Issue 40's proof: multi-node DDP jobs sharing GPUs, through a two-node Slurm on one host.

  python3 bench/two_node_proof.py OUT [--fake] [--slurm-root /opt/slurmroot] [--steps S]
                                  [--width W] [--depth D] [--batch B]

Brings up munged, slurmctld and two slurmd (n1, n2) in /tmp/nvshare-2node, and one
nvshare-scheduler per node, each managing one GPU (n1 GPU 0, n2 GPU 1: two nodes of one GPU each),
then runs, all through sbatch (`-N2 --ntasks-per-node=1 --gres=nvshare:1`, one rank per node):
  (a) one 2-node DDP training alone (torchrun over the two nodes, NCCL);
  (b) two 2-node DDP trainings submitted together: both complete, their losses are bit-identical
      to the one alone, both nodes' schedulers registered them as multi-node jobs and ran the lower
      id first, nobody was taken as unresponsive, and the span of the two is at most 1.10x two
      alone back to back (issue 40's bound).
Every job runs with NCCL_NVLS_ENABLE=0 (NVLink multicast off). --fake runs the same with the fake
CUDA driver (tests/c) and the fake driver's collective (nvtest barrier) as the payload.
Writes OUT/result.json, OUT/results.md and OUT/logs.tar.gz. Exit status 0 when every check passed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys
import tarfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_node import OneNodeSlurm, stop_leftovers  # noqa: E402
from two_gpu_proof import NO_MULTICAST, inventory  # noqa: E402

from nvshare_slurm.node import localcluster  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
BASE = Path("/tmp/nvshare-2node")
SPAN_LIMIT = 1.10
NODES = ("n1", "n2")


def say(text: str) -> None:
    print(f"two-node-proof: {text}", flush=True)


class TwoNodes(OneNodeSlurm):
    """munged, slurmctld, two slurmd (n1, n2) and one nvshare-scheduler per node, in BASE; the
    process handling (spawn, wait_for, run, stop) is OneNodeSlurm's."""

    def __init__(self, args, gpus: list[dict]):
        root = "/" if args.fake else args.slurm_root
        super().__init__(BASE, root, 4, [], {**NO_MULTICAST, "PYTHONUNBUFFERED": "1"})
        self.args, self.gpus = args, gpus

    def write(self) -> None:
        stop_leftovers(BASE.glob("**/*.pid"))
        shutil.rmtree(BASE, ignore_errors=True)
        for stale in Path("/dev/shm").glob("nvs2node-*"):   # --fake's collectives of a killed run
            stale.unlink(missing_ok=True)
        for sub in ("state", "jobs", "munge", "nvshare"):
            (BASE / sub).mkdir(parents=True)
        os.chmod(BASE, 0o755)
        os.chmod(BASE / "jobs", 0o1777)
        for node, gpu in zip(NODES, self.gpus, strict=True):
            device = "" if self.args.fake else f", device: /dev/nvidia{gpu['index']}"
            (BASE / "nvshare" / f"{node}.yaml").write_text(
                f"socket: {BASE}/nvshare/{node}.sock\nstate_dir: {BASE}/nvshare/state-{node}\n"
                f"slurm_bin_dir: {self.bin_dir}\nnode_name: {node}\nlog_level: debug\n"
                f"gpus: [{{uuid: {gpu['uuid']}, memory: {gpu['memory_mib']}M{device}}}]\n")
        unpacked = self.slurm_root != "/"
        nodes = tuple(localcluster.Node(n, localcluster.free_port(), "nvshare:4",
                                        (f"NodeName={n} Name=nvshare Count=4",), cpus=8,
                                        real_memory=4000, hostname=self.host, one_socket=True)
                      for n in NODES)
        cluster = localcluster.LocalCluster(
            name="nvs2node", base=BASE, host=self.host, ctld_port=localcluster.free_port(),
            nodes=nodes, partitions=(localcluster.Partition("proof", NODES, default=True),),
            per_node_files=True,
            plugin_dir=localcluster.unpacked_plugin_dir(self.slurm_root) if unpacked else None,
            cgroup=localcluster.local_cgroup_conf(unpacked, False, localcluster.cgroup_v2()),
            extra={"MinJobAge": "3600"})
        localcluster.write(cluster, localcluster.Wrappers(
            f"{BASE}/nvshare/{{node}}.yaml", localcluster.python_commands(sys.executable),
            {"PYTHONPATH": os.environ.get("PYTHONPATH", ""),
             "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}))

    def start(self) -> None:
        self.write()
        m = BASE / "munge"
        shutil.copy("/etc/munge/munge.key", m / "munge.key")
        os.chmod(m / "munge.key", 0o600)
        os.chmod(m, 0o700)
        self.spawn("munged", [str(self.sbin / "munged"), "-F", "--force", f"--socket={m}/munge.sock",
                              f"--key-file={m}/munge.key", f"--log-file={m}/munged.log",
                              f"--pid-file={m}/munged.pid", f"--seed-file={m}/munged.seed"])
        self.wait_for(lambda: (m / "munge.sock").exists(), 10, "munged")
        os.chmod(m, 0o755)
        for node in NODES:
            self.spawn(f"scheduler-{node}", [sys.executable, "-m", "nvshare_slurm.daemon"],
                       {"NVSHARE_CONFIG": str(BASE / "nvshare" / f"{node}.yaml")})
            self.wait_for(lambda n=node: (BASE / "nvshare" / f"{n}.sock").exists(), 30,
                          f"the scheduler of {node}")
        self.spawn("slurmctld", [str(self.sbin / "slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self.wait_for(lambda: "UP" in self.run("scontrol", "ping").stdout, 30, "slurmctld")
        stepd = ["-d", str(self.sbin / "slurmstepd")] if self.slurm_root != "/" else []
        for node in NODES:
            self.spawn(f"slurmd-{node}", [str(self.sbin / "slurmd"), "-D", "-N", node, "-f",
                                          str(self.conf), *stepd])
        self.wait_for(lambda: self.run("sinfo", "-h", "-o", "%t").stdout.split() == ["idle"], 60,
                      "both nodes idle")


def job_script(args) -> Path:
    """job.sh: one rank per node; rank 0 writes result-<job>.json."""
    if args.fake:
        rank = (f"export LD_LIBRARY_PATH={REPO}/tests/c/build FAKE_CUDA_BARRIER=/nvs2node-$SLURM_JOB_ID; "
                f"{REPO}/tests/c/build/nvtest init ctx:0 barrier:3000:{args.steps}:2:$SLURM_PROCID "
                f"> out-$SLURM_JOB_ID-$SLURM_PROCID.txt && "
                f"if [ $SLURM_PROCID = 0 ]; then echo '{{\"losses\": []}}' > result-$SLURM_JOB_ID.json; fi")
    else:
        rank = (f"exec {sys.executable} -m torch.distributed.run --nnodes=2 --nproc_per_node=1 "
                f"--node_rank=$SLURM_NODEID --master_addr=127.0.0.1 --master_port=$PORT "
                f"{REPO}/tests/gpu/ddp_train.py --steps {args.steps} --width {args.width} "
                f"--depth {args.depth} --batch {args.batch} --out result-$SLURM_JOB_ID.json")
    path = BASE / "jobs" / "job.sh"
    path.write_text(f"""#!/bin/sh
export PORT=$((29500 + SLURM_JOB_ID % 1000))
echo "proof-env SLURM_JOB_ID=$SLURM_JOB_ID NODES=$SLURM_JOB_NODELIST"
srun -N2 --ntasks-per-node=1 sh -c {shlex.quote(rank)}
rc=$?
rm -f /dev/shm/nvs2node-$SLURM_JOB_ID
echo "proof-exit $rc"
exit $rc
""")
    path.chmod(0o755)
    return path


def submit(c: TwoNodes, script: Path, name: str) -> str:
    res = c.run("sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "--gres=nvshare:1", "-J", name,
                "-o", "slurm-%j.out", str(script))
    if res.returncode != 0:
        raise RuntimeError(f"sbatch {name}: {res.stderr.strip()}")
    return res.stdout.strip().split(";")[0]


def wait(c: TwoNodes, jobs: list[str], timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        for job in jobs:
            out = c.run("scontrol", "show", "job", "-o", job).stdout
            states[job] = (re.search(r"JobState=(\S+)", out) or [None, "?"])[1]
        if all(s not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") for s in states.values()):
            break
        time.sleep(0.5)
    return states


def result(job: str) -> dict:
    path = BASE / "jobs" / f"result-{job}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--fake", action="store_true")
    ap.add_argument("--slurm-root", default="/opt/slurmroot")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--timeout", type=float, default=240)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.gpus = 2
    gpus = inventory(args)
    if len(gpus) < 2:
        say(f"needs two GPUs, found {len(gpus)}")
        return 2
    c = TwoNodes(args, gpus[:2])
    checks: dict[str, bool] = {}
    record: dict = {"date": datetime.now(timezone.utc).isoformat(), "gpus": gpus[:2],
                    "args": vars(args), "checks": checks}
    try:
        c.start()
        script = job_script(args)
        alone = submit(c, script, "alone")
        t0 = time.time()
        states = wait(c, [alone], args.timeout)
        one = time.time() - t0
        record["alone"] = {"job": alone, "state": states[alone], "seconds": one,
                           "train_seconds": result(alone).get("train_seconds")}
        say(f"(a) one 2-node job alone: {states[alone]} in {one:.1f} s")
        checks["alone completed"] = states[alone] == "COMPLETED"
        pair = [submit(c, script, "x"), submit(c, script, "y")]
        t0 = time.time()
        states = wait(c, pair, args.timeout + 2 * one)
        span = time.time() - t0
        record["pair"] = {"jobs": pair, "states": states, "span_seconds": span,
                          "train_seconds": [result(j).get("train_seconds") for j in pair]}
        say(f"(b) two 2-node jobs together: {states} in {span:.1f} s (alone {one:.1f} s)")
        checks["both completed"] = all(s == "COMPLETED" for s in states.values())
        base = result(alone).get("losses")
        checks["losses bit-identical to alone"] = bool(base is not None) and all(
            result(j).get("losses") == base for j in pair)
        checks[f"span <= {SPAN_LIMIT} x two alone"] = span <= SPAN_LIMIT * 2 * one
        for node in NODES:
            log = (BASE / f"scheduler-{node}.out").read_text(errors="replace")
            checks[f"{node}: both multi-node"] = all(f"job {j}: a multi-node job" in log for j in pair)
            checks[f"{node}: nobody unresponsive"] = "unresponsive" not in log
        record["span_ratio"] = span / (2 * one)
    except Exception as exc:  # noqa: BLE001 - a failed run is a result
        record["error"] = str(exc)[-2000:]
        say(f"failed: {exc}")
    finally:
        c.stop()
        with tarfile.open(out / "logs.tar.gz", "w:gz") as tar:
            for path in list(BASE.glob("*.out")) + list((BASE / "jobs").glob("*")) + \
                    list((BASE / "nvshare").glob("*.yaml")) + [BASE / "slurm.conf"]:
                if path.is_file():
                    tar.add(path, arcname=path.name)
    (out / "result.json").write_text(json.dumps(record, indent=1))
    lines = ["| check | passed |", "|---|---|"] + [f"| {k} | {v} |" for k, v in checks.items()]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if checks and all(checks.values()) and "error" not in record else 1


if __name__ == "__main__":
    sys.exit(main())
