"""Chapter 3's reproduction: seeded requests decoded in padded batches, each compared with its run alone.

Mirrors vLLM 0.33.0's Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``) in miniature: the real
speculator, target and MRV2 verification. All randomness is keyed by (seed, position), so a request's text
must not depend on who shares its batch.

Read :func:`run_padding_bench` first. One padded step on a toy drafter (the chapter's named histories and
the statistics) is :mod:`specfix.lab.stale_rows`'s; its names are importable from here too.
"""

from __future__ import annotations

import difflib
import random
import re
from collections import Counter, deque
from dataclasses import dataclass, field

import torch

from specfix import runtime
from specfix.checks import is_int
from specfix.fixes import Fixes
from specfix.lab.stale_rows import (  # noqa: F401  (chapter 3, its exercises and tests import them from here)
    ORIGIN_FREE,
    SAMPLERS,
    BufferState,
    PaddedWrite,
    StaleRowScenario,
    TableDraft,
    one_step_distribution,
    padded_step_scenario,
    resolve_sampler,
    total_variation,
    two_step_events,
    write_origin,
)
from specfix.models import load_models
from specfix.mrv2.speculator import DraftModelSpeculator, RequestStates, rejection_sample_mrv2
from specfix.tokenizer import corpus_text, get_tokenizer


@dataclass(frozen=True)
class BenchRequest:
    req_id: int
    prompt: tuple[int, ...]
    max_tokens: int
    seed: int  # every request samples at temperature 1


def make_requests(
    num_requests: int, *, seed: int = 0, max_tokens: tuple[int, int] = (16, 32)
) -> list[BenchRequest]:
    """Seeded requests at temperature 1, prompted with the first 3 to 6 words of sentences from the fables."""
    if not is_int(num_requests) or num_requests < 1:
        raise ValueError(f"num_requests must be a positive int, got {num_requests!r}")
    tok = get_tokenizer()
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", corpus_text()) if len(s.split()) >= 6]
    rng = random.Random(seed)
    requests = []
    for i in range(num_requests):
        words = rng.choice(sentences).split()[: rng.randint(3, 6)]
        prompt = tuple(tok.encode(" ".join(words)))
        requests.append(BenchRequest(i, prompt, rng.randint(*max_tokens), rng.randrange(2**31)))
    return requests


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


class SpecDecodeEngine:
    """Drafter (padded, graph-replayed on a GPU) + target verification, one step per loop iteration."""

    def __init__(
        self,
        target,
        draft,
        *,
        max_num_reqs: int = 8,
        num_speculative_steps: int = 3,
        device: torch.device | str | None = None,
        fixes: Fixes | None = None,
        sampler: str = "auto",
    ):
        self.device = torch.device(device or runtime.DEVICE)
        self.fixes = fixes or Fixes()
        self.sampler = resolve_sampler(sampler, self.device, self.fixes)
        self.target, self.draft = target, draft
        self.k = num_speculative_steps
        self.max_model_len = 128  # each request's region of the KV cache, in tokens
        self.states = RequestStates(max_num_reqs, num_speculative_steps, self.device)
        self.spec = DraftModelSpeculator(
            draft,
            max_num_reqs=max_num_reqs,
            num_speculative_steps=self.k,
            vocab_size=target.vocab_size,
            context_len=draft.order - 1,
            device=self.device,
            fixes=self.fixes,
            sampler=SAMPLERS[self.sampler],
        )
        self.kv_cache = target.make_kv_cache(max_num_reqs * self.max_model_len, self.device)
        if self.device.type == "cuda":
            self.spec.capture_cuda_graphs()
        self._row_writer: list[int | None] = [None] * max_num_reqs

    def _prefill(self, live: _Live) -> None:
        positions = torch.arange(len(live.tokens), device=self.device)
        self.target(
            torch.tensor(live.tokens, device=self.device),
            positions,
            live.slot * self.max_model_len + positions,
            self.kv_cache,
        )

    def _padded_write(self, row: int, slot: int, req_ids: list[int], context, drafts) -> PaddedWrite:
        """Padded ``row`` wrote ``draft_logits[slot]``: the victim, the stale value's origin, and the draft
        steps whose cached logits differ from what the victim's own row computed."""
        victim, cols = self.states.owner(slot), []
        if victim is not None:
            b = req_ids.index(victim)
            ctx = context[b][None].clone()
            for j in range(self.k):
                expected = self.draft.next_token_logits(ctx)[0]  # cached before temperature (vLLM 0.33)
                if not torch.allclose(self.spec.draft_logits[slot, j], expected, rtol=1e-5, atol=1e-5):
                    cols.append(j)
                ctx = torch.cat([ctx[:, 1:], drafts[b][None, j : j + 1]], dim=1)
        return PaddedWrite(row, slot, victim, write_origin(self._row_writer[row], victim), tuple(cols))

    def _check_requests(self, requests: list[BenchRequest], max_batch: int) -> None:
        if not 1 <= max_batch <= self.states.max_num_reqs:
            raise ValueError(f"max_batch={max_batch} outside [1, max_num_reqs={self.states.max_num_reqs}]")
        for r in requests:
            if len(r.prompt) + r.max_tokens + self.k + 1 > self.max_model_len:
                raise ValueError(f"request {r.req_id} needs more than max_model_len={self.max_model_len}")
            if len(r.prompt) < self.spec.context_ids.shape[1]:
                raise ValueError(f"request {r.req_id}: prompt shorter than the draft context")

    def _verify(self, live: list[_Live], idx: torch.Tensor, pos: torch.Tensor, drafts: torch.Tensor):
        """The target scores each row's last token and drafts; MRV2 verification samples from it."""
        dev = self.device
        last = torch.tensor([e.tokens[-1] for e in live], device=dev)
        positions = pos[:, None] + torch.arange(self.k + 1, device=dev)
        slot_mapping = idx.long()[:, None] * self.max_model_len + positions
        logits = self.target(
            torch.cat([last[:, None], drafts], dim=1).flatten(),
            positions.flatten(),
            slot_mapping.flatten(),
            self.kv_cache,
        )
        return rejection_sample_mrv2(
            logits,
            drafts,
            self.spec.draft_logits,
            idx,
            self.states.temperature,
            self.states.seeds,
            pos,
            self.fixes,
        )

    @torch.no_grad()
    def generate(self, requests: list[BenchRequest], max_batch: int) -> RunResult:
        """Decode every request, at most ``max_batch`` at a time (admitted in order, as slots free up)."""
        self._check_requests(requests, max_batch)
        waiting, live = deque(requests), []
        outputs, steps, emissions = {}, [], {r.req_id: [] for r in requests}
        width, dev = self.spec.context_ids.shape[1], self.device
        step = 0
        while waiting or live:
            while waiting and len(live) < max_batch:
                req = waiting.popleft()
                entry = _Live(req, self.states.add_request(req.req_id, 1.0, req.seed), list(req.prompt))
                self._prefill(entry)
                live.append(entry)
            n = len(live)
            idx = torch.tensor([e.slot for e in live], dtype=torch.int32, device=dev)
            context = torch.tensor([e.tokens[-width:] for e in live], device=dev)
            pos = torch.tensor([len(e.tokens) - 1 for e in live], device=dev)
            proposal = self.spec.propose(
                n, idx, self.states.temperature, self.states.seeds, context, pos, trace=True
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
            sampled, num_sampled = self._verify(live, idx, pos, drafts)
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

    def summary(self) -> dict:
        return {
            "num_requests": len(self.requests),
            "differing": len(self.differing),
            "fixes": {n: getattr(self.fixes, n) for n in ("pad_idx_mapping", "mask_invalid_reqs")},
            "steps_batched": len(self.batched.steps),
            "padded_steps": sum(s.num_reqs_padded > len(s.req_ids) for s in self.batched.steps),
            "writes_by_origin": dict(Counter(w.origin for s in self.batched.steps for w in s.writes)),
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
    max_tokens: tuple[int, int] = (16, 32),
    device: torch.device | str | None = None,
    models=None,
    solo: RunResult | None = None,
    sampler: str = "auto",
) -> PaddingBench:
    """Run seeded requests batched and each alone; solo runs have no padded rows, so ``solo`` from an
    earlier bench with the same requests is reused whatever the fixes."""
    device = torch.device(device or runtime.DEVICE)
    target, draft = models or load_models(device)
    requests = make_requests(num_requests, max_tokens=max_tokens)
    kw = dict(max_num_reqs=max_num_reqs, device=device, fixes=fixes, sampler=sampler)
    batched = SpecDecodeEngine(target, draft, **kw).generate(requests, max_batch=max_batch)
    if solo is None:
        solo = SpecDecodeEngine(target, draft, **kw).generate(requests, max_batch=1)
    elif set(solo.outputs) != {r.req_id for r in requests}:
        raise ValueError("solo holds other requests than this bench's")
    return PaddingBench(requests, fixes or Fixes(), batched, solo)
