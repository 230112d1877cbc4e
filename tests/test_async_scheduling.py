"""Async scheduling as in vLLM 0.33 (``AsyncScheduler``, the runner's fill, the engine's batch queue), and
where a ``-1`` reaches the embedding in each scheduling mode."""

import pytest
import torch

from specfix.fixes import Fixes
from specfix.lab.placeholder_lifecycle import story_prompts
from specfix.models import load_models
from specfix.v1.engine import LLMEngine, SamplingParams, generate
from specfix.v1.model_runner import DraftTokenIds, ModelRunnerOutput
from specfix.v1.scheduler import AsyncScheduler, Request

VOCAB = 512
K = 3
MODELS = load_models("cpu")
PROMPTS = story_prompts(6)  # chapter 1's story openings
GREEDY = SamplingParams(temperature=0.0, max_tokens=15)
RUN = dict(models=MODELS, sampler_backend="torch")


def _sched(**kw):
    return AsyncScheduler(vocab_size=VOCAB, num_spec_tokens=K, **kw)


def _update(sched, out, sampled):
    req_ids = list(out.num_scheduled_tokens)
    result = ModelRunnerOutput(
        req_ids, {r: i for i, r in enumerate(req_ids)}, [sampled.get(r, []) for r in req_ids]
    )
    return sched.update_from_output(out, result)


# -- the scheduler -------------------------------------------------------------------------------------------
def test_every_decode_gets_k_placeholders_counted_in_num_output_placeholders():
    sched = _sched()
    sched.add_request(Request("a", [5, 6], SamplingParams(max_tokens=16)))
    req = sched.requests["a"]
    first = sched.schedule()  # the whole prompt: the request samples its first token in this step
    assert first.num_scheduled_tokens == {"a": 2} and first.scheduled_spec_decode_tokens == {}
    assert req.spec_token_ids == [-1] * K and req.num_output_placeholders == 1 and not req.is_prefill_chunk
    second = sched.schedule()  # planned before the first step's token is known
    assert second.num_scheduled_tokens == {"a": 1 + K}
    assert second.scheduled_spec_decode_tokens == {"a": [-1] * K}
    assert second.num_placeholder_spec_tokens == {"a": K}
    assert second.scheduled_cached_reqs.num_computed_tokens == [2]
    assert req.num_computed_tokens == 2 + 1 + K and req.num_output_placeholders == 1 + (1 + K)


def test_output_takes_rejected_drafts_and_emitted_tokens_off_the_placeholders():
    sched = _sched()
    sched.add_request(Request("a", [5, 6], SamplingParams(max_tokens=16)))
    req = sched.requests["a"]
    first, second = sched.schedule(), sched.schedule()
    _update(sched, first, {"a": [8]})
    assert req.output_token_ids == [8] and req.num_output_placeholders == 1 + K  # the second step's
    _update(sched, second, {"a": [9, 40]})  # one draft accepted, two rejected, then 40
    assert req.output_token_ids == [8, 9, 40]
    assert req.num_output_placeholders == 0 and req.num_computed_tokens == req.num_tokens - 1
    stats = sched.spec_decoding_stats  # no runner filled the placeholders here: all three were padding
    assert (stats.num_draft_tokens, stats.num_placeholder_slots) == (0, K)


def test_filled_placeholders_count_as_drafts():
    sched = _sched()
    sched.add_request(Request("a", [5, 6], SamplingParams(max_tokens=16)))
    first, second = sched.schedule(), sched.schedule()
    _update(sched, first, {"a": [8]})
    filled = ModelRunnerOutput(["a"], {"a": 0}, [[9, 40]], num_filled_spec_tokens={"a": K})
    sched.update_from_output(second, filled)
    stats = sched.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, K, 1)
    assert stats.num_placeholder_slots == 0


def test_the_first_steps_output_delivered_again_while_the_second_is_in_flight_is_refused():
    """Under async scheduling the request still has a step in flight, so only the step's own number tells
    a second delivery of the first output from the second step's."""
    sched = _sched()
    sched.add_request(Request("a", [5, 6], SamplingParams(max_tokens=16)))
    first, second = sched.schedule(), sched.schedule()
    _update(sched, first, {"a": [8]})
    req = sched.requests["a"]
    state = (list(req.output_token_ids), req.num_computed_tokens, req.num_output_placeholders)
    with pytest.raises(ValueError, match=r"step_id 0.*delivered already"):
        _update(sched, first, {"a": [8]})
    assert (req.output_token_ids, req.num_computed_tokens, req.num_output_placeholders) == state
    _update(sched, second, {"a": [9, 40]})
    assert req.output_token_ids == [8, 9, 40]


def test_a_request_still_prefilling_gets_no_placeholders():
    sched = _sched(max_num_batched_tokens=4)
    sched.add_request(Request("a", list(range(6)), SamplingParams()))
    sched.schedule()
    req = sched.requests["a"]
    assert req.is_prefill_chunk and req.spec_token_ids == [] and req.num_output_placeholders == 0
    assert sched.schedule().num_scheduled_tokens == {"a": 2}  # the rest of the prompt, no drafts
    assert req.spec_token_ids == [-1] * K and req.num_output_placeholders == 1


def test_every_request_shares_one_placeholder_list_of_the_steps_size():
    """vLLM sizes ``_spec_token_placeholders`` by the step's ``num_spec_tokens_to_schedule`` (which its
    dynamic speculative decoding can lower; specfix always asks for k) and hands every request that list."""
    sched = _sched()
    for req_id in ("a", "b"):
        sched.add_request(Request(req_id, [5, 6], SamplingParams()))
    out = sched.schedule()
    assert out.num_spec_tokens_to_schedule == K and sched._spec_token_placeholders == [-1] * K
    a, b = sched.requests["a"], sched.requests["b"]
    assert a.spec_token_ids is b.spec_token_ids is sched._spec_token_placeholders


def test_a_prefilled_request_is_padded_in_async_mode_too():
    sched = _sched()
    sched.add_request(Request("pd", [5, 6, 7], SamplingParams(), num_computed_tokens=2))
    out = sched.schedule()
    assert out.scheduled_spec_decode_tokens == {"pd": [-1] * K}
    assert out.num_placeholder_spec_tokens == {"pd": K}
    assert sched.requests["pd"].num_output_placeholders == 1 + K


@pytest.mark.parametrize("max_tokens, scheduled", [(2, {}), (3, {"a": 1 + K})])
def test_no_step_is_planned_once_the_step_in_flight_must_reach_max_tokens(max_tokens, scheduled):
    """After step 2's output: 3 tokens known, 1 more surely coming; with max_tokens = 2 the request is
    done whatever step 2 accepts, so vLLM plans nothing more for it."""
    sched = _sched()
    sched.add_request(Request("a", [5, 6], SamplingParams(max_tokens=max_tokens)))
    first, _ = sched.schedule(), sched.schedule()
    _update(sched, first, {"a": [8]})
    assert sched.schedule().num_scheduled_tokens == scheduled


def test_positions_are_capped_at_max_model_len():
    """The scheduler's num_computed_tokens counts every in-flight draft as accepted; vLLM caps a step at
    ``max_model_len - num_computed_tokens - 1`` tokens, so here only the last sampled token fits."""
    sched = _sched(max_model_len=8)
    sched.add_request(Request("a", [5, 6], SamplingParams(max_tokens=3)))
    first, _ = sched.schedule(), sched.schedule()
    _update(sched, first, {"a": [8]})
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1} and out.scheduled_spec_decode_tokens == {}


def test_drafts_never_travel_through_the_async_scheduler():
    sched = _sched()
    sched.add_request(Request("a", [5, 6], SamplingParams()))
    with pytest.raises(RuntimeError, match="AsyncScheduler takes no drafts"):
        sched.update_draft_token_ids(DraftTokenIds(["a"], [[1, 2, 3]]))


def test_an_id_stays_taken_while_a_step_that_carries_it_is_in_flight():
    sched = _sched()
    sched.add_request(Request("a", [5, 6], SamplingParams(max_tokens=3)))
    first, second = sched.schedule(), sched.schedule()
    _update(sched, first, {"a": [8]})
    third = sched.schedule()  # planned while step 2 may still reject all its drafts
    assert third.num_scheduled_tokens == {"a": 1 + K}
    assert [r.request_id for r in _update(sched, second, {"a": [9, 10, 11, 12]})] == ["a"]
    assert "a" not in sched.requests and sched.is_request_id_in_use("a")
    with pytest.raises(ValueError, match="request_id 'a' finished, but a step that carries it is still"):
        sched.add_request(Request("a", [7], SamplingParams()))
    assert _update(sched, third, {"a": [9, 10]}) == []  # the late output of a finished request: dropped
    assert not sched.is_request_id_in_use("a")
    sched.add_request(Request("a", [7], SamplingParams()))
    assert sched.requests["a"].output_token_ids == []


# -- the engine ----------------------------------------------------------------------------------------------
def _greedy_reference(prompt_ids, max_tokens):
    seq = list(prompt_ids)
    for _ in range(max_tokens):
        seq.append(int(MODELS[0].score(seq)[-1].argmax()))
    return seq[len(prompt_ids) :]


@pytest.mark.parametrize("remote", [False, [True, False, True, False, False, True]])
def test_greedy_text_is_the_same_in_both_modes_and_equals_plain_greedy(remote):
    sync = generate(PROMPTS, GREEDY, remote_prefill=remote, **RUN)
    asyn = generate(PROMPTS, GREEDY, remote_prefill=remote, async_scheduling=True, **RUN)
    plain = generate(PROMPTS, GREEDY, num_speculative_tokens=None, **RUN)
    tok = sync.outputs[0]
    for s, a, p in zip(sync.outputs, asyn.outputs, plain.outputs, strict=True):
        assert s.token_ids == a.token_ids == p.token_ids == _greedy_reference(s.prompt_token_ids, 15)
    assert tok.finished and sync.stats == asyn.stats and sync.stats.num_accepted_tokens > 0


def test_async_scheduling_without_speculation_equals_plain_decoding():
    """No drafts: each step still runs before the previous one's token reaches the scheduler."""
    runs = [
        generate(PROMPTS, GREEDY, num_speculative_tokens=None, async_scheduling=a, **RUN)
        for a in (False, True)
    ]
    assert [o.token_ids for o in runs[0].outputs] == [o.token_ids for o in runs[1].outputs]
    assert runs[1].stats.num_draft_tokens == runs[1].stats.num_placeholder_slots == 0


def test_seeded_sampling_is_the_same_in_both_modes():
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=20) for i in range(len(PROMPTS))]
    runs = [
        generate(PROMPTS, params, remote_prefill=[True, False] * 3, async_scheduling=a, **RUN)
        for a in (False, True)
    ]
    assert [o.token_ids for o in runs[0].outputs] == [o.token_ids for o in runs[1].outputs]
    assert runs[0].stats == runs[1].stats


def test_the_runner_writes_its_previous_proposals_over_the_placeholders():
    """On the CPU side (``token_ids_cpu``) the slots keep the scheduler's -1; on the device, before the
    forward, they hold what the drafter proposed in the previous step from the committed tokens, and
    the spec-decode metadata (built after the fill) carries those real drafts."""
    result = generate(PROMPTS, GREEDY, async_scheduling=True, record=True, **RUN)
    drafter = LLMEngine(**RUN).model_runner.drafter
    checked = 0
    for step in result.trace:
        spec = step.scheduler_output.scheduled_spec_decode_tokens
        ends = torch.tensor(step.num_scheduled_tokens).cumsum(0).tolist()
        for i, (req_id, end) in enumerate(zip(step.req_ids, ends, strict=True)):
            if req_id not in spec:
                continue
            assert spec[req_id] == [-1] * K and step.num_filled_spec_tokens[req_id] == K
            row = step.token_ids_cpu[i].tolist()
            committed = row[: row.index(-1)]
            assert row[len(committed) : len(committed) + K] == [-1] * K
            filled = step.input_ids_before_clamp[end - K : end].tolist()
            assert filled == drafter.propose_batch([committed])[0]
            md = step.spec_decode_metadata
            start = int(md.cu_num_draft_tokens[i]) - K
            assert md.draft_token_ids[start : start + K].tolist() == filled
            checked += 1
    assert checked > 20


def test_num_output_placeholders_cover_the_batch_in_flight():
    engine = LLMEngine(async_scheduling=True, **RUN)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=12), remote_prefill=i % 2 == 0)
    while engine.has_unfinished_requests():
        engine.step()
        in_flight = engine._batch_queue[0][0] if engine._batch_queue else None
        for req_id, req in engine.scheduler.requests.items():
            expected = 0
            carried = in_flight is not None and req_id in in_flight.num_scheduled_tokens
            if carried and not req.is_prefill_chunk:
                expected = 1 + len(in_flight.scheduled_spec_decode_tokens.get(req_id, ()))
            assert req.num_output_placeholders == expected, (engine.num_steps, req_id)
    assert engine.scheduler.requests == {}


def test_without_the_clamp_every_placeholder_of_a_plain_batch_is_filled_in_time():
    """No request arrives prefilled: the synchronous scheduler writes no -1 (a short n-gram proposal is
    never padded) and the async runner overwrites every one it gets, so nothing reaches the embedding."""
    off = Fixes(clamp_placeholders=False)
    for kw in (dict(proposer="ngram"), dict(async_scheduling=True)):
        result = generate(PROMPTS, GREEDY, fixes=off, **kw, **RUN)
        assert all(len(o.token_ids) == 15 for o in result.outputs)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_without_the_clamp_a_prefilled_request_crashes_the_first_step(async_scheduling):
    off = Fixes(clamp_placeholders=False)
    with pytest.raises(IndexError, match="index out of range in self"):
        generate(
            PROMPTS,
            GREEDY,
            fixes=off,
            remote_prefill=True,
            max_steps=1,
            async_scheduling=async_scheduling,
            **RUN,
        )


def _starved(fixes, async_scheduling):
    """Three requests and a token budget of 8: two decodes of 1 + k take it all, the third waits."""
    engine = LLMEngine(
        fixes=fixes, max_num_batched_tokens=8, async_scheduling=async_scheduling, record=True, **RUN
    )
    for prompt in PROMPTS[:3]:
        engine.add_request(prompt, GREEDY)
    return engine


def test_async_a_request_skipped_for_a_step_keeps_its_minus_one_up_to_the_embedding():
    """A request left out of the previous step (the budget went to others) has no proposals with the
    runner: its placeholders stay -1. Without the clamp, that step and no earlier one crashes."""
    engine = _starved(Fixes(), async_scheduling=True)
    while engine.has_unfinished_requests():
        engine.step()
    trace = engine.model_runner.trace
    unfilled = [
        i
        for i, step in enumerate(trace)
        for req_id, spec in step.scheduler_output.scheduled_spec_decode_tokens.items()
        if step.num_filled_spec_tokens.get(req_id, 0) < len(spec)
    ]
    assert unfilled, "the workload no longer starves a request"
    first = unfilled[0]
    assert -1 in trace[first].input_ids_before_clamp.tolist()
    assert all(-1 not in step.input_ids_before_clamp.tolist() for step in trace[:first])
    crashing = _starved(Fixes(clamp_placeholders=False), async_scheduling=True)
    for _ in range(first):
        crashing.step()
    with pytest.raises(IndexError, match="index out of range in self"):
        crashing.step()
    sync = _starved(Fixes(clamp_placeholders=False), async_scheduling=False)  # the same workload: no -1
    done = [out for _ in range(100) if sync.has_unfinished_requests() for out in sync.step()]
    assert [len(out.token_ids) for out in done] == [15, 15, 15]


def test_async_scheduling_refuses_the_ngram_drafter():
    with pytest.raises(ValueError, match="async_scheduling=True does not work with proposer='ngram'"):
        LLMEngine(async_scheduling=True, proposer="ngram", **RUN)
    with pytest.raises(TypeError, match="async_scheduling must be a bool, got 1"):
        LLMEngine(async_scheduling=1, **RUN)


class _ShortDrafter:
    k = K

    def propose_batch(self, histories):
        return [[1] for _ in histories]


def test_a_drafter_with_fewer_than_k_proposals_is_refused_and_the_step_undone():
    engine = LLMEngine(async_scheduling=True, **RUN)
    engine.model_runner.drafter = _ShortDrafter()
    engine.add_request("the mice", GREEDY)
    with pytest.raises(ValueError, match="async scheduling needs exactly k = 3 proposals per request"):
        engine.step()
    assert engine.num_steps == 0 and engine.scheduler.waiting and not engine.scheduler.running


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_async_scheduling_on_cuda_matches_the_cpu():
    """The fill runs on the device there: the same texts as on the CPU, in both modes."""
    kw = dict(remote_prefill=[True, False] * 3, sampler_backend="auto", async_scheduling=True, record=True)
    on_gpu = generate(PROMPTS, GREEDY, device="cuda", models=load_models("cuda"), **kw)
    on_cpu = generate(PROMPTS, GREEDY, models=MODELS, **kw)
    assert [o.token_ids for o in on_gpu.outputs] == [o.token_ids for o in on_cpu.outputs]
    assert sum(sum(s.num_filled_spec_tokens.values()) for s in on_gpu.trace) > 0
