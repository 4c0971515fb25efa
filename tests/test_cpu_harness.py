"""The single-process FSDP2 TrainingWorker harness: one real actor update with verl's vanilla loss."""

import pytest

from tests.cpu_harness import isolated


@pytest.mark.slow
def test_one_vanilla_update_changes_weights_in_the_advantage_direction(tmp_path):
    report = isolated("tests.cpu_harness:demo_vanilla_update", timeout=300, workdir=str(tmp_path), lr=1e-2)
    print(report)
    assert report["num_params"] > 0
    assert report["num_changed"] == report["num_params"]
    assert report["max_abs_change"] > 1e-3
    # Positive advantage: the response became more likely; negative: less likely.
    assert report["good_logp_after"] > report["good_logp_before"] + 0.1
    assert report["bad_logp_after"] < report["bad_logp_before"] - 0.1
    assert report["metrics"]["lr"] == 1e-2
    assert report["metrics"]["grad_norm"] > 0


# ------------------------------------------------------------------ the session's shared jobs (SharedJobs)


class _Jobs:
    """Jobs that report when they start and run until released, counting how many run at once."""

    def __init__(self):
        import threading

        self.lock, self.running, self.most = threading.Lock(), 0, 0
        self.started = {i: threading.Event() for i in range(10)}
        self.release = threading.Event()

    def __call__(self, i: int) -> int:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.started[i].set()
        assert self.release.wait(timeout=120)
        with self.lock:
            self.running -= 1
        return i


def test_shared_jobs_run_one_at_a_time_beside_the_tests_and_two_while_a_test_waits(tmp_path_factory):
    """The test process keeps one core busy while it runs tests: one job at a time then; a test waiting
    for a job gives its share to the jobs: two at a time. A job queued ``after`` others starts once they
    are done; jobs not started when the session ends never start."""
    import threading

    from tests.cpu_harness import SharedJobs

    runs, jobs = SharedJobs(tmp_path_factory), _Jobs()
    queued = [runs.submit(i, jobs, i) for i in range(3)]
    assert runs.submit(0, jobs, 0) is queued[0]  # once per key
    assert jobs.started[0].wait(timeout=60)
    assert not jobs.started[1].wait(timeout=1.0) and jobs.most == 1  # the test process is busy: one job
    waiter = threading.Thread(target=queued[2].result)
    waiter.start()  # a test waits: a second job starts
    assert jobs.started[1].wait(timeout=60) and jobs.most == 2
    follow_up = runs.submit("after", jobs, 3, after=[queued[0], queued[1]])
    assert not jobs.started[3].wait(timeout=0.5)
    jobs.release.set()
    waiter.join(timeout=60)
    assert [job.result() for job in queued] == [0, 1, 2] and follow_up.result() == 3
    assert jobs.most == 2
    jobs.release.clear()
    late = [runs.submit(("late", i), jobs, 4 + i) for i in range(2)]
    assert jobs.started[4].wait(timeout=60)
    closing = threading.Thread(target=runs.close)
    closing.start()
    jobs.release.set()
    closing.join(timeout=60)
    assert late[0].result() == 4
    assert not jobs.started[5].is_set() and (late[1].future.cancelled() or late[1].future.exception() is not None)
