"""GPU recipe scripts: syntax, and their Hydra overrides compose and validate (DRY_RUN=1: no GPU, no data)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_offpolicy.glue.compose import compose_main_ppo
from verl.utils.config import omega_conf_to_dataclass
from verl_offpolicy.glue.validation import validate_offpolicy_config
from verl_offpolicy.rewards.math_verify_reward import compute_score

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
SCRIPTS = sorted(RECIPES.glob("*.sh"))
# Training scripts that take a preset as their first argument (the others fix their algorithm).
TRAINING = [p.name for p in SCRIPTS if "PRESET=${1:?" in p.read_text()]
FIXED = [p.name for p in SCRIPTS if p.name not in TRAINING and "run_main_ppo" in p.read_text() and p.name != "_common.sh"]

# The REC paper's Table 1 ("Default hyperparameters"), written out by hand: lr, prompts per step, K,
# weight decay, warm-up steps, evaluation temperature / top-p (None: the paper gives none).
REC_TABLE_1 = {
    "gsm8k_qwen2.5-1.5b.sh": dict(lr=1e-6, batch=96, k=8, weight_decay=0.01, warmup=0, eval=(1.0, 1.0)),
    "guru_math_qwen2.5-7b.sh": dict(lr=1e-6, batch=64, k=16, weight_decay=0.1, warmup=80, eval=None),
    "math_llama3.1-8b_megatron.sh": dict(lr=5e-7, batch=64, k=16, weight_decay=0.1, warmup=40, eval=(0.6, 1.0)),
}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


def _dry_run(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """Run a recipe as in an activated environment: this python's bin directory first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", str(RECIPES / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": path, "DRY_RUN": "1", **env},
    )


# Each script's full `verl-offpolicy check` (a fresh process, ~20 s) with one preset, the presets taking
# turns so each is checked on some script; every script × preset pair is composed in-process below.
CHECKED_PRESETS = ("rec_ring_nois", "agro", "pmd_partition")
FULL_CHECKS = [(script, CHECKED_PRESETS[i % len(CHECKED_PRESETS)]) for i, script in enumerate(TRAINING)]


@pytest.mark.slow  # each runs the recipe's `verl-offpolicy check` in a fresh process
@pytest.mark.parametrize("script,preset", FULL_CHECKS)
def test_recipe_composes_and_validates(script, preset):
    proc = _dry_run(script, preset)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith("ok: ")
    assert ("strategy=megatron" in summary) == ("megatron" in script)


def _composed(script: str, *args: str, **env: str):
    """The config main_ppo would run: the script's arguments (DRY_RUN=print) composed through its Hydra app."""
    proc = _dry_run(script, *args, DRY_RUN="print", **env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    argv = proc.stdout.splitlines()
    assert argv[0] == "--config-name"
    return compose_main_ppo(argv[1], argv[2:])


@pytest.mark.parametrize("script", TRAINING)
@pytest.mark.parametrize("preset", CHECKED_PRESETS)
def test_every_recipe_and_preset_pair_passes_validation(script, preset):
    """Every script with every checked preset, composed as main_ppo would and validated by our startup
    checks and verl's own config conversion (in-process; the fresh-process check runs above)."""
    cfg = _composed(script, preset)
    validate_offpolicy_config(cfg)
    omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def test_every_training_script_is_tested():
    assert set(TRAINING) >= set(REC_TABLE_1) and FIXED == ["gsm8k_qwen2.5-1.5b_opmd_trinity.sh"]


@pytest.mark.parametrize("script", sorted(REC_TABLE_1))
def test_recipe_uses_the_rec_paper_table_1_setting(script):
    """Table 1 per column, and Table 2 for all: AdamW (0.9, 0.999), grad clip 1.0, constant schedule,
    training sampling at temperature 1.0 / top-p 1.0; one optimizer step per batch (Trinity-RFT)."""
    want = REC_TABLE_1[script]
    cfg = _composed(script, "rec_oneside_nois")
    actor, rollout, optim = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor.optim
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
        assert rollout.val_kwargs.do_sample and (rollout.val_kwargs.temperature, rollout.val_kwargs.top_p) == want["eval"]


@pytest.mark.parametrize("script", sorted(REC_TABLE_1))
@pytest.mark.parametrize("preset", ["pmd_mean", "pmd_partition"])
def test_recipe_keeps_the_pmd_presets_several_updates_per_batch(script, preset):
    """The recipes set no mini-batch size: the PMD presets keep OpenKimi's ≥ 16 updates per batch
    (GSM8K 96 prompts → 16 mini-batches of 6; MATH and Guru 64 → 16 of 4), the others one."""
    cfg = _composed(script, preset)
    batch, mini = cfg.data.train_batch_size, cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    assert batch % mini == 0 and batch // mini == 16 and cfg.actor_rollout_ref.actor.ppo_epochs == 1


def test_opmd_trinity_recipe_uses_trinity_rft_opmd_gsm8k_setting():
    """Trinity-RFT examples/opmd_gsm8k: τ 4, KL loss mse 0.001, lr 2e-6, betas (0, 0.95), sync_interval 10."""
    cfg = _composed("gsm8k_qwen2.5-1.5b_opmd_trinity.sh")
    actor = cfg.actor_rollout_ref.actor
    assert cfg.algorithm.adv_estimator == "opmd" and actor.policy_loss.loss_mode == "opmd"
    assert cfg.algorithm.offpolicy.tau == 4.0 and actor.policy_loss.tau == 4.0
    assert (actor.use_kl_loss, actor.kl_loss_type, actor.kl_loss_coef) == (True, "mse", 0.001)
    assert actor.optim.lr == 2e-6 and list(actor.optim.betas) == [0.0, 0.95]
    assert cfg.algorithm.offpolicy.sync_interval == 10 and not cfg.algorithm.use_kl_in_reward
    assert (cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n) == (96, 8)


@pytest.mark.slow
def test_paper_off_policy_setting_reaches_the_scheduler():
    proc = _dry_run("gsm8k_qwen2.5-1.5b.sh", "rec_oneside_nois", SYNC_INTERVAL="20", SYNC_OFFSET="0")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "sync_interval=20 sync_offset=0 ratio_anchor=behaviour" in proc.stdout


def test_recipe_rejects_unknown_preset_with_allowed_values():
    proc = _dry_run("gsm8k_qwen2.5-1.5b.sh", "rec_sideways")
    assert proc.returncode == 2
    assert "unknown preset 'rec_sideways'; allowed:" in proc.stderr and "rec_ring_nois" in proc.stderr


@pytest.mark.slow  # the recipe's `verl-offpolicy check`: a fresh process imports verl
def test_recipe_extra_override_is_validated():
    proc = _dry_run("gsm8k_qwen2.5-1.5b.sh", "agro", "algorithm.kl_ctrl.kl_coef=0.3")
    assert proc.returncode == 1
    assert "to equal algorithm.offpolicy.beta" in proc.stderr


def test_prepare_data_rejects_unknown_dataset():
    proc = subprocess.run(
        ["bash", str(RECIPES / "prepare_data.sh"), "imagenet", "/tmp/unused"], capture_output=True, text=True, timeout=30
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
