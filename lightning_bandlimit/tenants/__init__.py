"""Several training jobs on one device: how their memory-aware callbacks know each other and
share one ladder (plain Python: no torch, no Lightning).

* :mod:`.ledger`: a device's tenants find each other without a server: one small file per job
  in a shared folder, written atomically, with a heartbeat (:class:`Ledger`, :class:`Tenant`).
* :mod:`.entries`: the folder is untrusted input: what a file must be, and each field, to count
  as an entry (anything else is skipped and named once: :class:`BadEntry`).
* :mod:`.offer`: what a job publishes of itself: its setting (rung, split, compression), its
  measured peaks and its next move's saving and cost (:func:`offer`).
* :mod:`.coordination`: one ladder across the tenants, a rule every job applies alike: the
  cheapest lever across every job moves first, exact before lossy; on release the lossy part
  first, across jobs (:class:`Coordination`).
* :mod:`.order`: which job's move comes first: under a shortfall the cheapest, on release the
  one furthest up its ladder (compression, then split, then rung).
* :mod:`.room`: what a settled job's check does while a peer arrives: nothing given back, room
  made by exact rungs, one job at a time.
* :mod:`.refit`: an arrival's top rung, taken before it was measured, given back once to what a
  run of its model on the device measured to fit.
* :mod:`.trust`: what a peer's entry claims counts no further than the device and the clock show.
* :mod:`.arrival`: the arrival protocol, by which peers make room for a job before its first
  step: its states (:class:`Arrival`), events and transitions (:func:`advance`), and the room a
  job's move frees (:func:`room_to_free`).
"""

from lightning_bandlimit.tenants.arrival import Arrival, Event, Phase, Room, advance, room_to_free
from lightning_bandlimit.tenants.coordination import Coordination
from lightning_bandlimit.tenants.entries import BadEntry
from lightning_bandlimit.tenants.ledger import Ledger, Tenant
from lightning_bandlimit.tenants.offer import offer

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
