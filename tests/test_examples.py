"""GPU example scripts (``examples/``): verl's naming and layout conventions, and every script composes
and passes every startup check (no GPU, no data).

Cheap by design: each script's Hydra arguments are printed once (``DRY_RUN=print``, a bash process) and
cached for the session; composition and the startup checks run in-process, as ``verl-offpolicy check``
runs them. One fresh-process ``DRY_RUN=1`` run (marked slow) checks the script → ``check`` path itself.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hydra_utils import compose_and_check
from verl_offpolicy.cli import run_startup_callbacks
from verl_offpolicy.glue.compose import compose_main_ppo
from verl_offpolicy.rewards.math_verify_reward import compute_score

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DOCS_ALGO = ROOT / "docs" / "algo"

# ----------------------------------------------------------------------------------- naming rules
# The rules of verl's example-naming checker, tests/special_sanity/check_example_naming.py
# (https://github.com/verl-project/verl/blob/main/tests/special_sanity/check_example_naming.py, its
# pre-commit hook `check-example-naming`), written out here: `run_<model>_<train-backend>.sh`, the
# train backend the last token, no inference-backend / platform / machine / quantization token.
FORBIDDEN_TOKENS = ("vllm", "sglang", "trtllm", "npu", "amd", "gb200", "b200", "blackwell", "fp8")
ALLOWED_BACKENDS = (
    "fsdp",
    "fsdp2",
    "fsdp_turbo",
    "megatron",
    "megatron_lite",
    "mindspeed",
    "automodel",
    "veomni",
    "torchtitan",
)
# The checker's DEFAULT_IGNORE_DIRS that can occur here (relative to examples/).
IGNORED_DIRS = ("data_preprocess", "profile", "tutorial")


def naming_violations(name: str) -> list[str]:
    """What verl's checker reports for a script's file name (empty: it passes)."""
    if not name.startswith("run_"):
        return ["must be named run_<model>_<train-backend>.sh"]
    if not name.endswith(".sh"):
        return ["must end with .sh"]
    stem = name[: -len(".sh")]
    tokens = stem.split("_")[1:]
    errors = []
    forbidden = [t for t in tokens if t in FORBIDDEN_TOKENS]
    if forbidden:
        errors.append(f"forbidden token(s) {forbidden}: make them environment toggles")
    if not tokens or not any(stem.endswith(f"_{backend}") for backend in ALLOWED_BACKENDS):
        errors.append(f"must end with _<train-backend>.sh, train-backend in {list(ALLOWED_BACKENDS)}")
    return errors


CHECKED = sorted(p for p in EXAMPLES.rglob("*.sh") if p.relative_to(EXAMPLES).parts[0] not in IGNORED_DIRS)
SCRIPTS = [p.relative_to(EXAMPLES).as_posix() for p in CHECKED]
FAMILIES = sorted(p.stem for p in DOCS_ALGO.glob("*.md"))
# The families with GPU scripts: examples/<family>_trainer/ (optional for a family, docs/extending.md).
EXAMPLE_FAMILIES = sorted(p.name[: -len("_trainer")] for p in EXAMPLES.glob("*_trainer"))
# Scripts that only pick a family preset and run another script (the setting lives there, once).
WRAPPERS = {s: re.search(r'exec bash "\$\(dirname "\$0"\)/\.\./(\S+?)"', (EXAMPLES / s).read_text()) for s in SCRIPTS}
WRAPPERS = {s: m.group(1) for s, m in WRAPPERS.items() if m}
CANONICAL = [s for s in SCRIPTS if s not in WRAPPERS]
TAKES_PRESET = [s for s in CANONICAL if "PRESET=${PRESET:-" in (EXAMPLES / s).read_text()]


@pytest.mark.parametrize(
    "name,violations",
    [
        # hand-derived from the checker's rules
        ("run_qwen3_8b_fsdp.sh", 0),
        ("run_qwen3_30b_a3b_megatron_lite.sh", 0),
        ("run_qwen2_5_7b_vllm_fsdp.sh", 1),  # inference backend in the name
        ("run_qwen3_8b_fsdp_fp8.sh", 2),  # quantization token, and the backend is not last
        ("run_qwen3_8b_fsdp_multi_rs.sh", 1),  # something after the backend
        ("gsm8k_qwen2.5-1.5b.sh", 1),  # this repository's former recipe names
        ("math_llama3.1-8b_megatron.sh", 1),
    ],
)
def test_naming_rules_match_verls_checker(name, violations):
    assert len(naming_violations(name)) == violations, naming_violations(name)


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_passes_verls_naming_rules(script):
    assert naming_violations(Path(script).name) == []
    family = Path(script).parts[0]
    assert len(Path(script).parts) == 2 and family.endswith("_trainer") and family[: -len("_trainer")] in FAMILIES


def test_every_example_folder_is_a_family_with_a_page():
    assert set(EXAMPLE_FAMILIES) <= set(FAMILIES), sorted(set(EXAMPLE_FAMILIES) - set(FAMILIES))
    assert len(EXAMPLE_FAMILIES) >= 9 and len(CANONICAL) >= 5 and set(WRAPPERS.values()) <= set(CANONICAL)


@pytest.mark.parametrize("script", SCRIPTS + ["data_preprocess/prepare_data.sh"])
def test_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(EXAMPLES / script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_knobs_are_in_the_user_adjustable_block(script):
    """verl's convention: the user's knobs are uppercase environment variables with defaults, in one
    `# ---- user-adjustable ----` block at the top; nothing but them in it."""
    text = (EXAMPLES / script).read_text()
    begin, end = "# ---- user-adjustable ----\n", "# ---- end user-adjustable ----\n"
    assert text.count(begin) == 1 and text.count(end) == 1
    block = text.split(begin)[1].split(end)[0].strip().splitlines()
    assert block, script
    for line in block:
        assert re.fullmatch(r"([A-Z][A-Z0-9_]*)=\$\{\1:-[^}]*\}\S*( +#.*)?", line), line


@pytest.mark.parametrize("family", EXAMPLE_FAMILIES)
def test_family_readme_lists_its_scripts_and_flags(family):
    folder = EXAMPLES / f"{family}_trainer"
    text = (folder / "README.md").read_text()
    assert "## Canonical Scripts" in text and "## Key Flags" in text
    table = text.split("## Canonical Scripts")[1].split("## Key Flags")[0]
    listed = set(re.findall(r"^\| `(run_\w+\.sh)` \|", table, flags=re.M))
    assert listed == {p.name for p in folder.glob("run_*.sh")}
    assert f"docs/algo/{family}.md" in text


# ------------------------------------------------------------------------------------ composition


def _run(script: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run an example as in an activated environment: this python's bin directory first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PATH": path, **env},
    )


@functools.cache
def _argv(script: str, **env: str) -> tuple[str, ...]:
    """The Hydra arguments the script passes to main_ppo (``DRY_RUN=print``), once per session."""
    proc = _run(script, {"DRY_RUN": "print", **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    argv = tuple(proc.stdout.splitlines())
    assert argv[0] == "--config-name"
    return argv


@functools.cache
def _checked(script: str, **env: str):
    """The config main_ppo would run, after every startup check (in-process), once per session."""
    argv = _argv(script, **env)
    return compose_and_check(argv[1], list(argv[2:]))


CHECKED_PRESETS = ("rec_ring_nois", "agro", "pmd_partition")


@pytest.mark.parametrize("script", TAKES_PRESET)
@pytest.mark.parametrize("preset", CHECKED_PRESETS)
def test_every_example_and_preset_pair_passes_the_startup_checks(script, preset):
    cfg = _checked(script, PRESET=preset)
    assert cfg.actor_rollout_ref.actor.strategy == ("megatron" if script.endswith("_megatron.sh") else "fsdp")


@pytest.mark.parametrize("script", CANONICAL)
def test_every_example_passes_the_startup_checks_with_its_default(script):
    cfg = _checked(script)
    assert cfg.actor_rollout_ref.rollout.name == "vllm"


@pytest.mark.parametrize("script", sorted(WRAPPERS))
def test_family_wrapper_runs_the_rec_setting_with_its_default_preset(script):
    """A wrapper passes exactly the arguments of the script it runs, with its family's default preset."""
    default = re.search(r"PRESET=\$\{PRESET:-(\w+)\}", (EXAMPLES / script).read_text()).group(1)
    assert default.split("_")[0] == Path(script).parts[0].removesuffix("_trainer")
    assert _argv(script) == _argv(WRAPPERS[script], PRESET=default)
    assert f"algorithm={default}" in _argv(script)


def test_family_wrapper_rejects_a_preset_of_another_family():
    proc = _run("red_trainer/run_qwen2_5_1_5b_fsdp.sh", {"DRY_RUN": "print", "PRESET": "grpo"})
    assert proc.returncode == 2 and "unknown PRESET 'grpo'; allowed: red_drop red_weight" in proc.stderr


def test_inference_backend_is_an_environment_toggle():
    assert "actor_rollout_ref.rollout.name=sglang" in _argv(
        "rec_trainer/run_qwen2_5_1_5b_fsdp.sh", INFER_BACKEND="sglang"
    )
    proc = _run("rec_trainer/run_qwen2_5_1_5b_fsdp.sh", {"DRY_RUN": "print", "INFER_BACKEND": "trtllm"})
    assert proc.returncode == 2 and "unknown INFER_BACKEND 'trtllm'; allowed: vllm sglang" in proc.stderr


def test_example_rejects_unknown_preset_and_dry_run_with_allowed_values():
    proc = _run("rec_trainer/run_qwen2_5_1_5b_fsdp.sh", {"DRY_RUN": "print", "PRESET": "rec_sideways"})
    assert proc.returncode == 2
    assert "unknown PRESET 'rec_sideways'; allowed:" in proc.stderr and "rec_ring_nois" in proc.stderr
    proc = _run("rec_trainer/run_qwen2_5_1_5b_fsdp.sh", {"DRY_RUN": "yes"})
    assert proc.returncode == 2 and "unknown DRY_RUN 'yes'; allowed: 0 1 print" in proc.stderr


def test_example_extra_override_is_validated():
    argv = _argv("rec_trainer/run_qwen2_5_1_5b_fsdp.sh", PRESET="agro")
    full = compose_main_ppo(argv[1], [*argv[2:], "algorithm.kl_ctrl.kl_coef=0.3"], return_hydra_config=True)
    with pytest.raises(ValueError, match="to equal algorithm.offpolicy.beta"):
        run_startup_callbacks(full)


@pytest.mark.slow  # the one fresh-process run: the script's DRY_RUN=1 → `verl-offpolicy check` (~20 s)
def test_dry_run_checks_the_paper_off_policy_setting_in_a_fresh_process():
    proc = _run(
        "rec_trainer/run_qwen2_5_1_5b_fsdp.sh",
        {"DRY_RUN": "1", "PRESET": "rec_oneside_nois", "SYNC_INTERVAL": "20", "SYNC_OFFSET": "0"},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("ok: offpolicy_trainer | adv_estimator=grpo loss_mode=rec")
    assert "sync_interval=20 sync_offset=0 ratio_anchor=behaviour" in summary


# --------------------------------------------------------------------------- the papers' settings

# The REC paper's Table 1 ("Default hyperparameters"), written out by hand: lr, prompts per step, K,
# weight decay, warm-up steps, evaluation temperature / top-p (None: the paper gives none).
REC_TABLE_1 = {
    "rec_trainer/run_qwen2_5_1_5b_fsdp.sh": dict(lr=1e-6, batch=96, k=8, weight_decay=0.01, warmup=0, eval=(1.0, 1.0)),
    "rec_trainer/run_qwen2_5_7b_fsdp.sh": dict(lr=1e-6, batch=64, k=16, weight_decay=0.1, warmup=80, eval=None),
    "rec_trainer/run_llama3_1_8b_megatron.sh": dict(
        lr=5e-7, batch=64, k=16, weight_decay=0.1, warmup=40, eval=(0.6, 1.0)
    ),
}


@pytest.mark.parametrize("script", sorted(REC_TABLE_1))
def test_example_uses_the_rec_paper_table_1_setting(script):
    """Table 1 per column, and Table 2 for all: AdamW (0.9, 0.999), grad clip 1.0, constant schedule,
    training sampling at temperature 1.0 / top-p 1.0; one optimizer step per batch (Trinity-RFT)."""
    want = REC_TABLE_1[script]
    cfg = _checked(script, PRESET="rec_oneside_nois")
    actor, rollout, optim = (
        cfg.actor_rollout_ref.actor,
        cfg.actor_rollout_ref.rollout,
        cfg.actor_rollout_ref.actor.optim,
    )
    assert optim.lr == want["lr"] and optim.weight_decay == want["weight_decay"]
    assert cfg.data.train_batch_size == want["batch"] and rollout.n == want["k"]
    assert list(optim.betas) == [0.9, 0.999]
    if "megatron" in script:
        assert optim.lr_warmup_steps == want["warmup"] and optim.lr_decay_style == "constant"
        assert optim.weight_decay_incr_style == "constant" and optim.clip_grad == 1.0
    else:
        warmup = optim.lr_warmup_steps if optim.lr_warmup_steps > 0 else 0  # ≤ 0: verl uses the ratio
        assert warmup == want["warmup"] and (optim.lr_warmup_steps > 0 or optim.lr_warmup_steps_ratio == 0.0)
        assert optim.lr_scheduler_type == "constant" and actor.grad_clip == 1.0
    assert (rollout.temperature, rollout.top_p) == (1.0, 1.0)
    assert actor.ppo_mini_batch_size == want["batch"] and actor.ppo_epochs == 1
    if want["eval"] is not None:
        assert (
            rollout.val_kwargs.do_sample and (rollout.val_kwargs.temperature, rollout.val_kwargs.top_p) == want["eval"]
        )


@pytest.mark.parametrize("script", sorted(REC_TABLE_1))
def test_example_keeps_the_pmd_presets_several_updates_per_batch(script):
    """The examples set no mini-batch size: the PMD presets keep OpenKimi's ≥ 16 updates per batch
    (GSM8K 96 prompts → 16 mini-batches of 6; MATH and Guru 64 → 16 of 4), the others one."""
    cfg = _checked(script, PRESET="pmd_partition")
    batch, mini = cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert batch % mini == 0 and batch // mini == 16 and cfg.actor_rollout_ref.actor.ppo_epochs == 1


def test_asymre_example_uses_the_asymre_paper_math_setting():
    """AsymRE's MATH setting as Trinity-RFT's rec_family runs it: K 8, 16 prompts, lr 6e-8, Megatron."""
    cfg = _checked("asymre_trainer/run_llama3_1_8b_megatron.sh")
    assert cfg.algorithm.adv_estimator == "asymre" and cfg.algorithm.offpolicy.shift == -0.1
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (16, 8)
    assert cfg.actor_rollout_ref.actor.optim.lr == 6e-8 and cfg.trainer.total_training_steps == 2000


def test_opmd_example_uses_trinity_rft_opmd_gsm8k_setting():
    """Trinity-RFT examples/opmd_gsm8k: τ 4, KL loss mse 0.001, lr 2e-6, betas (0, 0.95), sync_interval 10."""
    cfg = _checked("opmd_trainer/run_qwen2_5_1_5b_fsdp.sh")
    actor = cfg.actor_rollout_ref.actor
    assert cfg.algorithm.adv_estimator == "opmd" and actor.policy_loss.loss_mode == "opmd"
    assert cfg.algorithm.offpolicy.tau == 4.0 and actor.policy_loss.tau == 4.0
    assert (actor.use_kl_loss, actor.kl_loss_type, actor.kl_loss_coef) == (True, "mse", 0.001)
    assert actor.optim.lr == 2e-6 and list(actor.optim.betas) == [0.0, 0.95]
    assert cfg.algorithm.offpolicy.sync_interval == 10 and not cfg.algorithm.use_kl_in_reward
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (96, 8)


def test_prepare_data_rejects_unknown_dataset():
    proc = subprocess.run(
        ["bash", str(EXAMPLES / "data_preprocess" / "prepare_data.sh"), "imagenet", "/tmp/unused"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "allowed: gsm8k, math, guru_math" in proc.stderr


@pytest.mark.parametrize(
    "response,truth,expected",
    [
        ("so x = \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("the answer is \\boxed{3}", "4", 0.0),
        ("no final answer", "4", 0.0),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ],
)
def test_math_verify_reward(response, truth, expected):
    assert compute_score("math", response, truth) == expected
