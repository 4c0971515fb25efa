"""Opt-in CPU backend of verl-offpolicy: what runs inside verl's processes on a CPU-only machine, without patching verl.

- :mod:`.platform`: verl platform ``cpu`` (selected with ``VERL_PLATFORM=cpu``).
- :mod:`.hf_server`, :mod:`.rollout`, :mod:`.sampling`: rollout backend ``hf`` (transformers generation: server;
replica + adapter; sampling and seeding).
- :mod:`.checkpoint_engine`: weight transport ``cpu_mailbox`` for a rollout on its own pool (imported by verl
via ``custom_backend_module``).
- :mod:`.registration`: registers both into verl's registries at ``import verl`` (cheap).
- :mod:`.guards`: startup checks of a CPU config (Hydra callback of the ``+cpu=demo`` overlay).
- :mod:`.megatron`, :mod:`.agent_loop`: shims for verl's Megatron engine on the CPU; the seeded agent loop.
- :mod:`.task`: the reward of the demo's "repeat the symbol" task (loaded by verl's reward loop).

The tooling that prepares a model and drives ``main_ppo`` from outside (``run_demo()``) is
:mod:`verl_offpolicy.demo`; nothing here imports it. Nothing here is imported unless asked for, and
nothing changes for GPU users.
"""

# Import verl first: its plugin loading imports verl_offpolicy.cpu.registration, which imports
# .platform. Importing .platform before verl would otherwise run that chain while .platform is only
# half initialised.
import verl  # noqa: F401
