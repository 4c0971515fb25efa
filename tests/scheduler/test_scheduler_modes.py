"""The scheduler trainer's two modes (docs/scheduler.md): one small class and one registered name per mode.

Built through verl's own entry point (``get_trainer_cls(trainer_mode)(config=...)``, what ``main_ppo``
does); the constructor needs neither Ray nor workers. Also: the hook tables in the mode classes'
docstrings are the classes' shape, and docs/scheduler.md's table of startup rules names real functions.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tests.hydra_utils import VALID_SIZES
from tests.scenario_schedule import OVERLAPPED
from verl_offpolicy.glue.compose import compose_preset
from verl_offpolicy.glue.config import OffPolicyConfigError

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"


def _trainer(preset: str, extra: list[str]):
    """verl's main_ppo: the class registered under the config's trainer_mode, built with the config."""
    from verl.trainer.ppo.v1 import get_trainer_cls

    config = compose_preset(preset, overrides=[*VALID_SIZES, *extra])
    return get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)


def _modes():
    from verl_offpolicy.glue.scheduler.colocated import ColocatedTrainer
    from verl_offpolicy.glue.scheduler.overlapped import OverlappedTrainer

    return ColocatedTrainer, OverlappedTrainer


@pytest.mark.parametrize("overlapped", [False, True])
def test_each_mode_has_its_registered_name_picked_from_hybrid_engine(overlapped):
    from verl.trainer.ppo.v1 import get_trainer_cls

    colocated_cls, overlapped_cls = _modes()
    trainer = _trainer("opmd", OVERLAPPED + ["algorithm.offpolicy.sync_offset=1"] if overlapped else [])
    assert type(trainer) is (overlapped_cls if overlapped else colocated_cls)
    assert get_trainer_cls("offpolicy_overlapped" if overlapped else "offpolicy") is type(trainer)
    assert trainer.config.trainer.v1.trainer_mode == ("offpolicy_overlapped" if overlapped else "offpolicy")
    assert (trainer.schedule.sync_interval, trainer.schedule.sync_offset) == (1, 1 if overlapped else 0)
    # verl's _setup builds colocated replicas exactly in the colocated mode
    assert getattr(trainer, "_enable_hybrid_replicas", True) is not overlapped


@pytest.mark.parametrize("mode, hybrid_engine", [("offpolicy", "false"), ("offpolicy_overlapped", "true")])
def test_a_trainer_name_that_disagrees_with_hybrid_engine_is_refused(mode, hybrid_engine):
    extra = OVERLAPPED if hybrid_engine == "false" else []
    config = compose_preset(
        "opmd",
        overrides=[
            *VALID_SIZES,
            *extra,
            f"actor_rollout_ref.hybrid_engine={hybrid_engine}",
            f"trainer.v1.trainer_mode={mode}",
        ],
    )
    from verl_offpolicy.glue.validation import validate_offpolicy_config

    expected = "offpolicy" if hybrid_engine == "true" else "offpolicy_overlapped"
    with pytest.raises(
        OffPolicyConfigError,
        match=f"trainer.v1.trainer_mode={mode} with actor_rollout_ref.hybrid_engine="
        f"{hybrid_engine.title()}.*set trainer.v1.trainer_mode={expected}, or remove it",
    ):
        validate_offpolicy_config(config)


def test_the_constructor_validates_a_config_no_callback_saw():
    with pytest.raises(OffPolicyConfigError, match="overlapped mode.*ratio_anchor=behaviour"):
        _trainer("rec_oneside_nois", OVERLAPPED + ["algorithm.offpolicy.ratio_anchor=behaviour"])


def _table_hooks(cls) -> list[str]:
    """The hooks named in the first column of the class module's docstring table."""
    doc = importlib.import_module(cls.__module__).__doc__
    return re.findall(r"^``(\w+)``", doc, flags=re.MULTILINE)


def test_each_mode_class_defines_the_hooks_of_its_table():
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from verl_offpolicy.glue.scheduler.trainer import OffPolicyTrainer

    for cls in _modes():
        hooks = _table_hooks(cls)
        assert len(hooks) >= 5, (cls, hooks)
        for hook in hooks:
            assert hasattr(PPOTrainer, hook), f"{hook} is not a verl PPOTrainer hook"
            owner = next(c for c in cls.__mro__ if hook in vars(c))
            assert owner in (cls, OffPolicyTrainer), f"{cls.__name__}.{hook} comes from {owner.__name__}"
        assert not hasattr(cls, "overlapped")  # no mode flag: the class is the mode


def _documented_rules() -> list[str]:
    """The dotted names (under verl_offpolicy.glue, the startup callback's under verl_offpolicy) in the first
    column of the 'Rejected at startup' table."""
    section = DOC.read_text().split("## Rejected at startup", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [name for row in rows for name in re.findall(r"`([\w.]+)`", row.split("|")[1])]


def test_the_scheduler_docs_table_of_startup_rules_matches_the_code():
    from verl_offpolicy.glue.scheduler import checks

    documented = _documented_rules()
    for dotted in documented:  # under verl_offpolicy.glue, or under verl_offpolicy (the startup callback)
        prefix = "verl_offpolicy" if dotted.startswith("startup.") else "verl_offpolicy.glue"
        module, _, attr = f"{prefix}.{dotted}".rpartition(".")
        assert hasattr(importlib.import_module(module), attr), f"docs/scheduler.md names {dotted}, which does not exist"
    scheduler_rules = {
        f"scheduler.checks.{rule.__name__}" for rule in (*checks.ROLLOUT_CORRECTION_RULES, *checks.RULES)
    }
    assert scheduler_rules <= set(documented), sorted(scheduler_rules - set(documented))


def test_check_rejects_an_unknown_checkpoint_backend_and_a_bad_generation_timeout(monkeypatch):
    """Both passed `check` and failed after Ray started (the rollout pool's engine, the TaskRunner's deadline)."""
    from tests.hydra_utils import VALID_SIZES, compose_and_check

    base = ["algorithm=opmd", *VALID_SIZES]
    with pytest.raises(ValueError, match=r"checkpoint_engine.backend=.bogus. is not a checkpoint engine verl knows"):
        compose_and_check(
            "offpolicy_trainer", [*base, *OVERLAPPED, "actor_rollout_ref.rollout.checkpoint_engine.backend=bogus"]
        )
    # verl's nccl engine cannot be imported on this CPU machine (no cupy): a GPU config checked here is accepted
    compose_and_check(
        "offpolicy_trainer", [*base, *OVERLAPPED, "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"]
    )
    monkeypatch.setenv("VERL_OFFPOLICY_GENERATION_TIMEOUT", "abc")
    with pytest.raises(
        ValueError, match="VERL_OFFPOLICY_GENERATION_TIMEOUT must be a number of seconds > 0, got 'abc'"
    ):
        compose_and_check("offpolicy_trainer", base)
