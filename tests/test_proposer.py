"""The drafters: n-gram prompt lookup by hand, the draft model's greedy drafts, and bad settings refused."""

import ast
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from specfix.models import load_models
from specfix.v1.proposer import DraftModelProposer, NgramProposer

TARGET, DRAFT = load_models("cpu")
ROOT = Path(__file__).resolve().parents[1]


def test_ngram_lookup_by_hand():
    ngram = NgramProposer(3, 1, 3)
    # the last two tokens (7, 8) occurred before, followed by 9, 1, 7; [4, 5, 6] and [3] have no earlier
    # occurrence, so no drafts
    histories = [[5, 7, 8, 9, 1, 7, 8], np.array([4, 5, 6], dtype=np.int32), [3]]
    assert ngram.propose_batch(histories) == [[9, 1, 7], [], []]


def test_ngram_takes_the_longest_match_and_its_earliest_occurrence():
    ngram = NgramProposer(2, 1, 3)
    # (7, 8) occurs at 0 (then 1, 2) and at 4 (then 3, 4); vLLM takes the earliest: 1, 2
    # and a longer match wins over an earlier shorter one: (5, 7, 8) at 5 is followed by 6
    histories = [[7, 8, 1, 2, 7, 8, 3, 4, 7, 8], [7, 8, 0, 0, 0, 5, 7, 8, 6, 5, 7, 8]]
    assert ngram.propose_batch(histories) == [[1, 2], [6, 5]]


def test_ngram_defaults_are_vllms_and_max_model_len_caps_the_drafts():
    assert (NgramProposer(3).prompt_lookup_min, NgramProposer(3).prompt_lookup_max) == (5, 5)
    history = [1, 2, 3, 4, 5, 9, 8, 1, 2, 3, 4, 5]
    no_earlier_5_gram = history[5:]
    assert NgramProposer(3).propose_batch([history, no_earlier_5_gram]) == [[9, 8, 1], []]
    assert NgramProposer(3, max_model_len=14).propose_batch([history]) == [[9, 8]]  # 12 tokens + 2 drafts
    assert NgramProposer(3, max_model_len=12).propose_batch([history]) == [[]]


def _vllm_ngram(version: str):
    """vLLM's own ``_find_longest_matched_ngram_and_propose_tokens`` read from .peer/src/, numba's jit
    replaced by the identity (the function is plain Python over numpy); None without the source."""
    path = ROOT / ".peer/src" / version / "vllm/v1/spec_decode/ngram_proposer.py"
    if not path.exists():
        return None
    tree = ast.parse(path.read_text())
    fn = next(
        n
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name == "_find_longest_matched_ngram_and_propose_tokens"
    )
    fn.decorator_list = []
    scope = {"np": np}
    exec(compile(ast.Module([fn], []), str(path), "exec"), scope)
    return scope[fn.name]


def test_ngram_matches_vllm_0_33_on_random_histories():
    vllm = _vllm_ngram("0.33.0")
    if vllm is None:
        why = "needs vLLM 0.33.0's source in .peer/src/ (python scripts/fetch_vllm_peer.py)"
        (pytest.fail if os.environ.get("SPECFIX_REQUIRE_PEER") == "1" else pytest.skip)(why)
    rng = np.random.default_rng(0)
    for _ in range(400):
        ids = rng.integers(0, 4, size=int(rng.integers(1, 40)))
        lo = int(rng.integers(1, 4))
        hi, k, max_len = lo + int(rng.integers(0, 3)), int(rng.integers(1, 6)), int(rng.integers(1, 50))
        ours = NgramProposer(k, lo, hi, max_model_len=max_len).propose_batch([ids])[0]
        assert ours == vllm(ids, lo, hi, max_len, k).tolist(), (ids.tolist(), lo, hi, k, max_len)


def test_draft_model_proposes_k_greedy_tokens():
    drafter = DraftModelProposer(DRAFT, 2)
    history = [4, 0, 17, 30]
    first = int(DRAFT.score(history)[-1].argmax())
    drafts = drafter.propose_batch([history, torch.tensor([4, 0])])
    assert [len(d) for d in drafts] == [2, 2] and drafts[0][0] == first
    assert drafts[0][1] == int(DRAFT.score([*history, first])[-1].argmax())


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="prompt_lookup_min must be an int >= 1, got 1.5"):
        NgramProposer(3, 1.5, 3)
    with pytest.raises(ValueError, match="prompt_lookup_max must be an int >= 3, got 2"):
        NgramProposer(3, 3, 2)
    with pytest.raises(ValueError, match="max_model_len must be an int >= 1, got 0"):
        NgramProposer(3, max_model_len=0)
    with pytest.raises(TypeError, match="draft_model must be a specfix.models.NgramLM, got str"):
        DraftModelProposer("draft", 3)
