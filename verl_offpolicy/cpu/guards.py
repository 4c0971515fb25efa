"""Startup checks of the CPU path: a bad setting fails before Ray starts, with what to set.

Without them, several CPU mistakes fail late or not at all: TransferQueue's placement group waits
forever for CPUs Ray does not have, a worker without ``VERL_PLATFORM=cpu`` builds a CUDA engine,
FSDP1/flash-attention/torch.compile fail deep inside a worker, and a model path that is not on disk
makes transformers try to download.

:class:`CPUStartupGuard` is a Hydra callback (installed by the ``+cpu=<overlay>`` configs). Hydra
turns an ``Exception`` raised by a callback into a warning, so a failure is raised as
``SystemExit`` with the message (exit status 1, nothing started). It also switches the driver
process itself to the CPU platform (verl reads ``trainer.device`` against it before Ray starts).
The rollout backend re-checks the platform in every process it runs in
(:func:`verl_offpolicy.cpu.platform.require_cpu_platform`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from verl_offpolicy.cpu.engine_guards import (
    MEGATRON_STRATEGY,
    VLLM_OVERLAY,
    check_megatron_cpu_config,
    check_vllm_cpu_config,
    select,
)
from verl_offpolicy.cpu.platform import CPU_ENV, ENV_ENGINE_DEVICE, ENV_PLATFORM, LOOPBACK_ENV, PLATFORM_NAME
from verl_offpolicy.glue.registration import CPU_CHECKPOINT_BACKEND, CPU_CHECKPOINT_MODULE, HF_ROLLOUT, VLLM_ROLLOUT

logger = logging.getLogger("verl_offpolicy")

# Each training process's placement-group bundle reserves this many CPUs (verl's ResourcePoolManager).
CPUS_PER_TRAINING_BUNDLE = 3
# Each standalone rollout rank's bundle reserves this many (RolloutReplica.init_standalone: max_colocate_count=2).
CPUS_PER_ROLLOUT_BUNDLE = 2
SUPPORTED_ATTENTION = ("sdpa", "eager")
ENV_PREFIX = "ray_kwargs.ray_init.runtime_env.env_vars"


class CPUConfigError(ValueError):
    """The configuration cannot run on verl's CPU path; the message lists what to set."""


def cpu_path_selected(cfg: DictConfig) -> bool:
    """True if the config (or the environment) asks for verl's CPU path."""
    return (
        select(cfg, "actor_rollout_ref.rollout.name") == HF_ROLLOUT
        or select(cfg, "trainer.device") == PLATFORM_NAME
        or str(select(cfg, f"{ENV_PREFIX}.{ENV_PLATFORM}", "")).lower() == PLATFORM_NAME
        or os.environ.get(ENV_PLATFORM, "").strip().lower() == PLATFORM_NAME
    )


def required_ray_cpus(cfg: DictConfig) -> int:
    """Logical Ray CPUs that verl reserves up front (TransferQueue + training placement groups).

    TransferQueue's controller takes one CPU and each storage unit one placement-group bundle of one
    CPU; each training process's bundle reserves ``max_colocate_count`` (3) CPUs. If Ray has fewer,
    ``ray.get(placement_group.ready())`` waits forever.
    """
    units = int(select(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 8) or 0)
    gpus = int(select(cfg, "trainer.n_gpus_per_node", 1) or 0) * int(select(cfg, "trainer.nnodes", 1) or 0)
    return 1 + units + CPUS_PER_TRAINING_BUNDLE * gpus + CPUS_PER_ROLLOUT_BUNDLE * standalone_rollout_gpus(cfg)


def standalone_rollout_gpus(cfg: DictConfig) -> int:
    """Fake Ray GPUs of the rollout's own pool (``hybrid_engine=false``): rollout.nnodes x n_gpus_per_node."""
    if select(cfg, "actor_rollout_ref.hybrid_engine", True):
        return 0
    rollout = "actor_rollout_ref.rollout"
    return int(select(cfg, f"{rollout}.nnodes", 0) or 0) * int(select(cfg, f"{rollout}.n_gpus_per_node", 0) or 0)


def check_standalone_rollout(cfg: DictConfig, need) -> None:
    """A rollout on its own pool (``hybrid_engine=false``): a size for the pool and the CPU weight transport."""
    rollout = "actor_rollout_ref.rollout"
    replicas = select(cfg, f"{rollout}.n_gpus_per_node", 0)
    need(
        f"{rollout}.n_gpus_per_node",
        isinstance(replicas, int) and replicas >= 1,
        replicas,
        "with actor_rollout_ref.hybrid_engine=false the rollout runs on a pool of its own, one process (replica) per "
        f"fake Ray GPU: set {rollout}.n_gpus_per_node=1, or 2 for two replicas",
    )
    nodes = select(cfg, f"{rollout}.nnodes", 0)
    if select(cfg, "ray_kwargs.ray_init.address") is None:
        need(
            f"{rollout}.nnodes",
            nodes == 1,
            nodes,
            f"a Ray cluster the run starts itself has one node; set {rollout}.nnodes=1 (or join a cluster of several "
            "nodes: ray_kwargs.ray_init.address, `verl-offpolicy cluster start`)",
        )
    else:
        need(f"{rollout}.nnodes", isinstance(nodes, int) and nodes >= 1, nodes, f"set {rollout}.nnodes=1 or more")
    ce = f"{rollout}.checkpoint_engine"
    backend = select(cfg, f"{ce}.backend")
    need(
        f"{ce}.backend",
        backend == CPU_CHECKPOINT_BACKEND,
        backend,
        f"weights reach a rollout on its own pool through a checkpoint engine; verl's (nccl, nixl, ...) need CUDA: "
        f"set {ce}.backend={CPU_CHECKPOINT_BACKEND} and {ce}.custom_backend_module={CPU_CHECKPOINT_MODULE}",
    )
    module = select(cfg, f"{ce}.custom_backend_module")
    if backend == CPU_CHECKPOINT_BACKEND:
        need(
            f"{ce}.custom_backend_module",
            module == CPU_CHECKPOINT_MODULE,
            module,
            f"verl registers backend {CPU_CHECKPOINT_BACKEND} by importing it in every worker; "
            f"set {ce}.custom_backend_module={CPU_CHECKPOINT_MODULE}",
        )


def check_micro_batch_sizes(cfg: DictConfig, need) -> None:
    """Fixed micro-batch sizes must divide the batches they split (verl asserts it in the worker, at the first
    step, as "data size must be divisible by force_group_size * micro_batch_size_per_gpu").

    With ``use_dynamic_bsz=false`` verl's engine splits each call's samples into micro-batches of exactly
    ``*micro_batch_size_per_gpu``: the log-prob calls get a step's samples (``data.train_batch_size x
    rollout.n`` per training process), the update gets a mini-batch's (``ppo_mini_batch_size x rollout.n``).
    The reference model is checked only where verl uses it (KL loss or KL in reward).
    """
    n = int(select(cfg, "actor_rollout_ref.rollout.n", 1) or 1)
    dp = max(1, int(select(cfg, "trainer.n_gpus_per_node", 1) or 1) * int(select(cfg, "trainer.nnodes", 1) or 1))
    step_samples = int(select(cfg, "data.train_batch_size", 0) or 0) * n // dp
    mini_samples = int(select(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size", 0) or 0) * n // dp
    uses_ref = bool(
        select(cfg, "algorithm.use_kl_in_reward", False) or select(cfg, "actor_rollout_ref.actor.use_kl_loss", False)
    )
    checks = [
        (
            "actor_rollout_ref.actor",
            "ppo_micro_batch_size_per_gpu",
            mini_samples,
            "actor_rollout_ref.actor.ppo_mini_batch_size x rollout.n",
        ),
        (
            "actor_rollout_ref.rollout",
            "log_prob_micro_batch_size_per_gpu",
            step_samples,
            "data.train_batch_size x rollout.n",
        ),
    ]
    if uses_ref:
        checks.append(
            (
                "actor_rollout_ref.ref",
                "log_prob_micro_batch_size_per_gpu",
                step_samples,
                "data.train_batch_size x rollout.n",
            )
        )
    mini = int(select(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size", 0) or 0) * n
    if dp > 1 and mini > 0:  # verl asserts it in the worker (train_mini_batch), at the first update
        need(
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            mini % dp == 0,
            select(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size"),
            f"each update's {mini} samples (ppo_mini_batch_size x rollout.n) must split evenly over the {dp} "
            "training processes (trainer.n_gpus_per_node); choose sizes whose product divides by it",
        )
    for prefix, name, samples, what in checks:
        micro = select(cfg, f"{prefix}.{name}")
        dynamic = select(cfg, f"{prefix}.{'log_prob_' if name.startswith('log_prob') else ''}use_dynamic_bsz", False)
        if micro is None or int(micro) <= 0 or samples <= 0 or dynamic:  # a size ≤ 0 is verl's own config error
            continue
        largest = max(m for m in range(1, min(int(micro), samples) + 1) if samples % m == 0)  # the divisor to suggest
        need(
            f"{prefix}.{name}",
            samples % int(micro) == 0,
            micro,
            f"must divide the {samples} samples it splits ({what}{' per training process' if dp > 1 else ''}); "
            f"set {prefix}.{name}={largest} (any divisor of {samples})",
        )


# Each rule of the CPU path is ``rule(cfg, need)``: it calls ``need(key, ok, got, fix)`` for each key it checks
# (a problem is recorded where ``ok`` is false). CPU_RULES runs them in order.


class Findings:
    """The ``need`` the rules call: records ``"{key}={got!r}: {fix}"`` where ``ok`` is false."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def __call__(self, key: str, ok: bool, got: Any, fix: str) -> None:
        if not ok:
            self.problems.append(f"{key}={got!r}: {fix}")

    def extend(self, problems: list[str]) -> None:
        """Problems a part found in full (verl's vLLM and Megatron checks list theirs)."""
        self.problems.extend(problems)


ROLLOUT = "actor_rollout_ref.rollout"
RAY_INIT = "ray_kwargs.ray_init"


def _uses_critic(cfg: DictConfig) -> bool:
    return select(cfg, "algorithm.adv_estimator") == "gae" or bool(select(cfg, "critic.enable"))


def check_rollout(cfg: DictConfig, need: Findings) -> None:
    """The rollout: ``hf`` (or verl's vLLM with its overlay), one process, async, and its own pool's checks."""
    name = select(cfg, f"{ROLLOUT}.name")
    if name == VLLM_ROLLOUT:
        need.extend(check_vllm_cpu_config(cfg))
    else:
        need(
            f"{ROLLOUT}.name",
            name == HF_ROLLOUT,
            name,
            f"SGLang does not run here; set {ROLLOUT}.name={HF_ROLLOUT} (transformers generation on the CPU), or "
            f"{VLLM_ROLLOUT} with +{VLLM_OVERLAY}",
        )
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        value = select(cfg, f"{ROLLOUT}.{key}", 1)
        need(f"{ROLLOUT}.{key}", value == 1, value, f"the {name} rollout runs one process; set {ROLLOUT}.{key}=1")
    mode = select(cfg, f"{ROLLOUT}.mode", "async")
    need(f"{ROLLOUT}.mode", mode == "async", mode, f"set {ROLLOUT}.mode=async")
    if not select(cfg, "actor_rollout_ref.hybrid_engine", True):
        check_standalone_rollout(cfg, need)


def check_lora(cfg: DictConfig, need: Findings) -> None:
    """LoRA (``actor_rollout_ref.model.lora_rank > 0``) reaches the CPU path's rollouts as merged weights only:
    the ``hf`` server loads full weights, not adapters, and verl 0.9.1's vLLM adapter path fails inside vLLM 0.30
    (``verl/utils/vllm/utils.py`` calls ``WeightsMapper.get_unstacked_mapper``, which that vLLM lacks; the engine
    dies at the first weight sync and the run hangs; the fix in verl: ``upstream/vllm-lora-rename-mapper.diff``)."""
    rank = select(cfg, "actor_rollout_ref.model.lora_rank", 0) or 0
    merge = select(cfg, "actor_rollout_ref.model.lora.merge", False)
    if isinstance(rank, int) and rank > 0:
        need(
            "actor_rollout_ref.model.lora.merge",
            bool(merge),
            merge,
            f"with actor_rollout_ref.model.lora_rank={rank} the rollout must receive merged weights (the hf rollout "
            "loads no adapter; verl's vLLM adapter path fails in vLLM 0.30's CPU build); set "
            "actor_rollout_ref.model.lora.merge=true",
        )


MODEL = "actor_rollout_ref.model"


def check_lora_values(cfg: DictConfig, need: Findings) -> None:
    """With LoRA on, a ``lora_adapter_path`` is a local adapter folder (nothing is downloaded on the CPU path).
    What the files say where they are here (an adapter folder without its config, ``target_modules`` naming no
    module of the model) and the values that are pure config are startup rules on every machine:
    :mod:`verl_offpolicy.glue.lora`."""
    rank = select(cfg, f"{MODEL}.lora_rank", 0)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        return
    adapter = select(cfg, f"{MODEL}.lora_adapter_path")
    if adapter is not None:
        folder = os.path.expanduser(str(adapter))
        need(
            f"{MODEL}.lora_adapter_path",
            os.path.isfile(os.path.join(folder, "adapter_config.json")),
            adapter,
            "must be a local folder holding a saved peft adapter (adapter_config.json; nothing is downloaded on the "
            "CPU path), or null to train a new adapter",
        )


def check_device(cfg: DictConfig, need: Findings) -> None:
    device = select(cfg, "trainer.device")
    need("trainer.device", device == PLATFORM_NAME, device, "set trainer.device=cpu")


def check_engines(cfg: DictConfig, need: Findings) -> None:
    """Megatron's CPU checks, or FSDP2 without torch.compile for the actor, the reference and a critic."""
    if select(cfg, "actor_rollout_ref.actor.strategy") == MEGATRON_STRATEGY:
        need.extend(check_megatron_cpu_config(cfg))
        return  # the FSDP keys do not exist in verl's Megatron configs
    for prefix, engine_key in (
        ("actor_rollout_ref.actor", "fsdp_config"),
        ("actor_rollout_ref.ref", "fsdp_config"),
        ("critic", "fsdp"),
    ):
        if prefix == "critic" and not _uses_critic(cfg):
            continue
        for key in (f"{prefix}.strategy", f"{prefix}.{engine_key}.strategy"):
            value = select(cfg, key)
            if value is not None:
                need(key, value == "fsdp2", value, f"FSDP1 does not run on the CPU; set {key}=fsdp2")
        for key in (f"{prefix}.use_torch_compile", f"{prefix}.{engine_key}.use_torch_compile"):
            value = select(cfg, key)
            if value is not None:
                need(key, value is False, value, f"torch.compile is not supported on the CPU path; set {key}=false")


def check_models(cfg: DictConfig, need: Findings) -> None:
    """The models: sdpa or eager attention, no fused kernels, local directories (nothing is downloaded)."""
    for prefix in ("actor_rollout_ref.model", "critic.model"):
        if prefix == "critic.model" and not _uses_critic(cfg):
            continue
        attn = select(cfg, f"{prefix}.override_config.attn_implementation", "flash_attention_2")
        need(
            f"{prefix}.override_config.attn_implementation",
            attn in SUPPORTED_ATTENTION,
            attn,
            f"flash-attention needs CUDA; set +{prefix}.override_config.attn_implementation=sdpa "
            f"(allowed: {', '.join(SUPPORTED_ATTENTION)})",
        )
        fused = select(cfg, f"{prefix}.use_fused_kernels", False)
        need(
            f"{prefix}.use_fused_kernels",
            not fused,
            fused,
            f"fused kernels need CUDA; set {prefix}.use_fused_kernels=false",
        )
        for key in ("path", "tokenizer_path"):
            path = select(cfg, f"{prefix}.{key}")
            if path is None and key == "tokenizer_path":
                continue
            local = os.path.expanduser(str(path)) if path is not None else ""
            need(
                f"{prefix}.{key}",
                bool(path) and os.path.isdir(local),
                path,
                "must be a local directory (nothing is downloaded on the CPU path); build a tiny model with "
                "verl_offpolicy.demo.tiny.build_tiny(dir) or use verl_offpolicy.demo.run.run_demo",
            )


def check_worker_env(cfg: DictConfig, need: Findings) -> None:
    """The variables every Ray worker needs (``CPU_ENV``), all of them strings."""
    for env_key, value in CPU_ENV.items():
        got = select(cfg, f"{ENV_PREFIX}.{env_key}")
        need(
            f"{ENV_PREFIX}.{env_key}",
            str(got) == value,
            got,
            f"every Ray worker needs it; set +{ENV_PREFIX}.{env_key}={value}",
        )
    for env_key, value in (select(cfg, ENV_PREFIX) or {}).items():
        need(
            f"{ENV_PREFIX}.{env_key}",
            isinstance(value, str),
            value,
            "Ray takes only strings there (it fails after starting); quote the value: "
            f"{ENV_PREFIX}.{env_key}='{value}'",
        )


def check_ray_resources(cfg: DictConfig, need: Findings) -> None:
    """A cluster the run starts: enough fake GPUs and logical CPUs; one it joins: its nodes decide."""
    gpus_needed = int(select(cfg, "trainer.n_gpus_per_node", 1) or 0) * int(select(cfg, "trainer.nnodes", 1) or 0)
    rollout_gpus = standalone_rollout_gpus(cfg)
    num_gpus = select(cfg, f"{RAY_INIT}.num_gpus")
    num_cpus = select(cfg, f"{RAY_INIT}.num_cpus")
    address = select(cfg, f"{RAY_INIT}.address")
    if address is not None:  # joining an existing cluster: its nodes' resources decide, and Ray refuses these two
        for key, value in ((f"{RAY_INIT}.num_gpus", num_gpus), (f"{RAY_INIT}.num_cpus", num_cpus)):
            need(
                key,
                value is None,
                value,
                f"{RAY_INIT}.address={address} joins an existing Ray cluster, whose nodes' "
                f"resources decide (Ray refuses num_cpus/num_gpus when connecting); set {key}=null",
            )
        return
    need(
        f"{RAY_INIT}.num_gpus",
        num_gpus is not None and num_gpus >= gpus_needed + rollout_gpus,
        num_gpus,
        f"verl places each training process (and each rollout process on its own pool) on a Ray 'GPU'; on the "
        f"CPU these are fake: set ++{RAY_INIT}.num_gpus={gpus_needed + rollout_gpus} (= trainer.n_gpus_per_node x "
        f"trainer.nnodes{' + rollout.nnodes x rollout.n_gpus_per_node' if rollout_gpus else ''})",
    )
    have = num_cpus if num_cpus is not None else (os.cpu_count() or 1)
    required = required_ray_cpus(cfg)
    units = select(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 8)
    need(
        f"{RAY_INIT}.num_cpus",
        have >= required,
        num_cpus,
        f"TransferQueue (1 controller + {units} storage units) and the placement groups need {required} "
        f"logical Ray CPUs, Ray would have {have} and wait forever; set {RAY_INIT}.num_cpus=16 and "
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    )


def check_training_ranks(cfg: DictConfig, need: Findings) -> None:
    """One node unless joining a cluster of several; at least one training process."""
    n_gpus = select(cfg, "trainer.n_gpus_per_node", 1)
    nnodes = select(cfg, "trainer.nnodes", 1)
    if select(cfg, f"{RAY_INIT}.address") is None:
        need(
            "trainer.nnodes",
            nnodes == 1,
            nnodes,
            "a Ray cluster the run starts itself has one node; set trainer.nnodes=1, "
            f"or join a cluster of several nodes ({RAY_INIT}.address, `verl-offpolicy cluster start`)",
        )
    need(
        "trainer.n_gpus_per_node",
        isinstance(n_gpus, int) and n_gpus >= 1,
        n_gpus,
        "the number of training processes (FSDP2 ranks on gloo, sharing this machine's cores): set "
        "trainer.n_gpus_per_node=1, or 2 to train on two ranks (docs/cpu.md)",
    )


def check_cpu_config(cfg: DictConfig) -> list[str]:
    """All problems of ``cfg`` for the CPU path, each naming the key and the value to set (:data:`CPU_RULES`, in
    order)."""
    need = Findings()
    for rule in CPU_RULES:
        rule(cfg, need)
    return need.problems


def validate_cpu_config(cfg: DictConfig) -> None:
    """Raise :class:`CPUConfigError` listing every problem of ``cfg`` for the CPU path."""
    problems = check_cpu_config(cfg)
    if problems:
        raise CPUConfigError(
            "this configuration cannot run on verl's CPU path (+cpu=demo sets all of these):\n  - "
            + "\n  - ".join(problems)
        )


class CPUStartupGuard(Callback):
    """Hydra callback of the CPU overlays: validate, then put the driver on the CPU platform."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not cpu_path_selected(config):
            return
        try:
            validate_cpu_config(config)
            from verl_offpolicy.cpu.verl_shims import activate_cpu_platform

            activate_cpu_platform(check_stale=False)
        except Exception as exc:
            raise SystemExit(f"verl-offpolicy: {exc}") from exc
        warn_if_not_loopback()


CPU_GROUP = "cpu"  # +cpu=demo, +cpu=megatron: the CPU overlays (configs/cpu/)
CPU_ROLLOUT_GROUP = "cpu_rollout"  # +cpu_rollout=standalone, +cpu_rollout=vllm: on top of one (configs/cpu_rollout/)
# What each cpu_rollout overlay would do to a config that is not on the CPU path.
CPU_ROLLOUT_EFFECTS = {
    "standalone": "it caps Ray at 2 GPUs and selects the CPU weight transport (cpu_mailbox)",
    "vllm": "it turns off vLLM's sleep mode and CUDA graphs and fixes its KV cache at 512 MiB",
}


def overlay_names(value: str) -> list[str]:
    """The overlays of one group an override selects: ``vllm`` -> [vllm], ``[vllm,standalone]`` -> both."""
    return [v.strip() for v in value.strip().strip("[]").split(",") if v.strip()]


def selected_cpu_rollout_overlays(config: DictConfig) -> list[str]:
    """The ``+cpu_rollout=`` overlays a composed config selected: one (``+cpu_rollout=vllm``, in Hydra's
    ``runtime.choices``) or several (``+cpu_rollout=[vllm,standalone]``, which Hydra does not record among the
    choices: read from the command line's overrides)."""
    choices = select(config, "hydra.runtime.choices", None) or {}
    if choices.get(CPU_ROLLOUT_GROUP) is not None:
        return [str(choices[CPU_ROLLOUT_GROUP])]
    for override in select(config, "hydra.overrides.task", None) or []:
        key, _, value = str(override).partition("=")
        if key.lstrip("+~") == CPU_ROLLOUT_GROUP and value:
            return overlay_names(value)
    return []


def check_cpu_rollout_overlay(config: DictConfig) -> None:
    """Raise :class:`CPUConfigError` if a ``+cpu_rollout=`` overlay is used without a ``+cpu=`` overlay."""
    overlays = selected_cpu_rollout_overlays(config)
    choices = select(config, "hydra.runtime.choices", None) or {}
    if not overlays or choices.get(CPU_GROUP) is not None:
        return
    effects = "; ".join(f"{o}: {CPU_ROLLOUT_EFFECTS.get(o, 'its settings are the CPU path')}" for o in overlays)
    selected = overlays[0] if len(overlays) == 1 else "[" + ",".join(overlays) + "]"
    raise CPUConfigError(
        f"+{CPU_ROLLOUT_GROUP}={selected} is part of verl-offpolicy's CPU path and goes on top of +{CPU_GROUP}=demo "
        f"(or +{CPU_GROUP}=megatron), which this config does not select; on any other config it would change it "
        f"({effects}). Add +{CPU_GROUP}=demo, or remove +{CPU_ROLLOUT_GROUP}={selected}"
    )


class CPURolloutOverlayGuard(Callback):
    """Hydra callback of the ``+cpu_rollout=`` overlays: they need the CPU path (:func:`check_cpu_rollout_overlay`)."""

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            check_cpu_rollout_overlay(config)
        except CPUConfigError as exc:  # Hydra would turn an Exception into a warning
            raise SystemExit(f"verl-offpolicy: {exc}") from exc


def warn_if_not_loopback() -> bool:
    """Warn (and return True) if Ray in this process will listen on every interface.

    Ray reads the variable when it is imported, which happens before any config is read, so it can
    only be set in the environment that starts ``main_ppo`` (``verl-offpolicy demo`` does).
    """
    missing = {k: v for k, v in LOOPBACK_ENV.items() if os.environ.get(k) != v}
    if missing:
        setting = " ".join(f"{k}={v}" for k, v in missing.items())
        logger.warning(
            "verl-offpolicy: Ray, TransferQueue and the process groups will listen on every network interface; "
            "start main_ppo with %s in its environment to keep them on 127.0.0.1",
            setting,
        )
    return bool(missing)


__all__ = [
    "CPUConfigError",
    "CPURolloutOverlayGuard",
    "CPUStartupGuard",
    "check_cpu_rollout_overlay",
    "overlay_names",
    "selected_cpu_rollout_overlays",
    "ENV_ENGINE_DEVICE",
    "check_cpu_config",
    "check_megatron_cpu_config",
    "check_vllm_cpu_config",
    "cpu_path_selected",
    "required_ray_cpus",
    "validate_cpu_config",
    "warn_if_not_loopback",
]


CPU_RULES = (
    check_rollout,
    check_lora_values,
    check_lora,
    check_device,
    check_engines,
    check_models,
    check_worker_env,
    check_ray_resources,
    check_micro_batch_sizes,
    check_training_ranks,
)
