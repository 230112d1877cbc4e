"""Scheduler: where placeholders are born, the token budget, rollback of rejected drafts, statistics."""

import copy

import pytest
import torch

from specfix.v1.model_runner import DraftTokenIds, ModelRunnerOutput
from specfix.v1.rejection_sampler import MAX_SPEC_LEN
from specfix.v1.scheduler import AsyncScheduler, Request, SamplingParams, Scheduler, SpecDecodingStats

VOCAB = 512


def _sched(k=3, **kw):
    return Scheduler(vocab_size=VOCAB, num_spec_tokens=k, **kw)


def _run(sched, out, sampled):
    """Feed back ``sampled[req_id]`` as the model's output for a scheduled step."""
    req_ids = list(out.num_scheduled_tokens)
    index = {r: i for i, r in enumerate(req_ids)}
    result = ModelRunnerOutput(req_ids, index, [sampled.get(r, []) for r in req_ids])
    return sched.update_from_output(out, result)


def test_prefill_then_decode_with_drafts():
    sched = _sched()
    sched.add_request(Request("a", [5, 6, 7], SamplingParams(max_tokens=10)))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 3} and out.scheduled_spec_decode_tokens == {}
    assert [r.req_id for r in out.scheduled_new_reqs] == ["a"]
    _run(sched, out, {"a": [8]})
    sched.update_draft_token_ids(DraftTokenIds(["a"], [[9, 10, 11]]))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.scheduled_spec_decode_tokens == {"a": [9, 10, 11]}
    assert out.scheduled_cached_reqs.num_computed_tokens == [3]


def _decoding(sched, req_id="a", prompt=(5, 6), max_tokens=16):
    """Add a request and run its prefill: it then waits with one sampled token to decode (None: finished)."""
    sched.add_request(Request(req_id, list(prompt), SamplingParams(max_tokens=max_tokens)))
    _run(sched, sched.schedule(), {req_id: [8]})
    return sched.requests.get(req_id)


def test_new_decode_is_padded_with_minus_one():
    """A request whose KV came from a prefill node has one token left: 1 + k tokens, drafts [-1] * k."""
    sched = _sched()
    sched.add_request(Request("a", [5, 6, 7], SamplingParams(), num_computed_tokens=2))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 4}
    assert out.scheduled_spec_decode_tokens == {"a": [-1, -1, -1]}
    assert out.num_placeholder_spec_tokens == {"a": 3}


def test_one_token_prompt_is_padded_only_behind_a_scheduled_running_request():
    """vLLM pads a request without KV only if a *running* request was scheduled before it in the step;
    new requests admitted before it do not count."""
    sched = _sched()
    sched.add_request(Request("a", [5], SamplingParams()))
    assert sched.schedule().scheduled_spec_decode_tokens == {}  # alone: a 1-token prefill, as in vLLM
    both_new = _sched()
    both_new.add_request(Request("b", [5, 6], SamplingParams()))
    both_new.add_request(Request("a", [5], SamplingParams()))
    out = both_new.schedule()
    assert out.scheduled_spec_decode_tokens == {} and out.num_scheduled_tokens == {"b": 2, "a": 1}
    behind_running = _sched()
    _decoding(behind_running, "b")
    behind_running.add_request(Request("a", [5], SamplingParams()))
    out = behind_running.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": [-1, -1, -1]}
    assert out.num_scheduled_tokens == {"b": 1, "a": 4}


def test_no_padding_in_a_step_with_a_running_prefill_chunk():
    sched = _sched(max_num_batched_tokens=8)
    sched.add_request(Request("long", list(range(12)), SamplingParams()))
    _run(sched, sched.schedule(), {})  # 8 of 12 prompt tokens: still prefilling
    assert sched.requests["long"].is_prefill_chunk
    sched.add_request(Request("pd", [5, 6, 7], SamplingParams(), num_computed_tokens=2))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"long": 4, "pd": 1} and out.scheduled_spec_decode_tokens == {}
    assert out.num_placeholder_spec_tokens == {}


@pytest.mark.parametrize("proposed", [[9], []])
def test_a_running_request_is_never_padded(proposed):
    """The n-gram drafter proposes fewer than k tokens, or none on no match: vLLM schedules
    1 + len(drafts) tokens and verifies only those."""
    sched = _sched()
    _decoding(sched)
    sched.update_draft_token_ids(DraftTokenIds(["a"], [proposed]))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1 + len(proposed)}
    assert out.scheduled_spec_decode_tokens == ({"a": proposed} if proposed else {})
    assert out.num_placeholder_spec_tokens == ({"a": 0} if proposed else {})


def test_a_short_budget_trims_a_running_decode_but_stops_before_an_unpadded_new_one():
    sched = _sched(max_num_batched_tokens=6)
    for req_id in ("a", "b"):
        sched.add_request(Request(req_id, [5, 6], SamplingParams()))
    _run(sched, sched.schedule(), {"a": [8], "b": [8]})
    sched.update_draft_token_ids(DraftTokenIds(["a", "b"], [[9, 10, 11], [9, 10, 11]]))
    sched.add_request(Request("pd", [1, 2, 3], SamplingParams(), num_computed_tokens=2))
    out = sched.schedule()
    # "a" takes 4, "b" gets the 2 left (its last token + one draft); "pd" would need 1 + k: not scheduled
    assert out.num_scheduled_tokens == {"a": 4, "b": 2}
    assert out.scheduled_spec_decode_tokens == {"a": [9, 10, 11], "b": [9]}


def test_drafts_of_a_request_still_prefilling_are_dropped():
    sched = _sched(max_num_batched_tokens=4)
    sched.add_request(Request("a", list(range(6)), SamplingParams()))
    _run(sched, sched.schedule(), {})
    sched.update_draft_token_ids(DraftTokenIds(["a"], [[9, 10, 11]]))
    assert sched.requests["a"].spec_token_ids == []
    assert sched.schedule().num_scheduled_tokens == {"a": 2}


@pytest.mark.parametrize("policy, expected", [("minus_one", [-1, -1, -1]), ("zero", [0, 0, 0])])
def test_the_placeholder_policy_picks_the_padding_value(policy, expected):
    sched = _sched(placeholder_policy=policy)
    sched.add_request(Request("a", [5, 6, 7], SamplingParams(), num_computed_tokens=2))
    out = sched.schedule()
    assert out.scheduled_spec_decode_tokens == {"a": expected} and out.num_placeholder_spec_tokens == {"a": 3}


def test_rejected_drafts_are_rolled_back():
    sched = _sched()
    req = _decoding(sched, max_tokens=20)
    assert req.num_computed_tokens == 2 and req.num_tokens == 3
    sched.update_draft_token_ids(DraftTokenIds(["a"], [[9, 10, 11]]))
    out = sched.schedule()
    assert req.num_computed_tokens == 2 + 4  # optimistic until the runner answers
    _run(sched, out, {"a": [9, 40]})  # first draft accepted, second rejected and replaced by 40
    assert req.output_token_ids == [8, 9, 40]
    assert req.num_computed_tokens == req.num_tokens - 1  # everything but the last sample has KV
    stats = sched.spec_decoding_stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.num_accepted_tokens_per_pos == [1, 0, 0] and stats.acceptance_lengths == [2]


def test_request_finishes_at_max_tokens():
    sched = _sched()
    _decoding(sched, max_tokens=2)
    sched.update_draft_token_ids(DraftTokenIds(["a"], [[9, 10, 11]]))
    finished = _run(sched, sched.schedule(), {"a": [9, 10, 11, 12]})
    assert [r.request_id for r in finished] == ["a"] and finished[0].output_token_ids == [8, 9]
    assert finished[0].is_finished and not sched.has_unfinished_requests()
    assert sched.requests == {}  # freed at once, as in vLLM
    sched.update_draft_token_ids(DraftTokenIds(["a"], [[1, 2, 3]]))  # late drafts of a freed request: dropped
    assert sched.requests == {}
    assert sched.schedule().finished_req_ids == {"a"}  # the runner hears of it in the next step
    assert sched.schedule().finished_req_ids == set()


def test_a_finished_request_id_can_be_used_again():
    sched = _sched()
    sched.add_request(Request("a", [5, 6], SamplingParams(max_tokens=1)))
    assert [r.request_id for r in _run(sched, sched.schedule(), {"a": [8]})] == ["a"]
    sched.add_request(Request("a", [7], SamplingParams(max_tokens=2)))
    out = sched.schedule()
    assert out.finished_req_ids == {"a"} and [r.req_id for r in out.scheduled_new_reqs] == ["a"]
    assert sched.requests["a"].prompt_token_ids == [7]


def test_token_budget_chunks_prefills_and_stops_before_an_unpadded_new_decode():
    sched = _sched(max_num_batched_tokens=5)
    sched.add_request(Request("a", list(range(8)), SamplingParams()))
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 5}
    _run(sched, out, {})  # partial prefill: nothing sampled
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 3}
    sched2 = _sched(max_num_batched_tokens=6)
    sched2.add_request(Request("x", [1, 2, 3], SamplingParams(), num_computed_tokens=2))
    sched2.add_request(Request("y", [1, 2, 3], SamplingParams(), num_computed_tokens=2))
    out = sched2.schedule()  # x takes 4 tokens; y would need 4 more but only 2 are left: not scheduled
    assert out.num_scheduled_tokens == {"x": 4}


def test_stats_keep_placeholders_apart():
    stats = SpecDecodingStats(num_spec_tokens=3)
    stats.observe(num_slots=3, num_placeholders=2, num_accepted=2)  # 1 real draft accepted + 1 zero slot
    stats.observe(num_slots=3, num_placeholders=3, num_accepted=0)  # a padded new decode
    stats.observe(num_slots=3, num_placeholders=0, num_accepted=3)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (2, 4, 4)
    assert (stats.num_placeholder_slots, stats.num_placeholders_accepted) == (5, 1)
    assert stats.acceptance_rate == 1.0 and stats.mean_acceptance_length == 1 + 4 / 2
    assert stats.acceptance_rate_per_pos == [1.0, 1.0, 1.0]


def _snapshot(sched):
    return copy.deepcopy(
        (
            sched.requests,
            [r.request_id for r in sched.waiting],
            [r.request_id for r in sched.running],
            sched.spec_decoding_stats,
        )
    )


@pytest.mark.parametrize(
    "make, error, word",
    [
        (lambda: Request("b", [VOCAB], SamplingParams()), ValueError, f"got {VOCAB}"),  # id >= vocab size
        # a placeholder is not a prompt token
        (lambda: Request("b", [-1, 2], SamplingParams()), ValueError, r"prompt_token_ids must lie in \[0,"),
        (lambda: Request("b", torch.tensor([1.0, 2.0]), SamplingParams()), TypeError, "signed integers"),
        (lambda: Request("b", torch.tensor([1, 2], dtype=torch.uint8), SamplingParams()), TypeError, "uint8"),
        (lambda: Request("b", [], SamplingParams()), ValueError, "prompt_token_ids is empty"),
        (lambda: Request("a", [1], SamplingParams()), ValueError, "request_id 'a' is already in the sched"),
        (lambda: Request("b", [1] * 250, SamplingParams(max_tokens=10)), ValueError, "exceeds max_model_len"),
        (
            lambda: Request("b", [1, 2], SamplingParams(), num_computed_tokens=2),
            ValueError,
            r"num_computed_tokens must lie in \[0, 2\)",
        ),
        (
            lambda: Request("b", [1, 2], SamplingParams(), num_computed_tokens=1.5),
            TypeError,
            "num_computed_tokens must be an int, got 1.5",
        ),
        (lambda: Request("b", [1, 2], SamplingParams(), num_computed_tokens=True), TypeError, "got True"),
        (lambda: Request(5, [1, 2], SamplingParams()), TypeError, "request_id must be a non-empty str, got"),
        (lambda: Request("", [1, 2], SamplingParams()), TypeError, "request_id must be a non-empty str"),
        (lambda: Request("b", [1, 2], {"temperature": 1.0}), TypeError, "sampling_params must be a Sampl"),
        (lambda: Request("b", [1, 2], SamplingParams(), output_token_ids=[3]), ValueError, "'b' is not new"),
        (lambda: Request("b", [1, 2], SamplingParams(), spec_token_ids=[-5]), ValueError, "'b' is not new"),
    ],
)
def test_bad_requests_leave_the_scheduler_unchanged(make, error, word):
    sched = _sched()
    _decoding(sched, max_tokens=3)
    before = _snapshot(sched)
    with pytest.raises(error, match=word):
        sched.add_request(make())
    assert _snapshot(sched) == before


def test_bad_drafts_leave_the_scheduler_unchanged():
    sched = _sched()
    _decoding(sched)
    before = _snapshot(sched)
    with pytest.raises(ValueError, match="vocab_size"):
        sched.update_draft_token_ids(DraftTokenIds(["a"], [[1, VOCAB]]))
    with pytest.raises(ValueError, match="req_ids"):
        sched.update_draft_token_ids(DraftTokenIds(["a"], [[1], [2]]))
    with pytest.raises(ValueError, match=r"draft_token_ids\[0\] must lie in \[0, vocab_size=512\), got -1"):
        sched.update_draft_token_ids(DraftTokenIds(["a"], [[1, -1]]))  # drafters never propose -1
    assert _snapshot(sched) == before


@pytest.mark.parametrize(
    "k, error", [(0, ValueError), (MAX_SPEC_LEN + 1, ValueError), (2.0, TypeError), (True, TypeError)]
)
def test_bad_k_is_refused(k, error):
    with pytest.raises(error, match="num_speculative_tokens"):
        _sched(k=k)


@pytest.mark.parametrize(
    "kwargs, error, word",
    [
        (dict(temperature=-0.5), ValueError, "temperature must be >= 0"),
        (dict(temperature=float("nan")), TypeError, "temperature must be a finite number"),
        (dict(temperature=float("inf")), TypeError, "temperature must be a finite number"),
        (dict(max_tokens=0), ValueError, "max_tokens"),
        (dict(seed=1.5), TypeError, "seed must be an int"),
        (dict(seed=2**64), ValueError, r"seed must fit in an int64.*got 18446744073709551616"),
        (dict(seed=2**63), ValueError, "seed must fit in an int64"),
        (dict(seed=2**70), ValueError, "seed must fit in an int64"),
        (dict(seed=-(2**63) - 1), ValueError, "seed must fit in an int64"),
    ],
)
def test_bad_sampling_params_are_refused_by_name(kwargs, error, word):
    with pytest.raises(error, match=word):
        SamplingParams(**kwargs)


def test_sampling_params_follow_vllm_defaults_and_temperature_rules():
    """vLLM 0.33's SamplingParams: every 0 < T < 0.01 is raised to 0.01 (below its _SAMPLING_EPS too), so only
    T == 0 is greedy; T must lie in [0, 2]; seed -1 means no seed."""
    assert SamplingParams().temperature == 1.0 and not SamplingParams().is_greedy  # vLLM's default
    assert SamplingParams(temperature=0.0).is_greedy
    for t in (1e-45, 1e-40, 1e-7, 9.99e-6, 1e-5, 0.005):
        with pytest.warns(UserWarning, match="raised to 0.01"):  # vLLM's _MAX_TEMP
            low = SamplingParams(temperature=t)
        assert low.temperature == 0.01 and not low.is_greedy, t
    assert SamplingParams(temperature=0.01).temperature == 0.01
    assert SamplingParams(temperature=2.0).temperature == 2.0
    with pytest.raises(ValueError, match=r"temperature must be in \[0, 2\]"):
        SamplingParams(temperature=2.01)
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=-2).seed == -2
    for seed in (2**63 - 1, -(2**63), 0):  # the int64 extremes are fine
        assert SamplingParams(seed=seed).seed == seed


def test_bad_scheduler_settings_are_refused():
    with pytest.raises(ValueError, match="placeholder_policy"):
        _sched(placeholder_policy="nan")
    with pytest.raises(ValueError, match="1 \\+ k"):
        _sched(k=4, max_num_batched_tokens=4)


def test_a_bad_sampled_id_leaves_every_request_unchanged():
    sched = _sched()
    for req_id in ("a", "b"):
        sched.add_request(Request(req_id, [5, 6], SamplingParams()))
    out = sched.schedule()
    before = _snapshot(sched)
    with pytest.raises(ValueError, match="sampled_token_ids of 'b'"):
        _run(sched, out, {"a": [8], "b": [VOCAB]})  # "a" is fine, "b" is out of range
    assert _snapshot(sched) == before


@pytest.mark.parametrize("cls", [Scheduler, AsyncScheduler])
def test_an_output_that_does_not_match_the_step_is_refused_and_changes_nothing(cls):
    """More ids than ``1 + drafts`` for a request, or a step's output delivered a second time, is refused
    by name before any request changes (both used to be appended to the request's output)."""
    sched = cls(vocab_size=VOCAB, num_spec_tokens=3)
    sched.add_request(Request("a", [5, 6, 7], SamplingParams(max_tokens=10), num_computed_tokens=2))
    out = sched.schedule()  # one token left: 1 + 3 tokens with drafts [-1] * 3
    assert out.scheduled_spec_decode_tokens == {"a": [-1, -1, -1]}
    before = copy.deepcopy(vars(sched))
    with pytest.raises(ValueError, match=r"sampled_token_ids of 'a' has 5 ids.*at most 1 \+ 3 = 4"):
        _run(sched, out, {"a": [8, 9, 10, 11, 12]})
    assert vars(sched) == before
    _run(sched, out, {"a": [8]})
    delivered = copy.deepcopy(vars(sched))
    with pytest.raises(ValueError, match=r"scheduler_output \(step_id 0\) is not .* delivered already"):
        _run(sched, out, {"a": [8]})
    assert vars(sched) == delivered
    other = cls(vocab_size=VOCAB, num_spec_tokens=3)
    other.add_request(Request("a", [5, 6, 7], SamplingParams(max_tokens=10)))
    with pytest.raises(ValueError, match="another scheduler made it"):
        _run(other, out, {"a": [8]})


# -- prefix caching: where a single node makes placeholders ------------------------------------------------


@pytest.mark.parametrize(
    "length, cached, padded",
    [
        (9, 8, True),  # one more than two blocks of 4: the cache holds all but the last token
        (10, 8, False),  # two tokens left: a prefill, not a decode
        (8, 4, False),  # a whole number of blocks: the last block holds the last token, to be computed
    ],
)
def test_a_repeated_prompt_starts_from_its_cached_blocks(length, cached, padded):
    sched = _sched(enable_prefix_caching=True, block_size=4)
    prompt = list(range(20, 20 + length))
    _decoding(sched, "first", prompt, max_tokens=1)  # finished: its blocks cached
    sched.add_request(Request("again", list(prompt), SamplingParams()))
    out = sched.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == cached
    assert out.num_scheduled_tokens["again"] == (4 if padded else length - cached)
    assert out.scheduled_spec_decode_tokens.get("again") == ([-1, -1, -1] if padded else None)


def test_a_block_matches_only_behind_the_same_prefix():
    sched = _sched(enable_prefix_caching=True, block_size=4)
    _decoding(sched, "first", [1, 2, 3, 4, 5, 6, 7, 8, 9], max_tokens=1)
    sched.add_request(Request("other", [0, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams()))  # only block 2 equal
    out = sched.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0
    assert out.num_scheduled_tokens["other"] == 9


def test_prefix_caching_is_off_by_default_and_checked():
    sched = _sched(block_size=4)
    _decoding(sched, "first", list(range(9)), max_tokens=1)
    sched.add_request(Request("again", list(range(9)), SamplingParams()))
    assert sched.schedule().num_scheduled_tokens["again"] == 9
    with pytest.raises(TypeError, match="enable_prefix_caching must be a bool"):
        _sched(enable_prefix_caching=1)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        _sched(block_size=0)


def test_blocks_are_cached_from_committed_tokens_only():
    """A decode's drafts are scheduled, not committed: their block is not cached (vLLM caps at num_tokens)."""
    sched = _sched(enable_prefix_caching=True, block_size=4)
    sched.add_request(Request("a", [1, 2, 3], SamplingParams(max_tokens=8)))
    _run(sched, sched.schedule(), {"a": [4]})
    sched.update_draft_token_ids(DraftTokenIds(["a"], [[5, 6, 7]]))
    sched.schedule()  # 4 tokens scheduled from position 3: [4, 5, 6, 7], only token 4 is committed
    assert sched.cached_block_hashes == set(sched.block_hashes([1, 2, 3, 4]))
    assert sched.block_hashes([1, 2, 3, 4, 5]) == sched.block_hashes([1, 2, 3, 4])
