"""nvshare-node-config: what an admin pastes into slurm.conf and gres.conf.

Golden files (tests/data/golden/nodeconfig.*, kept as tests/test_render.py keeps its own) for the
text; NVML is a fake pynvml module (no GPU here) driven through the real NvmlInventory; the config's
`gpus:` list goes through the installed command. The printed lines are also checked against the
Slurm model: typed gpuK = GPU index K, count-only = GPUs x sharers."""
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
from test_render import check_golden   # tests/data/golden/, NVSHARE_UPDATE_GOLDEN=1 rewrites

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


@pytest.fixture
def nvml(monkeypatch, tmp_path):
    """Install a fake pynvml with the given GPUs; the config file has no `gpus:` (so NVML is used)."""
    config = tmp_path / "nvshare.yaml"
    config.write_text("log_level: info\n")
    monkeypatch.setenv("NVSHARE_CONFIG", str(config))

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
    argv = ["--node", "gpu01", "--sharers", "4"] + (["--typed"] if style == "typed" else [])
    code, out, err = run(capsys, *argv)
    assert code == 0 and err == ""
    check_golden(f"nodeconfig.{style}.txt", out)


def test_json_golden(nvml, capsys):
    nvml(H100S[:2])
    code, out, _ = run(capsys, "--node", "gpu01", "--sharers", "3", "--typed", "--json")
    assert code == 0
    check_golden("nodeconfig.json", out)
    data = json.loads(out)
    assert data["slurm_conf"] == {"NodeName": "gpu01", "Gres": "nvshare:gpu0:3,nvshare:gpu1:3"}
    assert data["slots"] == 6


def config_lines(out: str) -> tuple[str, list[str]]:
    """(the slurm.conf NodeName line, the gres.conf lines) of the text output."""
    lines = [line for line in out.splitlines() if line.startswith("NodeName=")]
    return lines[0], lines[1:]


@pytest.mark.parametrize("gpus,sharers", [(1, 1), (2, 4), (8, 7)])
def test_count_only_slots_are_gpus_times_sharers(nvml, capsys, gpus, sharers):
    nvml([(f"GPU-{i:08x}-0000-4000-8000-000000000000", "A100", 40 * GIB)
         for i in range(gpus)])
    _, out, _ = run(capsys, "--node", "n1", "--sharers", str(sharers))
    node_line, gres_lines = config_lines(out)
    assert node_line == f"NodeName=n1 Gres=nvshare:{gpus * sharers}"
    assert gres_lines == [f"NodeName=n1 Name=nvshare Count={gpus * sharers}"]


def test_typed_lines_agree_with_each_other(nvml, capsys):
    """slurm.conf's per-type counts and gres.conf's Type=/Count= lines must match, or slurmd refuses."""
    nvml(H100S)
    _, out, _ = run(capsys, "--node", "n2", "--sharers", "2", "--typed")
    node_line, gres_lines = config_lines(out)
    from_slurm_conf = {part.split(":")[1]: int(part.split(":")[2])
                       for part in node_line.split("Gres=")[1].split(",")}
    from_gres_conf = {}
    for line in gres_lines:
        fields = dict(word.split("=", 1) for word in line.split())
        assert fields["NodeName"] == "n2" and fields["Name"] == "nvshare"
        from_gres_conf[fields["Type"]] = int(fields["Count"])
    assert from_slurm_conf == from_gres_conf == {f"gpu{i}": 2 for i in range(4)}


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
    # What tests/slurm/conftest.py gives its typed node n2, which real Slurm accepts.
    assert node_line == "NodeName=n2 Gres=nvshare:gpu0:4,nvshare:gpu1:4"
    assert gres_lines == ["NodeName=n2 Name=nvshare Type=gpu0 Count=4",
                          "NodeName=n2 Name=nvshare Type=gpu1 Count=4"]


def test_a_gpu_name_cannot_add_lines(nvml, capsys):
    nvml([("GPU-00000000-0000-4000-8000-000000000000", "Evil\nNodeName=x Gres=nvshare:999\r", GIB)])
    _, out, _ = run(capsys, "--node", "n1")
    assert [line for line in out.splitlines() if "nvshare:999" in line] == \
        ["#   gpu0: GPU-00000000-0000-4000-8000-000000000000 1G Evil?NodeName=x Gres=nvshare:999?"]


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
