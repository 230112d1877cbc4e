"""The 50-request reproduction in miniature: identity with the fix, traced corruption without it."""

import numpy as np
import pytest
import torch
from scipy import stats

from specfix import Fixes
from specfix.lab.padding_bench import (
    StaleRowScenario,
    count_repeats,
    first_divergence,
    make_requests,
    mark_differences,
    one_step_distribution,
    padded_step_scenario,
    resolve_sampler,
    run_padding_bench,
    total_variation,
    two_step_events,
)
from specfix.lab.stale_rows import ORIGIN_EARLIER, ORIGIN_FREE, ORIGIN_FRESH, ORIGIN_REUSED
from specfix.models import load_models
from specfix.tools.stats import chi_square, chi_square_power

KW = dict(max_batch=3, max_num_reqs=4, max_tokens=(8, 14), device="cpu")  # batches of 3 replay size 4


@pytest.fixture(scope="module")
def benches():
    models = load_models("cpu")
    on = run_padding_bench(4, fixes=Fixes(), models=models, **KW)
    off = run_padding_bench(4, fixes=Fixes(pad_idx_mapping=False), models=models, solo=on.solo, **KW)
    return on, off


def test_fixed_batched_equals_solo(benches):
    on, _ = benches
    assert on.differing == []
    assert any(s.num_reqs_padded > len(s.req_ids) for s in on.batched.steps)  # padding really happened
    assert all(s.writes == [] for s in on.batched.steps)
    assert on.summary()["writes_landed"] == 0


def test_unfixed_corrupts_and_is_traced_to_a_padded_row(benches):
    _, off = benches
    assert off.differing, off.summary()
    req = off.differing[0]
    index, step, writes = off.cause(req)
    record = off.batched.steps[step]
    slot = record.slots[record.req_ids.index(req)]
    assert writes and all(w.slot == slot and w.row >= len(record.req_ids) for w in writes)
    assert any(w.overwritten_cols for w in writes)
    assert off.summary()["writes_landed"] >= len(off.differing)  # each differing response had one
    # the zeros idx_mapping starts with point at slot 0
    assert off.summary()["writes_by_origin"][ORIGIN_FRESH] > 0


@pytest.mark.parametrize("fix", [True, False])
def test_output_distribution(fix):
    """A test for the stale draft row, not for the sampler's fidelity: 400 draws cannot see the small biases
    tests/test_gumbel.py is sized for (a logit bias of 0.05 needs about 10^5). Without the fix the drafted
    positions follow the draft q instead of the target p, which 400 draws show many times over
    (test_the_distribution_test_is_sized_for_the_stale_row gives its false alarm and power)."""
    result = one_step_distribution(400, fixes=Fixes(pad_idx_mapping=fix), sampler="reference")
    assert result["positions"][0]["passed"] == fix
    assert result["passed"] == fix


def test_the_distribution_test_is_sized_for_the_stale_row():
    """False alarm: a correct sampler fails the test above (any of its k + 1 positions, each tested at its
    threshold of ten standard deviations above the mean) with probability below 1e-6 (3e-8 here). Power
    against the stale row's q at 400 draws: computed (noncentral chi-square, approximate because bins with
    fewer than 5 expected draws merge) above 1 - 1e-12, and simulated: 1,000 samples of 400 draws from q,
    none passes (power >= 0.997 at 95% confidence)."""
    result = one_step_distribution(400, sampler="reference")
    p, q, first = np.array(result["target_probs"]), np.array(result["draft_probs"]), result["positions"][0]
    assert first["trials"] == 400
    assert sum(stats.chi2.sf(r["threshold"], r["df"]) for r in result["positions"]) < 1e-6
    alpha = stats.chi2.sf(first["threshold"], first["df"])
    assert chi_square_power(p, q, 400, alpha) > 1 - 1e-12
    rng = np.random.default_rng(0)
    assert not any(chi_square(c, p)["passed"] for c in rng.multinomial(400, q, size=1000))


def test_helpers():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert count_repeats([4, 4, 5, 5, 5, 6]) == 3
    left, right = mark_differences([0, 1, 2], [0, 1, 1, 2])
    assert "{+" in right and "(dup)" in right and "[-" not in left


def test_bad_input():
    with pytest.raises(ValueError, match="num_requests"):
        make_requests(0)
    with pytest.raises(ValueError, match="sampler"):
        one_step_distribution(10, sampler="gpu")


def test_the_drafters_torch_twin_gives_the_benchs_kernel_outputs():
    models = load_models("cpu")
    kw = dict(max_batch=3, max_num_reqs=4, max_tokens=(4, 6), device="cpu", models=models)
    runs = {
        s: run_padding_bench(3, fixes=Fixes(pad_idx_mapping=False), sampler=s, **kw)
        for s in ("kernel", "reference")
    }
    assert any(s.writes for s in runs["kernel"].batched.steps)  # the padded rows did write
    assert runs["kernel"].batched.outputs == runs["reference"].batched.outputs
    assert runs["kernel"].solo.outputs == runs["reference"].solo.outputs


def test_resolve_sampler():
    cpu = torch.device("cpu")
    assert resolve_sampler("auto", cpu, Fixes()) == "reference"
    assert resolve_sampler("auto", cpu, Fixes(mask_invalid_reqs=False)) == "kernel"
    assert resolve_sampler("kernel", cpu, Fixes()) == "kernel"
    with pytest.raises(ValueError, match="mask_invalid_reqs"):
        resolve_sampler("reference", cpu, Fixes(mask_invalid_reqs=False))
    with pytest.raises(ValueError, match="sampler"):
        resolve_sampler("torch", cpu, Fixes())


def test_without_the_fix_drafted_positions_follow_the_draft_and_the_bonus_follows_the_target():
    off = one_step_distribution(400, fixes=Fixes(pad_idx_mapping=False))
    on = one_step_distribution(400, fixes=Fixes())
    drafted, bonus = off["positions"][:-1], off["positions"][-1]
    assert [r["role"] for r in off["positions"]] == ["draft"] * len(drafted) + ["bonus"]
    assert all(r["tv_to_draft"] < r["tv_to_target"] for r in drafted)
    assert bonus["passed"] and bonus["tv_to_target"] < bonus["tv_to_draft"]
    assert all(r["tv_to_target"] < r["tv_to_draft"] for r in on["positions"])
    assert off["acceptance_rate"] > on["acceptance_rate"]
    assert max(off["stale_probs"]) == off["stale_probs"][off["stale_token"]]
    with pytest.raises(ValueError, match="num_trials"):
        one_step_distribution(0)


def test_total_variation():
    assert total_variation([0.5, 0.5], [0.5, 0.5]) == 0
    assert total_variation([1, 0], [0, 1]) == 1
    assert total_variation([0.2, 0.8], [0.5, 0.5]) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="1-D of one length"):
        total_variation([1, 0], [1, 0, 0])


UNFIXED = Fixes(pad_idx_mapping=False)


@pytest.mark.parametrize(
    "events,origins",
    [
        (["step abc"], {3: (0, "a", ORIGIN_FRESH)}),
        (
            ["step abcdef", "finish c", "step abdef"],
            {5: (5, "f", ORIGIN_EARLIER), 6: (0, "a", ORIGIN_FRESH), 7: (0, "a", ORIGIN_FRESH)},
        ),
        (
            ["step abcdef", "finish f", "arrive g", "finish e", "step gabcd"],
            {5: (5, "g", ORIGIN_REUSED), 6: (0, "a", ORIGIN_FRESH), 7: (0, "a", ORIGIN_FRESH)},
        ),
        (
            ["step abcdefg", "finish cf", "step abdeg"],
            {5: (5, None, ORIGIN_FREE), 6: (6, "g", ORIGIN_EARLIER), 7: (0, "a", ORIGIN_FRESH)},
        ),
    ],
)
def test_scenario_traces_every_source_of_stale_values(events, origins):
    state = padded_step_scenario(events, fixes=UNFIXED)
    assert {w.row: (w.slot, w.victim, w.origin) for w in state.writes} == origins
    assert all(state.idx_mapping[row] == slot for row, (slot, _, _) in origins.items())
    assert state.victims == sorted({v for _, v, _ in origins.values() if v is not None})
    fixed = padded_step_scenario(events)
    assert fixed.writes == () and set(fixed.idx_mapping[fixed.num_reqs :]) == {-1}
    assert fixed.idx_mapping[: fixed.num_reqs] == state.idx_mapping[: state.num_reqs]


def test_scenario_slots_and_batch():
    state = padded_step_scenario(["step abcdef", "finish f", "arrive g", "finish e", "step gabcd"])
    assert state.batch == tuple("gabcd") and state.num_reqs == 5 and state.num_reqs_padded == 8
    assert state.owners == {5: "g", 0: "a", 1: "b", 2: "c", 3: "d"}
    assert state.idx_mapping[:5] == (5, 0, 1, 2, 3)


@pytest.mark.parametrize(
    "events,match",
    [
        ("step abc", "non-empty list"),
        ([], "non-empty list"),
        (["walk abc"], "events\\[0\\]"),
        (["step aab"], "events\\[0\\]"),
        (["step aB"], "events\\[0\\]"),
        (["step abc", "finish d"], "events\\[1\\].*not live"),
        (["step abc", "arrive a"], "events\\[1\\].*already live"),
        (["step abc", "finish a", "step a"], "events\\[2\\].*already finished"),
        (["step abcdefghi"], "max_num_reqs"),
        (["step abc", "finish a"], "last event must be a 'step'"),
    ],
)
def test_scenario_refuses_bad_histories_before_running_any(events, match):
    with pytest.raises(ValueError, match=match):
        padded_step_scenario(events, max_num_reqs=8)


def test_a_refused_history_leaves_the_scenario_as_it_was():
    scenario = StaleRowScenario(fixes=UNFIXED, max_num_reqs=8)
    scenario.play(["step abc"])
    before = (scenario.spec.idx_mapping.clone(), dict(scenario.states.req_id_to_index), scenario.steps_run)
    with pytest.raises(ValueError, match="not live"):
        scenario.play(["finish a", "step bc", "finish z"])
    assert torch.equal(scenario.spec.idx_mapping, before[0])
    assert (scenario.states.req_id_to_index, scenario.steps_run) == before[1:]


def test_two_step_events():
    assert two_step_events(6, 5) == ["step abcdef", "finish c", "step abdef"]
    assert two_step_events(2, 2) == ["step ab", "step ab"]  # nobody called c: nobody ends
    assert two_step_events(4, 6) == ["step abcd", "finish c", "step abdefg"]  # newcomers after survivors
    assert two_step_events(6, 3) == ["step abcdef", "finish c", "step abd"]  # e and f wait
    padded_step_scenario(two_step_events(16, 16))  # the slider's far corner runs
    with pytest.raises(ValueError, match="second_batch"):
        two_step_events(3, 17)
