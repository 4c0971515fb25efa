"""Bad CPU settings fail at startup, before Ray starts, with a message naming the key and what to set."""

import pytest

from tests.actor_harness import compose_cpu_config
from tests.cpu_harness import assert_named_with_fix, run_main_ppo
from verl_offpolicy.cpu.guards import CPUConfigError, check_cpu_config, required_ray_cpus, validate_cpu_config
from verl_offpolicy.demo.tiny import build_tiny

GUARD_TIMEOUT = 120  # a guard failure must be quick: no Ray, no workers


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("guard") / "tiny")


def _problems(tiny, *overrides):
    return check_cpu_config(compose_cpu_config(tiny["model_path"], tiny["tokenizer_path"], list(overrides)))


def test_overlay_is_accepted(tiny):
    assert _problems(tiny, "algorithm.adv_estimator=grpo") == []


@pytest.mark.parametrize(
    "override, key, fix",
    [
        ("actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.strategy='fsdp'", "=fsdp2"),
        (
            "actor_rollout_ref.actor.fsdp_config.strategy=fsdp",
            "actor_rollout_ref.actor.fsdp_config.strategy='fsdp'",
            "=fsdp2",
        ),
        (
            "actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2",
            "actor_rollout_ref.model.override_config.attn_implementation='flash_attention_2'",
            "attn_implementation=sdpa",
        ),
        (
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "tensor_model_parallel_size=2",
            "tensor_model_parallel_size=1",
        ),
        ("actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.name='vllm'", "rollout.name=hf"),
        (
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile=true",
            "use_torch_compile=True",
            "use_torch_compile=false",
        ),
        ("ray_kwargs.ray_init.num_cpus=2", "ray_kwargs.ray_init.num_cpus=2", "num_cpus=16"),
        (
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=16",
            "ray_kwargs.ray_init.num_cpus=16",
            "num_data_storage_units=1",
        ),
        ("ray_kwargs.ray_init.num_gpus=0", "ray_kwargs.ray_init.num_gpus=0", "num_gpus=1"),
        ("~ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM", "env_vars.VERL_PLATFORM=None", "VERL_PLATFORM=cpu"),
        (
            "~ray_kwargs.ray_init.runtime_env.env_vars.VERL_ENGINE_DEVICE",
            "env_vars.VERL_ENGINE_DEVICE=None",
            "VERL_ENGINE_DEVICE=cuda",
        ),
        # Ray's runtime_env takes strings only, and said so only after starting (a thread count given bare)
        (
            "+ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS=2",
            "env_vars.OMP_NUM_THREADS=2",
            "OMP_NUM_THREADS='2'",
        ),
        (
            "actor_rollout_ref.model.path=/nonexistent/model",
            "actor_rollout_ref.model.path='/nonexistent/model'",
            "local directory",
        ),
        ("trainer.device=cuda", "trainer.device='cuda'", "trainer.device=cpu"),
        # a rollout on its own pool: verl's naive transport only serves a colocated rollout, and the pool needs a size
        ("actor_rollout_ref.hybrid_engine=false", "checkpoint_engine.backend='naive'", "backend=cpu_mailbox"),
        ("actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=0", "rollout.nnodes=1"),
    ],
)
def test_bad_setting_is_named_with_its_fix(tiny, override, key, fix):
    assert_named_with_fix(_problems(tiny, override), key, fix)


@pytest.mark.parametrize(
    "overrides, key, fix",
    [
        # 4 prompts x 4 samples = 16 samples per step; the base overlay's micro-batches are 32 (verl asserted it
        # in the worker at the first step, after a minute of start-up)
        (
            [
                "data.train_batch_size=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.rollout.n=4",
            ],
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
            "log_prob_micro_batch_size_per_gpu=16",
        ),
        (
            [
                "data.train_batch_size=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.rollout.n=4",
            ],
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
            "ppo_micro_batch_size_per_gpu=16",
        ),
        # 8 x 16 = 128 samples, mini-batch 2 x 16 = 32: a micro-batch of 24 divides neither
        (
            [
                "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=24",
            ],
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=24",
            "ppo_micro_batch_size_per_gpu=16 (any divisor of 32)",
        ),
        # the reference model is checked where verl uses it (KL loss)
        (
            ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=48"],
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=48",
            "=32 (any divisor of 128)",
        ),
    ],
)
def test_a_micro_batch_that_does_not_divide_its_batch_is_named_with_a_size_that_does(tiny, overrides, key, fix):
    assert_named_with_fix(_problems(tiny, *overrides), key, fix)


def test_micro_batches_are_not_checked_where_verl_does_not_use_them(tiny):
    """Dynamic batch sizes split by tokens; an unused reference model is never called."""
    assert _problems(tiny, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=48") == []
    assert (
        _problems(
            tiny,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=48",
            "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=1024",
        )
        == []
    )


def test_two_training_ranks_are_accepted_and_take_two_fake_gpus(tiny):
    """``trainer.n_gpus_per_node=2``: the overlay's fake Ray GPUs follow it; a count set by hand must cover it."""
    cfg = compose_cpu_config(tiny["model_path"], tiny["tokenizer_path"], ["trainer.n_gpus_per_node=2"])
    assert check_cpu_config(cfg) == []
    assert cfg.ray_kwargs.ray_init.num_gpus == 2
    assert required_ray_cpus(cfg) == 1 + 1 + 2 * 3  # controller + 1 storage unit + two training bundles
    assert_named_with_fix(
        _problems(tiny, "trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=1"),
        "ray_kwargs.ray_init.num_gpus=1",
        "++ray_kwargs.ray_init.num_gpus=2",
    )
    # the rollout's own pool takes one more: the standalone overlay's count follows both, one set by hand is checked
    cfg = compose_cpu_config(
        tiny["model_path"], tiny["tokenizer_path"], ["trainer.n_gpus_per_node=2", "+cpu_rollout=standalone"]
    )
    assert check_cpu_config(cfg) == [] and cfg.ray_kwargs.ray_init.num_gpus == 3
    assert_named_with_fix(
        _problems(tiny, "trainer.n_gpus_per_node=2", "+cpu_rollout=standalone", "ray_kwargs.ray_init.num_gpus=2"),
        "ray_kwargs.ray_init.num_gpus=2",
        "num_gpus=3",
    )
    assert_named_with_fix(
        _problems(tiny, "trainer.n_gpus_per_node=0"), "trainer.n_gpus_per_node=0", "trainer.n_gpus_per_node=1"
    )


@pytest.mark.parametrize(
    "overrides, key, fix",
    [
        # 3 prompts x 1 sample per update cannot split over 2 ranks (verl asserts it at the first update)
        (
            [
                "trainer.n_gpus_per_node=2",
                "data.train_batch_size=3",
                "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                "actor_rollout_ref.rollout.n=1",
            ],
            "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            "split evenly over the 2",
        ),
        # 4 x 4 = 16 samples per step are 8 per rank: a micro-batch of 16 does not divide them
        (
            [
                "trainer.n_gpus_per_node=2",
                "data.train_batch_size=4",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            ],
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "=8 (any divisor of 8)",
        ),
    ],
)
def test_batch_sizes_that_do_not_split_over_two_ranks_are_named(tiny, overrides, key, fix):
    assert_named_with_fix(_problems(tiny, *overrides), key, fix)


def test_required_cpus_counts_transfer_queue_and_placement_groups(tiny):
    cfg = compose_cpu_config(tiny["model_path"], tiny["tokenizer_path"])
    assert required_ray_cpus(cfg) == 1 + 1 + 3  # controller + 1 storage unit + one training bundle
    with pytest.raises(CPUConfigError, match="cannot run on verl's CPU path"):
        validate_cpu_config(
            compose_cpu_config(tiny["model_path"], tiny["tokenizer_path"], ["ray_kwargs.ray_init.num_cpus=3"])
        )


def test_standalone_rollout_overlay_is_complete_and_counted(tiny):
    """``+cpu_rollout=standalone`` sets everything a rollout on its own pool needs; its bundle reserves 2 CPUs
    and it takes one more fake Ray GPU (literal counts from verl's replica.py: max_colocate_count=2)."""
    cfg = compose_cpu_config(tiny["model_path"], tiny["tokenizer_path"], ["+cpu_rollout=standalone"])
    assert check_cpu_config(cfg) == []
    assert required_ray_cpus(cfg) == 1 + 1 + 3 + 2  # controller + 1 storage unit + training bundle + rollout bundle
    problems = check_cpu_config(
        compose_cpu_config(
            tiny["model_path"], tiny["tokenizer_path"], ["+cpu_rollout=standalone", "ray_kwargs.ray_init.num_gpus=1"]
        )
    )
    assert any("num_gpus=1" in p and "num_gpus=2" in p for p in problems), problems
    # two replicas on the rollout's pool: a fake GPU (the overlay's count follows) and a bundle of 2 CPUs each
    cfg = compose_cpu_config(
        tiny["model_path"],
        tiny["tokenizer_path"],
        ["+cpu_rollout=standalone", "actor_rollout_ref.rollout.n_gpus_per_node=2"],
    )
    assert check_cpu_config(cfg) == [] and cfg.ray_kwargs.ray_init.num_gpus == 1 + 2
    assert required_ray_cpus(cfg) == 1 + 1 + 3 + 2 * 2


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["actor_rollout_ref.actor.strategy=fsdp"], "actor_rollout_ref.actor.strategy='fsdp'"),
        (
            ["transfer_queue.backend.SimpleStorage.num_data_storage_units=8", "ray_kwargs.ray_init.num_cpus=4"],
            "wait forever",
        ),
    ],
)
@pytest.mark.slow  # a fresh main_ppo process imports verl
def test_main_ppo_exits_before_ray_with_the_message(tiny, overrides, expected):
    rc, output, seconds = run_main_ppo(
        [
            "+cpu=demo",
            f"actor_rollout_ref.model.path={tiny['model_path']}",
            f"actor_rollout_ref.model.tokenizer_path={tiny['tokenizer_path']}",
            "algorithm.adv_estimator=grpo",
            *overrides,
        ],
        timeout=GUARD_TIMEOUT,
    )
    assert rc == 1, output[-3000:]
    assert "verl-offpolicy:" in output and expected in output, output[-3000:]
    assert "ray init kwargs" not in output  # main_ppo never reached ray.init
    assert seconds < GUARD_TIMEOUT


@pytest.mark.slow  # a fresh process imports verl
def test_worker_without_cpu_platform_gets_the_fix_in_its_error():
    from tests.cpu_harness import isolated

    message = isolated("tests.scenario_platform:adapter_outside_cpu_platform", timeout=120, cpu=False)
    assert "VERL_PLATFORM=cpu" in message
    assert "+ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM=cpu" in message


def test_missing_loopback_environment_is_warned_with_the_variable(monkeypatch, caplog):
    from verl_offpolicy.cpu.guards import warn_if_not_loopback
    from verl_offpolicy.cpu.platform import LOOPBACK_ENV

    ((key, value),) = LOOPBACK_ENV.items()
    monkeypatch.delenv(key, raising=False)
    with caplog.at_level("WARNING", logger="verl_offpolicy"):
        assert warn_if_not_loopback() is True
    assert f"{key}={value}" in caplog.text
    caplog.clear()
    monkeypatch.setenv(key, value)
    with caplog.at_level("WARNING", logger="verl_offpolicy"):
        assert warn_if_not_loopback() is False
    assert caplog.text == ""


@pytest.mark.parametrize(
    "address, loopback",
    [
        ("127.0.0.1:8265 (gcs_server)", True),
        ("::ffff:127.0.0.1:41945 (raylet)", True),
        ("::1:5000 (python)", True),
        ("0.0.0.0:44227 (python)", False),
        ("192.0.2.2:55105 (ray::TransferQueue)", False),
        (":::41971 (raylet)", False),
    ],
)
def test_is_loopback_reads_psutil_addresses(address, loopback):
    from verl_offpolicy.cpu.platform import is_loopback

    assert is_loopback(address) is loopback


def test_joining_an_existing_cluster_leaves_its_sizing_to_the_nodes(tiny):
    """``ray_kwargs.ray_init.address`` (demo --ray-address): Ray refuses num_cpus/num_gpus when connecting, the
    cluster's nodes decide; trainer.nnodes may exceed 1 there, not on a cluster the run starts itself."""
    from verl_offpolicy.demo.cluster import join_overrides

    joined = join_overrides("127.0.0.1:6379")
    assert _problems(tiny, *joined) == []
    assert _problems(tiny, *joined, "trainer.nnodes=2") == []
    assert_named_with_fix(
        _problems(tiny, *joined[:1], "ray_kwargs.ray_init.num_cpus=null"),
        "ray_kwargs.ray_init.num_gpus=1",
        "ray_kwargs.ray_init.num_gpus=null",
    )
    assert_named_with_fix(_problems(tiny, "trainer.nnodes=2"), "trainer.nnodes=2", "cluster start")


def test_a_joining_runs_worker_environment_reaches_ray_as_strings(tiny):
    """On an existing cluster the workers inherit its raylets' environment: the run's file-logger path and
    HF_HUB_OFFLINE go through runtime_env, whose values Ray wants as strings (a bare 1 became an int)."""
    from verl_offpolicy.demo.cluster import join_overrides, worker_env_overrides

    env = {"VERL_FILE_LOGGER_PATH": "/tmp/it's here/metrics.jsonl", "HF_HUB_OFFLINE": "1", "OTHER": "x"}
    cfg = compose_cpu_config(
        tiny["model_path"], tiny["tokenizer_path"], join_overrides("127.0.0.1:1") + worker_env_overrides(env)
    )
    env_vars = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert (env_vars.VERL_FILE_LOGGER_PATH, env_vars.HF_HUB_OFFLINE, "OTHER" in env_vars) == (
        env["VERL_FILE_LOGGER_PATH"],
        "1",
        False,
    )
