"""Everything nvshare asks Slurm: one `scontrol show job -d <id>` per job, parsed per node.

Slurm runs Prolog/Epilog with no PATH, so scontrol is called by absolute path (config slurm_bin_dir).
A GRES without a plugin (nvshare) is only counted: the prolog environment says nothing about it, but
the detailed job record lists per node what the job holds, e.g.

    Nodes=n1 CPU_IDs=0 Mem=0 GRES=nvshare(CNT:1)
    Nodes=gpu[01-02] CPU_IDs=0-3 Mem=0 GRES=nvshare:gpu1(CNT:2),gpu:a100(IDX:0-1)

Slurm 23.02 and later also print the record as JSON (`scontrol --json show job -d`), where that
list is `gres_detail` beside `job_resources`' nodes; it is read wherever scontrol has it, since only
there a job name or comment holding newlines cannot pass for lines of the record itself. Slurm
22.05 has the text form only (tests/data/slurm/<version>/ holds both versions' real outputs).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

GRES_NAME = "nvshare"
_TYPED_GPU = re.compile(r"^gpu(\d{1,2})$")
_JOB_ID = re.compile(r"^[1-9]\d{0,9}$")
# gres:nvshare:1 (22.05), gres/nvshare:gpu1:2 (24.11) in a TresPer* request
_NVSHARE_REQUEST = re.compile(rf"(?:^|,)gres[:/]{GRES_NAME}(?::|,|$)")
_TRES_KEYS = ("TresPerNode", "TresPerJob", "TresPerTask", "TresPerSocket")
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
    tres_requests: str = ""    # TresPerNode/Job/Task/Socket: what was asked for, kept while the
    #                            job is COMPLETING (its node lines then show an empty GRES=)

    def on_node(self, node: str) -> NodeGres:
        return self.nodes.get(node, NodeGres())

    def held_nvshare_on(self, node: str) -> bool:
        """Whether the job holds (or, COMPLETING, held) nvshare or Slurm GPUs on node: its node
        line says so, or the node is among its nodes and it asked for nvshare GRES."""
        gres = self.on_node(node)
        if gres.holds_nvshare or gres.gpu_index:
            return True
        return node in self.nodes and bool(_NVSHARE_REQUEST.search(self.tres_requests))


    def multinode(self) -> bool:
        """Whether it holds nvshare (or Slurm's GPUs) on two or more nodes: its ranks on one node
        wait for those on the others (NVSHARE_JOB_MULTINODE)."""
        return sum(1 for node in self.nodes if self.held_nvshare_on(node)) >= 2


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
    return _the_job(parse_show_jobs(text), job_id)


def _the_job(records: list[JobRecord], job_id: int) -> JobRecord:
    for record in records:
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
    records, form = _job_records([], slurm_bin_dir, timeout, attempts, None)
    live = [r for r in records if r.state in _LIVE_STATES and node in r.nodes]
    if form == "json":
        return live
    # In the text form a comment can hold a whole record of its own ("\nJobId=..."), which a
    # listing cannot tell from a real one: each job kept is read once more on its own, where
    # Slurm's record of that id comes first, and kept where the two agree on whose job it is and
    # what it holds (its state may have moved on meanwhile).
    def owner_and_holdings(r: JobRecord) -> tuple:
        return r.uid, r.gid, r.user, r.nodes, r.qos, r.partition, r.interactive
    confirmed = []
    for record in live:
        try:
            alone = show_job(record.job_id, slurm_bin_dir, timeout, 1)
        except SlurmError:
            continue
        if owner_and_holdings(alone) == owner_and_holdings(record):
            confirmed.append(record)
    return confirmed


def _job_records(selector: list[str], slurm_bin_dir: str, timeout: float, attempts: int,
                 environ: dict[str, str] | None) -> tuple[list[JobRecord], str]:
    """`scontrol show job -d [id]` as records, and which form was read ("json" or "text")."""
    args = ["show", "job", "-d", *selector]
    if slurm_bin_dir not in _NO_JSON:
        records = _json_records(args, slurm_bin_dir, timeout, environ)
        if records is not None:
            return records, "json"
    return parse_show_jobs(_scontrol(args, slurm_bin_dir, timeout, attempts, environ)), "text"


# slurm_bin_dirs whose scontrol has no --json (Slurm before 23.02): asked in the text form only.
_NO_JSON: set[str] = set()


def _json_records(args: list[str], slurm_bin_dir: str, timeout: float,
                  environ: dict[str, str] | None) -> list[JobRecord] | None:
    """The JSON form's records, or None where the text form must answer: no --json here, or an
    answer that describes no job. scontrol --json (24.11) prints an empty list with exit 0 both
    for a job id slurmctld does not know and for a slurmctld it cannot reach; the text form tells
    the two apart, with the message that callers act on and retry."""
    try:
        out, complaint = _run("scontrol", ["--json", *args], slurm_bin_dir, timeout, environ,
                              whole=True)
    except SlurmError:
        return None
    if out is None:
        if "json" in complaint.lower():         # "unrecognized option '--json'", no serializer
            _NO_JSON.add(slurm_bin_dir)
        return None
    try:
        records = parse_json_jobs(out)
    except SlurmError:
        return None
    if records:
        return records
    listing = len(args) == 3
    return [] if listing and not _json_load_failed(out) else None


def _json_load_failed(text: str) -> bool:
    """Whether a JSON listing of all jobs came without slurmctld's answer (last_update is 0)."""
    try:
        update = json.loads(text).get("last_update")
    except (ValueError, AttributeError):
        return True
    number = update.get("number") if isinstance(update, dict) else update
    return not number


def parse_json_jobs(text: str) -> list[JobRecord]:
    """Every job of `scontrol --json show job -d` output (data_parser v0.0.39 of Slurm 23.02 to
    v0.0.42 of 24.11); a job that cannot be read is skipped. SlurmError for any other output."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"scontrol --json printed no JSON: {exc}") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise SlurmError("scontrol --json printed no job list")
    out = []
    for job in jobs:
        try:
            out.append(_json_record(job))
        except (SlurmError, KeyError, TypeError, ValueError):
            continue
    return out


# job_state_string()'s order: a flag names the state before the base state does (v0.0.40 and
# later list the base state and its flags; v0.0.39 gives the string itself).
_STATE_FLAGS = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED",
                "REQUEUE_HOLD", "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")


def _json_record(job: dict) -> JobRecord:
    job_id = _json_int(job["job_id"])
    if job_id is None:
        raise SlurmError("a job without job_id")
    states = job.get("job_state")
    if isinstance(states, list):
        state = next((f for f in _STATE_FLAGS if f in states), states[0] if states else "")
    else:
        state = _json_str(states)
    # gres_detail has one entry per allocated node, in the order of job_resources' node list;
    # a node past its end holds no GRES (the text form prints it with an empty GRES=).
    resources = job.get("job_resources") or {}
    hosts = resources.get("nodes") if isinstance(resources, dict) else None
    if isinstance(hosts, dict):
        hosts = hosts.get("list")
    details = job.get("gres_detail") or []
    nodes: dict[str, NodeGres] = {}
    for index, node in enumerate(expand_hostlist(_json_str(hosts))):
        nodes[node] = parse_gres(_json_str(details[index]) if index < len(details) else "")
    return JobRecord(job_id, _json_str(job.get("name")), _json_str(job.get("user_name")),
                     _json_int(job.get("user_id")), _json_int(job.get("group_id")), nodes,
                     _json_str(job.get("admin_comment")), state,
                     qos=_json_str(job.get("qos")), partition=_json_str(job.get("partition")),
                     interactive=job.get("batch_flag") in (False, 0),
                     comment=_json_str(job.get("comment")),
                     tres_requests=",".join(_json_str(job.get(k)) for k in (
                         "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket")))


def _json_str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _json_int(value: object) -> int | None:
    """A plain number, or v0.0.40's {"set": true, "number": N} for a value that may be unset."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set") else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# Lines of the text form that only Slurm writes: the name is the one text of the user's printed
# before the per-node lines, which end at MinCPUsNode=; comments and paths come after.
_USER_LINE = re.compile(r"^   UserId=(.*)\((\d+)\) GroupId=.*\((\d+)\) MCS_label=")
_NODE_LINE = re.compile(r"^     Nodes=(\S+) CPU_IDs=\S* Mem=\d+ GRES=(\S*)$")


def _parse_record(record: str, job_id: int) -> JobRecord:
    lines = record.splitlines()
    # JobName ends the first line in the multi-line format; a name may hold spaces and '='.
    name = lines[0].split(" JobName=", 1)[1] if " JobName=" in lines[0] else ""
    # Slurm prints a user's text raw: a name or comment with newlines can hold lines shaped like
    # the record's own. Slurm's UserId line comes right after a one-line name; a name of several
    # lines, or a second UserId line anywhere, makes the record say nothing it could be trusted
    # for (no user, no nodes: the job is not one nvshare serves here, never one it over-serves).
    match = _USER_LINE.match(lines[1]) if len(lines) >= 2 else None
    if match is None or sum(1 for line in lines if line.startswith("   UserId=")) != 1:
        return JobRecord(job_id, name)
    user, uid, gid = match.group(1), int(match.group(2)), int(match.group(3))
    end = next((i for i, line in enumerate(lines) if line.startswith("   MinCPUsNode=")),
               len(lines))
    head, tail = lines[2:end], lines[end:]
    nodes: dict[str, NodeGres] = {}
    for line in head:
        match = _NODE_LINE.match(line)
        if match:
            gres = parse_gres(match.group(2))
            for node in expand_hostlist(match.group(1)):
                nodes[node] = gres
    fields = "\n".join(head)
    # Slurm prints AdminComment before the user's Comment (a line of which may look like it):
    # the first of each is Slurm's.
    comment_at = next((i for i, line in enumerate(tail) if line.startswith("   Comment=")),
                      len(tail))
    admin_comment = next((line[len("   AdminComment="):] for line in tail[:comment_at]
                          if line.startswith("   AdminComment=")), "")
    comment = tail[comment_at][len("   Comment="):] if comment_at < len(tail) else ""
    return JobRecord(job_id, name, user, uid, gid, nodes, admin_comment.rstrip(" "),
                     _word(fields, "JobState"), qos=_word(fields, "QOS"),
                     partition=_word(fields, "Partition"),
                     interactive=_word(fields, "BatchFlag") == "0", comment=comment.rstrip(" "),
                     tres_requests=",".join(_last_word(tail, k) for k in _TRES_KEYS))


def _last_word(lines: list[str], key: str) -> str:
    """Slurm's `   Key=value` line: the last one (a user's comment printed before it may hold
    lines shaped like it)."""
    values = [line[len(key) + 4:] for line in lines if line.startswith(f"   {key}=")]
    value = values[-1].strip() if values else ""
    return "" if value == "(null)" else value


def _word(record: str, key: str) -> str:
    """The first `Key=value` word of the record ("" when absent or Slurm's "(null)")."""
    match = re.search(rf"(?:^|\s){key}=(\S*)", record)
    value = match.group(1) if match else ""
    return "" if value == "(null)" else value


def show_job(job_id: int, slurm_bin_dir: str, timeout: float = 10.0, attempts: int = 3,
             environ: dict[str, str] | None = None) -> JobRecord:
    """Ask slurmctld once (retrying a transient failure) for the job's detailed record."""
    return _the_job(_job_records([str(job_id)], slurm_bin_dir, timeout, attempts, environ)[0],
                    job_id)


def _run(name: str, args: list[str], slurm_bin_dir: str, timeout: float,
         environ: dict[str, str] | None, whole: bool = False) -> tuple[str | None, str]:
    """Run a Slurm command from slurm_bin_dir (Prolog/Epilog have no PATH): (stdout, '') when it
    succeeded, else (None, its last complaint in one line, or all of it with `whole`). SlurmError
    when it cannot run at all."""
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
    if whole and out:
        return None, "\n".join(out)
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


def suspended_jobs(node: str, slurm_bin_dir: str, timeout: float = 5.0,
                   environ: dict[str, str] | None = None) -> set[int]:
    """The jobs slurmctld holds SUSPENDED on `node` (one squeue call). slurmctld marks a job
    SUSPENDED before slurmd signals it (SIGTSTP, then SIGSTOP or a cgroup freeze 2 s later:
    PreemptParameters=suspend_grace_time from 23.11), so this is the early word of a suspend.
    SlurmError when squeue cannot run or fails."""
    out, why = _run("squeue", ["--noheader", "--states=SUSPENDED", f"--nodelist={node}",
                               "--format=%A"], slurm_bin_dir, timeout, environ)
    if out is None:
        raise SlurmError(f"squeue --states=SUSPENDED: {why}")
    return {job for word in out.split() if (job := valid_job_id(word)) is not None}


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
