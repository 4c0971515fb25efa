"""OmegaConf resolvers used by the presets, registered at ``import verl`` in every process, and their rule.

verl's driver and its ``TaskRunner`` resolve the config after ``import verl``, which runs our
``verl.plugins`` entry point (``EAGER_REGISTRATIONS`` of :mod:`verl_offpolicy.glue.registration`).
``RULES``: a mini-batch size this resolver computed must split into verl's micro-batches
(:func:`check_preset_mini_batch`).
"""

from __future__ import annotations

from omegaconf import OmegaConf

# ``${offpolicy.mini_batch_size:${data.train_batch_size},<updates>}`` in a preset.
MINI_BATCH_RESOLVER = "offpolicy.mini_batch_size"


def mini_batch_size(train_batch_size: int, updates: int) -> int:
    """The largest d dividing B = train_batch_size with d ≤ B/updates (1 if B < updates).

    As ``actor.ppo_mini_batch_size`` (prompts per optimizer update) it splits every batch into
    B/d ≥ min(updates, B) updates: B = 512, 16 updates → 32 (OpenKimi's PMD runs); B = 8 → 1.
    """
    for key, value in (("data.train_batch_size", train_batch_size), ("updates", updates)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{MINI_BATCH_RESOLVER}: {key} must be an integer >= 1, got {value!r}")
    limit = max(1, train_batch_size // updates)
    return next(d for d in range(limit, 0, -1) if train_batch_size % d == 0)


# ``${offpolicy.ray_gpus:${trainer.nnodes},${trainer.n_gpus_per_node},<rollout nnodes>,<rollout n_gpus_per_node>}``
# in the CPU path's overlays (``ray_kwargs.ray_init.num_gpus``).
RAY_GPUS_RESOLVER = "offpolicy.ray_gpus"


def ray_gpus(trainer_nodes: int, trainer_gpus: int, rollout_nodes: int = 0, rollout_gpus: int = 0) -> int:
    """The (fake) Ray GPUs a run places its processes on: one per training process, plus one per process of a
    rollout on its own pool: trainer_nodes·trainer_gpus + rollout_nodes·rollout_gpus."""
    return int(trainer_nodes) * int(trainer_gpus) + int(rollout_nodes) * int(rollout_gpus)


TRAINER_MODE_RESOLVER = "offpolicy.trainer_mode"


def trainer_mode(hybrid_engine: bool) -> str:
    """``${offpolicy.trainer_mode:${actor_rollout_ref.hybrid_engine}}``: the scheduler's trainer for the engine layout
    (``offpolicy`` colocated, ``offpolicy_overlapped`` with the rollout on a pool of its own)."""
    from verl_offpolicy.glue.registration import scheduler_trainer

    return scheduler_trainer(hybrid_engine)


def register_resolvers() -> None:
    """Register :data:`MINI_BATCH_RESOLVER`, :data:`RAY_GPUS_RESOLVER` and :data:`TRAINER_MODE_RESOLVER` once
    per process."""
    for name, function in (
        (MINI_BATCH_RESOLVER, mini_batch_size),
        (RAY_GPUS_RESOLVER, ray_gpus),
        (TRAINER_MODE_RESOLVER, trainer_mode),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


def check_preset_mini_batch(view) -> None:
    """A mini-batch from the presets' resolver (PMD: ≥ 16 updates per batch) must split into verl's micro-batches.

    verl asserts at the first update that each update's responses (ppo_mini_batch_size × rollout.n)
    divide by the data-parallel size and, per rank, by ppo_micro_batch_size_per_gpu (FSDP, no dynamic
    batch size). Only checked when the mini-batch size is the preset's (a size set explicitly is the user's).
    """
    from verl_offpolicy.glue.knobs import OffPolicyConfigError  # not at import: this module runs at `import verl`

    actor = "actor_rollout_ref.actor"
    node = view.select(actor)
    if node is None:
        return
    raw = OmegaConf.to_container(node, resolve=False).get("ppo_mini_batch_size")
    if not (isinstance(raw, str) and MINI_BATCH_RESOLVER in raw) or view.select(f"{actor}.use_dynamic_bsz", False):
        return
    if view.select(f"{actor}.strategy", "fsdp") not in ("fsdp", "fsdp2"):
        return
    mini = view.select(f"{actor}.ppo_mini_batch_size")
    n = view.select("actor_rollout_ref.rollout.n", 1)
    gpus = view.select("trainer.nnodes", 1) * view.select("trainer.n_gpus_per_node", 1)
    ranks = max(1, gpus // (view.select(f"{actor}.ulysses_sequence_parallel_size", 1) or 1))
    micro = view.select(f"{actor}.ppo_micro_batch_size_per_gpu")
    responses = mini * n
    if responses % ranks == 0 and (not micro or (responses // ranks) % micro == 0):
        return
    raise OffPolicyConfigError(
        f"{actor}.ppo_mini_batch_size={mini} (the preset's split of data.train_batch_size="
        f"{view.select('data.train_batch_size')} into several optimizer updates) × actor_rollout_ref.rollout.n={n} = "
        f"{responses} responses per update do not split into {ranks} data-parallel rank(s) × "
        f"{actor}.ppo_micro_batch_size_per_gpu={micro}: set {actor}.ppo_micro_batch_size_per_gpu to a divisor of "
        f"{responses // ranks if responses % ranks == 0 else 'the responses per rank'}, set "
        f"{actor}.ppo_mini_batch_size "
        f"explicitly, or set {actor}.use_dynamic_bsz=true"
    )


RULES = (check_preset_mini_batch,)
