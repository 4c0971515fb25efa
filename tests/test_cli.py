"""The ``verl-offpolicy`` console command: schedule, list, doctor."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hydra_utils import VALID_SIZES
from tests.jobs import queued_at_start
from tests.scenario_presets import SPEC
from verl_offpolicy.cli import main, preset_header, preset_names
from verl_offpolicy.configs import PRIMARY_CONFIGS
from verl_offpolicy.cpu.platform import is_loopback
from verl_offpolicy.demo.command import rollout_overrides
from verl_offpolicy.demo.process import processes_mentioning

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


@pytest.mark.parametrize("timeout", ["-5", "0", "nan", "inf"])
def test_demo_rejects_a_timeout_that_is_no_positive_number_before_anything_runs(capsys, tmp_path, timeout):
    out = tmp_path / "out"
    assert main(["demo", "--timeout", timeout, "--output-dir", str(out)]) == 2
    assert "--timeout must be a number of seconds > 0, got " in capsys.readouterr().err
    assert not out.exists()


def test_schedule_with_a_huge_interval_generates_only_the_steps_asked_for(capsys):
    assert main(["schedule", "-s", str(10**12), "-n", "4"]) == 0
    out = capsys.readouterr().out
    assert "+4 batches" in out and str(10**12) + " batches" not in out.split("\n", 1)[1]


@pytest.mark.slow  # check's worker probe: a fresh process imports verl
def test_check_accepts_options_between_hydra_overrides(capsys):
    """As main_ppo does: `check algorithm=opmd --config-name offpolicy_trainer ...` (options anywhere)."""
    argv = [
        "check",
        "algorithm=opmd",
        "--config-name",
        "offpolicy_trainer",
        *VALID_SIZES[:3],
        "--config-name",
        "offpolicy_trainer",
        *VALID_SIZES[3:],
    ]
    assert main(argv) == 0, capsys.readouterr().err
    assert "ok: offpolicy_trainer | adv_estimator=opmd" in capsys.readouterr().out


def test_demo_accepts_options_between_hydra_overrides(capsys):
    """The options are read wherever they stand (an unknown preset stops it before anything runs)."""
    assert main(["demo", "trainer.seed=1", "--preset", "no_such_preset", "data.seed=2", "--steps", "3"]) == 2
    assert "unknown preset 'no_such_preset'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "rollout, overrides, expected",
    [
        ("hf", ["+cpu_rollout=standalone", "data.seed=1"], ["+cpu_rollout=standalone", "data.seed=1"]),
        ("vllm", ["data.seed=1"], ["data.seed=1", "+cpu_rollout=vllm"]),
        # verl's vLLM server on a pool of its own: both overlays, as one Hydra list
        ("vllm", ["+cpu_rollout=standalone", "data.seed=1"], ["data.seed=1", "+cpu_rollout=[vllm,standalone]"]),
        ("vllm", ["+cpu_rollout=[standalone,vllm]"], ["+cpu_rollout=[vllm,standalone]"]),
        ("vllm", ["+cpu_rollout=vllm"], ["+cpu_rollout=vllm"]),
    ],
)
def test_demo_rollout_option_merges_its_overlay_with_the_users(rollout, overrides, expected):
    assert rollout_overrides(rollout, overrides) == expected


def test_demo_rejects_an_unknown_rollout_before_anything_runs(capsys, tmp_path):
    out = tmp_path / "out"
    assert main(["demo", "--rollout", "sglang", "--output-dir", str(out)]) == 2
    assert "unknown --rollout 'sglang'; allowed: hf, vllm" in capsys.readouterr().err
    assert not out.exists()


CPU_OVERLAY = ["--config-name", "offpolicy_trainer", "algorithm=opmd", "+cpu=demo"]


@pytest.fixture()
def cpu_model_dirs(tmp_path):
    # The CPU guard checks that the model and tokenizer paths are local directories (check loads neither).
    # A passing guard puts this process on the CPU platform (VERL_PLATFORM=cpu, ... in os.environ): undone
    # afterwards, or every later test's subprocess would inherit it.
    environ = dict(os.environ)
    yield [f"actor_rollout_ref.model.path={tmp_path}", f"actor_rollout_ref.model.tokenizer_path={tmp_path}"]
    os.environ.clear()
    os.environ.update(environ)


@pytest.mark.slow  # check's worker probe: a fresh process imports verl
def test_check_accepts_the_cpu_overlay(capsys, cpu_model_dirs):
    assert main(["check", *CPU_OVERLAY, *cpu_model_dirs]) == 0, capsys.readouterr().err
    assert "strategy=fsdp2" in capsys.readouterr().out


@pytest.mark.parametrize(
    "override,expected",
    [
        (
            "actor_rollout_ref.actor.strategy=fsdp",
            "FSDP1 does not run on the CPU; set actor_rollout_ref.actor.strategy=fsdp2",
        ),
        ("actor_rollout_ref.rollout.name=vllm", "set actor_rollout_ref.rollout.name=hf"),
        ("ray_kwargs.ray_init.num_cpus=2", "Ray would have 2 and wait forever"),
        (
            "actor_rollout_ref.model.lora_rank=8 actor_rollout_ref.model.lora.merge=false",
            "lora.merge=False: with actor_rollout_ref.model.lora_rank=8 the rollout must receive merged weights",
        ),
    ],
)
def test_check_runs_the_cpu_guards_of_main_ppo(capsys, cpu_model_dirs, override, expected):
    """`+cpu=...` selects the CPU path: check applies the same guard (the overlay's Hydra callback) main_ppo does."""
    assert main(["check", *CPU_OVERLAY, *cpu_model_dirs, *override.split()]) == 1
    captured = capsys.readouterr()
    assert "ok:" not in captured.out
    assert "cannot run on verl's CPU path" in captured.err and expected in captured.err


@pytest.mark.parametrize("config_name", ["ppo_trainer", "offpolicy_trainer"])
def test_check_rejects_a_trainer_mode_verl_does_not_know(capsys, config_name):
    """verl looks trainer.v1.trainer_mode up only in its TaskRunner, after Ray and TransferQueue started."""
    assert main(["check", "--config-name", config_name, "trainer.v1.trainer_mode=bogus", *VALID_SIZES]) == 1
    captured = capsys.readouterr()
    assert "ok:" not in captured.out
    assert "trainer.v1.trainer_mode='bogus' is not a registered trainer; allowed values: " in captured.err
    assert all(mode in captured.err for mode in ("sync", "colocate_async", "separate_async", "offpolicy"))


@pytest.mark.parametrize("overlay", ["standalone", "vllm", "[vllm,standalone]"])
def test_check_rejects_a_cpu_rollout_overlay_without_the_cpu_path(capsys, overlay):
    """+cpu_rollout=standalone on a GPU config caps Ray's GPUs and selects the CPU weight transport; a list of
    overlays (verl's vLLM rollout on its own pool) is not among Hydra's recorded choices, and caught too."""
    assert (
        main(["check", "--config-name", "offpolicy_trainer", "algorithm=opmd", f"+cpu_rollout={overlay}", *VALID_SIZES])
        == 1
    )
    captured = capsys.readouterr()
    assert "ok:" not in captured.out
    assert f"+cpu_rollout={overlay} is part of verl-offpolicy's CPU path" in captured.err
    assert f"Add +cpu=demo, or remove +cpu_rollout={overlay}" in captured.err


@pytest.mark.slow  # check's worker probe: a fresh process imports verl
def test_check_accepts_a_users_own_preset_on_their_search_path(capsys, tmp_path):
    """A preset file of the user's, in a folder added to Hydra's search path, is selectable (and validated)."""
    (tmp_path / "algorithm").mkdir()
    (tmp_path / "algorithm" / "my_opmd.yaml").write_text(
        "# @package _global_\n# my OPMD variant\ndefaults:\n  - /offpolicy_shared/common\n  - _self_\n"
        "algorithm:\n  adv_estimator: opmd\n  norm_adv_by_std_in_grpo: false\n"
        "actor_rollout_ref:\n  actor:\n    policy_loss:\n      loss_mode: opmd\n"
    )
    search = f"hydra.searchpath=[file://{tmp_path}]"
    assert main(["check", "--config-name", "offpolicy_trainer", search, "algorithm=my_opmd", *VALID_SIZES]) == 0, (
        capsys.readouterr().err
    )
    assert "adv_estimator=opmd loss_mode=opmd" in capsys.readouterr().out
    # ... and validated like ours.
    assert (
        main(
            [
                "check",
                "--config-name",
                "offpolicy_trainer",
                search,
                "algorithm=my_opmd",
                "algorithm.offpolicy.baseline=max",
                *VALID_SIZES,
            ]
        )
        == 1
    )
    assert "algorithm.offpolicy.baseline='max' is not valid" in capsys.readouterr().err


@pytest.mark.parametrize("config_name", PRIMARY_CONFIGS)
def test_check_rejects_an_algorithm_choice_that_is_no_preset(capsys, config_name):
    """verl's own `algorithm/rollout_correction.yaml` is in the same Hydra group, but is no algorithm."""
    assert main(["check", "--config-name", config_name, "algorithm=rollout_correction", *VALID_SIZES]) == 1
    err = capsys.readouterr().err
    assert "algorithm=rollout_correction is not a verl-offpolicy preset" in err
    assert all(name in err for name in preset_names())
    assert "a preset of your own: algorithm/<name>.yaml in a folder on Hydra's search path" in err


def test_list_names_every_preset_with_description_and_paper_setting(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    names = [line for line in out.splitlines() if line and not line.startswith(" ")]
    assert sorted(names) == sorted(SPEC)
    for name in SPEC:
        header = preset_header(name)
        assert header, f"{name} has no description"
        assert any("Reproduces:" in line for line in header), f"{name} does not state the paper setting"


DOCTOR_TIMEOUT = 900  # composes every preset twice and starts Ray: minutes on a busy machine


def run_doctor(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The real console script (environment ``env``, default this process's, PYTHONPATH included), and every
    TCP socket that its process tree (the Ray probe, GCS, raylet, workers) listened on while it ran, polled
    every 0.1 s."""
    import time

    from verl_offpolicy.demo.process import listening_addresses

    proc = subprocess.Popen(
        [EXE, "doctor", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ if env is None else env),
    )
    listening: set[str] = set()
    deadline = time.monotonic() + DOCTOR_TIMEOUT
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            listening.update(listening_addresses(proc, None))
            time.sleep(0.1)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), sorted(listening)


NO_PLUGINS = {"VERL_USE_EXTERNAL_PLUGINS": "none"}


@queued_at_start(scope="module")
def doctor_run(demo_runs):
    """The future of the full doctor run in the session's environment, a long job of the session. It spends
    most of its minute in one process at a time (start Ray, then a worker that imports verl)."""
    return demo_runs.submit("doctor", run_doctor, env=demo_runs.environ)


@queued_at_start(scope="module")
def doctor_no_plugins_run(demo_runs):
    """As :func:`doctor_run`, with ``NO_PLUGINS`` (queued only in a session that selects its test)."""
    return demo_runs.submit("doctor_no_plugins", run_doctor, env={**demo_runs.environ, **NO_PLUGINS})


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(DOCTOR_TIMEOUT + 60)
def test_doctor_reports_every_name_in_driver_and_ray_worker(doctor_run):
    proc, listening = doctor_run.result()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    driver, _, worker = proc.stdout.partition("[fresh Ray worker]")
    for section in (driver, worker):
        for name in ("opmd", "pmd_partition", "asymre", "red_drop", "red_weight", "agro", "pmd", "rec", "offpolicy"):
            assert f" {name}\n" in section
        assert "MISSING" not in section
    assert f"offpolicy_trainer: {len(preset_names())} presets checked" in proc.stdout
    # Security: doctor's Ray cluster (GCS, raylet, a worker) listens on loopback only.
    assert len(listening) >= 3, listening
    assert [a for a in listening if not is_loopback(a)] == [], listening


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(DOCTOR_TIMEOUT + 60)
def test_doctor_reports_what_workers_miss_when_verl_loads_no_plugins(doctor_no_plugins_run):
    """`VERL_USE_EXTERNAL_PLUGINS=none`: `import verl` registers nothing of ours in any process; doctor
    must say so with the fix (it used to register the names itself and say ok).

    Extended tier: in the default run, ``doctor --address`` finds the same setting in the workers of the
    cluster's third node (tests/scheduler/test_cluster_e2e.py), and main_ppo's driver stops on it
    (test_plugin.py::test_main_ppo_without_our_plugin_stops_before_ray_naming_the_setting)."""
    proc, listening = doctor_no_plugins_run.result()
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    fix = "VERL_USE_EXTERNAL_PLUGINS=none disables verl's plugins"
    process, _, worker = proc.stdout.partition("[fresh Ray worker]")
    assert fix in process and fix in worker and "MISSING" in worker
    assert "Traceback" not in proc.stdout + proc.stderr
    assert [a for a in listening if not is_loopback(a)] == [], listening


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(DOCTOR_TIMEOUT + 60)
def test_doctor_reports_a_timeout_as_a_finding_and_leaves_nothing_behind():
    before = set(Path("/tmp").glob("vo-doctor-*"))
    proc, _ = run_doctor("--timeout", "0.5")
    assert proc.returncode == 1
    assert "the fresh Ray worker did not answer within 0.5 s" in proc.stdout
    assert "overloaded" in proc.stdout and "--timeout" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert set(Path("/tmp").glob("vo-doctor-*")) == before
    assert processes_mentioning("vo-doctor-") == []


def test_doctor_address_names_a_node_by_id_address_and_custom_resources_and_flags_other_versions():
    """doctor --address's per-node findings (the e2e in tests/scheduler/test_cluster_e2e.py runs it on a real cluster):
    a node is named as ``ray status`` shows it; a version that differs from the driver's is a finding naming
    both versions, one that matches is not."""
    from verl_offpolicy.doctor import node_label, version_problems

    node = {
        "node_id": "b828e61747d3aa01",
        "ip": "127.0.0.1",
        "resources": {
            "CPU": 8.0,
            "GPU": 1.0,
            "memory": 1e9,
            "object_store_memory": 1e8,
            "node:127.0.0.1": 1.0,
            "accelerator_type:A100": 1.0,
            "vo_node_1": 1.0,
            "big_disk": 1.0,
        },
    }
    assert node_label(node) == "node b828e61747d3 at 127.0.0.1 (big_disk, vo_node_1)"
    assert node_label({**node, "resources": {"CPU": 1.0}}) == "node b828e61747d3 at 127.0.0.1"
    here = {"verl-offpolicy": "0.1.0", "verl": "0.9.1"}
    assert version_problems("node x", dict(here), here) == []
    assert version_problems("node x", {"verl-offpolicy": "0.0.9", "verl": "0.9.1"}, here) == [
        "node x: verl-offpolicy 0.0.9 on the node, 0.1.0 here; install the same version on every node"
    ]
    assert version_problems("node x", {"verl": "0.9.1"}, here) == [
        "node x: verl-offpolicy not installed on the node, 0.1.0 here; install the same version on every node"
    ]


def test_doctor_address_flags_a_node_without_a_cpu_where_transfer_queue_may_deal_a_storage_unit():
    """TransferQueue deals its storage units (1 CPU each) round-robin over every alive node with hard node
    affinity: a node with no CPU (no ``CPU`` key, or 0) fails a run on some start-ups and not others (seen in
    CI on tests/scheduler/test_cluster_e2e.py's third node), so doctor names it with both keys of the fix; a node
    with a CPU is not a finding."""
    from verl_offpolicy.doctor import STORAGE_NODE_KEY, STORAGE_UNITS_KEY, storage_placement_problems

    assert storage_placement_problems("node x", {"CPU": 1.0, "GPU": 0.0}) == []
    for resources in ({"GPU": 1.0}, {"CPU": 0.0, "vo_node_2": 1.0}):
        [problem] = storage_placement_problems("node x", resources)
        assert problem.startswith("node x: no CPU"), problem
        assert STORAGE_UNITS_KEY in problem and f"+{STORAGE_NODE_KEY}=" in problem, problem


def test_doctors_ray_probe_keeps_its_token_in_its_own_dir(tmp_path):
    """doctor's Ray cluster enables Ray's token authentication; Ray used to write the token to
    ~/.ray/auth_token, world-readable (0644), and leave it. The probe's environment points Ray at a fresh
    token in the probe's temp dir (0600, removed with it), as the demo's does (whose run test_cpu_e2e.py
    checks leaves $HOME empty); a token or mode the user set is kept."""
    from verl_offpolicy.doctor import ray_probe_env

    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")}
    token = Path(ray_probe_env(env, str(tmp_path))["RAY_AUTH_TOKEN_PATH"])
    assert token.parent == tmp_path and token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    assert (
        ray_probe_env({**env, "RAY_AUTH_MODE": "disabled"}, str(tmp_path / "other")).get("RAY_AUTH_TOKEN_PATH") is None
    )


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_ray_that_cannot_start_is_a_finding(monkeypatch):
    """A real ray.init failure (RAY_ADDRESS names a cluster that is not there) in the probe process."""
    from verl_offpolicy.doctor import ProbeError, ray_worker_state

    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:9"}
    with pytest.raises(ProbeError, match="Ray could not start a worker: .*Error"):
        ray_worker_state(env, timeout=240)
    assert processes_mentioning("vo-doctor-") == []


# ------------------------------------------------------------ check: what the workers will see


@pytest.mark.parametrize(
    "env,expected",
    [
        ({"VERL_USE_EXTERNAL_PLUGINS": "none"}, "unset VERL_USE_EXTERNAL_PLUGINS"),
        ({"VERL_USE_EXTERNAL_PLUGINS": "someone_else"}, "VERL_USE_EXTERNAL_PLUGINS=someone_else,verl_offpolicy"),
    ],
)
@pytest.mark.slow  # check's worker probe: a fresh process imports verl
def test_check_reports_what_workers_miss_after_import_verl(capsys, monkeypatch, env, expected):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["check", "--config-name", "offpolicy_trainer", "algorithm=opmd", *VALID_SIZES]) == 1
    err = capsys.readouterr().err
    assert "the Ray workers of this run will not have verl-offpolicy" in err and expected in err
    assert "algorithm.adv_estimator=opmd" in err


@pytest.mark.slow  # check's worker probe: a fresh process imports verl
def test_check_reads_the_workers_environment_from_the_config(capsys):
    override = "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_PLUGINS=none"
    assert main(["check", "--config-name", "offpolicy_trainer", "algorithm=opmd", override, *VALID_SIZES]) == 1
    assert "VERL_USE_EXTERNAL_PLUGINS=none disables verl's plugins" in capsys.readouterr().err


@pytest.mark.slow  # check's worker probe: a fresh process imports verl
def test_check_reports_a_broken_entry_point(capsys, monkeypatch, tmp_path):
    """Installed metadata whose entry point names a module that does not exist (a stale install):
    found first on the path, it shadows the real metadata, as a second, broken install would."""
    dist = tmp_path / "verl_offpolicy-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: verl-offpolicy\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[verl.plugins]\nverl_offpolicy = verl_offpolicy.glue.no_such_plugin\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    # Run from tmp_path: in a source checkout with an editable install, the checkout's own
    # verl_offpolicy.egg-info (the working directory, first on a fresh process's sys.path) would be
    # found before the stale metadata.
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--config-name", "offpolicy_trainer", "algorithm=opmd", *VALID_SIZES]) == 1
    err = capsys.readouterr().err
    assert "entry point verl_offpolicy = verl_offpolicy.glue.no_such_plugin failed to load" in err
    assert "No module named 'verl_offpolicy.glue.no_such_plugin'" in err and "reinstall" in err


def test_cluster_rejects_bad_sizes_and_a_stop_without_its_dir_before_starting_anything(capsys):
    before = set(Path("/tmp").glob("vo-cluster-*"))
    assert main(["cluster", "start", "--nodes", "0"]) == 2
    assert "--nodes must be >= 1, got 0" in capsys.readouterr().err
    assert main(["cluster", "start", "--gpus-per-node", "-1"]) == 2
    assert "--gpus-per-node must be >= 1, got -1" in capsys.readouterr().err
    assert main(["cluster", "stop"]) == 2
    assert "--dir is required" in capsys.readouterr().err
    assert set(Path("/tmp").glob("vo-cluster-*")) == before


def _sleeper(*args: str) -> subprocess.Popen:
    """A process whose command line names ``args`` (as a Ray process names its session dir)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", *args])


@pytest.mark.slow  # starts a Python process (another run's stand-in)
def test_cluster_stop_refuses_what_cluster_start_did_not_make_and_touches_nothing(tmp_path, capsys):
    """`cluster stop --dir D` on a dir that is not a cluster's (a typo: the temp folder, a truncated name) once
    killed every process whose command line contained D and removed D's tree. Now: refused, nothing ended or removed."""
    plain = tmp_path / "nc"
    plain.mkdir()
    (plain / "important.txt").write_text("keep")
    other = _sleeper(f"{plain}-other-run")
    try:
        assert main(["cluster", "stop", "--dir", str(plain)]) == 1
        err = capsys.readouterr().err
        assert f"{plain} is not a cluster dir" in err and "nothing was stopped" in err
        named = tmp_path / "vo-cluster-lookalike"  # the right name but no marker: not made by `cluster start`
        named.mkdir()
        assert main(["cluster", "stop", "--dir", str(named)]) == 1
        assert "has no vo-cluster file" in capsys.readouterr().err
        assert main(["cluster", "stop", "--dir", str(tmp_path / "vo-cluster-missing")]) == 1
        assert "does not exist" in capsys.readouterr().err
        assert other.poll() is None and (plain / "important.txt").read_text() == "keep" and named.is_dir()
    finally:
        other.kill()
        other.wait(timeout=60)


@pytest.mark.slow  # starts Python processes (the cluster's and another run's stand-ins)
def test_cluster_stop_ends_only_the_processes_of_its_own_dir(tmp_path, capsys):
    """A cluster's Ray processes (naming its Ray temp dir or a path under it) end and the dir goes; a process naming a
    longer dir that starts with the same characters (another run) and one that merely names the cluster's dir (not a
    process of the cluster: `tail -f D/server.log`) live on. The rest of what `stop` ends:
    tests/demo/test_cluster_stop.py."""
    from verl_offpolicy.demo.cluster import MARKER_NAME, MARKER_TEXT

    path = tmp_path / "vo-cluster-abc"
    path.mkdir()
    (path / MARKER_NAME).write_text(MARKER_TEXT)
    ours, ours_option = _sleeper(f"{path}/ray"), _sleeper(f"--temp-dir={path}/ray/session_1")
    theirs, bystander = _sleeper(f"{path}x/ray"), _sleeper(str(path))
    try:
        assert main(["cluster", "stop", "--dir", str(path)]) == 0
        assert ours.wait(timeout=60) is not None and ours_option.wait(timeout=60) is not None
        assert theirs.poll() is None and bystander.poll() is None and not path.exists()
    finally:
        for proc in (ours, ours_option, theirs, bystander):
            proc.kill()
            proc.wait(timeout=60)


def test_names_path_matches_a_path_or_one_under_it_not_a_longer_name():
    from verl_offpolicy.demo.process import names_path

    assert names_path(["python", "-m", "x", "serve", "/tmp/d"], "/tmp/d")
    assert names_path(["raylet", "--session_dir=/tmp/d/session_1"], "/tmp/d")
    assert names_path(["w", '--cfg={"temp_dir": "/tmp/d"}'], "/tmp/d")
    assert not names_path(["python", "/tmp/d-other-run"], "/tmp/d")
    assert not names_path(["python", "/tmp/dd/x", "--x=/tmp/dx"], "/tmp/d")
    assert not names_path(["python", "/home/tmp/d"], "/tmp/d")


def test_doctor_tells_no_cluster_at_an_address_apart_from_a_slow_one_within_seconds():
    """`doctor --address 127.0.0.1:1` waited its whole --timeout and blamed load: now a TCP connect answers at once."""
    import time

    from verl_offpolicy.doctor import ProbeError, check_cluster_reachable

    start = time.monotonic()
    with pytest.raises(ProbeError, match=r"^no Ray cluster at 127.0.0.1:1: Connection refused"):
        check_cluster_reachable("127.0.0.1:1", {})
    assert time.monotonic() - start < 30
    check_cluster_reachable("auto", {})  # Ray resolves "auto" (and ray://): nothing to connect to here


def test_doctor_names_the_missing_token_variables_of_a_cluster():
    from verl_offpolicy.doctor import _token_hint

    hint = _token_hint({"RAY_AUTH_MODE": "token"})
    assert "lacks RAY_AUTH_TOKEN_PATH" in hint and "export the values `cluster start` printed" in hint
    assert _token_hint({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/x"}) == ""
