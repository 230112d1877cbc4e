"""One bad request or one failing step never breaks the engine.

Faults are injected inside a step (a raising model forward, NaN logits, a raising sampler, a raising or
garbage-proposing drafter, an interrupt) into one engine, while a twin engine gets the same requests and
steps without faults. A failed step must leave the faulty engine exactly as it was, and from then on the
two engines must agree on every request, token for token, under synchronous and async scheduling. A
hypothesis state machine interleaves requests (seeded random and greedy), bad requests, reused ids,
steps and failing steps; the tests before it pin single cases by hand.
"""

import copy
import re

import pytest
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from specfix.models import load_models
from specfix.v1.engine import LLMEngine, SamplingParams

MODELS = load_models("cpu")
VOCAB = MODELS[0].vocab_size
PROMPTS = ["the fox saw the crow", "a lion was asleep", "the north wind", "the mice"]


class InjectedFault(RuntimeError):
    pass


class Saboteur:
    """Arms one fault at a time; the part that reaches the armed point raises (once)."""

    def __init__(self):
        self.armed = None

    def fire(self, point: str) -> bool:
        if self.armed != point:
            return False
        self.armed = None
        return True


class SabotagedModel:
    def __init__(self, model, saboteur):
        self.model, self.saboteur = model, saboteur

    def __call__(self, *args):
        if self.saboteur.fire("model"):
            raise InjectedFault("injected: the model forward failed")
        logits = self.model(*args)
        return torch.full_like(logits, float("nan")) if self.saboteur.fire("nan_logits") else logits


class SabotagedSampler:
    def __init__(self, sampler, saboteur):
        self.sampler, self.saboteur = sampler, saboteur

    def __call__(self, *args):
        if self.saboteur.fire("sampler"):
            raise InjectedFault("injected: the rejection sampler failed")
        return self.sampler(*args)


class SabotagedDrafter:
    def __init__(self, drafter, saboteur):
        self.drafter, self.saboteur, self.k = drafter, saboteur, drafter.k

    def propose_batch(self, histories):
        if histories and self.saboteur.fire("drafter"):
            raise InjectedFault("injected: the drafter failed")
        if histories and self.saboteur.fire("interrupt"):
            raise KeyboardInterrupt  # a user stopping a notebook cell mid-step
        drafts = self.drafter.propose_batch(histories)
        if histories and self.saboteur.fire("garbage"):
            return [[VOCAB] * self.k for _ in histories]
        return drafts


#: fault -> what the step raises: (type, message)
FAULTS = {
    "model": (InjectedFault, "the model forward failed"),
    "nan_logits": (ValueError, "logits must be free of NaN"),
    "sampler": (InjectedFault, "the rejection sampler failed"),
    "drafter": (InjectedFault, "the drafter failed"),
    # caught after the sampled tokens were committed, before the drafts are kept anywhere
    "garbage": (ValueError, r"draft_token_ids\[0\] must lie in \[0, vocab_size="),
    "interrupt": (KeyboardInterrupt, "^$"),
}


def engine(saboteur=None, **kw):
    kw = {
        "num_speculative_tokens": 3,
        "models": MODELS,
        "sampler_backend": "torch",
        "max_num_seqs": 4,
        "max_num_batched_tokens": 32,
        "max_model_len": 64,
        **kw,
    }
    e = LLMEngine(**kw)
    if saboteur is not None:
        runner = e.model_runner
        runner.model = SabotagedModel(runner.model, saboteur)
        runner.rejection_sampler = SabotagedSampler(runner.rejection_sampler, saboteur)
        runner.drafter = SabotagedDrafter(runner.drafter, saboteur)
    return e


def state(e: LLMEngine) -> dict:
    """Everything a step may change, as plain values (the global RNG state apart: see ``full_state``)."""
    s, r = e.scheduler, e.model_runner
    batch = r.input_batch
    drafts = r._draft_token_ids
    return {
        "requests": {
            i: (q.prompt_token_ids, q.output_token_ids, q.num_computed_tokens, q.spec_token_ids, q.status)
            for i, q in s.requests.items()
        },
        "queues": ([q.request_id for q in s.waiting], [q.request_id for q in s.running], s.finished_req_ids),
        "stats": copy.deepcopy(vars(s.spec_decoding_stats)),
        "runner": {
            i: (
                q.output_token_ids,
                q.num_computed_tokens,
                q.prev_num_draft_len,
                None if q.generator is None else q.generator.get_state().tolist(),
            )
            for i, q in r.requests.items()
        },
        "rows": (
            dict(batch.req_id_to_index),
            batch.token_ids_cpu.tolist(),
            batch.num_tokens_no_spec.tolist(),
            batch.num_computed_tokens_cpu.tolist(),
            batch.spec_token_ids,
        ),
        "kv_cache": r.kv_cache.tolist(),
        "pending_drafts": None if drafts is None else (drafts.req_ids, drafts.draft_token_ids),
        "engine": (e._prompts, e._next_id, e.num_steps),
        "trace": len(r.trace),
    }


def full_state(e: LLMEngine) -> dict:
    return {**copy.deepcopy(state(e)), "global_rng": torch.get_rng_state().tolist()}


def outputs(step_outputs):
    return [(o.request_id, o.token_ids, o.text, o.finished) for o in step_outputs]


def add_both(engines, i, prompt, temperature, seed, max_tokens=8, remote=False):
    params = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens)
    for e in engines:
        e.add_request(prompt, params, request_id=f"r{i}", remote_prefill=remote)


# -- single cases, by hand ---------------------------------------------------------------------------------


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_failed_step_changes_nothing_and_the_engine_goes_on(fault, async_scheduling):
    saboteur = Saboteur()
    kw = {"record": True, "async_scheduling": async_scheduling}
    faulty, clean = engine(saboteur, **kw), engine(**kw)
    for i, prompt in enumerate(PROMPTS):
        add_both((faulty, clean), i, prompt, [0.0, 0.8, 1.0, 0.6][i], seed=i, remote=i % 2 == 0)
    for _ in range(2):
        assert outputs(faulty.step()) == outputs(clean.step())
    before = full_state(faulty)
    saboteur.armed = fault
    error, word = FAULTS[fault]
    with pytest.raises(error, match=word):
        faulty.step()
    assert saboteur.armed is None, "the fault was reached"
    assert full_state(faulty) == before
    while clean.has_unfinished_requests():
        assert outputs(faulty.step()) == outputs(clean.step())
    assert not faulty.has_unfinished_requests() and state(faulty) == state(clean)


def test_the_seed_that_used_to_break_the_engine_is_refused_up_front():
    """``seed=2**64`` used to pass, then fail inside the next step after the scheduler had moved, leaving
    every later step to raise KeyError. Now it never gets in, and a running request is untouched."""
    e = engine()
    e.add_request(PROMPTS[0], SamplingParams(temperature=0.8, seed=1, max_tokens=6))
    e.step()
    before = full_state(e)
    with pytest.raises(ValueError, match="seed must fit in an int64"):
        e.add_request(PROMPTS[1], SamplingParams(temperature=0.8, seed=2**64))
    assert full_state(e) == before
    while e.has_unfinished_requests():
        e.step()


# -- the state machine -------------------------------------------------------------------------------------

BAD_REQUESTS = [  # (prompt, sampling params as kwargs, add_request kwargs, error, message)
    ([0, VOCAB], {}, {}, ValueError, r"prompt_token_ids must lie in \[0, vocab_size="),
    ([], {}, {}, ValueError, "prompt_token_ids is empty"),
    ("the fox " * 40, {}, {}, ValueError, "exceeds max_model_len=64"),
    ("the fox", {"seed": 2**64}, {}, ValueError, "seed must fit in an int64"),
    ("the fox", {"seed": -(2**63) - 1}, {}, ValueError, "seed must fit in an int64"),
    ("the fox", {"temperature": float("nan")}, {}, TypeError, "temperature must be a finite number"),
    ("the fox", {"temperature": -1.0}, {}, ValueError, "temperature must be >= 0"),
    ("the fox", {"max_tokens": 0}, {}, ValueError, "max_tokens must be an int >= 1"),
    ("the fox", {}, {"request_id": 7}, TypeError, "request_id must be a non-empty str"),
    ("the fox", {}, {"remote_prefill": "yes"}, TypeError, "remote_prefill must be a bool"),
]

requests = st.tuples(
    st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
    st.builds(
        SamplingParams,
        temperature=st.sampled_from([0.0, 1e-40, 0.6, 1.0]),
        seed=st.integers(-(2**63), 2**63 - 1),
        max_tokens=st.integers(1, 6),
    ),
    st.booleans(),
)  # (prompt, params, remote prefill)


class EngineUnderFaults(RuleBasedStateMachine):
    """A faulty engine and a clean twin, fed the same requests and steps."""

    @initialize(
        scheduling=st.sampled_from(["sync/draft_model", "sync/ngram", "async/draft_model"]),
        k=st.integers(1, 4),
        budget=st.integers(5, 24),
    )
    def start(self, scheduling, k, budget):
        self.saboteur = Saboteur()
        mode, proposer = scheduling.split("/")
        kw = {
            "num_speculative_tokens": k,
            "proposer": proposer,
            "max_num_batched_tokens": budget,
            "async_scheduling": mode == "async",
        }
        self.faulty, self.clean = engine(self.saboteur, **kw), engine(**kw)
        self.num_added, self.finished_ids = 0, []

    def live_ids(self):
        return list(self.clean.scheduler.requests)

    @rule(request=requests, reuse=st.booleans())
    def add_request(self, request, reuse):
        free = [i for i in self.finished_ids if i not in self.live_ids()]
        request_id = free[0] if reuse and free else f"r{self.num_added}"
        if request_id in free:
            event("a finished request's id used again")
        self.num_added += 1
        prompt, params, remote = request
        for e in (self.faulty, self.clean):
            assert e.add_request(prompt, params, request_id=request_id, remote_prefill=remote) == request_id

    @rule(bad=st.sampled_from(BAD_REQUESTS))
    def add_bad_request(self, bad):
        prompt, params, kwargs, error, word = bad
        before = full_state(self.faulty)
        with pytest.raises(error, match=word):
            self.faulty.add_request(prompt, SamplingParams(**params), **kwargs)
        assert full_state(self.faulty) == before

    @rule(pick=st.integers(0, 3))
    def add_a_live_id_again(self, pick):
        if not self.live_ids():
            return
        request_id = self.live_ids()[pick % len(self.live_ids())]
        before = full_state(self.faulty)
        with pytest.raises(ValueError, match=f"request_id '{request_id}' is already in the scheduler"):
            self.faulty.add_request("the fox", SamplingParams(), request_id=request_id)
        assert full_state(self.faulty) == before

    def _step_both(self):
        done = outputs(self.faulty.step())
        assert done == outputs(self.clean.step())
        self.finished_ids += [request_id for request_id, *_ in done]
        if done:
            event("a step finished a request")

    @rule(times=st.integers(1, 3))
    def step(self, times):
        for _ in range(times):
            self._step_both()

    @rule()
    def run_until_idle(self):
        while self.clean.has_unfinished_requests():
            self._step_both()
        assert not self.faulty.has_unfinished_requests()

    @rule(fault=st.sampled_from(list(FAULTS)), request=requests)
    def failing_step(self, fault, request):
        if not self.live_ids():  # an idle engine would reach no fault: give it work first
            self.add_request(request, reuse=False)
        before = full_state(self.faulty)
        self.saboteur.armed = fault
        error, word = FAULTS[fault]
        try:
            done = outputs(self.faulty.step())
        except error as raised:
            event(f"failed step: {fault}")
            assert self.saboteur.armed is None, f"{fault} was armed, but {raised!r} came from elsewhere"
            assert re.search(word, str(raised)), raised
            assert full_state(self.faulty) == before
            return
        # the step never reached the armed point (nothing was scheduled there): it was a plain step
        event(f"fault not reached: {fault}")
        assert self.saboteur.armed == fault
        self.saboteur.armed = None
        assert done == outputs(self.clean.step())
        self.finished_ids += [request_id for request_id, *_ in done]

    @invariant()
    def the_twins_agree(self):
        assert state(self.faulty) == state(self.clean)


EngineUnderFaults.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=25,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestEngineUnderFaults = EngineUnderFaults.TestCase
# hypothesis draws temperatures next to zero: the engine raises them with a warning, as vLLM 0.33 does
pytestmark = pytest.mark.filterwarnings("ignore:temperature .* is below 0.01:UserWarning")
