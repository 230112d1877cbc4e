"""Every checker is honest: each hint is earned by a wrong answer built to earn it, lazy answers are refused,
right answers pass whatever container they come in, and answers that dodge the point of an exercise (a host
sync, a call to specfix's own version, a read-off constant) are refused with a hint that says why.

The tables below are the newer exercises' and the defects' cases; each chapter's own file
(``tests/test_exercises_<chapter>.py``) holds the older exercises' hint cases. ``test_every_hint_is_tested``
checks that together they name every hint of every checker."""

import bisect
import importlib
import json
import pkgutil
import random
import re
import string
from pathlib import Path

import numpy as np
import pytest
import torch

import specfix.exercises
from specfix.exercises import core
from specfix.exercises import cudagraph_idx_mapping as ch3
from specfix.exercises import embedding_assert as ch2
from specfix.exercises import performance as ch5
from specfix.exercises import placeholder_lifecycle as ch1
from specfix.exercises.solutions import cudagraph_idx_mapping as sol3
from specfix.exercises.solutions import embedding_assert as sol2
from specfix.exercises.solutions import performance as sol5
from specfix.exercises.solutions import placeholder_lifecycle as sol1

ROOT = Path(__file__).resolve().parents[1]
for info in pkgutil.iter_modules(specfix.exercises.__path__):
    if not info.ispkg and info.name != "core":
        importlib.import_module(f"specfix.exercises.{info.name}")


@pytest.fixture(autouse=True)
def readers_answers():
    core.use_solutions(False)


def _hint(check, answer):
    verdict = check(answer)
    assert not verdict.solved, f"{check.exercise} accepted {answer!r}"
    return verdict.hint_ids


# -- lazy answers: never accepted, never a crash of the checker ----------------------------------------------

LAZY_VALUES = [0, 1, -1, "", "the", [], {}, set(), 3.5, True, np.int64(0), torch.tensor([1, 2])]
LAZY_FUNCTIONS = [
    lambda *a, **k: None,
    lambda *a, **k: 0,
    lambda *a, **k: [],
    lambda *a, **k: a[0] if a else k,
]  # the stub's return, constants, the input echoed


@pytest.mark.parametrize("exercise", sorted(core.CHECKERS))
def test_lazy_answers_are_refused_with_a_hint(exercise):
    check = core.CHECKERS[exercise]
    for answer in LAZY_FUNCTIONS if callable(check.reference()) else LAZY_VALUES:
        verdict = check(answer)
        assert not verdict.solved and verdict.hints, f"{exercise} accepted {answer!r}"
        assert verdict.hint_ids != ["raised"], f"{exercise} crashed on {answer!r}: {verdict}"


#: Lazy answers that read a value off the chapter, or call specfix's own version of the exercise.
READ_OFF = [
    ("ch3.find_stale_row", lambda mystery: (5, 2)),  # the notebook's mystery, read off its print
    (  # replays the step on the puzzle itself and reads the victim off its report
        "ch3.find_stale_row",
        lambda m: next((w.row, w.slot) for w in m.play([f"step {m.batch}"]).writes if w.victim is not None),
    ),
    ("ch3.stale_victims", set()),
    ("ch1.emitted", lambda drafts, choices: choices),
    ("ch2.guard_positions", lambda positions, cu, req_ids: ["0", "0", "0", "2", "2", "2"]),  # the demo's
]


@pytest.mark.parametrize("exercise,answer", READ_OFF, ids=[e for e, _ in READ_OFF])
def test_answers_read_off_the_chapter_are_refused(exercise, answer):
    assert _hint(core.CHECKERS[exercise], answer)


def _plays_the_real_speculator(events, max_num_reqs):
    from specfix.lab.padding_bench import StaleRowScenario

    scenario = StaleRowScenario(fixes=ch3.UNFIXED, max_num_reqs=max_num_reqs)
    scenario.play(list(events))
    return scenario.spec.idx_mapping.tolist()


def _calls_the_rejection_sampler(drafts, choices):
    from specfix.v1.rejection_sampler import RejectionSampler
    from specfix.v1.sampling_metadata import SamplingMetadata
    from specfix.v1.spec_decode_metadata import SpecDecodeMetadata

    logits = torch.nn.functional.one_hot(torch.tensor(choices), 16).float()  # the target's choices, greedy
    metadata = SpecDecodeMetadata.make_dummy([list(drafts)], "cpu")
    greedy = SamplingMetadata.from_requests([0.0], [None], "cpu")
    return RejectionSampler.parse_output(RejectionSampler()(metadata, None, logits, greedy), 16)[0]


def _asks_the_dispatcher(live_batch, capture_sizes):
    from specfix.mrv2.cudagraph import CudaGraphDispatcher

    return CudaGraphDispatcher(max(capture_sizes)).dispatch(live_batch).num_reqs_padded


def _asks_the_dflash_preparation(idx_mapping, num_reqs, k, max_num_reqs):
    from specfix.mrv2 import dflash

    out, table = dflash.DFlashInputs.allocate(max_num_reqs, k), torch.arange(max_num_reqs)
    return dflash.prepare_dflash_inputs(num_reqs, idx_mapping, table, table, 16, out).sample_idx_mapping


@pytest.mark.parametrize(
    "check,answer",
    [
        (ch3.check_dflash_padding, _asks_the_dflash_preparation),
        (ch5.check_replayed_rows, _asks_the_dispatcher),
        (ch3.check_simulate_idx_mapping, _plays_the_real_speculator),
        (ch1.check_emitted, _calls_the_rejection_sampler),
    ],
)
def test_calling_specfixs_own_version_is_refused(check, answer):
    verdict = check(answer)
    assert verdict.hint_ids == ["bypass"] and "specfix's own" in str(verdict)


def test_a_forbidden_function_is_put_back_after_the_check():
    from specfix.lab.padding_bench import StaleRowScenario
    from specfix.v1.rejection_sampler import RejectionSampler

    before = (StaleRowScenario.play, RejectionSampler.forward)
    ch3.check_simulate_idx_mapping(_plays_the_real_speculator)
    ch1.check_emitted(_calls_the_rejection_sampler)
    assert (StaleRowScenario.play, RejectionSampler.forward) == before
    assert "forward" in vars(RejectionSampler)


# -- right answers in any container --------------------------------------------------------------------------

CONTAINED = (
    [
        ("ch1.metadata", {k: c(v) for k, v in sol1.metadata_answer().items()})
        for c in (list, tuple, np.array, torch.tensor)
    ]
    + [("ch1.zero_accepts", v) for v in (2, np.int64(2), np.int32(2), torch.tensor(2), torch.tensor([2]))]
    + [
        ("ch1.clamp_point", {k: c(v) for k, v in sol1.clamp_point.items()})
        for c in (int, np.int64, torch.tensor)
    ]
    + [("ch2.which_ops", c(sorted(sol2.which_ops))) for c in (set, frozenset, list, tuple)]
    + [
        ("ch3.stale_victims", v)
        for v in ({"a", "g"}, ["g", "a"], ("a", "g"), "ag", "a, g", np.array(["a", "g"]))
    ]
    + [
        ("ch3.corrupted_responses", lambda e, m, c=c: c(sorted(sol3.corrupted_responses(e, m))))
        for c in (set, list, tuple, "".join, frozenset)
    ]
    + [
        ("ch1.draft_ids", lambda i, r, t, c=c: c(sol1.gather_draft_token_ids(i, r, t)))
        for c in (torch.Tensor.numpy, torch.Tensor.tolist, lambda t: tuple(t.tolist()), torch.Tensor.long)
    ]
    + [("ch5.floor", c(sol5.answer_floor_us)) for c in (float, np.float64, np.float32)]
    + [("ch5.which_syncs", c(sol5.which_syncs)) for c in (set, list, tuple)]
    + [
        ("ch3.find_stale_row", lambda m, c=c: c(list(sol3.find_stale_row(m))))
        for c in (list, tuple, np.array, torch.tensor)
    ]
    + [("ch1.emitted", lambda d, ch, c=c: c(sol1.emitted_tokens(d, ch))) for c in (list, tuple, np.array)]
    + [
        ("ch3.simulate_idx_mapping", lambda e, m, c=c: c(sol3.simulate_idx_mapping(e, m)))
        for c in (list, tuple, np.array, torch.tensor)
    ]
    + [
        ("ch3.dflash_padding", lambda i, n, k, m, c=c: c(sol3.sample_idx_mapping(i, n, k, m).tolist()))
        for c in (list, tuple, np.array, torch.tensor)
    ]
    + [("ch2.guard_positions", lambda p, cu, r, c=c: c(sol2.requests_at(p, cu, r))) for c in (list, tuple)]
)


@pytest.mark.parametrize("exercise,answer", CONTAINED, ids=[e for e, _ in CONTAINED])
def test_a_right_answer_passes_in_any_container(exercise, answer):
    verdict = core.CHECKERS[exercise](answer)
    assert verdict.solved, str(verdict)


# -- section 1's defects, one test each ----------------------------------------------------------------------


def test_first_bad_op_indexing_hint_gives_the_true_reason():
    message = str(ch2.check_first_bad_op('totals = getattr(self, f"totals_{m}")[row]'))
    assert "torch.where" in message and "never the kernel" not in message


@pytest.mark.parametrize(
    "spelling", ["probs=self.embed_tokens(input_ids)", "probs =  self.embed_tokens( input_ids )"]
)
def test_first_bad_op_accepts_any_spacing(spelling):
    assert ch2.check_first_bad_op(spelling).solved


def _clamps_after_a_host_check(input_ids, num_tokens, num_input_tokens, draft_token_ids):
    if (input_ids[:num_input_tokens] < 0).any():  # a host read of a GPU value: a sync every step
        input_ids[:num_input_tokens].clamp_(min=0)
    return input_ids[:num_input_tokens]


def _clamps_after_item(input_ids, num_tokens, num_input_tokens, draft_token_ids):
    if input_ids[:num_input_tokens].min().item() < 0:
        input_ids[:num_input_tokens].clamp_(min=0)
    return input_ids[:num_input_tokens]


@pytest.mark.parametrize("answer", [_clamps_after_a_host_check, _clamps_after_item])
def test_clamp_that_synchronises_is_refused(answer):
    verdict = ch2.check_clamp(answer)
    assert verdict.hint_ids == ["syncs"] and "host" in str(verdict)


def test_find_stale_row_hidden_cases_cover_the_traps():
    cases = ch3._HIDDEN_MYSTERIES
    first_free, fresh = ch3.mystery_batch(*cases[0]), ch3.mystery_batch(*cases[1])
    assert first_free.states.owner(first_free.spec.idx_mapping[len(first_free.batch)].item()) is None
    assert any(fresh.row_writer[row] is None and slot == 0 for row, slot in ch3._culprits(fresh))
    for case in cases:
        mystery = ch3.mystery_batch(*case)
        assert ch3._culprits(mystery), case
        # every live request runs
        assert sorted(mystery.batch) == sorted(mystery.states.req_id_to_index), case


def test_find_stale_row_first_padded_row_gets_the_free_slot_hint():
    answer = lambda m: (len(m.batch), m.spec.idx_mapping[len(m.batch)].item())
    assert _hint(ch3.check_find_stale_row, answer) == ["free_slot"]


def test_pad_idx_mapping_is_written_before_the_fix_is_shown():
    cells = json.loads((ROOT / "notebooks/03_cudagraph_idx_mapping.ipynb").read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells]
    exercise = next(i for i, s in enumerate(sources) if "ex.check_pad_idx_mapping(" in s)
    shown = next(i for i, s in enumerate(sources) if 'show_fix("pad_idx_mapping")' in s)
    assert exercise < shown


@pytest.mark.parametrize("answer", [set(), {"g"}, {"a"}])
def test_stale_victims_hints_name_no_row_or_slot(answer):
    verdict = ch3.check_stale_victims(answer)
    assert not verdict.solved and not re.search(r"\d", str(verdict).split(":", 1)[1])


def test_zero_accepts_says_neither_more_nor_less():
    assert "too" not in str(ch1.check_zero_accepts(1)) + str(ch1.check_zero_accepts(15))


def test_floor_fallback_hint_does_not_spell_the_formula():
    message = str(ch5.check_floor(1000.0))
    assert "4 bytes" not in message and "1e6" not in message


def test_metadata_truth_is_not_public():
    assert not hasattr(ch1, "metadata_truth")


def test_show_solution_keeps_a_values_comments():
    shown = str(core.show_solution("ch3.stale_victims"))
    assert shown.startswith("#") and shown.rstrip().endswith('stale_victims = {"a", "g"}')


def test_chapter_1_recap_has_no_garbled_sentence():
    text = (ROOT / "notebooks/01_placeholder_lifecycle.ipynb").read_text()
    assert "In  vLLM" not in text


# -- the new exercises: every hint earned --------------------------------------------------------------------


def _stops_without_bonus(drafts, choices):
    return sol1.emitted_tokens(drafts, choices)[: len(drafts)]


def _never_emits_the_recovered_token(drafts, choices):
    out = sol1.emitted_tokens(drafts, choices)
    return out if len(out) == len(drafts) + 1 else out[:-1]


def _emits_the_draft_at_the_mismatch(drafts, choices):
    out = sol1.emitted_tokens(drafts, choices)
    n = len(out) - 1
    return out[:-1] + [drafts[n]] if n < len(drafts) else out


def _keeps_every_match(drafts, choices):
    return [c for d, c in zip(drafts, choices, strict=False) if d == c] + [choices[-1]]


def _placeholder_is_a_wildcard(drafts, choices):
    out = []
    for d, c in zip(drafts, choices, strict=False):
        if d not in (c, -1):
            return out + [c]
        out.append(d)
    return out + [choices[len(drafts)]]


def _off_by_one_bonus(drafts, choices):
    out = sol1.emitted_tokens(drafts, choices)
    return out[:-1] + [out[-1] + 1]


def _boundary(positions, cu, req_ids):
    return [req_ids[min(bisect.bisect_left(cu, p), len(cu) - 1)] for p in positions]


def _starts_not_ends(positions, cu, req_ids):
    return [req_ids[max(bisect.bisect_right(cu, p) - 1, 0)] for p in positions]


def _skips_nothing(positions, cu, req_ids):  # assumes every request has the same number of tokens
    width = cu[0] or 1
    return [req_ids[min(p // width, len(req_ids) - 1)] for p in positions]


def _names_empty_requests(positions, cu, req_ids):
    starts = [0] + cu[:-1]  # a request owns its start, even when it holds nothing
    return [
        req_ids[
            next(i for i, s in enumerate(starts) if s >= p) if p in starts else bisect.bisect_right(cu, p)
        ]
        for p in positions
    ]


def _wrong(name):
    return lambda events, max_num_reqs: ch3._wrong_simulations(events, max_num_reqs)[name]


NEW_HINTS = [
    (ch1.check_emitted, lambda d, c: "the", "format"),
    (ch1.check_emitted, _stops_without_bonus, "no_bonus"),
    (ch1.check_emitted, _never_emits_the_recovered_token, "no_recovered"),
    (ch1.check_emitted, _emits_the_draft_at_the_mismatch, "emits_draft"),
    (ch1.check_emitted, _keeps_every_match, "not_prefix"),
    (ch1.check_emitted, _placeholder_is_a_wildcard, "placeholder"),
    (ch1.check_emitted, _off_by_one_bonus, "wrong"),
    (ch1.check_clamp_point, {"scheduler": 0, "before_metadata": 0}, "format"),
    (ch1.check_clamp_point, {**sol1.clamp_point, "scheduler": -1}, "scheduler"),
    (ch1.check_clamp_point, {**sol1.clamp_point, "before_metadata": -1}, "before_metadata"),
    (ch1.check_clamp_point, {point: 0 for point in ch1.CLAMP_POINTS}, "preprocess"),  # "the clamp reaches it"
    (ch2.check_guard_positions, lambda p, cu, r: "0", "format"),
    (ch2.check_guard_positions, lambda p, cu, r: [bisect.bisect_right(cu, x) for x in p], "indices"),
    (ch2.check_guard_positions, _boundary, "boundary"),
    (ch2.check_guard_positions, _starts_not_ends, "exclusive"),
    (ch2.check_guard_positions, _names_empty_requests, "empty_request"),
    (ch2.check_guard_positions, _skips_nothing, "wrong"),
    (ch3.check_simulate_idx_mapping, lambda e, m: [0] * (m - 1), "format"),
    (ch3.check_simulate_idx_mapping, _wrong("starts_minus_one"), "starts_minus_one"),
    (ch3.check_simulate_idx_mapping, _wrong("pads_minus_one"), "pads_minus_one"),
    (ch3.check_simulate_idx_mapping, _wrong("finish_clears"), "finish_clears"),
    (ch3.check_simulate_idx_mapping, _wrong("slot_not_reused"), "slot_not_reused"),
    (ch3.check_simulate_idx_mapping, _wrong("rows_by_name"), "rows_by_name"),
    (ch3.check_simulate_idx_mapping, lambda e, m: list(range(m)), "wrong"),
    (ch3.check_dflash_padding, lambda i, n, k, m: [0] * (m * k - 1), "format"),
    (
        ch3.check_dflash_padding,
        lambda i, n, k, m: torch.cat(
            [i[:n].long().repeat_interleave(k), torch.zeros((m - n) * k, dtype=torch.long)]
        ),
        "pads_zero",
    ),
    (ch3.check_dflash_padding, lambda i, n, k, m: i[:n].tolist() + [-1] * (m * k - n), "not_expanded"),
    (ch3.check_dflash_padding, lambda i, n, k, m: i[:n].tolist() * k + [-1] * ((m - n) * k), "interleaved"),
    (ch3.check_dflash_padding, lambda i, n, k, m: i.long().repeat_interleave(k), "stale_rows"),
    (ch3.check_dflash_padding, lambda i, n, k, m: [-1] * (m * k), "wrong"),
    (ch5.check_which_syncs, "b", "format"),
    (ch5.check_which_syncs, {"a", "b"}, "clamp"),
    (ch5.check_which_syncs, {"b", "c"}, "scheduler"),
    (ch5.check_which_syncs, {"host_mask", "host_mask_async"}, "pinned"),
    (ch5.check_which_syncs, set(), "pageable"),
]


@pytest.mark.parametrize("check,answer,hint", NEW_HINTS, ids=[f"{c.exercise}-{h}" for c, _, h in NEW_HINTS])
def test_new_exercises_name_each_mistake(check, answer, hint):
    assert _hint(check, answer) == [hint]


def test_the_new_exercises_are_checked_on_a_seeded_family_the_notebook_never_prints():
    assert len(ch1._emitted_cases()) > 20 and ch1._emitted_cases(1) != ch1._emitted_cases(0)
    assert len(ch2._position_cases()) > 10
    assert any(c == (p[i - 1] if i else 0) for _, p, _ in ch2._position_cases() for i, c in enumerate(p))
    cases = ch3._SIMULATION_CASES
    assert len(cases) > 5 and any("finish" in " ".join(e) for e, _ in cases)


def test_dflash_padding_truth_is_the_fixed_preparation_and_the_bug_pads_zero():
    from specfix.mrv2 import dflash

    idx, num_reqs, k, max_num_reqs = ch3._dflash_cases()[0]
    assert ch3._dflash_truth(idx, num_reqs, k, max_num_reqs) == [2, 2, 2, 0, 0, 0] + [-1] * 6
    out, table = dflash.DFlashInputs.allocate(max_num_reqs, k), torch.arange(max_num_reqs)
    dflash.prepare_dflash_inputs(
        num_reqs, torch.tensor(idx, dtype=torch.int32), table, table, 16, out, ch3.Fixes(dflash_pad_idx=False)
    )
    assert out.sample_idx_mapping.tolist()[num_reqs * k :] == [0] * 6


def _random_histories(seed: int, count: int = 8) -> list[tuple[list[str], int]]:
    """(events, max_num_reqs): arrivals, steps and finishes drawn at random (the seeded family the checker's
    hidden histories were drawn from, at seed 0)."""
    rng, cases = random.Random(seed), []
    for _ in range(count):
        events, live, used, max_num_reqs = [], [], 0, rng.choice((4, 8))
        for _ in range(rng.randint(2, 6)):
            if live and rng.random() < 0.3:
                gone = rng.sample(live, rng.randint(1, len(live)))
                events.append(f"finish {''.join(gone)}")
                live = [c for c in live if c not in gone]
                continue
            newcomers = list(string.ascii_lowercase[used : used + rng.randint(0, max_num_reqs - len(live))])
            used += len(newcomers)
            if newcomers and rng.random() < 0.5:
                events.append(f"arrive {''.join(newcomers)}")
                live, newcomers = live + newcomers, []
            if live or newcomers:  # the step runs every newcomer (that is how it arrives), and some others
                batch = newcomers + rng.sample(live, rng.randint(0 if newcomers else 1, len(live)))
                events.append("step " + "".join(rng.sample(batch, len(batch))))
                live += newcomers
        cases.append((events or ["step a"], max_num_reqs))
    return cases


def test_the_hidden_histories_are_the_seeded_family():
    hidden = [(list(events), m) for events, m in ch3._SIMULATION_CASES[3:]]
    assert hidden == _random_histories(seed=0)


def test_simulated_idx_mapping_matches_the_real_speculator_on_random_histories():
    for events, max_num_reqs in _random_histories(seed=7) + list(ch3._SIMULATION_CASES):
        want = _plays_the_real_speculator(events, max_num_reqs)
        assert sol3.simulate_idx_mapping(events, max_num_reqs) == want, events


def test_guard_report_points_at_the_placeholders_of_the_prefilled_requests():
    report = ch2.guard_report()
    assert report.error.op == "F.embedding" and set(report.error.values) == {-1}
    owners = set(sol2.requests_at(report.positions, report.cu_num_tokens, report.req_ids))
    assert owners == {report.req_ids[0], report.req_ids[2]}  # the two that arrived prefilled (run_demo)


def test_only_the_clamp_in_preprocess_keeps_the_minus_one_for_the_sampler_and_none_for_the_embedding():
    for point in ch1.CLAMP_POINTS:
        step = ch1.step_with_clamp_at(point)
        assert int(step.embedding_input.min()) >= 0, point
        assert ch1.sampler_sees(point) == (-1 if point == "preprocess" else 0)


def test_which_syncs_reads_the_recording():
    assert ch5.syncing_fixes() == {"host_mask"}


# -- every hint of every checker is earned by some test ------------------------------------------------------

#: Hints no CPU test can earn, with the reason.
UNTESTABLE = {}


def test_every_hint_is_tested():
    text = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_exercises*.py"))
    missing = [
        f"{name}:{hint}"
        for name, check in sorted(core.CHECKERS.items())
        for hint in check.hints
        if f'"{hint}"' not in text and f"{name}:{hint}" not in UNTESTABLE
    ]
    assert not missing, missing
