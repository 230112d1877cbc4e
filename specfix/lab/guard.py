"""Turn the cryptic CUDA index assert into a readable Python error, for debugging (not for serving).

    from specfix.lab.guard import check_indices
    with check_indices():
        model(input_ids)        # raises IndexGuardError naming the op, the bad values and where they sit

Embedding lookups, ``index_select``, ``gather``, ``take`` and integer-tensor indexing are checked *before*
the op runs, so no CUDA kernel gets to assert and poison the process. Read :class:`check_indices` first:
the comment above it says what it costs, how strict it is and what it does not cover.
"""

from __future__ import annotations

import statistics
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from specfix.checks import check_count
from specfix.timing import wall_us
from specfix.v1.rejection_sampler import PLACEHOLDER_TOKEN_ID

#: How many offending positions an error message lists before it says "and N more".
MAX_LISTED = 8


class IndexGuardError(IndexError):
    """An index tensor holds values outside the indexed dimension (found before any kernel ran)."""

    def __init__(self, lookup: _Lookup, values: list[int], positions: list[tuple], num_bad: int):
        self.op, self.values, self.positions, self.num_bad = lookup.op, values, positions, num_bad
        self.valid_range, self.index_shape = (0, lookup.size), tuple(lookup.index.shape)
        self.caller = _caller()
        extent = (
            "the number of elements of the indexed tensor (take indexes it flattened)"
            if lookup.dim is None
            else f"the size of dim {lookup.dim} of the indexed tensor"
        )
        listed = ", ".join(f"{v} at {p}" for v, p in zip(values, positions, strict=True))
        more = f", and {num_bad - len(values)} more" if num_bad > len(values) else ""
        lines = [
            f"{self.op}: {num_bad} of {lookup.index.numel()} indices fall outside the valid range "
            f"[0, {lookup.size}), {extent} (shape {tuple(lookup.source.shape)}, "
            f"device {lookup.index.device}).",
            f"  offending values: {listed}{more}",
            f"  (positions are in the index tensor, of shape {self.index_shape})",
        ]
        if self.caller:
            lines.append(f"  called from {self.caller}")
        if PLACEHOLDER_TOKEN_ID in values:
            lines.append(
                f"  {PLACEHOLDER_TOKEN_ID} is PLACEHOLDER_TOKEN_ID: a speculative-decoding placeholder "
                "reached an index op; clamp the ids first (vLLM PR #47029, Fixes.clamp_placeholders)."
            )
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class _Lookup:
    """One index tensor to check: ``index`` selects along ``dim`` of ``source`` (dim None: flattened)."""

    op: str
    source: torch.Tensor
    dim: int | None
    index: torch.Tensor

    @property
    def size(self) -> int:
        return self.source.numel() if self.dim is None else self.source.shape[self.dim]


def _arg(args: tuple, kwargs: dict, position: int, *names: str):
    if len(args) > position:
        return args[position]
    for name in names:
        if name in kwargs:
            return kwargs[name]
    raise TypeError(f"missing argument {names[0]!r}")


def _fixed(op: str, dim: int | None, source: tuple, index: tuple) -> Callable:
    """An op whose source and index sit at a fixed ``(position, *keyword names)`` each."""

    def extract(args, kwargs):
        return [_Lookup(op, _arg(args, kwargs, *source), dim, _arg(args, kwargs, *index))]

    return extract


def _along_dim(name: str) -> Callable:
    def extract(args, kwargs):  # index_select / gather: (input, dim, index)
        source = _arg(args, kwargs, 0, "input", "self")
        dim = _arg(args, kwargs, 1, "dim")
        if not isinstance(dim, int):  # named dimensions: leave them to torch
            return []
        dim = dim + source.dim() if dim < 0 else dim
        return [_Lookup(name, source, dim, _arg(args, kwargs, 2, "index"))]

    return extract


def _subscript(name: str) -> Callable:
    def extract(args, kwargs):  # x[key] / x[key] = value
        source, key = args[0], args[1]
        return [_Lookup(name, source, dim, index) for dim, index in _integer_indices(source, key)]

    return extract


_MASK_DTYPES = (torch.bool, torch.uint8)  # torch indexes with these as masks, not as positions


def _integer_indices(source: torch.Tensor, key) -> list[tuple[int, torch.Tensor]]:
    """The (dim, integer index tensor) pairs of an indexing key, following torch's indexing rules."""
    key = key if isinstance(key, tuple) else (key,)

    def width(k) -> int:  # how many dims of ``source`` this key entry consumes
        if k is None or k is Ellipsis:
            return 0
        if isinstance(k, torch.Tensor) and k.dtype in _MASK_DTYPES:
            return k.dim()
        return 1

    ellipsis_width = source.dim() - sum(width(k) for k in key)
    found, dim = [], 0
    for k in key:
        if k is Ellipsis:
            dim += ellipsis_width
            continue
        if isinstance(k, list | range) and k and all(type(v) is int for v in k):
            k = torch.tensor(list(k), dtype=torch.long)
        if (
            isinstance(k, torch.Tensor)
            and not k.dtype.is_floating_point
            and k.dtype not in _MASK_DTYPES
            and dim < source.dim()
        ):
            found.append((dim, k))
        dim += width(k)
    return found


# A TorchFunctionMode: outside the ``with`` block nothing is patched and nothing costs anything. Inside,
# each guarded op reads its index's (min, max) on the host: one device sync per op, so it refuses to run
# in CUDA-graph capture. Strict: a negative index is refused even where torch wraps it (``x[-1]``), as a
# negative token id is a leaked placeholder. Not covered: nested-list keys (``x[[[1, 5]]]``) and the
# scatter family, which reach torch's own checks.
class check_indices(TorchFunctionMode):  # noqa: N801  (used like a function: ``with check_indices():``)
    """Out-of-range indices raise :class:`IndexGuardError` before any kernel; ``checked`` counts syncs."""

    def __init__(self):
        super().__init__()
        self.checked = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        extract = _GUARDED.get(func)
        if extract is not None:
            for lookup in extract(args, kwargs):
                self._check(lookup)
        return func(*args, **kwargs)

    def _check(self, lookup: _Lookup) -> None:
        index = lookup.index
        if not isinstance(index, torch.Tensor) or index.numel() == 0:
            return
        if index.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("check_indices cannot run in CUDA graph capture: it reads indices on the host")
        self.checked += 1
        size = lookup.size
        lo, hi = torch.aminmax(index.detach())
        if int(lo) >= 0 and int(hi) < size:  # the host sync per op (lo, then hi if lo passes)
            return
        bad = ((index < 0) | (index >= size)).reshape(-1)
        flat = bad.nonzero().reshape(-1)[:MAX_LISTED]
        values = index.reshape(-1)[flat].tolist()
        if index.dim() == 0:
            positions = [()]
        else:
            coords = torch.stack(torch.unravel_index(flat, index.shape), dim=1)
            positions = [tuple(p) for p in coords.tolist()]
        raise IndexGuardError(lookup, values, positions, int(bad.sum()))


@dataclass(frozen=True)
class GuardTiming:
    """Wall times of the same call run unguarded and under :func:`check_indices`, interleaved."""

    plain_s: tuple[float, ...]
    guarded_s: tuple[float, ...]
    checked: int  # index tensors the guard checked in one guarded run (one host read each)

    @property
    def ratio(self) -> float:
        return statistics.median(self.guarded_s) / statistics.median(self.plain_s)

    @property
    def separated(self) -> bool:
        """Every guarded run was slower than every unguarded one: the cost stands out of the noise."""
        return min(self.guarded_s) > max(self.plain_s)


def time_guard(fn: Callable[[], object], repeats: int = 7) -> GuardTiming:
    """Time ``fn()`` unguarded and guarded, alternating, so that drift in the machine's speed hits both."""
    check_count("repeats", repeats)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    guards = []

    def guarded():
        with check_indices() as guard:
            fn()
        guards.append(guard)

    def seconds(call) -> float:  # one call, the GPU idle before it and waited for after it
        return wall_us(lambda: (call(), sync()), 1, setup=sync)[0] / 1e6

    seconds(fn), seconds(guarded)  # warm-up: first calls pay one-time set-up
    plain, guarded_s = zip(*[(seconds(fn), seconds(guarded)) for _ in range(repeats)], strict=True)
    return GuardTiming(plain, guarded_s, guards[-1].checked)


def _caller() -> str:
    """The innermost frame on the stack outside torch and this module: the code that made the call."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = Path(frame.filename)
        if path == Path(__file__) or _TORCH_DIR in path.parents:
            continue
        return f"{path.name}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
    return ""


_TORCH_DIR = Path(torch.__file__).parent
_take = _fixed("take", None, source=(0, "input", "self"), index=(1, "index"))  # take indexes flattened
_GUARDED: dict[Callable, Callable] = {
    F.embedding: _fixed("F.embedding", 0, source=(1, "weight"), index=(0, "input")),
    torch.embedding: _fixed("torch.embedding", 0, source=(0, "weight"), index=(1, "indices", "input")),
    torch.index_select: _along_dim("index_select"),
    torch.Tensor.index_select: _along_dim("Tensor.index_select"),
    torch.gather: _along_dim("gather"),
    torch.Tensor.gather: _along_dim("Tensor.gather"),
    torch.take: _take,
    torch.Tensor.take: _take,
    torch.Tensor.__getitem__: _subscript("Tensor.__getitem__"),
    torch.Tensor.__setitem__: _subscript("Tensor.__setitem__"),
}
