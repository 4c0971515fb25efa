"""The ``main_ppo`` command line of a demo run: engine, overlay, the model's inputs, the preset and overrides."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from verl_offpolicy.configs import PRIMARY_CONFIGS, STOCK_CONFIGS, preset_selector
from verl_offpolicy.cpu.guards import CPU_ROLLOUT_GROUP, overlay_names
from verl_offpolicy.demo.cluster import joins_cluster
from verl_offpolicy.demo.models import DEFAULT_MODEL, ROLLOUTS, get_model
from verl_offpolicy.demo.process import ray_dir_in
from verl_offpolicy.glue.registration import HF_ROLLOUT

DEFAULT_CONFIG_NAME = "ppo_trainer"
# Training engine -> (our primary config, its CPU overlay, the key of the engine's seed). The primary
# config decides: verl's/our Megatron config runs with +cpu=megatron (``verl-offpolicy demo --engine``).
CPU_ENGINES = {
    "fsdp": (PRIMARY_CONFIGS[0], "+cpu=demo", "actor_rollout_ref.actor.fsdp_config.seed"),
    "megatron": (PRIMARY_CONFIGS[1], "+cpu=megatron", "actor_rollout_ref.actor.megatron.seed"),
}
CPU_OVERLAY = CPU_ENGINES["fsdp"][1]


def rollout_overrides(rollout: str, overrides: Sequence[str]) -> list[str]:
    """``overrides`` with the ``+cpu_rollout=`` overlay of ``rollout`` merged in: ``vllm`` adds ``vllm`` to the
    overlays the overrides select (``+cpu_rollout=standalone`` becomes ``+cpu_rollout=[vllm,standalone]``: verl's
    vLLM server on a pool of its own, the overlapped mode); ``hf`` changes nothing."""
    if rollout not in ROLLOUTS:
        raise ValueError(f"unknown rollout {rollout!r}; allowed: {', '.join(ROLLOUTS)}")
    if rollout == HF_ROLLOUT:
        return list(overrides)
    selected, rest = [], []
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") == CPU_ROLLOUT_GROUP:
            selected += overlay_names(value)
        else:
            rest.append(override)
    overlays = [rollout] + [o for o in selected if o != rollout]
    return rest + [f"+{CPU_ROLLOUT_GROUP}={overlays[0] if len(overlays) == 1 else '[' + ','.join(overlays) + ']'}"]


def cpu_engine(config_name: str) -> str:
    """``megatron`` for verl's and our Megatron primary configs, else ``fsdp``."""
    return "megatron" if config_name in (STOCK_CONFIGS[1], PRIMARY_CONFIGS[1]) else "fsdp"


def preset_overrides(preset: str, config_name: str = DEFAULT_CONFIG_NAME, model: str = DEFAULT_MODEL) -> list[str]:
    """Hydra overrides selecting an algorithm, plus the model's task settings for it
    (:attr:`verl_offpolicy.demo.models.DemoModel.task_overrides`, e.g. AGRO's β on the repeat task).

    On verl's stock configs (``ppo_trainer``), ``grpo`` is verl's built-in GRPO with the vanilla
    PPO-clip loss (plain verl keys, no preset file); any other name, and every name on our primary
    configs (``offpolicy_trainer``), selects the preset file ``verl_offpolicy/configs/algorithm/<preset>.yaml``
    (``+algorithm=`` or ``algorithm=``: :func:`verl_offpolicy.configs.preset_selector`).
    """
    task = list(get_model(model).task_overrides.get(preset, ()))
    if preset == "grpo" and config_name in STOCK_CONFIGS:
        return [
            "algorithm.adv_estimator=grpo",
            "algorithm.norm_adv_by_std_in_grpo=true",
            "algorithm.use_kl_in_reward=false",
            "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
            "actor_rollout_ref.actor.loss_agg_mode=token-mean",
            *task,
        ]
    return [preset_selector(preset, config_name), *task]


@dataclass
class DemoInputs:
    """The paths a run trains on: model, tokenizer and the task's parquet files."""

    model_path: str
    tokenizer_path: str
    train_files: str
    val_files: str


def build_inputs(output_dir: str | os.PathLike, seed: int = 0, model: str = DEFAULT_MODEL) -> DemoInputs:
    """Build (or reuse) the model, tokenizer and task data of ``model`` (:mod:`.models`) under ``output_dir``."""
    return DemoInputs(**get_model(model).build(Path(output_dir), seed))


def demo_command(
    inputs: DemoInputs,
    *,
    output_dir: str | os.PathLike,
    preset: str = "grpo",
    steps: int = 20,
    seed: int = 0,
    overrides: Sequence[str] = (),
    config_name: str = DEFAULT_CONFIG_NAME,
    ray_temp_dir: Optional[str] = None,
    python: str = sys.executable,
    model: str = DEFAULT_MODEL,
) -> list[str]:
    """The ``main_ppo`` command line of a demo run (overlay, inputs, preset, the model's settings, then
    ``overrides``)."""
    output_dir = Path(output_dir).resolve()
    _, overlay, seed_key = CPU_ENGINES[cpu_engine(config_name)]
    command = [
        python,
        "-m",
        "verl.trainer.main_ppo",
        "--config-name",
        config_name,
        overlay,
        f"actor_rollout_ref.model.path={inputs.model_path}",
        f"actor_rollout_ref.model.tokenizer_path={inputs.tokenizer_path}",
        f"data.train_files={inputs.train_files}",
        f"data.val_files={inputs.val_files}",
        f"data.seed={seed}",
        f"actor_rollout_ref.rollout.seed={seed}",
        f"actor_rollout_ref.actor.data_loader_seed={seed}",
        f"{seed_key}={seed}",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={output_dir / 'checkpoints'}",
        f"hydra.run.dir={output_dir / 'hydra'}",
    ]
    # joining an existing cluster: Ray would look for a node of that cluster in this temp dir, and fail
    if ray_temp_dir and not joins_cluster(list(overrides)):
        command.append(
            f"+ray_kwargs.ray_init._temp_dir={ray_dir_in(ray_temp_dir)}"
        )  # Ray's 0777 dir inside our 0700 one
    return command + run_overrides(preset, config_name, model, overrides)


def run_overrides(preset: str, config_name: str, model: str, overrides: Sequence[str] = ()) -> list[str]:
    """The last overrides of a demo run, in the order Hydra applies them (the last one wins): the preset
    (:func:`preset_overrides`), then the model's settings, then the caller's ``overrides``."""
    return [*preset_overrides(preset, config_name, model), *get_model(model).overrides, *overrides]
