"""A bound on forming the process group: a peer that dies during the rendezvous must not hang us.

torchrun's rendezvous can complete with a node that dies a moment later; the surviving workers
then wait in ``init_process_group`` for a rank that never connects, for the whole process-group
timeout (30 minutes by default, also the bound of every collective, so it cannot simply be made
short). :class:`JoinDeadline` bounds only the set-up: if it has not finished in time, the
process writes one line saying so and exits with status 75 (``EX_TEMPFAIL``), which torchrun
answers by restarting the group without the dead node. The waiting thread is inside C++ and
cannot be interrupted, so exiting is the only way out.
"""

from __future__ import annotations

import os
import sys
import threading
from types import TracebackType

__all__ = ["EXIT_STATUS", "JoinDeadline"]

#: the exit status after the deadline passed (``EX_TEMPFAIL``: a temporary failure, retry)
EXIT_STATUS = 75


class JoinDeadline:
    """Exit the process if the ``with`` block has not finished within ``seconds``.

    Args:
        seconds: the bound; ``None`` for no bound.
        what: what is being waited for, for the message.

    Example:
        >>> with JoinDeadline(60.0, "the process group"):
        ...     pass  # finished in time: nothing happens
    """

    def __init__(self, seconds: float | None, what: str) -> None:
        self.seconds, self.what = seconds, what
        self._timer: threading.Timer | None = None

    def _expire(self) -> None:
        sys.stderr.write(
            f"ElasticDDPStrategy: {self.what} did not form within {self.seconds:g} s (a peer left during the "
            f"rendezvous?); exiting with status {EXIT_STATUS} so that torchrun restarts the group\n"
        )
        sys.stderr.flush()
        os._exit(EXIT_STATUS)

    def __enter__(self) -> JoinDeadline:
        if self.seconds is not None:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
