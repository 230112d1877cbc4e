"""Chapter 1's experiments: verifications from a recorded run, two runs lined up, -1 on the random path."""

import pytest

from specfix import Fixes
from specfix.lab import placeholder_lifecycle as lab
from specfix.models import load_models
from specfix.v1.engine import SamplingParams, generate

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
WORK = dict(num_speculative_tokens=3, proposer="ngram", remote_prefill=True, record=True)


@pytest.fixture(scope="module")
def runs():
    prompts = lab.story_prompts(4)
    return (generate(prompts, GREEDY, placeholder_policy="zero", **WORK), generate(prompts, GREEDY, **WORK))


def test_story_prompts_cycle_and_refuse_bad_counts():
    assert lab.story_prompts(len(lab.STORY_STARTS) + 1)[-1] == lab.STORY_STARTS[0]
    with pytest.raises(ValueError, match="num_prompts must be an int >= 1, got 0"):
        lab.story_prompts(0)


@pytest.mark.parametrize("which,pad", [(0, 0), (1, -1)])
def test_verifications_add_up_to_the_schedulers_own_counts(runs, which, pad):
    result = runs[which]
    found = lab.verifications(result)
    stats = result.stats
    assert sum(len(v.drafts) for v in found) == stats.num_draft_tokens
    assert sum(v.num_placeholders for v in found) == stats.num_placeholder_slots > 0
    assert sum(v.accepted_drafts for v in found) == stats.num_accepted_tokens
    assert sum(v.accepted_placeholders for v in found) == stats.num_placeholders_accepted
    assert {t for v in found for t in v.placeholders} == {pad}
    assert all(0 <= v.accepted <= len(v.drafts) + v.num_placeholders for v in found)


def test_verifications_need_a_recorded_run():
    result = generate(["the mice"], GREEDY, max_steps=2)
    with pytest.raises(ValueError, match="record=True"):
        lab.verifications(result)
    with pytest.raises(TypeError, match="result must be a GenerateResult"):
        lab.verifications([])


def test_a_shared_verification_is_judged_alike_under_both_placeholder_policies(runs):
    zero, clamp = runs
    summary = lab.compare_runs(zero, clamp)
    both = summary["both"]
    assert both["verifications"] > 0 and both["accepted in a"] == both["accepted in b"]
    assert summary["only a"]["accepted in b"] == 0 and summary["only b"]["accepted in a"] == 0
    total = {
        name: sum(g["drafts"] for key, g in summary.items() if key != other)
        for name, other in [("a", "only b"), ("b", "only a")]
    }
    assert total == {"a": zero.stats.num_draft_tokens, "b": clamp.stats.num_draft_tokens}


def test_compare_runs_refuses_runs_of_different_texts(runs):
    other = generate(["a lion was asleep"], GREEDY, **WORK)
    with pytest.raises(ValueError, match="different texts"):
        lab.compare_runs(runs[0], other)


@pytest.fixture(scope="module")
def models():
    return load_models("cpu")


def test_without_the_check_the_random_path_accepts_placeholders(models):
    prompts = lab.story_prompts(8)
    on = lab.negative_draft_run(Fixes(), prompts, models, max_tokens=24)
    off = lab.negative_draft_run(Fixes(reject_negative_drafts=False), prompts, models, max_tokens=24)
    assert on["rows with an accepted -1"] == 0 < on["verifications"]
    assert off["rows with an accepted -1"] > 0


def test_negative_draft_run_needs_k(models):
    with pytest.raises(ValueError, match="k must be an int >= 1"):
        lab.negative_draft_run(Fixes(), ["the mice"], models, k=0)


# -- a -1 from the prefix cache, on both runners -----------------------------------------------------------


def test_the_repeated_prompt_is_one_token_longer_than_a_block():
    from specfix.tokenizer import get_tokenizer
    from specfix.v1.scheduler import BLOCK_SIZE

    tok = get_tokenizer()
    ids = tok.encode(lab.REPEATED_PROMPT)
    assert len(ids) == BLOCK_SIZE + 1
    assert int(load_models("cpu")[0].score(ids)[-1].argmax()) == 0  # the next word is token 0


@pytest.fixture(scope="module")
def paths():
    return lab.runner_paths(models=load_models("cpu"))


def test_runner_paths_follow_one_placeholder_through_both_runners(paths):
    v1, v1_off, v2, v2_off = (paths[name] for name in lab.RUNNER_PATHS)
    for row in (v1, v2, v2_off):
        assert row["cached tokens"] == 16 and row["scheduler sends"] == [-1, -1, -1]
        assert row["embedding reads"] == [0, 0, 0]
    assert v1_off["error"].startswith("IndexError")
    assert v1["verification sees"] == v2["verification sees"] == [-1, -1, -1]
    assert v1["emitted"] == v2["emitted"] == [0]
    assert v1["placeholders accepted"] == v2["placeholders accepted"] == 0
    assert v2_off["verification sees"] == [0, 0, 0]
    assert v2_off["placeholders accepted"] == 1 and v2_off["emitted"][0] == 0 and len(v2_off["emitted"]) == 2


def test_placeholder_sources_count_the_slots_each_deployment_gets():
    counts = lab.placeholder_sources(num_prompts=3, max_tokens=8, models=load_models("cpu"))
    assert counts["one node, new prompts"]["-1 slots"] == 0
    assert counts["one node, a prompt sent again (prefix cache)"]["-1 slots"] == 3  # the repeat's first step
    assert counts["P/D decode node"]["-1 slots"] == 3 * 3  # each prompt's first decode
    async_run = counts["one node, async scheduling"]
    assert async_run["-1 slots"] == async_run["draft slots"] > 0  # every slot is sent as -1, then filled
