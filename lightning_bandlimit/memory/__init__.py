"""Memory probes: free memory of the device a job runs on, other processes' use included.

Example:
    >>> from lightning_bandlimit.memory import ScriptedProbe
    >>> ScriptedProbe([512], total=1024).read().free_fraction
    0.5
"""

from lightning_bandlimit.memory.budget import SharedBudgetProbe
from lightning_bandlimit.memory.controller import CompressionController, Decision, MemoryModel
from lightning_bandlimit.memory.cotenant import CoTenant, RampTrace
from lightning_bandlimit.memory.ladder import LadderController, LadderDecision, Setting
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
