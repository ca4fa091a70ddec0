"""`accelerate launch --cpu --num_processes N` detection (captioner/orchestration/launching.py)."""
from __future__ import annotations

import pytest

from pacs.captioner.orchestration.launching import LaunchError, cpu_processes_to_start, launcher_arguments

SINGLE_CPU_LAUNCHER = {"ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
PARENT = ["/usr/bin/python", "/usr/local/bin/accelerate", "launch", "--cpu", "--num_processes", "3",
          "recipes/scst_pacs.py", "xe.max_steps=5"]


def test_cpu_launcher_asked_for_several_processes_is_detected():
    assert launcher_arguments(PARENT) == PARENT[3:]
    assert cpu_processes_to_start(SINGLE_CPU_LAUNCHER, PARENT) == 3
    module_form = ["python", "-m", "accelerate.commands.launch", "--num_processes=2", "--cpu", "x.py"]
    assert cpu_processes_to_start(SINGLE_CPU_LAUNCHER, module_form) == 2


def test_nothing_to_do_outside_that_situation():
    assert cpu_processes_to_start({}, PARENT) == 0  # not a CPU launch
    assert cpu_processes_to_start({"ACCELERATE_USE_CPU": "True"}, PARENT) == 0  # one process: no MASTER_ADDR
    assert cpu_processes_to_start(dict(SINGLE_CPU_LAUNCHER, WORLD_SIZE="3", RANK="0"), PARENT) == 0  # torchrun
    assert cpu_processes_to_start(dict(SINGLE_CPU_LAUNCHER, OMPI_COMM_WORLD_SIZE="3"), PARENT) == 0  # MPI
    assert cpu_processes_to_start(SINGLE_CPU_LAUNCHER, ["bash", "-c", "python x.py"]) == 0  # not accelerate
    one = PARENT[:4] + ["--num_processes", "1"] + PARENT[6:]
    assert cpu_processes_to_start(SINGLE_CPU_LAUNCHER, one) == 0


def test_unknown_count_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr("accelerate.commands.config.default_config_file", str(tmp_path / "none.yaml"))
    with pytest.raises(LaunchError, match="--num_processes N"):
        cpu_processes_to_start(SINGLE_CPU_LAUNCHER, ["accelerate", "launch", "--cpu", "x.py"])


def test_count_from_an_accelerate_config_file(tmp_path):
    config = tmp_path / "cpu.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 4\n"
                      "num_machines: 1\nmixed_precision: 'no'\nuse_cpu: true\n")
    parent = ["accelerate", "launch", "--config_file", str(config), "recipes/scst_pacs.py"]
    assert cpu_processes_to_start(SINGLE_CPU_LAUNCHER, parent) == 4


def test_unreadable_launcher_command_line_is_reported_not_ignored():
    # before: an unreadable parent command line counted as "not accelerate" and one process ran silently
    with pytest.raises(LaunchError, match="cannot read the launcher's command line"):
        cpu_processes_to_start(SINGLE_CPU_LAUNCHER, None)
    with pytest.raises(LaunchError, match="accelerate launch --multi_gpu"):
        cpu_processes_to_start(SINGLE_CPU_LAUNCHER, lambda: None)
    # outside that situation the command line is not even read
    calls = []
    assert cpu_processes_to_start({}, lambda: calls.append(1)) == 0 and calls == []
    assert cpu_processes_to_start(SINGLE_CPU_LAUNCHER, lambda: PARENT) == 3
