"""One padded drafting step on a toy drafter, for chapter 3's histories of stale rows and their statistics.

The histories are named; the statistics are those of a step whose every live slot a stale row overwrites.

The real :class:`~specfix.mrv2.speculator.DraftModelSpeculator` and MRV2 verification, driven with a
:class:`TableDraft` so that each row's logits are known. Read :func:`padded_step_scenario` first (the
chapter's histories), then :func:`one_step_distribution` (the statistics). Whole decodes, batched against
alone, are :mod:`specfix.lab.padding_bench`'s.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np
import torch

from specfix import runtime
from specfix.checks import is_int
from specfix.fixes import Fixes
from specfix.mrv2.gumbel import gumbel_sample
from specfix.mrv2.speculator import (
    DraftModelSpeculator,
    RequestStates,
    reference_sampler,
    rejection_sample_mrv2,
)
from specfix.tools.stats import chi_square

# Where a padded row's stale ``idx_mapping`` value came from:
ORIGIN_FRESH = "fresh buffer (zeros)"  # never written: the zeroed buffer names slot 0
ORIGIN_EARLIER = "earlier larger batch"  # its last request is still live, now at another row
ORIGIN_REUSED = "finished request's slot, reused"  # its request finished and the slot is another's now
ORIGIN_FREE = "free slot"  # the named slot is free: the write is harmless


@dataclass(frozen=True)
class PaddedWrite:
    """A padded row whose stale ``idx_mapping`` entry made it write ``draft_logits[slot]``."""

    row: int
    slot: int
    victim: object | None  # the live request that owns ``slot`` (None: free)
    origin: str
    overwritten_cols: tuple[int, ...] = ()  # draft steps whose cached logits no longer match the victim's


#: The drafter's two samplers by name: the Triton kernel and its torch twin.
SAMPLERS = {"kernel": gumbel_sample, "reference": reference_sampler}


def write_origin(writer: object | None, victim: object | None) -> str:
    """The row's last writer against the slot's live owner (None: never written, free)."""
    if writer is None:
        return ORIGIN_FRESH
    if victim is None:
        return ORIGIN_FREE
    return ORIGIN_EARLIER if victim == writer else ORIGIN_REUSED


def resolve_sampler(sampler: str, device: torch.device, fixes: Fixes) -> str:
    """``"auto"``: the kernel on a GPU, its torch twin on a CPU (where Triton's interpreter is slow); the
    twin is the masked sampler, so with ``fixes.mask_invalid_reqs`` off it is the kernel."""
    if sampler not in ("auto", "kernel", "reference"):
        raise ValueError(f"sampler must be 'auto', 'kernel' or 'reference', got {sampler!r}")
    if sampler == "auto":
        sampler = "kernel" if device.type == "cuda" or not fixes.mask_invalid_reqs else "reference"
    if sampler == "reference" and not fixes.mask_invalid_reqs:
        raise ValueError("sampler='reference' is the masked sampler: with mask_invalid_reqs off use 'kernel'")
    return sampler


class TableDraft(torch.nn.Module):
    """A toy draft model: next-token logits are ``table[last token]``."""

    order = 2

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", table.float())

    def next_token_logits(self, context_ids: torch.Tensor) -> torch.Tensor:
        return self.table[context_ids[:, -1]]


def _table_speculator(table, max_num_reqs: int, k: int, device, fixes: Fixes, sampler: str, **kwargs):
    """A real :class:`DraftModelSpeculator` drafting from a :class:`TableDraft` of ``table``."""
    return DraftModelSpeculator(
        TableDraft(table).to(device),
        max_num_reqs=max_num_reqs,
        num_speculative_steps=k,
        vocab_size=table.shape[1],
        context_len=1,
        device=device,
        fixes=fixes,
        sampler=SAMPLERS[resolve_sampler(sampler, device, fixes)],
        **kwargs,
    )


@dataclass(frozen=True)
class BufferState:
    """``idx_mapping`` as one padded step reads it, and what its padded rows write."""

    idx_mapping: tuple[int, ...]  # the whole persistent buffer (max_num_reqs rows)
    batch: tuple[str, ...]  # the live request in each batch row
    num_reqs_padded: int  # rows the step processes (the captured size it dispatched to)
    owners: dict[int, str]  # request-state slot -> live request (scheduled this step or not)
    writes: tuple[PaddedWrite, ...]  # padded rows whose entry is a slot: each writes draft_logits[slot]

    @property
    def num_reqs(self) -> int:
        return len(self.batch)

    @property
    def victims(self) -> list[str]:
        return sorted({w.victim for w in self.writes if w.victim is not None})


_VERBS = ("step", "arrive", "finish")


def _parse_events(events, live: set[str], finished: set[str], max_num_reqs: int) -> list[tuple[str, str]]:
    """Check a whole history before anything runs; (verb, names) pairs."""
    if isinstance(events, str) or not isinstance(events, (list, tuple)) or not events:
        raise ValueError(f"events must be a non-empty list of strings such as 'step abc', got {events!r}")
    live, finished, parsed = set(live), set(finished), []
    for i, event in enumerate(events):
        parts = event.split() if isinstance(event, str) else []
        if (
            len(parts) != 2
            or parts[0] not in _VERBS
            or not (parts[1].isascii() and parts[1].isalpha() and parts[1].islower())
            or len(set(parts[1])) != len(parts[1])
        ):
            raise ValueError(
                f"events[{i}] must be '<verb> <names>' with a verb of {_VERBS} and distinct "
                f"lowercase letters as names, got {event!r}"
            )
        verb, names = parts
        problems = {
            "not live": set(names) - live if verb == "finish" else set(),
            "already live": set(names) & live if verb == "arrive" else set(),
            "already finished (a name is used once)": set(names) & finished,
        }
        for what, bad in problems.items():
            if bad:
                raise ValueError(f"events[{i}] {event!r}: {sorted(bad)} {what}")
        if verb == "finish":
            live -= set(names)
            finished |= set(names)
        else:
            live |= set(names)
        if len(live) > max_num_reqs:
            raise ValueError(
                f"events[{i}] {event!r}: {len(live)} live requests, more than "
                f"max_num_reqs={max_num_reqs} slots"
            )
        parsed.append((verb, names))
    return parsed


class StaleRowScenario:
    """A real :class:`DraftModelSpeculator` driven by a history of one-letter requests: ``"step abf"``
    (newcomers take the lowest free slot), ``"arrive g"``, ``"finish c"`` (its table row stays stale).
    Each request gets its own context, so a padded row's logits differ from its victim's."""

    def __init__(
        self, *, fixes: Fixes | None = None, max_num_reqs: int = 16, device: torch.device | str | None = None
    ):
        self.device = torch.device(device or runtime.DEVICE)
        self.fixes = fixes or Fixes()
        table = torch.randn(32, 32, generator=torch.Generator().manual_seed(7)) * 3  # a vocab of 32
        self.states = RequestStates(max_num_reqs, 1, self.device)
        self.spec = _table_speculator(table, max_num_reqs, 1, self.device, self.fixes, "auto")
        self.row_writer: list[str | None] = [None] * max_num_reqs
        self.finished: set[str] = set()
        self.steps_run = 0

    def step_inputs(self, names: str) -> tuple:
        """``propose``'s arguments for live requests ``names``, in batch order."""
        live = self.states.req_id_to_index
        missing = [n for n in names if n not in live]
        if missing:
            raise ValueError(f"requests {missing} are not live")
        dev, vocab = self.device, self.spec.vocab_size
        idx = torch.tensor([live[n] for n in names], dtype=torch.int32, device=dev)
        context = torch.tensor([[(ord(n) * 7 + self.steps_run * 3) % vocab] for n in names], device=dev)
        positions = torch.full((len(names),), 10 + self.steps_run, dtype=torch.long, device=dev)
        return len(names), idx, self.states.temperature, self.states.seeds, context, positions

    def play(self, events) -> BufferState | None:
        """Run ``events``; the buffer state of the last step (None without one)."""
        live = set(self.states.req_id_to_index)
        parsed = _parse_events(events, live, self.finished, self.states.max_num_reqs)
        state = None
        for verb, names in parsed:
            if verb == "finish":
                for n in names:
                    self.states.remove_request(n)
                self.finished |= set(names)
                continue
            for n in names:
                if n not in self.states.req_id_to_index:
                    self.states.add_request(n, 1.0, ord(n))
            if verb == "step":
                state = self._step(names)
        return state

    def _step(self, names: str) -> BufferState:
        proposal = self.spec.propose(*self.step_inputs(names), trace=True)
        owners = {slot: name for name, slot in self.states.req_id_to_index.items()}
        writes = tuple(
            PaddedWrite(row, slot, owners.get(slot), write_origin(self.row_writer[row], owners.get(slot)))
            for row, slot in proposal.padded_writes
        )
        self.row_writer[: len(names)] = list(names)
        self.steps_run += 1
        return BufferState(
            tuple(self.spec.idx_mapping.tolist()),
            tuple(names),
            proposal.batch.num_reqs_padded,
            owners,
            writes,
        )


def padded_step_scenario(events, **kwargs) -> BufferState:
    """The last step's buffer state of ``events``, e.g. ``["step abcdef", "finish c", "step abdef"]``."""
    state = StaleRowScenario(**kwargs).play(events)  # checks the whole history before it runs
    if events[-1].split()[0] != "step":
        raise ValueError(f"the last event must be a 'step' (its buffer is returned), got {events[-1]!r}")
    return state


def two_step_events(first_batch: int, second_batch: int) -> list[str]:
    """Chapter 3's slider: a step, request ``c`` ends, a second step of survivors then newcomers (survivors
    past ``second_batch`` wait, live but not scheduled)."""
    for name, value in (("first_batch", first_batch), ("second_batch", second_batch)):
        if not is_int(value) or not 1 <= value <= 16:
            raise ValueError(f"{name} must be an int in [1, 16], got {value!r}")
    first = string.ascii_lowercase[:first_batch]
    gone = "c" if "c" in first else ""
    survivors = [c for c in first if c not in gone]
    newcomers = list(
        string.ascii_lowercase[first_batch : first_batch + max(0, second_batch - len(survivors))]
    )
    events = [f"step {first}"] + ([f"finish {gone}"] if gone else [])
    return events + [f"step {''.join((survivors + newcomers)[:second_batch])}"]


def one_step_distribution(
    num_trials: int,
    *,
    fixes: Fixes | None = None,
    device: torch.device | str | None = None,
    sampler: str = "auto",
) -> dict:
    """Trials of one step whose every live slot a stale row overwrites: with a context-free target p each
    output position must still follow p exactly."""
    if not is_int(num_trials) or num_trials < 1:
        raise ValueError(f"num_trials must be a positive int, got {num_trials!r}")
    device = torch.device(device or runtime.DEVICE)
    fixes = fixes or Fixes()
    sampler = resolve_sampler(sampler, device, fixes)
    g = torch.Generator().manual_seed(0)
    v, k, t = 16, 2, num_trials  # vocab, draft steps, trials
    p_logits = torch.randn(v, generator=g)
    table = torch.randn(v, generator=g).repeat(v, 1)  # the draft ignores its context: q
    stale = v - 1
    table[stale] = torch.full((v,), -8.0).index_fill_(0, torch.tensor([stale]), 8.0)
    spec = _table_speculator(table, 2 * t, k, device, fixes, sampler, capture_sizes=[2 * t])
    temperature = torch.ones(2 * t, device=device)
    seeds = torch.randint(0, 2**31, (2 * t,), generator=g).to(device)
    sampled, num_sampled = _trials_over_stale_rows(spec, t, stale, p_logits, temperature, seeds)
    p = torch.softmax(p_logits, dim=0).double().numpy()
    q = torch.softmax(table[0], 0).double().numpy()
    positions = _positions(sampled.cpu().numpy(), num_sampled.cpu().numpy(), p, q)
    return {
        "sampler": sampler,
        "target_probs": p.tolist(),
        "draft_probs": q.tolist(),
        "stale_probs": torch.softmax(table[stale], 0).tolist(),
        "stale_token": stale,
        "positions": positions,
        "passed": all(r["passed"] for r in positions),
        "acceptance_rate": float((num_sampled.cpu().numpy() - 1).mean()) / k,
    }


def _trials_over_stale_rows(spec: DraftModelSpeculator, t: int, stale: int, p_logits, temperature, seeds):
    """An earlier batch of 2t rows leaves the stale token's context in rows t.., then t trials replay at 2t
    rows and are verified against target logits ``p_logits`` at every position: (sampled, num_sampled)."""
    device, k = spec.device, spec.num_speculative_steps
    # The earlier, larger batch: rows t.. hold the trial slots 0..t-1 with the stale token as context.
    earlier = torch.cat([torch.arange(t, 2 * t), torch.arange(t)]).to(torch.int32).to(device)
    context = torch.cat([torch.zeros(t, 1), torch.full((t, 1), stale)]).long().to(device)
    spec.propose(
        2 * t, earlier, temperature, seeds, context, torch.zeros(2 * t, dtype=torch.long, device=device)
    )
    # The trials: t live rows in slots 0..t-1, context token 0, replayed at 2t rows.
    idx = torch.arange(t, dtype=torch.int32, device=device)
    pos = torch.full((t,), 5, dtype=torch.long, device=device)
    trial_context = torch.zeros(t, 1, dtype=torch.long, device=device)
    proposal = spec.propose(t, idx, temperature, seeds, trial_context, pos)
    return rejection_sample_mrv2(
        p_logits.to(device).repeat(t * (k + 1), 1),
        proposal.draft_tokens,
        spec.draft_logits,
        idx,
        temperature,
        seeds,
        pos,
        spec.fixes,
    )


def _positions(sampled: np.ndarray, num_sampled: np.ndarray, p: np.ndarray, q: np.ndarray) -> list[dict]:
    """Per output position: the trials that reached it, its counts, chi-square against p, TV to p and q."""
    k, rows = sampled.shape[1] - 1, []
    for j in range(k + 1):
        reached = num_sampled > j
        counts = np.bincount(sampled[reached, j], minlength=len(p)).astype(float)
        freq = counts / max(counts.sum(), 1.0)
        rows.append(
            {
                "position": j,
                "role": "bonus" if j == k else "draft",
                "trials": int(reached.sum()),
                "counts": counts.tolist(),
                "tv_to_target": total_variation(freq, p),
                "tv_to_draft": total_variation(freq, q),
                **chi_square(counts, p),
            }
        )
    return rows


def total_variation(a, b) -> float:
    """Half the sum of absolute differences."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-D of one length, got {a.shape} and {b.shape}")
    return float(0.5 * np.abs(a - b).sum())
