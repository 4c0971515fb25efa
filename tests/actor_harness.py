"""A real single-process verl ``TrainingWorker`` (FSDP2 engine, gloo world of size 1) on the CPU.

For tests that need one real actor update with a given loss, without Ray or the trainer: the worker
is built exactly as ``ActorRolloutRefWorker.init_model`` builds its actor (same config classes,
same ``ppo_loss`` entry point, same engine), from the ``+cpu=demo`` config composed with Hydra, and
the batch goes through the same padding conversion as verl's trainer.

    from tests.actor_harness import ActorHarness

    harness = ActorHarness.create(workdir, loss_mode="vanilla", lr=1e-2)
    batch = harness.make_batch(prompts=[[5, 7, 10, 6]] * 4, responses=[[10, 10, 2]] * 4, advantages=[1, -1, 1, -1])
    before = harness.state_dict()
    metrics = harness.update(batch)            # old_log_probs computed by the worker unless given
    after = harness.state_dict()

Because verl caches the device name at import time in some modules, the process must be on the CPU
platform before those modules are imported: start it with ``VERL_PLATFORM=cpu`` (the helper
:func:`run_isolated` runs a function in such a fresh process with a timeout), or call
:func:`verl_offpolicy.cpu.verl_shims.activate_cpu_platform` first, which raises if it is too late.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from verl_offpolicy.configs import STOCK_CONFIGS
from verl_offpolicy.cpu.platform import CPU_ENV, LOOPBACK_ENV
from verl_offpolicy.cpu.verl_shims import activate_cpu_platform
from verl_offpolicy.demo.command import CPU_ENGINES
from verl_offpolicy.demo.process import run_captured
from verl_offpolicy.glue.compose import compose_main_ppo


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_single_process_env() -> None:
    """Environment of rank 0 of a world of size 1 (what Ray's worker group would set), on 127.0.0.1."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


# engine -> (verl's stock config, our CPU overlay, the key of the engine's seed)
ENGINES = {engine: (STOCK_CONFIGS[i], *CPU_ENGINES[engine][1:]) for i, engine in enumerate(("fsdp", "megatron"))}


def compose_cpu_config(model_path: str, tokenizer_path: str, overrides: Sequence[str] = (), engine: str = "fsdp"):
    """verl's stock config of ``engine`` with our CPU overlay and ``overrides`` (Hydra compose)."""
    config_name, overlay, _ = ENGINES[engine]
    return compose_main_ppo(
        config_name,
        [
            overlay,
            f"actor_rollout_ref.model.path={model_path}",
            f"actor_rollout_ref.model.tokenizer_path={tokenizer_path}",
            *overrides,
        ],
    )


def padded_batch(
    pad: int,
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    advantages: Sequence[float] | torch.Tensor,
) -> dict[str, torch.Tensor]:
    """verl's trainer layout: left-padded prompts, right-padded responses, their masks and positions;
    ``advantages`` is one value per sequence (broadcast over its tokens) or a [B, R] tensor."""
    batch = len(prompts)
    p_len = max(len(p) for p in prompts)
    r_len = max(len(r) for r in responses)
    prompt_ids = torch.full((batch, p_len), pad, dtype=torch.long)
    response_ids = torch.full((batch, r_len), pad, dtype=torch.long)
    prompt_mask = torch.zeros((batch, p_len), dtype=torch.long)
    response_mask = torch.zeros((batch, r_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        prompt_ids[i, p_len - len(p) :] = torch.tensor(p)
        prompt_mask[i, p_len - len(p) :] = 1
        response_ids[i, : len(r)] = torch.tensor(r)
        response_mask[i, : len(r)] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    advantages = torch.as_tensor(advantages, dtype=torch.float32)
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand(batch, r_len).clone()
    return {
        "prompts": prompt_ids,
        "responses": response_ids,
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "advantages": advantages * response_mask,
    }


def _scalar(value: Any) -> Any:
    """A metric as a float: one-element lists (one per mini-batch here) are unwrapped, longer ones averaged."""
    if isinstance(value, list | tuple):
        values = [_scalar(v) for v in value]
        if all(isinstance(v, int | float) for v in values) and values:
            return values[0] if len(values) == 1 else sum(values) / len(values)
        return values
    if hasattr(value, "item"):
        return value.item()
    return value


@dataclass
class ActorHarness:
    worker: Any  # verl.workers.engine_workers.TrainingWorker
    actor_config: Any  # verl.workers.config.ActorConfig
    config: Any  # the composed DictConfig
    tokenizer: Any
    temperature: float = 1.0

    @classmethod
    def create(
        cls,
        workdir: str | os.PathLike,
        *,
        loss_mode: str = "vanilla",
        lr: float = 1e-2,
        overrides: Sequence[str] = (),
        model_path: Optional[str] = None,
        tokenizer_path: Optional[str] = None,
        seed: int = 0,
        engine: str = "fsdp",
    ) -> "ActorHarness":
        """Build the tiny model (unless paths are given) and a real FSDP2 ``TrainingWorker`` for it.

        ``loss_mode`` selects verl's policy loss (``actor.policy_loss.loss_mode``) and ``overrides``
        are Hydra overrides of the whole config (e.g. ``actor_rollout_ref.actor.clip_ratio=0.1``, or
        ``actor_rollout_ref.actor.policy_loss._target_=...`` for a typed loss config). ``engine``:
        ``fsdp`` (FSDP2, ``+cpu=demo``) or ``megatron`` (verl's Megatron engine, ``+cpu=megatron``;
        needs the ``megatron-cpu`` extra).
        """
        activate_cpu_platform()
        init_single_process_env()
        from omegaconf import open_dict
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.config import ActorConfig, HFModelConfig, TrainingWorkerConfig
        from verl.workers.engine_workers import TrainingWorker
        from verl.workers.utils.losses import ppo_loss

        if model_path is None or tokenizer_path is None:
            from verl_offpolicy.demo.tiny import TinyModelSpec, build_tiny

            paths = build_tiny(Path(workdir) / "tiny", TinyModelSpec(seed=seed))
            model_path, tokenizer_path = paths["model_path"], paths["tokenizer_path"]
        cfg = compose_cpu_config(
            model_path,
            tokenizer_path,
            [
                f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}",
                f"actor_rollout_ref.actor.optim.lr={lr}",
                f"{ENGINES[engine][2]}={seed}",
                "actor_rollout_ref.actor.optim.total_training_steps=100",
                *overrides,
            ],
            engine=engine,
        )
        with open_dict(cfg):
            cfg.actor_rollout_ref.actor.optim.total_training_steps = 100
        # As ActorRolloutRefWorker.init_model builds its actor.
        model_config: HFModelConfig = omega_conf_to_dataclass(cfg.actor_rollout_ref.model)
        actor_config: ActorConfig = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        actor_config.model_config = model_config
        training_config = TrainingWorkerConfig(
            model_type="language_model",
            model_config=actor_config.model_config,
            engine_config=actor_config.engine,
            optimizer_config=actor_config.optim,
            checkpoint_config=actor_config.checkpoint,
            profiler_config=None,
        )
        rollout = cfg.actor_rollout_ref.rollout
        engine = training_config.engine_config
        engine.use_dynamic_bsz = cfg.actor_rollout_ref.actor.use_dynamic_bsz
        engine.infer_max_token_len_per_gpu = rollout.log_prob_max_token_len_per_gpu
        engine.infer_micro_batch_size_per_gpu = rollout.log_prob_micro_batch_size_per_gpu
        engine.max_token_len_per_gpu = cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
        engine.micro_batch_size_per_gpu = cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu
        engine.use_remove_padding = model_config.get("use_remove_padding", False)
        worker = TrainingWorker(config=training_config)
        worker.reset()
        worker.set_loss_fn(partial(ppo_loss, config=actor_config))
        return cls(
            worker=worker,
            actor_config=actor_config,
            config=cfg,
            tokenizer=model_config.tokenizer,
            temperature=float(rollout.temperature),
        )

    # ------------------------------------------------------------------ data

    def make_batch(
        self,
        prompts: Sequence[Sequence[int]],
        responses: Sequence[Sequence[int]],
        advantages: Sequence[float] | torch.Tensor,
        old_log_probs: Optional[torch.Tensor] = None,
    ):
        """A padded batch in the trainer's layout: left-padded prompts, right-padded responses.

        ``advantages`` is one value per sequence (broadcast over its tokens) or a [B, R] tensor.
        ``old_log_probs`` ([B, R]) defaults to the current policy's log-probs (computed in :meth:`update`).
        """
        from tensordict import TensorDict

        data = padded_batch(self.tokenizer.pad_token_id, prompts, responses, advantages)
        if old_log_probs is not None:
            data["old_log_probs"] = old_log_probs.float() * data["response_mask"]
        return TensorDict(data, batch_size=[len(prompts)])

    def _no_padding(self, batch, micro_batch_size: Optional[int] = None):
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import left_right_2_no_padding

        td = left_right_2_no_padding(batch.clone())
        # One micro-batch per call unless asked (the configured sizes are for the demo's batches).
        tu.assign_non_tensor(
            td, temperature=self.temperature, micro_batch_size_per_gpu=micro_batch_size or batch.batch_size[0]
        )
        return td

    # ------------------------------------------------------------------ engine calls

    def log_probs(self, batch) -> torch.Tensor:
        """Per-token log-probs [B, R] of the responses under the current weights (worker.infer_batch)."""
        from verl.utils import tensordict_utils as tu
        from verl.workers.utils.padding import no_padding_2_padding

        td = self._no_padding(batch)
        tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
        output = self.worker.infer_batch(td)
        return no_padding_2_padding(tu.get(output, "log_probs"), td).float() * batch["response_mask"]

    def update(
        self, batch, mini_batch_size: Optional[int] = None, epochs: int = 1, micro_batch_size: Optional[int] = None
    ) -> dict[str, Any]:
        """One real ``train_mini_batch`` (one optimizer step per mini-batch) with the configured loss.

        ``micro_batch_size`` (default: the whole batch) splits each mini-batch into micro-batches of that
        many sequences (the engine's gradient accumulation).
        """
        from verl.utils import tensordict_utils as tu

        if "old_log_probs" not in batch.keys():
            batch = batch.clone()
            batch["old_log_probs"] = self.log_probs(batch)
        td = self._no_padding(batch, micro_batch_size)
        size = mini_batch_size or batch.batch_size[0]
        tu.assign_non_tensor(
            td,
            calculate_entropy=False,
            distillation_use_topk=False,
            distillation_only=False,
            global_batch_size=size,
            mini_batch_size=size,
            epochs=epochs,
            seed=0,
            dataloader_kwargs={"shuffle": False},
            compute_loss=True,
        )
        output = self.worker.train_mini_batch(td)
        return {key: _scalar(value) for key, value in tu.get(output, "metrics").items()}

    def record_grads(self) -> None:
        """From now on, keep the gradient of each optimizer step (:meth:`grads`).

        verl's engines zero the gradients when a training call ends (``zero_grad_on_exit``), so they are
        read inside ``engine.optimizer_step``, after the last backward and before clipping and stepping.
        """
        engine = self.worker.engine
        original = engine.optimizer_step

        def optimizer_step():
            self.last_grads = self._read_grads()
            return original()

        engine.optimizer_step = optimizer_step

    def grads(self) -> dict[str, torch.Tensor]:
        """The gradient of the last optimizer step after :meth:`record_grads`."""
        if getattr(self, "last_grads", None) is None:
            raise RuntimeError("no gradient recorded: call record_grads() before update()")
        return self.last_grads

    def _read_grads(self) -> dict[str, torch.Tensor]:
        """The current gradient in fp32 under the HF names of :meth:`state_dict`.

        FSDP2: each parameter's ``.grad`` (full tensor). Megatron: each parameter's ``main_grad`` (the
        fp32 gradient buffer of Megatron's DDP), split into HF tensors by the engine's own mbridge
        (``_weight_to_hf_format``: fused QKV into q/k/v, ``linear_fc1`` into gate/up).
        """
        engine = self.worker.engine
        out = {}
        if hasattr(engine, "bridge") and engine.bridge is not None:  # MegatronEngine (vanilla mbridge)
            from verl.utils.megatron_utils import unwrap_model

            for chunk in engine.module:
                for name, param in unwrap_model(chunk).named_parameters():
                    names, tensors = engine.bridge._weight_to_hf_format(name, param.main_grad.detach().float())
                    out.update({n: t.clone() for n, t in zip(names, tensors, strict=True)})
            return out
        for name, param in engine.module.named_parameters():
            grad = param.grad
            if hasattr(grad, "full_tensor"):
                grad = grad.full_tensor()
            out[name.removeprefix("_fsdp_wrapped_module.")] = grad.detach().float().clone()
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) HF-named weights, as the trainer sends them to the rollout."""
        params, _ = self.worker.engine.get_per_tensor_param()
        out = {}
        for name, tensor in params:
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            out[name] = tensor.detach().to("cpu").clone()
        return out


# ----------------------------------------------------------------------------------------------
# Fresh-process runner
# ----------------------------------------------------------------------------------------------


class IsolatedRunError(RuntimeError):
    """The isolated function failed or timed out; the message has its output."""


def run_isolated(target: str, kwargs: Optional[dict[str, Any]] = None, timeout: float = 300.0, cpu: bool = True) -> Any:
    """Run ``module:function(**kwargs)`` in a fresh Python process on the CPU platform.

    The function's return value must be JSON-serialisable. The process gets ``VERL_PLATFORM=cpu``
    from the start (so no verl module caches another device; ``cpu=False`` removes it instead),
    runs in its own session, and is killed if it does not finish within ``timeout`` seconds.
    """
    module, _, function = target.partition(":")
    with tempfile.TemporaryDirectory(prefix="vo-isolated-") as tmp:
        result_path = Path(tmp) / "result.json"
        code = (
            "import json, sys, importlib\n"
            f"fn = getattr(importlib.import_module({module!r}), {function!r})\n"
            f"result = fn(**json.loads({json.dumps(json.dumps(kwargs or {}))}))\n"
            f"open({str(result_path)!r}, 'w').write(json.dumps(result))\n"
        )
        env = dict(os.environ)
        if cpu:
            env.update(CPU_ENV)
            env.update(LOOPBACK_ENV)
        else:
            for key in CPU_ENV:
                env.pop(key, None)
        env.setdefault("HF_HUB_OFFLINE", "1")
        for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        returncode, output = run_captured([sys.executable, "-c", code], env=env, timeout=timeout)
        if returncode is None:
            raise IsolatedRunError(f"{target} did not finish within {timeout:.0f}s; output:\n{output[-4000:]}")
        if returncode != 0 or not result_path.exists():
            raise IsolatedRunError(f"{target} failed (exit {returncode}); output:\n{output[-4000:]}")
        return json.loads(result_path.read_text())


def run_ranks(
    target: str, kwargs: dict[str, Any], world_sizes: Sequence[int], workdir: str | os.PathLike, timeout: float = 300.0
) -> dict[int, list[Any]]:
    """Run ``module:function(rank=, world_size=, **kwargs)`` on every rank of one gloo world per size, all at once.

    Each world of ``world_sizes`` gets its ranks as fresh ``VERL_PLATFORM=cpu`` processes with what Ray's
    worker group would set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR=127.0.0.1``, a free
    ``MASTER_PORT``), each in its own session, output in ``workdir``. Returns {world size: [rank 0's result,
    ...]}, each the function's JSON return value. If any process fails or the ``timeout`` passes, every
    process still running is killed (a rank left alone would wait in a collective) and the error shows
    the failed rank's output.
    """
    import signal
    import subprocess
    import time

    workdir = Path(workdir)
    procs: list[tuple[int, int, subprocess.Popen, Path, Path]] = []
    env = {**os.environ, **CPU_ENV, **LOOPBACK_ENV}
    env.setdefault("HF_HUB_OFFLINE", "1")
    module, _, function = target.partition(":")
    try:
        for size in world_sizes:
            port = _free_port()
            for rank in range(size):
                tag = f"w{size}r{rank}"
                result_path, log_path = workdir / f"{tag}.json", workdir / f"{tag}.log"
                call = {**kwargs, "rank": rank, "world_size": size}
                code = (
                    "import json, importlib\n"
                    f"fn = getattr(importlib.import_module({module!r}), {function!r})\n"
                    f"result = fn(**json.loads({json.dumps(json.dumps(call))}))\n"
                    f"open({str(result_path)!r}, 'w').write(json.dumps(result))\n"
                )
                rank_env = {
                    **env,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(size),
                    "LOCAL_WORLD_SIZE": str(size),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                }
                with open(log_path, "w") as log:
                    proc = subprocess.Popen(
                        [sys.executable, "-c", code],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        env=rank_env,
                        start_new_session=True,
                        cwd=Path(__file__).resolve().parents[1],
                    )  # our `tests`, not verl's
                procs.append((size, rank, proc, result_path, log_path))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for _, _, p, _, _ in procs):
            failed = [(s, r, log) for s, r, p, _, log in procs if p.poll() not in (None, 0)]
            if failed:
                s, r, log = failed[0]
                raise IsolatedRunError(
                    f"{target} failed on rank {r} of the world of {s}; output:\n{log.read_text()[-4000:]}"
                )
            if time.monotonic() > deadline:
                raise IsolatedRunError(
                    f"{target} did not finish within {timeout:.0f}s; rank 0's output:\n"
                    f"{procs[0][4].read_text()[-4000:]}"
                )
            time.sleep(0.2)
        results: dict[int, list[Any]] = {size: [] for size in world_sizes}
        for size, rank, proc, result_path, log_path in procs:
            if proc.returncode != 0 or not result_path.exists():
                raise IsolatedRunError(
                    f"{target} failed on rank {rank} of the world of {size} (exit {proc.returncode}); "
                    f"output:\n{log_path.read_text()[-4000:]}"
                )
            results[size].append(json.loads(result_path.read_text()))
        return results
    finally:
        for _, _, proc, _, _ in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
