"""The demo tooling: prepares a model and a task and drives verl's stock ``main_ppo`` on the CPU from outside.

It runs in the caller's process (``verl-offpolicy demo``, the tests, the benchmarks); what runs inside
verl's processes is the CPU backend, :mod:`verl_offpolicy.cpu`, which imports nothing from here.

- :mod:`.run`: :func:`~.run.run_demo`, one run end to end (inputs, ``main_ppo``, results, summary).
- :mod:`.command`: the ``main_ppo`` command line (engine, overlay, preset, the model's overrides).
- :mod:`.launch`: the subprocess, its output streamed to the log and the console, its timeout.
- :mod:`.process`: process groups, Ray sessions, listening sockets, locks, signals.
- :mod:`.output_dir`, :mod:`.environment`: a run's files, its lock, its environment.
- :mod:`.results`, :mod:`.plot`, :mod:`.progress`: metrics read back, the reward curve, the console lines.
- :mod:`.errors`: :class:`~.errors.DemoError` and its exit codes.
- :mod:`.models`: the models of ``--model``; :mod:`.tiny`, :mod:`.smollm2` build them;
  :mod:`.repeat_task`, :mod:`.arithmetic` write their tasks' data.
"""
