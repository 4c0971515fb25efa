"""OmegaConf resolvers used by the presets, registered at ``import verl`` in every process.

verl's driver and its ``TaskRunner`` resolve the config after ``import verl``, which runs our
``verl.plugins`` entry point (``EAGER_REGISTRATIONS`` of :mod:`verl_offpolicy.glue.registration`).
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


def register_resolvers() -> None:
    """Register :data:`MINI_BATCH_RESOLVER` once per process."""
    if not OmegaConf.has_resolver(MINI_BATCH_RESOLVER):
        OmegaConf.register_new_resolver(MINI_BATCH_RESOLVER, mini_batch_size)
