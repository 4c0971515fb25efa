"""The ``verl-offpolicy`` console command: schedule, list, doctor."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hydra_utils import VALID_SIZES
from tests.test_presets import SPEC
from verl_offpolicy.cli import main, preset_header, preset_names

# The console script pip installs next to this environment's python (PATH may not include it).
EXE = str(Path(sys.executable).parent / "verl-offpolicy")


def test_console_script_is_installed():
    assert Path(EXE).is_file(), "pip install -e . must install the verl-offpolicy command"
    proc = subprocess.run([EXE, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "doctor" in proc.stdout


def test_schedule_prints_the_spec_table(capsys):
    assert main(["schedule", "--sync-interval", "4", "--sync-offset", "1", "--steps", "12"]) == 0
    out = capsys.readouterr().out
    rows = [r for r in (line.split() for line in out.splitlines()) if len(r) >= 5 and r[0].isdigit() and r[1].isdigit()]
    assert [int(r[1]) for r in rows] == [0, 0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8]
    assert [int(r[2]) for r in rows] == [0, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]
    assert "3 rollout calls" in out and "at most s+d = 5" in out


def test_schedule_rejects_invalid_interval_with_the_key(capsys):
    assert main(["schedule", "--sync-interval", "0", "--steps", "3"]) == 2
    assert "algorithm.offpolicy.sync_interval must be an integer >= 1" in capsys.readouterr().err


def test_schedule_rejects_a_non_positive_step_count(capsys):
    assert main(["schedule", "-s", "2", "-n", "-3"]) == 2
    err = capsys.readouterr().err
    assert "--steps (-n) must be an integer >= 1, got -3" in err


def test_schedule_with_a_huge_interval_generates_only_the_steps_asked_for(capsys):
    assert main(["schedule", "-s", str(10**12), "-n", "4"]) == 0
    out = capsys.readouterr().out
    assert "+4 batches" in out and str(10**12) + " batches" not in out.split("\n", 1)[1]


def test_check_accepts_options_between_hydra_overrides(capsys):
    """As main_ppo does: `check algorithm=opmd --config-name offpolicy_trainer ...` (options anywhere)."""
    argv = ["check", "algorithm=opmd", "--config-name", "offpolicy_trainer", *VALID_SIZES[:3], "--config-name",
            "offpolicy_trainer", *VALID_SIZES[3:]]
    assert main(argv) == 0, capsys.readouterr().err
    assert "ok: offpolicy_trainer | adv_estimator=opmd" in capsys.readouterr().out


def test_demo_accepts_options_between_hydra_overrides(capsys):
    """The options are read wherever they stand (an unknown preset stops it before anything runs)."""
    assert main(["demo", "trainer.seed=1", "--preset", "no_such_preset", "data.seed=2", "--steps", "3"]) == 2
    assert "unknown preset 'no_such_preset'" in capsys.readouterr().err


CPU_OVERLAY = ["--config-name", "offpolicy_trainer", "algorithm=opmd", "+cpu=demo"]


@pytest.fixture()
def cpu_model_dirs(tmp_path):
    # The CPU guard checks that the model and tokenizer paths are local directories (check loads neither).
    return [f"actor_rollout_ref.model.path={tmp_path}", f"actor_rollout_ref.model.tokenizer_path={tmp_path}"]


def test_check_accepts_the_cpu_overlay(capsys, cpu_model_dirs):
    assert main(["check", *CPU_OVERLAY, *cpu_model_dirs]) == 0, capsys.readouterr().err
    assert "strategy=fsdp2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "override,expected",
    [
        ("actor_rollout_ref.actor.strategy=fsdp", "FSDP1 does not run on the CPU; set actor_rollout_ref.actor.strategy=fsdp2"),
        ("actor_rollout_ref.rollout.name=vllm", "set actor_rollout_ref.rollout.name=hf"),
        ("ray_kwargs.ray_init.num_cpus=2", "Ray would have 2 and wait forever"),
    ],
)
def test_check_runs_the_cpu_guards_of_main_ppo(capsys, cpu_model_dirs, override, expected):
    """`+cpu=...` selects the CPU path: check applies the same guard (the overlay's Hydra callback) main_ppo does."""
    assert main(["check", *CPU_OVERLAY, *cpu_model_dirs, override]) == 1
    captured = capsys.readouterr()
    assert "ok:" not in captured.out
    assert "cannot run on verl's CPU path" in captured.err and expected in captured.err


@pytest.mark.parametrize("config_name", ["offpolicy_trainer", "offpolicy_megatron_trainer"])
def test_check_rejects_an_algorithm_choice_that_is_no_preset(capsys, config_name):
    """verl's own `algorithm/rollout_correction.yaml` is in the same Hydra group, but is no algorithm."""
    assert main(["check", "--config-name", config_name, "algorithm=rollout_correction", *VALID_SIZES]) == 1
    err = capsys.readouterr().err
    assert "algorithm=rollout_correction is not a verl-offpolicy preset" in err
    assert all(name in err for name in preset_names())


def test_list_names_every_preset_with_description_and_paper_setting(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    names = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert sorted(names) == sorted(SPEC)
    for name in SPEC:
        header = preset_header(name)
        assert header, f"{name} has no description"
        assert any("Reproduces:" in line for line in header), f"{name} does not state the paper setting"


@pytest.mark.timeout(600)
def test_doctor_reports_every_name_in_driver_and_ray_worker():
    proc = subprocess.run([EXE, "doctor"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    driver, _, worker = proc.stdout.partition("[fresh Ray worker]")
    for section in (driver, worker):
        for name in ("opmd", "pmd_partition", "asymre", "red_drop", "red_weight", "agro", "pmd", "rec", "offpolicy"):
            assert f" {name}\n" in section
        assert "MISSING" not in section
    assert f"offpolicy_trainer: {len(preset_names())} presets checked" in proc.stdout
