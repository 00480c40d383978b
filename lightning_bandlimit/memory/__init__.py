"""Memory probes: free memory of the device a job runs on, other processes' use included.

Example:
    >>> from lightning_bandlimit.memory import ScriptedProbe
    >>> ScriptedProbe([512], total=1024).read().free_fraction
    0.5
"""

from lightning_bandlimit.memory.budget import SharedBudgetProbe
from lightning_bandlimit.memory.cotenant import CoTenant, RampTrace
from lightning_bandlimit.memory.cuda import CudaProbe
from lightning_bandlimit.memory.host import HostMemoryProbe
from lightning_bandlimit.memory.nvml import NVMLProbe
from lightning_bandlimit.memory.probes import auto_probe
from lightning_bandlimit.memory.protocol import MemoryProbe, MemoryReading, ProbeUnavailable
from lightning_bandlimit.memory.scripted import ScriptedProbe

__all__ = [
    "CoTenant",
    "CudaProbe",
    "HostMemoryProbe",
    "MemoryProbe",
    "MemoryReading",
    "NVMLProbe",
    "ProbeUnavailable",
    "RampTrace",
    "ScriptedProbe",
    "SharedBudgetProbe",
    "auto_probe",
]
