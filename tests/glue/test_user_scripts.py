"""A user's own verl command line plus one preset: the preset's algorithm, or a stop that names the key.

verl's own example scripts (captured as argv files in ``tests/verl_scripts/``, ``capture.py`` there) set
``algorithm.adv_estimator=grpo``, a ``ppo_mini_batch_size`` and a KL loss; Hydra applies them after the
preset. The startup callback (what ``main_ppo`` and ``check`` run) must stop when they replace what defines
the preset's algorithm, and name every other preset key they replace. Expected values are read off the
preset files by hand (named in each test).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.hydra_utils import VALID_SIZES
from verl_offpolicy.cli import main, run_startup_callbacks, run_startup_checks
from verl_offpolicy.configs import preset_names, preset_selector
from verl_offpolicy.glue.compose import compose_main_ppo, compose_main_ppo_argv
from verl_offpolicy.glue.preset_overrides import (
    ESTIMATOR_KEY,
    LOSS_MODE_KEY,
    PRESET_KEY,
    defining_keys,
    preset_values,
)

ACTOR = "actor_rollout_ref.actor"


def _startup(config_name: str, overrides: list[str]):
    """The startup callbacks of a command line, as main_ppo runs them: None if they pass, else the message."""
    full = compose_main_ppo(config_name, [*VALID_SIZES, *overrides], return_hydra_config=True)
    try:
        run_startup_callbacks(full)
    except ValueError as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------------------ keys that define a preset


def test_a_scripts_estimator_stops_a_preset_with_its_own(capsys):
    """red_weight.yaml sets adv_estimator=red_weight; with verl's grpo (and red_weight's rec loss, no mask, no
    weight, no regulariser) the run would be the reinforce preset's setting (reinforce.yaml)."""
    message = _startup("ppo_trainer", ["+algorithm=red_weight", "algorithm.adv_estimator=grpo"])
    assert message is not None
    assert "the command line replaces what defines preset red_weight" in message
    assert "algorithm.adv_estimator=grpo (the preset sets red_weight)" in message
    assert "Delete `algorithm.adv_estimator=grpo` from your command line" in message
    assert "(`+algorithm=reinforce`)" in message


def test_on_our_primary_config_the_alternative_is_spelled_without_plus():
    message = _startup("offpolicy_trainer", ["algorithm=red_weight", "algorithm.adv_estimator=grpo"])
    assert message is not None and "(`algorithm=reinforce`)" in message and "+algorithm" not in message


def test_a_variant_knob_stops_and_names_the_presets_of_that_variant():
    """rec_ring_nois with clip_mode=one-side is rec.yaml's grpo + rec + no regulariser with a one-side mask and no
    weight: what rec_oneside_nois.yaml and rec_oneside_nois_wide.yaml set."""
    message = _startup("ppo_trainer", ["+algorithm=rec_ring_nois", f"{ACTOR}.policy_loss.clip_mode=one-side"])
    assert message is not None
    assert f"{ACTOR}.policy_loss.clip_mode=one-side (the preset sets ring)" in message
    assert "`+algorithm=rec_oneside_nois`, `+algorithm=rec_oneside_nois_wide`" in message


def test_an_estimator_no_preset_has_points_to_verls_own_setting():
    message = _startup("ppo_trainer", ["+algorithm=opmd", "algorithm.adv_estimator=rloo"])
    assert message is not None
    assert "algorithm.adv_estimator=rloo (the preset sets opmd)" in message
    assert "drop the preset to train verl's own setting" in message


def test_the_same_value_on_the_command_line_is_no_replacement(capsys):
    """rec.yaml sets adv_estimator=grpo: a script's algorithm.adv_estimator=grpo changes nothing."""
    assert _startup("ppo_trainer", ["+algorithm=rec_ring_nois", "algorithm.adv_estimator=grpo"]) is None
    assert "adv_estimator" not in capsys.readouterr().err


def test_an_error_caused_by_a_replaced_preset_key_says_so():
    """agro.yaml sets use_kl_in_reward=true (R = r − β·log π/π_ref); the script's false breaks agro's own rule."""
    message = _startup("ppo_trainer", ["+algorithm=agro", "algorithm.use_kl_in_reward=False"])
    assert message is not None
    assert "set algorithm.use_kl_in_reward=true" in message
    assert (
        "Your command line set `algorithm.use_kl_in_reward=False` (the preset agro sets "
        "algorithm.use_kl_in_reward=True)" in message
    )


def test_defining_keys_are_the_families_variant_knobs():
    """Discovered from the family modules: every knob with a closed list or a switch, no magnitude."""
    from verl_offpolicy.glue import algorithms
    from verl_offpolicy.glue.knobs import ALGO_PREFIX, LOSS_PREFIX

    expected = {ESTIMATOR_KEY, LOSS_MODE_KEY}
    magnitudes = set()
    for family in algorithms.families():
        for prefix, knobs in ((ALGO_PREFIX, family.offpolicy_knobs), (LOSS_PREFIX, family.loss_knobs)):
            for knob in knobs:
                variant = knob.choices or isinstance(knob.default, bool) if knob.variant is None else knob.variant
                (expected if variant else magnitudes).add(f"{prefix}.{knob.name}")
    assert defining_keys() == expected
    assert f"{ALGO_PREFIX}.tau" in magnitudes and f"{LOSS_PREFIX}.clip_mode" in expected
    # topr.py: topr_reward says the rewards' scale (0/1 or already ±1); TOPR either way, so a script may set it
    assert f"{ALGO_PREFIX}.topr_reward" in magnitudes


def test_the_reward_scale_of_topr_is_a_note_not_a_stop(capsys):
    """topr_reward=raw is the advice of topr's own reward-range rule: it must not be refused as another algorithm."""
    assert _startup("ppo_trainer", ["+algorithm=topr", "algorithm.offpolicy.topr_reward=raw"]) is None
    (note,) = _notes(capsys)
    assert "algorithm.offpolicy.topr_reward signed -> raw" in note


def test_every_preset_defines_its_estimator_and_loss():
    """Every preset's own files (and the shared parts and presets they include) set both names."""
    for name in preset_names():
        values = preset_values(name)
        assert ESTIMATOR_KEY in values and LOSS_MODE_KEY in values, name


# ----------------------------------------------------------- the TaskRunner: no command line, the preset's name


def _taskrunner(config_name: str, overrides: list[str], config_dir: Path | None = None):
    """What the trainer's constructor in verl's TaskRunner runs on the config it gets: no ``hydra`` node (Hydra
    deletes it), no callback ran on it. None if it passes, else the message."""
    from verl_offpolicy.glue.validation import validate_offpolicy_config

    argv = [
        *(["--config-dir", str(config_dir)] if config_dir else []),
        "--config-name",
        config_name,
        *VALID_SIZES,
        *overrides,
    ]
    config = compose_main_ppo_argv(argv)
    assert "hydra" not in config
    try:
        validate_offpolicy_config(config)
    except ValueError as exc:
        return str(exc)
    return None


def test_every_preset_writes_its_own_name():
    """The name the TaskRunner compares against is the file's (discovered from the preset folder)."""
    for name in preset_names():
        assert preset_values(name)[PRESET_KEY] == name, name
        assert OmegaConf.select(compose_main_ppo("ppo_trainer", [f"+algorithm={name}"]), PRESET_KEY) == name


def test_the_taskrunner_stops_a_replaced_estimator_without_the_command_line():
    """red_weight.yaml sets adv_estimator=red_weight; the config reaching the TaskRunner holds verl's grpo (no
    callback ran on it): the same stop as in the driver, naming the preset's key as the other way out."""
    message = _taskrunner("ppo_trainer", ["+algorithm=red_weight", "algorithm.adv_estimator=grpo"])
    assert message is not None
    assert "the config replaces what defines preset red_weight" in message
    assert "algorithm.adv_estimator=grpo (the preset sets red_weight)" in message
    assert "(`+algorithm=reinforce`)" in message
    assert f"set {PRESET_KEY}=null" in message


def test_the_taskrunner_passes_a_preset_as_written_and_a_magnitude_changed():
    """tau is a magnitude (not a defining key); the preset's own values pass."""
    assert _taskrunner("ppo_trainer", ["+algorithm=opmd"]) is None
    assert _taskrunner("ppo_trainer", ["+algorithm=opmd", "algorithm.offpolicy.tau=0.5"]) is None
    assert _taskrunner("offpolicy_trainer", ["algorithm=rec_ring_nois"]) is None


def test_a_variant_knob_changed_in_a_config_file_stops_in_the_taskrunner():
    """rec_ring_nois.yaml sets clip_mode=ring: a loss knob with a closed list, so a defining key."""
    message = _taskrunner(
        "offpolicy_trainer", ["algorithm=rec_ring_nois", f"{LOSS_MODE_KEY.rsplit('.', 1)[0]}.clip_mode=two-side"]
    )
    assert message is not None and "clip_mode=two-side (the preset sets ring)" in message
    assert "`+algorithm=rec_twoside_nois`" in message  # rec_twoside_nois.yaml: the same keys with clip_mode two-side


def test_a_users_preset_built_on_ours_names_itself(tmp_path):
    """A preset of the user's own that includes red_weight and changes its estimator inherits red_weight's name:
    it stops naming the key; with its own name (not one of ours) it trains as written."""
    folder = tmp_path / "algorithm"
    folder.mkdir()
    body = "# @package _global_\ndefaults:\n  - red_weight\n  - _self_\n\nalgorithm:\n  adv_estimator: grpo\n"
    (folder / "my_red.yaml").write_text(body)
    message = _taskrunner("ppo_trainer", ["+algorithm=my_red"], config_dir=tmp_path)
    assert message is not None and "preset red_weight" in message and f"{PRESET_KEY}=null" in message
    (folder / "my_red.yaml").write_text(body + "  offpolicy:\n    preset: my_red\n")
    assert _taskrunner("ppo_trainer", ["+algorithm=my_red"], config_dir=tmp_path) is None


def test_the_preset_name_is_a_name():
    message = _taskrunner("ppo_trainer", ["+algorithm=opmd", f"{PRESET_KEY}=3"])
    assert message is not None and f"{PRESET_KEY} must be a preset's name or null, got 3" in message


# ------------------------------------------------------------------------------------- the notes


def _notes(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("verl-offpolicy: note: ")]


def test_a_scripts_mini_batch_is_named_with_the_updates_it_makes(capsys):
    """common.yaml: ppo_mini_batch_size = data.train_batch_size (one update); 1024 / 256 = 4 updates."""
    assert (
        _startup("ppo_trainer", ["+algorithm=opmd", "data.train_batch_size=1024", f"{ACTOR}.ppo_mini_batch_size=256"])
        is None
    )
    assert _notes(capsys) == [
        f"verl-offpolicy: note: {ACTOR}.ppo_mini_batch_size 1024 -> 256 (your command line replaces preset "
        "opmd's value): "
        "4 optimizer updates per batch instead of 1"
    ]


def test_m2po_with_one_update_per_batch_is_named_plain_ppo(capsys):
    """m2po.yaml: mini-batch = the largest divisor of 64 giving >= 4 updates = 16 (4 updates); 64 gives 1."""
    assert (
        _startup("ppo_trainer", ["+algorithm=m2po", "data.train_batch_size=64", f"{ACTOR}.ppo_mini_batch_size=64"])
        is None
    )
    (note,) = _notes(capsys)
    assert "ppo_mini_batch_size 16 -> 64" in note and "1 optimizer update per batch instead of 4" in note
    assert "is plain PPO: every ratio is 1" in note


def test_a_scripts_kl_loss_and_a_knob_are_named(capsys):
    assert (
        _startup(
            "ppo_trainer",
            [
                "+algorithm=opmd",
                f"{ACTOR}.use_kl_loss=True",
                f"{ACTOR}.kl_loss_coef=0.001",
                "algorithm.offpolicy.tau=0.5",
            ],
        )
        is None
    )
    notes = _notes(capsys)
    assert any(f"{ACTOR}.use_kl_loss False -> True" in n and "kl_loss_coef=0.001" in n for n in notes), notes
    assert any("algorithm.offpolicy.tau 1.0 -> 0.5" in n and "Temperature τ" in n for n in notes), notes


def test_no_note_without_a_preset(capsys):
    """verl's own algorithm (no preset selected): nothing of ours to compare."""
    full = compose_main_ppo("ppo_trainer", [*VALID_SIZES, f"{ACTOR}.ppo_mini_batch_size=8"], return_hydra_config=True)
    run_startup_callbacks(full)
    assert _notes(capsys) == []


# ------------------------------------------------------------------- LoRA on its own pool, verl's async trainers

POOL = [
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
]
SEPARATE_ASYNC = ["trainer.v1.trainer_mode=separate_async", *POOL]
LORA = "actor_rollout_ref.model.lora_rank=8"
MERGED = "actor_rollout_ref.model.lora.merge=true"


def _validate(*overrides: str):
    from verl_offpolicy.glue.validation import validate_offpolicy_config

    validate_offpolicy_config(compose_main_ppo("ppo_trainer", ["+algorithm=opmd", *VALID_SIZES, *overrides]))


@pytest.mark.parametrize(
    "mode",
    [
        [
            "algorithm.offpolicy.ratio_anchor=rollout",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            *POOL,
        ],  # ours, overlapped
        [*SEPARATE_ASYNC, "trainer.v1.separate_async.parameter_sync_step=1"],  # verl's own
    ],
    ids=["overlapped", "separate_async"],
)
def test_lora_on_a_rollout_pool_of_its_own_needs_merged_weights(mode):
    """verl 0.9.1's checkpoint-engine weight path sends the base weights without the adapter (verl#7495)."""
    from verl_offpolicy.glue.validation import OffPolicyConfigError

    with pytest.raises(
        OffPolicyConfigError,
        match=r"lora_rank=8 with actor_rollout_ref.hybrid_engine=false .* needs "
        r"actor_rollout_ref.model.lora.merge=true: .*verl#7495",
    ):
        _validate(*mode, LORA)
    _validate(*mode, LORA, MERGED)
    _validate(*mode)  # no LoRA


def test_separate_asyncs_own_asserts_are_startup_errors():
    """verl's PPOTrainerSeparateAsync asserts train_batch_size == parameter_sync_step x ppo_mini_batch_size (its
    default step is 4; VALID_SIZES: batch 16, mini-batch 16) and a checkpoint engine other than naive."""
    from verl_offpolicy.glue.validation import OffPolicyConfigError

    with pytest.raises(
        OffPolicyConfigError,
        match=r"needs data.train_batch_size == trainer.v1.separate_async.parameter_sync_step "
        r"x actor_rollout_ref.actor.ppo_mini_batch_size, got 16 != 4 x 16: set trainer.v1.separate_async."
        r"parameter_sync_step=1 or actor_rollout_ref.actor.ppo_mini_batch_size=4",
    ):
        _validate(*SEPARATE_ASYNC)
    _validate(
        *SEPARATE_ASYNC,
        "trainer.v1.separate_async.parameter_sync_step=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    )
    naive = [o for o in SEPARATE_ASYNC if "checkpoint_engine" not in o]
    with pytest.raises(OffPolicyConfigError, match=r"separate_async .*checkpoint_engine.backend to verl's nccl"):
        _validate(*naive, "trainer.v1.separate_async.parameter_sync_step=1")
    with pytest.raises(
        OffPolicyConfigError,
        match=r"data.train_batch_size=16 must be divisible by trainer.v1.colocate_async.parameter_sync_step=3",
    ):
        _validate("trainer.v1.trainer_mode=colocate_async", "+trainer.v1.colocate_async.parameter_sync_step=3")


def test_the_cpu_overlay_merges_lora_itself():
    """On the CPU path one key turns LoRA on: the overlay sets lora.merge=true (its rollouts load no adapter)."""
    cfg = compose_main_ppo("offpolicy_trainer", ["algorithm=opmd", "+cpu=demo", LORA])
    assert cfg.actor_rollout_ref.model.lora.merge is True
    assert compose_main_ppo("ppo_trainer", [LORA]).actor_rollout_ref.model.lora.merge is False  # verl's own default


# ------------------------------------------------------------------------------------------ check's options


def test_check_help_lists_main_ppos_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["check", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--config-path", "-cp", "--config-dir", "-cd", "--config-name", "-cn", "--no-worker-probe"):
        assert flag in out


@pytest.mark.parametrize(
    "overrides,trainer",
    [
        ([], "offpolicy(colocated)"),
        (
            ["algorithm.offpolicy.ratio_anchor=rollout", "actor_rollout_ref.rollout.calculate_log_probs=true", *POOL],
            "offpolicy_overlapped",
        ),
        (["trainer.use_v1=false"], "RayPPOTrainer(legacy,trainer.use_v1=false)"),
        (["trainer.v1.trainer_mode=colocate_async"], "colocate_async"),
    ],
)
def test_checks_ok_line_names_the_trainer_that_will_run(capsys, overrides, trainer):
    assert main(["check", "--no-worker-probe", "+algorithm=opmd", *VALID_SIZES, *overrides]) == 0, (
        capsys.readouterr().err
    )
    assert f" trainer={trainer} " in capsys.readouterr().out


def test_config_path_and_name_mean_what_they_mean_for_main_ppo():
    """main_ppo's @hydra.main(config_path="config"): a relative path is relative to verl/trainer/ (the scripts'
    --config-path=config and ./config), an absolute one is used as is."""
    from verl_offpolicy.glue.compose import main_ppo_file

    config_dir = Path(main_ppo_file()).parent / "config"
    for argv in (["--config-path=config"], ["-cp", "./config"], ["--config-path", str(config_dir)]):
        cfg = compose_main_ppo_argv([*argv, "-cn", "ppo_megatron_trainer", "+algorithm=opmd"])
        assert cfg.actor_rollout_ref.actor.strategy == "megatron" and cfg.algorithm.adv_estimator == "opmd"


def test_config_dir_adds_a_users_folder(tmp_path):
    (tmp_path / "algorithm").mkdir()
    (tmp_path / "algorithm" / "my_opmd.yaml").write_text(
        "# @package _global_\ndefaults:\n  - /offpolicy_shared/common\n  - _self_\n"
        "algorithm:\n  adv_estimator: opmd\nactor_rollout_ref:\n  actor:\n    policy_loss:\n      loss_mode: opmd\n"
    )
    cfg = compose_main_ppo_argv(["-cd", str(tmp_path), "--config-name", "offpolicy_trainer", "algorithm=my_opmd"])
    assert cfg.algorithm.adv_estimator == "opmd"
    with pytest.raises(Exception, match="not found"):
        compose_main_ppo_argv(["-cd", str(tmp_path / "missing")])


def test_offpolicy_keys_without_a_preset_say_where_they_come_from(capsys):
    assert main(["check", "--no-worker-probe", "algorithm.offpolicy.tau=0.5"]) == 1
    err = capsys.readouterr().err
    assert "algorithm.offpolicy.tau: the keys under algorithm.offpolicy come with a verl-offpolicy preset" in err
    assert "+algorithm=<name>" in err and "To append to your config" not in err


# ----------------------------------------------------------------------------- the corpus of verl's scripts

CORPUS = Path(__file__).resolve().parents[1] / "verl_scripts"


def corpus() -> list[Path]:
    return sorted(CORPUS.rglob("*.argv"))


def _argv(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line]


def _signature(argv: list[str]) -> tuple[str, ...]:
    """The part of a line that can change a preset: its options and every key some preset sets."""
    keys = {k for name in preset_names() for k in preset_values(name)} | {"data.train_batch_size"}
    return tuple(
        a for a in argv if a.startswith("-") and not a.startswith(("+", "~")) or a.split("=")[0].lstrip("+~") in keys
    )


def _outcome(argv: list[str], preset: str):
    """(config, None) when every startup check passes, (None, message) when one stops."""
    from hydra._internal.utils import get_args_parser

    config_name = get_args_parser().parse_args(argv).config_name or "ppo_trainer"
    full = compose_main_ppo_argv([*argv, preset_selector(preset, config_name)], return_hydra_config=True)
    try:
        return run_startup_checks(full)[0], None
    except Exception as exc:  # noqa: BLE001 - the message is the outcome
        return None, str(exc)


def assert_preset_or_stop(argv: list[str], preset: str) -> str:
    """The preset's algorithm (every defining key it sets, in the composed config), or a stop that names the
    override that replaced one."""
    config, message = _outcome(argv, preset)
    own = {k: v for k, v in preset_values(preset).items() if k in defining_keys()}
    written = {a.split("=", 1)[0].lstrip("+"): a for a in argv if "=" in a}
    if config is not None:
        assert {k: OmegaConf.select(config, k) for k in own} == own, (preset, argv)
        return "ok"
    replaced = [written[k] for k, v in own.items() if k in written and str(v) != written[k].split("=", 1)[1]]
    for override in replaced:
        assert f"`{override}`" in message, (preset, override, message)
    return "stop"


def _drifted(argv: list[str]) -> str | None:
    from tests.verl_scripts.capture import drift

    return drift(argv)


def recorded_drift(path: Path) -> bool:
    """Whether ``path`` is listed in its release's DRIFT.md (a line the installed verl cannot compose)."""
    label = path.relative_to(CORPUS).parts[0]
    return f"`{path.relative_to(CORPUS / label)}`" in (CORPUS / label / "DRIFT.md").read_text()


def test_the_corpus_holds_both_releases_scripts():
    labels = {p.relative_to(CORPUS).parts[0] for p in corpus()}
    assert len(labels) == 2 and len(corpus()) > 200
    assert sum("algorithm.adv_estimator=grpo" in _argv(p) for p in corpus()) > 100


@pytest.mark.slow
def test_every_kind_of_verl_script_gets_the_preset_or_a_stop():
    """One line per distinct preset-relevant signature, each with a preset in turn: the composed config has the
    preset's algorithm, or the run stops naming the script's key. A line recorded as drift in DRIFT.md (keys
    verl 0.9.1 removed) must still fail to compose; `-m extended` runs every line with every preset."""
    representatives: dict[tuple, Path] = {}
    for path in corpus():
        representatives.setdefault(_signature(_argv(path)), path)
    outcomes, presets = [], preset_names()
    for index, path in enumerate(representatives.values()):
        if recorded_drift(path):
            assert _drifted(_argv(path)), (
                f"{path} is listed in DRIFT.md but composes: regenerate it (capture.py --drift)"
            )
            continue
        outcomes.append(assert_preset_or_stop(_argv(path), presets[index % len(presets)]))
    assert outcomes.count("ok") >= 5 and outcomes.count("stop") >= 5, outcomes


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("preset", preset_names())
def test_every_captured_line_with_every_preset(preset):
    for path in corpus():
        if not recorded_drift(path):
            assert_preset_or_stop(_argv(path), preset)


@pytest.mark.slow
@pytest.mark.extended
def test_drift_is_recorded_not_hidden():
    """Every captured line that verl 0.9.1 cannot compose is listed in its release's DRIFT.md, and nothing else."""
    for path in corpus():
        assert recorded_drift(path) == bool(_drifted(_argv(path))), path


# ---------------------------------------------------------------------------------- machine and install


def test_an_error_while_importing_a_package_is_a_machine_problem(tmp_path, monkeypatch):
    from verl_offpolicy.glue.broken_install import module_this_machine_cannot_import

    (tmp_path / "needs_a_gpu_lib.py").write_text("raise ValueError('libfoo version None not supported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def validate():
        import needs_a_gpu_lib  # noqa: F401

    with pytest.raises(ValueError) as raised:
        validate()
    assert module_this_machine_cannot_import(raised.value) == "needs_a_gpu_lib"
    try:
        raise ValueError("a bad value")  # raised by a function, not by a module's body: a config error
    except ValueError as exc:
        assert module_this_machine_cannot_import(exc) is None
    assert module_this_machine_cannot_import(ModuleNotFoundError("x", name="vllm")) == "vllm"


NO_VLLM = """
import importlib.metadata as md, sys
version = md.version
def without_vllm(name):
    if name in ("vllm", "sglang"):
        raise md.PackageNotFoundError(name)
    return version(name)
md.version = without_vllm
class Hide:  # a login node: neither vLLM nor SGLang can be imported
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "sglang"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Hide())
from verl_offpolicy.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # a fresh process that imports verl
def test_check_on_a_machine_without_vllm_names_what_is_missing(tmp_path):
    """verl's validate_config imports its vLLM rollout for a LoRA rank on vLLM; without vLLM that import raises
    "vllm version None not supported": a fact of this machine, not of the config."""
    import subprocess
    import sys

    script = tmp_path / "no_vllm.py"
    script.write_text(NO_VLLM)
    argv = ["check", "--no-worker-probe", "+algorithm=opmd", LORA, "actor_rollout_ref.rollout.name=vllm", *VALID_SIZES]
    proc = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "invalid configuration" not in proc.stderr
    assert "warning: this machine cannot import verl.third_party.vllm (ValueError: vllm version None" in proc.stderr
    assert proc.stdout.startswith("ok: ppo_trainer | adv_estimator=opmd")


def test_a_verl_built_from_source_gets_the_version_warning(tmp_path, monkeypatch):
    """A source build reads 0.10.0.dev0 or 0.9.0.dev0: our requirement (verl>=0.9,<0.10) excludes both, so
    `pip install .` would replace it (docs/cluster.md: `pip install --no-deps .`), and the version warning applies."""
    import tomllib
    from packaging.requirements import Requirement

    from verl_offpolicy import verl_pin

    requirement = next(
        r for r in tomllib.loads(Path("pyproject.toml").read_text())["project"]["dependencies"] if r.startswith("verl")
    )
    for source_build in ("0.10.0.dev0", "0.9.0.dev0"):
        assert not Requirement(requirement).specifier.contains(source_build, prereleases=True)
        dist_info = tmp_path / source_build / f"verl-{source_build}.dist-info"
        dist_info.mkdir(parents=True)
        (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: verl\nVersion: {source_build}\n")
        monkeypatch.syspath_prepend(str(dist_info.parent))
        assert verl_pin.installed_verl() == source_build
        assert (
            f"verl {source_build} is installed, but verl-offpolicy is tested on verl 0.9.1" in verl_pin.untested_verl()
        )


def test_list_into_head_ends_without_a_traceback():
    """A fresh process, but one that imports no verl (`list` reads the preset files): fast."""
    import subprocess
    import sys

    code = "import sys; from verl_offpolicy.cli import main; sys.exit(main(['list']))"
    proc = subprocess.run(
        ["bash", "-c", f"'{sys.executable}' -c \"{code}\" | head -1; exit ${{PIPESTATUS[0]}}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == preset_names()[0]
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
