"""The lightning-bandlimit command line: recipes, LightningCLI subcommands, checkpoints."""

import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_bandlimit.jobs.cli import BandLimitCLI, main
from lightning_bandlimit.utils.command_line import CommandLineError, one_line_error
from lightning_bandlimit.utils.recipe_files import recipe_path, recipes

TINY = [
    "--trainer.max_epochs",
    "1",
    "--data.train_size",
    "32",
    "--data.val_size",
    "16",
    "--data.batch_size",
    "8",
    "--model.backbone",
    "small_cnn",
    "--model.width",
    "4",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
]


def test_recipes_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    main(["recipes"])
    out = capsys.readouterr().out
    assert set(recipes()) == {
        "quickstart",
        "cifar10-resnet18",
        "elastic",
        "elastic_exact",
        "robustness",
        "robustness_study",
    }
    assert "quickstart" in out and "CIFAR-10" in out


def test_unknown_recipe_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "no-such-recipe"])
    assert exit_info.value.code == 2
    assert "no-such-recipe" in capsys.readouterr().err
    with pytest.raises(
        FileNotFoundError, match="recipes: cifar10-resnet18, elastic, elastic_exact, quickstart, robustness"
    ):
        recipe_path("no-such-recipe")


def test_recipe_by_path_and_by_name_give_the_same_objects(tmp_path: Path) -> None:
    copy = tmp_path / "mine.yaml"
    copy.write_text(recipe_path("quickstart").read_text())
    by_name = BandLimitCLI(args=["--config", "quickstart"], run=False)
    by_path = BandLimitCLI(args=[f"--config={copy}"], run=False)
    assert type(by_name.model) is type(by_path.model)
    assert by_name.datamodule.hparams == by_path.datamodule.hparams


def test_short_class_names_resolve() -> None:
    cli = BandLimitCLI(
        args=[
            "--model",
            "ImageClassifier",
            "--model.backbone",
            "small_cnn",
            "--data",
            "SyntheticImageDataModule",
            "--trainer.callbacks+=BandLimit",
            "--trainer.callbacks.compression",
            "0.3",
        ],
        run=False,
    )
    assert type(cli.model).__name__ == "ImageClassifier"
    band = [cb for cb in cli.trainer.callbacks if type(cb).__name__ == "BandLimit"]
    assert len(band) == 1 and band[0].compression == 0.3


def test_cifar10_recipe_reads_a_local_folder(tmp_path: Path) -> None:
    from lightning_bandlimit.data import write_fake_cifar10

    folder = write_fake_cifar10(tmp_path / "cifar")
    cli = BandLimitCLI(
        args=[
            "--config",
            "cifar10-resnet18",
            "--data.data_dir",
            str(folder),
            "--data.val_size",
            "10",
            "--data.num_workers",
            "0",
        ],
        run=False,
    )
    cli.datamodule.setup("fit")
    assert len(cli.datamodule.val_dataloader().dataset) == 10


@pytest.mark.slow
def test_fit_then_validate_with_and_without_band_limiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", "quickstart", *TINY])
    run = tmp_path / "runs" / "quickstart" / "lightning_logs" / "version_0"
    assert (run / "metrics.csv").is_file() and (run / "config.yaml").is_file()
    ckpt = run / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    assert "BandLimit/compression" in (run / "metrics.csv").read_text().splitlines()[0]
    banded = BandLimitCLI(args=["validate", "--config", "quickstart", *TINY, "--ckpt_path", str(ckpt)])
    assert type(banded.model.backbone[0]).__name__ == "BandLimitedConv2d"
    plain = BandLimitCLI(
        args=["validate", "--config", "quickstart", *TINY, "--ckpt_path", str(ckpt), "--trainer.callbacks=[]"]
    )
    assert type(plain.model.backbone[0]).__name__ == "Conv2d"
    assert "val/acc" in plain.trainer.callback_metrics


@pytest.mark.slow
def test_module_entry_point_and_print_config() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_bandlimit", "fit", "--config", "quickstart", "--print_config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "lightning_bandlimit.callbacks.BandLimit" in proc.stdout
    assert "LightningCLI's args parameter" not in proc.stderr


@pytest.mark.parametrize("recipe", ["quickstart", "cifar10-resnet18"])
def test_recipe_compression_can_be_set_from_the_command_line(recipe: str) -> None:
    cli = BandLimitCLI(
        args=[
            "--config",
            recipe,
            "--trainer.callbacks.compression",
            "0.9",
            "--data.init_args.num_workers",
            "0",
        ]
        if recipe.startswith("cifar")
        else ["--config", recipe, "--trainer.callbacks.compression", "0.9"],
        run=False,
    )
    band = [cb for cb in cli.trainer.callbacks if type(cb).__name__ == "BandLimit"]
    assert len(band) == 1 and band[0].compression == 0.9


def test_optimizer_and_scheduler_are_configurable_the_lightningcli_way() -> None:
    # LightningCLI warns that it overrides the model's configure_optimizers (its own wording):
    # what matters is that the optimizer and scheduler asked for are the ones used
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cli = BandLimitCLI(
            args=[
                "--config",
                "quickstart",
                "--optimizer",
                "Adam",
                "--optimizer.lr",
                "0.003",
                "--lr_scheduler",
                "StepLR",
                "--lr_scheduler.step_size",
                "5",
            ],
            run=False,
        )
    optimizers, schedulers = cli.model.configure_optimizers()
    assert type(optimizers[0]).__name__ == "Adam" and optimizers[0].defaults["lr"] == 0.003
    assert type(schedulers[0]).__name__ == "StepLR" and schedulers[0].step_size == 5


# Bad values on the command line: one line "lightning-bandlimit: error: ..." and exit status 2.


@pytest.mark.slow
def test_bad_compression_is_one_line_from_the_console_script(tmp_path: Path) -> None:
    # also the console script's test: installed with the package, it runs the CLI
    script = Path(sys.executable).parent / "lightning-bandlimit"
    assert script.is_file()
    proc = subprocess.run(
        [str(script), "fit", "--config", "quickstart", "--trainer.callbacks.compression", "1.5"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    # Lightning may log "Seed set to 0" before; the error is the last line, and the only one.
    assert lines[-1] == "lightning-bandlimit: error: compression must be in [0, 1), got 1.5"
    assert sum("error" in line for line in lines) == 1
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--trainer.callbacks.nosuch", "3"],
            "lightning-bandlimit: error: --trainer.callbacks: Option 'nosuch' is not accepted",
        ),
        (
            ["--trainer.max_epochs", "abc"],
            "lightning-bandlimit: error: --trainer.max_epochs: Expected a <class 'int'>. Got value: abc",
        ),
        (["--model.width", "-3"], "lightning-bandlimit: error: width must be >= 1, got -3"),
        (["--model", "NoSuchModel"], "lightning-bandlimit: error: --model: "),
        (["--nosuch", "1"], "lightning-bandlimit: error: unrecognized arguments: --nosuch 1"),
    ],
)
def test_bad_values_end_in_one_line_and_exit_2(
    args: list[str], message: str, error_line: Callable[[], str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "quickstart", *args])
    assert exit_info.value.code == 2
    assert error_line().startswith(message)


def test_missing_data_dir_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error_line: Callable[[], str]
) -> None:
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no-cifar"
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--config",
                "cifar10-resnet18",
                "--data.data_dir",
                str(missing),
                "--trainer.logger",
                "false",
            ]
        )
    assert exit_info.value.code == 2
    line = error_line()
    assert (
        line.startswith("lightning-bandlimit: error: ") and str(missing) in line and "does not exist" in line
    )


def test_an_error_during_training_keeps_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_bandlimit.models import ImageClassifier

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in training_step")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ImageClassifier, "training_step", broken)
    with pytest.raises(RuntimeError, match="a bug in training_step"):
        main(["fit", "--config", "quickstart", *TINY])


def test_jsonargparse_debug_keeps_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JSONARGPARSE_DEBUG", "true")
    with pytest.raises(CommandLineError, match=r"^compression must be in \[0, 1\), got 1.5$") as info:
        main(["fit", "--config", "quickstart", "--trainer.callbacks.compression", "1.5"])
    assert isinstance(info.value.__cause__, ValueError)


def test_usage_errors_is_opt_in_for_the_python_api() -> None:
    args = ["--config", "quickstart", "--trainer.callbacks.compression", "1.5"]
    with pytest.raises(CommandLineError, match=r"^compression must be in \[0, 1\), got 1.5$"):
        BandLimitCLI(args=args, run=False, usage_errors=True)
    with pytest.raises(ValueError, match="Does not validate") as info:  # no usage_errors: jsonargparse's own
        BandLimitCLI(args=args, run=False)
    assert not isinstance(info.value, CommandLineError)


def test_help_works_and_sys_argv_is_left_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["lightning-bandlimit", "fit", "--config", "quickstart", "--help"]
    monkeypatch.setattr(sys, "argv", list(argv))
    with pytest.raises(SystemExit) as exit_info:
        main()  # reads sys.argv, resolves the recipe name without rewriting it
    assert exit_info.value.code == 0
    assert sys.argv == argv
    out = capsys.readouterr().out
    assert "--trainer.max_epochs" in out and "packaged recipe" in out


def test_one_line_error_keeps_the_option_and_the_root_cause() -> None:
    from argparse import ArgumentError

    try:
        try:
            raise ValueError("Expected a <class 'int'>. Got value: abc")
        except ValueError as inner:
            raise ArgumentError(
                None,
                'Parser key "trainer.max_epochs":\n  Does not validate against any of the Union subtypes\n'
                "  Errors:\n    - Expected a <class 'int'>\n    - Expected a <class 'NoneType'>\n"
                "  Given value: abc",
            ) from inner
    except ArgumentError as error:
        assert one_line_error(error) == "--trainer.max_epochs: Expected a <class 'int'>. Got value: abc"
    assert one_line_error(ValueError("a\n- b\nGiven value type: <class 'str'>")) == "a; b"
