"""Chapter 5's checkers name each typical wrong answer with its own hint (and never raise)."""

import pytest

from specfix.exercises import performance as ex
from specfix.exercises.solutions.performance import replayed_rows
from specfix.figures.performance import ceilings
from specfix.mrv2.cudagraph import cudagraph_capture_sizes
from specfix.tools import bench, recorded

REPORT = recorded.load("bench_h200")
READ, COPY = ceilings(REPORT)["read"], ceilings(REPORT)["copy"]
ROWS, VOCAB, _ = ex.FLOOR_SHAPE
BYTES = ROWS * VOCAB * 4


def _hints(verdict):
    assert not {"todo", "raised"} & set(verdict.hint_ids), str(verdict)  # the check ran to its end
    return verdict.hint_ids


def test_floor_accepts_the_bytes_over_the_read_ceiling():
    assert ex.check_floor(BYTES / (READ * 1e6)).solved


@pytest.mark.parametrize(
    "answer,hint",
    [
        ("42", "not_a_number"),
        (True, "not_a_number"),
        (-1.0, "not_a_number"),
        (BYTES / (COPY * 1e6), "copy_ceiling"),
        (ROWS * VOCAB * 2 / (READ * 1e6), "bytes_per_logit"),  # counted bf16's 2 bytes
        (ROWS * VOCAB / (READ * 1e6), "quarter"),  # logits, not bytes (or 64 rows)
        (2 * BYTES / (READ * 1e6), "read_and_write"),
        (BYTES / (READ * 1e12), "units"),  # seconds
        (BYTES / (READ * 1e9), "units"),  # milliseconds
        (BYTES / (READ * 1e3), "units"),  # nanoseconds
        (1000.0, "off"),
    ],
)
def test_floor_names_each_wrong_answer(answer, hint):
    assert _hints(ex.check_floor(answer)) == [hint]


def test_floor_recognises_the_measured_time():
    judged = bench.frame(REPORT, "gumbel").query(
        "impl == @bench.JUDGED and rows == @ROWS and vocab == @VOCAB and dtype == 'fp32'"
    )
    assert _hints(ex.check_floor(float(judged["median_us"].iloc[0]))) == ["measured"]


def test_replayed_rows_says_the_sizes_come_in_any_order():
    assert "any order" in ex.check_replayed_rows.todo


@pytest.mark.parametrize(
    "answer,hint",
    [
        (lambda live, sizes: float(replayed_rows(live, sizes)), "not_int"),
        (lambda live, sizes: max([s for s in sizes if s <= live], default=live), "too_few"),  # rounds down
        (lambda live, sizes: live, "no_padding"),
        (lambda live, sizes: min([s for s in sizes if s > live], default=live), "exact_fit"),  # > for >=
        (lambda live, sizes: max([s for s in sizes if s >= live], default=live), "not_smallest"),
        (lambda live, sizes: next((s for s in sizes if s >= live), live), "unsorted"),  # first that fits
        (lambda live, sizes: min(s for s in sizes if s >= live), "eager"),  # raises past the largest size
        (lambda live, sizes: min([s for s in sizes if s >= live], default=max(sizes)), "eager"),
    ],
)
def test_replayed_rows_names_each_wrong_answer(answer, hint):
    assert _hints(ex.check_replayed_rows(answer)) == [hint]


def test_replayed_rows_checks_every_recorded_batch():
    replays = bench.frame(REPORT, "drafter_graph").query("impl == 'graph'")
    pairs = replays[["live_batch", "padded_batch"]].drop_duplicates()
    sizes = [s for s in cudagraph_capture_sizes() if s <= ex.MAX_NUM_REQS]
    assert len(pairs) > 1
    assert all(replayed_rows(live, sizes) == padded for live, padded in pairs.itertuples(index=False))
