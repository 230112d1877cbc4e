"""The tokenizer and the tiny models: ids chosen on purpose, closed-form probabilities checked against an
independent count, the flat vLLM layout, and the draft/target acceptance rate at k=3."""

import math
from collections import Counter

import pytest
import torch

from specfix.lab.placeholder_lifecycle import story_prompts
from specfix.models import ALPHA, BETA, PAD_SLOT_ID, build_model, load_models
from specfix.tokenizer import Tokenizer, corpus_text, get_tokenizer, words
from specfix.v1.engine import SamplingParams, generate


@pytest.fixture(scope="module")
def models():
    return load_models("cpu")


def test_token_zero_is_the_and_the_last_id_is_the_full_stop():
    tok = get_tokenizer()
    assert tok.vocab[0] == "the" and tok.vocab[-1] == "."
    counts = Counter(words(corpus_text()))
    assert counts["the"] == max(counts.values())  # the commonest word, so the target often picks it
    assert 200 <= tok.vocab_size <= 2000
    assert len(corpus_text().encode()) < 100_000


def test_tokenizer_round_trip_and_visible_placeholders():
    tok = get_tokenizer()
    text = "The lion woke up, and the mouse ran away."
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("zebra") == [tok.unk_token_id]
    assert tok.decode([tok.encode("fox")[0], -1]) == "Fox <-1>"
    with pytest.raises(ValueError, match="duplicate"):
        Tokenizer(["a", "a", "<unk>"])


def test_models_are_deterministic():
    (t1, d1), (t2, d2) = load_models("cpu"), load_models("cpu")
    for a, b in [(t1, t2), (d1, d2)]:
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
            assert torch.equal(x, y), name
    assert (t1.order, d1.order) == (4, 3)


@pytest.mark.parametrize("bad", [-1, 512])
def test_the_first_operation_is_the_embedding_lookup(models, bad):
    target, draft = models
    calls = []
    handle = target.embed_tokens.register_forward_pre_hook(lambda mod, args: calls.append(args[0].clone()))
    ids = torch.tensor([3, bad])
    pos = torch.arange(2)
    with pytest.raises(IndexError, match="index out of range"):
        target(ids, pos, pos.clone(), target.make_kv_cache(2, "cpu"))
    handle.remove()
    assert len(calls) == 1 and torch.equal(calls[0], ids)
    with pytest.raises(IndexError, match="index out of range"):
        draft(ids, pos, pos.clone(), draft.make_kv_cache(2, "cpu"))


def _reference_prob(ids, context, nxt, order, vocab_size):
    """Recursive smoothing written out from plain counts (independent of the module's tables)."""
    unigram = Counter(ids)
    p = (unigram[nxt] + 1.0) / (len(ids) + vocab_size)
    for m in range(1, order):
        ctx = tuple(context[-m:])
        if len(ctx) < m:
            break
        follow = Counter(ids[i + m] for i in range(len(ids) - m) if tuple(ids[i : i + m]) == ctx)
        weight = BETA if m == 1 else ALPHA
        if m == 1 or follow:
            p = (follow[nxt] + weight * p) / (sum(follow.values()) + weight)
    return p


@pytest.mark.parametrize("text", ["said the fox", "the lion was", "a little mouse", "zebra the hare"])
def test_probabilities_match_an_independent_count(models, text):
    target, draft = models
    tok = get_tokenizer()
    ids = tok.encode(corpus_text())
    context = tok.encode(text)
    for model in (target, draft):
        logits = model.score(context)[-1]
        assert math.isclose(torch.logsumexp(logits, 0).item(), 0.0, abs_tol=1e-4)
        for nxt in [0, tok.encode(".")[0], tok.encode("said")[0], tok.unk_token_id]:
            expected = _reference_prob(ids, context, nxt, model.order, tok.vocab_size)
            assert math.isclose(logits[nxt].exp().item(), expected, rel_tol=1e-4), (model.order, nxt)


def test_flat_batch_matches_one_sequence_at_a_time(models):
    target, _ = models
    a, b = [4, 0, 17, 30, 2], [9, 11, 0]
    max_len = 8
    # Two requests in rows 0 and 1, interleaved in vLLM's flat layout, plus two padded rows.
    ids = torch.tensor(a + b + [-5, -5])  # padded rows must never be looked up here: they are clamped below
    ids = ids.clamp(min=0)
    positions = torch.tensor(list(range(5)) + list(range(3)) + [0, 0])
    slots = torch.tensor(list(range(5)) + [max_len + p for p in range(3)] + [PAD_SLOT_ID, PAD_SLOT_ID])
    cache = target.make_kv_cache(2 * max_len, "cpu")
    logits = target(ids, positions, slots, cache)
    assert torch.equal(logits[:5], target.score(a))
    assert torch.equal(logits[5:8], target.score(b))
    assert cache[:5].tolist() == a and cache[max_len : max_len + 3].tolist() == b
    assert cache[5:max_len].eq(0).all() and cache[max_len + 3 : -1].eq(0).all()  # padding wrote nothing real


def test_decode_continues_from_the_kv_cache(models):
    target, _ = models
    seq = [4, 0, 17, 30, 2, 8]
    cache = target.make_kv_cache(16, "cpu")
    first = target(torch.tensor(seq[:4]), torch.arange(4), torch.arange(4), cache)
    second = target(torch.tensor(seq[4:]), torch.arange(4, 6), torch.arange(4, 6), cache)
    assert torch.equal(torch.cat([first, second]), target.score(seq))


def test_next_token_logits_matches_score(models):
    _, draft = models
    ctx = torch.tensor([[5, 0, 12], [7, 7, 3]])
    out = draft.next_token_logits(ctx)
    assert torch.equal(out[0], draft.score([0, 12])[-1]) and torch.equal(out[1], draft.score([7, 3])[-1])
    with pytest.raises(ValueError, match=r"context_ids must be a \[B, L\] tensor"):
        draft.next_token_logits(torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="context_ids must hold signed integers"):
        draft.next_token_logits(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="order"):
        build_model(1)


def test_score_refuses_what_is_not_a_token_sequence(models):
    target, _ = models
    with pytest.raises(ValueError, match="token_ids is empty"):
        target.score([])
    with pytest.raises(ValueError, match=rf"token_ids must lie in \[0, vocab_size={target.vocab_size}\)"):
        target.score([3, target.vocab_size])
    with pytest.raises(ValueError, match="got \\[-1, 3\\]"):
        target.score([-1, 3])


PROMPTS = story_prompts(8)  # chapter 1's eight story openings, each once


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_acceptance_rate_at_k3_lies_between_40_and_90_percent(temperature):
    params = [SamplingParams(temperature=temperature, seed=i, max_tokens=32) for i in range(len(PROMPTS))]
    stats = generate(PROMPTS, params, num_speculative_tokens=3, sampler_backend="torch").stats
    assert stats.num_draft_tokens >= 150
    assert 0.40 <= stats.acceptance_rate <= 0.90
    assert 1 < stats.mean_acceptance_length < 1 + 3
