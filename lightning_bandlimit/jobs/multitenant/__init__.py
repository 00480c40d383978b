"""The multi-tenant scenario: a training job beside a co-tenant process, on a shared memory budget.

One job is one recipe trained in its own process (so its resident memory is its own) beside a
:class:`~lightning_bandlimit.memory.CoTenant` that follows a
:class:`~lightning_bandlimit.memory.RampTrace`, measured every step by a
:class:`~lightning_bandlimit.callbacks.SharedBudget`. A job is ``plain`` (the recipe with plain
``nn.Conv2d``: what the user would otherwise run), ``checkpointed`` (the plain model with every
checkpointable unit always checkpointed: what a user could do instead, no callback), ``fixed``
(band-limited at one compression) or ``adaptive`` (an
:class:`~lightning_bandlimit.callbacks.AdaptiveBandLimit` reading the budget, with the levers
its spec names). The job processes start with ``MALLOC_MMAP_THRESHOLD_=131072`` so that their resident
set follows their live tensors, as a GPU job's reserved memory does after ``empty_cache``;
the plain job runs under the same setting, so the comparison is like for like.

* :mod:`.spec`: a job (:class:`JobSpec`) and what it measured (:class:`JobResult`).
* :mod:`.run`: one job trained in this process (:func:`run_job`); the jobs of one device
  registered in a shared folder (:func:`registered_memory`).
* :mod:`.processes`: jobs launched in processes of their own (:func:`launch`,
  :func:`launch_set`) under :data:`HOST_ALLOCATOR_ENV`.
* :mod:`.command`: one job's process, ``python -m lightning_bandlimit.jobs.multitenant
  SPEC.json`` (what :func:`launch` starts).
* :mod:`.report`: the results read against a budget (:func:`budget_for`,
  :func:`adaptive_thresholds`, :func:`over_budget`) and plotted (:func:`plot_timelines`).

Used by the main job and the multi-tenant, co-training and robustness-study benchmarks.
"""

from lightning_bandlimit.jobs.multitenant.processes import HOST_ALLOCATOR_ENV, launch, launch_set
from lightning_bandlimit.jobs.multitenant.report import (
    adaptive_thresholds,
    budget_for,
    over_budget,
    plot_timelines,
)
from lightning_bandlimit.jobs.multitenant.run import registered_memory, run_job
from lightning_bandlimit.jobs.multitenant.spec import JobResult, JobSpec

__all__ = [
    "HOST_ALLOCATOR_ENV",
    "JobResult",
    "JobSpec",
    "adaptive_thresholds",
    "budget_for",
    "launch",
    "launch_set",
    "over_budget",
    "plot_timelines",
    "registered_memory",
    "run_job",
]
