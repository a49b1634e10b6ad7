"""The admin guide walked as a new admin would (issue 26): its examples run on a fresh Slurm cluster
as a user who is not root, each command's output checked against what the guide says it prints;
the offline (wheelhouse) install it documents; and the demo as a first-day admin runs it.

An example in docs/admin-guide.md is an indented block whose first line starts with `$ `: each
`$ ` line is a command, the lines under it what it prints. `<name>` stands for one word; a name
that a later command uses (`<job>`) takes the value it matched, the others match any word. A line
`...` stands for any lines. A command this module does not know how to run fails the test, so the
guide cannot show one that nobody checks.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .cluster import BIN, SlurmCluster, cluster_dir, entry_point, job_dir, need_real_slurm, running

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "admin-guide.md"
USER = "nobody"
# The guide's first node: typed GRES, so that `--gres=nvshare:2` meets Slurm packing both slots.
NODES = [("g1", "nvshare:gpu0:4,nvshare:gpu1:4", ["NodeName=g1 Name=nvshare Type=gpu0 Count=4",
                                                  "NodeName=g1 Name=nvshare Type=gpu1 Count=4"])]
COMMANDS = ("sbatch", "nvshare-status", "cat")      # what a user types in the guide's examples
PLACEHOLDER = re.compile(r"<([a-z0-9_]+)>")


# --- the guide's examples -----------------------------------------------------------------------

def examples(text: str) -> list[list[tuple[str, list[str]]]]:
    """Every example block: [(command, expected output lines)], indentation of the block removed."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        match = re.match(r"^( +)\$ ", lines[i])
        if not match or (i > 0 and lines[i - 1].strip()):
            i += 1
            continue
        indent, steps = match.group(1), []
        while i < len(lines) and lines[i].startswith(indent) and lines[i].strip():
            line = lines[i][len(indent):]
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
            i += 1
        blocks.append(steps)
    return blocks


def line_pattern(expected: str, bound: dict[str, str], binds: set[str]) -> re.Pattern:
    out, pos, seen = [], 0, set()
    for match in PLACEHOLDER.finditer(expected):
        out.append(re.escape(expected[pos:match.start()]))
        name = match.group(1)
        if name in bound:
            out.append(re.escape(bound[name]))
        elif name in binds and name not in seen:
            out.append(rf"(?P<{name}>\S+?)")
            seen.add(name)
        else:
            out.append(r"\S+?")
        pos = match.end()
    out.append(re.escape(expected[pos:]))
    return re.compile("".join(out))


def match_output(expected: list[str], actual: list[str], bound: dict[str, str],
                 binds: set[str]) -> dict[str, str] | None:
    """The placeholders bound by matching actual against expected (None: no match)."""
    if not expected:
        return {} if not actual else None
    if expected[0] == "...":
        for skip in range(len(actual) + 1):
            found = match_output(expected[1:], actual[skip:], bound, binds)
            if found is not None:
                return found
        return None
    if not actual:
        return None
    match = line_pattern(expected[0], bound, binds).fullmatch(actual[0])
    if match is None:
        return None
    here = {k: v for k, v in match.groupdict().items() if v is not None}
    rest = match_output(expected[1:], actual[1:], {**bound, **here}, binds)
    return None if rest is None else {**here, **rest}


def test_the_example_parser_and_matcher():
    text = "para\n\n    $ sbatch x\n    Submitted batch job <job>\n    $ cat slurm-<job>.out\n" \
           "    ...\n    ok <any>\n\nafter\n"
    [block] = examples(text)
    assert block == [("sbatch x", ["Submitted batch job <job>"]), ("cat slurm-<job>.out",
                                                                   ["...", "ok <any>"])]
    binds = {"job"}
    assert match_output(block[0][1], ["Submitted batch job 17"], {}, binds) == {"job": "17"}
    assert match_output(["...", "ok <any>"], ["a", "b", "ok 5"], {"job": "17"}, binds) == {}
    assert match_output(["ok <job>"], ["ok 18"], {"job": "17"}, binds) is None
    assert match_output(["x=<uuid>,<uuid>"], ["x=a,b"], {}, binds) == {}
    assert match_output(["a"], ["a", "b"], {}, binds) is None


def test_the_guide_has_examples_and_each_names_a_known_command():
    blocks = examples(GUIDE.read_text())
    assert blocks, "docs/admin-guide.md has no `$ ` example: the walk below would check nothing"
    for block in blocks:
        for command, _ in block:
            assert command.split()[0] in COMMANDS, f"the guide shows {command!r}, which no test runs"


def run_as_user(cluster: SlurmCluster, command: str, cwd: Path, node_config: Path) -> str:
    env = {"PATH": f"{Path(entry_point('nvshare-status')).parent}:{BIN}:/usr/bin:/bin",
           "SLURM_CONF": str(cluster.conf), "NVSHARE_CONFIG": str(node_config), "HOME": str(cwd)}
    argv = ["runuser", "-u", USER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()),
            "bash", "-c", command]
    run = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"$ {command}\n{run.stdout}{run.stderr}"
    return run.stdout


@pytest.mark.timeout(300)
def test_walk_the_admin_guide_as_a_user(request):
    need_real_slurm()
    if shutil.which("runuser") is None:
        pytest.skip("needs runuser (the examples run as nobody)")
    blocks = examples(GUIDE.read_text())
    with running(SlurmCluster(cluster_dir("nvsguide-"), NODES)) as cluster:
        cwd = job_dir(cluster, request.node.name)
        node = cluster.nodes["g1"]
        for block in blocks:
            binds = {name for command, _ in block for name in PLACEHOLDER.findall(command)}
            bound: dict[str, str] = {}
            for command, expected in block:
                for name, value in bound.items():
                    command = command.replace(f"<{name}>", value)
                assert not PLACEHOLDER.search(command), f"{command!r}: unbound placeholder"
                if command.startswith("cat slurm-"):     # the job's output comes as it runs
                    path = cwd / command.split()[1]
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline and \
                            len(path.read_text().splitlines() if path.exists() else []) < \
                            len([e for e in expected if e != "..."]):
                        time.sleep(0.2)
                actual = run_as_user(cluster, command, cwd, node.config_path)
                if command.startswith("sbatch "):
                    # A user looks once the job runs: its batch script has begun (the prolog,
                    # which registers it, is done by then).
                    job = actual.split()[-1]
                    cluster.wait_state(int(job), ("RUNNING",), timeout=30)
                    out = cwd / f"slurm-{job}.out"
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline and not (out.exists() and out.read_text()):
                        time.sleep(0.2)
                found = match_output(expected, actual.rstrip("\n").split("\n"), bound, binds)
                assert found is not None, (f"$ {command}\nprinted:\n{actual}\nthe guide says:\n"
                                           + "\n".join(expected))
                bound.update(found)
        cluster.run([BIN / "scancel", "-u", USER], timeout=10)


# --- nvshare-node-config's example ---------------------------------------------------------------

def test_node_config_prints_the_guides_example(tmp_path):
    """The guide's "For a node with two GPUs, `nvshare-node-config --sharers 4` prints" block:
    every line it shows (comments aside, which it shortens) comes out, in that order."""
    text = GUIDE.read_text()
    intro = "For a node with two GPUs, `nvshare-node-config --sharers 4` prints"
    assert intro in text, "the guide's nvshare-node-config example moved: update this test"
    block = text[text.index(intro):].split("\n\n", 1)[1]
    shown = []
    for line in block.split("\n"):
        if line and not line.startswith("       "):
            if shown and not line.strip():
                continue
            break
        if line.strip() and not line.strip().startswith("#"):
            shown.append(line.strip())
    assert "NodeName=gpu01 Name=nvshare Count=8" in shown and "ConstrainDevices=yes" in shown
    config = tmp_path / "nvshare.yaml"
    config.write_text("gpus:\n- {uuid: GPU-a, memory: 16G}\n- {uuid: GPU-b, memory: 16G}\n")
    run = subprocess.run([sys.executable, "-m", "nvshare_slurm.nodeconfig", "--sharers", "4",
                          "--node", "gpu01", "--prefix", "/opt/nvshare", "--config", str(config)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    printed = [line for line in run.stdout.split("\n") if line and not line.startswith("#")]
    at = 0
    for line in shown:
        assert line in printed[at:], f"the guide shows {line!r}; nvshare-node-config printed:\n" \
                                     + run.stdout
        at = printed.index(line, at) + 1


# --- the offline install: a wheelhouse, then pip with no index ----------------------------------

@pytest.mark.timeout(600)
def test_wheelhouse_install_with_no_index_runs_for_a_user(tmp_path):
    """The guide's "Offline install": pip download into a wheelhouse, then a fresh venv installs
    from it with --no-index, and a user who is not root runs nvshare-status. The wheel comes from
    `pip wheel` of the committed tree (scripts/build-wheel.sh's zig build takes minutes: its wheel
    has its own test, tests/hook/test_wheel.py)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser (runs the installed command as nobody)")
    if shutil.which("git") is None or not (REPO / ".git").exists():
        # scripts/test-slurm-2411.sh's chroot has a copy of the tree, not the checkout; the
        # install does not depend on Slurm's version, and the 22.05 tier runs it.
        pytest.skip("needs the git checkout (the wheel is built from `git archive HEAD`)")
    base = Path(tempfile.mkdtemp(prefix="nvshare-wheelhouse-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        source = base / "src"
        source.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "HEAD"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
        house = base / "wheelhouse"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(house), str(source)], check=True,
                       capture_output=True, timeout=400)
        [wheel] = house.glob("nvshare_slurm-*.whl")
        download = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(house),
                                   str(wheel)], capture_output=True, text=True, timeout=300)
        if download.returncode != 0:
            pytest.skip(f"no package index reachable for `pip download`: {download.stderr[-300:]}")
        names = sorted(p.name.split("-")[0].lower() for p in house.glob("*.whl"))
        for dependency in ("nvidia_ml_py", "prometheus_client", "psutil", "pyyaml"):
            assert any(n.replace(".", "_").startswith(dependency) for n in names), names
        venv = base / "venv"
        python = shutil.which("python3", path="/usr/bin") or sys.executable
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=120)
        install = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index",
                                  "--find-links", str(house), "nvshare-slurm"],
                                 capture_output=True, text=True, timeout=300,
                                 env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": os.devnull})
        assert install.returncode == 0, install.stderr
        subprocess.run(["chmod", "-R", "a+rX", str(venv)], check=True)
        version = subprocess.run(["runuser", "-u", USER, "--", str(venv / "bin" / "nvshare-status"),
                                  "--version"], capture_output=True, text=True, timeout=60)
        assert (version.returncode, version.stdout.strip()) == (0, "nvshare-status 0.1.0"), \
            version.stderr
        assert (venv / "share" / "nvshare-slurm" / "nvshare.yaml.example").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --- the demo a first-day admin runs --------------------------------------------------------------

@pytest.mark.timeout(300)
def test_demo_shows_status_to_a_user_and_leaves_no_munge_key(tmp_path):
    need_real_slurm()
    demo = Path(tempfile.mkdtemp(prefix="nvshare-demo-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHARE_", "SLURM_"))}
    env.update(NVSHARE_PYTHON=sys.executable, PYTHONPATH=str(REPO), NVSHARE_DEMO_DIR=str(demo))
    try:
        run = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh")], env=env,
                             capture_output=True, text=True, timeout=280)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-3000:]
        assert "== nvshare-status while they run (as a user: nobody)\nIndex=0 " in out
        assert "the two jobs' GPU work never overlapped" in out
        assert not (demo / "munge" / "munge.key").exists()
        assert [p for p in demo.rglob("*.key")] == []
        assert "gpu-machine-slurm" not in (REPO / "scripts" / "demo.sh").read_text()
    finally:
        shutil.rmtree(demo, ignore_errors=True)


@pytest.mark.timeout(420)
def test_the_readme_demo_command_installs_with_a_python_every_user_can_run(tmp_path):
    """The README's first command, as is (no NVSHARE_PYTHON), where root's `python3` is one other users
    cannot run (pyenv's under /root, as on this project's machines): install.sh refuses such a Python
    (every job's TaskProlog would fail), so the demo installs with the system's /usr/bin/python3, as
    test.sh does, and runs. It failed so before: "other users cannot run ... python3"."""
    need_real_slurm()
    if subprocess.run(["/usr/bin/python3", "-c", "import sys, venv; sys.exit(sys.version_info < (3, 10))"],
                      capture_output=True).returncode:
        pytest.skip("no system /usr/bin/python3 3.10+ with venv")
    private = Path(tempfile.mkdtemp(prefix="nvshare-rootonly-", dir="/root"))   # mode 0700
    prefix = Path(tempfile.mkdtemp(prefix="nvshare-demo-venv-", dir="/tmp"))
    demo = Path(tempfile.mkdtemp(prefix="nvshare-demo-", dir="/tmp"))
    try:
        (private / "python3").symlink_to(sys.executable)
        assert subprocess.run(["runuser", "-u", "nobody", "--", str(private / "python3"), "-c", "0"],
                              capture_output=True).returncode != 0
        prefix.rmdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NVSHARE_", "SLURM_", "VIRTUAL_ENV"))}
        env.update(PATH=f"{private}:{env.get('PATH', '/usr/bin:/bin')}", NVSHARE_PREFIX=str(prefix),
                   NVSHARE_DEMO_DIR=str(demo))
        run = subprocess.run(["bash", str(REPO / "scripts" / "demo.sh")], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=400)
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-3000:]
        assert "other users cannot run" not in out, out[-3000:]
        assert os.path.realpath(prefix / "bin" / "python") == os.path.realpath("/usr/bin/python3")
        assert "the two jobs' GPU work never overlapped" in out, out[-3000:]
    finally:
        for d in (private, prefix, demo):
            shutil.rmtree(d, ignore_errors=True)
