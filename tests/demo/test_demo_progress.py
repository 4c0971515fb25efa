"""The demo's start-up phases and plain summary (verl_offpolicy.demo.progress), on lines copied from a
real demo log (verl 0.9.1, Ray, the hf rollout; colour codes as Ray prints them)."""

from verl_offpolicy.demo.progress import PHASES, StartupPhases, plain_summary

# In the order a real run printed them, with noise lines in between.
REAL_LINES = [
    "INFO:2026-11-23 16:33:06,170:Platform override from VERL_PLATFORM: cpu",
    "[validate_config] All configuration checks passed successfully!",
    "ray init kwargs: {'num_cpus': 16}",
    "2026-11-23 16:33:12,527\tINFO worker.py:2038 -- Started a local Ray instance.",
    "\x1b[36m(TaskRunnerV1 pid=19104)\x1b[0m INFO:2026-11-23 16:33:20,139:Platform override from VERL_PLATFORM: cpu",
    "\x1b[36m(TaskRunnerV1 pid=19104)\x1b[0m {'actor_rollout_ref': {'actor': {'_target_': "
    "'verl.workers.config.FSDPActorConfig',",
    "\x1b[36m(WorkerDict pid=19257)\x1b[0m INFO:2026-11-23 16:33:36,025:Platform override from VERL_PLATFORM: cpu",
    "\x1b[36m(WorkerDict pid=19257)\x1b[0m LlamaForCausalLM contains 77.12K parameters",
    "\x1b[36m(HFRolloutServer pid=19306)\x1b[0m INFO:2026-11-23 16:33:44,059:hf rollout server 0 ready: model "
    "/x/tiny/model (torch.float32), 2 threads, max_model_len 16",
    "\x1b[36m(WorkerDict pid=19257)\x1b[0m INFO:2026-11-23 16:33:44,192:hf rollout: synced 21 tensors to replica "
    "0 (global_steps=0) in 0.05s",
    "(TaskRunnerV1 pid=19104) ('Initial validation metrics: {...}')",
    "\x1b[36m(WorkerDict pid=19257)\x1b[0m INFO:2026-11-23 16:33:54,208:hf rollout: synced 21 tensors to replica "
    "0 (global_steps=1) in 0.02s",
    "(TaskRunnerV1 pid=19104) step:1 - critic/score/mean:0.109 - timing_s/step:9.87",
    "(TaskRunnerV1 pid=19104) step:2 - critic/score/mean:0.2 - timing_s/step:2.3",
]


def test_every_phase_reported_once_in_order_with_elapsed_seconds():
    phases = StartupPhases(start=100.0)
    shown = [out for i, line in enumerate(REAL_LINES) if (out := phases.feed(line, now=100.0 + i))]
    assert len(shown) == len(PHASES) == 9
    assert shown[0] == "[cpu-demo]    1.0 s  configuration composed and checked"
    assert shown[1] == "[cpu-demo]    3.0 s  Ray started (127.0.0.1)"
    assert shown[4] == "[cpu-demo]    7.0 s  model loaded in the training worker: LlamaForCausalLM, 77.12K parameters"
    assert (
        shown[6] == "[cpu-demo]    9.0 s  weights synced trainer -> rollout"
    )  # global_steps=0 only, not the step-1 sync
    assert shown[-1] == "[cpu-demo]   12.0 s  first training step done"


def test_a_phase_is_not_reported_twice():
    phases = StartupPhases(start=0.0)
    assert phases.feed(REAL_LINES[3], now=1.0) is not None
    assert phases.feed(REAL_LINES[3], now=2.0) is None


def test_plain_summary_names_rewards_validation_time_and_files():
    summary = {
        "steps": 4,
        "reward_first": 0.25,
        "reward_last": 0.5,
        "validation": {0: 0.6875, 4: 0.75},
        "timings": {"mean_step_s": 71.23, "startup_s": 88.4, "total_s": 420.0},
        "plot": "/o/reward_curve.png",
    }
    text = plain_summary(summary, log_path="/o/train.log", metrics_path="/o/metrics.jsonl")
    assert text.splitlines() == [
        "[cpu-demo] finished 4 training steps",
        "  train reward (sampled), step 1 -> last: 0.250 -> 0.500",
        "  validation reward (greedy), step 0 -> step 4: 0.688 -> 0.750",
        "  time: 71.2 s per step, start-up 88 s, 420 s in all",
        "  reward curve: /o/reward_curve.png",
        "  log: /o/train.log",
        "  metrics (verl's file logger, JSONL): /o/metrics.jsonl",
    ]
