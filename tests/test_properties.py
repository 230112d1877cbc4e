"""Property tests over random schedules: batch sizes, prompt lengths, k, drafters, token budgets, which
requests arrive prefilled (and so where -1 placeholders appear).

With every fix on: no negative id ever reaches the embedding, no -1 reaches any output, and greedy
speculative decoding equals plain greedy decoding token for token. With the clamp off, the same schedules
crash whenever a placeholder was scheduled.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfix.fixes import Fixes
from specfix.models import load_models
from specfix.v1.engine import SamplingParams, generate

MODELS = load_models("cpu")
VOCAB = MODELS[0].vocab_size
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 4))
    k = draw(st.integers(1, 4))
    return dict(
        prompts=[draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)) for _ in range(n)],
        remote_prefill=[draw(st.booleans()) for _ in range(n)],
        max_tokens=[draw(st.integers(1, 8)) for _ in range(n)],
        k=k,
        proposer=draw(st.sampled_from(["draft_model", "ngram"])),
        max_num_batched_tokens=draw(st.integers(k + 1, 24)),
    )


class EmbeddingWatch:
    """Records every id the target's embedding is asked to look up."""

    def __enter__(self):
        self.seen = []
        self.handle = MODELS[0].embed_tokens.register_forward_pre_hook(
            lambda module, args: self.seen.append(args[0].detach().clone())
        )
        return self

    def __exit__(self, *exc):
        self.handle.remove()

    @property
    def min_id(self):
        return min(int(t.min()) for t in self.seen)


def _run(s, temperatures, fixes=None):
    params = [
        SamplingParams(temperature=t, seed=i, max_tokens=m)
        for i, (t, m) in enumerate(zip(temperatures, s["max_tokens"], strict=True))
    ]
    return generate(
        s["prompts"],
        params,
        num_speculative_tokens=s["k"],
        proposer=s["proposer"],
        remote_prefill=s["remote_prefill"],
        max_num_batched_tokens=s["max_num_batched_tokens"],
        fixes=fixes or Fixes(),
        models=MODELS,
        sampler_backend="torch",
        record=True,
    )


def _reference(prompt, max_tokens):
    seq = list(prompt)
    for _ in range(max_tokens):
        seq.append(int(MODELS[0].score(seq)[-1].argmax()))
    return seq[len(prompt) :]


def _placeholders_scheduled(result):
    return any(
        -1 in spec
        for step in result.trace
        for spec in step.scheduler_output.scheduled_spec_decode_tokens.values()
    )


@SETTINGS
@given(schedules())
def test_greedy_speculative_decoding_is_plain_greedy_decoding(s):
    with EmbeddingWatch() as watch:
        result = _run(s, [0.0] * len(s["prompts"]))
    assert watch.min_id >= 0
    for out, prompt, m in zip(result.outputs, s["prompts"], s["max_tokens"], strict=True):
        assert out.token_ids == _reference(prompt, m)
        assert "<-1>" not in out.text
    assert result.stats.num_placeholders_accepted == 0


@SETTINGS
@given(schedules(), st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=4, max_size=4))
def test_random_sampling_never_lets_a_placeholder_through(s, temps):
    with EmbeddingWatch() as watch:
        result = _run(s, temps[: len(s["prompts"])])
    assert watch.min_id >= 0
    for out, m in zip(result.outputs, s["max_tokens"], strict=True):
        assert len(out.token_ids) == m and all(0 <= t < VOCAB for t in out.token_ids)
        assert "<-1>" not in out.text
    for step in result.trace:  # every sampler row is a -1-free prefix followed by -1s
        for row in step.sampler_output.tolist():
            n = row.index(-1) if -1 in row else len(row)
            assert all(t == -1 for t in row[n:]) and n >= 1
    assert result.stats.num_placeholders_accepted == 0


@SETTINGS
@given(schedules())
def test_without_the_clamp_every_scheduled_placeholder_crashes(s):
    probe = _run(s, [0.0] * len(s["prompts"]))  # same schedule, fixes on: were placeholders scheduled?
    if _placeholders_scheduled(probe):
        with pytest.raises(IndexError, match="index out of range"):
            _run(s, [0.0] * len(s["prompts"]), fixes=Fixes(clamp_placeholders=False))
    else:
        _run(s, [0.0] * len(s["prompts"]), fixes=Fixes(clamp_placeholders=False))


def test_some_schedules_do_carry_placeholders():
    """Guards the property tests against a generator that never produces a -1."""
    s = dict(
        prompts=[[4, 0, 17]],
        remote_prefill=[True],
        max_tokens=[3],
        k=2,
        proposer="ngram",
        max_num_batched_tokens=8,
    )
    assert _placeholders_scheduled(_run(s, [0.0]))
