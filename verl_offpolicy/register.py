"""Registration without entry points: ``VERL_USE_EXTERNAL_MODULES=verl_offpolicy.register``.

verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` (comma-separated) at ``import verl``, in
every process that imports it (driver, TaskRunner, Ray workers, which inherit the driver's environment),
before it loads the ``verl.plugins`` entry points. Importing this module registers everything this
package adds to verl, exactly as the entry point does (:mod:`verl_offpolicy.glue.plugin`): the advantage
estimators, the policy losses, the ``offpolicy`` trainer mode, the CPU platform, rollout and agent loop.
Use it where entry points are disabled (``VERL_USE_EXTERNAL_PLUGINS=none`` or a list without
``verl_offpolicy``) or the package's metadata is not installed (a source tree on ``PYTHONPATH``).
Loading both is harmless: registration runs once per process.

The configs (presets, ``offpolicy_trainer``) need no entry point: Hydra finds
``hydra_plugins/verl_offpolicy_searchpath`` on ``sys.path``.
"""

from verl_offpolicy.glue.plugin import LOAD_FAILURE  # noqa: F401 - importing it registers everything
