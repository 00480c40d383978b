"""A restarted group forms in a namespace of its own, whatever its predecessors left in the store.

The ranks are threads of this process, each with its own client of one TCP store (what torchrun's
agent hosts for every attempt); the process groups are gloo's, built directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from lightning_bandlimit.health.round_store import agent_store_shared, round_namespace, round_store


@pytest.fixture
def server() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)


def _client(server: dist.TCPStore) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=30))


def _ranks(delays: list[float], work: Callable[[int], object]) -> dict[int, object]:
    """Run ``work(rank)`` on one thread per rank, rank r starting after ``delays[r]`` s."""
    results: dict[int, object] = {}

    def run(rank: int) -> None:
        time.sleep(delays[rank])
        try:
            results[rank] = work(rank)
        except Exception as error:
            results[rank] = error

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(delays))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a rank never finished"
    return results


def _namespaces(server: dist.TCPStore, delays: list[float]) -> dict[int, object]:
    return _ranks(delays, lambda rank: round_namespace(_client(server), rank, len(delays), poll=0.05))


def test_every_rank_agrees_on_a_name_no_earlier_attempt_used(server: dist.TCPStore) -> None:
    first = _namespaces(server, [0.0, 0.0, 0.0])
    assert len(set(first.values())) == 1
    # the next attempts: ranks 1 and 2 arrive while only the first attempt's token is there
    second = _namespaces(server, [0.5, 0.0, 0.1])
    assert len(set(second.values())) == 1 and second[0] != first[0]
    third = _namespaces(server, [0.3, 0.0, 0.0])
    assert len(set(third.values())) == 1 and third[0] not in (first[0], second[0])


def _gloo_sum(server: dist.TCPStore, delays: list[float]) -> dict[int, object]:
    """Each rank forms a gloo group as init_process_group would, in the attempt's namespace, and
    all-reduces rank + 1."""

    def form(rank: int) -> float:
        client = _client(server)
        store = dist.PrefixStore(round_namespace(client, rank, len(delays), poll=0.05), client)
        group = dist.ProcessGroupGloo(dist.PrefixStore("default_pg", store), rank, 2, timedelta(seconds=5))
        value = torch.tensor([rank + 1.0])
        group.allreduce([value]).wait()
        return float(value)

    return _ranks(delays, form)


def test_a_restarted_group_forms_though_the_store_holds_its_predecessors_addresses(
    server: dist.TCPStore,
) -> None:
    assert _gloo_sum(server, [0.0, 0.0]) == {0: 3.0, 1: 3.0}
    # rank 1 restarts late: rank 0 must not dial rank 1's old address
    assert _gloo_sum(server, [0.0, 1.5]) == {0: 3.0, 1: 3.0}
    assert _gloo_sum(server, [1.5, 0.0]) == {0: 3.0, 1: 3.0}


def test_round_store_reads_the_env_store_and_prefixes_it(
    server: dist.TCPStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    assert agent_store_shared()
    stores = _ranks([0.0, 0.0], lambda rank: round_store(rank, 2, timedelta(seconds=30)))
    stores[0].set("k", "from rank 0")  # type: ignore[attr-defined]
    assert stores[1].get("k") == b"from rank 0"  # type: ignore[attr-defined]
    assert not server.check(["k"])  # in the attempt's namespace, not the store's root
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "False")
    assert not agent_store_shared()


@pytest.mark.parametrize(
    ("rank", "world_size", "poll", "message"),
    [(2, 2, 0.2, r"rank must be in \[0, world_size=2\), got 2"), (-1, 2, 0.2, "got -1"), (0, 2, 0.0, "poll")],
)
def test_bad_arguments_are_named(rank: int, world_size: int, poll: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        round_namespace(dist.HashStore(), rank, world_size, poll)
