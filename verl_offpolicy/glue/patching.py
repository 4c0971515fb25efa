"""One way to patch a verl (or megatron, torch) attribute in place: once per process, recognisably.

Every shim of this package replaces a name in someone else's module; the registration hooks may run twice in a
process (an import hook and an explicit call, a re-import), and a test needs to see whether a shim is in place.
:func:`patch_once` replaces ``owner.<name>`` by ``make(original)`` and marks the replacement with :data:`PATCHED`;
a second call leaves it alone.
"""

from __future__ import annotations

from typing import Any, Callable

PATCHED = "_verl_offpolicy_patched"


def is_patched(obj: Any) -> bool:
    """Whether ``obj`` (a function, method or class) is a replacement :func:`patch_once` installed."""
    return bool(getattr(obj, PATCHED, False))


def patch_once(owner: Any, name: str, make: Callable[[Any], Any]) -> bool:
    """Replace ``owner.<name>`` by ``make(original)`` unless it is already ours; returns True if this call patched."""
    original = getattr(owner, name)
    if is_patched(original):
        return False
    replacement = make(original)
    setattr(replacement, PATCHED, True)
    setattr(owner, name, replacement)
    return True
