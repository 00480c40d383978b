"""Shared test settings and fixtures: deterministic, small, CPU-friendly.

Helpers that the scripts started in subprocesses need too live in ``_helpers.py`` (no pytest).
"""

import ctypes
import gc
import os
import resource
import time
from collections.abc import Callable, Iterator

import lightning.pytorch as pl
import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    """Under xdist, each worker's torch takes its share of the cores (workers x threads <= cores),
    and so do the processes its tests start: more threads than cores only makes them wait on
    each other."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(threads)
        # and the processes its tests start (a script sets its own where it needs more): two jobs
        # of two threads each on two cores took 255 s where one thread each took 7 s (OpenMP's
        # threads spin while they wait for a core)
        os.environ["OMP_NUM_THREADS"] = str(threads)


def _peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    return max(own, _LOGGED_PEAK_MIB)


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller prints it
        workeroutput["peak_rss_mib"] = _peak_rss_mib()


_WORKER_PEAKS: dict[str, float] = {}
_MEMORY_LOG = os.environ.get("BANDLIMIT_TEST_MEMORY_LOG")  # a folder: each process's RSS after each test


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


_LIBC = ctypes.CDLL(None)
_MALLOC_TRIM = getattr(_LIBC, "malloc_trim", None)  # glibc only
_TRIM_STEP_MIB = 512
_trimmed_at_mib = 0.0  # the resident set after the last trim


@pytest.hookimpl(trylast=True)  # after the test's fixtures are gone
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A process that grew by 512 MiB since the last trim collects its garbage and hands the freed
    heap back to the system (glibc keeps it otherwise): one test's peak must not become every
    later test's floor. Only on such growth: a collection per test costs about 0.5 s once the
    heap is large (that was a fifth of the serial suite)."""
    global _trimmed_at_mib
    if _MALLOC_TRIM is not None and _rss_mib() > _trimmed_at_mib + _TRIM_STEP_MIB:
        gc.collect()
        _MALLOC_TRIM(0)
        _trimmed_at_mib = _rss_mib()


def _reset_peak() -> bool:
    """Start a new resident-set peak (Linux: ``VmHWM``); whether the kernel allows it."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def _vm_hwm_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


_LOGGED_PEAK_MIB = 0.0  # with the memory log, the largest per-test peak (the reset hides earlier ones)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """With ``BANDLIMIT_TEST_MEMORY_LOG=<folder>``: one line per test (resident MiB before, after
    and at its peak, seconds) in ``<folder>/<worker>.tsv``, to find what a test leaves alive for
    the next ones and which test needs the most."""
    global _LOGGED_PEAK_MIB
    if not _MEMORY_LOG:
        return (yield)
    before, started, reset = _rss_mib(), time.perf_counter(), _reset_peak()
    try:
        return (yield)
    finally:
        peak = _vm_hwm_mib() if reset else float("nan")
        _LOGGED_PEAK_MIB = max(_LOGGED_PEAK_MIB, peak if reset else 0.0)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        seconds = time.perf_counter() - started
        with open(os.path.join(_MEMORY_LOG, f"{worker}.tsv"), "a") as log:
            log.write(f"{item.nodeid}\t{before:.0f}\t{_rss_mib():.0f}\t{peak:.0f}\t{seconds:.2f}\n")


@pytest.hookimpl(optionalhook=True)  # xdist's hook
def pytest_testnodedown(node: object, error: object) -> None:
    output = getattr(node, "workeroutput", {})
    if "peak_rss_mib" in output:
        _WORKER_PEAKS[getattr(node, "gateway").id] = output["peak_rss_mib"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The suite's memory: each process's peak resident set (the issue's 3 GB bound is per process)."""
    peaks = dict(sorted(_WORKER_PEAKS.items())) or {"pytest": _peak_rss_mib()}
    terminalreporter.write_line(
        "peak resident memory (MiB): " + ", ".join(f"{k} {v:.0f}" for k, v in peaks.items())
    )


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_saved_tensor_hooks_left() -> Iterator[None]:
    yield
    # A test that leaves saved-tensor hooks installed changes every later test's autograd in this
    # process (an out-of-memory error in a fit once left a profile's meter there): it fails here.
    left = torch._C._autograd._top_saved_tensors_default_hooks(False)
    while torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
        torch._C._autograd._pop_saved_tensors_default_hooks()
    assert left is None, f"saved-tensor hooks left installed: {left}"


class StopAfter(pl.Callback):
    """Interrupt a run, as a pre-emption would, after ``steps`` optimizer steps."""

    def __init__(self, steps: int) -> None:
        self.steps = steps

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step >= self.steps:
            trainer.should_stop = True


@pytest.fixture
def stop_after() -> type[StopAfter]:
    """The :class:`StopAfter` callback class (for resume-from-checkpoint tests)."""
    return StopAfter


@pytest.fixture
def error_line(capsys: pytest.CaptureFixture[str]) -> Callable[[], str]:
    """Reads what was printed to stderr so far: no traceback in it; returns its last non-blank line."""

    def read() -> str:
        err = capsys.readouterr().err
        assert "Traceback" not in err
        return [line for line in err.splitlines() if line.strip()][-1]

    return read


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread for the test: tiny convolutions run far slower on two threads than on
    one when another process holds a core, and nothing compared depends on the thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
