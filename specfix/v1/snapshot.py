"""Save what an engine step may change, and put it back if the step fails: steps are all-or-nothing.

vLLM has no such thing (a worker that raises takes the engine down with it); specfix runs in notebooks,
where a user changes one thing, re-runs a cell, and must never be left with an engine that only a kernel
restart cures. ``LLMEngine.step`` saves the scheduler's, the runner's and its own state before it starts
and restores them if anything raises.

Read :class:`Snapshot` first: the comment above it says what is saved and how.
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


# ``Snapshot(obj, skip)`` records every attribute of ``obj`` except those named in ``skip``, without a list
# of which attributes there are, so a field added later is covered too:
#
# * tensors, numpy arrays and ``torch.Generator``s, wherever they sit (an attribute, inside a list or a
#   dict, in a nested object), keep their identity and get their contents (a generator: its state) back
#   in place, so persistent buffers keep their addresses and a numpy view of a tensor stays its view;
# * torch modules (weights, which a step reads but never writes), functions and classes are shared as
#   they are;
# * everything else (lists, dicts, dataclasses, plain objects) is deep-copied, and on ``restore`` the
#   copies replace the live values; attributes the step added are removed.
#
# ``skip`` names what is not per-step state: models, drafters, samplers, or an append-only log that the
# owner truncates itself.
class Snapshot:
    """The state of ``obj``'s attributes (all but ``skip``), restorable once; see the comment above."""

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
        """Put ``obj`` back as it was when the snapshot was taken."""
        if self._restored:
            raise RuntimeError("a Snapshot restores once: its saved objects are now live")
        self._restored = True
        for leaf, saved in self._leaves:
            _put_back(leaf, saved)
        live = vars(self._obj)
        for name in [n for n in live if n not in self._skip and n not in self._attrs]:
            del live[name]
        live.update(self._attrs)
