"""Save what an engine step may change, and put it back if the step fails: steps are all-or-nothing.

vLLM has no such thing (a worker that raises takes the engine down); specfix runs in notebooks, where a
failed cell must never leave an engine that only a kernel restart cures.
"""

from __future__ import annotations

import collections
import copy
import enum
import types
from collections.abc import Iterable

import numpy as np
import torch

_LEAVES = (torch.Tensor, np.ndarray, torch.Generator)
_SHARED = (
    torch.nn.Module,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
    type,
)
_ATOMS = (str, bytes, int, float, bool, complex, type(None), enum.Enum, torch.device, torch.dtype)


def _scan(root: object) -> tuple[list, list]:
    """The leaves (tensors, arrays, generators) and the shared objects reachable from ``root``."""
    leaves, shared, seen, stack = [], [], set(), [root]
    while stack:
        value = stack.pop()
        if isinstance(value, _ATOMS) or id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, _LEAVES):
            leaves.append(value)
        elif isinstance(value, _SHARED):
            shared.append(value)
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset, collections.deque)):
            stack.extend(value)
        elif hasattr(value, "__dict__"):
            stack.extend(vars(value).values())
    return leaves, shared


def _save(leaf):
    if isinstance(leaf, torch.Tensor):
        return leaf.detach().clone()
    if isinstance(leaf, np.ndarray):
        return leaf.copy()
    return leaf.get_state()


@torch.no_grad()
def _put_back(leaf, saved) -> None:
    if isinstance(leaf, torch.Tensor):
        leaf.copy_(saved)
    elif isinstance(leaf, np.ndarray):
        leaf[...] = saved
    else:
        leaf.set_state(saved)


# ``Snapshot(obj, skip)`` records every attribute but ``skip`` (models, drafters, logs), with no list of
# fields, so a field added later is covered too. Tensors, arrays and generators get their contents back in
# place (buffers keep their addresses, numpy views stay views); modules, functions and classes are shared;
# everything else is deep-copied and replaces the live value on ``restore``.
class Snapshot:
    """The state of ``obj``'s attributes (all but ``skip``), restorable once."""

    def __init__(self, obj: object, skip: Iterable[str] = ()):
        self._obj = obj
        self._skip = frozenset(skip)
        attrs = {name: value for name, value in vars(obj).items() if name not in self._skip}
        leaves, shared = _scan(attrs)
        memo = {id(x): x for x in (*leaves, *shared)}  # deepcopy keeps these as they are
        self._leaves = [(leaf, _save(leaf)) for leaf in leaves]
        self._attrs = copy.deepcopy(attrs, memo)
        self._restored = False

    def restore(self) -> None:
        if self._restored:
            raise RuntimeError("a Snapshot restores once: its saved objects are now live")
        self._restored = True
        for leaf, saved in self._leaves:
            _put_back(leaf, saved)
        live = vars(self._obj)
        for name in [n for n in live if n not in self._skip and n not in self._attrs]:
            del live[name]
        live.update(self._attrs)
