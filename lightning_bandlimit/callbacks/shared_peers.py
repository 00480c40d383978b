"""What the peers of a :class:`~lightning_bandlimit.callbacks.SharedDevice` job hold on its device,
read at a check before its ladder decides (:class:`PeerMemory`): a peer's own change is not
others' growth to the job's ladder.

Each live peer counts at what the device measures for its process where the probe can tell
(NVML's per-process memory, :meth:`~lightning_bandlimit.memory.MemoryProbe.process_memory`: its
CUDA context and allocator cache too, which its own peak leaves out, from before its first step),
else at the peak it published. Where the device's process ids are not the jobs' own (a container
renumbers them), or the probe fails to list them, the published peaks are used, said once. The
peers and their measured memory are kept for the check's decision, which bounds the peers'
claims by what the device measures (:func:`~lightning_bandlimit.tenants.trust.bound_claims`).
"""

from __future__ import annotations

import os

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_bandlimit.callbacks.ladder_reading import process_memory
from lightning_bandlimit.memory.protocol import MemoryProbe, ProbeUnavailable
from lightning_bandlimit.tenants.ledger import Ledger, Tenant

__all__ = ["PeerMemory"]


class PeerMemory:
    """The peers' memory as a job's check reads it, and the peers it read for the check's decision.

    Attributes:
        by_process: whether the peers are measured per process (``None``: not known yet;
            ``False``: they count at the memory they published, from then on).

    Example:
        >>> peers = PeerMemory()
        >>> peers.by_process is None, peers.taken is None
        (True, True)
    """

    def __init__(self) -> None:
        self.by_process: bool | None = None
        # the peers and their processes' memory read for this check's decision (by read)
        self.taken: tuple[list[Tenant], dict[int, int]] | None = None

    def read(self, ledger: Ledger, probe: MemoryProbe | None) -> float | None:
        """The live peers' memory (bytes) in ``ledger``: each at what ``probe`` measures for its
        process (its context, cache and tensors), else at the peak it published. ``None`` when a
        peer's is unknown; ``0`` with no peers. The peers and what was measured are kept for
        :meth:`take`."""
        peers = ledger.peers()
        measured = self._process_memory(probe) if peers else {}
        self.taken = peers, measured
        memory = [measured.get(p.pid, p.memory) for p in peers]
        if any(m is None for m in memory):
            return None
        return float(sum(memory))  # type: ignore[arg-type]

    def take(self, ledger: Ledger) -> tuple[list[Tenant], dict[int, int]]:
        """The peers and their processes' memory :meth:`read` read for this check (once); a check
        without a read gets the ledger's peers, no process measured."""
        taken, self.taken = self.taken, None
        return taken if taken is not None else (ledger.peers(), {})

    def _process_memory(self, probe: MemoryProbe | None) -> dict[int, int]:
        """The device's per-process memory, when the probe measures it and its process ids are
        this job's (NVML gives the host's, which a container renumbers: then none is taken). A
        probe failing to list them, in any way (:func:`~.ladder_reading.process_memory`), is
        said once and read for them no more."""
        if probe is None or self.by_process is False:
            return {}
        try:
            found = process_memory(probe)
        except ProbeUnavailable as error:
            rank_zero_warn(f"SharedDevice: {error}; peers count at the memory they published")
            self.by_process = False
            return {}
        if found is None:
            self.by_process = False
            return {}
        if os.getpid() not in found:  # this job holds memory on the device, so it would be listed
            if self.by_process is None:
                rank_zero_info(
                    "SharedDevice: the device lists no process with this job's id (another process "
                    "namespace, as in a container): peers count at the memory they published"
                )
                self.by_process = False
            return {}
        self.by_process = True
        return found
