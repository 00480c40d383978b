"""One launch (one phase) of an elastic benchmark run; every rank executes it."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from benchmarks.common.trainer import QUIET
from benchmarks.elastic.plan import benchmark_rule, library_fingerprint


def worker(cfg: dict[str, Any]) -> None:
    """One launch (one phase) of a run; every rank executes this (Lightning re-runs the command)."""
    import lightning.pytorch as pl
    import torch

    from lightning_bandlimit.data import SyntheticImageDataModule
    from lightning_bandlimit.models import ImageClassifier
    from lightning_bandlimit.strategies import ElasticDDPStrategy, SampleSchedule
    from lightning_bandlimit.utils.files import atomic_write_json

    class AdamWClassifier(ImageClassifier):
        """``ImageClassifier`` trained by AdamW with the same ``SampleSchedule``."""

        def configure_optimizers(self) -> Any:
            hp = self.hparams
            optimizer = torch.optim.AdamW(
                self.parameters(), lr=hp.learning_rate, weight_decay=hp.weight_decay
            )
            total_steps = max(1, int(self.trainer.estimated_stepping_batches))
            schedule = self._sample_schedule(optimizer, total_steps)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    class PrefilledData(SyntheticImageDataModule):
        """The synthetic data module with its image cache filled from images rendered by the parent."""

        def setup(self, stage: str | None = None) -> None:
            super().setup(stage)
            rendered = torch.load(cfg["data"], weights_only=True)
            for dataset, images in ((self.train_set, rendered["train"]), (self.val_set, rendered["val"])):
                assert len(images) == len(dataset) and dataset._cache is not None
                dataset._cache.update(enumerate(images))

    class PhaseEnd(pl.Callback):
        """Save the checkpoint and stop right after the optimizer step that reaches ``end`` samples."""

        def __init__(self, end: int | None, path: str | None) -> None:
            self.end, self.path, self._step = end, path, 0

        def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
            self._step = trainer.global_step

        def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
            seen = trainer.strategy.samples_seen
            if self.end is None or trainer.global_step == self._step or seen < self.end:
                return
            if seen != self.end:
                raise RuntimeError(f"phase overshot its end: {seen} samples seen, planned {self.end}")
            trainer.save_checkpoint(self.path)  # a collective: every rank calls it
            trainer.should_stop = True

    class RecordIndices(pl.Callback):
        """Which training images (by index) this rank trained on, per epoch."""

        def __init__(self, lookup: dict[bytes, int]) -> None:
            self.lookup, self.seen = lookup, {}

        def on_train_batch_start(
            self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int
        ) -> None:
            keys = batch[0][:, 0, 0, :8].contiguous().numpy()
            indices = [self.lookup[row.tobytes()] for row in keys]
            self.seen.setdefault(str(trainer.current_epoch), []).extend(indices)

    t_start = time.perf_counter()
    import lightning_bandlimit

    package = Path(lightning_bandlimit.__file__).parent
    fingerprint = library_fingerprint(package)
    pl.seed_everything(cfg["seed"], verbose=False)
    data = PrefilledData(
        train_size=cfg["train_size"],
        val_size=cfg["val_size"],
        test_size=0,
        batch_size=cfg["batch"],
        seed=cfg["seed"],
    )
    data.setup("fit")
    train_images = torch.stack([data.train_set[i][0] for i in range(len(data.train_set))])
    lookup = {row.tobytes(): i for i, row in enumerate(train_images[:, 0, 0, :8].contiguous().numpy())}
    if len(lookup) != len(train_images):
        raise RuntimeError("two training images share their first pixels; cannot record indices")
    model_class = AdamWClassifier if cfg["optimizer"] == "adamw" else ImageClassifier
    model = model_class(
        "small_cnn", width=cfg["width"], lr_schedule="samples", learning_rate=cfg["lr"], momentum=0.9
    )
    recorder = RecordIndices(lookup)
    rule = benchmark_rule(cfg["rule"], cfg["batch"])
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=cfg["devices"],
        strategy=ElasticDDPStrategy(rule=rule, cpu_threads=1, seed=cfg["seed"]),
        max_epochs=cfg["epochs"],
        accumulate_grad_batches=cfg["accumulation"],
        **QUIET,
        num_sanity_val_steps=0,
        callbacks=[PhaseEnd(cfg.get("phase_end"), cfg.get("save")), recorder],
    )
    t_fit = time.perf_counter()
    trainer.fit(model, train_dataloaders=data.train_dataloader(), ckpt_path=cfg.get("resume"))
    fit_s = time.perf_counter() - t_fit
    strategy = trainer.strategy
    out = Path(cfg["out"])
    atomic_write_json(
        out.parent / f"{out.stem}-indices-rank{trainer.global_rank}.json", recorder.seen, indent=None
    )
    record: dict[str, Any] = {}
    if cfg.get("validate"):
        t_val = time.perf_counter()
        (metrics,) = trainer.validate(model, dataloaders=data.val_dataloader(), verbose=False)
        record.update(
            val_acc=float(metrics["val/acc"]),
            val_loss=float(metrics["val/loss"]),
            val_s=time.perf_counter() - t_val,
        )
    if trainer.global_rank == 0:
        schedule = next(
            c.scheduler for c in trainer.lr_scheduler_configs if isinstance(c.scheduler, SampleSchedule)
        )
        applied = strategy.applied
        micro_batch = strategy.sampler.batch_size  # the training loader's, after any rebuild
        record.update(
            devices=cfg["devices"],
            accumulation_launched=cfg["accumulation"],
            accumulation_applied=trainer.accumulate_grad_batches,
            micro_batch=micro_batch,
            global_batch=cfg["devices"] * micro_batch * trainer.accumulate_grad_batches,
            plan=None if strategy.plan is None else dataclasses.asdict(strategy.plan),
            rule=cfg["rule"],
            samples_seen=strategy.samples_seen,
            global_step=trainer.global_step,
            epoch=trainer.current_epoch,
            resized_from=strategy.resized_from,
            rollbacks=strategy.rollbacks,
            applied=None if applied is None else {**applied.__dict__, "global_batch": applied.global_batch},
            adascale_gain=strategy.gain if cfg["rule"] == "adascale" else None,
            schedule_progress=schedule.progress,
            schedule_total=schedule.total_samples,
            final_lr=float(trainer.optimizers[0].param_groups[0]["lr"]),
            fit_s=fit_s,
            worker_s=time.perf_counter() - t_start,
            threads=torch.get_num_threads(),
            library=fingerprint,
            library_path=str(package),
        )
        atomic_write_json(out, record, indent=None)
