"""The recipe tests run torch on one thread (models trained by module-scoped fixtures included).

Their models are tiny: on two threads, with another process holding a core, a band-limited
convolution runs ten times slower than on one. Nothing they compare depends on the thread count.
"""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def _one_thread_for_the_recipes() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
