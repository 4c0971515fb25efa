"""Test helpers and scenarios of the CPU path (the engine pieces live in tests/actor_harness.py).

- :class:`ActorHarness` / :func:`run_isolated`: a real single-process FSDP2 ``TrainingWorker`` and a
  runner that executes ``module:function`` in a fresh ``VERL_PLATFORM=cpu`` process with a timeout.
- :func:`run_main_ppo`: stock ``python -m verl.trainer.main_ppo`` with a timeout (process group
  killed on timeout), for startup-guard tests.
- Functions meant to run inside :func:`run_isolated` (their results are JSON).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from tests.actor_harness import ActorHarness, IsolatedRunError, run_isolated  # noqa: F401
from verl_offpolicy.demo.process import run_captured
from verl_offpolicy.cpu.platform import CPU_ENV, LOOPBACK_ENV

REPO_ROOT = Path(__file__).resolve().parents[1]

# Demo overrides of the end-to-end tests: no validation, 4 prompts x 4 samples per step (the demo's default is 8 x 16).
NO_VALIDATION = ["trainer.val_before_train=false", "trainer.test_freq=-1"]
SMALL_DEMO = NO_VALIDATION + [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
]


PRIMARY_CONFIG = "offpolicy_trainer"
SCHEDULED_STEPS = 6  # steps of the scheduler's shared runs: (4, 1) trains its first new version at step 6
SHARED_RUN_TIMEOUT = 600
STANDALONE = ["+cpu_rollout=standalone"]  # the overlapped mode's rollout on its own worker


def schedule(s: int, d: int) -> list[str]:
    """The overrides of ``sync_interval = s``, ``sync_offset = d``."""
    return [f"algorithm.offpolicy.sync_interval={s}", f"algorithm.offpolicy.sync_offset={d}"]


def opmd_overrides(s: int, d: int, mode: str) -> list[str]:
    """The overrides of the scheduler's small ``opmd`` runs at (s, d): 4 prompts x 4 samples, no
    validation; ``mode`` is ``colocated`` or ``overlapped`` (the standalone rollout)."""
    assert mode in ("colocated", "overlapped"), mode
    return SMALL_DEMO + schedule(s, d) + (STANDALONE if mode == "overlapped" else [])


def opmd_run(demo_runs, s: int, d: int, mode: str, extra: Sequence[str] = ()):
    """The future of the ``opmd`` run at (s, d) of the scheduler's and the overlapped mode's tests (one
    per mode and setting, shared through :class:`DemoRuns`): :func:`opmd_overrides` + ``extra``, 6
    steps, on our primary config."""
    overrides = opmd_overrides(s, d, mode) + list(extra)
    return demo_runs.start("opmd", SCHEDULED_STEPS, overrides, PRIMARY_CONFIG, SHARED_RUN_TIMEOUT, name=f"opmd_{mode}_s{s}d{d}")


def dumped_batches(rollout_dir: Path, steps) -> dict[int, list[tuple]]:
    """Per step, the trained samples as sorted (prompt, response, score) from verl's rollout dumps
    (``trainer.rollout_data_dir``). Uids are left out: they are uuid4, new in every run; the content is
    what must match between runs."""
    out = {}
    for step in steps:
        rows = [json.loads(line) for line in (Path(rollout_dir) / f"{step}.jsonl").read_text().splitlines()]
        out[step] = sorted((r["input"], r["output"], r["score"]) for r in rows)
    return out


def dumped_uid_groups(rollout_dir: Path, steps) -> set[str]:
    """The prompt groups (uid prefixes) trained in ``steps``, from verl's rollout dumps."""
    return {
        json.loads(line)["uid"].split("_")[0]
        for step in steps
        for line in (Path(rollout_dir) / f"{step}.jsonl").read_text().splitlines()
    }


def demo_run_command(out: Path, preset: str, steps: int, overrides: Sequence[str], config_name: Optional[str] = None) -> list[str]:
    """The ``main_ppo`` command of a demo run in ``out`` (seed 0, verl's rollout dumps in ``out/rollouts``)
    with a Ray session dir of its own: what :func:`run_resumed` starts."""
    from verl_offpolicy.demo.command import DEFAULT_CONFIG_NAME, build_inputs, demo_command

    out.mkdir(parents=True, exist_ok=True)
    return demo_command(
        build_inputs(out, seed=0), output_dir=out, preset=preset, steps=steps, seed=0,
        overrides=[*overrides, f"trainer.rollout_data_dir={out / 'rollouts'}"],
        config_name=config_name or DEFAULT_CONFIG_NAME, ray_temp_dir=tempfile.mkdtemp(prefix="vo-ray-", dir="/tmp"),
    )


class SharedJobs:
    """The session's long jobs, shared by the end-to-end tests of every module (:meth:`submit`: doctor, a
    resumed run; :class:`DemoRuns` adds demo runs). conftest queues the jobs that the selected tests will
    ask for at the session's start (a module's ``SHARED_JOBS``), and runs the end-to-end tests last: the
    jobs run in the background while the rest of the suite runs in the test process. A run keeps about one of two cores busy (its start-up is a
    chain of processes importing verl one after the other), and so does the test process: while it runs
    tests, ``parallel - 1`` jobs go at once; while it waits for a job (:meth:`SharedJob.result`),
    ``parallel``. A job that failed raises the same error for every test that asks for it, without being
    run twice.

    Every job starts from the environment of the session's start (:attr:`environ`) plus what it names
    itself, never from ``os.environ`` of the moment: tests change it (``monkeypatch.setenv``) while jobs run.
    """

    def __init__(self, tmp_path_factory, parallel: int = 2):
        from concurrent.futures import ThreadPoolExecutor

        self.environ = dict(os.environ)
        self._tmp = tmp_path_factory
        self._pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="shared-job")
        self._jobs: dict[Any, Any] = {}
        self._lock = threading.Lock()
        self._parallel = parallel
        self._slots = threading.Condition()
        self._running = 0  # jobs under way
        self._waiting = 0  # test-process threads waiting for a job
        self._closing = False

    def _gated(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` that starts only while fewer jobs run than the test process leaves room for."""

        def run(*args: Any, **kwargs: Any) -> Any:
            with self._slots:
                self._slots.wait_for(
                    lambda: self._closing or self._running < (self._parallel if self._waiting else max(1, self._parallel - 1))
                )
                if self._closing:
                    raise RuntimeError("the test session ended before this shared job started")
                self._running += 1
            try:
                return fn(*args, **kwargs)
            finally:
                with self._slots:
                    self._running -= 1
                    self._slots.notify_all()

        return run

    def wait(self, future: Any) -> Any:
        """``future.result()``; while it waits, the test process's share of the machine goes to the jobs."""
        if future.done():
            return future.result()
        with self._slots:
            self._waiting += 1
            self._slots.notify_all()
        try:
            return future.result()
        finally:
            with self._slots:
                self._waiting -= 1

    def submit(self, key: Any, fn: Callable[..., Any], *args: Any, after: Sequence[Any] = (), **kwargs: Any):
        """Queue ``fn(*args, **kwargs)`` once per ``key``; returns its :class:`SharedJob`. A job with
        ``after`` (other jobs) enters the queue once they are all done, so it never holds a slot waiting."""
        from concurrent.futures import Future

        fn = self._gated(fn)
        with self._lock:
            if key in self._jobs:
                return self._jobs[key]
            if not after:
                self._jobs[key] = SharedJob(self, self._pool.submit(fn, *args, **kwargs))
                return self._jobs[key]
            outer: Future = Future()
            self._jobs[key] = SharedJob(self, outer)
        pending = [getattr(dep, "future", dep) for dep in after]
        remaining = [len(pending)]

        def forward(inner) -> None:
            if inner.cancelled():
                outer.cancel()
            elif inner.exception() is not None:
                outer.set_exception(inner.exception())
            else:
                outer.set_result(inner.result())

        def one_done(_) -> None:
            with self._lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            try:
                inner = self._pool.submit(fn, *args, **kwargs)
            except RuntimeError:  # the pool is shut down (the session ends)
                outer.cancel()
                return
            inner.add_done_callback(forward)

        for dep in pending:
            dep.add_done_callback(one_done)
        return self._jobs[key]

    def tmp_dir(self, name: str) -> Path:
        """A new directory of the session's temp dir for a job's files."""
        return self._tmp.mktemp(name)

    def close(self) -> None:
        """Drop the jobs not started yet and wait for those under way (each ends within its timeout)."""
        with self._slots:
            self._closing = True
            self._slots.notify_all()
        self._pool.shutdown(wait=True, cancel_futures=True)


class DemoRuns(SharedJobs):
    """:class:`SharedJobs` and demo runs (:func:`verl_offpolicy.demo.run.run_demo`, seed 0, verl's rollout
    dumps in ``<out>/rollouts``; one per distinct preset, steps, overrides, config and environment)."""

    def __init__(self, tmp_path_factory, parallel: int = 2):
        from verl_offpolicy.demo.run import run_demo

        super().__init__(tmp_path_factory, parallel)
        self._run_demo = run_demo  # bound now: a test may monkeypatch the module's attribute while jobs run

    def start(
        self, preset: str, steps: int, overrides: Sequence[str], config_name: str, timeout: float, name: str = "run",
        plot: bool = False, env: Optional[dict[str, str]] = None, console: bool = False,
    ) -> QueuedRun:
        """Queue the demo run (once per configuration). ``env``: variables set on top of :attr:`environ`;
        ``console``: keep the run's console lines (``run_demo(stream=...)``) in :attr:`QueuedRun.console`."""
        import io

        env = dict(env or {})
        key = ("run", preset, steps, tuple(overrides), config_name, plot, tuple(sorted(env.items())), console)
        with self._lock:
            if key in self._jobs:
                return self._jobs[key]
        out, stream = self.tmp_dir(name), io.StringIO() if console else None
        job = self.submit(
            ("job",) + key, self._run_demo, preset=preset, steps=steps, seed=0, output_dir=out, timeout=timeout,
            overrides=[*overrides, f"trainer.rollout_data_dir={out / 'rollouts'}"], config_name=config_name,
            stream=stream or False, plot=plot, env={**self.environ, **env},
        )
        with self._lock:
            self._jobs[key] = QueuedRun(self, job.future, out, stream)
            return self._jobs[key]


@dataclass(frozen=True)
class SharedJob:
    """A job queued in :class:`SharedJobs` and its future."""

    owner: SharedJobs
    future: Any

    def result(self):
        """Wait for the job (:meth:`SharedJobs.wait`); its result, or its error raised."""
        return self.owner.wait(self.future)


@dataclass(frozen=True)
class QueuedRun(SharedJob):
    """A demo run queued in :class:`DemoRuns`: also its output directory (known at once) and the stream
    that receives its console lines if they are kept. ``result()``: its
    :class:`~verl_offpolicy.demo.results.DemoResult`."""

    output_dir: Path = None
    console: Optional[Any] = None


def checkpoint_of(result, step: int) -> Path:
    """The ``global_step_<step>`` checkpoint a demo run saved (``trainer.save_freq``): the checkpoint an
    interruption right after that step would leave, since verl writes the tracker file
    (``latest_checkpointed_iteration.txt``) only once a checkpoint is complete."""
    checkpoint = Path(result.output_dir) / "checkpoints" / f"global_step_{step}"
    tracker = checkpoint.parent / "latest_checkpointed_iteration.txt"
    assert checkpoint.is_dir() and tracker.exists(), f"no complete step-{step} checkpoint in {checkpoint.parent}"
    return checkpoint


def run_resumed(
    command: Sequence[str], out: Path, timeout: float, env: Optional[dict[str, str]] = None
) -> tuple[str, dict[int, dict[str, Any]]]:
    """Run a resumed demo ``command`` to the end (log ``out/train.log``, metrics ``out/metrics.jsonl``;
    its Ray session dir removed afterwards), from ``env`` (default: this process's environment); assert it
    exited 0 and return (log text, metrics by step)."""
    import shutil

    from verl_offpolicy.demo.environment import cpu_env
    from verl_offpolicy.demo.launch import run_subprocess
    from verl_offpolicy.demo.results import read_metrics

    ray_dir = _ray_temp_dir(command)
    try:
        returncode, _, _ = run_subprocess(
            command, env=cpu_env(out / "metrics.jsonl", base=env), log_path=out / "train.log",
            timeout=timeout, ray_marker=ray_dir, cwd=str(out),
        )
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    log = (out / "train.log").read_text(errors="replace")
    assert returncode == 0, log[-4000:]
    return log, read_metrics(out / "metrics.jsonl")


def start_resumed(
    demo_runs: DemoRuns, reference: QueuedRun, step: int, preset: str, steps: int, overrides: Sequence[str],
    config_name: str, timeout: float, name: str,
):
    """Queue a run that resumes ``reference``'s configuration (``overrides``, without its checkpointing) from
    its step-``step`` checkpoint, once ``reference`` is done; its future gives (output dir, log, metrics by
    step) (:func:`run_resumed`)."""

    def job():
        out = demo_runs.tmp_dir(name) / "resumed"
        checkpoint = checkpoint_of(reference.result(), step)
        command = demo_run_command(out, preset, steps, [*overrides, *resume_overrides(checkpoint)], config_name)
        return (out, *run_resumed(command, out, timeout, env=demo_runs.environ))

    return demo_runs.submit(("resumed", name), job, after=[reference])


def resume_overrides(checkpoint: Path) -> list[str]:
    """Overrides that resume a demo run from ``checkpoint`` (a ``global_step_<k>`` dir) and save nothing more."""
    return [
        f"trainer.default_local_dir={checkpoint.parent}",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={checkpoint}",
        "trainer.save_freq=-1",
    ]


def _ray_temp_dir(command: Sequence[str]) -> str:
    """The Ray session dir a demo command was built with (``demo_command(..., ray_temp_dir=...)``)."""
    for arg in command:
        if arg.startswith("+ray_kwargs.ray_init._temp_dir=") or arg.startswith("ray_kwargs.ray_init._temp_dir="):
            return arg.split("=", 1)[1]
    raise ValueError("the command has no Ray temp dir: build it with demo_command(..., ray_temp_dir=...)")


def isolated(target: str, timeout: float = 300.0, cpu: bool = True, **kwargs: Any) -> Any:
    """:func:`run_isolated` for functions of this module (``tests.cpu_harness:<fn>``), from the repo root."""
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)  # `python -c` puts the cwd first on sys.path: our `tests`, not verl's
    try:
        return run_isolated(target, kwargs, timeout=timeout, cpu=cpu)
    finally:
        os.chdir(cwd)


def run_main_ppo(
    args: Sequence[str], timeout: float = 120.0, env: Optional[dict[str, str]] = None, cpu_env: bool = True
) -> tuple[int, str, float]:
    """Run ``python -m verl.trainer.main_ppo <args>``; return (exit code, output, seconds).

    The process runs in its own session and is killed (whole group) if it exceeds ``timeout``.
    """
    run_env = dict(os.environ if env is None else env)
    if cpu_env:
        run_env.update(CPU_ENV)
        run_env.update(LOOPBACK_ENV)
    run_env.setdefault("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vo-main-ppo-") as tmp:
        returncode, output = run_captured(
            [sys.executable, "-m", "verl.trainer.main_ppo", *args, f"hydra.run.dir={tmp}"], env=run_env, timeout=timeout, cwd=tmp
        )
        if returncode is None:
            raise AssertionError(f"main_ppo did not exit within {timeout}s (a hang); output:\n{output[-3000:]}")
    return returncode, output, time.monotonic() - start


# ----------------------------------------------------------------------------------------------
# Run inside run_isolated (fresh VERL_PLATFORM=cpu process)
# ----------------------------------------------------------------------------------------------


def _server(model_path: str, tokenizer_path: str, overrides: Sequence[str] = ()):
    from verl.workers.rollout.replica import RolloutMode
    from tests.actor_harness import compose_cpu_config
    from verl_offpolicy.cpu.hf_server import HFRolloutServer

    cfg = compose_cpu_config(model_path, tokenizer_path, overrides)
    server = HFRolloutServer(
        config=cfg.actor_rollout_ref.rollout,
        model_config=cfg.actor_rollout_ref.model,
        rollout_mode=RolloutMode.HYBRID,
        replica_rank=0,
    )
    return server, cfg


def rollout_server_semantics(workdir: str) -> dict[str, Any]:
    """Greedy/sampled generation of the hf server against an independent transformers forward pass."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl_offpolicy.demo.tiny import build_tiny

    paths = build_tiny(Path(workdir) / "tiny")
    server, cfg = _server(paths["model_path"], paths["tokenizer_path"])
    tok = server.model_config.tokenizer
    reference = AutoModelForCausalLM.from_pretrained(paths["model_path"], attn_implementation="sdpa").eval()

    def prompt(text: str) -> list[int]:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    prompts = [prompt("repeat c"), prompt("repeat a b"), prompt("repeat")]

    def teacher_forced(prompt_ids: list[int], response: list[int], temperature: float) -> list[float]:
        ids = torch.tensor([prompt_ids + response])
        with torch.no_grad():
            logits = reference(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        scale = temperature if temperature > 0 else 1.0
        lp = torch.log_softmax(logits / scale, dim=-1)
        return lp.gather(1, torch.tensor(response)[:, None]).squeeze(1).tolist()

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        greedy = {"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True}
        # Concurrent requests (batched by the server, different prompt lengths = left padding) ...
        batched = await asyncio.gather(
            *[server.generate(p, dict(greedy, max_tokens=6), request_id=f"g{i}") for i, p in enumerate(prompts)]
        )
        # ... equal one-at-a-time requests.
        single = [await server.generate(p, dict(greedy, max_tokens=6), request_id=f"s{i}") for i, p in enumerate(prompts)]
        out["batched_equals_single"] = [b.token_ids for b in batched] == [s.token_ids for s in single]
        # Greedy = argmax of the reference model, step by step.
        greedy_ok = True
        for p, o in zip(prompts, single, strict=True):
            ids = list(p)
            for t in o.token_ids:
                with torch.no_grad():
                    nxt = int(reference(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
                greedy_ok &= nxt == t
                ids.append(t)
        out["greedy_is_argmax"] = greedy_ok
        out["max_tokens_respected"] = all(len(o.token_ids) <= 6 for o in single)
        out["stop_reasons"] = sorted({o.stop_reason for o in single})
        out["global_steps"] = single[0].extra_fields.get("global_steps")
        # Sampled log-probs = log_softmax(logits / T) of the reference, for T = 0.7 and 1.0.
        diffs = {}
        for temperature in (0.7, 1.0):
            params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 8}
            samples = await asyncio.gather(
                *[server.generate(p, dict(params), request_id=f"t{temperature}-{i}") for i, p in enumerate(prompts * 4)]
            )
            worst = 0.0
            for p, s in zip(prompts * 4, samples, strict=True):
                ref = teacher_forced(p, s.token_ids, temperature)
                worst = max(worst, max(abs(a - b) for a, b in zip(ref, s.log_probs, strict=True)))
            diffs[str(temperature)] = worst
        out["sampled_logprob_max_diff"] = diffs
        # top_k=1 is greedy whatever the temperature; logprobs=False returns None.
        topk1 = await server.generate(prompts[0], {"temperature": 1.5, "top_k": 1, "max_tokens": 6}, request_id="k1")
        out["top_k1_is_greedy"] = topk1.token_ids == single[0].token_ids
        out["no_logprobs_when_not_asked"] = topk1.log_probs is None
        # A weight update that misses parameters is refused; a full one tags global_steps.
        state = {k: v.clone() for k, v in reference.state_dict().items()}
        await server.update_weights_chunk(list(state.items())[:3])
        try:
            await server.finish_weight_update(global_steps=7)
            out["partial_update_refused"] = False
        except RuntimeError as exc:
            out["partial_update_refused"] = "did not cover" in str(exc)
        for name in state:
            state[name] = state[name] * 0.5
        await server.update_weights_chunk(list(state.items()))
        await server.finish_weight_update(global_steps=7)
        after = await server.generate(prompts[0], dict(greedy, max_tokens=6), request_id="after")
        out["global_steps_after_update"] = after.extra_fields.get("global_steps")
        new_ref = AutoModelForCausalLM.from_pretrained(paths["model_path"], attn_implementation="sdpa").eval()
        new_ref.load_state_dict(state)
        ids = list(prompts[0])
        ok = True
        for t in after.token_ids:
            with torch.no_grad():
                ok &= int(new_ref(input_ids=torch.tensor([ids])).logits[0, -1].argmax()) == t
            ids.append(t)
        out["generation_uses_new_weights"] = ok
        # Abort: a parked request comes back aborted and empty when rejecting.
        await server.abort_all_requests(reject_request=True)
        rejected = await server.generate(prompts[0], dict(greedy), request_id="rej")
        out["rejected_while_paused"] = rejected.stop_reason == "aborted" and rejected.token_ids == []
        await server.resume_generation()
        resumed = await server.generate(prompts[0], dict(greedy, max_tokens=6), request_id="res")
        out["serves_after_resume"] = resumed.token_ids == after.token_ids
        return out

    return asyncio.run(run())


def rollout_vs_trainer_after_sync(workdir: str, temperature: float = 0.7, num_prompts: int = 8) -> dict[str, Any]:
    """Real weight sync (trainer engine -> adapter -> Ray server), then compare log-probs.

    The trainer (FSDP2 TrainingWorker) is updated once so its weights differ from the checkpoint the
    rollout server loaded; the adapter streams ``engine.get_per_tensor_param()`` to the server as
    verl's colocated ``update_weights(mode="naive")`` does; the server samples responses with
    log-probs at ``temperature``; the trainer recomputes log-probs of the same tokens.
    """
    import ray
    import torch

    from verl.workers.rollout.replica import RolloutMode
    from verl_offpolicy.cpu.hf_server import HFRolloutServer, server_actor_name
    from verl_offpolicy.cpu.rollout import HFServerAdapter

    harness = ActorHarness.create(
        workdir, lr=5e-2, overrides=[f"actor_rollout_ref.rollout.temperature={temperature}"]
    )
    tok = harness.tokenizer
    symbols = list("abcdefgh")[:num_prompts]
    prompts = []
    for s in symbols:
        ids = tok.apply_chat_template([{"role": "user", "content": f"repeat {s}"}], add_generation_prompt=True, tokenize=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    # Move the trainer away from the checkpoint: one vanilla update.
    targets = [tok.convert_tokens_to_ids([s] * 3 + ["</s>"]) for s in symbols]
    harness.update(harness.make_batch(prompts, targets, [1.0] * len(prompts)))

    cfg = harness.config
    temp_dir = tempfile.mkdtemp(prefix="vo-ray-", dir="/tmp")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=temp_dir,
        runtime_env={"env_vars": dict(CPU_ENV)},
        log_to_driver=False,
    )
    try:
        server = (
            ray.remote(HFRolloutServer)
            .options(name=server_actor_name(0), num_cpus=0)
            .remote(
                config=cfg.actor_rollout_ref.rollout,
                model_config=cfg.actor_rollout_ref.model,
                rollout_mode=RolloutMode.HYBRID,
                replica_rank=0,
            )
        )
        ray.get(server.ready.remote(), timeout=120)
        params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "logprobs": True, "max_tokens": 8}

        def sample(tag: str):
            refs = [server.generate.remote(p, dict(params), request_id=f"{tag}{i}") for i, p in enumerate(prompts * 2)]
            return ray.get(refs, timeout=120)

        def max_diff(outputs) -> float:
            batch = harness.make_batch(prompts * 2, [o.token_ids for o in outputs], [0.0] * len(outputs))
            trainer_lp = harness.log_probs(batch)
            worst = 0.0
            for i, o in enumerate(outputs):
                rollout_lp = torch.tensor(o.log_probs)
                worst = max(worst, float((trainer_lp[i, : len(o.log_probs)] - rollout_lp).abs().max()))
            return worst

        before = max_diff(sample("before"))
        adapter = HFServerAdapter(config=cfg.actor_rollout_ref.rollout, model_config=cfg.actor_rollout_ref.model, device_mesh=None)
        per_tensor, _ = harness.worker.engine.get_per_tensor_param()
        asyncio.run(adapter.update_weights(per_tensor, global_steps=1))
        outputs = sample("after")
        after = max_diff(outputs)
        return {
            "max_abs_logprob_diff_before_sync": before,
            "max_abs_logprob_diff_after_sync": after,
            "global_steps": outputs[0].extra_fields.get("global_steps"),
            "tokens_compared": sum(len(o.token_ids) for o in outputs),
            "temperature": temperature,
        }
    finally:
        ray.shutdown()
        import shutil

        shutil.rmtree(temp_dir, ignore_errors=True)


def platform_facts() -> dict[str, Any]:
    """What a VERL_PLATFORM=cpu process sees: platform, engine class, process group and where it listens."""
    import psutil
    import torch
    import torch.distributed as dist

    from verl.plugin.platform import get_platform
    from verl_offpolicy.cpu.platform import is_loopback
    from verl.utils import distributed
    from verl.workers.engine import EngineRegistry
    from tests.actor_harness import init_single_process_env

    init_single_process_env()  # MASTER_ADDR=127.0.0.1
    distributed.initialize_global_process_group_ray(timeout_second=60)
    backend = dist.get_backend()
    tensor = torch.ones(2)
    dist.all_reduce(tensor)
    listening = [
        f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN
    ]
    dist.destroy_process_group()
    platform = get_platform()
    module = platform.device_module
    return {
        "device_name": platform.device_name,
        "ray_resource_name": platform.ray_resource_name(),
        "current_device": str(platform.current_device()),
        "backend": str(backend),
        "engine_class": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
        "max_memory_allocated_positive": module.max_memory_allocated() > 0,
        "all_reduce": tensor.tolist(),
        "store_listens": bool(listening),
        "listening_not_loopback": [a for a in listening if not is_loopback(a)],
    }


def adapter_outside_cpu_platform() -> str:
    """The hf adapter's error in a process without VERL_PLATFORM=cpu (run with it removed)."""
    from verl_offpolicy.cpu.platform import require_cpu_platform

    try:
        require_cpu_platform("rollout name=hf")
    except RuntimeError as exc:
        return str(exc)
    return "no error"


# ----------------------------------------------------------------------------------------------
# One real actor update per verl-offpolicy loss (run in a fresh CPU process)
# ----------------------------------------------------------------------------------------------

LOSS_TARGET = "actor_rollout_ref.actor.policy_loss._target_=verl_offpolicy.glue.config.OffPolicyLossConfig"


def _repeat_c_tokens(harness) -> tuple[list[int], list[int], list[int]]:
    """Token ids of the prompt ``repeat c`` (chat template) and the responses ``c c </s>`` and ``d d </s>``."""
    tok = harness.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "repeat c"}], add_generation_prompt=True, tokenize=True)
    if hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    return prompt, tok.convert_tokens_to_ids(["c", "c", "</s>"]), tok.convert_tokens_to_ids(["d", "d", "</s>"])


def offpolicy_loss_updates(workdir: str, cases: list[dict[str, Any]], lr: float = 1e-2) -> dict[str, Any]:
    """For each case {"name", "loss_mode", "overrides", "old_log_prob_shift"}: one real FSDP2 update.

    Batch: prompt ``repeat c``; responses ``c c </s>`` with A = +1 and ``d d </s>`` with A = −1.
    ``old_log_prob_shift`` sets old_log_prob = log π − shift (ρ = e^shift on every token; 0 = on-policy).
    Returns, per case, how far the weights moved and the sequence log-probs before and after.
    """
    from tests.actor_harness import ActorHarness

    report = {}
    harness = None
    for case in cases:
        harness = ActorHarness.create(
            Path(workdir) / case["name"],
            loss_mode=case["loss_mode"],
            lr=lr,
            overrides=[LOSS_TARGET, *case.get("overrides", [])],
        )
        prompt, good, bad = _repeat_c_tokens(harness)
        batch = harness.make_batch([prompt] * 4, [good, bad, good, bad], [1.0, -1.0, 1.0, -1.0])
        before_lp = harness.log_probs(batch)
        batch["old_log_probs"] = (before_lp - float(case.get("old_log_prob_shift", 0.0))) * batch["response_mask"]
        before = harness.state_dict()
        metrics = harness.update(batch)
        after = harness.state_dict()
        after_lp = harness.log_probs(batch)
        report[case["name"]] = {
            "max_abs_change": max(float((after[k] - before[k]).abs().max()) for k in before),
            "good_before": float(before_lp.sum(-1)[0::2].mean()),
            "good_after": float(after_lp.sum(-1)[0::2].mean()),
            "bad_before": float(before_lp.sum(-1)[1::2].mean()),
            "bad_after": float(after_lp.sum(-1)[1::2].mean()),
            "metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)},
        }
    return report


# Extra shifts log π − log π_old of the m2po batch (8 responses × 3 tokens, micro-batches of 2 responses):
# every token 0.05 ((log ρ)² = 0.0025) except, all in the first micro-batch, a moderate token 0.5 (0.25) and
# three extreme ones 1, 1.5, −2 (1, 2.25, 4). Over the mini-batch: 20 × 0.0025 + 0.25 → mean 0.0143 ≤ 0.04,
# adding the 1 → 0.0591 > 0.04, so exactly the three extremes go. Within the first micro-batch alone
# (2 × 0.0025 + 0.25 → mean 0.085 > 0.04) the moderate token would go too.
M2PO_SHIFTS = [[0.05, 0.05, 0.5], [1.0, 1.5, -2.0]] + [[0.05, 0.05, 0.05]] * 6
M2PO_EXTREME_TOKENS = 3


def m2po_micro_batch_updates(workdir: str, micro_batch_sizes: list[int], lr: float = 1e-2) -> dict[str, Any]:
    """One real FSDP2 update with ``m2po`` per micro-batch size, from identical weights and data.

    Returns, per size, the metrics of the update and the updated weights' max distance from those of the
    first size, and how far the first update moved the weights.
    """
    import torch

    from tests.actor_harness import ActorHarness

    report: dict[str, Any] = {}
    first_after = None
    for size in micro_batch_sizes:
        harness = ActorHarness.create(Path(workdir) / f"micro{size}", loss_mode="m2po", lr=lr, overrides=[LOSS_TARGET])
        prompt, good, bad = _repeat_c_tokens(harness)
        batch = harness.make_batch([prompt] * 8, [good, bad] * 4, [1.0, -1.0] * 4)
        shifts = torch.tensor(M2PO_SHIFTS)
        batch["old_log_probs"] = (harness.log_probs(batch) - shifts) * batch["response_mask"]
        before = harness.state_dict()
        metrics = harness.update(batch, micro_batch_size=size)
        after = harness.state_dict()
        entry = {"metrics": {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}}
        if first_after is None:
            first_after = after
            entry["max_abs_change"] = max(float((after[k] - before[k]).abs().max()) for k in before)
        entry["max_abs_diff_from_first"] = max(float((after[k] - first_after[k]).abs().max()) for k in after)
        report[str(size)] = entry
    return report


# ----------------------------------------------------------------------------------------------
# One real actor update with verl's vanilla loss (run in a fresh CPU process)
# ----------------------------------------------------------------------------------------------


def demo_vanilla_update(workdir: Optional[str] = None, lr: float = 1e-2) -> dict[str, Any]:
    """One real update with verl's ``vanilla`` loss; returns what changed (used by the tests).

    Prompts ``repeat c``, responses ``c c </s>`` (advantage +1) and ``d d </s>`` (advantage -1):
    after the update the log-prob of the positive responses must rise and the negative ones fall.
    """
    workdir = workdir or tempfile.mkdtemp(prefix="vo-harness-")
    harness = ActorHarness.create(workdir, loss_mode="vanilla", lr=lr)
    tok = harness.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "repeat c"}], add_generation_prompt=True, tokenize=True)
    if isinstance(prompt, dict) or hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    good = tok.convert_tokens_to_ids(["c", "c", "</s>"])
    bad = tok.convert_tokens_to_ids(["d", "d", "</s>"])
    batch = harness.make_batch([prompt] * 4, [good, bad, good, bad], [1.0, -1.0, 1.0, -1.0])
    before_weights = harness.state_dict()
    before_lp = harness.log_probs(batch)
    metrics = harness.update(batch)
    after_weights = harness.state_dict()
    after_lp = harness.log_probs(batch)
    changed = {
        name: float((after_weights[name] - before_weights[name]).abs().max())
        for name in before_weights
    }
    seq_before = before_lp.sum(-1)
    seq_after = after_lp.sum(-1)
    return {
        "num_params": len(before_weights),
        "num_changed": sum(v > 0 for v in changed.values()),
        "max_abs_change": max(changed.values()),
        "good_logp_before": float(seq_before[0::2].mean()),
        "good_logp_after": float(seq_after[0::2].mean()),
        "bad_logp_before": float(seq_before[1::2].mean()),
        "bad_logp_after": float(seq_after[1::2].mean()),
        "metrics": {k: (float(v) if isinstance(v, int | float) else str(v)) for k, v in metrics.items()},
    }


# ----------------------------------------------------------------------------------------------
# The same weights and batch through a loss under verl's FSDP2 engine, its Megatron engine and a
# plain-PyTorch reference (run the engines in fresh CPU processes, one per engine)
# ----------------------------------------------------------------------------------------------

# Per response token: old_log_prob = reference log-prob − shift, i.e. ρ_t = e^shift. Inside the REC
# one-side band (|shift| ≤ 0.05) or clearly out of it (0.5-0.6), never near its edges 0.8/1.2, so
# that bfloat16 noise of the Megatron engine cannot move a token across the clip boundary.
EQUIVALENCE_SHIFTS = (0.05, -0.5, 0.6, 0.02, -0.03, 0.5)


def bf16_exact_tiny(workdir: str) -> dict[str, str]:
    """The tiny model with weights rounded to bfloat16 values (stored in fp32): verl's Megatron engine
    holds bf16 parameters, so both engines and the reference then start from identical weights."""
    import torch
    from transformers import LlamaForCausalLM

    from verl_offpolicy.demo.tiny import TinyModelSpec, build_tiny

    paths = build_tiny(Path(workdir) / "tiny_bf16", TinyModelSpec(seed=0))
    marker = Path(workdir) / "tiny_bf16" / "rounded"
    if not marker.exists():
        model = LlamaForCausalLM.from_pretrained(paths["model_path"], torch_dtype=torch.float32)
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(torch.bfloat16).float())
        model.save_pretrained(paths["model_path"])
        marker.write_text("1")
    return paths


def equivalence_batch(tokenizer) -> dict[str, Any]:
    """Four responses of different lengths (so micro-batches of 2 hold 5 and 6 tokens) and advantages ±."""
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "repeat c"}], add_generation_prompt=True, tokenize=True)
    if hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    words = [["c", "c", "</s>"], ["d", "</s>"], ["c", "</s>"], ["d", "d", "e", "</s>"]]
    return {
        "prompts": [list(prompt)] * 4,
        "responses": [tokenizer.convert_tokens_to_ids(w) for w in words],
        "advantages": [1.0, -1.0, 0.5, -0.5],
    }


def reference_loss_and_grads(model_path: str, tokenizer_path: str, case: dict[str, Any]) -> dict[str, Any]:
    """The loss of the whole batch as one micro-batch and its gradient, in fp32 with transformers' Llama.

    Log-probs from ``LlamaForCausalLM`` (left-padded prompt, right-padded response, as verl's trainer
    lays them out); the loss is the registered verl loss of ``case`` called once on the whole batch
    with ``global_batch_info`` of the whole batch (one rank, all tokens, all sequences): what the
    engines' micro-batch sums must add up to. Also returns the old log-probs the engines get.
    """
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    from tests.actor_harness import padded_batch

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    model = LlamaForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32)
    spec = equivalence_batch(tokenizer)
    batch = padded_batch(tokenizer.pad_token_id, spec["prompts"], spec["responses"], spec["advantages"])
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]).logits
    r_len = batch["responses"].shape[1]
    log_probs = torch.log_softmax(logits[:, -r_len - 1 : -1].float(), dim=-1)
    log_prob = log_probs.gather(-1, batch["responses"][..., None]).squeeze(-1)
    mask = batch["response_mask"].bool()
    old = _old_log_probs(log_prob.detach(), mask)

    loss = whole_batch_loss(model_path, tokenizer_path, case, log_prob, old, batch["advantages"], mask)
    model.zero_grad()
    loss.backward()
    return {
        "loss": float(loss.detach()),
        "old_log_probs": old.tolist(),
        "advantages": batch["advantages"].tolist(),
        "response_mask": batch["response_mask"].tolist(),
        "grads": {name: p.grad.flatten().tolist() for name, p in model.named_parameters()},
    }


def whole_batch_loss(model_path, tokenizer_path, case, log_prob, old_log_prob, advantages, mask):
    """``case``'s registered verl loss on the whole batch as one micro-batch of one rank (the value an
    engine's micro-batch sums must reproduce): ``global_batch_info`` = (1 rank, all tokens, all sequences)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    cfg = compose_preset_actor(model_path, tokenizer_path, case, engine="fsdp")
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    actor.global_batch_info.update(
        {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": mask.shape[0], "loss_scale_factor": None}
    )
    loss, _ = get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=mask.bool(),
        loss_agg_mode=actor.loss_agg_mode, config=actor, rollout_is_weights=None,
    )
    return loss


def _old_log_probs(log_prob, mask):
    import torch

    shifts = torch.tensor(EQUIVALENCE_SHIFTS, dtype=log_prob.dtype)
    flat = torch.arange(mask.numel()).reshape(mask.shape) % len(EQUIVALENCE_SHIFTS)
    return (log_prob - shifts[flat]) * mask


def compose_preset_actor(model_path: str, tokenizer_path: str, case: dict[str, Any], engine: str):
    """The config of ``case["preset"]`` (``+algorithm=``) on ``engine``'s stock config with our CPU overlay."""
    from tests.actor_harness import compose_cpu_config

    return compose_cpu_config(model_path, tokenizer_path, [f"+algorithm={case['preset']}", *case.get("overrides", [])], engine=engine)


def engine_loss_and_grads(
    workdir: str, engine: str, model_path: str, tokenizer_path: str, cases: list[dict[str, Any]], old_log_probs: dict[str, list]
) -> dict[str, Any]:
    """Per case: one real ``train_mini_batch`` of the equivalence batch on ``engine`` (two micro-batches
    of two), returning verl's ``actor/pg_loss`` metric and the HF-named gradient of that step."""
    import torch

    from tests.actor_harness import ActorHarness

    report = {}
    for case in cases:
        cfg = compose_preset_actor(model_path, tokenizer_path, case, engine)
        actor = cfg.actor_rollout_ref.actor
        harness = ActorHarness.create(
            Path(workdir) / f"{engine}_{case['name']}",
            loss_mode=actor.policy_loss.loss_mode,
            lr=1e-9,  # the step is not what is compared; the gradient before it is
            model_path=model_path,
            tokenizer_path=tokenizer_path,
            engine=engine,
            overrides=[f"+algorithm={case['preset']}", "actor_rollout_ref.actor.optim.clip_grad=1e9", *case.get("overrides", [])],
        )
        harness.record_grads()
        spec = equivalence_batch(harness.tokenizer)
        batch = harness.make_batch(spec["prompts"], spec["responses"], spec["advantages"],
                                   old_log_probs=torch.tensor(old_log_probs[case["name"]]))
        log_prob = harness.log_probs(batch)
        metrics = harness.update(batch, micro_batch_size=2)
        report[case["name"]] = {
            "loss": float(metrics["actor/pg_loss"]),
            "log_probs": log_prob.tolist(),
            "grads": {name: g.flatten().tolist() for name, g in harness.grads().items()},
        }
    return report


def megatron_update_without_shim(workdir: str, omit: Optional[str] = None) -> dict[str, Any]:
    """Build verl's Megatron engine (tiny model, ``+cpu=megatron``) with every CUDA shim except ``omit``
    and run one forward and one update; return ``{"ok": True}`` or the error and the site-packages
    file (relative) of the frame that raised it."""
    import traceback

    import verl_offpolicy.cpu.megatron as shims
    from tests.actor_harness import ActorHarness

    if omit is not None:
        del shims.SHIMS[omit]  # this fresh process only
    try:
        harness = ActorHarness.create(Path(workdir) / "megatron", loss_mode="vanilla", lr=1e-3, engine="megatron")
        tok = harness.tokenizer
        spec = equivalence_batch(tok)
        batch = harness.make_batch(spec["prompts"], spec["responses"], spec["advantages"])
        harness.update(batch, micro_batch_size=2)
    except Exception as exc:  # noqa: BLE001 - the failure is the result
        frames = traceback.extract_tb(exc.__traceback__)
        # the last frame of megatron-core, mbridge or verl (torch's own frames only re-raise)
        site = [f.filename.split("site-packages/")[1] for f in frames if "site-packages/" in f.filename]
        site = [name for name in site if not name.startswith("torch/")]
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "raised_in": site[-1] if site else None}
    return {"ok": True}


def megatron_shim_isolation() -> dict[str, Any]:
    """What our registration does to a process that imports verl's engines (every worker does, FSDP
    runs included) before any Megatron engine is built; run with and without ``VERL_PLATFORM=cpu``."""
    import sys

    import torch

    import verl.workers.engine  # noqa: F401 - imports verl's Megatron engine module, as every worker does
    from verl.workers.engine.megatron.transformer_impl import MegatronEngine

    facts = {
        "megatron_engine_imported": "verl.workers.engine.megatron.transformer_impl" in sys.modules,
        "shim_module_imported": "verl_offpolicy.cpu.megatron" in sys.modules,
        "engine_init_wrapped": getattr(MegatronEngine.__init__, "_verl_offpolicy_cpu", False),
        "tensor_cuda_remapped": getattr(torch.Tensor.cuda, "_verl_offpolicy_cpu", False),
    }
    return facts


def assert_named_with_fix(problems: list[str], key: str, fix: str) -> None:
    """One of the startup guard's ``problems`` names ``key`` and says ``fix``."""
    matching = [p for p in problems if key in p]
    assert matching, problems
    assert fix in matching[0], matching[0]
