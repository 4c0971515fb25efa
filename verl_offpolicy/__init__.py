"""verl-offpolicy: off-policy RL algorithms and a staleness-controlled rollout scheduler for verl.

Layout:
    core/     pure math (torch only, no verl imports): advantages, losses, staleness schedule
    glue/     verl glue: registration, typed configs, startup validation, the scheduler trainer
    cpu/      opt-in CPU platform and rollout backend, tiny local model, synthetic task, demo
    configs/  Hydra configs: primary trainer configs and one preset per algorithm
"""

__version__ = "0.1.0"
