"""The process group closed before the interpreter exits, on every rank, however fitting ended.

A default process group left open at exit is destroyed while Python finalises, after the
interpreter has stopped running Python: a backend thread still joinable then (gloo's, or the
thread that runs a communication hook's completions) makes the C++ runtime end the process with
``terminate called without an active exception`` (status 134) after a fit that succeeded. Under
torchrun a worker that exits non-zero restarts the whole group and spends one of its
``max_restarts``; a scheduler marks the job failed.

:func:`close_at_exit` registers :func:`close_process_group` with :mod:`atexit` once per process;
it runs on a normal exit, on ``sys.exit`` (the pre-emption path's status 143) and after an
uncaught exception, while the interpreter is whole. Closing at exit rather than when ``fit``
returns keeps the group for whatever the script runs next (``trainer.test``, a report).
Before the group, what :func:`before_close` registered is stopped (a watchdog's thread that
still talks to the run's store). Nothing here raises: a failure to close is one warning.
"""

from __future__ import annotations

import atexit
import threading
import warnings
from collections.abc import Callable

import torch.distributed as dist

__all__ = ["before_close", "close_at_exit", "close_process_group"]

_lock = threading.Lock()
_registered = False
_before: list[Callable[[], None]] = []


def before_close(stop: Callable[[], None]) -> Callable[[], None]:
    """Run ``stop`` before the process group closes (each once; the last registered first).

    Args:
        stop: a callable taking nothing (e.g. a watchdog's ``stop``); an exception it raises is
            one warning.

    Returns:
        ``stop``, so that it can be used as a decorator.

    Example:
        >>> stopped = []
        >>> _ = before_close(lambda: stopped.append(True))
        >>> close_process_group()  # no group open here: only the registered stops run
        False
        >>> stopped
        [True]
    """
    with _lock:
        _before.append(stop)
    return stop


def close_process_group() -> bool:
    """Stop what :func:`before_close` registered, then destroy the default process group.

    Returns:
        ``True`` if a process group was open and is now destroyed.

    Example:
        >>> close_process_group()  # none open
        False
    """
    with _lock:
        stops = _before[::-1]
        _before.clear()
    for stop in stops:
        try:
            stop()
        except Exception as error:  # a watchdog that fails to stop must not keep the group open
            warnings.warn(f"lightning_bandlimit: stopping {stop!r} before closing failed: {error!r}")
    if not (dist.is_available() and dist.is_initialized()):
        return False
    try:
        dist.destroy_process_group()
    except Exception as error:
        warnings.warn(
            f"lightning_bandlimit: closing the process group failed ({error!r}); the process may "
            "end with 'terminate called without an active exception'"
        )
        return False
    return True


def close_at_exit() -> None:
    """Close the process group (:func:`close_process_group`) when the interpreter exits.

    Idempotent: registered once per process however often it is called. Call it where a process
    group is created (the strategies do) or at an entry point's start.

    Example:
        >>> close_at_exit(); close_at_exit()  # registered once
    """
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    atexit.register(close_process_group)
