"""The scheduler part: the staleness-controlled trainer and what it owns.

- :mod:`.trainer`: what both modes share (the FIFO in TransferQueue, the ratio anchor, the registered
  ``offpolicy`` name); :mod:`.colocated` and :mod:`.overlapped`: one small class per mode;
- :mod:`.rollout`: the overlapped mode's standalone rollout and the observed-version check;
- :mod:`.metrics`: the names of what the trainer logs;
- :mod:`.checks`: the startup rules of the scheduler, verl's rollout correction and verl's async modes.

This ``__init__`` imports nothing: the startup validation imports :mod:`.checks` without the trainer.
"""
