"""Hydra SearchPathPlugin: makes verl-offpolicy's configs visible to stock ``verl.trainer.main_ppo``.

Hydra discovers this module in the ``hydra_plugins`` namespace package after ``pip install``; it
appends ``pkg://verl_offpolicy.configs`` to the search path, so ``+algorithm=<preset>`` works with
verl's own ``ppo_trainer``/``ppo_megatron_trainer`` and ``--config-name offpolicy_trainer`` selects
our primary config.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

CONFIG_PACKAGE = "pkg://verl_offpolicy.configs"


class VerlOffPolicySearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="verl-offpolicy", path=CONFIG_PACKAGE)
