"""A job's peers: how a distributed run ends, and how it notices a hung or slow rank.

* :mod:`.exit`: the process group torn down in order when fitting ends, normally or by an
  exception, on every rank (one left to the interpreter's exit can abort it).
* :mod:`.heartbeat`: every rank publishes a heartbeat and its step to the run's store; a rank
  whose peer stops beating for ``hang_timeout`` says which rank and step, and exits non-zero
  (torchrun restarts the group; the resume path takes over).
* :mod:`.round_store`: a restarted group forms in a namespace of its own in torchrun's shared
  store (the keys its predecessors left there would point it at dead peers).
* :mod:`.stragglers`: a rank persistently slower than the median, reported once (plain Python).
"""
