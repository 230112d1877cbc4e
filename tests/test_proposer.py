"""The drafters: n-gram prompt lookup by hand, the draft model's greedy drafts, and bad histories refused."""

import numpy as np
import pytest
import torch

from specfix.models import load_models
from specfix.v1.proposer import DraftModelProposer, NgramProposer

TARGET, DRAFT = load_models("cpu")


def test_ngram_lookup_by_hand():
    ngram = NgramProposer(3)
    # the last two tokens (7, 8) occurred before, followed by 9, 1, 7
    assert ngram.propose([5, 7, 8, 9, 1, 7, 8]) == [9, 1, 7]
    assert ngram.propose(np.array([4, 5, 6], dtype=np.int32)) == []  # no earlier occurrence: no drafts
    assert ngram.propose([3]) == []


def test_draft_model_proposes_k_greedy_tokens():
    drafter = DraftModelProposer(DRAFT, 2)
    history = [4, 0, 17, 30]
    first = int(DRAFT.score(history)[-1].argmax())
    drafts = drafter.propose_batch([history, torch.tensor([4, 0])])
    assert [len(d) for d in drafts] == [2, 2] and drafts[0][0] == first
    assert drafts[0][1] == int(DRAFT.score([*history, first])[-1].argmax())


@pytest.mark.parametrize("history, error, word", [
    ([5, -1, 7], ValueError, "committed tokens are never placeholders"),
    ("abc", TypeError, "token_ids must be a sequence of token ids, got str"),
    ([1.0, 2.0], TypeError, "int token ids, got dtype float64"),
    ([[1, 2]], TypeError, r"1-D sequence .* shape \(1, 2\)"),
])  # fmt: skip
def test_bad_histories_are_refused_by_name(history, error, word):
    with pytest.raises(error, match=word):
        NgramProposer(3).propose(history)
    with pytest.raises(error, match=word.replace("token_ids", r"token_ids\[0\]")):
        DraftModelProposer(DRAFT, 3).propose_batch([history])


def test_draft_model_refuses_out_of_vocabulary_and_empty_histories():
    drafter = DraftModelProposer(DRAFT, 3)
    with pytest.raises(ValueError, match=r"token_ids\[1\] must be a non-empty history of ids in \[0, vocab"):
        drafter.propose_batch([[1, 2], [3, DRAFT.vocab_size]])
    with pytest.raises(ValueError, match=r"token_ids\[0\] must be a non-empty history"):
        drafter.propose_batch([[]])


def test_bad_settings_are_refused():
    with pytest.raises(TypeError, match="prompt_lookup_min must be an int, got 1.5"):
        NgramProposer(3, 1.5, 3)
    with pytest.raises(ValueError, match="need 1 <= prompt_lookup_min <= prompt_lookup_max"):
        NgramProposer(3, 3, 2)
    with pytest.raises(TypeError, match="draft_model must be a specfix.models.NgramLM, got str"):
        DraftModelProposer("draft", 3)
