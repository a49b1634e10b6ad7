"""Record what this machine's Slurm prints for the jobs nvshare reads, as fixtures for
tests/unit/test_slurm_outputs.py: run as root from the checkout, with Slurm and munge installed,

    python -m tests.slurm.record_outputs tests/data/slurm/<major.minor>

(scripts/test-slurm-2411.sh --record DIR does it inside its Debian 13 chroot, for Slurm 24.11).
It starts the test cluster of tests/slurm (two nodes, count-only n1, typed n2, both schedulers),
submits one job of each kind nvshare meets and writes, per job, `scontrol show job -d <id>` and,
where scontrol has it (23.02 and later), `scontrol --json show job -d <id>`; the same for all jobs
at once (the daemon's rebuild), the answers to a job id Slurm does not know and to an AdminComment
on a finished job, and manifest.json: which job is which, and what the tests expect of it."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .cluster import BIN, SlurmCluster
from .conftest import NODES

# name: (sbatch arguments, expected record on each node: {node: [slots, typed GPUs, gpu indices]}).
JOBS: dict[str, tuple[list[str], dict]] = {
    "count_only": (["-w", "n1", "--gres=nvshare:3"], {"n1": [3, [], []]}),
    "typed": (["-w", "n2", "--gres=nvshare:gpu1:2"], {"n2": [2, [1], []]}),
    "untyped_on_typed": (["-w", "n2", "--gres=nvshare:2"], {"n2": [2, [0], []]}),
    "two_nodes": (["-N", "2", "--gres=nvshare:1"], {"n1": [1, [], []], "n2": [1, [0], []]}),
    # A name made to break a parser that splits on spaces, quotes or '='.
    "no_nvshare": (["-w", "n2", "-J", "we'ird $(x) \"q\" name QOS=high JobName=x"],
                   {"n2": [0, [], []]}),
    "partition_comment": (["-p", "prod", "-w", "n1", "--gres=nvshare:1",
                           "--comment", "a comment, Partition=x QOS=y"], {"n1": [1, [], []]}),
    "array": (["--array=0-1", "-w", "n1", "--gres=nvshare:1"], {"n1": [1, [], []]}),
    "pending": (["-H", "--gres=nvshare:1"], {}),
    # A user's own text with lines that look like the record's: they must not become its GRES,
    # user or next record.
    "multiline_comment": (["-w", "n1", "--gres=nvshare:1", "--comment",
                           "fine\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=nvshare:gpu1(CNT:9)\n"
                           "   AdminComment=forged\nJobId=1 JobName=x"], {"n1": [1, [], []]}),
    "multiline_name": (["-w", "n2", "-J", "x\n   UserId=nobody(65534) GroupId=nogroup(65534) "
                        "MCS_label=N/A\n     Nodes=n2 CPU_IDs=0 Mem=0 GRES=nvshare:gpu0(CNT:4)"],
                       {"n2": [0, [], []]}),
}
ADMIN_COMMENT = "nvshare n1: gpu0 held=1.0s wait=0.0s peak=1.0G"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="nvslurm-record-", dir="/tmp"))
    os.chmod(base, 0o755)
    cluster = SlurmCluster(base, NODES)
    try:
        cluster.start()
        record(cluster, out)
    finally:
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    return 0


def record(cluster: SlurmCluster, out: Path) -> None:
    version = cluster.run([BIN / "scontrol", "--version"]).stdout.strip()
    has_json = cluster.run([BIN / "scontrol", "--json", "ping"]).returncode == 0
    manifest: dict = {"version": version, "json": has_json, "admin_comment": ADMIN_COMMENT,
                      "jobs": {}}
    script = "#!/bin/sh\nsleep 600\n"
    ids: dict[str, int] = {}
    for name, (args, _) in JOBS.items():
        try:
            ids[name] = cluster.sbatch(script, *args)
        except RuntimeError as exc:        # this Slurm refuses such a job: that is recorded
            manifest.setdefault("refused", {})[name] = str(exc)
    # An interactive allocation (BatchFlag=0), as salloc makes; --no-shell leaves it running.
    alloc = cluster.run([BIN / "salloc", "--no-shell", "-w", "n1", "--gres=nvshare:1",
                         "-J", "interactive"])
    match = re.search(r"Granted job allocation (\d+)", alloc.stderr + alloc.stdout)
    if not match:
        raise RuntimeError(f"salloc: {alloc.stderr}")
    ids["interactive"] = int(match.group(1))
    expected = {name: nodes for name, (_, nodes) in JOBS.items() if name in ids}
    expected["interactive"] = {"n1": [1, [], []]}
    for name, job in ids.items():
        if name != "pending":
            cluster.wait_state(job, ("RUNNING",), 30)
    cluster.scontrol("update", f"JobId={ids['count_only']}", f"AdminComment={ADMIN_COMMENT}")
    for name, job in ids.items():
        save(cluster, out / f"job-{name}", ["show", "job", "-d", str(job)], has_json)
        manifest["jobs"][name] = {"job_id": job, "nodes": expected[name]}
    # The daemon's rebuild reads every job at once, a suspended one among them.
    cluster.scontrol("suspend", str(ids["typed"]))
    cluster.wait_state(ids["typed"], ("SUSPENDED",), 30)
    save(cluster, out / "jobs-all", ["show", "job", "-d"], has_json)
    manifest["suspended"] = ids["typed"]
    # What scontrol answers for a job it does not know, and for the AdminComment of a finished job
    # (the epilog's case): exit status and both streams.
    unknown = max(ids.values()) + 1000
    save_result(cluster, out / "job-unknown", ["show", "job", "-d", str(unknown)])
    manifest["unknown"] = unknown
    cluster.run([BIN / "scancel", str(ids["count_only"])])
    cluster.wait_job(ids["count_only"], 60)
    save_result(cluster, out / "admin-comment-finished",
                ["update", f"JobId={ids['count_only']}", "AdminComment=late"])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    cluster.run([BIN / "scancel", "--full", "-u", "root"])
    print(f"record_outputs: {version}: {len(ids)} jobs into {out}")


def save(cluster: SlurmCluster, stem: Path, args: list[str], has_json: bool) -> None:
    text = cluster.scontrol(*args)
    if text.returncode != 0:
        raise RuntimeError(f"scontrol {' '.join(args)}: {text.stderr}")
    stem.with_suffix(".txt").write_text(text.stdout)
    if has_json:
        started = time.monotonic()
        shown = cluster.scontrol("--json", *args)
        if shown.returncode != 0:
            raise RuntimeError(f"scontrol --json {' '.join(args)}: {shown.stderr}")
        print(f"record_outputs: scontrol --json {' '.join(args)}: "
              f"{time.monotonic() - started:.3f}s", file=sys.stderr)
        stem.with_suffix(".json").write_text(shown.stdout)


def save_result(cluster: SlurmCluster, stem: Path, args: list[str]) -> None:
    # The --json form too where scontrol has no --json: what the fallback to text sees.
    for suffix, argv in ((".result", args), (".json-result", ["--json", *args])):
        result = cluster.scontrol(*argv)
        stem.with_name(stem.name + suffix + ".json").write_text(json.dumps(
            {"argv": argv, "returncode": result.returncode, "stdout": result.stdout,
             "stderr": result.stderr}, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
