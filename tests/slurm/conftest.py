"""A real Slurm cluster for the whole session: two nodes on this machine, each with its own
nvshare-scheduler. n1: count-only `Gres=nvshare:64`; n2: typed `Gres=nvshare:gpu0:4,nvshare:gpu1:4`.
(Slurm 22.05.8 with count-only and typed nvshare GRES in one cluster refused a count-only node's
fifth nvshare unit of the session with 4 slots, all freed: `gres_sched_create_sock_gres_list` failed
in slurmctld. n1 therefore has more slots than the session uses; docs/admin-guide.md says why.)
Skips (with the reason) where it cannot run: not root, or Slurm/munge not installed."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .cluster import BIN, SlurmCluster, cluster_dir, job_dir, need_real_slurm, running
from .helpers import BUILD, REPO_C

NODES = [
    ("n1", "nvshare:64", ["NodeName=n1 Name=nvshare Count=64"]),
    ("n2", "nvshare:gpu0:4,nvshare:gpu1:4", ["NodeName=n2 Name=nvshare Type=gpu0 Count=4",
                                             "NodeName=n2 Name=nvshare Type=gpu1 Count=4"]),
]


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="session")
def cluster():
    need_real_slurm()
    with running(SlurmCluster(cluster_dir("nvslurm-"), NODES)) as c:
        yield c


@pytest.fixture
def healthy(cluster):
    """Each test starts with both schedulers up and both nodes serving jobs; cleans its own jobs."""
    for node in cluster.nodes:
        if node not in cluster.schedulers or cluster.schedulers[node].poll() is not None:
            cluster.start_scheduler(node)
    cluster.scontrol("update", f"nodename={','.join(cluster.nodes)}", "state=resume")
    yield cluster
    cluster.run([BIN / "scancel", "-u", "root"], timeout=10)


@pytest.fixture
def jobdir(cluster, request):
    """A directory every job of the test can write (jobs may run as other users)."""
    return job_dir(cluster, request.node.name)


@pytest.fixture(scope="module")
def nvtest():
    subprocess.run(["make", "-s", "-C", str(REPO_C)], check=True, capture_output=True)
    return BUILD / "nvtest"
