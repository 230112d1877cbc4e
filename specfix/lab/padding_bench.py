"""Chapter 3's reproduction: seeded requests decoded in padded batches, each compared with its run alone.

Mirrors vLLM 0.33.0's Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``) in miniature: the real
speculator, target and MRV2 verification. All randomness is keyed by (seed, position), so a request's text
must not depend on who shares its batch.

Read :func:`run_padding_bench` first, then :func:`padded_step_scenario` (the chapter's named histories)
and :func:`one_step_distribution` (the statistics).
"""

from __future__ import annotations

import difflib
import random
import re
import string
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np
import torch

from specfix import runtime
from specfix.checks import is_int
from specfix.fixes import Fixes
from specfix.models import load_models
from specfix.mrv2.gumbel import gumbel_sample
from specfix.mrv2.speculator import (
    DraftModelSpeculator,
    RequestStates,
    reference_sampler,
    rejection_sample_mrv2,
)
from specfix.tokenizer import corpus_text, get_tokenizer
from specfix.tools.stats import chi_square

# Where a padded row's stale ``idx_mapping`` value came from:
ORIGIN_FRESH = "fresh buffer (zeros)"  # never written: the zeroed buffer names slot 0
ORIGIN_EARLIER = "earlier larger batch"  # its last request is still live, now at another row
ORIGIN_REUSED = "finished request's slot, reused"  # its request finished and the slot is another's now
ORIGIN_FREE = "free slot"  # the named slot is free: the write is harmless


@dataclass(frozen=True)
class BenchRequest:
    req_id: int
    prompt: tuple[int, ...]
    max_tokens: int
    temperature: float
    seed: int


def make_requests(
    num_requests: int,
    *,
    seed: int = 0,
    prompt_words: tuple[int, int] = (3, 6),
    max_tokens: tuple[int, int] = (16, 32),
    temperature: float = 1.0,
) -> list[BenchRequest]:
    """Seeded requests whose prompts are the opening words of sentences from the fables."""
    if not is_int(num_requests) or num_requests < 1:
        raise ValueError(f"num_requests must be a positive int, got {num_requests!r}")
    tok = get_tokenizer()
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", corpus_text()) if len(s.split()) >= prompt_words[1]]
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        words = rng.choice(sentences).split()[: rng.randint(*prompt_words)]
        requests.append(
            BenchRequest(
                i,
                tuple(tok.encode(" ".join(words))),
                rng.randint(*max_tokens),
                temperature,
                rng.randrange(2**31),
            )
        )
    return requests


@dataclass(frozen=True)
class PaddedWrite:
    """A padded row whose stale ``idx_mapping`` entry made it write ``draft_logits[slot]``."""

    row: int
    slot: int
    victim: object | None  # the live request that owns ``slot`` (None: free)
    origin: str
    overwritten_cols: tuple[int, ...] = ()  # draft steps whose cached logits no longer match the victim's


@dataclass
class StepRecord:
    step: int
    req_ids: list[int]  # batch order
    slots: list[int]  # idx_mapping[:num_reqs]
    num_reqs_padded: int
    ran: str
    writes: list[PaddedWrite] = field(default_factory=list)


@dataclass
class RunResult:
    outputs: dict[int, list[int]]
    steps: list[StepRecord]
    #: req_id -> [(step, index of its first new output token, number of new tokens)]
    emissions: dict[int, list[tuple[int, int, int]]]

    def step_of_token(self, req_id: int, index: int) -> int:
        for step, start, count in self.emissions[req_id]:
            if start <= index < start + count:
                return step
        raise ValueError(f"request {req_id} has no output token {index}")


@dataclass
class _Live:
    req: BenchRequest
    slot: int
    tokens: list[int]
    out: list[int] = field(default_factory=list)


#: The drafter's two samplers by name: the Triton kernel and its torch twin.
SAMPLERS = {"kernel": gumbel_sample, "reference": reference_sampler}


def _origin(writer: object | None, victim: object | None) -> str:
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


class SpecDecodeEngine:
    """Drafter (padded, graph-replayed on a GPU) + target verification, one step per loop iteration."""

    def __init__(
        self,
        target,
        draft,
        *,
        max_num_reqs: int = 8,
        num_speculative_steps: int = 3,
        max_model_len: int = 128,
        device: torch.device | str | None = None,
        fixes: Fixes | None = None,
        capture_sizes: list[int] | None = None,
        cuda_graphs: bool | None = None,
        sampler: str = "auto",
    ):
        self.device = torch.device(device or runtime.DEVICE)
        self.fixes = fixes or Fixes()
        self.sampler = resolve_sampler(sampler, self.device, self.fixes)
        self.target, self.draft = target, draft
        self.k = num_speculative_steps
        self.max_model_len = max_model_len
        self.states = RequestStates(max_num_reqs, num_speculative_steps, self.device)
        self.spec = DraftModelSpeculator(
            draft,
            max_num_reqs=max_num_reqs,
            num_speculative_steps=self.k,
            vocab_size=target.vocab_size,
            context_len=draft.order - 1,
            device=self.device,
            fixes=self.fixes,
            capture_sizes=capture_sizes,
            sampler=SAMPLERS[self.sampler],
        )
        self.kv_cache = target.make_kv_cache(max_num_reqs * max_model_len, self.device)
        if cuda_graphs is None:
            cuda_graphs = self.device.type == "cuda"
        if cuda_graphs:
            self.spec.capture_cuda_graphs()
        self._row_writer: list[int | None] = [None] * max_num_reqs

    def _prefill(self, live: _Live) -> None:
        n = len(live.tokens)
        positions = torch.arange(n, device=self.device)
        self.target(
            torch.tensor(live.tokens, device=self.device),
            positions,
            live.slot * self.max_model_len + positions,
            self.kv_cache,
        )

    def _padded_write(self, row: int, slot: int, req_ids: list[int], context, drafts) -> PaddedWrite:
        """Padded ``row`` wrote ``draft_logits[slot]``: the victim, the stale value's origin, steps hit."""
        victim = self.states.owner(slot)
        b = None if victim is None else req_ids.index(victim)
        cols = () if b is None else self._overwritten_cols(context[b], drafts[b], slot)
        return PaddedWrite(row, slot, victim, _origin(self._row_writer[row], victim), cols)

    def _overwritten_cols(self, context: torch.Tensor, drafts: torch.Tensor, slot: int) -> tuple[int, ...]:
        """Draft steps whose cached logits differ from what the victim's own row computed."""
        ctx = context[None].clone()
        cols = []
        for j in range(self.k):
            expected = self.draft.next_token_logits(ctx)[0]  # cached before temperature (vLLM 0.33)
            if not torch.allclose(self.spec.draft_logits[slot, j], expected, rtol=1e-5, atol=1e-5):
                cols.append(j)
            ctx = torch.cat([ctx[:, 1:], drafts[None, j : j + 1]], dim=1)
        return tuple(cols)

    @torch.no_grad()
    def generate(self, requests: list[BenchRequest], max_batch: int, trace: bool = True) -> RunResult:
        """Decode every request, at most ``max_batch`` at a time (admitted in order, as slots free up)."""
        if not 1 <= max_batch <= self.states.max_num_reqs:
            raise ValueError(f"max_batch={max_batch} outside [1, max_num_reqs={self.states.max_num_reqs}]")
        for r in requests:
            if len(r.prompt) + r.max_tokens + self.k + 1 > self.max_model_len:
                raise ValueError(f"request {r.req_id} needs more than max_model_len={self.max_model_len}")
            if len(r.prompt) < self.spec.context_ids.shape[1]:
                raise ValueError(f"request {r.req_id}: prompt shorter than the draft context")
        waiting, live = deque(requests), []
        outputs, steps, emissions = {}, [], {r.req_id: [] for r in requests}
        width, k, dev = self.spec.context_ids.shape[1], self.k, self.device
        step = 0
        while waiting or live:
            while waiting and len(live) < max_batch:
                req = waiting.popleft()
                entry = _Live(
                    req, self.states.add_request(req.req_id, req.temperature, req.seed), list(req.prompt)
                )
                self._prefill(entry)
                live.append(entry)
            n = len(live)
            idx = torch.tensor([e.slot for e in live], dtype=torch.int32, device=dev)
            context = torch.tensor([e.tokens[-width:] for e in live], device=dev)
            pos = torch.tensor([len(e.tokens) - 1 for e in live], device=dev)
            proposal = self.spec.propose(
                n, idx, self.states.temperature, self.states.seeds, context, pos, trace=trace
            )
            drafts = proposal.draft_tokens
            record = StepRecord(
                step, [e.req.req_id for e in live], idx.tolist(), proposal.batch.num_reqs_padded, proposal.ran
            )
            record.writes = [
                self._padded_write(row, slot, record.req_ids, context, drafts)
                for row, slot in proposal.padded_writes
            ]
            steps.append(record)
            last = torch.tensor([e.tokens[-1] for e in live], device=dev)
            positions = pos[:, None] + torch.arange(k + 1, device=dev)
            slot_mapping = idx.long()[:, None] * self.max_model_len + positions
            logits = self.target(
                torch.cat([last[:, None], drafts], dim=1).flatten(),
                positions.flatten(),
                slot_mapping.flatten(),
                self.kv_cache,
            )
            sampled, num_sampled = rejection_sample_mrv2(
                logits,
                drafts,
                self.spec.draft_logits,
                idx,
                self.states.temperature,
                self.states.seeds,
                pos,
                self.fixes,
            )
            for e, row, count in zip(live, sampled.tolist(), num_sampled.tolist(), strict=True):
                new = row[:count][: e.req.max_tokens - len(e.out)]
                emissions[e.req.req_id].append((step, len(e.out), len(new)))
                e.out += new
                e.tokens += new
            for i, e in enumerate(live):
                self._row_writer[i] = e.req.req_id
            for e in [e for e in live if len(e.out) >= e.req.max_tokens]:
                self.states.remove_request(e.req.req_id)
                outputs[e.req.req_id] = e.out
            live = [e for e in live if e.req.req_id not in outputs]
            step += 1
        return RunResult(outputs, steps, emissions)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (None if identical)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def mark_differences(solo: list[int], batched: list[int], tokenizer=None) -> tuple[str, str]:
    """Both texts, wdiff style (``[-solo-]``, ``{+batched+}``, ``(dup)`` on a repeated neighbour)."""
    tok = tokenizer or get_tokenizer()
    a, b = [tok.vocab[t] for t in solo], [tok.vocab[t] for t in batched]
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            left += a[i1:i2]
            right += b[j1:j2]
            continue
        left += [f"[-{w}-]" for w in a[i1:i2]]
        for j in range(j1, j2):
            dup = (j > 0 and b[j - 1] == b[j]) or (j + 1 < len(b) and b[j + 1] == b[j])
            right.append(f"{{+{b[j]}+}}" + ("(dup)" if dup else ""))
    return " ".join(left), " ".join(right)


def count_repeats(tokens: list[int]) -> int:
    """Adjacent repeated tokens (``"the the"``): the duplication symptom."""
    return sum(1 for x, y in zip(tokens, tokens[1:], strict=False) if x == y)


@dataclass
class PaddingBench:
    requests: list[BenchRequest]
    fixes: Fixes
    batched: RunResult
    solo: RunResult

    @property
    def differing(self) -> list[int]:
        out_b, out_s = self.batched.outputs, self.solo.outputs
        return [r.req_id for r in self.requests if out_b[r.req_id] != out_s[r.req_id]]

    def cause(self, req_id: int) -> tuple[int, int, list[PaddedWrite]]:
        """(first diverging token, its step, that step's padded writes into the request's slot)."""
        index = first_divergence(self.solo.outputs[req_id], self.batched.outputs[req_id])
        if index is None:
            raise ValueError(f"request {req_id} is identical batched and alone")
        step = self.batched.step_of_token(req_id, index)
        record = self.batched.steps[step]
        return index, step, [w for w in record.writes if w.victim == req_id]

    def write_origins(self) -> Counter:
        """Padded-row writes of the batched run, by origin."""
        return Counter(w.origin for s in self.batched.steps for w in s.writes)

    def summary(self) -> dict:
        return {
            "num_requests": len(self.requests),
            "differing": len(self.differing),
            "fixes": {n: getattr(self.fixes, n) for n in ("pad_idx_mapping", "mask_invalid_reqs")},
            "steps_batched": len(self.batched.steps),
            "padded_steps": sum(s.num_reqs_padded > len(s.req_ids) for s in self.batched.steps),
            "writes_by_origin": dict(self.write_origins()),
            # writes the victim's own row did not overwrite in the same launch (on a GPU: a race)
            "writes_landed": sum(bool(w.overwritten_cols) for s in self.batched.steps for w in s.writes),
            "ran": sorted({s.ran for s in self.batched.steps}),
            "repeats_batched": sum(count_repeats(v) for v in self.batched.outputs.values()),
            "repeats_solo": sum(count_repeats(v) for v in self.solo.outputs.values()),
        }


def run_padding_bench(
    num_requests: int,
    *,
    fixes: Fixes | None = None,
    max_batch: int = 6,
    max_num_reqs: int = 8,
    num_speculative_steps: int = 3,
    seed: int = 0,
    max_tokens: tuple[int, int] = (16, 32),
    device: torch.device | str | None = None,
    capture_sizes: list[int] | None = None,
    cuda_graphs: bool | None = None,
    models=None,
    solo: RunResult | None = None,
    sampler: str = "auto",
) -> PaddingBench:
    """Run seeded requests batched and each alone; solo runs have no padded rows, so ``solo`` from an
    earlier bench with the same requests is reused whatever the fixes."""
    device = torch.device(device or runtime.DEVICE)
    target, draft = models or load_models(device)
    requests = make_requests(num_requests, seed=seed, max_tokens=max_tokens)
    kw = dict(
        max_num_reqs=max_num_reqs,
        num_speculative_steps=num_speculative_steps,
        device=device,
        fixes=fixes,
        capture_sizes=capture_sizes,
        cuda_graphs=cuda_graphs,
        sampler=sampler,
    )
    batched = SpecDecodeEngine(target, draft, **kw).generate(requests, max_batch=max_batch)
    if solo is None:
        solo = SpecDecodeEngine(target, draft, **kw).generate(requests, max_batch=1)
    elif set(solo.outputs) != {r.req_id for r in requests}:
        raise ValueError("solo holds other requests than this bench's")
    return PaddingBench(requests, fixes or Fixes(), batched, solo)


@dataclass(frozen=True)
class BufferState:
    """``idx_mapping`` as one padded step reads it, and what its padded rows write."""

    idx_mapping: tuple[int, ...]  # the whole persistent buffer (max_num_reqs rows)
    batch: tuple[str, ...]  # the live request in each batch row
    num_reqs_padded: int  # rows the step processes (the captured size it dispatched to)
    owners: dict[int, str]  # request-state slot -> live request (scheduled this step or not)
    writes: tuple[PaddedWrite, ...]  # padded rows whose entry is a slot: each writes draft_logits[slot]
    fixes: Fixes

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
        if verb == "finish" and not set(names) <= live:
            raise ValueError(f"events[{i}] {event!r}: {sorted(set(names) - live)} not live")
        if verb == "arrive" and set(names) & live:
            raise ValueError(f"events[{i}] {event!r}: {sorted(set(names) & live)} already live")
        if set(names) & finished:
            raise ValueError(
                f"events[{i}] {event!r}: {sorted(set(names) & finished)} already finished "
                "(a name is used once)"
            )
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
        self,
        *,
        fixes: Fixes | None = None,
        max_num_reqs: int = 16,
        num_speculative_steps: int = 1,
        vocab_size: int = 32,
        device: torch.device | str | None = None,
        sampler: str = "auto",
    ):
        self.device = torch.device(device or runtime.DEVICE)
        self.fixes = fixes or Fixes()
        table = torch.randn(vocab_size, vocab_size, generator=torch.Generator().manual_seed(7)) * 3
        self.states = RequestStates(max_num_reqs, num_speculative_steps, self.device)
        self.spec = DraftModelSpeculator(
            TableDraft(table).to(self.device),
            max_num_reqs=max_num_reqs,
            num_speculative_steps=num_speculative_steps,
            vocab_size=vocab_size,
            context_len=1,
            device=self.device,
            fixes=self.fixes,
            sampler=SAMPLERS[resolve_sampler(sampler, self.device, self.fixes)],
        )
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
            PaddedWrite(row, slot, owners.get(slot), _origin(self.row_writer[row], owners.get(slot)))
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
            self.fixes,
        )


def padded_step_scenario(events, **kwargs) -> BufferState:
    """The last step's buffer state of ``events``, e.g. ``["step abcdef", "finish c", "step abdef"]``."""
    scenario = StaleRowScenario(**kwargs)
    _parse_events(events, set(), set(), scenario.states.max_num_reqs)
    if events[-1].split()[0] != "step":
        raise ValueError(f"the last event must be a 'step' (its buffer is returned), got {events[-1]!r}")
    return scenario.play(events)


def two_step_events(first_batch: int, second_batch: int, finished: str = "c") -> list[str]:
    """Chapter 3's slider: a step, ``finished`` ends, a second step of survivors then newcomers (survivors
    past ``second_batch`` wait, live but not scheduled)."""
    for name, value in (("first_batch", first_batch), ("second_batch", second_batch)):
        if not is_int(value) or not 1 <= value <= 16:
            raise ValueError(f"{name} must be an int in [1, 16], got {value!r}")
    first = string.ascii_lowercase[:first_batch]
    gone = "".join(c for c in first if c in finished)
    survivors = [c for c in first if c not in gone]
    newcomers = list(
        string.ascii_lowercase[first_batch : first_batch + max(0, second_batch - len(survivors))]
    )
    events = [f"step {first}"] + ([f"finish {gone}"] if gone else [])
    return events + [f"step {''.join((survivors + newcomers)[:second_batch])}"]


class TableDraft(torch.nn.Module):
    """A toy draft model: next-token logits are ``table[last token]``."""

    order = 2

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", table.float())

    def next_token_logits(self, context_ids: torch.Tensor) -> torch.Tensor:
        return self.table[context_ids[:, -1]]


def one_step_distribution(
    num_trials: int,
    *,
    fixes: Fixes | None = None,
    vocab_size: int = 16,
    num_speculative_steps: int = 2,
    seed: int = 0,
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
    g = torch.Generator().manual_seed(seed)
    v, k, t = vocab_size, num_speculative_steps, num_trials
    p_logits = torch.randn(v, generator=g)
    table = torch.randn(v, generator=g).repeat(v, 1)  # the draft ignores its context: q
    stale = v - 1
    table[stale] = torch.full((v,), -8.0).index_fill_(0, torch.tensor([stale]), 8.0)
    spec = DraftModelSpeculator(
        TableDraft(table).to(device),
        max_num_reqs=2 * t,
        num_speculative_steps=k,
        vocab_size=v,
        context_len=1,
        device=device,
        fixes=fixes,
        capture_sizes=[2 * t],
        sampler=SAMPLERS[sampler],
    )
    temperature = torch.ones(2 * t, device=device)
    seeds = torch.randint(0, 2**31, (2 * t,), generator=g).to(device)
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
    sampled, num_sampled = rejection_sample_mrv2(
        p_logits.to(device).repeat(t * (k + 1), 1),
        proposal.draft_tokens,
        spec.draft_logits,
        idx,
        temperature,
        seeds,
        pos,
        fixes,
    )
    p = torch.softmax(p_logits, dim=0).double().numpy()
    q = torch.softmax(table[0], 0).double().numpy()
    positions = _positions(sampled.cpu().numpy(), num_sampled.cpu().numpy(), p, q)
    mean_accepted = float((num_sampled.cpu().numpy() - 1).mean())
    return {
        "sampler": sampler,
        "target_probs": p.tolist(),
        "draft_probs": q.tolist(),
        "stale_probs": torch.softmax(table[stale], 0).tolist(),
        "stale_token": stale,
        "positions": positions,
        "passed": all(r["passed"] for r in positions),
        "mean_accepted": mean_accepted,
        "acceptance_rate": mean_accepted / k,
    }


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
