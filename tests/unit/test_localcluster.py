"""nvshare_slurm.node.localcluster: the one writer of a local cluster's Slurm files, for the real-Slurm
tests (tests/slurm/cluster.py), the benchmarks' node (bench/slurm_node.py) and the demo
(scripts/demo.sh, through the command line).

Golden files (tests/data/golden/localcluster.*, NVSHARE_UPDATE_GOLDEN=1 rewrites) hold each user's
files as its own code describes them, with the temp dir, ports, host and interpreter named by word;
a change to what any of them runs shows in review. The wrappers are run by sh, with a hostile
directory name; the cgroup.conf choice is checked for every machine the demo meets."""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nvshare_slurm.node import localcluster
from nvshare_slurm.node.localcluster import (ENTRY_POINTS, CgroupConf, LocalCluster, LocalClusterError, Node,
                                             Partition, Wrappers)
from slurm.cluster import entry_point
from helpers_golden import check_golden   # tests/data/golden/, NVSHARE_UPDATE_GOLDEN=1 rewrites

REPO = Path(__file__).resolve().parents[2]


def files_text(base: Path) -> str:
    """Every file the writer made, in one text, the machine-specific parts named by word."""
    parts = []
    for name in ("slurm.conf", "gres.conf", "cgroup.conf", *(f"{kind}.sh" for kind in ENTRY_POINTS)):
        if (base / name).exists():
            parts.append(f"==> {name}\n{(base / name).read_text()}")
    text = "".join(parts).replace(str(base), "BASE").replace(sys.executable, "PYTHON")
    text = text.replace(str(Path(entry_point("nvshare-prolog")).parent), "ENTRY_POINTS")
    text = re.sub(r"Port=\d+", "Port=PORT", text)
    return re.sub(rf"\b{re.escape(localcluster.short_hostname())}\b", "HOST", text)


@pytest.fixture
def machine(monkeypatch):
    """A cgroup v2 machine whose caller has PYTHONPATH and LD_LIBRARY_PATH set (the GPU machine)."""
    monkeypatch.setattr(localcluster, "cgroup_v2", lambda: True)
    monkeypatch.setenv("PYTHONPATH", "/checkout")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/slurmroot/usr/lib")


@pytest.mark.parametrize("constrained", [False, True], ids=["session", "devices"])
def test_the_real_slurm_tiers_files(tmp_path, machine, constrained):
    from slurm.cluster import CONSTRAINED, CONSTRAINED_CGROUP_CONF, SlurmCluster
    nodes = [("n1", "nvshare:64", ["NodeName=n1 Name=nvshare Count=64"]),
             ("n2", "gpu:1,nvshare:gpu0:4", ["NodeName=n2 Name=gpu File=/dev/nvidia0",
                                             "NodeName=n2 Name=nvshare Type=gpu0 Count=4"])]
    extra = dict(settings=CONSTRAINED, cgroup_conf=CONSTRAINED_CGROUP_CONF,
                 gres_types="gpu,nvshare") if constrained else {}
    base = tmp_path / "c"
    cluster = SlurmCluster(base, nodes, **extra)
    localcluster.write(cluster.description(), cluster.wrappers())
    name = "devices" if constrained else "session"
    check_golden(f"localcluster.tests-{name}.txt", files_text(base))


@pytest.mark.parametrize("slurm_root", ["/", "/opt/slurmroot"], ids=["installed", "unpacked"])
def test_the_benchmarks_node_files(tmp_path, machine, slurm_root):
    sys.path.insert(0, str(REPO / "bench"))
    from slurm_node import OneNodeSlurm
    node = OneNodeSlurm(tmp_path / "b", slurm_root, 3, ["log_level: debug"], {})
    node.write()
    text = files_text(tmp_path / "b").replace(f"CPUs={max(8, os.cpu_count() or 8)} ", "CPUs=CPUS ")
    check_golden(f"localcluster.bench-{'installed' if slurm_root == '/' else 'unpacked'}.txt", text)


def demo_argv(base: Path, unpacked: bool, constrain: bool) -> list[str]:
    """The command line scripts/demo.sh gives (there NVSHARE_PYTHON given with an unpacked Slurm,
    as scripts/gpu-slurm-e2e.sh runs it; the installed console scripts otherwise)."""
    gres = "gpu:1,nvshare:gpu0:4" if constrain else "nvshare:gpu0:4"
    argv = [str(base), "--name", "nvsdemo", "--host", "demohost", "--partition", "demo",
            "--cpus", "4", "--gres", gres,
            "--gres-conf", "NodeName=demohost Name=nvshare Type=gpu0 Count=4",
            "--gres-types", "gpu,nvshare" if constrain else "nvshare",
            "--proctrack", "proctrack/cgroup" if constrain else "proctrack/linuxproc",
            "--task-plugin", "task/cgroup" if constrain else "task/none",
            "--nvshare-config", f"{base}/nvshare/nvshare.yaml"]
    if unpacked:
        argv += ["--python", "/usr/bin/python3", "--wrapper-env", "PYTHONPATH=/checkout",
                 "--slurm-root", "/opt/slurmroot",
                 "--wrapper-env", "LD_LIBRARY_PATH=/opt/slurmroot/lib"]
    else:
        argv += ["--bin-dir", "/opt/nvshare/bin"]
    if constrain:
        argv += ["--constrain-devices", "--gres-conf", "NodeName=demohost Name=gpu File=/dev/nvidia0"]
    return argv


@pytest.mark.parametrize("unpacked", [False, True], ids=["installed", "unpacked"])
@pytest.mark.parametrize("constrain", [False, True], ids=["plain", "constrain"])
def test_the_demos_files(tmp_path, machine, unpacked, constrain):
    base = tmp_path / "d"
    assert localcluster.main(demo_argv(base, unpacked, constrain)) == 0
    name = f"{'unpacked' if unpacked else 'installed'}-{'constrain' if constrain else 'plain'}"
    check_golden(f"localcluster.demo-{name}.txt", files_text(base))


def test_the_demo_script_gives_the_command_line_the_goldens_use():
    """demo_argv above stands for scripts/demo.sh: the flags it passes are the ones the script has."""
    script = (REPO / "scripts" / "demo.sh").read_text()
    assert "-m nvshare_slurm.node.localcluster \"$DEMO\"" in script
    call = script.split("CLUSTER=(", 1)[1].split("nvshare_slurm.node.localcluster", 1)[0]
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", call))
    argvs = demo_argv(Path("/x"), True, True) + demo_argv(Path("/x"), False, False)
    assert flags == {word for word in argvs if word.startswith("--")}


# The cgroup.conf of each machine the demo and the benchmarks meet, as demo.sh wrote it by hand.
CGROUP_CASES = {
    # (unpacked, constrain_devices, cgroup v2): cgroup.conf
    (False, False, False): None,
    (False, False, True): None,
    (True, False, False): None,
    (True, False, True): "CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\nCgroupMountpoint=/sys/fs/cgroup\n",
    (False, True, False): "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainDevices=yes\n",
    (False, True, True): "CgroupPlugin=cgroup/v2\nCgroupMountpoint=/sys/fs/cgroup\nConstrainDevices=yes\n",
    (True, True, False): "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainDevices=yes\n",
    (True, True, True): ("CgroupPlugin=cgroup/v2\nIgnoreSystemd=yes\n"
                         "CgroupMountpoint=/sys/fs/cgroup\nConstrainDevices=yes\n"),
}


def small(base: Path, **fields) -> LocalCluster:
    node = Node("n1", 7001, "nvshare:4", ("NodeName=n1 Name=nvshare Count=4",))
    return LocalCluster(name="c", base=base, host="h", ctld_port=7000, nodes=(node,),
                        partitions=(Partition("p", ("n1",), default=True),), **fields)


@pytest.mark.parametrize("case", list(CGROUP_CASES),
                         ids=lambda c: f"unpacked={c[0]:d},constrain={c[1]:d},v2={c[2]:d}")
def test_cgroup_conf_for_each_machine(tmp_path, case):
    cluster = small(tmp_path, cgroup=localcluster.local_cgroup_conf(*case))
    assert localcluster.render_cgroup_conf(cluster) == CGROUP_CASES[case]
    (tmp_path / "cgroup.conf").write_text("left by an earlier run\n")
    localcluster.write(cluster, Wrappers("/x.yaml", localcluster.script_commands("/bin")))
    written = tmp_path / "cgroup.conf"
    assert (written.read_text() if written.exists() else None) == CGROUP_CASES[case]


def test_every_key_once_and_every_line_a_setting(tmp_path):
    cluster = small(tmp_path, extra={"MinJobAge": "600"}, plugin_dir="/r/plugins")
    text = localcluster.render_slurm_conf(cluster)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    keys = [line.split("=", 1)[0] for line in lines
            if not line.startswith(("NodeName=", "PartitionName="))]
    assert len(keys) == len(set(keys)) and {"MinJobAge", "PluginDir", "GresTypes"} <= set(keys)
    assert all(re.fullmatch(r"[A-Za-z]+=\S+( [A-Za-z]+=\S+)*", line) for line in lines), text


def test_a_partition_names_its_priority_tier_only_when_it_has_one(tmp_path):
    tiers = (Partition("high", ("n1",), priority_tier=2), Partition("low", ("n1",),
                                                                    oversubscribe="FORCE:1"))
    text = localcluster.render_slurm_conf(dataclasses.replace(small(tmp_path), partitions=tiers))
    lines = [line for line in text.splitlines() if line.startswith("PartitionName=")]
    assert lines == ["PartitionName=high Nodes=n1 MaxTime=INFINITE State=UP PriorityTier=2",
                     "PartitionName=low Nodes=n1 MaxTime=INFINITE State=UP OverSubscribe=FORCE:1"]


@pytest.mark.parametrize("fields,words", [
    ({"extra": {"TaskPlugin": "task/cgroup"}}, "extra: TaskPlugin is already set"),
    ({"extra": {"Min JobAge": "1"}}, "'Min JobAge' is not a slurm.conf key"),
    ({"extra": {"MinJobAge": ""}}, "MinJobAge: '' cannot be"),
    ({"base": Path("/tmp/a b")}, "AuthInfo: 'socket=/tmp/a b/munge/munge.sock' cannot be"),
    ({"plugin_dir": "/r #x"}, "PluginDir: '/r #x' cannot be"),
    ({"cgroup": CgroupConf(3)}, "cgroup/v3"),
])
def test_a_value_that_would_change_the_files_meaning_is_refused(tmp_path, fields, words):
    cluster = dataclasses.replace(small(tmp_path), **fields)
    with pytest.raises(LocalClusterError, match=re.escape(words)):
        localcluster.write(cluster, Wrappers("/x.yaml", localcluster.script_commands("/bin")))
    assert not (tmp_path / "slurm.conf").exists()    # nothing written, not half of it


def test_a_gres_conf_line_is_one_line(tmp_path):
    node = Node("n1", 1, "nvshare:1", ("NodeName=n1 Name=nvshare Count=1\nNodeName=n9 Name=gpu",))
    with pytest.raises(LocalClusterError, match="more than one line"):
        localcluster.render_gres_conf(dataclasses.replace(small(tmp_path), nodes=(node,)))


def test_the_wrapper_names_the_nodes_config_and_execs_the_entry_point(tmp_path):
    """sh runs the wrapper as slurmd would (SLURMD_NODENAME and nothing else), from a directory
    whose name a shell would misread, and the entry point gets exactly what the wrapper names."""
    base = tmp_path / "a'; echo foo $HOME"
    base.mkdir()
    show = ("import os, sys; print(repr((sys.argv[1:], {k: os.environ.get(k) for k in "
            "('NVSHARE_CONFIG', 'SLURM_CONF', 'PYTHONPATH')})))")
    commands = {kind: [sys.executable, "-c", show, kind, "two words"] for kind in ENTRY_POINTS}
    wrappers = Wrappers(f"{base}/{{node}}/nvshare.yaml", commands, {"PYTHONPATH": "/p q:/r"})
    cluster = dataclasses.replace(small(tmp_path), base=base)
    path = base / "taskprolog.sh"
    path.write_text(localcluster.render_wrapper(cluster, wrappers, "taskprolog"))
    out = subprocess.run(["sh", str(path)], env={"SLURMD_NODENAME": "n2", "PATH": os.defpath},
                         capture_output=True, text=True, check=True, timeout=30).stdout
    assert eval(out) == (["taskprolog", "two words"],
                         {"NVSHARE_CONFIG": f"{base}/n2/nvshare.yaml",
                          "SLURM_CONF": f"{base}/slurm.conf", "PYTHONPATH": "/p q:/r"})


def test_the_command_line_refuses_what_it_cannot_write(tmp_path, capsys):
    argv = demo_argv(tmp_path / "d", False, False)
    assert localcluster.main(argv + ["--set", "Prolog=/other"]) == 1
    assert "extra: Prolog is already set" in capsys.readouterr().err
    assert not (tmp_path / "d" / "slurm.conf").exists()
    with pytest.raises(SystemExit) as exit_:
        localcluster.main([a for a in argv if a not in ("--bin-dir", "/opt/nvshare/bin")])
    assert exit_.value.code == 2
    assert "one of the arguments --python --bin-dir is required" in capsys.readouterr().err
