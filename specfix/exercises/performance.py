"""Chapter 5's exercises on what sampling and the placeholder fixes cost, with their checkers.

All three are checked against the H200 recording ``specfix/recorded/bench_h200.json``: its read ceiling, the
host synchronisations it counted per step, and the batch sizes its drafter steps were replayed at.
"""

from __future__ import annotations

import math
import numbers

from specfix.exercises.core import as_int, as_str_set, checker, value_of
from specfix.figures.performance import ceilings, fix_costs, floor_us
from specfix.lab.placeholder_fixes import LABELS
from specfix.mrv2.cudagraph import cudagraph_capture_sizes
from specfix.tools import bench, recorded

#: The shape of the prediction: rows, vocabulary, dtype.
FLOOR_SHAPE = (256, 151_936, "fp32")
#: A prediction within this relative distance of the floor counts as right.
FLOOR_TOLERANCE = 0.02


@checker(
    "ch5.floor",
    solution="performance:answer_floor_us",
    todo="set answer to the floor time, in microseconds, of sampling 256 rows of 151,936 fp32 logits on the "
    "H200: the bytes the sampler must read over the read ceiling of the recorded run",
    hints={
        "not_a_number": "answer must be a number of microseconds (e.g. answer = 12.5).",
        "copy_ceiling": "you divided by the copy bandwidth: a copy's TB/s counts bytes read and bytes "
        "written, while a sampler only reads its logits. Use the read ceiling (fp32 argmax).",
        "bytes_per_logit": "your bytes per logit are off: an fp32 logit is 4 bytes.",
        "quarter": "a quarter of the floor: either each logit counted as one byte, or a quarter of the rows "
        "(64, the drafter's batch, is not this sampler's 256 rows).",
        "read_and_write": "you counted the logits twice, as if they were read and written: a sampler reads "
        "them once and writes only one token id per row.",
        "units": "your answer is off by a power of ten: bytes / (TB/s x 1e12) gives seconds; the answer is "
        "in microseconds (x 1e6).",
        "measured": "that is the kernel's measured time, not its floor: the floor is the time a kernel that "
        "did nothing but read the logits would take.",
        "off": "not within 2% of the floor: which bytes must the sampler read at the least, and how fast "
        "can the H200 read them? Mind the units.",
    },
)
def check_floor(answer, verdict):
    answer = value_of(answer)  # a number, or a function that returns one
    ok = isinstance(answer, numbers.Real) and not isinstance(answer, bool) and answer > 0
    verdict.require(ok, "not_a_number", f"Got {answer!r}.")
    report, (rows, vocab, dtype) = recorded.load("bench_h200"), FLOOR_SHAPE
    limits = ceilings(report)
    floor = floor_us(rows, vocab, dtype, limits["read"])
    logits_over_read = rows * vocab / (limits["read"] * 1e6)
    measured = bench.frame(report, "gumbel").query(
        "impl == @bench.JUDGED and rows == @rows and vocab == @vocab and dtype == @dtype"
    )["median_us"]
    near = lambda *targets: any(math.isclose(answer, t, rel_tol=FLOOR_TOLERANCE) for t in targets)
    verdict.match(
        near(floor),
        f"You said {float(answer):,.4g} us.",
        "off",
        copy_ceiling=near(floor_us(rows, vocab, dtype, limits["copy"])),
        quarter=near(logits_over_read),  # 1 byte per logit = 64 rows of 4
        bytes_per_logit=near(2 * logits_over_read),
        read_and_write=near(2 * floor),
        units=near(*(floor * 10.0**e for e in (-9, -6, -3, 3, 6, 9))),
        measured=near(*measured),
    )


#: The drafter's buffers in the H200 run hold this many requests: no graph is captured above it.
MAX_NUM_REQS = 64


@checker(
    "ch5.replayed_rows",
    solution="performance:replayed_rows",
    todo="write replayed_rows: how many rows a step of live_batch requests runs (capture_sizes in any order)",
    hints={
        "not_int": "replayed_rows must return an int, the number of rows the step processes.",
        "too_few": "you replayed fewer rows than there are live requests: those requests would drop out of "
        "the step. A graph can only serve a batch it holds: take a captured size >= the batch.",
        "exact_fit": "a batch that equals a captured size fits that graph exactly, yet you padded it to a "
        "larger one: compare with >=, not >.",
        "no_padding": "you returned the batch itself: a batch that a captured graph holds replays that "
        "graph, padding rows included, and the graph's size is what the step processes.",
        "not_smallest": "you replayed a graph larger than needed: every extra row is padding the GPU "
        "computes for nothing. Take the smallest captured size that holds the batch.",
        "unsorted": "with the capture sizes listed largest first you picked the wrong one: the list need "
        "not be sorted, so take the smallest fitting size, not the first.",
        "eager": "a batch larger than every captured size has no graph: it runs eagerly at its exact size, "
        "so return the batch itself.",
    },
    forbid=("specfix.mrv2.cudagraph:CudaGraphDispatcher.dispatch",),
)
def check_replayed_rows(answer, verdict):
    sizes = [s for s in cudagraph_capture_sizes() if s <= MAX_NUM_REQS]
    replays = bench.frame(recorded.load("bench_h200"), "drafter_graph").query("impl == 'graph'")
    runs = replays[["live_batch", "padded_batch"]].drop_duplicates().itertuples(index=False)
    for live, padded in sorted(runs):
        got = answer(int(live), list(sizes))
        said = f"A live batch of {live} got {got!r} rows."
        verdict.require(as_int(got) is not None, "not_int", said)
        verdict.require(got >= live, "too_few", said)
        next_up = min((s for s in sizes if s > live), default=None)
        verdict.require(not (live in sizes and got == next_up), "exact_fit", said)
        verdict.require(got != live or live == padded, "no_padding", said)
        verdict.require(got == padded, "not_smallest", f"{said[:-1]}; the H200 run replayed {padded}.")
    live = sizes[2] + 1
    got = answer(live, sorted(sizes, reverse=True))
    said = f"A live batch of {live} got {got} rows."
    verdict.require(got == min(s for s in sizes if s >= live), "unsorted", said)
    live = max(sizes) + 6
    try:
        got = answer(live, list(sizes))
    except Exception as error:  # e.g. min() of no fitting size, or a case left as NotImplementedError
        got = f"{type(error).__name__}: {error}"
    said = f"A live batch of {live} got {got!r}; the largest graph holds {max(sizes)}."
    verdict.require(got == live, "eager", said)


# -- ch5.which_syncs --------------------------------------------------------------------------------------


def _fix_names() -> dict[str, str]:
    """Every way the chapter names a fix (its key, its label, its letter) -> its key."""
    letters = {fix: label.rsplit("(", 1)[-1].rstrip(")") for fix, label in LABELS.items()}
    return {name: fix for fix, c in letters.items() for name in (fix, LABELS[fix], c, f"({c})")}


def syncing_fixes() -> set[str]:
    """The fixes whose step made the host wait for the GPU in the H200 run."""
    costs = fix_costs()  # the H200 recording
    return set(costs.loc[costs["host_syncs_per_step"] > 0, "fix"])


@checker(
    "ch5.which_syncs",
    solution="performance:which_syncs",
    todo="set which_syncs to the fixes (a, b, b', c, or their names) whose step makes the host wait",
    hints={
        "format": "answer with a set of fixes, by letter ('a', \"b'\") or by name ('clamp', 'host_mask').",
        "clamp": "clamp_ is a kernel the host queues and leaves: nothing needs a value back from the GPU.",
        "scheduler": "scheduler_zero works on the host's own lists, before the step's GPU work: there is "
        "nothing on the GPU to wait for.",
        "pinned": "a copy from pinned memory with non_blocking=True is queued like a kernel, and the host "
        "moves on: it costs host time to build the mask, not a wait.",
        "pageable": "a host tensor built with torch.tensor(..., device=...) is copied from pageable memory, "
        "and that copy makes the host wait for the GPU's queue.",
    },
)
def check_which_syncs(answer, verdict):
    answer, names = as_str_set(value_of(answer)), _fix_names()
    ok = answer is not None and all(a.strip() in names for a in answer)
    verdict.require(ok, "format", f"(names: {sorted(names)})")
    got, truth = {names[a.strip()] for a in answer}, syncing_fixes()
    for fix, hint in (("clamp", "clamp"), ("scheduler_zero", "scheduler"), ("host_mask_async", "pinned")):
        verdict.require(fix not in got or fix in truth, hint)
    verdict.require(truth <= got, "pageable")
