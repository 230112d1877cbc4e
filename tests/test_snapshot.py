"""Snapshot: what an engine step restores when it fails, checked on a plain object by hand."""

import collections
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from specfix.v1.snapshot import Snapshot


@dataclass
class Row:
    tokens: list[int]
    generator: torch.Generator


@dataclass
class Holder:
    table: torch.Tensor = field(default_factory=lambda: torch.arange(6, dtype=torch.int32))
    rows: dict = field(default_factory=dict)
    queue: collections.deque = field(default_factory=collections.deque)
    count: int = 0
    model: torch.nn.Module = field(default_factory=lambda: torch.nn.Linear(2, 2))

    def __post_init__(self):
        self.view = self.table.numpy()  # a numpy view of the tensor, as InputBatch keeps


def _holder():
    h = Holder()
    g = torch.Generator().manual_seed(3)
    h.rows["a"] = Row([1, 2], g)
    h.by_index = {0: g}  # the same generator reachable twice, as runner and input batch hold it
    h.queue.append(("batch", h.table))
    return h


def test_a_step_is_undone_in_place():
    h = _holder()
    table, view, g, model = h.table, h.view, h.rows["a"].generator, h.model
    expected_draw = torch.rand(3, generator=torch.Generator().manual_seed(3))
    h.log = []
    saved = Snapshot(h, skip=("log",))
    # a "step": writes through the view, draws from the generator, mutates and rebinds, adds a field
    h.view[2] = 99
    torch.rand(5, generator=g)
    h.rows["a"].tokens.append(3)
    h.rows["b"] = Row([], torch.Generator())
    h.count += 1
    h.queue.append(("second", None))
    h.model.weight.data.zero_()  # (a step never writes weights: a module is shared, not saved)
    h.log.append("step 1")
    h.extra = "added by the step"
    saved.restore()
    assert h.table is table and h.view is view and h.view.base is not None  # same buffers, view intact
    assert h.table.tolist() == [0, 1, 2, 3, 4, 5] and np.shares_memory(h.view, h.table.numpy())
    assert list(h.rows) == ["a"] and h.rows["a"].tokens == [1, 2] and h.count == 0
    assert h.rows["a"].generator is g and h.by_index[0] is g  # one generator, as before
    assert torch.equal(torch.rand(3, generator=g), expected_draw)  # its state is back
    assert len(h.queue) == 1 and h.queue[0][1] is table
    assert h.model is model and not h.model.weight.any()  # shared as it is, not copied or restored
    assert h.log == ["step 1"]  # skipped: left as the step left it
    assert not hasattr(h, "extra")


def test_a_snapshot_restores_once():
    h = _holder()
    saved = Snapshot(h)
    saved.restore()
    with pytest.raises(RuntimeError, match="a Snapshot restores once"):
        saved.restore()
