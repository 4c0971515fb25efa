"""What a finished demo run reports (verl_offpolicy.demo.results) and its per-step console line
(verl_offpolicy.demo.progress.progress_line), on a metrics file in verl's FileLogger format
(one JSON record per line: {"step": n, "data": {...}}; a step may be logged more than once)."""

import json
import math

from verl_offpolicy.demo.launch import failure_message
from verl_offpolicy.demo.progress import progress_line
from verl_offpolicy.demo.results import (
    missing_steps,
    read_metrics,
    rollout_vs_trainer_gap,
    run_timings,
    training_metrics,
    validation_rewards,
)

VAL = "val-aux/verl_offpolicy/repeat/reward/mean@1"
RECORDS = [
    {"step": 0, "data": {VAL: 0.05, "val-core/verl_offpolicy/repeat/acc/mean@1": 0.05}},  # before training
    {"step": 1, "data": {"critic/score/mean": 0.1, "timing_s/step": 10.0}},
    {"step": 1, "data": {"training/rollout_probs_diff_max": 0.002, "training/rollout_probs_diff_mean": 0.001}},
    {
        "step": 2,
        "data": {
            "critic/score/mean": 0.3,
            "timing_s/step": 4.0,
            VAL: 0.5,
            "training/rollout_probs_diff_max": 0.004,
            "training/rollout_probs_diff_mean": 0.003,
        },
    },
]


def _metrics_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n\n")
    return path


def test_steps_are_merged_and_validation_read_per_step(tmp_path):
    by_step = read_metrics(_metrics_file(tmp_path))
    assert sorted(by_step) == [0, 1, 2]
    metrics = training_metrics(by_step)  # step 0 holds no train score
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[0]["training/rollout_probs_diff_max"] == 0.002  # the second record of step 1 merged in
    assert validation_rewards(by_step) == {0: 0.05, 2: 0.5}
    assert read_metrics(tmp_path / "missing.jsonl") == {}


def test_a_step_checkpointed_before_an_interrupt_but_never_logged_is_told_apart_from_a_missing_one():
    """Steps 1, 3, 4 logged, 5 steps run: step 2 is "unlogged" if this run resumed after a checkpoint at or past
    it (an earlier run trained it, then stopped between verl's save and its log), else "missing" (an error)."""
    logged = [{"step": s} for s in (1, 3, 4)]
    assert missing_steps(logged, 5, resumed=2) == ([2], [5])
    assert missing_steps(logged, 5, resumed=1) == ([], [2, 5])
    assert missing_steps(logged, 5) == ([], [2, 5])
    assert missing_steps(logged + [{"step": 5}], 5, resumed=3) == ([2], [])


def test_timings_and_rollout_gap(tmp_path):
    metrics = training_metrics(read_metrics(_metrics_file(tmp_path)))
    # start-up: launch -> end of step 1 (30 s) minus step 1 itself (10 s)
    timings = run_timings(metrics, total_s=50.123, subprocess_s=45.678, first_step_s=30.0)
    assert timings == {"total_s": 50.12, "subprocess_s": 45.68, "mean_step_s": 7.0, "startup_s": 20.0}
    assert "startup_s" not in run_timings(metrics, total_s=1, subprocess_s=1, first_step_s=None)
    assert math.isnan(run_timings([], total_s=1, subprocess_s=1, first_step_s=None)["mean_step_s"])
    assert rollout_vs_trainer_gap(metrics) == {"rollout_probs_diff_max": 0.004, "rollout_probs_diff_mean": 0.002}
    assert rollout_vs_trainer_gap([{"step": 1}]) == {}


def test_progress_line_of_verls_step_line():
    line = (
        "(TaskRunnerV1 pid=19104) step:3 - actor/pg_loss:np.float64(-0.0123456) - critic/score/mean:0.109375 - "
        f"timing_s/step:2.4956220470 - training/rollout_probs_diff_max:0.00012345 - {VAL}:0.75"
    )
    assert (
        progress_line(line)
        == "[cpu-demo] step 3: reward=0.1094 step_s=2.496 pg_loss=-0.01235 |p_rollout-p_actor|max=0.0001234 val=0.75"
    )
    assert progress_line("ValueError: bad key") == "[cpu-demo] ValueError: bad key"
    assert progress_line("UserWarning: FutureWarning: something") is None
    assert progress_line("INFO: nothing to see") is None


def test_a_step_of_several_generation_rounds_says_so_on_its_console_line():
    """DAPO's group filter regenerating for a batch (verl's console prints its rounds metric): the step's one
    line says how many rounds; one round adds nothing."""
    line = "(TaskRunnerV1 pid=7) step:4 - critic/score/mean:0.5 - offpolicy/filter_groups/gen_rounds:{}"
    assert progress_line(line.format("np.float64(3.0)")) == (
        "[cpu-demo] step 4: reward=0.5 (3 generation rounds: groups with one reward on every sample dropped and "
        "regenerated)"
    )
    assert progress_line(line.format("1.0")) == "[cpu-demo] step 4: reward=0.5"


def test_an_error_repeated_by_every_request_in_flight_is_shown_once():
    """A dead Ray actor fails each request in flight with the same error (ids and counts aside): one console line."""
    seen: set[str] = set()
    first = "ray.exceptions.ActorDiedError: The actor 8dfe4d90 died (request 17)"
    assert progress_line(first, seen) == f"[cpu-demo] {first}"
    assert progress_line("ray.exceptions.ActorDiedError: The actor 1968e95a died (request 18)", seen) is None
    assert progress_line("ValueError: another cause", seen) == "[cpu-demo] ValueError: another cause"


# The end of train.log of a demo whose hf rollout server was SIGKILLed mid-run (Ray's report, tabs as Ray writes it).
DEAD_SERVER_LOG = """Traceback (most recent call last):
ray.exceptions.RayTaskError(ActorDiedError): ray::TaskRunnerV1.run() (pid=6637, ip=127.0.0.1)
ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.
\tclass_name: HFRolloutServer
\tactor_id: 8dfe4d9031b77254ac20a0bc01000000
\tpid: 6959
\tname: hf_server_0_0
\tnamespace: 89216535-4c0d-4199-bf0b-594decb08b87
\tip: 127.0.0.1
The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker \
unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the process was killed
"""


def test_a_run_ended_by_a_dead_actor_names_it_in_one_line(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(DEAD_SERVER_LOG)
    message = failure_message(1, log)
    assert message.startswith(
        "main_ppo exited with status 1: the Ray actor hf_server_0_0 (HFRolloutServer, pid 6959) died: "
    )
    assert "Worker unexpectedly exits with a connection error code 2." in message and f"traceback: {log}" in message
    assert "\n" not in message
    log.write_text("Traceback (most recent call last):\nValueError: bad key\n")
    assert (
        failure_message(2, log)
        == f"main_ppo exited with status 2; end of {log}:\nTraceback (most recent call last):\nValueError: bad key"
    )
