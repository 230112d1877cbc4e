"""Model Runner V2's draft slots (vLLM 0.33.0): the zeroed draft table feeds token 0 where the scheduler
padded, ``gather_draft_sampled`` marks those slots -1 again so that verification rejects them; switched
off, the zeros are judged as drafts (0.25's MRV2)."""

import pytest
import torch

from specfix.fixes import Fixes
from specfix.models import load_models
from specfix.mrv2.draft_slots import GPUModelRunnerV2, gather_draft_sampled
from specfix.v1.engine import DEMO_PROMPTS, LLMEngine, SamplingParams, generate

MODELS = load_models("cpu")
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def _table():
    """Two requests, as vLLM lays them out. Request A (state row 2, prefill_len 10) starts decoding padded:
    positions 9..12, its drafts are placeholders. Request B (state row 0, prefill_len 5) verifies two real
    drafts at positions 7..9. Every input token is in ``input_ids``; rows 0..6 are the logits rows."""
    input_ids = torch.tensor([50, 51, 52, 53, 99, 60, 61, 62], dtype=torch.int32)
    positions = torch.tensor([9, 10, 11, 12, 0, 7, 8, 9])
    logits_indices = torch.tensor([0, 1, 2, 3, 5, 6, 7])
    idx = torch.tensor([2, 2, 2, 2, 0, 0, 0])
    local_pos = torch.tensor([0, 1, 2, 3, 0, 1, 2])
    prefill_len = torch.tensor([5, 0, 10])
    return input_ids, positions, logits_indices, idx, local_pos, prefill_len


def test_gather_draft_sampled_marks_the_draft_rows_of_a_step_that_starts_in_the_prefill():
    tokens, pos = gather_draft_sampled(*_table())
    assert tokens.tolist() == [50, -1, -1, -1, 60, 61, 62]  # A's last prompt token stays; B's drafts are real
    assert pos.tolist() == [9, 10, 11, 12, 7, 8, 9]


def test_gather_draft_sampled_without_the_fix_reads_the_inputs_as_they_are():
    tokens, _ = gather_draft_sampled(*_table(), fixes=Fixes(mark_placeholder_drafts=False))
    assert tokens.tolist() == [50, 51, 52, 53, 60, 61, 62]


def _first_step(fixes, prompt=DEMO_PROMPTS[0], **kw):
    engine = LLMEngine(
        num_speculative_tokens=3,
        models=MODELS,
        record=True,
        sampler_backend="torch",
        model_runner="v2",
        fixes=fixes,
        **kw,
    )
    engine.add_request(prompt, GREEDY, remote_prefill=True)
    engine.step()
    return engine


def test_the_draft_table_feeds_zeros_where_the_scheduler_wrote_minus_one():
    engine = _first_step(Fixes(clamp_placeholders=False))  # MRV2 has no clamp, and needs none
    assert isinstance(engine.model_runner, GPUModelRunnerV2)
    step = engine.model_runner.trace[0]
    assert step.scheduler_output.scheduled_spec_decode_tokens == {"0": [-1, -1, -1]}
    assert step.embedding_input[1:4].tolist() == [0, 0, 0]
    assert step.spec_decode_metadata.draft_token_ids.tolist() == [-1, -1, -1]
    assert len(step.sampled_token_ids[0]) == 1  # every placeholder slot rejected


def test_without_the_marking_a_zero_placeholder_is_accepted_as_a_draft():
    """The demo prompt's greedy next token is 0: 0.25's MRV2 accepts the placeholder slot holding 0."""
    engine = _first_step(Fixes(mark_placeholder_drafts=False))
    step = engine.model_runner.trace[0]
    assert step.spec_decode_metadata.draft_token_ids.tolist() == [0, 0, 0]
    assert step.sampled_token_ids[0][0] == 0 and len(step.sampled_token_ids[0]) >= 2
    assert engine.scheduler.spec_decoding_stats.num_placeholders_accepted >= 1


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_greedy_text_and_acceptance_match_the_v1_runner(async_scheduling):
    """Both runners reject every placeholder and verify the same drafts: the same tokens and statistics,
    prefilled requests (placeholders) and a repeated prompt (prefix-cache hit) included."""
    prompts = [*DEMO_PROMPTS, DEMO_PROMPTS[1]]
    kw = dict(
        remote_prefill=[True, False, True, False, False],
        models=MODELS,
        sampler_backend="torch",
        async_scheduling=async_scheduling,
        enable_prefix_caching=True,
    )
    v1 = generate(prompts, GREEDY, **kw)
    v2 = generate(prompts, GREEDY, model_runner="v2", **kw)
    assert [o.token_ids for o in v2.outputs] == [o.token_ids for o in v1.outputs]
    assert v2.stats.num_drafts > 0 and v2.stats.num_placeholders_accepted == 0
    assert (v2.stats.num_draft_tokens, v2.stats.num_accepted_tokens) == (
        v1.stats.num_draft_tokens,
        v1.stats.num_accepted_tokens,
    )


def test_the_engine_names_a_bad_runner():
    with pytest.raises(ValueError, match=r"model_runner must be one of \('v1', 'v2'\), got 'v3'"):
        LLMEngine(models=MODELS, model_runner="v3")


def test_the_module_keeps_its_short_name():
    import specfix
    from specfix import draft_slots

    assert draft_slots is specfix.mrv2.draft_slots
    assert draft_slots.gather_draft_sampled is gather_draft_sampled


def test_async_a_request_that_sat_out_a_step_keeps_its_proposals_in_the_table():
    """Chapter 1's tight-budget workload: on the V1 runner a request that sat out a step sends -1 towards
    the embedding; Model Runner V2's table still holds its last proposals, so no -1 is fed or verified."""
    prompts = ["the fox saw the crow", "a lion was asleep", "the north wind"]
    kw = dict(
        num_speculative_tokens=3,
        max_num_batched_tokens=8,
        async_scheduling=True,
        record=True,
        models=MODELS,
        sampler_backend="torch",
    )
    v1 = generate(prompts, GREEDY, **kw)
    v2 = generate(prompts, GREEDY, model_runner="v2", **kw)
    assert sum(int((step.input_ids_before_clamp < 0).sum()) for step in v1.trace) > 0
    assert all(int((step.input_ids_before_clamp < 0).sum()) == 0 for step in v2.trace)
    assert all(
        int((step.spec_decode_metadata.draft_token_ids < 0).sum()) == 0
        for step in v2.trace
        if step.spec_decode_metadata is not None
    )
    assert [o.token_ids for o in v2.outputs] == [o.token_ids for o in v1.outputs]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_v2_runner_on_cuda_matches_the_cpu():
    """The draft table, the marking and the prefix cache on the device: the same tokens and counts as here."""
    prompts = [*DEMO_PROMPTS, DEMO_PROMPTS[1]]
    kw = dict(
        remote_prefill=[True, False, True, False, False],
        sampler_backend="auto",
        model_runner="v2",
        enable_prefix_caching=True,
        record=True,
    )
    on_gpu = generate(prompts, GREEDY, device="cuda", models=load_models("cuda"), **kw)
    on_cpu = generate(prompts, GREEDY, models=MODELS, **kw)
    assert [o.token_ids for o in on_gpu.outputs] == [o.token_ids for o in on_cpu.outputs]
    assert on_gpu.stats.num_placeholders_accepted == 0
    assert on_gpu.trace[0].spec_decode_metadata.draft_token_ids.device.type == "cuda"
