"""The host-sync counter behind chapter 2's and chapter 5's "syncs per step" columns."""

import gc

import pytest
import torch

from specfix.tools.syncs import count_host_syncs

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_nothing_is_counted_on_cpu():
    assert count_host_syncs(lambda: torch.ones(3).sum().item(), torch.device("cpu")) is None


@pytest.mark.cuda
@needs_cuda
def test_sees_item_and_blocking_copies_and_not_arithmetic():
    x = torch.ones(4, device="cuda")
    assert count_host_syncs(lambda: x + 1, x.device) == 0
    assert count_host_syncs(lambda: x.sum().item(), x.device) == 1
    assert count_host_syncs(lambda: x.cpu(), x.device) == 1


@pytest.mark.cuda
@needs_cuda
def test_garbage_from_earlier_work_is_not_charged():
    x = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x * 2
    cycle = [graph, y]
    cycle.append(cycle)  # only the cyclic collector can free it
    del graph, y, cycle
    assert count_host_syncs(lambda: x + 1, x.device) == 0
    gc.collect()
