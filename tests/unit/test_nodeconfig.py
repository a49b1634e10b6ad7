"""nvshare-node-config: what an admin pastes into slurm.conf, gres.conf and cgroup.conf.

Golden files (tests/data/golden/nodeconfig.*, kept as tests/unit/test_render.py keeps its own) for the
text; NVML is a fake pynvml module (no GPU here) driven through the real NvmlInventory; the config's
`gpus:` list goes through the installed command. The printed lines are also checked against the
Slurm model: one section per file, headed `# <file>`, each parsing as that file; the GPUs as gpu
GRES on their device files in index order; typed gpuK = GPU index K, count-only = GPUs x sharers.
Device paths and entry points are printed only when plain, so nothing from NVML or the config can
add a line to a Slurm file."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from conftest import FAKE_GPUS
from nvshare_slurm import nodeconfig
from nvshare_slurm.base import config as config_mod
from nvshare_slurm.node.inventory import GpuInfo
from helpers_golden import check_golden   # tests/data/golden/, NVSHARE_UPDATE_GOLDEN=1 rewrites

GIB = 1 << 30


class FakeNvml(types.ModuleType):
    """The pynvml calls NvmlInventory makes, answering for the GPUs given."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[tuple], fail: str = ""):
        """gpus: (uuid, name, memory[, minor]) each; the minor number defaults to the index."""
        super().__init__("pynvml")
        self._gpus, self._fail = gpus, fail

    def nvmlInit(self):
        if self._fail == "init":
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount(self):
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetUUID(self, handle):
        return self._gpus[handle][0].encode()   # older nvidia-ml-py returns bytes

    def nvmlDeviceGetName(self, handle):
        return self._gpus[handle][1]

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(total=self._gpus[handle][2])

    def nvmlDeviceGetMinorNumber(self, handle):
        gpu = self._gpus[handle]
        return gpu[3] if len(gpu) > 3 else handle


H100S = [(f"GPU-6b1d3c2a-0000-4000-8000-00000000000{i}", "NVIDIA H100 80GB HBM3", 80 * GIB)
         for i in range(4)]


HOOK = "/opt/nvshare/lib/python3/site-packages/nvshare_slurm/libnvshare.so"


@pytest.fixture(autouse=True)
def installed_hook(monkeypatch):
    """The hook apptainer.conf binds is this installation's: a fixed path for the golden files."""
    monkeypatch.setattr(nodeconfig, "libnvshare_file", lambda: HOOK)


@pytest.fixture
def nvml(monkeypatch, tmp_path):
    """Install a fake pynvml with the given GPUs; the config file has no `gpus:` (so NVML is used)."""
    config = tmp_path / "nvshare.yaml"
    config.write_text("log_level: info\n")
    monkeypatch.setenv("NVSHARE_CONFIG", str(config))
    # Where the entry points read it, as on an installed node: no note about a config elsewhere.
    monkeypatch.setattr(config_mod, "DEFAULT_PATH", str(config))

    def install(gpus, fail: str = "") -> None:
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus, fail))
    return install


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = nodeconfig.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("style", ["count", "typed"])
def test_nvml_node_golden(nvml, capsys, style):
    nvml(H100S)
    argv = ["--node", "gpu01", "--sharers", "4", "--prefix", "/opt/nvshare"] + \
        (["--typed"] if style == "typed" else [])
    code, out, err = run(capsys, *argv)
    assert code == 0 and err == ""
    check_golden(f"nodeconfig.{style}.txt", out)


def test_json_golden(nvml, capsys):
    nvml(H100S[:2])
    code, out, _ = run(capsys, "--node", "gpu01", "--sharers", "3", "--typed", "--json",
                       "--prefix", "/opt/nvshare")
    assert code == 0
    check_golden("nodeconfig.json", out)
    data = json.loads(out)
    assert data["slurm_conf"] == {"NodeName": "gpu01",
                                  "Gres": "gpu:2,nvshare:gpu0:3,nvshare:gpu1:3"}
    assert data["slots"] == 6
    assert [g["device"] for g in data["gpus"]] == ["/dev/nvidia0", "/dev/nvidia1"]
    assert data["gres_conf"] == ["NodeName=gpu01 Name=gpu File=/dev/nvidia0",
                                 "NodeName=gpu01 Name=gpu File=/dev/nvidia1",
                                 "NodeName=gpu01 Name=nvshare Type=gpu0 Count=3",
                                 "NodeName=gpu01 Name=nvshare Type=gpu1 Count=3"]
    assert data["entry_points"] == {"Prolog": "/opt/nvshare/bin/nvshare-prolog",
                                    "Epilog": "/opt/nvshare/bin/nvshare-epilog",
                                    "TaskProlog": "/opt/nvshare/bin/nvshare-taskprolog"}


@pytest.mark.parametrize("typed", [False, True])
def test_json_files_are_the_text_sections(nvml, capsys, typed):
    """Configuration management writes data["files"]; an admin pastes the text: the same lines."""
    nvml(H100S)
    argv = ["--node", "gpu01"] + (["--typed"] if typed else [])
    _, text, _ = run(capsys, *argv)
    _, out, _ = run(capsys, *argv, "--json")
    files = json.loads(out)["files"]
    assert list(files) == list(nodeconfig.FILES)
    assert files == sections(text)


HEADERS = ["# slurm.conf", "# gres.conf", "# cgroup.conf", "# oci.conf",
           "# /etc/enroot/hooks.d/nvshare.sh", "# apptainer.conf"]


def sections(out: str) -> dict[str, list[str]]:
    """The text output cut at its header lines: file name -> that file's lines (blank lines between
    sections dropped). What comes before the first header must be comments only."""
    result: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if line in HEADERS:
            current = result.setdefault(line[2:], [])
            assert current == [], f"{line} twice"
        elif current is None:
            assert line == "" or line.startswith("#"), f"before the first section: {line!r}"
        elif line:
            current.append(line)
    return result


def settings(lines: list[str]) -> list[str]:
    """The lines of a config file that are not comments."""
    return [line for line in lines if not line.startswith("#")]


def config_lines(out: str) -> tuple[str, list[str]]:
    """(the slurm.conf NodeName line, the gres.conf lines) of the text output."""
    files = sections(out)
    node_lines = [line for line in files["slurm.conf"] if line.startswith("NodeName=")]
    assert len(node_lines) == 1
    return node_lines[0], settings(files["gres.conf"])


def words(line: str) -> dict[str, str]:
    """A Slurm config line as key=value words; every word must be one."""
    pairs = [word.split("=", 1) for word in line.split(" ")]
    assert all(len(pair) == 2 and pair[0] and pair[1] for pair in pairs), line
    return dict(pairs)


@pytest.mark.parametrize("gpus,sharers", [(1, 1), (2, 4), (8, 7)])
def test_count_only_slots_are_gpus_times_sharers(nvml, capsys, gpus, sharers):
    nvml([(f"GPU-{i:08x}-0000-4000-8000-000000000000", "A100", 40 * GIB)
         for i in range(gpus)])
    _, out, _ = run(capsys, "--node", "n1", "--sharers", str(sharers))
    node_line, gres_lines = config_lines(out)
    assert node_line == f"NodeName=n1 Gres=gpu:{gpus},nvshare:{gpus * sharers}"
    assert gres_lines == [f"NodeName=n1 Name=gpu File=/dev/nvidia{i}" for i in range(gpus)] + \
        [f"NodeName=n1 Name=nvshare Count={gpus * sharers}"]


def test_typed_lines_agree_with_each_other(nvml, capsys):
    """slurm.conf's per-type counts and gres.conf's Type=/Count= lines must match, or slurmd refuses."""
    nvml(H100S)
    _, out, _ = run(capsys, "--node", "n2", "--sharers", "2", "--typed")
    node_line, gres_lines = config_lines(out)
    gres = node_line.split("Gres=")[1].split(",")
    assert gres[0] == "gpu:4"
    from_slurm_conf = {part.split(":")[1]: int(part.split(":")[2]) for part in gres[1:]}
    from_gres_conf = {}
    for line in gres_lines:
        fields = words(line)
        assert fields["NodeName"] == "n2"
        if fields["Name"] == "nvshare":
            from_gres_conf[fields["Type"]] = int(fields["Count"])
    assert from_slurm_conf == from_gres_conf == {f"gpu{i}": 2 for i in range(4)}


@pytest.mark.parametrize("typed", [False, True])
def test_sections_come_in_order_under_their_header_lines(nvml, capsys, typed):
    nvml(H100S[:2])
    _, out, _ = run(capsys, "--node", "gpu01", *(["--typed"] if typed else []))
    lines = out.splitlines()
    assert [line for line in lines if line in HEADERS] == HEADERS
    for header in HEADERS:   # each after a blank line, so it reads as the start of a new file
        assert lines[lines.index(header) - 1] == ""
    assert list(sections(out)) == ["slurm.conf", "gres.conf", "cgroup.conf", "oci.conf",
                                   "/etc/enroot/hooks.d/nvshare.sh", "apptainer.conf"]
    assert list(sections(out)) == list(nodeconfig.FILES)


@pytest.mark.parametrize("typed", [False, True])
def test_each_section_parses_as_its_file(nvml, capsys, typed):
    nvml(H100S[:2])
    _, out, _ = run(capsys, "--node", "gpu01", "--sharers", "3", "--prefix", "/usr/local",
                    *(["--typed"] if typed else []))
    files = sections(out)

    slurm_conf = settings(files["slurm.conf"])
    once = [words(line) for line in slurm_conf if not line.startswith("NodeName=")]
    assert all(len(w) == 1 for w in once)
    keys = {k: v for w in once for k, v in w.items()}
    assert len(keys) == len(once)            # each key once
    assert keys == {"GresTypes": "gpu,nvshare", "PrologFlags": "Alloc",
                    "Prolog": "/usr/local/bin/nvshare-prolog",
                    "Epilog": "/usr/local/bin/nvshare-epilog",
                    "TaskProlog": "/usr/local/bin/nvshare-taskprolog",
                    "TaskPlugin": "task/cgroup", "ProctrackType": "proctrack/cgroup"}
    node = words(slurm_conf[-1])
    assert list(node) == ["NodeName", "Gres"] and node["NodeName"] == "gpu01"
    gres = node["Gres"].split(",")

    gres_conf = [words(line) for line in settings(files["gres.conf"])]
    assert all(list(w)[:2] == ["NodeName", "Name"] and w["NodeName"] == "gpu01" for w in gres_conf)
    gpu_lines = [w for w in gres_conf if w["Name"] == "gpu"]
    nvshare_lines = [w for w in gres_conf if w["Name"] == "nvshare"]
    assert len(gpu_lines) + len(nvshare_lines) == len(gres_conf)
    assert gres_conf[:len(gpu_lines)] == gpu_lines          # gpu lines first
    assert all(list(w) == ["NodeName", "Name", "File"] for w in gpu_lines)
    assert gres[0] == f"gpu:{len(gpu_lines)}" == "gpu:2"     # slurm.conf counts gres.conf's files
    assert sum(int(w["Count"]) for w in nvshare_lines) == 6
    if typed:
        assert gres[1:] == [f"nvshare:{w['Type']}:{w['Count']}" for w in nvshare_lines]
    else:
        assert gres[1:] == ["nvshare:6"] and list(nvshare_lines[0]) == ["NodeName", "Name", "Count"]

    assert settings(files["cgroup.conf"]) == ["ConstrainDevices=yes"]


def test_device_files_come_out_in_index_order(nvml, capsys):
    """The minor number is not the index (NVML numbers GPUs in PCI order, the driver its files in
    probe order): each GPU's own file, gpu0's first."""
    nvml([(f"GPU-{i:08x}-0000-4000-8000-000000000000", "A100", 40 * GIB, minor)
          for i, minor in enumerate([2, 0, 3, 1])])
    _, out, _ = run(capsys, "--node", "n1")
    _, gres_lines = config_lines(out)
    assert [line for line in gres_lines if "Name=gpu " in line] == \
        [f"NodeName=n1 Name=gpu File=/dev/nvidia{m}" for m in [2, 0, 3, 1]]
    assert "#   gpu1: /dev/nvidia0 GPU-00000001-" in out


def fixed_inventory(*gpus: GpuInfo):
    inventory = types.SimpleNamespace(gpus=lambda: list(gpus), processes=lambda uuid: [])
    return lambda cfg: inventory


def test_an_inventory_out_of_order_is_printed_in_index_order(nvml, capsys):
    gpus = [GpuInfo(f"GPU-{i}", i, "x", GIB, f"/dev/nvidia{10 + i}") for i in (2, 0, 1)]
    code = nodeconfig.main(["--node", "n1", "--typed"], inventory_for=fixed_inventory(*gpus))
    out = capsys.readouterr().out
    assert code == 0
    _, gres_lines = config_lines(out)
    assert gres_lines == [f"NodeName=n1 Name=gpu File=/dev/nvidia{10 + i}" for i in range(3)] + \
        [f"NodeName=n1 Name=nvshare Type=gpu{i} Count=4" for i in range(3)]


@pytest.mark.parametrize("device", [
    "/dev/nvidia0\nNodeName=n1 Name=gpu File=/dev/mem",
    "/dev/nvidia0 Count=99",
    "/dev/nvidia0#",
    "/dev/nvidia0\r",
    "dev/nvidia0",
    "",
    "/dev/nvidia[0-3]",       # gres.conf would read a range of files
    "/dev/nvidia\u00e9",
])
def test_a_device_path_that_is_not_plain_is_refused(nvml, capsys, device):
    gpus = [GpuInfo("GPU-0", 0, "x", GIB, "/dev/nvidia0"), GpuInfo("GPU-1", 1, "x", GIB, device)]
    for json_flag in ([], ["--json"]):
        code = nodeconfig.main(["--node", "n1", *json_flag], inventory_for=fixed_inventory(*gpus))
        out, err = capsys.readouterr()
        assert (code, out) == (1, "")
        assert err == (f"nvshare-node-config: gpu1's device file: {device!r} is not a plain "
                       "absolute path (/ followed by letters, digits, _ . / -): refusing to print "
                       "it\n")


def test_two_gpus_on_one_device_file_are_refused(nvml, capsys):
    gpus = [GpuInfo(f"GPU-{i}", i, "x", GIB, "/dev/nvidia0") for i in range(2)]
    code = nodeconfig.main(["--node", "n1"], inventory_for=fixed_inventory(*gpus))
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert "gpu0 and gpu1 have the same device file /dev/nvidia0" in err


def test_the_configs_gpus_list_through_the_installed_command(tmp_path):
    config = tmp_path / "nvshare.yaml"
    config.write_text(yaml.safe_dump({"gpus": FAKE_GPUS}))
    command = Path(sys.executable).parent / "nvshare-node-config"
    argv = [str(command)] if command.exists() else [sys.executable, "-m", "nvshare_slurm.nodeconfig"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVSHARE_")}
    out = subprocess.run(argv + ["--config", str(config), "--node", "n2", "--typed"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "2 GPU(s) from the config's gpus: list" in out.stdout
    node_line, gres_lines = config_lines(out.stdout)
    # The config's GPUs have no device: key, so their files are /dev/nvidia<index>.
    assert node_line == "NodeName=n2 Gres=gpu:2,nvshare:gpu0:4,nvshare:gpu1:4"
    assert gres_lines == ["NodeName=n2 Name=gpu File=/dev/nvidia0",
                          "NodeName=n2 Name=gpu File=/dev/nvidia1",
                          "NodeName=n2 Name=nvshare Type=gpu0 Count=4",
                          "NodeName=n2 Name=nvshare Type=gpu1 Count=4"]
    # The entry points of the installation that printed this.
    assert f"Prolog={command.parent}/nvshare-prolog" in out.stdout.splitlines() or \
        not command.exists()


def test_a_gpu_name_cannot_add_lines(nvml, capsys):
    nvml([("GPU-00000000-0000-4000-8000-000000000000", "Evil\nNodeName=x Gres=nvshare:999\r", GIB)])
    _, out, _ = run(capsys, "--node", "n1")
    assert [line for line in out.splitlines() if "nvshare:999" in line] == \
        ["#   gpu0: /dev/nvidia0 GPU-00000000-0000-4000-8000-000000000000 1G "
         "Evil?NodeName=x Gres=nvshare:999?"]


def test_a_uuid_cannot_add_lines_or_a_section(nvml, capsys):
    nvml([("GPU-0\n# gres.conf\nNodeName=n1 Name=gpu File=/dev/mem", "A100", GIB)])
    _, out, _ = run(capsys, "--node", "n1")
    assert out.count("# gres.conf\n") == 1 and "/dev/mem" in out
    assert [line for line in out.splitlines() if "/dev/mem" in line] == \
        ["#   gpu0: /dev/nvidia0 GPU-0?# gres.conf?NodeName=n1 Name=gpu File=/dev/mem 1G A100"]


def test_entry_points_beside_this_python_else_opt_nvshare(nvml, capsys, monkeypatch, tmp_path):
    nvml(H100S[:1])
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python3"))
    _, out, err = run(capsys, "--node", "n1")
    assert "Prolog=/opt/nvshare/bin/nvshare-prolog" in out.splitlines()
    assert err == (f"nvshare-node-config: no nvshare-prolog beside {bin_dir}/python3: printing "
                   "/opt/nvshare/bin/... (--prefix DIR names where they are)\n")
    (bin_dir / "nvshare-prolog").touch()
    _, out, err = run(capsys, "--node", "n1")
    assert err == ""
    assert [line for line in out.splitlines() if "Prolog=" in line] == [
        f"Prolog={bin_dir}/nvshare-prolog", f"TaskProlog={bin_dir}/nvshare-taskprolog"]
    assert f"Epilog={bin_dir}/nvshare-epilog" in out.splitlines()
    _, out, _ = run(capsys, "--node", "n1", "--prefix", "/srv/nvshare/")
    assert "Prolog=/srv/nvshare/bin/nvshare-prolog" in out.splitlines()


def test_an_entry_point_directory_that_is_not_plain_is_refused(nvml, capsys, monkeypatch, tmp_path):
    nvml(H100S[:1])
    for prefix, message in [("opt/nvshare", "--prefix: 'opt/nvshare' is not an absolute path"),
                            ("/opt/nv share", "--prefix: '/opt/nv share/bin' is not a plain")]:
        code, out, err = run(capsys, "--node", "n1", "--prefix", prefix)
        assert (code, out) == (1, "") and err.startswith(f"nvshare-node-config: {message}")
    bin_dir = tmp_path / "my venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "nvshare-prolog").touch()
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python3"))
    code, out, err = run(capsys, "--node", "n1")
    assert (code, out) == (1, "")
    assert "the entry points' directory (--prefix DIR names another)" in err and str(bin_dir) in err


@pytest.mark.parametrize("argv,message", [
    (["--sharers", "0"], "--sharers: expected 1 .. 1024, got 0"),
    (["--node", "a b"], "--node: 'a b' is not a usable Slurm NodeName"),
    (["--node", "x;reboot"], "is not a usable Slurm NodeName"),
])
def test_bad_arguments_exit_2(nvml, capsys, argv, message):
    nvml(H100S)
    with pytest.raises(SystemExit) as exc:
        nodeconfig.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_no_driver_and_no_gpus_exit_1_with_one_line(nvml, capsys):
    nvml(H100S, fail="init")
    code, out, err = run(capsys, "--node", "n1")
    assert code == 1 and out == ""
    assert err.startswith("nvshare-node-config: NVML: nvmlInit failed: Driver Not Loaded")
    assert "set `gpus:` in the config" in err and err.count("\n") == 1
    nvml([])
    code, out, err = run(capsys, "--node", "n1")
    assert (code, out) == (1, "")
    assert err == "nvshare-node-config: NVML lists no GPUs on n1: nothing to share\n"


def test_a_missing_config_given_on_the_command_line_is_named(nvml, capsys, tmp_path):
    """Not NVML's failure (the driver is missing here too): the mistyped path is what to fix."""
    nvml(H100S, fail="init")
    missing = tmp_path / "nonexistent.yaml"
    code, out, err = run(capsys, "--config", str(missing), "--node", "n1")
    assert (code, out) == (1, "")
    assert err == f"nvshare-node-config: {missing}: no such config file\n"


def test_a_missing_default_config_still_means_nvml(nvml, capsys, monkeypatch, tmp_path):
    nvml(H100S[:1])
    monkeypatch.setenv("NVSHARE_CONFIG", str(tmp_path / "absent.yaml"))
    code, out, _ = run(capsys, "--node", "n1")
    assert code == 0 and "1 GPU(s) from NVML" in out


def test_a_bad_config_is_named(tmp_path, capsys):
    config = tmp_path / "nvshare.yaml"
    config.write_text("gpus: [{uuid: GPU-1, memory: 0}]\n")
    code, _, err = run(capsys, "--config", str(config), "--node", "n1")
    assert code == 1 and "[0].memory: must be positive" in err and str(config) in err


def shipped(name: str, skip: int) -> list[str]:
    """A file of slurm/ without its `skip` lines that say where it goes (after the shebang)."""
    lines = (Path(__file__).resolve().parents[2] / "slurm" / name).read_text().splitlines()
    return lines[:1] + lines[1 + skip:] if lines[0].startswith("#!") else lines[skip:]


def test_container_sections_are_the_shipped_files_for_the_prefix(nvml, capsys, tmp_path):
    """slurm/oci.conf.example and slurm/enroot-hook are what the node gets for /opt/nvshare; another
    prefix changes only the entry points' paths; apptainer.conf binds the hook and the config's
    socket directory."""
    nvml(H100S[:1])
    files = sections(run(capsys, "--node", "gpu01", "--prefix", "/opt/nvshare")[1])
    assert files["oci.conf"] == shipped("oci.conf.example", 2)
    assert files["/etc/enroot/hooks.d/nvshare.sh"] == shipped("enroot-hook", 2)
    config = tmp_path / "sock.yaml"
    config.write_text("socket: /var/run/nvs/daemon.sock\n")
    files = sections(run(capsys, "--node", "gpu01", "--prefix", "/usr/local",
                         "--config", str(config))[1])
    oci = files["oci.conf"]
    assert [line for line in oci if "nvshare-container" in line and not line.startswith("#")] == [
        'RunTimeRun="/usr/local/bin/nvshare-container oci %j %b -- /usr/bin/crun --rootless=true '
        '--root=/tmp/ --cgroup-manager=disabled run --bundle %b %n.%u.%j.%s.%t"']
    assert files["/etc/enroot/hooks.d/nvshare.sh"][-1] == \
        "exec /usr/local/bin/nvshare-container enroot"
    assert settings(files["apptainer.conf"]) == [f"bind path = {HOOK}", "bind path = /var/run/nvs"]


def test_a_socket_that_is_not_plain_is_refused(nvml, capsys, tmp_path):
    nvml(H100S[:1])
    config = tmp_path / "sock.yaml"
    config.write_text("socket: /run/a b/daemon.sock\n")
    code, out, err = run(capsys, "--node", "gpu01", "--config", str(config))
    assert code == 1 and out == ""
    assert "the config's socket: '/run/a b/daemon.sock' is not a plain absolute path" in err


def test_a_config_elsewhere_says_what_makes_the_lines_work(nvml, capsys, monkeypatch, tmp_path):
    """Slurm runs the Prolog, Epilog and TaskProlog with no NVSHARE_CONFIG: they read the default
    path. Printed from another file (--config or NVSHARE_CONFIG), the output says so and gives the
    command that puts the file there; once it has run, the Prolog's view of the config is the file
    the lines were printed from, and nothing more is said."""
    nvml(H100S[:1])
    default = tmp_path / "etc" / "nvshare" / "nvshare.yaml"
    monkeypatch.setattr(config_mod, "DEFAULT_PATH", str(default))
    elsewhere = tmp_path / "site" / "nvshare.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text("socket: /var/run/nvs/daemon.sock\n")
    command = f"mkdir -p {default.parent}; ln -s {elsewhere} {default}"
    note = [f"# These read {default} (Slurm gives them no NVSHARE_CONFIG), and",
            f"# this was printed from {elsewhere}: put it there on every node:", f"# {command}"]
    told = (f"nvshare-node-config: printed from {elsewhere}, but the Prolog, Epilog, TaskProlog and "
            f"nvshare-container read {default} (Slurm gives them no NVSHARE_CONFIG): put it there on "
            f"every node: {command}\n")
    for argv, environ in [(["--config", str(elsewhere)], None), ([], str(elsewhere))]:
        monkeypatch.setenv("NVSHARE_CONFIG", environ or str(tmp_path / "unused.yaml"))
        code, out, err = run(capsys, "--node", "n1", "--prefix", "/opt/nvshare", *argv)
        assert (code, err) == (0, told)
        slurm_conf = sections(out)["slurm.conf"]
        at = slurm_conf.index("Prolog=/opt/nvshare/bin/nvshare-prolog")
        assert slurm_conf[at - 3:at] == note
        code, out, err = run(capsys, "--node", "n1", "--prefix", "/opt/nvshare", "--json", *argv)
        assert (code, err) == (0, told)
        assert json.loads(out)["files"]["slurm.conf"][at - 3:at] == note

    # What Slurm's Prolog reads (its environment has no NVSHARE_CONFIG), before and after.
    assert config_mod.load_for_job({})[0].socket == config_mod.Config.socket
    subprocess.run(["sh", "-c", command], check=True)
    assert config_mod.load_for_job({})[0].socket == "/var/run/nvs/daemon.sock"
    monkeypatch.delenv("NVSHARE_CONFIG")
    code, out, err = run(capsys, "--node", "n1", "--config", str(elsewhere))
    assert (code, err) == (0, "") and "Slurm gives them no NVSHARE_CONFIG" not in out


def test_a_config_path_with_control_characters_is_refused(nvml, capsys, monkeypatch, tmp_path):
    nvml(H100S[:1])
    odd = tmp_path / "a\nProlog=x.yaml"
    odd.write_text("log_level: info\n")
    code, out, err = run(capsys, "--node", "n1", "--config", str(odd))
    assert (code, out) == (1, "")
    assert err == (f"nvshare-node-config: the config's path {str(odd)!r} holds control characters: "
                   "refusing to print it\n")
