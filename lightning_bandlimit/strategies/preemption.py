"""SIGTERM under torchrun: every rank stops at the same step boundary, and none reports success.

torchrun sends SIGTERM to the workers of *one* agent at a time: when that agent is pre-empted,
or, at a membership change, at that agent's own monitor tick. Lightning 2.x answers a SIGTERM
with a collective issued from inside the signal handler (a broadcast from rank 0, matched by
whatever collective the other ranks run next) and then stops the ranks that saw the flag, so
under torchrun a rank other than 0 that receives SIGTERM desynchronises the collectives, the
group hangs until torchrun kills it, and ranks told to stop exit with status 0, which their
agents take for a finished job (closing the rendezvous for everyone).

:class:`Preemption` replaces that handler while training runs: the handler only sets a flag;
at each optimizer-step boundary the ranks agree on it with one ``reduce`` (any rank's SIGTERM
stops all), and then every rank raises ``SIGTERMException`` with exit status 143, so an
``ElasticCheckpoint`` saves at that step on every rank and the agents restart (or stop) the
workers as a failure, never as a success.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from lightning.pytorch.utilities.exceptions import SIGTERMException

__all__ = ["EXIT_STATUS", "Preemption"]

#: the exit status of a worker stopped by SIGTERM (128 + 15, as if killed by the signal)
EXIT_STATUS = 128 + signal.SIGTERM


class Preemption:
    """A SIGTERM flag that the ranks agree on at step boundaries.

    Args:
        agree: ``agree(local) -> bool``: ``True`` if any rank's ``local`` is ``True`` (one
            collective; every rank must call it at the same point).

    Example:
        >>> preemption = Preemption(agree=lambda local: local)
        >>> preemption.requested
        False
        >>> preemption.check()  # nothing received: training goes on
        >>> preemption.request()
        >>> preemption.check()
        Traceback (most recent call last):
        ...
        lightning.pytorch.utilities.exceptions.SIGTERMException: 143
    """

    def __init__(self, agree: Callable[[bool], bool]) -> None:
        self._agree = agree
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def request(self) -> None:
        """Record a stop request (what the SIGTERM handler does; no collective)."""
        self.requested = True

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.request()

    def install(self) -> None:
        """Handle SIGTERM with :meth:`request` (main thread only; a no-op elsewhere)."""
        if self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._handler)
        self._installed = True

    def uninstall(self) -> None:
        """Put back the handler :meth:`install` replaced."""
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    def check(self) -> None:
        """Agree with the other ranks; stop every rank if any received SIGTERM.

        Raises:
            SIGTERMException: with exit status :data:`EXIT_STATUS`, on every rank at once.
        """
        if self._agree(self.requested):
            self.requested = True
            raise SIGTERMException(EXIT_STATUS)
