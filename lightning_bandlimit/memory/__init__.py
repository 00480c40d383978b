"""Memory probes: free memory of the device a job runs on, other processes' use included.

The ladder's names (:class:`LadderController`, :class:`Setting`, ...) live in
:mod:`lightning_bandlimit.ladder`; they are importable from here too, as in earlier releases.

Example:
    >>> from lightning_bandlimit.memory import ScriptedProbe
    >>> ScriptedProbe([512], total=1024).read().free_fraction
    0.5
"""

from lightning_bandlimit.ladder import (  # noqa: E402  (earlier releases' import path)
    CompressionController,
    Decision,
    LadderController,
    LadderDecision,
    MemoryModel,
    Setting,
)
from lightning_bandlimit.memory.budget import SharedBudgetProbe
from lightning_bandlimit.memory.cotenant import CoTenant, RampTrace
from lightning_bandlimit.memory.probes import (
    CudaProbe,
    HostMemoryProbe,
    MemoryProbe,
    MemoryReading,
    NVMLProbe,
    ProbeUnavailable,
    ScriptedProbe,
    auto_probe,
)

__all__ = [
    "CoTenant",
    "CompressionController",
    "CudaProbe",
    "Decision",
    "HostMemoryProbe",
    "LadderController",
    "LadderDecision",
    "MemoryProbe",
    "MemoryModel",
    "MemoryReading",
    "NVMLProbe",
    "ProbeUnavailable",
    "RampTrace",
    "ScriptedProbe",
    "Setting",
    "SharedBudgetProbe",
    "auto_probe",
]
