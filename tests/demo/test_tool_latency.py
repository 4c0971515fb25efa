"""The tool task's tool latency (``demo --tool-latency``, :mod:`verl_offpolicy.demo.tool_task`): the tool verl's own
loader builds from the written config sleeps that long per call, heavy-tailed when asked, and a value it cannot take
is refused naming the key or the option."""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time

import pytest

from verl_offpolicy.demo.tool_task import TOOL_NAME, call_latency, latency_setting, write_tool_config


def _tools(path):
    from verl.tools.tool_registry import initialize_tools_from_config

    return initialize_tools_from_config(str(path))


def _call(tool) -> tuple[str, float]:
    async def once():
        instance_id, _ = await tool.create(create_kwargs={"value": "c"})
        start = time.perf_counter()
        response, _, _ = await tool.execute(instance_id, {})
        return response.text, time.perf_counter() - start

    return asyncio.run(once())


def test_the_written_config_gives_verls_loader_a_tool_that_takes_that_long(tmp_path):
    (tool,) = _tools(write_tool_config(tmp_path / "tool.yaml", 0.3))
    assert tool.name == TOOL_NAME and (tool.latency_s, tool.spread) == (0.3, "fixed")
    text, seconds = _call(tool)
    assert text == "c c c" and seconds >= 0.3  # a lower bound only: a busy machine may take longer


def test_no_latency_by_default(tmp_path):
    from verl_offpolicy.demo.tool_task import TOOL_CONFIG

    (tool,) = _tools(TOOL_CONFIG)
    assert tool.latency_s == 0.0


def test_lognormal_draws_have_the_median_and_a_heavy_tail():
    """exp(z), z ~ N(0, 1): median 1, mean e^(1/2) = 1.649, 95th percentile e^1.645 = 5.18 (times the median)."""
    rng = random.Random(1)
    draws = [call_latency(2.0, "lognormal", rng) for _ in range(20000)]
    assert statistics.median(draws) == pytest.approx(2.0, rel=0.05)
    assert statistics.fmean(draws) == pytest.approx(2.0 * math.exp(0.5), rel=0.05)
    assert sorted(draws)[int(0.95 * len(draws))] == pytest.approx(2.0 * 5.18, rel=0.08)
    assert call_latency(2.0, "fixed", rng) == 2.0


@pytest.mark.parametrize(
    "config,fragment",
    [
        ({"latency_s": -1}, "latency_s=-1: must be a number of seconds >= 0"),
        ({"latency_s": float("inf")}, "latency_s=inf: must be a number of seconds >= 0"),
        ({"latency_s": "1"}, "latency_s='1': must be a number of seconds >= 0"),
        ({"latency_s": 1, "latency_spread": "pareto"}, "latency_spread='pareto': allowed: fixed, lognormal"),
    ],
)
def test_a_latency_the_tool_cannot_take_is_refused_naming_the_key(config, fragment):
    with pytest.raises(ValueError, match=f"the {TOOL_NAME} tool's {fragment}"):
        latency_setting(config)


def _args(tmp_path, **values):
    return argparse.Namespace(
        output_dir=str(tmp_path), **{"tool_latency": None, "tool_latency_spread": "fixed", **values}
    )


def test_demo_option_writes_the_config_into_the_output_dir(tmp_path):
    from verl_offpolicy.cli import tool_latency_overrides
    from verl_offpolicy.demo.models import MODELS

    (override,) = tool_latency_overrides(
        _args(tmp_path, tool_latency=0.5, tool_latency_spread="lognormal"), MODELS["tiny-tool"]
    )
    key, _, path = override.partition("=")
    assert key == "actor_rollout_ref.rollout.multi_turn.tool_config_path" and path.startswith(str(tmp_path))
    (tool,) = _tools(path)
    assert (tool.latency_s, tool.spread) == (0.5, "lognormal")
    assert tool_latency_overrides(_args(tmp_path), MODELS["tiny"]) == []


@pytest.mark.parametrize(
    "model,values,fragment",
    [
        (
            "tiny",
            {"tool_latency": 1.0},
            "--tool-latency needs a model of the tool task (tiny-tool, tiny-tool-h32), got tiny",
        ),
        ("tiny-tool", {"tool_latency": -2.0}, "--tool-latency must be a number of seconds >= 0, got -2"),
        (
            "tiny-tool",
            {"tool_latency": 1.0, "tool_latency_spread": "pareto"},
            "--tool-latency-spread 'pareto': allowed",
        ),
        ("tiny-tool", {"tool_latency_spread": "lognormal"}, "--tool-latency-spread needs --tool-latency SECONDS"),
    ],
)
def test_demo_option_refusals_name_the_option(tmp_path, model, values, fragment):
    from verl_offpolicy.cli import tool_latency_overrides
    from verl_offpolicy.demo.models import MODELS

    with pytest.raises(ValueError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        tool_latency_overrides(_args(tmp_path, **values), MODELS[model])
