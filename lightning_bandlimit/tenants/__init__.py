"""Several training jobs on one device: how their memory-aware callbacks know each other and
share one ladder (plain Python: no torch, no Lightning).

* :mod:`.ledger`: a device's tenants find each other without a server: one small file per job
  in a shared folder, written atomically, with a heartbeat (:class:`Ledger`, :class:`Tenant`).
* :mod:`.entries`: the folder is untrusted input: what a file must be, and each field, to count
  as an entry (anything else is skipped and named once: :class:`BadEntry`).
* :mod:`.coordination`: one ladder across the tenants: the cheapest lever across every job moves
  first, exact before lossy; on release the lossy part first, across jobs
  (:class:`Coordination`; what each job offers: :func:`offer`).
* :mod:`.arrival`: the arrival protocol, by which peers make room for a job before its first
  step: its states (:class:`Arrival`), events and transitions (:func:`advance`), and the room a
  job's move frees (:func:`room_to_free`).
"""

from lightning_bandlimit.tenants.arrival import Arrival, Event, Phase, Room, advance, room_to_free
from lightning_bandlimit.tenants.coordination import Coordination, offer
from lightning_bandlimit.tenants.entries import BadEntry
from lightning_bandlimit.tenants.ledger import Ledger, Tenant

__all__ = [
    "Arrival",
    "BadEntry",
    "Coordination",
    "Event",
    "Ledger",
    "Phase",
    "Room",
    "Tenant",
    "advance",
    "offer",
    "room_to_free",
]
