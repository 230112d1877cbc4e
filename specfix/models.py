"""The tiny target and draft models, built in closed form from the fables (no training, no download).

They stand in for vLLM's models: their first operation is an ``nn.Embedding`` lookup of the flat
``input_ids``, exactly where a ``-1`` placeholder hurts (IndexError on CPU, a device-side assert on CUDA).

    target, draft = load_models("cpu")
    logits = target(input_ids, positions, slot_mapping, kv_cache)  # [N, V] log-probabilities

Read :class:`NgramLM` first: the comment above it says how the tables are built and laid out.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from specfix.checks import check_count, check_id_tensor
from specfix.tokenizer import corpus_text, get_tokenizer

#: vLLM's marker for a padded row of ``slot_mapping``: no KV-cache write.
PAD_SLOT_ID = -1
#: Pull of each context order towards the order below when the context was seen rarely.
ALPHA = 0.1
#: Pull of the bigram towards the unigram.
BETA = 0.05
TARGET_ORDER = 4
DRAFT_ORDER = 3


def _context_keys(ids: np.ndarray, m: int, vocab_size: int) -> np.ndarray:
    """Key of the m tokens ending at each position i >= m - 1: sum_j ids[i - j] * V**j."""
    keys = np.zeros(len(ids) - m + 1, dtype=np.int64)
    for j in range(m):
        keys += ids[m - 1 - j : len(ids) - j].astype(np.int64) * vocab_size**j
    return keys


def _count_tables(ids: np.ndarray, vocab_size: int, order: int):
    """Smoothed bigram [V, V], and for each longer context length m the seen keys and next-token counts."""
    unigram = np.bincount(ids, minlength=vocab_size) + 1.0
    unigram /= unigram.sum()
    bigram = np.zeros((vocab_size, vocab_size))
    np.add.at(bigram, (ids[:-1], ids[1:]), 1.0)
    bigram = (bigram + BETA * unigram) / (bigram.sum(1, keepdims=True) + BETA)
    tables = []
    for m in range(2, order):
        keys = _context_keys(ids[:-1], m, vocab_size)
        uniq, rows = np.unique(keys, return_inverse=True)
        counts = np.zeros((len(uniq) + 1, vocab_size))  # last row: an unseen context, no counts
        np.add.at(counts, (rows, ids[m:]), 1.0)
        tables.append((uniq, counts))
    return bigram, tables


# N-gram models, each order smoothed towards the one below (add-``ALPHA``); the bigram table *is* the
# embedding. The target is a 4-gram, the draft a 3-gram: one token less context, so it often agrees.
# Both use vLLM's flat token layout; the "KV cache" holds each position's token id, addressed through
# ``slot_mapping``, and ``PAD_SLOT_ID`` rows (CUDA-graph padding) write nothing and see no context.
class NgramLM(nn.Module):
    """P(next | last ``order - 1`` tokens); a token's context sits at slots ``slot - 1, slot - 2`` and
    ``kv_cache``'s last entry is padded rows' scratch slot (:meth:`make_kv_cache`)."""

    def __init__(self, bigram: np.ndarray, tables: list[tuple[np.ndarray, np.ndarray]]):
        super().__init__()
        self.vocab_size = bigram.shape[0]
        self.order = len(tables) + 2
        self.embed_tokens = nn.Embedding(self.vocab_size, self.vocab_size)
        with torch.no_grad():
            self.embed_tokens.weight.copy_(torch.from_numpy(bigram))
        self.context_counts = nn.ModuleList()
        for m, (keys, counts) in enumerate(tables, start=2):
            table = nn.Embedding(counts.shape[0], self.vocab_size)
            with torch.no_grad():
                table.weight.copy_(torch.from_numpy(counts))
            self.context_counts.append(table)
            self.register_buffer(f"keys_{m}", torch.from_numpy(keys))
            self.register_buffer(f"totals_{m}", torch.from_numpy(counts.sum(1)).float())
        self.requires_grad_(False)

    @staticmethod
    def make_kv_cache(num_slots: int, device: torch.device | str) -> torch.Tensor:
        """A token-id cache with ``num_slots`` slots plus the scratch slot."""
        return torch.zeros(num_slots + 1, dtype=torch.int64, device=device)

    def forward(self, input_ids, positions, slot_mapping, kv_cache):
        # The first operation, as in every vLLM model: embed the flat input_ids. A -1 fails right here.
        probs = self.embed_tokens(input_ids)
        scratch = kv_cache.numel() - 1
        written = slot_mapping >= 0
        kv_cache[torch.where(written, slot_mapping, scratch)] = input_ids.long()
        keys = input_ids.long()
        for m, table in enumerate(self.context_counts, start=2):
            has_context = written & (positions >= m - 1)
            earlier = kv_cache[torch.where(has_context, slot_mapping - (m - 1), scratch)]
            keys = keys + earlier * self.vocab_size ** (m - 1)
            seen_keys = getattr(self, f"keys_{m}")
            row = torch.searchsorted(seen_keys, keys).clamp(max=seen_keys.numel() - 1)
            row = torch.where(has_context & (seen_keys[row] == keys), row, table.num_embeddings - 1)
            totals = getattr(self, f"totals_{m}")[row]
            probs = (table(row) + ALPHA * probs) / (totals + ALPHA)[:, None]
        return probs.log()

    @torch.no_grad()
    def next_token_logits(self, context_ids: torch.Tensor) -> torch.Tensor:
        """[B, V] logits of the token after each row of ``context_ids`` [B, L] (its last tokens count)."""
        if not isinstance(context_ids, torch.Tensor) or context_ids.dim() != 2 or context_ids.shape[1] < 1:
            raise ValueError("context_ids must be a [B, L] tensor with L >= 1")
        check_id_tensor("context_ids", context_ids.flatten())
        batch, length = context_ids.shape
        width = min(length, self.order - 1)
        device = self.embed_tokens.weight.device
        ids = context_ids[:, length - width :].to(device).flatten()
        positions = torch.arange(width, device=device).repeat(batch)
        slots = torch.arange(batch * width, device=device)
        logits = self(ids, positions, slots, self.make_kv_cache(batch * width, device))
        return logits[width - 1 :: width]

    @torch.no_grad()
    def score(self, token_ids) -> torch.Tensor:
        """[L, V] logits after every token of one sequence, from scratch (a plain, cache-free reference)."""
        device = self.embed_tokens.weight.device
        ids = torch.as_tensor(token_ids, device=device)
        if ids.numel() == 0:
            raise ValueError("token_ids is empty: score needs at least one token")
        check_id_tensor("token_ids", ids)
        if bool(((ids < 0) | (ids >= self.vocab_size)).any()):
            raise ValueError(f"token_ids must lie in [0, vocab_size={self.vocab_size}), got {ids.tolist()}")
        positions = torch.arange(ids.numel(), device=device)
        return self(ids, positions, positions.clone(), self.make_kv_cache(ids.numel(), device))


@functools.lru_cache(maxsize=4)
def _tables(order: int):
    tok = get_tokenizer()
    ids = np.asarray(tok.encode(corpus_text()), dtype=np.int64)
    return _count_tables(ids, tok.vocab_size, order)


@torch.no_grad()
def build_model(order: int, device: torch.device | str = "cpu") -> NgramLM:
    """An n-gram model of the fables (order >= 2) on ``device``, in eval mode."""
    check_count("order", order, low=2)
    return NgramLM(*_tables(order)).to(device).eval()


def load_models(device: torch.device | str = "cpu") -> tuple[NgramLM, NgramLM]:
    """Fresh (target, draft): a 4-gram and a 3-gram model of the fables, deterministic, in well under 1 s."""
    return build_model(TARGET_ORDER, device), build_model(DRAFT_ORDER, device)
