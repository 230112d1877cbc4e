"""Verify draft tokens against the target model: the V1 rejection sampler.

Mirrors vLLM 0.33.0's ``vllm/v1/sample/rejection_sampler.py``, standard verification only (Leviathan et
al., arXiv 2211.17192): an *accepted* draft passes the test, a *recovered* token is drawn from the residual
at the first rejection, a *bonus* token from the last row when every draft passes.

A ``-1`` placeholder draft is always rejected: greedy because it never equals an argmax, random because
of vLLM PR #46533's ``draft < 0`` guard (``Fixes.reject_negative_drafts``).

Read ``rejection_sample`` first. The kernels sit in ``specfix.v1.rejection_kernels`` and
``specfix.v1.recovered_tokens``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from specfix.checks import check_device, check_id_tensor, check_vector, is_int
from specfix.fixes import Fixes
from specfix.v1 import device_checks
from specfix.v1.recovered_tokens import _exponential_noise, _token_to_request, sample_recovered_tokens
from specfix.v1.rejection_kernels import (
    PLACEHOLDER_TOKEN_ID,
    _use_triton,
    rejection_greedy_sample,
    rejection_random_sample,
)
from specfix.v1.sampling_metadata import SamplingMetadata
from specfix.v1.spec_decode_metadata import SpecDecodeMetadata

#: Most drafts one request may carry in one step.
MAX_SPEC_LEN = 128

_DEFAULT_FIXES = Fixes()


class RejectionSampler(torch.nn.Module):
    """Target logits and drafts in, accepted, recovered and bonus tokens out; unlike vLLM, the bonus token
    is sampled here (there is no separate ``Sampler``)."""

    def __init__(self, fixes: Fixes = _DEFAULT_FIXES, backend: str = "auto"):
        super().__init__()
        if not isinstance(fixes, Fixes):
            raise TypeError(f"fixes must be a specfix.Fixes, got {type(fixes).__name__}")
        _use_triton(backend)
        self.fixes = fixes
        self.backend = backend

    def forward(
        self,
        metadata: SpecDecodeMetadata,
        draft_probs: torch.Tensor | None,
        logits: torch.Tensor,
        sampling_metadata: SamplingMetadata,
    ) -> torch.Tensor:
        """``[B, max_spec_len + 1]`` int32 token ids (not vLLM's ``SamplerOutput``); ``logits`` is not
        modified. A seeded request's draws come from its own generator alone."""
        # Validate everything before drawing random numbers, so a bad call consumes no randomness.
        _check_forward(metadata, draft_probs, logits, sampling_metadata)
        if sampling_metadata.all_greedy:
            return _greedy_forward(metadata, logits, self.backend)
        # index_select copies (int32 indices as they come; logits[idx] is the same copy through more host
        # work), so the copies are scaled in place. The mask and the divisors are read once for the step: on
        # a GPU each is a launch (None: no launch).
        bonus_logits = _float32(logits.index_select(0, metadata.bonus_logits_indices))
        target_logits = _float32(logits.index_select(0, metadata.target_logits_indices))
        is_greedy = _mixed_greedy_mask(sampling_metadata)
        divisors = _divisors(sampling_metadata, is_greedy)
        bonus_token_ids = _sample_bonus_tokens(bonus_logits, sampling_metadata, divisors, is_greedy)
        apply_sampling_constraints(
            target_logits,
            metadata.cu_num_draft_tokens,
            sampling_metadata,
            temperature=divisors,
            num_draft_tokens=metadata.num_draft_tokens,
        )
        return _rejection_sample(
            metadata.draft_token_ids,
            metadata.num_draft_tokens,
            metadata.max_spec_len,
            metadata.cu_num_draft_tokens,
            draft_probs,
            target_logits,
            bonus_token_ids,
            sampling_metadata,
            reject_negative_drafts=self.fixes.reject_negative_drafts,
            backend=self.backend,
            is_greedy=is_greedy,
        )

    @staticmethod
    def parse_output(
        output_token_ids: torch.Tensor, vocab_size: int, discard_req_indices: Sequence[int] = ()
    ) -> list[list[int]]:
        """Per-request token lists without placeholders; discarded requests (partial prefills) get ``[]``."""
        if (
            not isinstance(output_token_ids, torch.Tensor)
            or output_token_ids.dim() != 2
            or output_token_ids.dtype.is_floating_point
            or output_token_ids.dtype == torch.bool
        ):
            raise TypeError("output_token_ids must be a 2-D integer tensor [B, max_spec_len + 1]")
        if not is_int(vocab_size) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        rows = output_token_ids.cpu().tolist()
        bad = [i for i in discard_req_indices if not 0 <= i < len(rows)]
        if bad:
            raise ValueError(f"discard_req_indices must lie in [0, {len(rows)}), got {bad}")
        discard = set(discard_req_indices)
        return [
            [] if i in discard else [t for t in row if t != PLACEHOLDER_TOKEN_ID and t < vocab_size]
            for i, row in enumerate(rows)
        ]


def _greedy_forward(metadata: SpecDecodeMetadata, logits: torch.Tensor, backend: str) -> torch.Tensor:
    """``forward`` when every request is greedy: one argmax over every row, then the ids are gathered, not
    the rows (an argmax is exact in any float dtype, so no float32 copy either)."""
    argmax = logits.argmax(dim=-1)
    target_argmax = argmax.index_select(0, metadata.target_logits_indices)
    bonus_token_ids = argmax.index_select(0, metadata.bonus_logits_indices)
    output_token_ids = _output_table(metadata.batch_size, metadata.max_spec_len, logits.device)
    rejection_greedy_sample(
        output_token_ids,
        metadata.cu_num_draft_tokens,
        metadata.draft_token_ids,
        target_argmax,
        bonus_token_ids,
        None,
        metadata.max_spec_len,
        backend=backend,
    )
    return output_token_ids


def _output_table(batch_size: int, max_spec_len: int, device: torch.device) -> torch.Tensor:
    """[B, max_spec_len + 1] int32, not filled: the kernels write each row whole, placeholders included
    (allocated after the argmax is queued, so that the GPU starts while the host allocates)."""
    return torch.empty((batch_size, max_spec_len + 1), dtype=torch.int32, device=device)


# Validation: types, shapes and devices always; values (a host sync on a GPU) only under device_checks.


def _check_forward(metadata, draft_probs, logits, sampling_metadata) -> None:
    """Every check ``RejectionSampler.forward`` makes, all before it draws anything; the metadata checked
    its own counts and tensors when it was built."""
    if not isinstance(metadata, SpecDecodeMetadata):
        raise TypeError(f"metadata must be a SpecDecodeMetadata, got {type(metadata).__name__}")
    _check_logits("logits", logits)
    rows = metadata.draft_token_ids.numel() + metadata.batch_size
    if logits.shape[0] != rows:
        raise ValueError(f"logits must have num_draft_total + B = {rows} rows, got {logits.shape[0]}")
    _check_sampling_metadata(sampling_metadata, metadata.batch_size, logits.device)
    _check_rejection_inputs(
        metadata.draft_token_ids,
        metadata.num_draft_tokens,
        metadata.max_spec_len,
        metadata.cu_num_draft_tokens,
        draft_probs,
        logits.shape[1],
        {"logits": logits, "draft_probs": draft_probs},
        {
            "metadata.target_logits_indices": (metadata.target_logits_indices, 0, rows),
            "metadata.bonus_logits_indices": (metadata.bonus_logits_indices, 0, rows),
        },
    )


def _check_logits(name: str, logits: object) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.dtype.is_floating_point:
        raise TypeError(
            f"{name} must be a float tensor, got {getattr(logits, 'dtype', type(logits).__name__)}"
        )
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(
            f"{name} must be 2-D [rows, vocab_size] with vocab_size > 0, got {tuple(logits.shape)}"
        )


def _check_sampling_metadata(sampling_metadata: object, batch_size: int, device: torch.device) -> None:
    if not isinstance(sampling_metadata, SamplingMetadata):
        raise TypeError(
            f"sampling_metadata must be a SamplingMetadata, got {type(sampling_metadata).__name__}"
        )
    t = sampling_metadata.temperature
    if t is not None and t.numel() != batch_size:
        raise ValueError(f"sampling_metadata.temperature has {t.numel()} entries for a batch of {batch_size}")
    if t is not None:
        check_device("sampling_metadata.temperature", t, device, "the logits")
    bad = [i for i in sampling_metadata.generators if not 0 <= i < batch_size]
    if bad:
        raise ValueError(f"sampling_metadata.generators keys {bad} are outside the batch of {batch_size}")


def _check_rejection_inputs(
    draft_token_ids,
    num_draft_tokens,
    max_spec_len,
    cu_num_draft_tokens,
    draft_probs,
    vocab_size: int,
    scores: dict[str, torch.Tensor | None],
    ranges: dict[str, tuple[torch.Tensor, float, float]],
) -> None:
    """What forward and ``rejection_sample`` both check: the drafts' bound and ``draft_probs``' shape
    always; ``ranges`` (name -> tensor, low, high) and ``scores`` (name -> float table) read under
    ``device_checks``, with the drafts too."""
    if max_spec_len > MAX_SPEC_LEN:
        raise ValueError(
            f"a request has {max_spec_len} drafts; at most MAX_SPEC_LEN={MAX_SPEC_LEN} are allowed"
        )
    if draft_probs is not None:
        _check_logits("draft_probs", draft_probs)
        shape = (draft_token_ids.numel(), vocab_size)
        if tuple(draft_probs.shape) != shape:
            raise ValueError(
                f"draft_probs must have shape {shape} like the target logits, got {tuple(draft_probs.shape)}"
            )
    if device_checks.wanted(draft_token_ids, *scores.values()):
        # Drafts may be PLACEHOLDER_TOKEN_ID (-1) or a token id.
        ranges = {"draft_token_ids": (draft_token_ids, PLACEHOLDER_TOKEN_ID, vocab_size), **ranges}
        _check_values(ranges, scores, cu_num_draft_tokens, num_draft_tokens)


def _check_drafts(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens) -> int:
    """``rejection_sample``'s drafts, counts first (an empty batch is told so); returns the draft total.
    ``forward``'s metadata made the same checks when it was built."""
    if not isinstance(num_draft_tokens, (list, tuple)) or len(num_draft_tokens) == 0:
        raise ValueError("num_draft_tokens must be a non-empty list: a batch needs at least one request")
    if set(map(type, num_draft_tokens)) != {int} or min(num_draft_tokens) < 0:  # at C speed; bool is not int
        bad = [n for n in num_draft_tokens if not is_int(n) or n < 0]
        if bad:
            raise ValueError(f"num_draft_tokens must hold ints >= 0, got {bad[0]!r}")
    total, largest = sum(num_draft_tokens), max(num_draft_tokens)
    if max_spec_len != largest:
        raise ValueError(f"max_spec_len={max_spec_len} but max(num_draft_tokens)={largest}")
    check_id_tensor("draft_token_ids", draft_token_ids, total)
    check_id_tensor("cu_num_draft_tokens", cu_num_draft_tokens, len(num_draft_tokens))
    return total


def _check_values(ranges, scores, cu_num_draft_tokens, num_draft_tokens) -> None:
    """Every value check in one host sync: a NaN row would silently emit token 0, so scores must be
    finite-softmaxable, ranges in bounds, the cumulative counts those of ``num_draft_tokens``."""
    named = [(name, t, lo, hi) for name, (t, lo, hi) in ranges.items() if t.numel()]
    floats = [(name, t) for name, t in scores.items() if t is not None and t.numel()]
    stats = [torch.stack([t.min().double(), t.max().double()]) for _, t, _, _ in named]
    expected = torch.tensor(num_draft_tokens, dtype=torch.int64).cumsum(0).to(cu_num_draft_tokens.device)
    wrong = cu_num_draft_tokens.long() != expected
    stats.append(torch.stack([wrong.sum().double(), wrong.long().argmax().double()]))
    for name, t in floats:
        bad_rows = (t.isnan() | t.isposinf()).any(dim=-1) | (t.amax(dim=-1) == float("-inf"))
        if name == "draft_probs":  # probabilities, where a row of zeros (nothing drafted) is fine
            bad_rows = t.isnan().any(dim=-1) | (t < 0).any(dim=-1) | (t > 1).any(dim=-1)
        stats.append(torch.stack([bad_rows.sum().double(), bad_rows.long().argmax().double()]))
    values = iter(torch.stack([x.to(stats[0].device) for x in stats]).tolist())
    for (name, t, lo, hi), (smallest, largest) in zip(named, values, strict=False):  # values goes on
        if not lo <= smallest <= largest < hi:  # False for NaN too
            show = (lambda x: f"{x:g}") if t.dtype.is_floating_point else int
            raise ValueError(
                f"{name} must lie in [{lo:g}, {hi:g}), got min {show(smallest)}, max {show(largest)}"
            )
    num_bad, first_bad = next(values)
    if num_bad:
        raise ValueError(
            f"cu_num_draft_tokens must be the inclusive cumulative sum of num_draft_tokens "
            f"{list(num_draft_tokens)}; {int(num_bad)} entries are not, the first is entry {int(first_bad)}"
        )
    for (name, _), (num_bad, first_bad) in zip(floats, values, strict=True):
        if num_bad:
            rule = "in [0, 1]" if name == "draft_probs" else "free of NaN, +inf and all -inf rows"
            raise ValueError(
                f"{name} must be {rule}; {int(num_bad)} row(s) are not, the first is row {int(first_bad)}"
            )


# Batch -> token helpers, sampling constraints, randomness


def apply_sampling_constraints(
    logits: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    *,
    temperature: torch.Tensor | None = None,
    num_draft_tokens: list[int] | None = None,
) -> torch.Tensor:
    """Divide each token's logits by its request's temperature in place (greedy rows by 1). With
    ``num_draft_tokens`` all equal, one broadcast division replaces the per-token expansion (3 launches)."""
    if sampling_metadata.all_greedy:
        return logits
    if temperature is None:
        temperature = _divisors(sampling_metadata, _mixed_greedy_mask(sampling_metadata))
    k = num_draft_tokens[0] if num_draft_tokens else 0
    if k > 0 and num_draft_tokens.count(k) == len(num_draft_tokens):  # no set built per call
        logits.view(len(num_draft_tokens), k, -1).div_(temperature.view(-1, 1, 1))
        return logits
    # vLLM's expand_batch_to_tokens, without its replace_from: _divisors already gave greedy requests 1.
    temperature = temperature[_token_to_request(cu_num_draft_tokens, logits.shape[0])]
    return logits.div_(temperature.unsqueeze(-1))


def generate_uniform_probs(
    num_tokens: int, num_draft_tokens: list[int], generators: dict[int, torch.Generator], device
) -> torch.Tensor:
    """One U[0,1) float64 per draft token (float32 returns exactly 0.0 too often); a seeded request's
    slice is redrawn from its own generator, so it does not depend on the rest of the batch.
    ``generators``' keys must be batch indices (the callers check them)."""
    uniform_probs = torch.rand(num_tokens, dtype=torch.float64, device=device)
    if generators:
        starts = [0, *itertools.accumulate(num_draft_tokens)]
        for i in sorted(generators):
            if num_draft_tokens[i] > 0:
                uniform_probs[starts[i] : starts[i + 1]].uniform_(generator=generators[i])
    return uniform_probs


def _divisors(sampling_metadata: SamplingMetadata, is_greedy: torch.Tensor | None) -> torch.Tensor:
    """[B] what each request's logits are divided by: its temperature, 1 for a greedy one."""
    if sampling_metadata.all_random:
        return sampling_metadata.temperature
    return torch.where(is_greedy, 1.0, sampling_metadata.temperature)


def _mixed_greedy_mask(sampling_metadata: SamplingMetadata) -> torch.Tensor | None:
    """[B] bool greedy mask when the batch mixes greedy and random requests (each read of ``is_greedy``
    is a comparison: a launch on a GPU); None when every request samples alike, which the kernels read as
    every row theirs."""
    if sampling_metadata.all_greedy or sampling_metadata.all_random:
        return None
    return sampling_metadata.is_greedy


def _float32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float32 else x.to(torch.float32)


def _sample_bonus_tokens(logits, sampling_metadata: SamplingMetadata, divisors, is_greedy) -> torch.Tensor:
    """[B] int token ids: argmax for greedy requests, a draw from softmax(logits / T) for random ones.
    ``logits`` is a scratch copy, scaled in place."""
    argmax = None if is_greedy is None else logits.argmax(dim=-1)
    probs = torch.softmax(logits.div_(divisors.unsqueeze(-1)), dim=-1)
    batch_size, vocab_size = logits.shape
    noise = _exponential_noise(batch_size, vocab_size, sampling_metadata.generators, None, logits.device)
    sampled = probs.div_(noise).argmax(dim=-1)
    return sampled if is_greedy is None else torch.where(is_greedy, argmax, sampled)


# Dispatch


def rejection_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    *,
    uniform_probs: torch.Tensor | None = None,
    recovered_token_ids: torch.Tensor | None = None,
    reject_negative_drafts: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """Verify every request's drafts into ``[B, max_spec_len + 1]`` int32, placeholder-filled as in vLLM:
    row i holds its accepted drafts then one recovered or bonus token. ``draft_probs`` None is one-hot."""
    num_tokens = _check_drafts(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens)
    _check_logits("target_logits", target_logits)
    _check_sampling_metadata(sampling_metadata, len(num_draft_tokens), target_logits.device)
    rows, vocab_size = target_logits.shape
    if rows != num_tokens:
        raise ValueError(f"target_logits must have num_draft_total = {num_tokens} rows, got {rows}")
    ranges = {}
    if uniform_probs is not None:
        check_vector("uniform_probs", uniform_probs, (torch.float64,), num_tokens)
        ranges["uniform_probs"] = (uniform_probs, 0, 1)
    if recovered_token_ids is not None:
        check_id_tensor("recovered_token_ids", recovered_token_ids, num_tokens)
        ranges["recovered_token_ids"] = (recovered_token_ids, 0, vocab_size)
    check_id_tensor("bonus_token_ids", bonus_token_ids, len(num_draft_tokens))
    ranges["bonus_token_ids"] = (bonus_token_ids, 0, vocab_size)
    _check_rejection_inputs(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        vocab_size,
        {"target_logits": target_logits, "draft_probs": draft_probs},
        ranges,
    )
    return _rejection_sample(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_logits,
        bonus_token_ids,
        sampling_metadata,
        uniform_probs=uniform_probs,
        recovered_token_ids=recovered_token_ids,
        reject_negative_drafts=reject_negative_drafts,
        backend=backend,
    )


# rejection_sample on inputs already validated: the rejection core the bench times beside vLLM's.
def _rejection_sample(
    draft_token_ids,
    num_draft_tokens,
    max_spec_len,
    cu_num_draft_tokens,
    draft_probs,
    target_logits,
    bonus_token_ids,
    sampling_metadata,
    uniform_probs=None,
    recovered_token_ids=None,
    reject_negative_drafts=True,
    backend="auto",
    is_greedy=None,
) -> torch.Tensor:
    if is_greedy is None:  # forward passes the mask it has read
        is_greedy = _mixed_greedy_mask(sampling_metadata)
    target_argmax = None if sampling_metadata.all_random else target_logits.argmax(dim=-1)  # queued first
    output_token_ids = _output_table(len(num_draft_tokens), max_spec_len, target_logits.device)
    if target_argmax is not None:
        rejection_greedy_sample(
            output_token_ids,
            cu_num_draft_tokens,
            draft_token_ids,
            target_argmax,
            bonus_token_ids,
            is_greedy,
            max_spec_len,
            backend=backend,
        )
        if sampling_metadata.all_greedy:
            return output_token_ids
    target_probs = torch.softmax(target_logits, dim=-1, dtype=torch.float32)
    uniform_probs, recovered_token_ids = _random_draws(
        uniform_probs,
        recovered_token_ids,
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        target_probs,
        sampling_metadata,
        backend,
    )
    rejection_random_sample(
        output_token_ids,
        cu_num_draft_tokens,
        draft_token_ids,
        draft_probs,
        target_probs,
        bonus_token_ids,
        recovered_token_ids,
        uniform_probs,
        is_greedy,
        max_spec_len,
        reject_negative_drafts=reject_negative_drafts,
        backend=backend,
    )
    return output_token_ids


def _random_draws(
    uniform_probs,
    recovered_token_ids,
    draft_token_ids,
    num_draft_tokens,
    max_spec_len,
    cu_num_draft_tokens,
    draft_probs,
    target_probs,
    sampling_metadata,
    backend,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What the caller did not pass, drawn in vLLM's order (uniforms, then the recovered draw's noise), so
    that a seeded request's generator gives vLLM's table; split recovered rows stay keys for the kernel."""
    if uniform_probs is None:
        uniform_probs = generate_uniform_probs(
            draft_token_ids.numel(), num_draft_tokens, sampling_metadata.generators, target_probs.device
        )
    if recovered_token_ids is None:
        recovered_token_ids = sample_recovered_tokens(
            max_spec_len,
            num_draft_tokens,
            cu_num_draft_tokens,
            draft_token_ids,
            draft_probs,
            target_probs,
            sampling_metadata,
            backend=backend,
            split_keys=True,
        )
    return uniform_probs, recovered_token_ids
