"""specfix.lab.masked_gumbel: chapter 4's batches, the guarded drafter step and the stale-padding table."""

import pytest
import torch

from specfix import Fixes, runtime
from specfix.lab import masked_gumbel as lab
from specfix.mrv2 import gumbel_reference as ref

DEVICE = runtime.DEVICE


def test_repeated_rows_assigns_requests_round_robin():
    b = lab.repeated_rows(10, torch.arange(5.0), 0.7, num_reqs=4, seed=3)
    assert torch.equal(b["logits"][7], torch.arange(5.0))
    assert b["expanded_idx_mapping"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert b["pos"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert b["temperature"].tolist() == pytest.approx([0.7] * 4)
    assert len(set(b["seed"].tolist())) == 4


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(rows=0), r"rows, vocab and num_reqs must be >= 1, got 0, 3 and 8"),
        (dict(logits=torch.zeros(2, 3)), r"logits must be one row \[vocab\], got shape \(2, 3\)"),
    ],
)
def test_repeated_rows_refuses_bad_sizes(kwargs, match):
    args = dict(rows=4, logits=torch.zeros(3), temperature=1.0) | kwargs
    with pytest.raises(ValueError, match=match):
        lab.repeated_rows(**args)


def test_the_crowd_holds_the_same_requests():
    alone, crowd, rows = lab.alone_and_crowded(vocab_size=50)
    for i, row in enumerate(rows):
        slot = int(crowd["expanded_idx_mapping"][row])
        assert torch.equal(crowd["logits"][row], alone["logits"][i])
        assert crowd["seed"][slot] == alone["seed"][i] and crowd["pos"][row] == alone["pos"][i]
        assert crowd["temperature"][slot] == alone["temperature"][i]
    assert sorted(int(crowd["expanded_idx_mapping"][r]) for r in rows) != [0, 1, 2, 3]  # moved slots


def test_sample_matches_the_reference_for_the_crowd():
    alone, crowd, rows = lab.alone_and_crowded(vocab_size=300)
    want = ref.gumbel_sample_reference(**alone, apply_temperature=True, is_drafting=False)
    assert torch.equal(lab.sample(alone, device=DEVICE), want)
    assert torch.equal(lab.sample(crowd, device=DEVICE)[rows], want)


def test_padded_drafter_step_with_the_mask_writes_only_live_slots():
    step = lab.padded_drafter_step()
    tokens, buffers = lab.run_drafter_step(step, device=DEVICE)
    whole = buffers["draft_logits"]
    written = (whole != lab.SENTINEL).any(-1)
    want = torch.zeros_like(written)
    for slot, col in step.live_slots:
        want[slot + 1, col] = True
    assert torch.equal(written, want)
    assert tokens[4] == step.logits[4].argmax() and tokens[5] == step.logits[5].argmax()


def test_padded_drafter_step_without_the_mask_writes_the_guard_row():
    step = lab.padded_drafter_step()
    _, buffers = lab.run_drafter_step(step, Fixes(mask_invalid_reqs=False), device=DEVICE)
    guard = buffers["draft_logits"][0, step.col]
    assert torch.equal(guard, step.logits[5])  # its logits, before temperature
    assert buffers["temperature"][0] == step.guard_temperature  # the guard itself is read, never written


@pytest.mark.parametrize("seed", range(4))
def test_stale_padding_step_overwrites_exactly_the_reported_slot(seed):
    puzzle, overwritten = lab.stale_padding_step(seed, device=DEVICE)
    table, col, temps = puzzle["table"], puzzle["col"], puzzle["temperature"]
    own = {
        slot: torch.equal(table[slot, col], puzzle["logits"][row])  # cached before temperature
        for row, slot in enumerate(puzzle["idx_mapping"].tolist())
    }
    assert [slot for slot, ok in own.items() if not ok] == overwritten and len(overwritten) == 1
    assert (temps[puzzle["idx_mapping"].long()] == 0).sum() == 1 and not (temps == 1).any()


def test_random_batch_has_one_greedy_request_and_sampled_others():
    b = lab.random_batch(6, 50, seed=2)
    assert b["logits"].shape == (6, 50) and b["expanded_idx_mapping"].tolist() == list(range(6))
    sampled = b["temperature"][1:]
    assert b["temperature"][0] == 0 and bool(((sampled >= 0.3) & (sampled <= 2)).all())


def test_random_batch_refuses_bad_sizes():
    with pytest.raises(ValueError, match=r"rows, vocab and num_reqs must be >= 1, got 3, 0 and 3"):
        lab.random_batch(3, 0)


def test_load_vllm_sampler_is_none_until_fetched(tmp_path, monkeypatch):
    monkeypatch.setattr(lab, "PEER_DIR", tmp_path)
    assert lab.load_vllm_sampler("0.33.0") is None


def test_load_vllm_sampler_imports_vllms_own_file(vllm_gumbel):
    """Its gumbel_sample runs in Triton's interpreter too, the draft-logits cache included (vLLM masks that
    store by a scalar, which the interpreter needs as an int1 mask: load_vllm_sampler gives it one)."""
    assert vllm_gumbel.__file__ == str(lab.PEER_DIR / "vllm_gumbel_0_33_0.py")
    step = lab.padded_drafter_step()
    b = {k: getattr(step, k).to(DEVICE) for k in lab.BATCH_KEYS}
    cache = torch.full((4, 2, step.logits.shape[1]), lab.SENTINEL, device=DEVICE)
    tokens = vllm_gumbel.gumbel_sample(*b.values(), True, True, cache, torch.tensor(1, device=DEVICE))
    _, buffers = lab.run_drafter_step(step, device=DEVICE)
    assert torch.equal(cache.cpu(), buffers["draft_logits"][1:-1]) and tokens.shape == (6,)


@pytest.mark.parametrize("with_peer", [False, True], ids=["torch reference", "vLLM's kernel"])
def test_vllm_mode_agreement_counts_same_tokens_and_caches(request, with_peer):
    """Chapter 4's table: noise="vllm" picks every token and caches every value as vLLM 0.33 does (its own
    kernel from .peer/, or the torch reference of its noise), and agrees with the exact mode on the greedy
    row only by necessity."""
    peer = request.getfixturevalue("vllm_gumbel") if with_peer else None
    batch = lab.random_batch(rows=6, vocab_size=300, seed=7, device=DEVICE)
    rows = lab.vllm_mode_agreement(batch, peer)
    assert [r["drafting"] for r in rows] == [False, True]
    for r in rows:
        assert r["rows"] == r["same token as vLLM's noise"] == 6 and r["same cached logits"]
        assert r["greedy row agrees"] and r["same token as specfix exact"] < 6
