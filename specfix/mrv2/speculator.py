"""A Model Runner V2 style draft-model speculator: persistent buffers, padded graph replays, draft logits.

Mirrors vLLM 0.33.0's ``vllm/v1/worker/gpu/spec_decode/speculator.py`` (``DraftModelSpeculator``,
``_copy_request_inputs``), the request-state tables of ``vllm/v1/worker/gpu/states.py`` and the MRV2
verification of ``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``.

Read ``DraftModelSpeculator.propose`` first (the comment above the class says how padded rows reach the
draft logits), then ``rejection_sample_mrv2`` (how a stale row corrupts the verification).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specfix.checks import ID_DTYPES, check_count, check_id_tensor, check_slots, check_vector, is_int
from specfix.fixes import Fixes
from specfix.mrv2.cudagraph import BatchDescriptor, CapturedStep, CudaGraphDispatcher, check_num_reqs
from specfix.mrv2.gumbel import NOISE_MODES, gumbel_sample
from specfix.mrv2.gumbel_reference import gumbel_sample_reference
from specfix.v1 import device_checks
from specfix.v1.rejection_sampler import (
    PLACEHOLDER_TOKEN_ID,
    generate_uniform_probs,
    rejection_sample,
    sample_recovered_tokens,
)
from specfix.v1.sampling_metadata import SAMPLING_EPS, SamplingMetadata


def reference_sampler(*args, fixes: Fixes | None = None, noise: str = "exact", **kwargs):
    """``gumbel_sample``'s torch twin, called as it is: the masked kernel's tokens and stores, for statistics
    too big for Triton's interpreter."""
    if fixes is not None and not fixes.mask_invalid_reqs:
        raise ValueError("the torch reference is the masked (fixed) sampler; use the Triton kernel")
    return gumbel_sample_reference(*args, noise=noise, **kwargs)


class RequestStates:
    """Per-request state tables, one row per ``req_state_idx``; slots are reused after a request ends."""

    def __init__(self, max_num_reqs: int, num_speculative_steps: int, device: torch.device | str = "cpu"):
        check_count("max_num_reqs", max_num_reqs)
        check_count("num_speculative_steps", num_speculative_steps)
        self.max_num_reqs = max_num_reqs
        self.temperature = torch.zeros(max_num_reqs, dtype=torch.float32, device=device)
        self.seeds = torch.zeros(max_num_reqs, dtype=torch.int64, device=device)
        self.draft_tokens = torch.zeros(max_num_reqs, num_speculative_steps, dtype=torch.int64, device=device)
        self.req_id_to_index: dict[object, int] = {}

    def add_request(self, req_id: object, temperature: float, seed: int) -> int:
        if req_id in self.req_id_to_index:
            raise ValueError(f"request {req_id!r} is already live in slot {self.req_id_to_index[req_id]}")
        if not temperature >= SAMPLING_EPS:  # NaN too
            raise ValueError(
                f"temperature must be >= SAMPLING_EPS ({SAMPLING_EPS}) for probabilistic "
                f"drafting (below it a request is greedy), got {temperature}"
            )
        if not is_int(seed):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        # the lowest free slot: deterministic, so the notebook can show reuse
        slot = min(set(range(self.max_num_reqs)) - set(self.req_id_to_index.values()), default=None)
        if slot is None:
            raise ValueError(f"all {self.max_num_reqs} request-state slots are taken")
        self.req_id_to_index[req_id] = slot
        self.temperature[slot] = temperature
        self.seeds[slot] = seed
        return slot

    def remove_request(self, req_id: object) -> int:
        """Free the request's slot (its table rows keep their stale values, as in vLLM)."""
        if req_id not in self.req_id_to_index:
            raise ValueError(f"request {req_id!r} is not live")
        return self.req_id_to_index.pop(req_id)

    def owner(self, slot: int) -> object | None:
        """The live request in ``slot``, or None if it is free."""
        return next((r for r, s in self.req_id_to_index.items() if s == slot), None)


@dataclass
class DraftProposal:
    """What one ``propose`` call did: the drafts of the live rows and how the step ran."""

    draft_tokens: torch.Tensor  # [num_reqs, k] int64
    batch: BatchDescriptor
    ran: str  # "cuda graph replay", "eager (padded size)" or "eager (exact size)"
    #: (padded row, req_state_idx) of each padded row that will write draft_logits; only with ``trace=True``
    padded_writes: list[tuple[int, int]] = field(default_factory=list)


# Batch rows are this step's requests in batch order; ``idx_mapping[row]`` is a row's ``req_state_idx``, its
# slot in the per-request tables. The step runs at a *padded* size (a CUDA graph per size on a GPU, the same
# step eagerly on a CPU), so rows past ``num_reqs`` hold what an earlier step left in ``idx_mapping``: before
# vLLM PR #47066 such a row wrote into a live request's ``draft_logits`` (see ``_copy_request_inputs``).
class DraftModelSpeculator:
    """Draft ``k`` tokens per request by Gumbel sampling over persistent buffers, as vLLM 0.33's MRV2 does."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        max_num_reqs: int,
        num_speculative_steps: int,
        vocab_size: int,
        context_len: int,
        device: torch.device | str = "cpu",
        fixes: Fixes | None = None,
        capture_sizes: list[int] | None = None,
        sampler: Callable[..., torch.Tensor] = gumbel_sample,  # or reference_sampler: the same, from torch
        noise: str = "exact",  # the sampler's noise mode ("vllm": token for token with vLLM 0.33)
    ):
        for name, value in (
            ("max_num_reqs", max_num_reqs),
            ("num_speculative_steps", num_speculative_steps),
            ("vocab_size", vocab_size),
            ("context_len", context_len),
        ):
            check_count(name, value)
        if noise not in NOISE_MODES:
            raise ValueError(f"noise must be one of {NOISE_MODES}, got {noise!r}")
        with torch.no_grad():  # one row of token 0: what vocabulary does the model's output cover?
            probe = model.next_token_logits(torch.zeros(1, context_len, dtype=torch.int64, device=device))
        if probe.dim() != 2 or probe.shape[1] != vocab_size:
            raise ValueError(
                f"vocab_size={vocab_size} does not match the draft model, whose logits have "
                f"shape {tuple(probe.shape)} for one row (expected (1, {vocab_size}))"
            )
        self.model = model
        self.noise = noise
        self.sampler = sampler
        self.device = torch.device(device)
        self.fixes = fixes or Fixes()
        self.max_num_reqs = max_num_reqs
        self.num_speculative_steps = k = num_speculative_steps
        self.vocab_size = vocab_size
        self.dispatcher = CudaGraphDispatcher(max_num_reqs, capture_sizes)
        # Persistent buffers: fixed addresses, sized for max_num_reqs, as a graph replay needs.
        z = lambda *shape, dtype: torch.zeros(*shape, dtype=dtype, device=self.device)
        self.idx_mapping = z(max_num_reqs, dtype=torch.int64)  # int64 as in vLLM 0.33 (int32 in 0.25)
        self.temperature = z(max_num_reqs, dtype=torch.float32)  # copies of the request-state tables
        self.seeds = z(max_num_reqs, dtype=torch.int64)
        # [max_num_reqs, context_len]: each row's last tokens, what an n-gram draft model reads (a
        # transformer drafter keeps hidden states and a KV cache instead)
        self.context_ids = z(max_num_reqs, context_len, dtype=torch.int64)
        self.positions = z(max_num_reqs, dtype=torch.int64)  # each row's last token's position
        self.draft_tokens = z(max_num_reqs, k, dtype=torch.int64)  # batch-row order
        self.draft_logits = z(max_num_reqs, k, vocab_size, dtype=torch.float32)  # request-state order
        self.graphs: CapturedStep | None = None

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent buffer the step reads or writes, by name."""
        names = "idx_mapping temperature seeds context_ids positions draft_tokens draft_logits"
        return {n: getattr(self, n) for n in names.split()}

    def _check_request_inputs(
        self, num_reqs: int, idx_mapping: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor
    ) -> None:
        """Refuse bad request inputs before any buffer is written."""
        check_num_reqs(num_reqs, self.max_num_reqs)
        check_id_tensor("idx_mapping", idx_mapping, min_length=num_reqs)
        check_vector("temperature", temperature, (torch.float32,), length=self.max_num_reqs)
        check_vector("seeds", seeds, (torch.int64,), length=self.max_num_reqs)
        # Value checks read the tensors back: free on a CPU, a host sync on a GPU (there only under
        # specfix.v1.device_checks, so that a drafting step never stalls the host).
        if device_checks.wanted(temperature, idx_mapping):
            if not bool((temperature >= 0).all()):  # NaN fails too
                raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature.tolist()}")
            check_slots("idx_mapping[:num_reqs]", idx_mapping[:num_reqs].cpu(), self.max_num_reqs)

    def _copy_request_inputs(
        self,
        num_reqs: int,
        idx_mapping: torch.Tensor,
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        dummy_run: bool = False,
    ) -> None:
        """Copy this step's request inputs into the persistent buffers, outside the graph."""
        self._check_request_inputs(num_reqs, idx_mapping, temperature, seeds)
        self.temperature.copy_(temperature)  # whole tables: rows are addressed by req_state_idx
        self.seeds.copy_(seeds)
        if dummy_run:  # a warm-up batch stands for no request, as in vLLM 0.33's _copy_request_inputs
            self.idx_mapping.fill_(-1)
            return
        self.idx_mapping[:num_reqs].copy_(idx_mapping[:num_reqs])
        # padded rows replay with whatever an earlier, larger batch left here, and a stale slot makes the
        # replay write that request's draft_logits: -1 marks them as no request (vLLM PR #47066)
        if self.fixes.pad_idx_mapping:  # [fix]
            self.idx_mapping[num_reqs:].fill_(-1)  # [fix]

    def _draft_step(self, num_rows: int) -> None:
        """k draft steps over the first ``num_rows`` rows of the buffers; no host sync (graph-safe)."""
        context = self.context_ids[:num_rows]
        for step in range(self.num_speculative_steps):
            logits = self.model.next_token_logits(context)
            tokens = self.sampler(
                logits,
                self.idx_mapping[:num_rows],
                self.temperature,
                self.seeds,
                # keyed by the position before the drafted token, as vLLM 0.25 and 0.33 key every draw
                self.positions[:num_rows] + step,
                True,
                # vLLM 0.33's drafting salt (2**30, PR #54282): a draft and the residual it may be resampled
                # from must not share noise; the vllm mode also mixes the step into the seed (spec_step_seed)
                is_drafting=True,
                logits_cache=self.draft_logits,
                logits_cache_col=step,
                fixes=self.fixes,
                noise=self.noise,
            )
            self.draft_tokens[:num_rows, step].copy_(tokens)
            context.copy_(torch.cat([context[:, 1:], tokens[:, None]], dim=1))

    def capture_cuda_graphs(self) -> None:
        """Capture one graph per size on a GPU."""
        # zeroed as vLLM 0.33's TargetDependentARSpeculator.capture does: the capture runs write
        # draft_logits of slot 0, harmless before any request arrives
        self.idx_mapping.zero_()
        self.graphs = CapturedStep(self._draft_step, self.dispatcher.capture_sizes, self.device)

    def propose(
        self,
        num_reqs: int,
        idx_mapping: torch.Tensor,
        temperature: torch.Tensor,
        seeds: torch.Tensor,
        context_ids: torch.Tensor,  # [num_reqs, context_len]: each row's last tokens
        positions: torch.Tensor,  # [num_reqs]: each row's last token's position
        *,
        padded: bool = True,  # False: eagerly at the exact size, the reference a padded run must match
        trace: bool = False,
        dummy_run: bool = False,  # the step for no request (every idx_mapping row -1)
    ) -> DraftProposal:
        """Draft k tokens for the ``num_reqs`` batch rows."""
        check_num_reqs(num_reqs, self.max_num_reqs)
        check_id_tensor("positions", positions, min_length=num_reqs)
        width = self.context_ids.shape[1]
        if (
            not isinstance(context_ids, torch.Tensor)
            or context_ids.dtype not in ID_DTYPES
            or context_ids.dim() != 2
            or context_ids.shape[1] != width
            or context_ids.shape[0] < num_reqs
        ):
            raise ValueError(
                f"context_ids must be a signed integer [num_reqs, {width}] tensor, got "
                f"{getattr(context_ids, 'dtype', type(context_ids))} "
                f"{tuple(getattr(context_ids, 'shape', ()))}"
            )
        tokens = context_ids[:num_reqs]
        if device_checks.wanted(tokens) and bool(((tokens < 0) | (tokens >= self.vocab_size)).any()):
            raise ValueError(f"context_ids must lie in [0, {self.vocab_size}), got {tokens.tolist()}")
        self._copy_request_inputs(num_reqs, idx_mapping, temperature, seeds, dummy_run)
        self.context_ids[:num_reqs].copy_(tokens)
        self.positions[:num_reqs].copy_(positions[:num_reqs])
        batch = self.dispatcher.dispatch(num_reqs) if padded else BatchDescriptor(num_reqs, num_reqs, "NONE")
        writes = []
        if trace:
            stale = self.idx_mapping[num_reqs : batch.num_reqs_padded].tolist()
            writes = [(num_reqs + i, s) for i, s in enumerate(stale) if s >= 0]
        if batch.cg_mode == "FULL" and self.graphs is not None:
            self.graphs.replay(batch.num_reqs_padded)
            ran = "cuda graph replay"
        else:
            self._draft_step(batch.num_reqs_padded)
            ran = "eager (padded size)" if batch.num_reqs_padded > num_reqs else "eager (exact size)"
        return DraftProposal(self.draft_tokens[:num_reqs].clone(), batch, ran, writes)


def keyed_generator(seed: int, position: int, device: torch.device | str) -> torch.Generator:
    """A generator that depends only on (request seed, position): batch composition cannot change it."""
    key = (int(seed) * 0x9E3779B97F4A7C15 + int(position) * 0xBF58476D1CE4E5B9) % (2**63 - 1)
    return torch.Generator(device=device).manual_seed(key)


def _check_verification_shapes(target_logits, draft_token_ids, draft_logits, idx_mapping) -> None:
    """``rejection_sample_mrv2``'s shapes: k from the drafts, V from the draft logits."""
    if not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dim() != 2:
        raise ValueError("draft_token_ids must be a [num_reqs, k] tensor")
    num_reqs, k = draft_token_ids.shape
    check_id_tensor("idx_mapping", idx_mapping, min_length=num_reqs)
    if draft_logits.dim() != 3 or draft_logits.shape[1] != k:
        raise ValueError(
            f"draft_logits must be [max_num_reqs, k={k}, V] to match draft_token_ids' k, "
            f"got shape {tuple(draft_logits.shape)}"
        )
    if target_logits.shape != (num_reqs * (k + 1), draft_logits.shape[2]):
        raise ValueError(
            f"target_logits must be [num_reqs * (k + 1), V] = "
            f"{(num_reqs * (k + 1), draft_logits.shape[2])}, got {tuple(target_logits.shape)}"
        )


# Verification accepts draft d with probability min(1, p(d) / q(d)), q read from draft_logits by
# req_state_idx, and otherwise resamples max(p - q, 0) (specfix.v1.rejection_sampler). The draft was sampled
# from the right q; if a padded row overwrote q since, the output no longer follows the target distribution.
def rejection_sample_mrv2(
    target_logits: torch.Tensor,  # [num_reqs * (k + 1), V]: row i * (k + 1) + j follows positions[i] + j
    draft_token_ids: torch.Tensor,  # [num_reqs, k], batch order
    draft_logits: torch.Tensor,  # [max_num_reqs, k, V]: logits before temperature, request-state order
    idx_mapping: torch.Tensor,  # [num_reqs]: batch row -> req_state_idx
    temperature: torch.Tensor,  # [max_num_reqs]
    seeds: torch.Tensor,  # [max_num_reqs]
    positions: torch.Tensor,  # [num_reqs]: each row's last token's position, the randomness key
    fixes: Fixes | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sampled [num_reqs, k + 1] int32, -1 after the last emitted token; num_sampled [num_reqs])``; all
    randomness is keyed by (seed, position), so a request's tokens do not depend on the rest of the batch."""
    fixes = fixes or Fixes()
    _check_verification_shapes(target_logits, draft_token_ids, draft_logits, idx_mapping)
    (num_reqs, k), vocab_size = draft_token_ids.shape, draft_logits.shape[2]
    slots = idx_mapping[:num_reqs].long()
    check_slots("idx_mapping[:num_reqs]", slots.cpu(), draft_logits.shape[0])
    device = target_logits.device
    temp = temperature[slots].float()
    if not bool((temp >= SAMPLING_EPS).all()):
        raise ValueError(
            f"probabilistic verification needs temperature >= SAMPLING_EPS ({SAMPLING_EPS}) for "
            f"every row, got {temp.tolist()}"
        )
    scaled = target_logits.float().view(num_reqs, k + 1, vocab_size) / temp[:, None, None]
    verify_logits = scaled[:, :k].reshape(num_reqs * k, vocab_size).contiguous()
    bonus_probs = torch.softmax(scaled[:, k], dim=-1)
    draft_scaled = draft_logits[slots].float() / temp[:, None, None]  # vLLM 0.33's verifier divides on load
    draft_probs = torch.softmax(draft_scaled.reshape(num_reqs * k, vocab_size), dim=-1)
    seeds_list, pos_list = seeds[slots].tolist(), positions[:num_reqs].tolist()
    gens = {i: keyed_generator(seeds_list[i], pos_list[i], device) for i in range(num_reqs)}
    meta = SamplingMetadata(temperature=temp, all_greedy=False, all_random=True, generators=gens)
    num_draft = [k] * num_reqs
    cu = (torch.arange(1, num_reqs + 1, device=device) * k).to(torch.int32)
    flat_drafts = draft_token_ids.reshape(-1).to(torch.int32)
    uniform = generate_uniform_probs(num_reqs * k, num_draft, gens, device)
    recovered = sample_recovered_tokens(
        k, num_draft, cu, flat_drafts, draft_probs, torch.softmax(verify_logits, dim=-1), meta, device
    )
    noise = torch.stack(
        [torch.empty(vocab_size, device=device).exponential_(generator=gens[i]) for i in range(num_reqs)]
    )
    bonus = (bonus_probs / noise).argmax(dim=-1).to(torch.int32)
    sampled = rejection_sample(
        flat_drafts,
        num_draft,
        k,
        cu,
        draft_probs,
        verify_logits,
        bonus,
        meta,
        uniform_probs=uniform,
        recovered_token_ids=recovered,
        reject_negative_drafts=fixes.reject_negative_drafts,
    )
    num_sampled = (sampled != PLACEHOLDER_TOKEN_ID).sum(dim=1)
    return sampled, num_sampled
