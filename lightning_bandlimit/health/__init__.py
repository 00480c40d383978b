"""A job's peers: how a distributed run ends, and how it notices a hung or slow rank.

* :mod:`.exit`: the process group torn down in order when fitting ends, normally or by an
  exception, on every rank (one left to the interpreter's exit can abort it).
* :mod:`.beat`: the heartbeat record a rank stores (a counter, its step, whether it is done),
  encoded in a few ASCII bytes and decoded strictly (plain Python).
* :mod:`.hangs`: the rule deciding, from the peers' beats read at each round, which peer is hung
  (silent for ``hang_timeout``), or that the store has not answered, with its reason (plain Python).
* :mod:`.heartbeat`: the watchdog: every rank publishes a heartbeat and its step to the run's
  store from threads of its own and has the rule judge its peers'; a rank whose peer stops beating
  for ``hang_timeout`` says which rank and step, and exits non-zero (torchrun restarts the group;
  the resume path takes over).
* :mod:`.reap`: a hung peer on this machine is ended with SIGKILL at once (its identity checked),
  not after torchrun's 30 s grace.
* :mod:`.round_store`: a restarted group forms in a namespace of its own in torchrun's shared
  store (the keys its predecessors left there would point it at dead peers).
* :mod:`.stragglers`: a rank persistently slower than the median, reported once (plain Python).
"""
