"""An FSDP run on the CPU path skips importing verl's Megatron engine (megatron-core costs seconds of CPU in
every process of a run): ``VERL_OFFPOLICY_CPU_SKIP_ENGINES``, set by ``+cpu=demo`` for the Ray workers and
by the demo for an FSDP driver. Fresh processes: what is imported at ``import verl`` is what is tested."""

import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from verl_offpolicy.glue.compose import compose_main_ppo

TIMEOUT = 300
ENV_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_OFFPOLICY_CPU_SKIP_ENGINES"  # written out

PROBE = """
import json, sys
import verl.workers.engine as engines
from verl_offpolicy.glue.registration import registration_failure
print(json.dumps({"megatron_imported": "megatron.core" in sys.modules,
                  "megatron_engine": engines.MegatronEngine is not None,
                  "fsdp_engine": engines.FSDPEngine is not None, "failure": registration_failure()}))
"""


def _probe(**env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "VERL_OFFPOLICY_CPU_SKIP_ENGINES")}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env={**base, **env}, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow  # fresh processes import verl
def test_a_cpu_fsdp_process_does_not_import_megatron_and_keeps_fsdp():
    skipped = _probe(VERL_PLATFORM="cpu", VERL_OFFPOLICY_CPU_SKIP_ENGINES="megatron,mindspeed")
    assert skipped == {"megatron_imported": False, "megatron_engine": False, "fsdp_engine": True, "failure": None}


@pytest.mark.slow
def test_the_variable_does_nothing_outside_the_cpu_platform():
    # a GPU process (no VERL_PLATFORM=cpu) imports every engine as verl does (megatron-core is installed here)
    assert _probe(VERL_OFFPOLICY_CPU_SKIP_ENGINES="megatron")["megatron_engine"] is True


@pytest.mark.slow
def test_an_unknown_engine_name_is_a_registration_failure_naming_the_variable():
    failure = _probe(VERL_PLATFORM="cpu", VERL_OFFPOLICY_CPU_SKIP_ENGINES="megatron,fsdp")["failure"]
    assert (
        "VERL_OFFPOLICY_CPU_SKIP_ENGINES=megatron,fsdp: unknown engine(s) ['fsdp']; allowed: megatron, mindspeed"
        in failure
    )


def test_the_fsdp_overlay_sets_it_for_the_workers_and_the_megatron_overlay_does_not():
    from verl_offpolicy.cpu.registration import FSDP_RUN_SKIPS

    fsdp = compose_main_ppo("offpolicy_trainer", ["algorithm=opmd", "+cpu=demo"])
    megatron = compose_main_ppo("offpolicy_megatron_trainer", ["algorithm=opmd", "+cpu=megatron"])
    assert OmegaConf.select(fsdp, ENV_KEY) == FSDP_RUN_SKIPS == "megatron,mindspeed"
    assert OmegaConf.select(megatron, ENV_KEY) is None
