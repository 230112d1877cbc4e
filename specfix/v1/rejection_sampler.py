"""Verify draft tokens against the target model: the V1 rejection sampler.

Mirrors vLLM 0.33.0's ``vllm/v1/sample/rejection_sampler.py`` (standard verification only; vLLM's
synthetic, block and FLy modes, top-k/top-p, penalties and logprobs are left out). Algorithm: Leviathan
et al., arXiv 2211.17192. Terms: an *accepted* token passes the test; a *recovered* token is sampled from the
residual distribution at the first rejection; the *bonus* token is sampled from the target's last row
when every draft passes.

A draft id of ``-1`` (the scheduler's placeholder) is always rejected: greedy because it never equals
an argmax, random because of vLLM PR #46533's explicit ``draft < 0`` guard (``Fixes.reject_negative_drafts``;
switched off, the placeholder can be accepted and written out as a token: ``rejection_random_sample_kernel``).

Read ``rejection_sample`` first (it validates, then verifies), then ``rejection_random_sample`` and its
kernel; every Triton kernel here has a vectorised torch reference (``*_ref``) that tests tie to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specfix import runtime
from specfix.checks import check_device, check_id_tensor, is_int
from specfix.fixes import Fixes
from specfix.runtime import HAS_TRITON, tl, triton
from specfix.v1 import device_checks
from specfix.v1.sampling_metadata import GREEDY_TEMPERATURE, SAMPLING_EPS, SamplingMetadata
from specfix.v1.spec_decode_metadata import SpecDecodeMetadata

__all__ = [
    "GREEDY_TEMPERATURE",
    "MAX_SPEC_LEN",
    "PLACEHOLDER_TOKEN_ID",
    "RejectionSampler",
    "SAMPLING_EPS",
    "apply_sampling_constraints",
    "expand_batch_to_tokens",
    "generate_uniform_probs",
    "rejection_greedy_sample",
    "rejection_greedy_sample_ref",
    "rejection_random_sample",
    "rejection_random_sample_ref",
    "rejection_sample",
    "sample_recovered_tokens",
    "sample_recovered_tokens_ref",
]

#: Fills the output past each request's last token, and marks a draft slot the drafter left empty.
PLACEHOLDER_TOKEN_ID = -1
#: Most drafts one request may carry in one step.
MAX_SPEC_LEN = 128
#: Lanes that cover one output row, ``max_spec_len + 1 <= MAX_SPEC_LEN + 1`` columns (a kernel constant,
#: so one compilation still serves every k).
_ROW_BLOCK = 256

_DEFAULT_FIXES = Fixes()
_BACKENDS = ("auto", "triton", "torch")


def _use_triton(backend: str, device: torch.device | None = None) -> bool:
    """Whether to launch the Triton kernel: on CUDA tensors, or anywhere under Triton's interpreter."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {_BACKENDS}, got {backend!r}")
    if backend == "torch":
        return False
    usable = HAS_TRITON and (runtime.INTERPRET or device is None or device.type == "cuda")
    if backend == "triton" and not usable:
        raise RuntimeError(
            f"backend='triton' cannot run here (triton installed: {HAS_TRITON}, tensors on {device}, "
            f"interpreter: {runtime.INTERPRET}); use backend='torch' or move the tensors to the GPU"
        )
    return usable


class RejectionSampler(torch.nn.Module):
    """Turns target logits and draft tokens into each request's accepted, recovered and bonus tokens.

    Unlike vLLM, there is no separate ``Sampler``: the bonus token is sampled here, by argmax for greedy
    requests and by a seeded draw from ``softmax(logits / T)`` for random ones.
    """

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
        """Return the sampled token ids, ``[B, max_spec_len + 1]`` int32 (a plain tensor, not vLLM's
        ``SamplerOutput``), ``PLACEHOLDER_TOKEN_ID`` where no token was produced.

        ``logits`` has ``sum k_i + B`` rows (already gathered by ``logits_indices``), indexed by
        ``metadata.target_logits_indices`` and ``metadata.bonus_logits_indices``; it is not modified.
        A seeded random request draws from its own generator, in this order: V exponentials for its
        bonus token, then (only if k_i > 0) k_i uniforms and V exponentials for its recovered tokens;
        so its output does not depend on the rest of the batch.
        """
        if not isinstance(metadata, SpecDecodeMetadata):
            raise TypeError(f"metadata must be a SpecDecodeMetadata, got {type(metadata).__name__}")
        _check_logits("logits", logits)
        expected_rows = metadata.draft_token_ids.numel() + metadata.batch_size
        if logits.shape[0] != expected_rows:
            raise ValueError(
                f"logits must have num_draft_total + B = {expected_rows} rows, got {logits.shape[0]}"
            )
        _check_sampling_metadata(sampling_metadata, metadata.batch_size, logits.device)
        # Validate everything before drawing random numbers, so a bad call consumes no randomness.
        _check_rejection_inputs(
            metadata.draft_token_ids,
            metadata.num_draft_tokens,
            metadata.max_spec_len,
            metadata.cu_num_draft_tokens,
            draft_probs,
            (metadata.draft_token_ids.numel(), logits.shape[1]),
            index_ranges={
                "metadata.target_logits_indices": (metadata.target_logits_indices, expected_rows),
                "metadata.bonus_logits_indices": (metadata.bonus_logits_indices, expected_rows),
            },
            scores={"logits": logits, "draft_probs": draft_probs},
        )
        bonus_logits = logits[metadata.bonus_logits_indices.long()].to(torch.float32, copy=True)
        target_logits = logits[metadata.target_logits_indices.long()].to(torch.float32, copy=True)
        bonus_token_ids = _sample_bonus_tokens(bonus_logits, sampling_metadata)
        target_logits = apply_sampling_constraints(
            target_logits, metadata.cu_num_draft_tokens, sampling_metadata
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
        )

    @staticmethod
    def parse_output(
        output_token_ids: torch.Tensor, vocab_size: int, discard_req_indices: Sequence[int] = ()
    ) -> list[list[int]]:
        """Per-request token lists: drop ``PLACEHOLDER_TOKEN_ID`` and ids >= ``vocab_size``; requests in
        ``discard_req_indices`` (e.g. partial prefills whose sample is thrown away) get ``[]``."""
        if (not isinstance(output_token_ids, torch.Tensor) or output_token_ids.dim() != 2
                or output_token_ids.dtype.is_floating_point or output_token_ids.dtype == torch.bool):
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


# ----------------------------------------------------------------------------------------------------
# Validation


def _check_logits(name: str, logits: object) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.dtype.is_floating_point:
        raise TypeError(
            f"{name} must be a float tensor, got {getattr(logits, 'dtype', type(logits).__name__)}"
        )
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(
            f"{name} must be 2-D [rows, vocab_size] with vocab_size > 0, got {tuple(logits.shape)}"
        )


def _check_sampling_metadata(sampling_metadata: object, batch_size: int, device: torch.device | None = None
                             ) -> None:
    if not isinstance(sampling_metadata, SamplingMetadata):
        raise TypeError(
            f"sampling_metadata must be a SamplingMetadata, got {type(sampling_metadata).__name__}"
        )
    t = sampling_metadata.temperature
    if t is not None and t.numel() != batch_size:
        raise ValueError(f"sampling_metadata.temperature has {t.numel()} entries for a batch of {batch_size}")
    if t is not None and device is not None:
        check_device("sampling_metadata.temperature", t, device, "the logits")
    bad = [i for i in sampling_metadata.generators if not 0 <= i < batch_size]
    if bad:
        raise ValueError(f"sampling_metadata.generators keys {bad} are outside the batch of {batch_size}")


def _check_values(
    ranges: dict[str, tuple[torch.Tensor, float, float]], scores: dict[str, torch.Tensor | None],
    cumsums: dict[str, tuple[torch.Tensor, list[int]]] | None = None,
) -> None:
    """One host sync for every value check: each ``ranges`` tensor lies in ``[low, high)`` (NaN does not);
    no ``scores`` tensor ([rows, V] logits) holds NaN or +inf or a row of only -inf (each makes the softmax
    NaN, and a NaN row would silently emit token 0); ``scores["draft_probs"]``, probabilities, lie in
    [0, 1]; each ``cumsums`` tensor is the inclusive cumulative sum of its counts.
    On GPU tensors these checks run only under ``device_checks`` (the step path makes no host sync)."""
    cumsums = cumsums or {}
    tensors = ([t for t, _, _ in ranges.values()] + [t for t in scores.values() if t is not None]
               + [t for t, _ in cumsums.values()])
    if not device_checks.wanted(*tensors):
        return
    named = [(name, t, lo, hi) for name, (t, lo, hi) in ranges.items() if t.numel()]
    floats = [(name, t) for name, t in scores.items() if t is not None and t.numel()]
    stats = [torch.stack([t.min().double(), t.max().double()]) for _, t, _, _ in named]
    for t, counts in cumsums.values():
        expected = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(t.device)
        wrong = t.long() != expected
        stats.append(torch.stack([wrong.sum().double(), wrong.long().argmax().double()]))
    for name, t in floats:
        bad_rows = (t.isnan() | t.isposinf()).any(dim=-1) | (t.amax(dim=-1) == float("-inf"))
        if name == "draft_probs":  # probabilities, where a row of zeros (nothing drafted) is fine
            bad_rows = t.isnan().any(dim=-1) | (t < 0).any(dim=-1) | (t > 1).any(dim=-1)
        stats.append(torch.stack([bad_rows.sum().double(), bad_rows.long().argmax().double()]))
    if not stats:
        return
    values = torch.stack([x.to(stats[0].device) for x in stats]).tolist()
    for (name, t, lo, hi), (smallest, largest) in zip(named, values[: len(named)], strict=True):
        if not lo <= smallest <= largest < hi:  # False for NaN too
            show = (lambda x: f"{x:g}") if t.dtype.is_floating_point else int
            raise ValueError(f"{name} must lie in [{lo:g}, {hi:g}), got min {show(smallest)}, "
                             f"max {show(largest)}")
    for (name, (_, counts)), (num_bad, first_bad) in zip(
            cumsums.items(), values[len(named): len(named) + len(cumsums)], strict=True):
        if num_bad:
            raise ValueError(f"{name} must be the inclusive cumulative sum of num_draft_tokens "
                             f"{list(counts)}; {int(num_bad)} entries are not, the first is entry "
                             f"{int(first_bad)}")
    for (name, _), (num_bad, first_bad) in zip(floats, values[len(named) + len(cumsums):], strict=True):
        if num_bad:
            rule = "in [0, 1]" if name == "draft_probs" else "free of NaN, +inf and all -inf rows"
            raise ValueError(f"{name} must be {rule}; {int(num_bad)} row(s) are not, the first is row "
                             f"{int(first_bad)}")


def _check_rejection_inputs(
    draft_token_ids,
    num_draft_tokens,
    max_spec_len,
    cu_num_draft_tokens,
    draft_probs,
    target_shape: tuple[int, int],
    uniform_probs=None,
    recovered_token_ids=None,
    index_ranges: dict[str, tuple[torch.Tensor, int]] | None = None,
    scores: dict[str, torch.Tensor | None] | None = None,
    bonus_token_ids=None,
) -> None:
    _check_num_draft_tokens(num_draft_tokens)
    total = sum(num_draft_tokens)
    if max_spec_len != max(num_draft_tokens):
        raise ValueError(f"max_spec_len={max_spec_len} but max(num_draft_tokens)={max(num_draft_tokens)}")
    if max_spec_len > MAX_SPEC_LEN:
        raise ValueError(
            f"a request has {max_spec_len} drafts; at most MAX_SPEC_LEN={MAX_SPEC_LEN} are allowed"
        )
    check_id_tensor("draft_token_ids", draft_token_ids, total)
    check_id_tensor("cu_num_draft_tokens", cu_num_draft_tokens, len(num_draft_tokens))
    if target_shape[0] != total:
        raise ValueError(f"target_logits must have num_draft_total = {total} rows, got {target_shape[0]}")
    vocab_size = target_shape[1]
    if draft_probs is not None:
        _check_logits("draft_probs", draft_probs)
        if tuple(draft_probs.shape) != tuple(target_shape):
            raise ValueError(
                f"draft_probs must have shape {tuple(target_shape)} like the target logits, "
                f"got {tuple(draft_probs.shape)}"
            )
    if uniform_probs is not None:
        if not isinstance(uniform_probs, torch.Tensor) or uniform_probs.dtype != torch.float64:
            raise TypeError("uniform_probs must be a float64 tensor")
        if uniform_probs.shape != (total,):
            raise ValueError(f"uniform_probs must have shape ({total},), got {tuple(uniform_probs.shape)}")
    # Drafts may be PLACEHOLDER_TOKEN_ID (-1) or a token id.
    ranges = {"draft_token_ids": (draft_token_ids, PLACEHOLDER_TOKEN_ID, vocab_size)}
    if uniform_probs is not None:
        ranges["uniform_probs"] = (uniform_probs, 0, 1)
    if recovered_token_ids is not None:
        check_id_tensor("recovered_token_ids", recovered_token_ids, total)
        ranges["recovered_token_ids"] = (recovered_token_ids, 0, vocab_size)
    if bonus_token_ids is not None:
        check_id_tensor("bonus_token_ids", bonus_token_ids, len(num_draft_tokens))
        ranges["bonus_token_ids"] = (bonus_token_ids, 0, vocab_size)
    for name, (index, high) in (index_ranges or {}).items():
        ranges[name] = (index, 0, high)
    _check_values(ranges, scores or {}, {"cu_num_draft_tokens": (cu_num_draft_tokens, num_draft_tokens)})


def _check_num_draft_tokens(num_draft_tokens: object) -> None:
    """A non-empty list of ints >= 0: checked first, so an empty batch is told so."""
    if not isinstance(num_draft_tokens, (list, tuple)) or len(num_draft_tokens) == 0:
        raise ValueError("num_draft_tokens must be a non-empty list: a batch needs at least one request")
    bad = [n for n in num_draft_tokens if not is_int(n) or n < 0]
    if bad:
        raise ValueError(f"num_draft_tokens must hold ints >= 0, got {bad[0]!r}")


# ----------------------------------------------------------------------------------------------------
# Batch -> token helpers, sampling constraints, randomness


def expand_batch_to_tokens(
    x: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    num_tokens: int,
    replace_from: float = 0,
    replace_to: float = 0,
) -> torch.Tensor:
    """Repeat each request's value once per token: ``x=[a,b,c]``, ``cu_num_tokens=[2,5,6]`` gives
    ``[a,a,b,b,b,c]``. Values equal to ``replace_from`` become ``replace_to`` (no-op when both are 0)."""
    if x.shape[0] != cu_num_tokens.shape[0]:
        raise ValueError(f"x has {x.shape[0]} entries but cu_num_tokens has {cu_num_tokens.shape[0]}")
    if replace_from != replace_to:
        x = torch.where(x == replace_from, replace_to, x)
    return x[_token_to_request(cu_num_tokens, num_tokens)]


def _token_to_request(cu_num_tokens: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[num_tokens] int64: the request each flat token belongs to, from the inclusive cumulative counts
    (a binary search on the device: no host sync, unlike ``repeat_interleave``, and graph-capturable)."""
    tokens = torch.arange(num_tokens, device=cu_num_tokens.device, dtype=cu_num_tokens.dtype)
    return torch.searchsorted(cu_num_tokens, tokens, right=True)


def apply_sampling_constraints(
    logits: torch.Tensor, cu_num_draft_tokens: torch.Tensor, sampling_metadata: SamplingMetadata
) -> torch.Tensor:
    """Divide each token's logits by its request's temperature, in place (greedy rows, with a temperature
    below ``SAMPLING_EPS``, divide by 1)."""
    if sampling_metadata.all_greedy:
        return logits
    temperature = torch.where(sampling_metadata.is_greedy, 1.0, sampling_metadata.temperature)
    temperature = expand_batch_to_tokens(temperature, cu_num_draft_tokens, logits.shape[0])
    return logits.div_(temperature.unsqueeze(-1))


def generate_uniform_probs(
    num_tokens: int, num_draft_tokens: list[int], generators: dict[int, torch.Generator], device
) -> torch.Tensor:
    """One U[0,1) float64 per draft token (float32 would return exactly 0.0 too often).

    Everything is drawn from the global generator, then each seeded request's slice is redrawn with its
    own generator, in batch order, so a seeded request's numbers do not depend on the rest of the batch.
    A request with no drafts consumes nothing from its generator.
    """
    uniform_probs = torch.rand(num_tokens, dtype=torch.float64, device=device)
    start = 0
    for i, k in enumerate(num_draft_tokens):
        if k > 0 and i in generators:
            uniform_probs[start : start + k].uniform_(generator=generators[i])
        start += k
    return uniform_probs


def _exponential_noise(
    batch_size: int, vocab_size: int, generators: dict[int, torch.Generator], redraw: list[bool], device
) -> torch.Tensor:
    """[B, V] Exp(1) noise; rows of seeded requests with ``redraw[i]`` are redrawn from their generator."""
    noise = torch.empty((batch_size, vocab_size), dtype=torch.float32, device=device).exponential_()
    for i, gen in sorted(generators.items()):
        if redraw[i]:
            noise[i].exponential_(generator=gen)
    return noise


# The recovered-token draw runs grid (B, max_spec_len, splits); its exponential noise comes from torch,
# keyed by the requests' generators, as does the bonus token.
if HAS_TRITON:

    @triton.jit
    def sample_recovered_tokens_kernel(
        output_ptr,  # [T] int32
        split_best_ptr,  # [T, num_splits] int64 (ignored when num_splits == 1)
        cu_num_draft_tokens_ptr,  # [B] int32, inclusive
        draft_token_ids_ptr,  # [T] int32
        draft_probs_ptr,  # [T, V] float32 (ignored when NO_DRAFT_PROBS)
        target_probs_ptr,  # [T, V] float32
        noise_ptr,  # [B, V] float32, Exp(1)
        vocab_size,
        split_size,  # columns per split, a multiple of BLOCK
        num_splits,
        BLOCK: tl.constexpr,
        NO_DRAFT_PROBS: tl.constexpr,
    ):
        """Grid (B, max_spec_len, num_splits): program (i, j, s) scores columns ``[s * split_size, (s + 1) *
        split_size)`` of request i's j-th recovered token (if it has one), ``residual[v] * (1 / E_i[v])``, in
        one pass. Each lane keeps the best score it has seen and its column (a strictly greater score
        replaces it, so each lane keeps its first maximum); the lanes are reduced once at the end, to the
        lowest column among the best: torch's argmax. The reciprocal is an IEEE division and nothing is
        fused, so the token is the torch twin's bit for bit. With one split the program stores the token;
        with several it stores its best as one int64 key (the score's bits, then the column reversed, so the
        largest key is the best score's lowest column) and ``_recovered_tokens_reduce_kernel`` picks.
        """
        req_idx = tl.program_id(0)
        pos = tl.program_id(1)
        split = tl.program_id(2)
        start = tl.load(cu_num_draft_tokens_ptr + req_idx - 1, mask=req_idx > 0, other=0)
        num_draft = tl.load(cu_num_draft_tokens_ptr + req_idx) - start
        if pos < num_draft:
            token_idx = (start + pos).to(tl.int64)
            draft = tl.load(draft_token_ids_ptr + token_idx)
            row = token_idx * vocab_size
            noise_row = req_idx.to(tl.int64) * vocab_size
            first = split * split_size
            best = tl.full([BLOCK], -1.0, tl.float32)  # every score is >= 0
            best_col = tl.zeros([BLOCK], dtype=tl.int32)
            for offset in range(0, split_size, BLOCK):
                cols = first + offset + tl.arange(0, BLOCK)
                inside = cols < vocab_size
                p = tl.load(target_probs_ptr + row + cols, mask=inside, other=0.0)
                if NO_DRAFT_PROBS:
                    residual = tl.where(cols == draft, 0.0, p)  # a -1 draft matches no column
                else:
                    q = tl.load(draft_probs_ptr + row + cols, mask=inside, other=0.0)
                    residual = tl.maximum(p - q, 0.0)
                e = tl.load(noise_ptr + noise_row + cols, mask=inside, other=1.0)
                score = tl.where(inside, residual * tl.math.div_rn(1.0, e), -1.0)
                better = score > best
                best = tl.where(better, score, best)
                best_col = tl.where(better, cols, best_col)
            top = tl.max(best, axis=0)
            col = tl.min(tl.where(best == top, best_col, vocab_size), axis=0)
            if num_splits == 1:
                tl.store(output_ptr + token_idx, col)
            else:  # top >= 0 (each split holds a column), so its bits sort as the float does
                key = top.to(tl.int32, bitcast=True).to(tl.int64) * 4294967296 + (2147483647 - col)
                tl.store(split_best_ptr + token_idx * num_splits + split, key)

    @triton.jit
    def _recovered_tokens_reduce_kernel(output_ptr, split_best_ptr, num_splits, SPLITS: tl.constexpr):
        """Grid (T,): each token's largest split key gives its recovered token."""
        token_idx = tl.program_id(0).to(tl.int64)
        s = tl.arange(0, SPLITS)
        keys = tl.load(split_best_ptr + token_idx * num_splits + s, mask=s < num_splits, other=-1)
        tl.store(output_ptr + token_idx, (2147483647 - (tl.max(keys, axis=0) & 0xFFFFFFFF)).to(tl.int32))

else:  # no triton: the dispatcher below always takes the torch reference
    sample_recovered_tokens_kernel = None
    _recovered_tokens_reduce_kernel = None


def sample_recovered_tokens(
    max_spec_len: int,
    num_draft_tokens: list[int],
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    sampling_metadata: SamplingMetadata,
    device,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """For each draft token, a sample from the residual distribution used if that draft is rejected.

    Residual: ``max(p - q, 0)`` with draft probabilities, or ``p`` with the draft token's entry zeroed
    without them (a -1 draft zeroes nothing, so its slot gets a sample from the full target; with them, as
    in vLLM, a slot nothing was drafted for should carry an all-zero q row to sample p itself). Sampled by
    the exponential race: with one Exp(1) vector E per request, ``argmax_v residual[v] / E[v]`` is
    distributed proportionally to the residual, no normalisation needed. The noise comes from torch (the
    request's generator, or the global one), so that a seed gives the same tokens on every backend; the
    rest is ``sample_recovered_tokens_kernel`` (one pass over p, q and E, no [T, V] temporaries) or, with
    ``backend="torch"``, its torch twin ``sample_recovered_tokens_ref``. Returns [num_draft_total] int32.
    """
    num_tokens, vocab_size = target_probs.shape
    noise = _exponential_noise(
        len(num_draft_tokens),
        vocab_size,
        sampling_metadata.generators,
        [k > 0 for k in num_draft_tokens],
        device,
    )
    if not _use_triton(backend, target_probs.device):
        return sample_recovered_tokens_ref(
            cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, noise
        )
    out = torch.empty(num_tokens, dtype=torch.int32, device=target_probs.device)
    if num_tokens == 0:
        return out
    block, splits = recovered_launch(len(num_draft_tokens) * max_spec_len, vocab_size)
    split_size = triton.cdiv(triton.cdiv(vocab_size, splits), block) * block
    splits = triton.cdiv(vocab_size, split_size)  # every split holds at least one column
    split_best = out if splits == 1 else torch.empty(
        (num_tokens, splits), dtype=torch.int64, device=target_probs.device)
    target_probs = target_probs.to(torch.float32).contiguous()
    sample_recovered_tokens_kernel[(len(num_draft_tokens), max_spec_len, splits)](
        out,
        split_best,
        cu_num_draft_tokens.to(torch.int32).contiguous(),
        draft_token_ids.to(torch.int32).contiguous(),
        draft_probs.to(torch.float32).contiguous() if draft_probs is not None else target_probs,
        target_probs,
        noise,
        vocab_size,
        split_size,
        splits,
        BLOCK=block,
        NO_DRAFT_PROBS=draft_probs is None,
        num_warps=8,
    )
    if splits > 1:
        _recovered_tokens_reduce_kernel[(num_tokens,)](
            out, split_best, splits, SPLITS=triton.next_power_of_2(splits))
    return out


#: Programs a recovered-token draw aims for: with fewer draft tokens than this, each token's row is split
#: over several programs, so that a batch of a few requests still keeps the GPU's SMs busy.
RECOVERED_PROGRAMS = 1024
#: Most programs one token's row is split over.
MAX_RECOVERED_SPLITS = 64


def recovered_launch(num_programs: int, vocab_size: int) -> tuple[int, int]:
    """``(BLOCK, splits per token)`` for ``sample_recovered_tokens_kernel`` at ``num_programs`` = B x
    max_spec_len. On a GPU, a tile of 2,048 and as many splits (a power of 2, at most 64) as bring the
    grid to about ``RECOVERED_PROGRAMS``; vLLM's kernel runs one program per token, which at B = 1 leaves
    all but one SM idle. Under the interpreter, whose cost is per program, one tile per row and no split."""
    if runtime.INTERPRET:
        return min(triton.next_power_of_2(vocab_size), 1 << 16), 1
    block = 2048
    if num_programs >= RECOVERED_PROGRAMS:
        return block, 1
    wanted = triton.next_power_of_2(triton.cdiv(RECOVERED_PROGRAMS, num_programs))
    return block, max(1, min(wanted, MAX_RECOVERED_SPLITS, triton.cdiv(vocab_size, block)))


def sample_recovered_tokens_ref(
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    noise: torch.Tensor,
) -> torch.Tensor:
    """Torch twin of ``sample_recovered_tokens_kernel``: ``argmax_v residual[t, v] * (1 / noise[req(t), v])``
    (the first index on ties), [num_draft_total] int32."""
    num_tokens = target_probs.shape[0]
    if draft_probs is None:
        # Zero each row's draft entry; a -1 draft writes its column 0 back unchanged.
        residual = target_probs.clone()
        column = draft_token_ids.long().clamp_min(0).unsqueeze(-1)
        kept = residual.gather(1, column) * (draft_token_ids < 0).unsqueeze(-1)
        residual.scatter_(1, column, kept)
    else:
        residual = (target_probs - draft_probs).clamp_min_(0)
    inv_noise = 1.0 / noise
    token_to_req = _token_to_request(cu_num_draft_tokens, num_tokens)
    return (residual * inv_noise[token_to_req]).argmax(dim=-1).to(torch.int32)


def _sample_bonus_tokens(logits: torch.Tensor, sampling_metadata: SamplingMetadata) -> torch.Tensor:
    """[B] int32: argmax for greedy requests, a draw from softmax(logits / T) for random ones."""
    argmax = logits.argmax(dim=-1)
    if sampling_metadata.all_greedy:
        return argmax.to(torch.int32)
    temperature = torch.where(sampling_metadata.is_greedy, 1.0, sampling_metadata.temperature)
    probs = torch.softmax(logits / temperature.unsqueeze(-1), dim=-1)
    noise = _exponential_noise(
        logits.shape[0],
        logits.shape[1],
        sampling_metadata.generators,
        [True] * logits.shape[0],
        logits.device,
    )
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(sampling_metadata.is_greedy, argmax, sampled).to(torch.int32)


# ----------------------------------------------------------------------------------------------------
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
    """Verify every request's drafts; return ``[B, max_spec_len + 1]`` int32 filled with
    ``PLACEHOLDER_TOKEN_ID``, as in vLLM: row i holds ``a_i + 1`` tokens in columns ``0..a_i`` (``a_i``
    accepted drafts, then the recovered token, or the bonus token in column ``k_i`` when all ``k_i``
    drafts are accepted).

    ``target_logits`` [num_draft_total, V] must already be temperature-scaled; ``draft_probs`` None means
    a one-hot draft distribution (q = 1). Greedy requests accept a draft iff it equals the target argmax;
    random requests run the probability-ratio test with ``uniform_probs`` [T] float64 and
    ``recovered_token_ids`` [T] (generated here when None: pass your own to control the randomness).
    """
    _check_num_draft_tokens(num_draft_tokens)
    _check_logits("target_logits", target_logits)
    _check_sampling_metadata(sampling_metadata, len(num_draft_tokens), target_logits.device)
    _check_rejection_inputs(
        draft_token_ids,
        num_draft_tokens,
        max_spec_len,
        cu_num_draft_tokens,
        draft_probs,
        tuple(target_logits.shape),
        uniform_probs,
        recovered_token_ids,
        scores={"target_logits": target_logits, "draft_probs": draft_probs},
        bonus_token_ids=bonus_token_ids,
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


def _rejection_sample(
    draft_token_ids,
    num_draft_tokens,
    max_spec_len,
    cu_num_draft_tokens,
    draft_probs,
    target_logits,
    bonus_token_ids,
    sampling_metadata,
    *,
    uniform_probs=None,
    recovered_token_ids=None,
    reject_negative_drafts=True,
    backend="auto",
) -> torch.Tensor:
    """``rejection_sample`` on inputs already validated."""
    device = target_logits.device
    batch_size = len(num_draft_tokens)
    num_tokens = draft_token_ids.numel()
    # Every row is written whole (its tokens, then PLACEHOLDER_TOKEN_ID) by the greedy or the random kernel.
    output_token_ids = torch.empty((batch_size, max_spec_len + 1), dtype=torch.int32, device=device)
    is_greedy = sampling_metadata.is_greedy
    if not sampling_metadata.all_random:
        target_argmax = target_logits.argmax(dim=-1)
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
    if uniform_probs is None:
        uniform_probs = generate_uniform_probs(
            num_tokens, num_draft_tokens, sampling_metadata.generators, device
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
            device,
            backend=backend,
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


# The verification loops run one program per request looping over its drafts (grid (B,)); max_spec_len is
# a runtime argument, so one compilation serves every k.
if HAS_TRITON:

    @triton.jit
    def _fill_row_tail(row_ptr, last, max_spec_len, ROW: tl.constexpr):
        """PLACEHOLDER_TOKEN_ID in columns ``last + 1 .. max_spec_len`` of one output row: with every row
        written whole, the output needs no fill kernel before the verification kernels."""
        cols = tl.arange(0, ROW)
        tl.store(row_ptr + cols, tl.full([ROW], -1, tl.int32), mask=(cols > last) & (cols <= max_spec_len))

    @triton.jit(do_not_specialize=["max_spec_len"])
    def rejection_greedy_sample_kernel(
        output_token_ids_ptr,  # [B, max_spec_len + 1] int32
        cu_num_draft_tokens_ptr,  # [B] int32, inclusive
        draft_token_ids_ptr,  # [T] int32
        target_argmax_ptr,  # [T] int32 or int64
        bonus_token_ids_ptr,  # [B] int32
        is_greedy_ptr,  # [B] bool (ignored unless HAS_IS_GREEDY)
        max_spec_len,  # a runtime int: one compilation serves every k
        HAS_IS_GREEDY: tl.constexpr,
        ROW: tl.constexpr,  # a power of 2 >= max_spec_len + 1
    ):
        """Emit the target argmax at each position until a draft differs from it; bonus if none does;
        PLACEHOLDER_TOKEN_ID in the rest of the row. A -1 draft never equals an argmax, so it is always
        rejected."""
        req_idx = tl.program_id(0)
        active = True
        if HAS_IS_GREEDY:
            active = tl.load(is_greedy_ptr + req_idx)
        if active:
            start = tl.load(cu_num_draft_tokens_ptr + req_idx - 1, mask=req_idx > 0, other=0)
            num_draft = tl.load(cu_num_draft_tokens_ptr + req_idx) - start
            row_ptr = output_token_ids_ptr + req_idx * (max_spec_len + 1)
            rejected = False
            last = num_draft  # the row's last token: the bonus, or the first rejection's
            # Loop to the static bound, not to the loaded count: triton 3.6's interpreter cannot take a
            # loaded scalar as a range() bound (it is a 1-element array there).
            for pos in range(max_spec_len):
                if not rejected and pos < num_draft:
                    draft = tl.load(draft_token_ids_ptr + start + pos)
                    target = tl.load(target_argmax_ptr + start + pos)
                    tl.store(row_ptr + pos, target)
                    if draft != target:
                        rejected = True
                        last = pos
            if not rejected:
                tl.store(row_ptr + num_draft, tl.load(bonus_token_ids_ptr + req_idx))
            _fill_row_tail(row_ptr, last, max_spec_len, ROW)

else:  # no triton: the dispatcher below always takes the torch reference
    rejection_greedy_sample_kernel = None


def rejection_greedy_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    is_greedy: torch.Tensor | None,
    max_spec_len: int,
    *,
    backend: str = "auto",
) -> None:
    """Write the greedy rows of ``output_token_ids`` in place, whole: their tokens, then
    ``PLACEHOLDER_TOKEN_ID`` (Triton kernel or torch reference). Other rows are left as they are."""
    if not _use_triton(backend, output_token_ids.device):
        rejection_greedy_sample_ref(
            output_token_ids,
            cu_num_draft_tokens,
            draft_token_ids,
            target_argmax,
            bonus_token_ids,
            is_greedy,
            max_spec_len,
        )
        return
    _check_row_block(max_spec_len)
    batch_size = output_token_ids.shape[0]
    rejection_greedy_sample_kernel[(batch_size,)](
        output_token_ids,
        cu_num_draft_tokens.to(torch.int32).contiguous(),
        draft_token_ids.to(torch.int32).contiguous(),
        target_argmax.contiguous(),  # argmax's int64 as it comes: a conversion would cost a launch
        bonus_token_ids.to(torch.int32).contiguous(),
        is_greedy if is_greedy is not None else output_token_ids,  # dummy pointer when every row is greedy
        max_spec_len,
        HAS_IS_GREEDY=is_greedy is not None,
        ROW=_ROW_BLOCK,
    )


def _check_row_block(max_spec_len: int) -> None:
    if not 0 <= max_spec_len < _ROW_BLOCK:
        raise ValueError(f"max_spec_len must lie in [0, {_ROW_BLOCK}) for the kernels, got {max_spec_len}")


if HAS_TRITON:

    @triton.jit(do_not_specialize=["max_spec_len"])
    def rejection_random_sample_kernel(
        output_token_ids_ptr,  # [B, max_spec_len + 1] int32
        cu_num_draft_tokens_ptr,  # [B] int32, inclusive
        draft_token_ids_ptr,  # [T] int32
        draft_probs_ptr,  # [T, V] float32 (ignored when NO_DRAFT_PROBS)
        target_probs_ptr,  # [T, V] float32
        bonus_token_ids_ptr,  # [B] int32
        recovered_token_ids_ptr,  # [T] int32
        uniform_probs_ptr,  # [T] float64
        is_greedy_ptr,  # [B] bool (ignored unless HAS_IS_GREEDY)
        max_spec_len,  # a runtime int: one compilation serves every k
        vocab_size,
        NO_DRAFT_PROBS: tl.constexpr,
        HAS_IS_GREEDY: tl.constexpr,
        REJECT_NEGATIVE_DRAFTS: tl.constexpr,
        ROW: tl.constexpr,  # a power of 2 >= max_spec_len + 1
    ):
        """Accept draft d iff q(d) > 0 and p(d) / q(d) >= u (q = 1 without draft probs); at the first
        rejection emit the recovered token and stop; bonus if nothing was rejected; PLACEHOLDER_TOKEN_ID in
        the rest of the row.

        REJECT_NEGATIVE_DRAFTS (vLLM PR #46533) rejects d < 0 without loading either probability, as
        vLLM's kernel does (a masked load reads no memory). Without it, as before the fix, d = -1 is used
        as a column: the flat offset ``t * V - 1`` reads the previous row's last probability, so the
        placeholder is accepted when that value beats u, and -1 is emitted as a token. For the batch's
        first draft the offset is -1: on the GPU the old kernel read memory just before the tensor
        (undefined); here that read is masked off and the draft is rejected.
        """
        req_idx = tl.program_id(0)
        active = True
        if HAS_IS_GREEDY:
            active = tl.load(is_greedy_ptr + req_idx) == 0
        if active:
            start = tl.load(cu_num_draft_tokens_ptr + req_idx - 1, mask=req_idx > 0, other=0)
            num_draft = tl.load(cu_num_draft_tokens_ptr + req_idx) - start
            row_ptr = output_token_ids_ptr + req_idx * (max_spec_len + 1)
            rejected = False
            last = num_draft  # the row's last token: the bonus, or the first rejection's
            # Loop to the static bound, not to the loaded count: triton 3.6's interpreter cannot take a
            # loaded scalar as a range() bound (it is a 1-element array there).
            for pos in range(max_spec_len):
                if not rejected and pos < num_draft:
                    token_idx = (start + pos).to(tl.int64)
                    draft = tl.load(draft_token_ids_ptr + token_idx)
                    u = tl.load(uniform_probs_ptr + token_idx)
                    flat = token_idx * vocab_size + draft
                    # Both probability loads are masked off (no memory is read) where `readable` is False,
                    # and such a draft is never accepted.
                    if REJECT_NEGATIVE_DRAFTS:  # [fix]
                        readable = draft >= 0  # [fix]
                    else:  # [no fix]
                        readable = flat >= 0  # [no fix]
                    p = tl.load(target_probs_ptr + flat, mask=readable, other=0.0)
                    if NO_DRAFT_PROBS:
                        accepted = readable & (p.to(tl.float64) >= u)
                    else:
                        q = tl.load(draft_probs_ptr + flat, mask=readable, other=0.0)
                        # div_rn: IEEE division like torch's (Triton's `/` is approximate on NVIDIA GPUs).
                        ratio = tl.math.div_rn(p, tl.where(q > 0, q, 1.0))
                        accepted = readable & (q > 0) & (ratio.to(tl.float64) >= u)
                    if accepted:
                        token = draft
                    else:
                        rejected = True
                        last = pos
                        token = tl.load(recovered_token_ids_ptr + token_idx)
                    tl.store(row_ptr + pos, token)
            if not rejected:
                tl.store(row_ptr + num_draft, tl.load(bonus_token_ids_ptr + req_idx))
            _fill_row_tail(row_ptr, last, max_spec_len, ROW)

else:  # no triton: the dispatcher below always takes the torch reference
    rejection_random_sample_kernel = None


def rejection_random_sample(
    output_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    recovered_token_ids: torch.Tensor,
    uniform_probs: torch.Tensor,
    is_greedy: torch.Tensor | None,
    max_spec_len: int,
    *,
    reject_negative_drafts: bool = True,
    backend: str = "auto",
) -> None:
    """Write the random rows of ``output_token_ids`` in place, whole: their tokens, then
    ``PLACEHOLDER_TOKEN_ID`` (Triton kernel or torch reference). Other rows are left as they are
    (``is_greedy`` None: every row is random).

    Draft d at flat token t is accepted iff ``q > 0 and p / q >= u`` with ``p = target_probs[t, d]``,
    ``q = draft_probs[t, d]`` (1 if None) and ``u = uniform_probs[t]``; a rejection emits
    ``recovered_token_ids[t]`` and ends the row. Like vLLM's kernels, this core does not validate its
    inputs; ``rejection_sample`` does."""
    if not _use_triton(backend, output_token_ids.device):
        rejection_random_sample_ref(
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
        )
        return
    _check_row_block(max_spec_len)
    batch_size = output_token_ids.shape[0]
    target_probs = target_probs.to(torch.float32).contiguous()
    rejection_random_sample_kernel[(batch_size,)](
        output_token_ids,
        cu_num_draft_tokens.to(torch.int32).contiguous(),
        draft_token_ids.to(torch.int32).contiguous(),
        draft_probs.to(torch.float32).contiguous() if draft_probs is not None else target_probs,
        target_probs,
        bonus_token_ids.to(torch.int32).contiguous(),
        recovered_token_ids.to(torch.int32).contiguous(),
        uniform_probs.contiguous(),
        is_greedy if is_greedy is not None else output_token_ids,
        max_spec_len,
        target_probs.shape[1],
        NO_DRAFT_PROBS=draft_probs is None,
        HAS_IS_GREEDY=is_greedy is not None,
        REJECT_NEGATIVE_DRAFTS=reject_negative_drafts,
        ROW=_ROW_BLOCK,
    )


# ----------------------------------------------------------------------------------------------------
# Torch references: vectorised restatements of the kernels, tied to them bit for bit by the tests.


def _token_layout(cu_num_draft_tokens: torch.Tensor, num_tokens: int):
    """For each flat draft token: its request, its position in the request; and each request's k."""
    cu = cu_num_draft_tokens.long()
    num_draft = torch.diff(cu, prepend=cu.new_zeros(1))
    req = torch.repeat_interleave(
        torch.arange(cu.numel(), device=cu.device), num_draft, output_size=num_tokens
    )
    pos = torch.arange(num_tokens, device=cu.device) - (cu - num_draft)[req]
    return req, pos, num_draft


def _write_prefix(
    output_token_ids, req, pos, num_draft, accepted, emitted, bonus_token_ids, active_rows
) -> None:
    """Write each active request's tokens up to and including its first rejection, then the bonus."""
    rejected = (~accepted).long()
    before = torch.cumsum(rejected, 0) - rejected  # rejections before each token, across the batch
    start_of_token = torch.arange(req.numel(), device=req.device) - pos
    before_in_req = before - before[start_of_token]  # ... within its own request
    write = (before_in_req == 0) & active_rows[req]
    output_token_ids[req[write], pos[write]] = emitted[write].to(output_token_ids.dtype)
    rejections_in_req = torch.zeros_like(num_draft).index_add_(0, req, rejected)
    bonus_rows = torch.nonzero(active_rows & (rejections_in_req == 0)).flatten()
    output_token_ids[bonus_rows, num_draft[bonus_rows]] = bonus_token_ids[bonus_rows].to(
        output_token_ids.dtype
    )


def _active_rows(is_greedy: torch.Tensor | None, batch_size: int, greedy: bool, device) -> torch.Tensor:
    if is_greedy is None:  # the caller runs only the path every row takes
        return torch.ones(batch_size, dtype=torch.bool, device=device)
    return is_greedy.bool() if greedy else ~is_greedy.bool()


def rejection_greedy_sample_ref(
    output_token_ids,
    cu_num_draft_tokens,
    draft_token_ids,
    target_argmax,
    bonus_token_ids,
    is_greedy,
    max_spec_len,
) -> None:
    """Torch twin of ``rejection_greedy_sample_kernel``: emit the argmax at every position up to the
    first draft that differs from it; bonus if none differs. ``is_greedy`` None = every row greedy."""
    req, pos, num_draft = _token_layout(cu_num_draft_tokens, draft_token_ids.numel())
    accepted = draft_token_ids.long() == target_argmax.long()
    active = _active_rows(is_greedy, output_token_ids.shape[0], True, output_token_ids.device)
    output_token_ids.masked_fill_(active.unsqueeze(1), PLACEHOLDER_TOKEN_ID)
    _write_prefix(output_token_ids, req, pos, num_draft, accepted, target_argmax, bonus_token_ids, active)


def _gather_flat(table: torch.Tensor, flat: torch.Tensor, readable: torch.Tensor) -> torch.Tensor:
    """``table.flatten()[flat]`` where ``readable``, 0.0 elsewhere (a load the kernel masks off)."""
    values = table.reshape(-1)[torch.where(readable, flat, 0)]
    return torch.where(readable, values, torch.zeros_like(values))


def rejection_random_sample_ref(
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
    *,
    reject_negative_drafts=True,
) -> None:
    """Torch twin of ``rejection_random_sample_kernel`` (see there for the ``-1`` behaviour when
    ``reject_negative_drafts`` is False). ``is_greedy`` None = every row random."""
    num_tokens, vocab_size = target_probs.shape
    req, pos, num_draft = _token_layout(cu_num_draft_tokens, num_tokens)
    draft = draft_token_ids.long()
    flat = torch.arange(num_tokens, device=draft.device) * vocab_size + draft
    readable = draft >= 0 if reject_negative_drafts else flat >= 0
    p = _gather_flat(target_probs.float().contiguous(), flat, readable)
    if draft_probs is None:
        accepted = readable & (p.double() >= uniform_probs)
    else:
        q = _gather_flat(draft_probs.float().contiguous(), flat, readable)
        ratio = p / torch.where(q > 0, q, torch.ones_like(q))
        accepted = readable & (q > 0) & (ratio.double() >= uniform_probs)
    emitted = torch.where(accepted, draft, recovered_token_ids.long())
    active = _active_rows(is_greedy, output_token_ids.shape[0], False, output_token_ids.device)
    output_token_ids.masked_fill_(active.unsqueeze(1), PLACEHOLDER_TOKEN_ID)
    _write_prefix(output_token_ids, req, pos, num_draft, accepted, emitted, bonus_token_ids, active)
