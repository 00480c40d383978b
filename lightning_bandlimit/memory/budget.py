"""A memory budget shared with other processes, read as a probe.

On a shared GPU, NVML reports the device's free memory after every process's use. On a CPU
host the same situation is a budget (a slice of the host given to a group of jobs) that this
job and its co-tenants draw from; :class:`SharedBudgetProbe` reports what is left of it, from
two measurements the caller supplies: this job's memory and the others'.
"""

from __future__ import annotations

from collections.abc import Callable

from lightning_bandlimit.memory.protocol import MemoryProbe, MemoryReading, ProbeUnavailable, as_bytes

__all__ = ["SharedBudgetProbe"]


class SharedBudgetProbe(MemoryProbe):
    """Free memory of a ``budget`` shared with other processes: ``budget - own() - others()``.

    Args:
        budget: bytes the job and its co-tenants share.
        own: returns this job's memory in bytes now (e.g. its peak resident set since the last
            call, as :class:`~lightning_bandlimit.callbacks.SharedBudget` measures it).
        others: returns the co-tenants' memory in bytes now (e.g. their resident sets).
        own_base: returns what the job held at the start of the step whose peak ``own()``
            returns (:attr:`MemoryReading.own_base`); called before ``own``, which may reset
            what both read. ``None``: not measured.

    Raises:
        TypeError: if ``budget`` is not an integer number of bytes.
        ValueError: if ``budget`` is not positive.

    A reading clips ``free`` at 0 when the budget is overdrawn (the readings' contract) and
    reports ``own()`` as the job's own memory (:attr:`MemoryReading.own`), which is what an
    :class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` learns its memory model from;
    :meth:`read` raises :class:`ProbeUnavailable` when a measurement fails with ``OSError``
    (e.g. a co-tenant that exited).

    Example:
        >>> probe = SharedBudgetProbe(1000, own=lambda: 600, others=lambda: 300)
        >>> probe.read()
        MemoryReading(total=1000, free=100, source='budget', own=600, own_base=None)
        >>> SharedBudgetProbe(1000, own=lambda: 800, others=lambda: 300).read().free
        0
    """

    source = "budget"
    measures_own = True

    def __init__(
        self,
        budget: int,
        own: Callable[[], int],
        others: Callable[[], int],
        own_base: Callable[[], int] | None = None,
    ) -> None:
        budget = as_bytes("budget", budget, minimum=1)
        self.budget, self.own, self.others, self.own_base = budget, own, others, own_base

    def read(self) -> MemoryReading:
        self._ensure_open()
        try:
            base = None if self.own_base is None else int(self.own_base())
            own = int(self.own())
            used = own + int(self.others())
        except OSError as error:
            raise ProbeUnavailable(
                f"SharedBudgetProbe cannot measure the processes' memory ({error})"
            ) from error
        free = min(self.budget, max(0, self.budget - used))
        base = None if base is None else min(base, own)  # a peak read after the step can lag its start
        return MemoryReading(total=self.budget, free=free, source=self.source, own=own, own_base=base)

    def __repr__(self) -> str:
        return f"SharedBudgetProbe(budget={self.budget})"
