"""Values that passed ``verl-offpolicy check`` and then failed, trained nothing or were silently reinterpreted.

Each case composes a command line and runs every startup check in this process, as ``check`` does
(:func:`tests.hydra_utils.compose_and_check`: ``run_startup_checks`` of ``verl_offpolicy.cli``), and expects the
refusal to name the key and the value (and what to set), or the startup warning to name the setting.
"""

from __future__ import annotations

import logging

import pytest

from tests.hydra_utils import VALID_SIZES, compose_and_check

BASE = ["algorithm=opmd", *VALID_SIZES, "actor_rollout_ref.rollout.calculate_log_probs=true"]
RC = "algorithm.rollout_correction"


def _refused(overrides: list[str], *fragments: str, config_name: str = "offpolicy_trainer", base=BASE) -> str:
    with pytest.raises(ValueError) as caught:
        compose_and_check(config_name, [*base, *overrides])
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


# ------------------------------------------------------------------------ verl's rollout correction


@pytest.mark.parametrize(
    "overrides,fragments",
    [
        ([f"{RC}.rollout_is=bogus"], [f"{RC}.rollout_is='bogus'", "Must be one of", "'sequence'", "'token'"]),
        ([f"{RC}.rollout_rs=bogus"], [f"{RC}.rollout_rs='bogus'", "seq_mean_k1", "token_k3"]),
        (
            [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=abc"],
            [f"{RC}.rollout_is_threshold='abc'", "lower <= upper"],
        ),
        (
            [f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=-1"],
            [f"{RC}.rollout_is_threshold=-1", "must be positive"],
        ),
        # an inverted IcePop band: verl would refuse it in the trainer's first step
        (
            [f"{RC}.rollout_is=sequence", f"{RC}.rollout_is_threshold=2.0_0.5"],
            [f"{RC}.rollout_is_threshold='2.0_0.5'", "lower bound must be <= upper"],
        ),
        ([f"{RC}.rollout_is_threshold=nan"], [f"{RC}.rollout_is_threshold=nan", "is not a number"]),
        ([f"{RC}.rollout_rs=seq_mean_k3"], [f"{RC}.rollout_rs_threshold=None", "must be provided"]),
        (
            [f"{RC}.rollout_rs=seq_mean_k3", f"{RC}.rollout_rs_threshold=0.5_2.0"],
            [f"{RC}.rollout_rs_threshold='0.5_2.0'", "single upper bound"],
        ),
        ([f"{RC}.loss_type=bogus"], [f"{RC}.loss_type='bogus'", "reinforce", "ppo_clip"]),
        ([f"{RC}.bypass_mode=yes"], [f"{RC}.bypass_mode must be true or false, got 'yes'"]),
    ],
)
def test_rollout_correction_values_are_verls(overrides, fragments):
    _refused(overrides, *fragments)


def test_rollout_correction_values_verl_accepts_pass():
    compose_and_check("offpolicy_trainer", [*BASE, f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.5_5.0"])
    compose_and_check(
        "offpolicy_trainer",
        [*BASE, f"{RC}.rollout_rs='token_k1,seq_mean_k3'", f"{RC}.rollout_rs_threshold='0.5_2.0,0.01'"],
    )


def test_an_icepop_band_without_ratio_1_is_warned_at_startup(caplog):
    with caplog.at_level(logging.WARNING, logger="verl_offpolicy"):
        compose_and_check("offpolicy_trainer", [*BASE, f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=1.25_3.5"])
    warned = [r.getMessage() for r in caplog.records if "excludes ratio 1" in r.getMessage()]
    assert len(warned) == 1 and f"{RC}.rollout_is_threshold=1.25_3.5" in warned[0] and "[1.25, 3.5]" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="verl_offpolicy"):  # a band around 1: no warning
        compose_and_check("offpolicy_trainer", [*BASE, f"{RC}.rollout_is=token", f"{RC}.rollout_is_threshold=0.25_4.5"])
    assert not [r for r in caplog.records if "excludes ratio 1" in r.getMessage()]


# ------------------------------------------------------------------------ verl's legacy trainer


def test_the_legacy_trainer_refuses_the_overlapped_mode():
    # verl's RayPPOTrainer asserts a hybrid engine in its constructor, after Ray started
    _refused(
        ["trainer.use_v1=false", "actor_rollout_ref.hybrid_engine=false"],
        "trainer.use_v1=false",
        "actor_rollout_ref.hybrid_engine=false",
        "set actor_rollout_ref.hybrid_engine=true",
    )
    compose_and_check("offpolicy_trainer", [*BASE, "trainer.use_v1=false"])  # colocated: runs on the legacy trainer


# ------------------------------------------------------------------------ upper bounds, sampling values

MATH_VERIFY = ["reward.custom_reward_function.path=pkg://verl_offpolicy.rewards.math_verify_reward"]
TIMEOUT_KEY = "reward.custom_reward_function.reward_kwargs.timeout_seconds"


def test_timeouts_above_what_the_platforms_timers_hold_are_refused(monkeypatch):
    """1e10 s passed startup, then every wait on it raised OverflowError; threading.TIMEOUT_MAX is the bound."""
    import threading

    limit = f"{threading.TIMEOUT_MAX:.0f}"
    _refused([*MATH_VERIFY, f"+{TIMEOUT_KEY}=1e10"], f"{TIMEOUT_KEY} must be", "got 10000000000.0", f"at most {limit}")
    compose_and_check("offpolicy_trainer", [*BASE, *MATH_VERIFY, f"+{TIMEOUT_KEY}=1e9"])
    monkeypatch.setenv("VERL_OFFPOLICY_GENERATION_TIMEOUT", "1e10")
    _refused([], "VERL_OFFPOLICY_GENERATION_TIMEOUT must be a number of seconds > 0, got '1e10'", f"at most {limit}")
    monkeypatch.setenv("VERL_OFFPOLICY_GENERATION_TIMEOUT", "1e9")
    compose_and_check("offpolicy_trainer", BASE)


def test_command_line_timeouts_above_the_platforms_timers_are_refused_before_anything_runs(capsys, tmp_path):
    """demo, check and doctor passed 1e10 s on to a wait that raised OverflowError."""
    import threading

    from verl_offpolicy.cli import main
    from verl_offpolicy.doctor import ProbeError, fresh_process_state

    limit = f"at most {threading.TIMEOUT_MAX:.0f}"
    out = tmp_path / "demo"
    assert main(["demo", "--timeout", "1e10", "--output-dir", str(out)]) == 2
    assert f"--timeout must be a number of seconds > 0 and {limit}" in capsys.readouterr().err and not out.exists()
    assert main(["check", "--timeout", "1e10", "--config-name", "offpolicy_trainer", *BASE]) == 1
    assert f"--timeout must be a number of seconds > 0 and {limit}" in capsys.readouterr().err
    with pytest.raises(ProbeError, match=f"{limit}.*got 1e\\+10"):  # doctor's probes: before a process starts
        fresh_process_state({}, 1e10)


@pytest.mark.parametrize(
    "override,fragment",
    [
        (
            "actor_rollout_ref.rollout.top_p=1.5",
            "actor_rollout_ref.rollout.top_p=1.5 is not valid; allowed: a number in (0, 1]",
        ),
        ("actor_rollout_ref.rollout.top_p=0", "actor_rollout_ref.rollout.top_p=0 is not valid"),
        (
            "actor_rollout_ref.rollout.temperature=0",
            "actor_rollout_ref.rollout.temperature=0 is not valid; allowed: a number > 0",
        ),
        ("actor_rollout_ref.rollout.temperature=-0.5", "actor_rollout_ref.rollout.temperature=-0.5 is not valid"),
        ("actor_rollout_ref.rollout.val_kwargs.top_p=2", "actor_rollout_ref.rollout.val_kwargs.top_p=2 is not valid"),
        (
            "actor_rollout_ref.rollout.val_kwargs.temperature=-1",
            "actor_rollout_ref.rollout.val_kwargs.temperature=-1 is not valid",
        ),
    ],
)
def test_sampling_values_the_engines_refuse_are_refused_at_startup(override, fragment):
    _refused([override], fragment)


def test_greedy_validation_and_a_reshaped_rollout_pass():
    compose_and_check(
        "offpolicy_trainer",
        [
            *BASE,
            "actor_rollout_ref.rollout.val_kwargs.temperature=0",
            "actor_rollout_ref.rollout.temperature=0.7",
            "actor_rollout_ref.rollout.top_p=0.9",
        ],
    )


# ------------------------------------------------------------------------ verl's multi-turn rollout

MULTI_TURN = "actor_rollout_ref.rollout.multi_turn"
AGENT = "actor_rollout_ref.rollout.agent"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """The tiny model's word-level tokenizers: the tool task's (it holds the words format's call token) and the
    repeat task's (it does not)."""
    from verl_offpolicy.demo.tiny import build_tokenizer

    root = tmp_path_factory.mktemp("tokenizers")
    build_tokenizer(root / "tool", task="tool")
    build_tokenizer(root / "repeat", task="repeat")
    return {task: f"actor_rollout_ref.model.tokenizer_path={root / task}" for task in ("tool", "repeat")}


def _tool_task(*extra: str) -> list[str]:
    from verl_offpolicy.demo.tool_task import TOOL_CONFIG

    return [
        f"{MULTI_TURN}.enable=true",
        f"{MULTI_TURN}.tool_config_path={TOOL_CONFIG}",
        f"{AGENT}.default_agent_loop=seeded_tool_agent",
        *extra,
    ]


def test_an_unregistered_agent_loop_is_refused_unless_its_config_declares_it(tmp_path):
    _refused(
        [f"{AGENT}.default_agent_loop=bogus"],
        f"{AGENT}.default_agent_loop='bogus' is not an agent loop",
        "tool_agent",
        "single_turn_agent",
        f"{AGENT}.agent_loop_config_path",
    )
    declared = tmp_path / "loops.yaml"
    declared.write_text("- name: bogus\n  _target_: verl.experimental.agent_loop.tool_agent_loop.ToolAgentLoop\n")
    compose_and_check(
        "offpolicy_trainer", [*BASE, f"{AGENT}.default_agent_loop=bogus", f"{AGENT}.agent_loop_config_path={declared}"]
    )


def test_the_words_format_needs_its_call_token_in_the_tokenizer(tokenizers):
    compose_and_check("offpolicy_trainer", [*BASE, *_tool_task(f"{MULTI_TURN}.format=words", tokenizers["tool"])])
    _refused(
        _tool_task(f"{MULTI_TURN}.format=words", tokenizers["repeat"]),
        f"{MULTI_TURN}.format=words needs the token '<|call|>'",
    )


def test_a_format_whose_markers_the_tokenizer_cannot_spell_is_refused(tokenizers):
    # hermes marks calls with <tool_call> ... </tool_call>: a word-level vocabulary encodes each to <unk>
    _refused(
        _tool_task(f"{MULTI_TURN}.format=hermes", tokenizers["tool"]),
        f"{MULTI_TURN}.format=hermes marks a call with '</tool_call>'",
        "cannot spell",
        "['<unk>']",
    )


def test_a_tool_agent_loop_without_tools_is_refused():
    _refused(
        _tool_task(f"{MULTI_TURN}.tool_config_path=null"),
        f"{MULTI_TURN}.tool_config_path and {MULTI_TURN}.function_tool_path are null",
        "no tool to call",
    )


@pytest.mark.parametrize("key,value", [("max_assistant_turns", 0), ("max_assistant_turns", -1), ("max_user_turns", 0)])
def test_turn_limits_below_one_are_refused(key, value):
    # verl's tool agent loop reads 0 as "no limit" and stops every trajectory after one turn at a negative bound
    _refused(_tool_task(f"{MULTI_TURN}.{key}={value}"), f"{MULTI_TURN}.{key}={value} is not valid", "null for no limit")


# ------------------------------------------------------------------------ LoRA and data files (the CPU path's guard)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from verl_offpolicy.demo.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture()
def cpu_tiny(tiny_model):
    """``+cpu=demo`` on the tiny model (merged LoRA, once LoRA is on); a passing CPU guard puts this process on the
    CPU platform (os.environ), undone afterwards."""
    import os

    environ = dict(os.environ)
    yield [
        "algorithm=opmd",
        "+cpu=demo",
        f"actor_rollout_ref.model.path={tiny_model['model_path']}",
        f"actor_rollout_ref.model.tokenizer_path={tiny_model['tokenizer_path']}",
        "actor_rollout_ref.model.lora.merge=true",
    ]
    os.environ.clear()
    os.environ.update(environ)


MODEL = "actor_rollout_ref.model"


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        # verl enables LoRA at rank > 0: a negative rank trains every parameter, silently
        ([f"{MODEL}.lora_rank=-4"], f"{MODEL}.lora_rank=-4: must be an integer"),
        ([f"{MODEL}.lora_rank=8.0"], f"{MODEL}.lora_rank=8.0: must be an integer"),
        # the adapter's update is scaled by alpha / rank
        ([f"{MODEL}.lora_rank=8", f"{MODEL}.lora_alpha=0"], f"{MODEL}.lora_alpha=0: the adapter's update is scaled"),
        (
            [f"{MODEL}.lora_rank=8", f"{MODEL}.lora_alpha=-16"],
            f"{MODEL}.lora_alpha=-16: the adapter's update is scaled",
        ),
        (
            [f"{MODEL}.lora_rank=8", f"{MODEL}.target_modules=[query,value]"],
            f"{MODEL}.target_modules=['query', 'value']: names no module of the model",
        ),
        (
            [f"{MODEL}.lora_rank=8", f"{MODEL}.lora_adapter_path=/nonexistent/adapter"],
            f"{MODEL}.lora_adapter_path='/nonexistent/adapter': must be a local folder holding a saved peft adapter",
        ),
        ([f"{MODEL}.lora_rank=8", f"{MODEL}.lora.merge=yes"], f"{MODEL}.lora.merge='yes': must be true or false"),
    ],
)
def test_lora_values_are_refused_naming_the_key(cpu_tiny, overrides, fragment):
    _refused(overrides, fragment, base=cpu_tiny)


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        ([f"{MODEL}.lora_rank=-4"], f"{MODEL}.lora_rank=-4: must be an integer"),
        ([f"{MODEL}.lora_rank=8.0"], f"{MODEL}.lora_rank=8.0: must be an integer"),
        ([f"{MODEL}.lora_rank=8", f"{MODEL}.lora_alpha=0"], f"{MODEL}.lora_alpha=0: the adapter's update is scaled"),
        ([f"{MODEL}.lora.merge=yes"], f"{MODEL}.lora.merge='yes': must be true or false"),
    ],
)
def test_lora_values_are_refused_on_gpu_configs_too(overrides, fragment):
    """Pure config, so refused on verl's stock config without the CPU overlay (a GPU cluster's command line)."""
    _refused(overrides, fragment, config_name="ppo_trainer", base=["+algorithm=opmd", *VALID_SIZES])


@pytest.mark.parametrize("case", ["target_modules", "adapter_folder"])
def test_lora_files_on_this_machine_are_checked_on_gpu_configs_too(tiny_model, tmp_path, case):
    """verl's stock config (a GPU cluster's command line) whose model folder is on this machine: target modules that
    name no module of it, or an adapter folder without peft's config, are refused as on the CPU path."""
    overrides = [f"{MODEL}.path={tiny_model['model_path']}", f"{MODEL}.lora_rank=8"]
    if case == "target_modules":
        overrides.append(f"{MODEL}.target_modules=[query,value]")
        fragment = f"{MODEL}.target_modules=['query', 'value']: names no module of the model"
    else:
        overrides.append(f"{MODEL}.lora_adapter_path={tmp_path}")
        fragment = f"{MODEL}.lora_adapter_path='{tmp_path}': is not a saved peft adapter (no adapter_config.json"
    _refused(overrides, fragment, config_name="ppo_trainer", base=["+algorithm=opmd", *VALID_SIZES])


def test_an_adapter_path_that_is_not_here_is_left_to_the_cluster_on_gpu_configs(tiny_model):
    compose_and_check(
        "ppo_trainer",
        [
            "+algorithm=opmd",
            *VALID_SIZES,
            f"{MODEL}.path={tiny_model['model_path']}",
            f"{MODEL}.lora_rank=8",
            f"{MODEL}.lora_adapter_path=/cluster/only/adapter",
            "actor_rollout_ref.rollout.name=vllm",  # verl's stock config leaves it to the script
        ],
    )


def test_lora_values_that_train_pass(cpu_tiny):
    # the tiny Llama's attention projections are q_proj ... o_proj (peft matches a name's last part)
    compose_and_check(
        "offpolicy_trainer", [*cpu_tiny, f"{MODEL}.lora_rank=8", f"{MODEL}.target_modules=[q_proj,v_proj]"]
    )


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    """The repeat task's files, and broken copies: empty, without the prompt column, a prompt that is not UTF-8
    (row 2, a string column holding the byte 0xff) and one whose prompt messages hold bytes (row 0)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl_offpolicy.demo.repeat_task import build_dataset

    root = tmp_path_factory.mktemp("data")
    files = build_dataset(root / "good")
    good = pd.read_parquet(files["train_files"])
    good.iloc[:0].to_parquet(root / "empty.parquet")
    good.drop(columns=["prompt"]).to_parquet(root / "no_prompt.parquet")
    table = pq.read_table(files["train_files"])
    texts = [b"repeat a", b"repeat b", b"\xffrepeat", *[b"repeat c"] * (table.num_rows - 3)]
    latin = pa.array(texts, type=pa.binary()).cast(pa.string(), safe=False)
    pq.write_table(table.set_column(table.column_names.index("prompt"), "prompt", latin), root / "not_utf8.parquet")
    messages = pa.array([[{"role": "user", "content": b"repeat \xe9"}]] * table.num_rows)
    pq.write_table(table.set_column(table.column_names.index("prompt"), "prompt", messages), root / "bytes.parquet")
    return {"root": root, **files}


@pytest.mark.parametrize(
    "name,fragment",
    [
        ("empty.parquet", "empty.parquet is empty (0 rows)"),
        (
            "no_prompt.parquet",
            "no_prompt.parquet has no column 'prompt' (its columns: data_source, ability, reward_model",
        ),
        ("not_utf8.parquet", "not_utf8.parquet, row 2, column 'prompt': the prompt is text that is not UTF-8"),
        ("bytes.parquet", "bytes.parquet, row 0, column 'prompt': the prompt is bytes that are not UTF-8"),
    ],
)
def test_a_training_file_verl_cannot_use_is_named_with_its_row_and_column(cpu_tiny, data_files, name, fragment):
    _refused(
        [f"data.train_files={data_files['root'] / name}", f"data.val_files={data_files['val_files']}"],
        f"data.train_files: {data_files['root']}/{fragment}",
        base=cpu_tiny,
    )


def test_a_training_file_verl_cannot_use_is_refused_on_gpu_configs_too(data_files):
    """verl's stock config without the CPU overlay (a GPU cluster's command line): a file that is on this machine
    is checked all the same."""
    _refused(
        [f"data.train_files={data_files['root'] / 'empty.parquet'}"],
        f"data.train_files: {data_files['root']}/empty.parquet is empty (0 rows)",
        config_name="ppo_trainer",
        base=["+algorithm=opmd", *VALID_SIZES],
    )


def test_a_truncation_mode_verl_does_not_know_is_refused():
    _refused(
        ["data.truncation=bogus"],
        "data.truncation='bogus' is not valid; allowed: error, left, right, middle",
        config_name="ppo_trainer",
        base=["+algorithm=opmd", *VALID_SIZES],
    )


def test_the_demos_data_files_pass(cpu_tiny, data_files):
    compose_and_check(
        "offpolicy_trainer",
        [*cpu_tiny, f"data.train_files={data_files['train_files']}", f"data.val_files={data_files['val_files']}"],
    )


# ------------------------------------------------------------------------------- doctor --address


def _serve_once(answer: bytes):
    """A loopback server that answers every connection with ``answer`` (then closes); its port, and a stop."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(30)

    def serve():
        for _ in range(2):
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server.getsockname()[1], server.close


def test_an_address_that_is_no_ray_cluster_is_named_within_seconds():
    """An HTTP server at the address: "not a Ray cluster" at once, instead of waiting the probe's whole timeout and
    blaming the node. A server that opens with an HTTP/2 SETTINGS frame (what a Ray GCS, a gRPC server, sends
    first: checked against a real GCS when this was written) passes on to the worker probe."""
    import time

    from verl_offpolicy.doctor import ProbeError, check_cluster_reachable

    port, stop = _serve_once(b"HTTP/1.0 400 Bad request\r\nServer: test\r\n\r\n")
    started = time.monotonic()
    try:
        with pytest.raises(
            ProbeError,
            match=rf"not a Ray cluster at 127.0.0.1:{port}: the server there answered "
            r"'HTTP/1.0 400 Bad request', not the gRPC",
        ):
            check_cluster_reachable(f"127.0.0.1:{port}", {})
    finally:
        stop()
    assert time.monotonic() - started < 30
    settings = bytes([0, 0, 6, 0x04, 0, 0, 0, 0, 0]) + bytes([0, 3, 0, 0, 0, 100])  # SETTINGS, stream 0, one setting
    port, stop = _serve_once(settings)
    try:
        check_cluster_reachable(f"127.0.0.1:{port}", {})
    finally:
        stop()
