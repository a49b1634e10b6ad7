"""Slurm glue without a cluster: scontrol parsing (recorded outputs), TaskProlog lines, prolog/epilog
decisions with a recorded-output scontrol stand-in, hostile inputs."""
from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from helpers_slurm import DATA, slurm_env
from nvshare_slurm import epilog, libnvshare_path, prolog, taskprolog
from nvshare_slurm.base.config import Config
from nvshare_slurm.base.priority import ClassMap, ShareClass, classify
from nvshare_slurm.node import slurm, taskenv
from nvshare_slurm.wire.proto import C



def recorded(name: str) -> str:
    return (DATA / name).read_text()


# ---- scontrol show job -d ----------------------------------------------------------------------
def test_count_only_job_holds_its_slots_on_its_node_only():
    job = slurm.parse_show_job(recorded("count_only_3.txt"), 2)
    assert job.on_node("n1") == slurm.NodeGres(nvshare_slots=3)
    assert not job.on_node("n2").holds_nvshare
    assert (job.user, job.uid, job.gid) == ("root", 0, 0)


def test_typed_request_names_the_gpu_slurm_chose():
    job = slurm.parse_show_job(recorded("typed_gpu1_2.txt"), 3)
    assert job.on_node("n2") == slurm.NodeGres(nvshare_slots=2, nvshare_gpus=(1,))


def test_untyped_request_on_typed_node_follows_slurms_choice():
    # JOB_GRES lists gpu1:0; only the per-node line says where the slots are.
    job = slurm.parse_show_job(recorded("typed_untyped_request.txt"), 4)
    assert job.on_node("n2") == slurm.NodeGres(nvshare_slots=2, nvshare_gpus=(0,))


def test_two_node_job_is_read_per_node():
    job = slurm.parse_show_job(recorded("two_nodes_mixed.txt"), 5)
    assert job.on_node("n1") == slurm.NodeGres(nvshare_slots=1)
    assert job.on_node("n2") == slurm.NodeGres(nvshare_slots=1, nvshare_gpus=(0,))


def test_job_without_nvshare_and_hostile_name():
    job = slurm.parse_show_job(recorded("no_nvshare_hostile_name.txt"), 6)
    assert job.name == "we'ird $(x) \"q\" name"
    assert job.nodes == {} or not job.on_node("n1").holds_nvshare


def test_other_job_id_in_output_is_an_error():
    with pytest.raises(slurm.SlurmError, match="did not describe job 7"):
        slurm.parse_show_job(recorded("count_only_1.txt"), 7)


@pytest.mark.parametrize("value, expected", [
    ("nvshare(CNT:1)", slurm.NodeGres(1)),
    ("nvshare:gpu0(CNT:2),nvshare:gpu3(CNT:1)", slurm.NodeGres(3, (0, 3))),
    ("gpu:a100:2(IDX:0,2),nvshare(CNT:1)", slurm.NodeGres(1, (), (0, 2))),
    ("gpu(IDX:0-1)", slurm.NodeGres(0, (), (0, 1))),
    ("shard:4(IDX:1)", slurm.NodeGres(0, (), (1,))),
    ("nvshare:a100(CNT:2)", slurm.NodeGres(2)),          # a type that is not gpuK: daemon places
    ("nvshare:gpu1(CNT:0)", slurm.NodeGres(0)),
    ("", slurm.NodeGres()),
    ("(null)", slurm.NodeGres()),
])
def test_gres_values(value, expected):
    assert slurm.parse_gres(value) == expected


@pytest.mark.parametrize("value", ["nvshare(CNT:x)", "gpu(IDX:0-a)", "nvshare((CNT:1)"])
def test_malformed_gres_is_an_error_not_a_guess(value):
    with pytest.raises(slurm.SlurmError):
        slurm.parse_gres(value)


def test_hostlists():
    assert slurm.expand_hostlist("n[1-3,5],gpu[08-10]x,login") == [
        "n1", "n2", "n3", "n5", "gpu08x", "gpu09x", "gpu10x", "login"]
    assert slurm.expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    with pytest.raises(slurm.SlurmError):
        slurm.expand_hostlist("n[a-b]")


def test_per_node_lines_with_hostlists():
    text = ("JobId=9 JobName=x y=z\n   UserId=al ice(1000) GroupId=users(100) MCS_label=N/A\n"
            "     Nodes=g[01-02] CPU_IDs=0-3 Mem=0 GRES=nvshare(CNT:2)\n"
            "     Nodes=g03 CPU_IDs=0 Mem=0 GRES=gpu(IDX:1)\n")
    job = slurm.parse_show_job(text, 9)
    assert job.name == "x y=z" and job.uid == 1000 and job.gid == 100
    assert job.on_node("g02").nvshare_slots == 2 and job.on_node("g03").gpu_index == (1,)


@pytest.mark.parametrize("value, expected", [("12", 12), (" 7 ", 7), ("0", None), ("", None),
                                             (None, None), ("12; rm -rf /", None), ("1e3", None)])
def test_job_ids_from_environment(value, expected):
    assert slurm.valid_job_id(value) == expected


# ---- TaskProlog lines --------------------------------------------------------------------------
PLACEMENT = {"gpu_uuid": ["GPU-fa4e0000-0000-0000-0000-000000000001",
                          "GPU-fa4e0000-0000-0000-0000-000000000000"], "gpu_index": [1, 0]}


def test_export_lines_name_placement_socket_job_policy():
    cfg = Config(socket="/run/nvshare/scheduler.sock", on_daemon_loss="run")
    lines = taskenv.export_lines(42, PLACEMENT, cfg, "/opt/nvshare/libnvshare.so", "/usr/lib/a.so")
    gpus = ",".join(PLACEMENT["gpu_uuid"])
    assert lines == [
        "export LD_PRELOAD=/opt/nvshare/libnvshare.so:/usr/lib/a.so",
        f"export CUDA_VISIBLE_DEVICES={gpus}",
        f"export NVSHARE_MANAGED_GPUS={gpus}",
        "export NVSHARE_SOCKET=/run/nvshare/scheduler.sock",
        "export NVSHARE_JOB_ID=42",
        "export NVSHARE_ON_DAEMON_LOSS=run",
    ]                                            # swap on (the default): nothing to say


def test_export_lines_turn_swap_off_when_the_config_does():
    cfg = Config(socket="/run/nvshare/scheduler.sock", swap=False)
    lines = taskenv.export_lines(42, PLACEMENT, cfg, "/opt/nvshare/libnvshare.so", None)
    assert lines[-1] == "export NVSHARE_SWAP=off"
    assert [line for line in lines if "NVSHARE_SWAP" in line] == ["export NVSHARE_SWAP=off"]
    assert all(line.startswith("export ") and "\n" not in line for line in lines)


@pytest.mark.parametrize("existing, expected", [
    (None, "/h.so"),
    ("", "/h.so"),
    ("/h.so", "/h.so"),                              # a step inherits the batch script's value
    ("/a.so /h.so:/b.so", "/h.so:/a.so:/b.so"),
    ("/a.so\nexport EVIL=1", "/h.so:EVIL=1"),  # an entry with a newline is dropped
])
def test_ld_preload_is_prepended_once_and_stays_one_line(existing, expected):
    assert taskenv.ld_preload("/h.so", existing) == expected


def test_unsafe_values_are_refused():
    with pytest.raises(taskenv.UnsafeValue):
        taskenv.export_line("NVSHARE_SOCKET", "/tmp/a\nexport X=1")
    with pytest.raises(taskenv.UnsafeValue):
        taskenv.export_lines(1, {"gpu_uuid": ["GPU-1 $(id)"], "gpu_index": [0]}, Config(),
                                "/h.so", None)
    # Spaces and quotes pass literally: Slurm does not interpret the value.
    assert taskenv.export_line("NVSHARE_SOCKET", "/tmp/a b'c/s.sock") == \
        "export NVSHARE_SOCKET=/tmp/a b'c/s.sock"


def test_hook_path_is_the_packaged_library():
    assert libnvshare_path().name == "libnvshare.so"
    assert libnvshare_path().parent.name == "nvshare_slurm"


def test_qos_partition_and_comment_are_read():
    job = slurm.parse_show_job(recorded("qos_partition_comment.txt"), 11)
    # The job's name holds "QOS=scavenger Partition=low": only the record's own fields count.
    assert (job.qos, job.partition, job.comment, job.interactive) == \
        ("prod", "gpu-prod", "opportunistic", False)


def test_no_accounting_qos_is_empty_and_salloc_is_interactive():
    batch = slurm.parse_show_job(recorded("count_only_1.txt"), 1)
    assert (batch.qos, batch.partition, batch.comment, batch.interactive) == \
        ("", "debug", "", False)
    salloc = slurm.parse_show_job(recorded("salloc_interactive.txt"), 12)
    assert salloc.interactive and salloc.partition == "debug"


SITE_MAP = ClassMap(qos={"prod": "high", "scavenger": "low"}, partition={"gpu-prod": "low",
                    "debug": "normal"}, comment={"opportunistic": "low"}, interactive="high",
                    default="normal")


@pytest.mark.parametrize("facts,expected", [
    (dict(qos="prod", partition="debug"), ShareClass("high", "qos prod")),
    (dict(qos="unlisted", partition="gpu-prod"), ShareClass("low", "partition gpu-prod")),
    (dict(partition="other,gpu-prod"), ShareClass("low", "partition gpu-prod")),
    (dict(partition="other", interactive=True), ShareClass("high", "interactive")),
    (dict(partition="other", comment="opportunistic"), ShareClass("low", "comment opportunistic")),
    # Words the site did not list, and a class name itself, choose nothing.
    (dict(partition="other", comment="high"), ShareClass("normal", "default")),
    (dict(), ShareClass("normal", "default")),
])
def test_the_site_map_decides_in_order_qos_partition_interactive_comment(facts, expected):
    assert classify(SITE_MAP, **facts) == expected


def test_interactive_none_gives_no_class_of_its_own():
    assert classify(ClassMap(interactive="none", default="low"), interactive=True) == \
        ShareClass("low", "default")


def test_prolog_registers_the_class_from_slurmctlds_record(tmp_path, fake_slurm, scheduler_factory,
                                                           capsys):
    sched = scheduler_factory()
    fake_slurm("qos_partition_comment.txt")
    env = slurm_env(tmp_path, fake_slurm.bindir, 11, socket_path=sched.socket,
                    priority_classes={"qos": {"prod": "high"}, "partition": {"gpu-prod": "low"}})
    assert prolog.run(env, wait_sec=2.0) == 0
    assert "class high(qos prod)" in capsys.readouterr().err
    job = sched.client().status(C.NVSHARE_STATUS_JOB, 11)["jobs"][0]
    assert (job["share_class"], job["class_reason"]) == ("high", "qos prod")


# ---- prolog / epilog / taskprolog decisions ----------------------------------------------------
def test_prolog_ignores_job_without_nvshare(tmp_path, fake_slurm, capsys):
    calls = fake_slurm("no_nvshare_hostile_name.txt")
    env = slurm_env(tmp_path, fake_slurm.bindir, 6)
    assert prolog.run(env, wait_sec=0.2) == 0
    assert capsys.readouterr().err == ""
    # Asked once in each form (22.05 refuses --json), and no drain.
    assert calls.read_text().splitlines() == ["--json show job -d 6", "show job -d 6"]


def test_prolog_fails_and_drains_when_daemon_is_down(tmp_path, fake_slurm, capsys):
    calls = fake_slurm("count_only_1.txt")
    env = slurm_env(tmp_path, fake_slurm.bindir, 1)
    assert prolog.run(env, wait_sec=0.3) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["nvshare-prolog: job 1: nvshare: scheduler not running"]
    assert "update nodename=n1 state=drain reason=nvshare: scheduler not running" in calls.read_text()


def test_prolog_fails_when_slurmctld_cannot_describe_the_job(tmp_path, fake_slurm, capsys):
    fake_slurm(None, exit_code=1)
    assert prolog.run(slurm_env(tmp_path, fake_slurm.bindir, 1), wait_sec=0.1) == 1
    assert "cannot read job 1 from slurmctld" in capsys.readouterr().err


def test_prolog_bad_config_only_matters_for_nvshare_jobs(tmp_path, fake_slurm, capsys):
    fake_slurm("no_nvshare_hostile_name.txt")
    env = slurm_env(tmp_path, fake_slurm.bindir, 6)
    Path(env["NVSHARE_CONFIG"]).write_text(
        f"slurm_bin_dir: {fake_slurm.bindir}\nscheduling_mode: sometimes\n")
    assert prolog.run(env, wait_sec=0.1) == 0
    fake_slurm("count_only_1.txt")
    env["SLURM_JOB_ID"] = "1"
    capsys.readouterr()
    assert prolog.run(env, wait_sec=0.1) == 1
    err = capsys.readouterr().err
    assert "bad config" in err and "scheduling_mode" in err


@pytest.mark.parametrize("job_id", ["", "abc", "1;id"])
def test_entry_points_ignore_a_missing_or_odd_job_id(tmp_path, fake_slurm, job_id):
    calls = fake_slurm("count_only_1.txt")
    env = slurm_env(tmp_path, fake_slurm.bindir, job_id)
    assert prolog.run(env) == 0 and epilog.run(env) == 0
    out = io.StringIO()
    assert taskprolog.run(env, out=out) == 0 and out.getvalue() == ""
    assert not calls.exists()


def test_epilog_daemon_down_for_non_nvshare_job_is_not_a_failure(tmp_path, fake_slurm):
    calls = fake_slurm("no_nvshare_hostile_name.txt")
    assert epilog.run(slurm_env(tmp_path, fake_slurm.bindir, 6), wait_sec=0.2) == 0
    assert "drain" not in calls.read_text()


def test_epilog_daemon_down_for_nvshare_job_drains(tmp_path, fake_slurm, capsys):
    calls = fake_slurm("count_only_1.txt")
    assert epilog.run(slurm_env(tmp_path, fake_slurm.bindir, 1), wait_sec=0.2) == 1
    assert capsys.readouterr().err.strip() == "nvshare-epilog: job 1: nvshare: scheduler not running"
    assert "state=drain" in calls.read_text()


def test_taskprolog_exports_the_hook_when_daemon_is_down(tmp_path, fake_slurm, capsys):
    # An nvshare job whose daemon cannot be reached still gets the hook, which then waits for the
    # daemon (on_daemon_loss), instead of running ungated on a shared GPU (issue 9).
    fake_slurm("count_only_1.txt")
    out = io.StringIO()
    assert taskprolog.run(slurm_env(tmp_path, fake_slurm.bindir, 1), out=out, wait_sec=0.2) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("export LD_PRELOAD=")
    assert "export NVSHARE_JOB_ID=1" in lines and "export NVSHARE_ON_DAEMON_LOSS=wait" in lines
    assert "scheduler cannot be reached" in capsys.readouterr().err


def test_taskprolog_ignores_nvshare_overrides_in_the_job_environment(tmp_path, fake_slurm):
    fake_slurm("count_only_1.txt")
    env = slurm_env(tmp_path, fake_slurm.bindir, 1, NVSHARE_SCHEDULING_MODE="bogus")
    out = io.StringIO()
    assert taskprolog.run(env, out=out, wait_sec=0.1) == 0   # no ConfigError from the user's env


def test_taskprolog_exports_swap_off_from_the_node_config_only(tmp_path, scheduler_factory):
    sched = scheduler_factory()
    sched.client().register_job(31, uid=0, gid=0, slots=1)
    cfg = tmp_path / "node.yaml"
    cfg.write_text(yaml.safe_dump({"socket": sched.socket, "swap": False}))
    # the job's own NVSHARE_SWAP=on is no config source for the TaskProlog
    env = {"SLURM_JOB_ID": "31", "NVSHARE_CONFIG": str(cfg), "NVSHARE_SWAP": "on"}
    out = io.StringIO()
    assert taskprolog.run(env, out=out) == 0
    lines = out.getvalue().splitlines()
    assert "export NVSHARE_SWAP=off" in lines and "export NVSHARE_JOB_ID=31" in lines
    cfg.write_text(yaml.safe_dump({"socket": sched.socket}))
    out = io.StringIO()
    assert taskprolog.run(env, out=out) == 0
    assert "NVSHARE_SWAP" not in out.getvalue() and "NVSHARE_JOB_ID=31" in out.getvalue()
