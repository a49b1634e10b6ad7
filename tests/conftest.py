"""Fixtures shared by every tier: a real nvshare-scheduler on a temporary socket with configured GPUs."""
from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers_slurm import DATA

# Two fake GPUs; tests/c/fake_cuda.c reports the same UUIDs by default (FAKE_CUDA_DEVICES).
FAKE_GPUS = [
    {"uuid": "GPU-fa4e0000-0000-0000-0000-000000000000", "memory": "16G"},
    {"uuid": "GPU-fa4e0000-0000-0000-0000-000000000001", "memory": "16G"},
]
REPO = Path(__file__).resolve().parent.parent
# small_gpu: one 1 GiB GPU (usable at the default 5 % reserve: 972.8 MiB), the first fake GPU.
SMALL_GPU, SMALL_GPU_MEMORY = FAKE_GPUS[0]["uuid"], "1G"


def pytest_collection_modifyitems(config, items):
    """A test marked `timing` judges how processes shared the fake driver's time (whose kernels ran
    during whose bursts, what share each got). On a loaded 2-core machine (CI's, with its steal) a
    run of one is now and then spoiled: the host, not the hook, stalled a process past the line. Such
    a test runs once more if it fails (pytest-rerunfailures; `-ra` reports each rerun as R); the bug
    it is there for fails both runs. Where the plugin is missing the test runs once."""
    if not config.pluginmanager.hasplugin("rerunfailures"):
        return
    for item in items:
        if item.get_closest_marker("timing") and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=1))


def become(uid: int) -> None:
    """This (forked) process drops root for uid: the attacks in tests are a user's."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


class Scheduler:
    """A running nvshare-scheduler process (python -m nvshare_slurm.daemon) with its own config."""

    def __init__(self, workdir: Path, settings: dict):
        self.workdir = workdir
        self.socket = str(workdir / "scheduler.sock")
        self.state_dir = str(workdir / "state")
        self.config_path = workdir / "nvshare.yaml"
        self.log_path = workdir / "scheduler.log"
        # A stand-in scontrol that knows no jobs: a daemon that starts without state rebuilds
        # nothing, at once (tests of the rebuild replace it with a fake that prints records).
        # Without any, the daemon would keep asking, and questions about unknown jobs would wait.
        workdir.joinpath("scontrol").write_text(
            "#!/bin/sh\ncase \"$1\" in --json) echo \"scontrol: unrecognized option '--json'\" >&2;"
            " exit 1;; esac\nexit 0\n")
        workdir.joinpath("scontrol").chmod(0o755)
        # And a squeue that knows no suspended job (suspend.py asks it while jobs are registered).
        workdir.joinpath("squeue").write_text("#!/bin/sh\nexit 0\n")
        workdir.joinpath("squeue").chmod(0o755)
        config = {"socket": self.socket, "state_dir": self.state_dir, "gpus": FAKE_GPUS,
                  "log_level": "debug", "slurm_bin_dir": str(workdir)}
        config.update(settings)
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen | None = None
        self.extra_env: dict[str, str] = {}   # the daemon's own (the fake NVML's, say)

    @property
    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHARE_")}
        env["NVSHARE_CONFIG"] = str(self.config_path)
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 10.0, preexec_fn=None) -> Scheduler:
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "nvshare_slurm.daemon"],
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec_fn)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nvshare-scheduler exited {self.proc.returncode}:\n{self.log()}")
            if os.path.exists(self.socket):
                return self
            time.sleep(0.02)
        raise RuntimeError(f"nvshare-scheduler did not create its socket:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def restart(self) -> Scheduler:
        self.stop()
        return self.start()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self):
        from nvshare_slurm.wire.client import Client
        return Client(self.socket)


@pytest.fixture
def scheduler_factory(tmp_path):
    """Start schedulers with settings: scheduler_factory(scheduling_mode="serial")."""
    started: list[Scheduler] = []
    # Short Unix socket paths: tmp_path can exceed the 108-byte sun_path limit.
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="nvs-", dir="/tmp"))
    os.chmod(base, 0o755)

    def make(start: bool = True, **settings) -> Scheduler:
        workdir = base / f"d{len(started)}"
        workdir.mkdir()
        sched = Scheduler(workdir, settings)
        started.append(sched)
        return sched.start() if start else sched

    yield make
    for sched in started:
        sched.stop()
    import shutil
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def scheduler(scheduler_factory):
    return scheduler_factory()


# ---- fixtures that test modules share (their helpers: helpers_*.py) -----------------------------

@pytest.fixture(scope="session")
def hook_lib() -> Path:
    """The hook under test (NVSHARE_TEST_LIB, else the package's), built when missing, and tests/c."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("make and a C compiler are needed for the hook tests")
    override = os.environ.get("NVSHARE_TEST_LIB")
    if override:
        lib = Path(override)
    else:
        import nvshare_slurm
        lib = nvshare_slurm.libnvshare_path()
        if not lib.exists():
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=REPO,
                           check=True, capture_output=True)
    assert lib.exists(), f"{lib} was not built"
    subprocess.run(["make", "-s", "-C", str(REPO / "tests" / "c")], check=True, capture_output=True)
    return lib


@pytest.fixture
def procs():
    """Processes a test starts; killed if the test fails half-way."""
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.fixture
def groups():
    """Names of the fake driver's barrier groups (FAKE_CUDA_BARRIER: POSIX shared memory), one per
    job of a test, removed afterwards."""
    made: list[str] = []

    def make(job_id: int) -> str:
        name = f"/nvshare-test-{os.getpid()}-{job_id}-{len(made)}"
        made.append(name)
        return name

    yield make
    for name in made:
        try:
            os.unlink(f"/dev/shm{name}")
        except FileNotFoundError:
            pass


@pytest.fixture
def clients():
    from lockclient import ClientProc
    started: list[ClientProc] = []

    def make(sched, job_id, *options, step=0, wrap=()):
        proc = ClientProc(sched.socket, job_id, step, *options, wrap=wrap)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.close()


@pytest.fixture
def small_gpu(scheduler_factory, tmp_path):
    """A scheduler with one 1 GiB GPU in concurrent mode and the fake driver to match. The fake
    driver copies at about 1 GB/s (page faults on host memory), so the auto switch interval is told
    so: turns of 4x the copy time, which keeps the test quick and the swaps a fraction of each turn."""
    shared = tmp_path / "device-memory"

    def make(**settings):
        config = {"gpus": [{"uuid": SMALL_GPU, "memory": SMALL_GPU_MEMORY}], "scheduling_mode": "concurrent",
                  "switch_time_mode": "auto", "swap_bandwidth": "1G", "switch_time_multiplier": 4,
                  "switch_time_min": 0.3}
        config.update(settings)
        sched = scheduler_factory(**config)
        sched.fake_env = {"FAKE_CUDA_DEVICES": f"{SMALL_GPU}:{SMALL_GPU_MEMORY}",
                          "FAKE_CUDA_SHARED_MEMORY": str(shared), "NVSHARE_LOG_LEVEL": "debug"}
        return sched
    return make


@pytest.fixture
def fake_slurm(tmp_path):
    """A slurm_bin_dir whose scontrol prints a recorded record and logs its arguments; it refuses
    --json, as Slurm 22.05's does (tests/unit/test_slurm_outputs.py has 24.11's JSON)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"

    def setup(record_file: str | None, exit_code: int = 0) -> Path:
        script = bindir / "scontrol"
        body = f"cat {DATA / record_file}\n" if record_file else ""
        script.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                          f"case \"$1\" in show) {body}exit {exit_code};;\n"
                          "  --json) echo \"scontrol: unrecognized option '--json'\" >&2; exit 1;;\n"
                          "esac\nexit 0\n")
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return calls
    setup.bindir = bindir
    return setup
