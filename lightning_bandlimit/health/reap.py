"""A hung peer on this machine is ended at once, not after torchrun's 30 s grace.

When a rank's watchdog finds a peer hung it exits, and torchrun's agent stops the group: SIGTERM
to every worker, then SIGKILL to those still there after a fixed 30 s. A *stopped* process
leaves SIGTERM pending, so a stop always costs those 30 s. A rank that finds a peer hung ends it
first with SIGKILL if, and only if, the peer runs on this machine: each rank publishes
:func:`identity` (the machine's boot id, its pid and the pid's start time), and
:func:`kill_if_local` acts only when all three still match, so neither a process on another
machine with the same pid nor a later process that reused the pid is ever touched. Linux only
(``/proc``); elsewhere nothing is killed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["identity", "kill_if_local"]

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the command's ")"


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return None


def identity(pid: int | None = None) -> str:
    """What identifies process ``pid`` (default: this one) on this machine, as one line.

    Returns:
        ``"<boot id> <pid> <start time>"``, or ``""`` where ``/proc`` does not tell.

    Example:
        >>> import os
        >>> line = identity()
        >>> line == "" or line.split()[1] == str(os.getpid())
        True
    """
    pid = os.getpid() if pid is None else pid
    boot, started = _boot_id(), _start_time(pid)
    return "" if boot is None or started is None else f"{boot} {pid} {started}"


def kill_if_local(published: str) -> bool:
    """SIGKILL the process ``published`` (an :func:`identity`) if it runs on this machine.

    Args:
        published: what the peer published; anything malformed or empty is ignored.

    Returns:
        ``True`` if the process was killed; ``False`` if it is elsewhere, gone, reused or unknown.

    Example:
        >>> kill_if_local("another-machine 1 42")
        False
    """
    parts = published.split()
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    boot, pid, started = parts[0], int(parts[1]), parts[2]
    if pid == os.getpid() or boot != _boot_id() or _start_time(pid) != started:
        return False
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return False
    return True
