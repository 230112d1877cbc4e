"""The engine end to end: readable text, greedy speculative == plain greedy, seeds, and each fix switched
off re-creating its bug; the zero-placeholder alternative measured; bad input refused."""

import copy

import pytest
import torch

from specfix.fixes import Fixes
from specfix.lab.placeholder_lifecycle import story_prompts
from specfix.models import load_models
from specfix.tokenizer import get_tokenizer
from specfix.v1.engine import LLMEngine, SamplingParams, generate, run_demo

PROMPTS = story_prompts(6)  # chapter 1's story openings
MODELS = load_models("cpu")


def greedy_reference(prompt_ids, max_tokens):
    """Plain greedy decoding, one token at a time, every step recomputed from scratch."""
    target = MODELS[0]
    seq = list(prompt_ids)
    for _ in range(max_tokens):
        seq.append(int(target.score(seq)[-1].argmax()))
    return seq[len(prompt_ids) :]


def holes(trace):
    """Sampler rows where a -1 is followed by a real token: a placeholder slot was accepted."""
    count = 0
    for step in trace:
        for row in step.sampler_output.tolist():
            first_gap = row.index(-1) if -1 in row else len(row)
            count += any(t != -1 for t in row[first_gap:])
    return count


def test_generate_gives_readable_text():
    result = generate(
        PROMPTS,
        SamplingParams(temperature=0.8, seed=3, max_tokens=12),
        models=MODELS,
        sampler_backend="torch",
        remote_prefill=[True, False] * 3,
    )
    tok = get_tokenizer()
    for out in result.outputs:
        assert len(out.token_ids) == 12 and all(0 <= t < tok.vocab_size for t in out.token_ids)
        assert out.text == tok.decode(out.token_ids) and "<-" not in out.text
    assert result.stats.num_placeholder_slots >= 3 * 3  # three padded new decodes


@pytest.mark.parametrize("proposer", ["draft_model", "ngram"])
def test_greedy_speculative_equals_plain_greedy(proposer):
    remote = [True, False, True, False, False, True]
    kw = dict(models=MODELS, sampler_backend="torch", remote_prefill=remote)
    params = SamplingParams(temperature=0.0, max_tokens=15)
    spec = generate(PROMPTS, params, num_speculative_tokens=3, proposer=proposer, **kw)
    plain = generate(PROMPTS, params, num_speculative_tokens=None, **kw)
    tok = get_tokenizer()
    for s, p, prompt in zip(spec.outputs, plain.outputs, PROMPTS, strict=True):
        assert s.token_ids == p.token_ids == greedy_reference(tok.encode(prompt), 15)
    assert spec.stats.num_accepted_tokens > 0


def test_triton_kernels_and_torch_reference_agree_in_the_engine():
    params = [SamplingParams(temperature=t, seed=i, max_tokens=10) for i, t in enumerate([0, 0.7, 1.0])]
    runs = [
        generate(PROMPTS[:3], params, models=MODELS, sampler_backend=b, remote_prefill=True)
        for b in ("auto", "torch")
    ]
    assert [o.token_ids for o in runs[0].outputs] == [o.token_ids for o in runs[1].outputs]


def test_seeded_requests_are_reproducible_and_batch_independent():
    params = SamplingParams(temperature=0.9, seed=11, max_tokens=14)
    kw = dict(models=MODELS, sampler_backend="torch")
    alone = generate(PROMPTS[:1], params, **kw).outputs[0].token_ids
    again = generate(PROMPTS[:1], params, **kw).outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, seed=i, max_tokens=9) for i in range(5)]
    crowd = generate(PROMPTS, [params, *others], **kw).outputs[0].token_ids
    assert alone == again == crowd


@pytest.mark.filterwarnings("ignore:temperature .* raised to 0.01")
def test_a_vanishing_temperature_samples_at_0_01():
    """As vLLM 0.33: every temperature in (0, 0.01) is raised to 0.01, so a subnormal one (which used to
    turn the softmax NaN and every token into 0) samples exactly as 0.01 does; only 0 is greedy."""
    kw = dict(models=MODELS, sampler_backend="torch", remote_prefill=[True, False] * 3)
    at_floor = generate(PROMPTS, SamplingParams(temperature=0.01, seed=4, max_tokens=10), **kw)
    want = [o.token_ids for o in at_floor.outputs]
    assert len({t for ids in want for t in ids}) > 5
    for t in (1e-45, 1e-40, 1e-38, 9e-6):
        tiny = generate(PROMPTS, SamplingParams(temperature=t, seed=4, max_tokens=10), **kw)
        assert [o.token_ids for o in tiny.outputs] == want, t


def test_seeds_at_the_int64_limits_run():
    params = [SamplingParams(temperature=0.9, seed=s, max_tokens=6) for s in (2**63 - 1, -(2**63))]
    out = generate(PROMPTS[:2], params, models=MODELS, sampler_backend="torch").outputs
    assert [len(o.token_ids) for o in out] == [6, 6]


def test_without_the_clamp_the_embedding_raises():
    with pytest.raises(IndexError, match="index out of range in self"):
        run_demo(Fixes(clamp_placeholders=False), device="cpu", steps=2)
    assert run_demo(Fixes(), device="cpu", steps=2).num_steps == 2


def _joining_run(fixes, async_scheduling):
    """Four requests decode (temperature 1) while a prefilled (P/D) request joins at every step: each
    newcomer's first decode is padded with [-1] * 3, right after a decoding request's real draft rows."""
    engine = LLMEngine(
        fixes=fixes,
        models=MODELS,
        sampler_backend="torch",
        record=True,
        max_num_seqs=64,
        async_scheduling=async_scheduling,
    )
    prompts = PROMPTS * 7
    for i in range(4):
        engine.add_request(prompts[i], SamplingParams(temperature=1.0, seed=100 + i, max_tokens=60))
    for i, prompt in enumerate(prompts[4:]):
        engine.add_request(prompt, SamplingParams(temperature=1.0, seed=i, max_tokens=3), remote_prefill=True)
        engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    return engine


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_without_reject_negative_drafts_placeholders_get_accepted(async_scheduling):
    """Before PR #46533 a -1 draft read column V-1 ('.') of the previous row and passed when that
    probability beat u: the sampler row then has a -1 *inside* its accepted prefix."""
    assert holes(_joining_run(Fixes(reject_negative_drafts=False), async_scheduling).model_runner.trace) > 0
    assert holes(_joining_run(Fixes(), async_scheduling).model_runner.trace) == 0


def test_zero_placeholders_are_accepted_when_the_target_picks_token_zero():
    kw = dict(models=MODELS, sampler_backend="torch", proposer="ngram", remote_prefill=True, record=True)
    params = SamplingParams(temperature=0.0, max_tokens=30)
    zero = generate(PROMPTS, params, placeholder_policy="zero", **kw)
    minus = generate(PROMPTS, params, **kw)
    accepted_zero_slots, emitted = 0, []
    for step in zero.trace:
        md, so = step.spec_decode_metadata, step.scheduler_output
        if md is None:
            continue
        for i, req_id in enumerate(step.req_ids):
            slots = so.scheduled_spec_decode_tokens.get(req_id, [])
            real = len(slots) - so.num_placeholder_spec_tokens.get(req_id, 0)
            out = step.sampler_output[i].tolist()
            for j in range(real, len(slots)):
                if out[j + 1] != -1:  # slot j was accepted (the next column was reached)
                    accepted_zero_slots += 1
                    emitted.append(out[j])
    assert accepted_zero_slots == zero.stats.num_placeholders_accepted > 0
    assert set(emitted) == {0}  # accepted exactly when the target's own choice was token 0, "the"
    assert minus.stats.num_placeholders_accepted == 0
    # greedy: a zero slot is accepted only when it equals the argmax, so the text is the same
    assert [o.token_ids for o in zero.outputs] == [o.token_ids for o in minus.outputs]


def test_finished_requests_are_freed_and_their_ids_can_be_used_again():
    engine = LLMEngine(models=MODELS, sampler_backend="torch")
    for i in range(200):
        engine.add_request(
            PROMPTS[i % len(PROMPTS)], SamplingParams(temperature=0.0, max_tokens=2), request_id=f"q{i}"
        )
    done = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step())
    assert sorted(done) == sorted(f"q{i}" for i in range(200)) and all(o.finished for o in done.values())
    assert engine.scheduler.requests == {} and engine._prompts == {}  # as in vLLM: gone when finished
    engine.step()  # the runner frees its rows when the next step tells it which requests finished
    assert engine.model_runner.requests == {} and engine.model_runner.input_batch.req_id_to_index == {}
    first = done["q3"]
    engine.add_request("a lion was asleep", SamplingParams(temperature=0.0, max_tokens=5), request_id="q3")
    again = [o for _ in range(10) for o in engine.step()]
    assert [o.request_id for o in again] == ["q3"] and again[0].prompt == "a lion was asleep" != first.prompt
    assert len(again[0].token_ids) == 5


def test_automatic_ids_skip_the_ids_in_use():
    engine = LLMEngine(models=MODELS, sampler_backend="torch")
    assert engine.add_request("the fox", SamplingParams(), request_id="1") == "1"
    assert [engine.add_request("the fox", SamplingParams()) for _ in range(3)] == ["0", "2", "3"]
    with pytest.raises(TypeError, match="request_id must be a non-empty str, got 5"):
        engine.add_request("the fox", SamplingParams(), request_id=5)
    with pytest.raises(ValueError, match="request_id '2' is already in the scheduler"):
        engine.add_request("the fox", SamplingParams(), request_id="2")
    assert engine.get_output("2").token_ids == [] and not engine.get_output("2").finished
    with pytest.raises(KeyError, match="'9' is not an unfinished request"):
        engine.get_output("9")


def _engine_snapshot(engine):
    s = engine.scheduler
    return copy.deepcopy(
        (
            s.requests,
            [r.request_id for r in s.waiting],
            engine.model_runner.requests,
            engine.model_runner.input_batch.token_ids_cpu,
        )
    )


@pytest.mark.parametrize(
    "prompt, params, error, word",
    [
        (
            [0, 512],
            SamplingParams(),
            ValueError,
            r"prompt_token_ids must lie in \[0, vocab_size=\d+\), got 512",
        ),
        (torch.tensor([1.0, 2.0]), SamplingParams(), TypeError, "prompt_token_ids must hold signed integers"),
        (torch.tensor([1, 2], dtype=torch.uint8), SamplingParams(), TypeError, "torch.uint8"),
        ([1, 2], {"temperature": 0.5}, TypeError, "sampling_params must be a SamplingParams, got dict"),
        ("the fox " * 200, SamplingParams(), ValueError, "exceeds max_model_len=256"),
    ],
)
def test_bad_requests_leave_the_engine_unchanged(prompt, params, error, word):
    engine = LLMEngine(models=MODELS, sampler_backend="torch")
    engine.add_request("the fox", SamplingParams(max_tokens=4))
    engine.step()
    before = _engine_snapshot(engine)
    with pytest.raises(error, match=word):
        engine.add_request(prompt, params)
    after = _engine_snapshot(engine)
    assert before[:3] == after[:3] and (before[3] == after[3]).all()


@pytest.mark.parametrize(
    "args, kwargs, error, word",
    [
        ([[]], {}, ValueError, "prompts is empty"),  # empty batch
        (["the fox"], {}, TypeError, "prompts must be a list"),  # a string, not a list of prompts
        ([["a", "b"], [SamplingParams()]], {}, ValueError, "sampling_params has 1 entries for 2 prompts"),
        ([["a", "b"]], {"remote_prefill": [True]}, ValueError, "remote_prefill has 1 entries for 2 prompts"),
        ([["a"]], {"num_speculative_tokens": 0}, ValueError, r"num_speculative_tokens must lie in \[1,"),
        ([["a"]], {"num_speculative_tokens": 129}, ValueError, "got 129"),
        ([["a"]], {"fixes": {"clamp_placeholders": True}}, TypeError, "fixes must be a specfix.Fixes"),
        ([["a"]], {"proposer": "eagle"}, ValueError, "proposer must be one of .* got 'eagle'"),
        ([["a"]], {"placeholder_policy": "two"}, ValueError, "placeholder_policy must be one of"),
        ([["a"], [{"temperature": 0.5}]], {}, TypeError, "sampling_params must be SamplingParams, got dict"),
        ([["a"]], {"device": "meta"}, ValueError, "models live on cpu, but device='meta'"),
    ],
)
def test_bad_generate_calls_are_refused(args, kwargs, error, word):
    with pytest.raises(error, match=word):
        generate(*args, models=MODELS, **kwargs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_engine_matches_cpu():
    kw = dict(num_speculative_tokens=3, remote_prefill=[True, False] * 3, sampler_backend="auto")
    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    on_gpu = generate(PROMPTS, greedy, device="cuda", models=load_models("cuda"), **kw)
    on_cpu = generate(PROMPTS, greedy, models=MODELS, **kw)
    assert [o.token_ids for o in on_gpu.outputs] == [o.token_ids for o in on_cpu.outputs]
    sampled = generate(
        PROMPTS,
        SamplingParams(temperature=0.8, seed=1, max_tokens=16),
        device="cuda",
        models=load_models("cuda"),
        **kw,
    )
    assert all(len(o.token_ids) == 16 and "<-" not in o.text for o in sampled.outputs)
    assert 0.40 <= on_gpu.stats.acceptance_rate <= 0.90


def test_a_failed_restore_keeps_the_steps_own_error_and_says_so(monkeypatch):
    """After a device-side assert even putting the buffers back fails: the error the reader sees is still the
    step's own, with a note that the engine is gone."""
    from specfix.v1 import engine as engine_module

    eng = LLMEngine(device="cpu")
    eng.add_request("the fox", SamplingParams(temperature=0.0, max_tokens=4))

    def broken_step():
        raise RuntimeError("CUDA error: device-side assert triggered")

    def broken_restore(self):
        raise RuntimeError("CUDA error: device-side assert triggered (again)")

    monkeypatch.setattr(eng, "_step_sync", broken_step)
    monkeypatch.setattr(engine_module._StepUndo, "restore", broken_restore)
    with pytest.raises(RuntimeError, match=r"^CUDA error: device-side assert triggered\n") as caught:
        eng.step()
    assert caught.value.args == ("CUDA error: device-side assert triggered",)  # the step's own error
    assert any("could not be put back" in note for note in caught.value.__notes__)
