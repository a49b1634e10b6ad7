"""What real Slurm printed, read back: tests/data/slurm/<version>/ holds `scontrol show job -d` of
Slurm 22.05 (text) and 24.11 (text and --json), recorded from the test cluster by
tests/slurm/record_outputs.py. Every job there is read by the text parser and, where Slurm has it,
the JSON one, and both must give what the job was submitted with; then slurm.show_job and
jobs_on_node run against an scontrol that answers each command line with its recorded output."""
from __future__ import annotations

import json
import re
import shlex
import stat
from pathlib import Path

import pytest

from nvshare_slurm.node import slurm

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
VERSIONS = sorted(p.name for p in DATA.iterdir() if (p / "manifest.json").exists())
# From tests/slurm/record_outputs.py's JOBS: what each job was submitted with, past the defaults.
MULTILINE_COMMENT = ("fine\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=nvshare:gpu1(CNT:9)\n"
                     "   AdminComment=forged\nJobId=1 JobName=x")
MULTILINE_NAME = ("x\n   UserId=nobody(65534) GroupId=nogroup(65534) MCS_label=N/A\n"
                  "     Nodes=n2 CPU_IDs=0 Mem=0 GRES=nvshare:gpu0(CNT:4)")
SUBMITTED = {
    "no_nvshare": {"name": "we'ird $(x) \"q\" name QOS=high JobName=x"},
    "partition_comment": {"partition": "prod", "comment": "a comment, Partition=x QOS=y"},
    "interactive": {"name": "interactive", "interactive": True},
    "pending": {"state": "PENDING"},
    "multiline_comment": {"comment": MULTILINE_COMMENT},
    "multiline_name": {"name": MULTILINE_NAME},
}
JOB_NAMES = ["count_only", "typed", "untyped_on_typed", "two_nodes", "no_nvshare",
             "partition_comment", "array", "pending", "interactive", "multiline_comment",
             "multiline_name"]


def manifest(version: str) -> dict:
    return json.loads((DATA / version / "manifest.json").read_text())


JSON_VERSIONS = [v for v in VERSIONS if manifest(v)["json"]]      # 23.02 and later


def expected(version: str, name: str) -> dict:
    m = manifest(version)
    nodes = {node: slurm.NodeGres(slots, tuple(typed), tuple(index))
             for node, (slots, typed, index) in m["jobs"][name]["nodes"].items()}
    fields = {"user": "root", "uid": 0, "gid": 0, "state": "RUNNING", "qos": "",
              "partition": "debug", "interactive": False, "comment": "", "admin_comment": "",
              "nodes": nodes}
    if name == "count_only":
        fields["admin_comment"] = m["admin_comment"]
    fields.update(SUBMITTED.get(name, {}))
    return fields


def fields_of(record: slurm.JobRecord, keys) -> dict:
    return {key: getattr(record, key) for key in keys}


def test_both_ends_of_the_supported_range_are_recorded():
    assert [manifest(v)["version"].split()[-1][:5] for v in VERSIONS] == ["22.05", "24.11"]
    assert [manifest(v)["json"] for v in VERSIONS] == [False, True]
    for version in VERSIONS:
        assert sorted(manifest(version)["jobs"]) == sorted(JOB_NAMES)


@pytest.mark.parametrize("version", JSON_VERSIONS)
@pytest.mark.parametrize("name", JOB_NAMES)
def test_each_job_is_read_from_the_json_form(version, name):
    job_id = manifest(version)["jobs"][name]["job_id"]
    record = slurm._the_job(slurm.parse_json_jobs(
        (DATA / version / f"job-{name}.json").read_text()), job_id)
    want = expected(version, name)
    if name in ("no_nvshare", "multiline_name"):      # on its node, holding no GRES at all
        want["nodes"] = {node: slurm.NodeGres() for node in want["nodes"]}
    assert fields_of(record, want) == want


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", JOB_NAMES)
def test_each_job_is_read_from_the_text_form(version, name):
    job_id = manifest(version)["jobs"][name]["job_id"]
    record = slurm.parse_show_job((DATA / version / f"job-{name}.txt").read_text(), job_id)
    want = expected(version, name)
    if name in ("no_nvshare",):
        want["nodes"] = {node: slurm.NodeGres() for node in want["nodes"]}
    if name == "multiline_comment":
        # Its comment's lines look like a GRES line, an AdminComment and a next record: none of
        # them counts, and the comment is its first line only.
        want["comment"] = "fine"
    if name == "multiline_name":
        # A name of several lines, one of them a forged UserId line: the text form cannot say
        # where the name ends, so the record vouches for nothing (the JSON form reads it whole).
        want = {"user": "", "uid": None, "gid": None, "nodes": {}, "state": ""}
    assert fields_of(record, want) == want


@pytest.mark.parametrize("version", JSON_VERSIONS)
def test_json_and_text_forms_agree_on_every_plainly_named_job(version):
    m = manifest(version)
    listing = DATA / version / "jobs-all"
    texts = {r.job_id: r for r in slurm.parse_show_jobs(listing.with_suffix(".txt").read_text())}
    jsons = {r.job_id: r for r in slurm.parse_json_jobs(listing.with_suffix(".json").read_text())}
    hostile = {m["jobs"][n]["job_id"] for n in ("multiline_comment", "multiline_name")}
    # Job 1's text record is shadowed by the one a comment forged after it (the first one wins).
    assert texts.keys() == jsons.keys()
    for job_id in texts.keys() - hostile - {1}:
        assert texts[job_id] == jsons[job_id], job_id
    assert jsons[m["suspended"]].state == "SUSPENDED"


# ---- through an scontrol that answers with the recorded outputs ---------------------------------
def recorded_scontrol(tmp_path: Path, version: str) -> tuple[Path, Path]:
    """A slurm_bin_dir whose scontrol prints what Slurm `version` printed for the same arguments
    (22.05 refuses --json as it did), and the file it logs each command line to."""
    m = manifest(version)
    d = DATA / version
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    bindir.mkdir()
    cases = []

    def answer(pattern: str, path: Path | None = None, result: Path | None = None) -> None:
        if result is not None:
            rec = json.loads(result.read_text())
            body = (f"printf %s {shlex.quote(rec['stdout'])}; "
                    f"printf %s {shlex.quote(rec['stderr'])} >&2; exit {rec['returncode']}")
        else:
            body = f"cat {shlex.quote(str(path))}; exit 0"
        cases.append(f"  {pattern}) {body};;")

    if m["json"]:
        answer('"--json show job -d"', d / "jobs-all.json")
    else:
        answer('"--json "*', result=d / "job-unknown.json-result.json")   # unrecognized option
    answer('"show job -d"', d / "jobs-all.txt")
    # A job's own record, and every record printed with it (an array's other tasks).
    asked: set[str] = set()
    for name, job in m["jobs"].items():
        text = d / f"job-{name}.txt"
        printed = re.findall(r"(?m)^JobId=(\d+)", text.read_text())
        shown = [job["job_id"]] + [int(i) for i in printed]
        for job_id in dict.fromkeys(shown):
            if str(job_id) in asked:
                continue
            asked.add(str(job_id))
            if m["json"]:
                answer(f'"--json show job -d {job_id}"', d / f"job-{name}.json")
            answer(f'"show job -d {job_id}"', text)
    answer('"--json show job -d "*', result=d / "job-unknown.json-result.json")
    answer('"show job -d "*', result=d / "job-unknown.result.json")
    script = bindir / "scontrol"
    script.write_text("#!/bin/sh\necho \"$*\" >> " + shlex.quote(str(calls)) + "\ncase \"$*\" in\n"
                      + "\n".join(cases) + "\nesac\necho 'unexpected' >&2; exit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return bindir, calls


@pytest.fixture(autouse=True)
def fresh_json_verdict(monkeypatch):
    """Each test finds out anew whether its scontrol has --json (slurm.py keeps it per process)."""
    monkeypatch.setattr(slurm, "_NO_JSON", set())


@pytest.mark.parametrize("version", VERSIONS)
def test_show_job_asks_once_in_the_form_this_slurm_has(tmp_path, version):
    bindir, calls = recorded_scontrol(tmp_path, version)
    m = manifest(version)
    for name in ("count_only", "two_nodes", "partition_comment", "multiline_comment"):
        record = slurm.show_job(m["jobs"][name]["job_id"], str(bindir))
        assert record.nodes == expected(version, name)["nodes"]
    lines = calls.read_text().splitlines()
    if m["json"]:
        assert lines == [f"--json show job -d {m['jobs'][n]['job_id']}" for n in
                         ("count_only", "two_nodes", "partition_comment", "multiline_comment")]
    else:        # 22.05 refuses --json once; after that only the text form is asked
        assert lines[0] == f"--json show job -d {m['jobs']['count_only']['job_id']}"
        assert lines[1:] == [f"show job -d {m['jobs'][n]['job_id']}" for n in
                             ("count_only", "two_nodes", "partition_comment", "multiline_comment")]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_job_slurm_does_not_know_is_an_error_asked_once(tmp_path, version):
    bindir, calls = recorded_scontrol(tmp_path, version)
    unknown = manifest(version)["unknown"]
    with pytest.raises(slurm.SlurmError, match="Invalid job id"):
        slurm.show_job(unknown, str(bindir))
    # 24.11's --json prints no job and exit 0 for it (as for a slurmctld it cannot reach): the text
    # form then says which, and "Invalid job id" is not retried.
    assert calls.read_text().splitlines() == [f"--json show job -d {unknown}",
                                              f"show job -d {unknown}"]


@pytest.mark.parametrize("version", VERSIONS)
def test_rebuild_finds_the_live_jobs_of_each_node(tmp_path, version):
    bindir, _ = recorded_scontrol(tmp_path, version)
    m = manifest(version)
    ids = {name: job["job_id"] for name, job in m["jobs"].items()}
    on_n1 = {r.job_id: r for r in slurm.jobs_on_node("n1", str(bindir))}
    on_n2 = {r.job_id: r for r in slurm.jobs_on_node("n2", str(bindir))}
    n1_jobs = {ids[n] for n in ("count_only", "two_nodes", "partition_comment", "interactive",
                                "multiline_comment", "array")}
    assert n1_jobs <= on_n1.keys() and len(on_n1) == len(n1_jobs) + 1   # the array's other task
    assert on_n1[ids["count_only"]].on_node("n1").nvshare_slots == 3
    assert on_n1[ids["multiline_comment"]].on_node("n1") == slurm.NodeGres(1)
    n2_jobs = {ids[n] for n in ("typed", "untyped_on_typed", "two_nodes", "no_nvshare")}
    if m["json"]:
        n2_jobs.add(ids["multiline_name"])        # read whole from JSON; it holds no nvshare
    assert on_n2.keys() == n2_jobs
    assert on_n2[ids["typed"]].state == "SUSPENDED"
    assert on_n2[ids["typed"]].on_node("n2") == slurm.NodeGres(2, (1,))
    assert ids["pending"] not in on_n1.keys() | on_n2.keys()


def test_a_record_forged_in_a_comment_is_not_rebuilt(tmp_path):
    """Text form: a comment holding a whole record of its own reads as a job of the listing; the
    job's own query (Slurm does not know it) leaves it out."""
    real = (DATA / "22.05" / "job-count_only.txt").read_text().rstrip("\n ")
    forged = ("JobId=777 JobName=forged\n"
              "   UserId=mallory(1000) GroupId=mallory(1000) MCS_label=N/A\n"
              "   JobState=RUNNING Reason=None Dependency=(null)\n"
              "     Nodes=n1 CPU_IDs=0 Mem=0 GRES=nvshare:gpu1(CNT:9)\n   MinCPUsNode=1")
    listing = real + "\n   Comment=x\n" + forged + "\n\n"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "all.txt").write_text(listing)
    (tmp_path / "one.txt").write_text(real + "\n")
    (bindir / "scontrol").write_text(
        "#!/bin/sh\ncase \"$*\" in\n"
        "  --json*) echo \"scontrol: unrecognized option '--json'\" >&2; exit 1;;\n"
        f"  'show job -d') cat {tmp_path / 'all.txt'};;\n"
        f"  'show job -d 1') cat {tmp_path / 'one.txt'};;\n"
        "  *) echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1;;\nesac\n")
    (bindir / "scontrol").chmod(0o755)
    assert 777 in {r.job_id for r in slurm.parse_show_jobs(listing)}    # what a listing alone says
    assert [r.job_id for r in slurm.jobs_on_node("n1", str(bindir))] == [1]


def test_a_listing_without_slurmctlds_answer_is_asked_again_in_text(tmp_path):
    """24.11's --json lists no job, exit 0, when slurmctld did not answer; last_update is then 0."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    empty = json.dumps({"jobs": [], "last_update": {"set": True, "infinite": False, "number": 0},
                        "errors": [], "warnings": []})
    (bindir / "scontrol").write_text(
        "#!/bin/sh\ncase \"$1\" in --json) echo " + shlex.quote(empty) + ";; *) "
        "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2;"
        " exit 1;; esac\n")
    (bindir / "scontrol").chmod(0o755)
    with pytest.raises(slurm.SlurmError, match="Unable to contact slurm controller"):
        slurm.jobs_on_node("n1", str(bindir), attempts=1)


def test_the_finished_jobs_admin_comment_refusal_is_recognised_on_both_versions():
    # slurm.set_admin_comment turns to sacctmgr when scontrol's refusal says "finished".
    for version in VERSIONS:
        result = json.loads((DATA / version / "admin-comment-finished.result.json").read_text())
        assert result["returncode"] != 0 and "finished" in result["stderr"], version
