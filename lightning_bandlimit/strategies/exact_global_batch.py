"""Keep the global batch exactly on every world size: micro-batch x accumulation x processes.

DeepSpeed Elasticity's idea as a :class:`~lightning_bandlimit.strategies.ScalingRule`: the user
fixes the global batch ``G`` (samples per optimizer step) and the micro-batch sizes a device may
run; for each world size ``W`` the rule picks the largest allowed micro-batch ``m`` whose
accumulation ``a = G / (W m)`` is a whole number no larger than ``max_accumulation``. Then every
optimizer step averages the gradient of exactly ``G`` samples whatever ``W`` is, so the learning
rate, momentum and schedule need no change. The valid world sizes are known before training
(:meth:`ExactGlobalBatch.valid_world_sizes`), and a world size without an exact plan is refused
before any step, or, with ``fallback=True``, trained at the nearest global batch with the LR
rescaled linearly (Goyal et al.) for the rest.

What changes with the micro-batch is BatchNorm: its statistics are computed per micro-batch on
each device. The loss and the gradient are those of the fixed run only while ``m`` stays the same
(e.g. 64 x 2 accumulation on one device, 64 x 1 on two); see the README's elastic section.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from lightning_bandlimit.strategies.scaling_rule import MicroBatchPlan, ScalingRule, TrainingConfig
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["ExactGlobalBatch"]


class ExactGlobalBatch(ScalingRule):
    """Keep the global batch exactly by choosing the micro-batch and the accumulation.

    Args:
        global_batch: samples per optimizer step, on every world size.
        micro_batches: the micro-batch sizes a device may run (e.g. ``[32, 64]``); ``None`` for
            every size from 1 to ``max_micro_batch``.
        max_micro_batch: the largest micro-batch when ``micro_batches`` is ``None``.
        max_accumulation: the most micro-batches per optimizer step.
        max_world_size: the largest world size :meth:`valid_world_sizes` reports.
        fallback: on a world size with no exact plan, train at the nearest global batch (LR
            rescaled linearly for the rest, logged) instead of refusing it.

    Raises:
        ValueError: if a size is not positive, neither or both of ``micro_batches`` and
            ``max_micro_batch`` are given, or no world size has an exact plan.
        TypeError: if a size is not an int.

    Example:
        >>> rule = ExactGlobalBatch(128, micro_batches=[32, 64])
        >>> rule.valid_world_sizes()
        [1, 2, 4]
        >>> rule.plan(2)
        MicroBatchPlan(world_size=2, micro_batch=64, accumulation=1, exact=True)
        >>> ref = TrainingConfig(world_size=1, per_device_batch=64, accumulation=2, lr=0.1)
        >>> new = rule.adjust(ref, world_size=4)
        >>> new.per_device_batch, new.accumulation, new.global_batch, new.lr
        (32, 1, 128, 0.1)
        >>> rule.plan(3)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: ExactGlobalBatch: ... on 3 processes; valid world sizes: [1, 2, 4] (or pass fallback=True)
        >>> ExactGlobalBatch(128, micro_batches=[32, 64], fallback=True).plan(3)  # 3 x 32 x 1 = 96
        MicroBatchPlan(world_size=3, micro_batch=32, accumulation=1, exact=False)
    """

    name = "exact-global-batch"
    chooses_accumulation = True
    chooses_micro_batch = True

    def __init__(
        self,
        global_batch: int,
        micro_batches: Sequence[int] | None = None,
        max_micro_batch: int | None = None,
        max_accumulation: int = 64,
        max_world_size: int = 64,
        fallback: bool = False,
    ) -> None:
        self.global_batch = check_int("global_batch", global_batch, minimum=1)
        if (micro_batches is None) == (max_micro_batch is None):
            raise ValueError(
                "ExactGlobalBatch: give either micro_batches (the sizes allowed) or max_micro_batch, got "
                f"micro_batches={micro_batches!r} and max_micro_batch={max_micro_batch!r}"
            )
        if micro_batches is None:
            top = check_int("max_micro_batch", max_micro_batch, minimum=1)
            sizes = list(range(1, top + 1))
        else:
            sizes = [check_int("micro_batches[]", m, minimum=1) for m in micro_batches]
            if not sizes:
                raise ValueError("ExactGlobalBatch: micro_batches must name at least one size, got []")
        self.micro_batches = tuple(sorted(set(sizes)))
        self._sizes = f"1..{max_micro_batch}" if micro_batches is None else str(list(self.micro_batches))
        self.max_accumulation = check_int("max_accumulation", max_accumulation, minimum=1)
        self.max_world_size = check_int("max_world_size", max_world_size, minimum=1)
        self.fallback = bool(fallback)
        if not self.valid_world_sizes():
            raise ValueError(
                f"ExactGlobalBatch: no world size up to {self.max_world_size} makes a global batch of "
                f"exactly {self.global_batch} from micro-batches {self._sizes} with at most "
                f"{self.max_accumulation} accumulation steps"
            )

    def _exact(self, world_size: int) -> MicroBatchPlan | None:
        for micro in reversed(self.micro_batches):  # the largest micro-batch runs fastest
            per_step = world_size * micro
            if self.global_batch % per_step == 0 and self.global_batch // per_step <= self.max_accumulation:
                return MicroBatchPlan(world_size, micro, self.global_batch // per_step)
        return None

    def valid_world_sizes(self) -> list[int]:
        """The world sizes from 1 to ``max_world_size`` that have an exact plan."""
        return [w for w in range(1, self.max_world_size + 1) if self._exact(w) is not None]

    def plan(self, world_size: int) -> MicroBatchPlan:
        """The micro-batch and accumulation for ``world_size`` processes.

        Args:
            world_size: the number of processes, ``>= 1``.

        Raises:
            ValueError: if no exact plan exists and ``fallback`` is off (the message lists the
                valid world sizes).
        """
        check_int("world_size", world_size, minimum=1)
        exact = self._exact(world_size)
        if exact is not None:
            return exact
        if not self.fallback:
            raise ValueError(
                f"ExactGlobalBatch: no micro-batch in {self._sizes} with at most "
                f"{self.max_accumulation} accumulation steps makes a global batch of exactly "
                f"{self.global_batch} on {world_size} processes; valid world sizes: "
                f"{self.valid_world_sizes()} (or pass fallback=True)"
            )
        candidates = [
            MicroBatchPlan(world_size, m, a, exact=False)
            for m in self.micro_batches
            for a in range(1, self.max_accumulation + 1)
        ]
        # nearest global batch; then the larger micro-batch (fewer, faster steps)
        return min(candidates, key=lambda p: (abs(p.global_batch - self.global_batch), -p.micro_batch))

    def micro_batch_plan(self, world_size: int) -> MicroBatchPlan:
        """:meth:`plan`: this rule always chooses the micro-batch."""
        return self.plan(world_size)

    def describe(self, plan: MicroBatchPlan, loader_batch: int | None = None) -> str:
        """One line saying what ``plan`` runs, the valid world sizes and, for a fallback, the LR.

        Args:
            plan: a plan of this rule.
            loader_batch: the training loader's own ``batch_size``, said to be replaced when it
                differs from the plan's micro-batch.

        Example:
            >>> rule = ExactGlobalBatch(128, micro_batches=[32, 64])
            >>> rule.describe(rule.plan(2), loader_batch=32)  # doctest: +NORMALIZE_WHITESPACE
            "global batch 128 on 2 processes = micro-batch 64 x accumulation 1 (the training
            loader's batch_size 32 is replaced); world sizes with an exact global batch of 128:
            [1, 2, 4]"
        """
        message = (
            f"{super().describe(plan, loader_batch)}; world sizes with an exact "
            f"global batch of {self.global_batch}: {self.valid_world_sizes()}"
        )
        if not plan.exact:
            message += (
                f". No exact plan exists for {plan.world_size} processes: training at the nearest global "
                f"batch {plan.global_batch} with the LR rescaled linearly (fallback=True)"
            )
        return message

    def adjust(
        self,
        reference: TrainingConfig,
        world_size: int,
        damping: float = 1.0,
        accumulation: int | None = None,
    ) -> TrainingConfig:
        """The reference's hyperparameters with this world size's micro-batch and accumulation.

        The LR changes only for a fallback plan: by ``(global batch / this rule's) ** damping``.
        ``accumulation`` is ignored: the rule chooses it.
        """
        check_real("damping", damping, minimum=0.0, maximum=1.0)
        plan = self.plan(world_size)
        k = (plan.global_batch / self.global_batch) ** damping
        return replace(
            reference,
            world_size=world_size,
            per_device_batch=plan.micro_batch,
            accumulation=plan.accumulation,
            lr=reference.lr * k,
        )

    def __repr__(self) -> str:
        return (
            f"ExactGlobalBatch(global_batch={self.global_batch}, micro_batches={self._sizes}, "
            f"max_accumulation={self.max_accumulation}, fallback={self.fallback})"
        )
