"""``ElasticSampler``: a distributed sampler that resumes mid-epoch at any world size.

A DDP job restarted by ``torchrun`` with a different number of processes loses its place in
the epoch with :class:`~torch.utils.data.DistributedSampler`, whose partition depends on the
world size: resuming either restarts the epoch or repeats and skips samples. This sampler
partitions one *global* order instead:

* Each epoch has one permutation of ``range(dataset_size)`` (``torch.randperm`` seeded with
  ``seed + epoch``; the identity when ``shuffle=False``), the same on every rank and at every
  world size.
* It is consumed in global steps of ``num_replicas * batch_size`` consecutive entries; within a
  step, rank ``r`` takes entries ``[r * batch_size, (r + 1) * batch_size)``.
* :attr:`ElasticSampler.consumed` counts the entries all ranks together have consumed (at a
  step boundary), and iteration starts at ``permutation[consumed:]``. A checkpoint stores
  ``(epoch, consumed)``; a restart with any world size or per-device batch re-partitions
  exactly the remaining entries, so no sample of the epoch is repeated or skipped.
* The final partial global step (fewer than ``num_replicas * batch_size`` entries left) is
  split into ``num_replicas`` contiguous chunks whose sizes differ by at most one, the first
  chunks taking the extra samples.

The training loop, not the iterator, moves :attr:`~ElasticSampler.consumed` forward (with
:meth:`ElasticSampler.advance`), because a ``DataLoader`` prefetches ahead of training.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from lightning_bandlimit.utils.validation import check_int

__all__ = ["ElasticSampler"]


class ElasticSampler(Sampler[int]):
    """Shard one global per-epoch order across ranks, resumable at any world size.

    Use it with ``DataLoader(dataset, batch_size=batch_size, sampler=sampler)`` (the loader's
    ``batch_size`` must equal this ``batch_size``), call :meth:`set_epoch` at the start of each
    epoch and :meth:`advance` after each global step, and save :meth:`state_dict` with the
    checkpoint. With Lightning, pass ``use_distributed_sampler=False`` to the ``Trainer`` or it
    wraps this sampler in a ``DistributedSamplerWrapper``.

    Each rank yields the same number of samples from every full global step. In the final
    partial step a rank gets ``remaining // num_replicas`` or one more; when fewer samples than
    ranks remain, the last ranks get **none**, so they yield one batch fewer than the others
    (with DDP, that rank skips the last collective; choose sizes, or ``drop_last`` upstream, so
    that this does not happen if the model needs every rank in every step).

    Args:
        dataset_size: number of samples in the dataset, ``>= 0``.
        batch_size: per-device batch, ``>= 1``.
        num_replicas: world size; defaults to ``torch.distributed``'s when initialised, else 1.
        rank: this process's rank in ``[0, num_replicas)``; defaults to ``torch.distributed``'s
            when initialised, else 0.
        shuffle: permute the samples each epoch; ``False`` keeps ``0, 1, 2, ...``.
        seed: the permutation of epoch ``e`` uses a generator seeded with ``seed + e``; the same
            on every rank.
        full_epoch_len: make ``len()`` count this rank's share of the *whole* epoch at the
            current world size, not just what is left (:meth:`remaining`). Training loops that
            plan a fixed number of batches per epoch from ``len()`` (Lightning's) then keep the
            right count for the epochs after a mid-epoch resume.

    Raises:
        ValueError: if ``dataset_size < 0``, ``batch_size < 1``, ``num_replicas < 1`` or
            ``rank`` is outside ``[0, num_replicas)``.
        TypeError: if one of them, or ``seed``, is not an ``int``.

    Example:
        >>> sampler = ElasticSampler(10, batch_size=2, num_replicas=2, rank=0, shuffle=False)
        >>> list(sampler)  # steps [0..3], [4..7]; the tail [8, 9] is split in two
        [0, 1, 4, 5, 8]
        >>> sampler.advance(1)  # one global step (2 ranks x 2 samples) done
        >>> sampler.consumed
        4
        >>> alone = ElasticSampler(10, batch_size=2, num_replicas=1, rank=0, shuffle=False)
        >>> alone.load_state_dict(sampler.state_dict())  # resume with one process
        >>> list(alone), len(alone)
        ([4, 5, 6, 7, 8, 9], 6)
    """

    def __init__(
        self,
        dataset_size: int,
        batch_size: int,
        *,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        full_epoch_len: bool = False,
    ) -> None:
        initialised = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if initialised else 1
        if rank is None:
            rank = dist.get_rank() if initialised else 0
        self.dataset_size = check_int("dataset_size", dataset_size, minimum=0)
        self.batch_size = check_int("batch_size", batch_size, minimum=1)
        self.num_replicas = check_int("num_replicas", num_replicas, minimum=1)
        check_int("rank", rank, minimum=0)
        if rank >= num_replicas:
            raise ValueError(
                f"expected rank in [0, {num_replicas}) for num_replicas={num_replicas}, got {rank}"
            )
        self.rank = rank
        self.shuffle = bool(shuffle)
        self.seed = check_int("seed", seed, minimum=-(2**63))
        self.epoch = 0
        self._consumed = 0
        self.full_epoch_len = bool(full_epoch_len)

    @property
    def consumed(self) -> int:
        """Samples of the current epoch already consumed by all ranks together."""
        return self._consumed

    @property
    def global_batch(self) -> int:
        """Samples one global step consumes: ``num_replicas * batch_size``."""
        return self.num_replicas * self.batch_size

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a *different* epoch restarts at ``consumed = 0``.

        Setting the epoch the sampler already has (as Lightning does after a restored
        checkpoint) keeps :attr:`consumed`, so a resumed epoch continues where it stopped.

        Args:
            epoch: the epoch number, ``>= 0``.

        Raises:
            ValueError: if ``epoch`` is negative.

        Example:
            >>> sampler = ElasticSampler(8, batch_size=2, num_replicas=1, rank=0)
            >>> sampler.advance(2); sampler.set_epoch(0); sampler.consumed
            4
            >>> sampler.set_epoch(1); sampler.consumed
            0
        """
        check_int("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self._consumed = 0
        self.epoch = epoch

    def advance(self, steps: int = 1) -> None:
        """Record ``steps`` completed global steps: ``consumed += steps * global_batch``.

        A global step is one ``DataLoader`` batch on every rank (so, with gradient accumulation,
        ``accumulation`` per optimizer step). ``consumed`` is capped at ``dataset_size``, which
        also covers the final, partial step. Call it after the step and before the checkpoint
        that should resume after it.

        Args:
            steps: completed global steps, ``>= 0``.

        Raises:
            ValueError: if ``steps`` is negative.

        Example:
            >>> sampler = ElasticSampler(10, batch_size=3, num_replicas=2, rank=1)
            >>> sampler.advance(1); sampler.consumed
            6
            >>> sampler.advance(1); sampler.consumed  # capped at dataset_size
            10
        """
        check_int("steps", steps, minimum=0)
        self._consumed = min(self.dataset_size, self._consumed + steps * self.global_batch)

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands: ``epoch``, ``consumed``, ``seed``, ``dataset_size``, ``shuffle``.

        The world size and batch size are deliberately not part of it: a different one may load it.

        Example:
            >>> ElasticSampler(10, batch_size=2, num_replicas=1, rank=0, seed=3).state_dict()
            {'epoch': 0, 'consumed': 0, 'seed': 3, 'dataset_size': 10, 'shuffle': True}
        """
        return {
            "epoch": self.epoch,
            "consumed": self._consumed,
            "seed": self.seed,
            "dataset_size": self.dataset_size,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`, saved at any world size and per-device batch.

        Args:
            state: a mapping from :meth:`state_dict`.

        Raises:
            KeyError: if a key is missing.
            TypeError: if ``epoch`` or ``consumed`` is not an ``int``.
            ValueError: if ``dataset_size``, ``shuffle`` or ``seed`` differ from this sampler's
                (the saved position would then point into a different order), or ``epoch`` /
                ``consumed`` are out of range (``consumed`` must lie in ``[0, dataset_size]``).

        Example:
            >>> saved = ElasticSampler(10, batch_size=2, num_replicas=1, rank=0).state_dict()
            >>> ElasticSampler(12, batch_size=2, num_replicas=1, rank=0).load_state_dict(saved)
            Traceback (most recent call last):
            ...
            ValueError: dataset_size mismatch: this sampler has 12, the state has 10
        """
        for key in ("dataset_size", "shuffle", "seed"):
            mine, theirs = getattr(self, key), state[key]
            if mine != theirs:
                raise ValueError(f"{key} mismatch: this sampler has {mine!r}, the state has {theirs!r}")
        epoch = check_int("epoch", state["epoch"], minimum=0)
        consumed = check_int("consumed", state["consumed"], minimum=0)
        if consumed > self.dataset_size:
            raise ValueError(f"consumed must be <= dataset_size={self.dataset_size}, got {consumed}")
        self.epoch, self._consumed = epoch, consumed

    def permutation(self) -> list[int]:
        """The current epoch's global order (the same on every rank)."""
        if not self.shuffle:
            return list(range(self.dataset_size))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.dataset_size, generator=generator).tolist()

    def _tail_chunk(self, tail: int) -> tuple[int, int]:
        """Start and size of this rank's chunk of a final partial step of ``tail`` samples."""
        base, extra = divmod(tail, self.num_replicas)
        return self.rank * base + min(self.rank, extra), base + (1 if self.rank < extra else 0)

    def remaining(self, consumed: int | None = None) -> int:
        """Samples this rank yields from ``consumed`` (default: :attr:`consumed`) to the epoch's end."""
        start = self._consumed if consumed is None else consumed
        full_steps, tail = divmod(self.dataset_size - start, self.global_batch)
        return full_steps * self.batch_size + self._tail_chunk(tail)[1]

    def __len__(self) -> int:
        """:meth:`remaining`, or this rank's whole epoch (``remaining(0)``) with ``full_epoch_len``."""
        return self.remaining(0 if self.full_epoch_len else None)

    def __iter__(self) -> Iterator[int]:
        """This rank's indices from :attr:`consumed` on, fixed when the iterator is created."""
        remaining = self.permutation()[self._consumed :]
        full_steps, tail = divmod(len(remaining), self.global_batch)
        mine: list[int] = []
        offset = self.rank * self.batch_size
        for step in range(full_steps):
            start = step * self.global_batch + offset
            mine.extend(remaining[start : start + self.batch_size])
        chunk_start, chunk_size = self._tail_chunk(tail)
        start = full_steps * self.global_batch + chunk_start
        mine.extend(remaining[start : start + chunk_size])
        return iter(mine)
