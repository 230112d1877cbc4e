"""GPUModelRunner: _calc_spec_decode_metadata keeps -1 (a copy), _preprocess clamps only input_ids,
CUDA-graph padding, and one whole step through the real scheduler."""

import numpy as np
import pytest
import torch

from specfix.fixes import Fixes
from specfix.models import load_models
from specfix.v1.model_runner import GPUModelRunner, cumsum_and_arange
from specfix.v1.proposer import DraftModelProposer
from specfix.v1.scheduler import Request, SamplingParams, Scheduler


@pytest.fixture(scope="module")
def models():
    return load_models("cpu")


def _runner(models, k=3, fixes=None, **kw):
    target, draft = models
    drafter = DraftModelProposer(draft, k) if k else None
    return GPUModelRunner(target, drafter=drafter, fixes=fixes or Fixes(), sampler_backend="torch", **kw)


def test_default_capture_sizes_are_vllm_0_33s_v1_rule(models):
    # 4 requests, k = 2, 64 batched tokens: multiples of 1 + k up to min(4 * 3 * 2, 512) = 24
    assert _runner(models, k=2, max_num_reqs=4, max_num_batched_tokens=64).cudagraph_capture_sizes == [
        3,
        6,
        9,
        12,
        18,
        24,
    ]
    no_spec = _runner(models, k=0, max_num_reqs=4, max_num_batched_tokens=64)
    assert no_spec.cudagraph_capture_sizes == [1, 2, 4, 8]


def test_cumsum_and_arange():
    cu, arange = cumsum_and_arange(np.array([2, 5, 3]))
    assert cu.tolist() == [2, 7, 10] and arange.tolist() == [0, 1, 0, 1, 2, 3, 4, 0, 1, 2]


def test_invalid_draft_suffixes_remain_rejected_in_metadata(models):
    """The source document's test, same inputs."""
    runner = _runner(models)
    runner.input_ids.gpu[:8] = torch.tensor([99, 10, -1, 99, 12, 99, 13, -1], dtype=torch.int32)
    md = runner._calc_spec_decode_metadata(np.array([2, 1, 2]), np.array([3, 5, 8]))
    assert md.draft_token_ids.tolist() == [10, -1, 12, 13, -1]


def test_worked_example_1_prefill_chunks_between_decodes(models):
    runner = _runner(models)
    runner.input_ids.gpu[:209] = torch.arange(209, dtype=torch.int32)  # each id names its position
    md = runner._calc_spec_decode_metadata(np.array([3, 0, 2, 0, 1]), np.array([4, 104, 107, 207, 209]))
    assert md.cu_num_sampled_tokens.tolist() == [4, 5, 8, 9, 11]
    assert md.logits_indices.tolist() == [0, 1, 2, 3, 103, 104, 105, 106, 206, 207, 208]
    assert md.bonus_logits_indices.tolist() == [3, 4, 7, 8, 10]
    assert md.cu_num_draft_tokens.tolist() == [3, 3, 5, 5, 6]
    assert md.target_logits_indices.tolist() == [0, 1, 2, 5, 6, 9]
    assert md.draft_token_ids.tolist() == [1, 2, 3, 105, 106, 208]
    assert md.max_spec_len == 3


def test_worked_example_2_padded_new_decode(models):
    runner = _runner(models)
    ids = [42, -1, -1, -1, 77, 11, 12, 13, 100, 101, 102, 103, 104]
    runner.input_ids.gpu[:13] = torch.tensor(ids, dtype=torch.int32)
    md = runner._calc_spec_decode_metadata(np.array([3, 3, 0]), np.array([4, 8, 13]))
    assert md.cu_num_sampled_tokens.tolist() == [4, 8, 9]
    assert md.logits_indices.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 12]
    assert md.bonus_logits_indices.tolist() == [3, 7, 8]
    assert md.cu_num_draft_tokens.tolist() == [3, 6, 6]
    assert md.target_logits_indices.tolist() == [0, 1, 2, 4, 5, 6]
    assert md.draft_token_ids.tolist() == [-1, -1, -1, 11, 12, 13]


@pytest.mark.parametrize(
    "clamp, spec, expect_clamped", [(True, True, True), (False, True, False), (True, False, False)]
)
def test_preprocess_clamps_input_ids_only(models, clamp, spec, expect_clamped):
    runner = _runner(models, k=3 if spec else None, fixes=Fixes(clamp_placeholders=clamp))
    ids = [42, -1, -1, -1, 77, 11, 12, 13]
    runner.input_ids.gpu[:8] = torch.tensor(ids, dtype=torch.int32)
    runner.input_ids.gpu[8:10] = -1  # stale padding rows from an earlier step
    md = runner._calc_spec_decode_metadata(np.array([3, 3]), np.array([4, 8]))
    embedded, _ = runner._preprocess(None, num_input_tokens=10)
    if expect_clamped:
        assert embedded.tolist() == [max(t, 0) for t in ids] + [0, 0]
    else:
        assert embedded.tolist() == ids + [-1, -1]
    assert md.draft_token_ids.tolist() == [-1, -1, -1, 11, 12, 13]  # the metadata kept its own copy
    assert runner.input_ids.gpu[10:].ge(0).all()  # nothing past num_input_tokens was touched... or needed


def test_one_step_through_scheduler_runner_and_sampler(models):
    """A padded new decode: -1 in token_ids_cpu and in the metadata, 0 at the embedding, rejected."""
    target, _ = models
    runner = _runner(models, record=True, max_model_len=64)
    sched = Scheduler(vocab_size=target.vocab_size, num_spec_tokens=3, max_model_len=64)
    prompt = [4, 0, 17, 30]
    sched.add_request(
        Request("a", prompt, SamplingParams(temperature=0.0, max_tokens=8), num_computed_tokens=3)
    )
    out = sched.schedule()
    result = runner.execute_model(out)
    trace = runner.trace[-1]
    assert trace.token_ids_cpu[0, 4:7].tolist() == [-1, -1, -1]
    assert trace.input_ids_before_clamp[:4].tolist() == [30, -1, -1, -1]
    assert trace.embedding_input[:4].tolist() == [30, 0, 0, 0]
    assert trace.spec_decode_metadata.draft_token_ids.tolist() == [-1, -1, -1]
    assert trace.sampler_output.tolist() == [[int(target.score(prompt)[-1].argmax()), -1, -1, -1]]
    assert result.sampled_token_ids == [trace.sampler_output[0, :1].tolist()]
    # 4 tokens padded to the capture size 4: no padded row; the runner drafted the next 3 tokens
    drafts = runner.take_draft_token_ids()
    assert drafts.req_ids == ["a"] and len(drafts.draft_token_ids[0]) == 3
    assert runner.take_draft_token_ids() is None


def test_padded_rows_write_no_kv_and_are_clamped(models):
    target, _ = models
    runner = _runner(models, record=True, max_model_len=32, cudagraph_capture_sizes=(8,))
    sched = Scheduler(vocab_size=target.vocab_size, num_spec_tokens=3, max_model_len=32)
    sched.add_request(Request("a", [4, 0, 17, 30], SamplingParams(max_tokens=4), num_computed_tokens=3))
    runner.input_ids.gpu[:8] = -1  # stale ids in what will be the padded tail
    runner.execute_model(sched.schedule())
    trace = runner.trace[-1]
    assert trace.input_ids_before_clamp.tolist()[4:] == [-1] * 4
    assert trace.embedding_input.tolist()[4:] == [0] * 4
    assert runner.slot_mapping.gpu[4:8].tolist() == [-1] * 4
    assert runner.kv_cache[3:7].tolist() == [30, 0, 0, 0]  # the request's own slots
    assert runner.kv_cache[7:-1].eq(0).all()


def test_prefilled_request_receives_its_kv(models):
    target, _ = models
    runner = _runner(models, record=True, max_model_len=32)
    sched = Scheduler(vocab_size=target.vocab_size, num_spec_tokens=3, max_model_len=32)
    prompt = [4, 0, 17, 30, 2]
    greedy = SamplingParams(temperature=0.0, max_tokens=4)
    sched.add_request(Request("a", prompt, greedy, num_computed_tokens=4))
    result = runner.execute_model(sched.schedule())
    assert runner.kv_cache[:4].tolist() == prompt[:4]
    assert result.sampled_token_ids == [[int(target.score(prompt)[-1].argmax())]]


def test_a_bad_draft_in_one_request_leaves_the_runner_unchanged(models):
    """Every id is checked before any request's state is written."""
    target, _ = models
    runner = _runner(models, max_model_len=64)
    sched = Scheduler(vocab_size=target.vocab_size, num_spec_tokens=3, max_model_len=64)
    for req_id in ("a", "b"):
        sched.add_request(
            Request(req_id, [4, 0, 17, 30], SamplingParams(max_tokens=8), num_computed_tokens=3)
        )
    out = sched.schedule()
    out.scheduled_spec_decode_tokens["b"] = [5, target.vocab_size, -1]
    tokens_before = runner.input_batch.token_ids_cpu.copy()
    with pytest.raises(ValueError, match="scheduled_spec_decode_tokens\\['b'\\]"):
        runner.execute_model(out)
    assert runner.requests == {} and runner.input_batch.req_id_to_index == {}
    assert np.array_equal(runner.input_batch.token_ids_cpu, tokens_before)
