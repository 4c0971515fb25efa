"""Whether verl's plugin settings let ``import verl`` load verl-offpolicy, read from an environment alone.

verl loads the ``verl.plugins`` entry points unless ``VERL_USE_EXTERNAL_PLUGINS`` is ``none`` or a list
without ours, and imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` first. Used by the startup
callback (:mod:`.startup`, for the Ray workers' environment) and by ``doctor``/``check``'s report
(:mod:`.diagnose`). Standard library only: it must work from a broken installation.
"""

from __future__ import annotations

from typing import Mapping

ENTRY_POINT_GROUP = "verl.plugins"
ENTRY_POINT_NAME = "verl_offpolicy"
PLUGIN_MODULE = "verl_offpolicy.glue.plugin"
REGISTER_MODULE = "verl_offpolicy.register"  # the same registration through VERL_USE_EXTERNAL_MODULES
PLUGINS_ENV = "VERL_USE_EXTERNAL_PLUGINS"
MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"


def plugin_setting_problem(env: Mapping[str, str]) -> str | None:
    """Why ``import verl`` in a process with environment ``env`` will not register verl-offpolicy, read
    from the environment alone (verl's ``VERL_USE_EXTERNAL_PLUGINS`` excludes our entry point and
    ``VERL_USE_EXTERNAL_MODULES`` does not name our module), with the fix; None if the setting lets it load."""
    modules = {name.strip() for name in env.get(MODULES_ENV, "").split(",") if name.strip()}
    if modules & {REGISTER_MODULE, PLUGIN_MODULE}:
        return None
    policy = env.get(PLUGINS_ENV, "auto").strip().lower()
    alternative = f"or set {MODULES_ENV}={REGISTER_MODULE}"
    if policy == "none":
        return (
            f"{PLUGINS_ENV}=none disables verl's plugins, so `import verl` registers nothing of verl-offpolicy; "
            f"unset {PLUGINS_ENV} (or set it to auto or to a list that includes {ENTRY_POINT_NAME}), {alternative}"
        )
    allowed = {name.strip() for name in policy.split(",") if name.strip()}
    if policy != "auto" and ENTRY_POINT_NAME not in allowed:
        return (
            f"{PLUGINS_ENV}={env.get(PLUGINS_ENV)} does not list {ENTRY_POINT_NAME}, so `import verl` "
            f"registers nothing of verl-offpolicy; add it ({PLUGINS_ENV}={policy},{ENTRY_POINT_NAME}), {alternative}"
        )
    return None
