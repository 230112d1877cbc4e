"""A padding-invariance checker: live results must not depend on what the padded rows hold.

A step run at a padded size (a CUDA-graph replay) reads whole persistent buffers, padded rows included;
a correct one gives its live requests the same results *whatever* the padding holds. Read
:func:`check_padding_invariance` first, then :func:`check_speculator`, which applies it to one drafter step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from specfix.checks import is_int

#: The garbage the padded region is filled with, one run each.
GARBAGE_PATTERNS = ("random", "nan", "minus_one", "huge")
#: The first run's name: the step on the buffers as found, padded region untouched.
STALE_RUN = "stale"
Rows = slice | range | Sequence[int]


@dataclass(frozen=True)
class Difference:
    """Live rows of ``buffer`` that came out differently under two runs (``run_a`` is the baseline)."""

    buffer: str
    rows: list[int]
    run_a: str
    run_b: str
    max_abs_diff: float

    def __str__(self) -> str:
        shown = self.rows[:8] + (["..."] if len(self.rows) > 8 else [])
        return (
            f"{self.buffer}: rows {shown} differ between {self.run_a!r} and {self.run_b!r} "
            f"(max |diff| {self.max_abs_diff:.3g})"
        )


@dataclass
class InvarianceReport:
    runs: list[str]
    differences: list[Difference] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.differences and not self.errors

    def rows(self, buffer: str, run: str) -> list[int]:
        """The live rows of ``buffer`` that came out differently in ``run`` than in the first run."""
        if run not in self.runs:
            raise ValueError(f"run must be one of {self.runs}, got {run!r}")
        return sorted({r for d in self.differences if d.buffer == buffer and d.run_b == run for r in d.rows})

    def __str__(self) -> str:
        if self.ok:
            return f"padding-invariant: live rows identical under runs {self.runs}"
        lines = [f"NOT padding-invariant ({len(self.differences)} difference(s), runs {self.runs}):"]
        lines += [f"  {d}" for d in self.differences]
        lines += [f"  run {name!r} raised: {msg}" for name, msg in self.errors.items()]
        return "\n".join(lines)


def _row_index(rows: Rows, t: torch.Tensor) -> torch.Tensor:
    if isinstance(rows, slice):
        return torch.arange(t.shape[0], device=t.device)[rows]
    return torch.as_tensor(list(rows), dtype=torch.long, device=t.device)


def _garbage(pattern: str, like: torch.Tensor, bound: tuple[int, int] | None, gen: torch.Generator):
    """A tensor shaped and typed like ``like`` holding ``pattern``'s garbage (integer buffers stay in
    ``bound`` = [low, high) when given; integers have no NaN, so ``nan`` writes 0, the fresh-buffer value)."""
    shape, dtype = like.shape, like.dtype
    if dtype.is_floating_point:
        big = torch.finfo(dtype).max / 4
        if pattern == "random":
            values = torch.randn(shape, generator=gen) * 1e3
        else:
            values = torch.full(shape, {"nan": float("nan"), "minus_one": -1.0, "huge": big}[pattern])
        return values.to(dtype)
    if dtype == torch.bool:
        return (
            (torch.rand(shape, generator=gen) < 0.5)
            if pattern == "random"
            else torch.full(shape, pattern == "huge")
        )
    info = torch.iinfo(dtype)
    low, high = bound if bound is not None else (info.min, info.max)
    if pattern == "random":
        values = torch.randint(max(low, -(2**62)), min(high, 2**62), shape, generator=gen, dtype=torch.int64)
    else:
        value = {"nan": 0, "minus_one": -1, "huge": high - 1}[pattern]
        values = torch.full(shape, min(max(value, low), high - 1), dtype=torch.int64)
    return values.to(dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-row equality, bit for bit, with NaN equal to NaN."""
    eq = a == b
    if a.dtype.is_floating_point:
        eq |= torch.isnan(a) & torch.isnan(b)
    return eq.reshape(a.shape[0], -1).all(dim=1)


# The step runs once on the buffers as found (the ``"stale"`` run), then once per garbage pattern over the
# padded rows, and the watched live rows are compared: a report says whether the padding can leak and
# which live rows the padding as it stands corrupts. A *fixed* wrong value (DFlash's padded samples all
# name row 0) looks the same under every pattern, so ``reference`` (the exact-size step) is compared too.
# Buffers are written only in place (a CUDA graph may replay them) and restored at the end.
def check_padding_invariance(
    step: Callable[[], object],  # any callable over persistent buffers, e.g. lambda: spec.propose(...)
    buffers: Mapping[str, torch.Tensor],  # every buffer the step reads or writes, by name
    padded: Mapping[str, Rows],  # per buffer, the rows that are padding
    live: Mapping[str, Rows],  # per buffer, the rows that must not change
    *,
    bounds: Mapping[str, tuple[int, int]] | None = None,
    reference: Callable[[], object] | None = None,
) -> InvarianceReport:
    """Run ``step`` once per garbage pattern and report the live rows that change; ``bounds`` keeps an
    index buffer's garbage in range so the step cannot fault."""
    bounds = dict(bounds or {})
    for role, names in (("padded", padded), ("live", live), ("bounds", bounds)):
        missing = sorted(set(names) - set(buffers))
        if missing:
            raise ValueError(f"{role} names buffers {missing} that are not in buffers {sorted(buffers)}")
    pad_rows = {n: _row_index(r, buffers[n]) for n, r in padded.items()}
    live_rows = {n: _row_index(r, buffers[n]) for n, r in live.items()}
    snapshot = {n: t.clone() for n, t in buffers.items()}
    gen = torch.Generator().manual_seed(0)

    def restore():
        for n, t in buffers.items():
            t.copy_(snapshot[n])

    def run(fill: str | None, call: Callable[[], object]) -> dict[str, torch.Tensor]:
        restore()
        if fill is not None:
            for n, rows in pad_rows.items():
                t = buffers[n]
                t.index_copy_(0, rows, _garbage(fill, t[rows], bounds.get(n), gen).to(t.device))
        call()
        return {n: buffers[n].index_select(0, rows).clone() for n, rows in live_rows.items()}

    runs = [(STALE_RUN, None, step)] + [(p, p, step) for p in GARBAGE_PATTERNS]
    runs += [("reference", None, reference)] if reference is not None else []
    report = InvarianceReport(runs=[name for name, _, _ in runs])
    results: dict[str, dict[str, torch.Tensor]] = {}
    try:
        for name, fill, call in runs:
            try:
                results[name] = run(fill, call)
            except Exception as exc:  # a fault under garbage is itself a finding
                report.errors[name] = f"{type(exc).__name__}: {exc}"
    finally:
        restore()
    report.differences += _differences(results, live_rows)
    return report


def _differences(results: dict[str, dict[str, torch.Tensor]], live_rows: dict[str, torch.Tensor]):
    """Each run's live rows against the first run's (the baseline)."""
    names, found = list(results), []
    for other in names[1:]:
        for buf, rows in live_rows.items():
            a, b = results[names[0]][buf], results[other][buf]
            bad = (~_same(a, b)).nonzero().flatten()
            if len(bad):
                diff = (a[bad].double() - b[bad].double()).abs().nan_to_num(nan=float("inf")).max().item()
                found.append(Difference(buf, rows[bad].tolist(), names[0], other, diff))
    return found


def check_speculator(
    spec,
    num_reqs: int,
    idx_mapping: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    context_ids: torch.Tensor,
    positions: torch.Tensor,
    unscheduled: Sequence[int] = (),
) -> InvarianceReport:
    """:func:`check_padding_invariance` for one ``DraftModelSpeculator.propose`` call. Watch the
    ``unscheduled`` slots: there a stale row is the only writer, so it shows on every device (a batch slot
    is a race on a GPU)."""
    slots = idx_mapping[:num_reqs].tolist()
    waiting = list(unscheduled)
    outside = all(is_int(s) and 0 <= s < spec.max_num_reqs and s not in slots for s in waiting)
    if not outside or len(set(waiting)) != len(waiting):
        raise ValueError(
            f"unscheduled must be distinct slots in [0, {spec.max_num_reqs}) outside this "
            f"step's {slots}, got {waiting}"
        )
    free = [s for s in range(spec.max_num_reqs) if s not in slots + waiting]
    tail = slice(num_reqs, None)
    args = (num_reqs, idx_mapping, temperature, seeds, context_ids, positions)
    return check_padding_invariance(
        lambda: spec.propose(*args),
        spec.buffers(),
        padded={
            "idx_mapping": tail,
            "context_ids": tail,
            "positions": tail,
            "draft_tokens": tail,
            "draft_logits": free,
        },
        live={"draft_tokens": range(num_reqs), "draft_logits": slots + waiting},
        bounds={
            "idx_mapping": (-1, spec.max_num_reqs),
            "context_ids": (0, spec.vocab_size),
            "positions": (0, 2**40),
        },
        reference=lambda: spec.propose(*args, padded=False),
    )


def check_dflash(
    drafter, num_reqs: int, idx_mapping: torch.Tensor, last_sampled: torch.Tensor, num_computed: torch.Tensor
) -> InvarianceReport:
    """:func:`check_padding_invariance` for one ``DFlashDrafter.propose`` call, against the exact-size step
    (the DFlash bug writes a *fixed* wrong value)."""
    k, m = drafter.inputs.num_speculative_steps, drafter.inputs.max_num_reqs
    slots = idx_mapping[:num_reqs].tolist()
    queries, samples = slice(num_reqs * (k + 1), None), slice(num_reqs * k, None)
    args = (num_reqs, idx_mapping, last_sampled, num_computed)
    return check_padding_invariance(
        lambda: drafter.propose(*args),
        drafter.buffers(),
        padded={
            "input_ids": queries,
            "positions": queries,
            "sample_indices": samples,
            "sample_pos": samples,
            "sample_idx_mapping": samples,
            "draft_tokens": samples,
            "draft_logits": [s for s in range(m) if s not in slots],
        },
        live={"draft_logits": slots, "draft_tokens": range(num_reqs * k)},
        bounds={
            "input_ids": (0, drafter.model.vocab_size + 1),
            "sample_idx_mapping": (-1, m),
            "sample_indices": (0, m * (k + 1)),
            "positions": (0, 2**40),
            "sample_pos": (0, 2**40),
        },
        reference=lambda: drafter.propose(*args, padded=False),
    )
