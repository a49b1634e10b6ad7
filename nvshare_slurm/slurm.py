"""Everything nvshare asks Slurm: one `scontrol show job -d <id>` per job, parsed per node.

Slurm runs Prolog/Epilog with no PATH, so scontrol is called by absolute path (config slurm_bin_dir).
A GRES without a plugin (nvshare) is only counted: the prolog environment says nothing about it, but
the detailed job record lists per node what the job holds, e.g.

    Nodes=n1 CPU_IDs=0 Mem=0 GRES=nvshare(CNT:1)
    Nodes=gpu[01-02] CPU_IDs=0-3 Mem=0 GRES=nvshare:gpu1(CNT:2),gpu:a100(IDX:0-1)
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

GRES_NAME = "nvshare"
_TYPED_GPU = re.compile(r"^gpu(\d{1,2})$")
_JOB_ID = re.compile(r"^[1-9]\d{0,9}$")
ADMIN_COMMENT_MAX = 1000


class SlurmError(Exception):
    """scontrol could not be run or did not describe the job."""


@dataclass(frozen=True)
class NodeGres:
    """What one job holds on one node."""
    nvshare_slots: int = 0                        # sum of nvshare counts, typed or not
    nvshare_gpus: tuple[int, ...] = ()            # typed nvshare:gpuK -> K (Slurm chose the GPUs)
    gpu_index: tuple[int, ...] = ()               # Slurm's own gpu/shard GRES indices on this node

    @property
    def holds_nvshare(self) -> bool:
        return self.nvshare_slots > 0


@dataclass(frozen=True)
class JobRecord:
    job_id: int
    name: str = ""
    user: str = ""
    uid: int | None = None
    gid: int | None = None
    nodes: dict[str, NodeGres] = field(default_factory=dict)   # per node name
    admin_comment: str = ""
    state: str = ""                                            # JobState, e.g. RUNNING
    qos: str = ""                                              # "" for (null): no accounting
    partition: str = ""
    interactive: bool = False                                  # BatchFlag=0: salloc, bare srun
    comment: str = ""                                          # the user's --comment

    def on_node(self, node: str) -> NodeGres:
        return self.nodes.get(node, NodeGres())


def valid_job_id(value: str | None) -> int | None:
    """A Slurm job id from the environment, or None when it is not a plain positive number."""
    if value is None or not _JOB_ID.match(value.strip()):
        return None
    return int(value.strip())


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist expression to names: 'n[1-3,5],gpu[01-02]x' -> n1 n2 n3 n5 gpu01x gpu02x."""
    names: list[str] = []
    for part in _split_top(expr, ","):
        part = part.strip()
        if not part:
            continue
        names.extend(_expand_one(part))
    return names


def _expand_one(part: str) -> list[str]:
    match = re.search(r"\[([^\[\]]*)\]", part)
    if not match:
        return [part]
    head, tail = part[: match.start()], part[match.end():]
    out: list[str] = []
    for rng in match.group(1).split(","):
        if "-" in rng:
            low, high = rng.split("-", 1)
            if not (low.isdigit() and high.isdigit()) or int(high) - int(low) > 100000:
                raise SlurmError(f"bad hostlist range {rng!r} in {part!r}")
            width = len(low)
            values = [str(i).zfill(width) for i in range(int(low), int(high) + 1)]
        elif rng.isdigit():
            values = [rng]
        else:
            raise SlurmError(f"bad hostlist element {rng!r} in {part!r}")
        for value in values:
            out.extend(_expand_one(head + value + tail))
    return out


def _split_top(text: str, sep: str) -> list[str]:
    """Split at sep outside (...) and [...]: 'gpu(IDX:0,2),nvshare(CNT:1)' has two items."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth = max(0, depth - 1)
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _index_list(text: str) -> list[int]:
    """'0-1,3' -> [0, 1, 3] (GRES IDX lists and SLURM_JOB_GPUS)."""
    out: list[int] = []
    for item in text.split(","):
        item = item.strip()
        if not item or item.upper() == "N/A":
            continue
        if "-" in item:
            low, high = item.split("-", 1)
            if not (low.isdigit() and high.isdigit()) or int(high) - int(low) > 1024:
                raise SlurmError(f"bad GPU index range {item!r}")
            out.extend(range(int(low), int(high) + 1))
        elif item.isdigit():
            out.append(int(item))
        else:
            raise SlurmError(f"bad GPU index {item!r}")
    return out


def parse_gres(value: str) -> NodeGres:
    """One node's GRES= value, e.g. 'nvshare:gpu0(CNT:2),gpu:a100:1(IDX:3)'."""
    slots = 0
    typed: list[int] = []
    gpu_index: list[int] = []
    for item in _split_top(value.strip(), ","):
        item = item.strip()
        if not item or item == "(null)":
            continue
        match = re.match(r"^([^():]+)((?::[^():]*)*)(?:\(([^()]*)\))?$", item)
        if not match:
            raise SlurmError(f"cannot read GRES item {item!r}")
        name = match.group(1)
        qualifiers = [q for q in match.group(2).split(":") if q]
        detail = match.group(3) or ""
        info = dict(kv.split(":", 1) for kv in _split_top(detail, " ") if ":" in kv) if detail else {}
        if name == GRES_NAME:
            count = _count(info, qualifiers, item)
            slots += count
            gpu_type = qualifiers[0] if qualifiers and not qualifiers[0].isdigit() else ""
            typed_match = _TYPED_GPU.match(gpu_type)
            if typed_match and count > 0:
                typed.append(int(typed_match.group(1)))
        elif name in ("gpu", "shard") and "IDX" in info:
            for index in _index_list(info["IDX"]):
                if index not in gpu_index:
                    gpu_index.append(index)
    return NodeGres(slots, tuple(sorted(set(typed))), tuple(gpu_index))


def _count(info: dict[str, str], qualifiers: list[str], item: str) -> int:
    if "CNT" in info:
        text = info["CNT"]
    elif qualifiers and qualifiers[-1].isdigit():
        text = qualifiers[-1]
    else:
        text = "1"
    if not text.isdigit():
        raise SlurmError(f"bad count in GRES item {item!r}")
    return int(text)


def parse_show_job(text: str, job_id: int) -> JobRecord:
    """The output of `scontrol show job -d <id>` (one job; array/het jobs print one record each)."""
    for record in parse_show_jobs(text):
        if record.job_id == job_id:
            return record
    raise SlurmError(f"scontrol did not describe job {job_id}")


def parse_show_jobs(text: str) -> list[JobRecord]:
    """Every record of `scontrol show job -d` output; a record that cannot be read is skipped."""
    out = []
    for record in re.split(r"\n(?=JobId=)", text.strip()):
        match = re.match(r"^JobId=(\d+)\b", record)
        if not match:
            continue
        try:
            out.append(_parse_record(record, int(match.group(1))))
        except SlurmError:
            continue
    return out


# Jobs whose processes may be running on their nodes.
_LIVE_STATES = ("RUNNING", "SUSPENDED", "CONFIGURING", "STOPPED")


def jobs_on_node(node: str, slurm_bin_dir: str, timeout: float = 10.0,
                 attempts: int = 2) -> list[JobRecord]:
    """Live jobs that hold something on `node`, for rebuilding the daemon's registry after its
    state was lost: one `scontrol show job -d` for every job of the cluster."""
    text = _scontrol(["show", "job", "-d"], slurm_bin_dir, timeout, attempts)
    return [r for r in parse_show_jobs(text)
            if r.state in _LIVE_STATES and node in r.nodes]


def _parse_record(record: str, job_id: int) -> JobRecord:
    lines = record.splitlines()
    # JobName ends the first line in the multi-line format; a name may hold spaces and '='.
    name = lines[0].split(" JobName=", 1)[1] if " JobName=" in lines[0] else ""
    user, uid, gid = "", None, None
    nodes: dict[str, NodeGres] = {}
    admin_comment = comment = ""
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("AdminComment="):
            admin_comment = stripped[len("AdminComment="):]
            continue
        if stripped.startswith("Comment="):
            comment = stripped[len("Comment="):]
            continue
        match = re.match(r"^UserId=(.*)\((\d+)\) GroupId=.*\((\d+)\)", stripped)
        if match:
            user, uid, gid = match.group(1), int(match.group(2)), int(match.group(3))
            continue
        match = re.match(r"^Nodes=(\S+) .*?\bGRES=(\S*)", stripped)
        if match and not stripped.startswith("NodeList="):
            gres = parse_gres(match.group(2))
            for node in expand_hostlist(match.group(1)):
                nodes[node] = gres
    state_match = re.search(r"(?m)^\s*JobState=(\S+)", record)
    state = state_match.group(1) if state_match else ""
    rest = "\n".join(lines[1:])   # not the first line: the job's name may hold "QOS=x"
    return JobRecord(job_id, name, user, uid, gid, nodes, admin_comment, state,
                     qos=_word(rest, "QOS"), partition=_word(rest, "Partition"),
                     interactive=_word(rest, "BatchFlag") == "0", comment=comment)


def _word(record: str, key: str) -> str:
    """The first `Key=value` word of the record ("" when absent or Slurm's "(null)")."""
    match = re.search(rf"(?:^|\s){key}=(\S*)", record)
    value = match.group(1) if match else ""
    return "" if value == "(null)" else value


def show_job(job_id: int, slurm_bin_dir: str, timeout: float = 10.0, attempts: int = 3,
             environ: dict[str, str] | None = None) -> JobRecord:
    """Ask slurmctld once (retrying a transient failure) for the job's detailed record."""
    text = _scontrol(["show", "job", "-d", str(job_id)], slurm_bin_dir, timeout, attempts,
                     environ)
    return parse_show_job(text, job_id)


def _run(name: str, args: list[str], slurm_bin_dir: str, timeout: float,
         environ: dict[str, str] | None) -> tuple[str | None, str]:
    """Run a Slurm command from slurm_bin_dir (Prolog/Epilog have no PATH): (stdout, '') when it
    succeeded, else (None, its last complaint in one line). SlurmError when it cannot run at all."""
    command = Path(slurm_bin_dir) / name
    if not os.access(command, os.X_OK):
        raise SlurmError(f"{command} is not an executable (config slurm_bin_dir)")
    env = dict(os.environ if environ is None else environ)
    env.setdefault("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
    try:
        result = subprocess.run([str(command), *args], capture_output=True, text=True,
                                errors="replace", timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"{command} {' '.join(args[:2])} timed out after {timeout:g}s"
    except OSError as exc:
        raise SlurmError(f"cannot run {command}: {exc}") from None
    if result.returncode == 0:
        return result.stdout, ""
    out = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return None, out[-1] if out else f"exit {result.returncode}"


def _scontrol(args: list[str], slurm_bin_dir: str, timeout: float, attempts: int,
              environ: dict[str, str] | None = None) -> str:
    """scontrol's stdout, retrying a transient failure; SlurmError with its last complaint."""
    last = ""
    for attempt in range(attempts):
        out, last = _run("scontrol", args, slurm_bin_dir, timeout, environ)
        if out is not None:
            return out
        if "Invalid job id" in last:
            break
        if attempt + 1 < attempts:
            time.sleep(0.5 * (attempt + 1))
    raise SlurmError(f"scontrol {' '.join(args)}: {last}")


def drain_node(node: str, reason: str, slurm_bin_dir: str,
               environ: dict[str, str] | None = None) -> None:
    """Drain the node with our reason (slurmd drains it anyway, with a generic 'Prolog error');
    best effort: the failing prolog or epilog is what matters."""
    try:
        _run("scontrol", ["update", f"nodename={node}", "state=drain", f"reason={reason[:200]}"],
             slurm_bin_dir, 10.0, environ)
    except SlurmError:
        pass


def set_admin_comment(job_id: int, text: str, slurm_bin_dir: str, timeout: float = 10.0,
                      environ: dict[str, str] | None = None) -> str:
    """Write `text` as the job's AdminComment (root or SlurmUser); returns the command that took it.

    slurmctld takes `scontrol update` only while the job runs; once it has finished (in the epilog,
    with Slurm 22.05) the accounting database still takes it through sacctmgr, where sacct shows it.
    """
    # One argv element: both commands take the rest of it literally, spaces and '=' included.
    value = " ".join(text.split())[:ADMIN_COMMENT_MAX]
    refused = _admin_command(slurm_bin_dir, "scontrol", ["update", f"JobId={job_id}",
                                                         f"AdminComment={value}"], timeout, environ)
    if not refused:
        return "scontrol"
    if "finished" not in refused:
        raise SlurmError(f"scontrol update job {job_id} AdminComment: {refused}")
    late = _admin_command(slurm_bin_dir, "sacctmgr", ["-i", "modify", "job", "where",
                                                      f"jobid={job_id}", "set",
                                                      f"AdminComment={value}"], timeout, environ)
    if not late:
        return "sacctmgr"
    raise SlurmError(f"job {job_id} AdminComment: scontrol: {refused}; sacctmgr: {late}")


def _admin_command(slurm_bin_dir: str, name: str, args: list[str], timeout: float,
                   environ: dict[str, str] | None) -> str:
    """Run a Slurm admin command; '' when it succeeded, else why not (one line)."""
    try:
        return _run(name, args, slurm_bin_dir, timeout, environ)[1]
    except SlurmError as exc:
        return str(exc)


def job_gpus_from_env(value: str | None) -> list[int]:
    """SLURM_JOB_GPUS ('0,2' or '0-1') as indices; empty when unset."""
    if not value:
        return []
    return _index_list(value)
