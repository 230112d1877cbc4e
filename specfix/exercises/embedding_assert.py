"""Chapter 2's exercises on the embedding's index assert, with their checkers.

The op table and the transcripts they read were recorded on a GPU (``specfix.tools.recorded``); the rest runs
the unfixed engine on the CPU.
"""

from __future__ import annotations

import bisect
import inspect
import itertools
import random
import re
from dataclasses import dataclass

import torch

from specfix.exercises.core import as_int_list, as_str_set, checker, value_of
from specfix.fixes import Fixes
from specfix.lab import embedding_assert as ea
from specfix.lab.guard import IndexGuardError, check_indices
from specfix.models import NgramLM
from specfix.tools import recorded
from specfix.tools.syncs import host_reads
from specfix.v1.engine import DEMO_PROMPTS, LLMEngine, SamplingParams

# -- ch2.clamp ------------------------------------------------------------------------------------------

#: A step of two requests with 3 drafts each ([last token, d1, d2, d3]); the second is padded with
#: placeholders. Rows 8:12 are CUDA-graph padding left from an earlier step; rows 12: lie past this step.
_BUFFER = [11, 42, 7, 19, 23, -1, -1, -1, 5, -1, -1, 30, -1, -1, 8, -1]
_NUM_TOKENS, _NUM_INPUT_TOKENS = 8, 12
_DRAFTS = [42, 7, 19, -1, -1, -1]


@checker(
    "ch2.clamp",
    solution="embedding_assert:preprocess",
    todo="write preprocess: return what the embedding reads, no id below 0; draft_token_ids keeps its -1",
    hints={
        "shape": "return what the embedding reads: the first num_input_tokens rows of input_ids (the "
        "scheduled tokens and the CUDA-graph padding after them), as a view of the buffer.",
        "metadata": "your clamp also rewrote draft_token_ids: the rejection sampler can no longer see the "
        "placeholder, and would verify a real token (0) in that slot. Clamp input_ids only.",
        "left_negative": "the embedding still reads a -1 among this step's tokens: on a GPU, that asserts.",
        "only_scheduled": "you clamped only [:num_tokens], but the embedding reads num_input_tokens rows: "
        "the CUDA-graph padding after them holds what an earlier step left there, a -1 included.",
        "changed_real": "you changed real ids: only -1s may change (clamp(min=0) leaves the rest alone).",
        "allocates": "you returned a new tensor (clamp without the underscore, torch.where, a copy): it "
        "allocates every step, and a graph captured on input_ids still reads its -1. Clamp in place.",
        "syncs": "your preprocess reads tensor values on the host (`if` on a tensor, .item(), nonzero): on "
        "a GPU each read waits for the queued kernels, every step, and no CUDA graph can capture it.",
    },
)
def check_clamp(answer, verdict):
    buffer, drafts = torch.tensor(_BUFFER, dtype=torch.int32), torch.tensor(_DRAFTS, dtype=torch.int32)
    before = buffer.clone()
    out, synced = host_reads(lambda: answer(buffer, _NUM_TOKENS, _NUM_INPUT_TOKENS, drafts))
    said = f"(got {type(out).__name__} of shape {tuple(getattr(out, 'shape', ()))})"
    verdict.require(isinstance(out, torch.Tensor) and out.shape == (_NUM_INPUT_TOKENS,), "shape", said)
    verdict.require(drafts.tolist() == _DRAFTS, "metadata", f"(draft_token_ids became {drafts.tolist()})")
    reads = f"(the embedding reads {out.tolist()})"
    verdict.require(bool((out[:_NUM_TOKENS] >= 0).all()), "left_negative", reads)
    verdict.require(bool((out >= 0).all()), "only_scheduled", reads)
    real = before[:_NUM_INPUT_TOKENS] >= 0
    verdict.require(torch.equal(out[real], before[:_NUM_INPUT_TOKENS][real]), "changed_real", reads)
    in_place = out.data_ptr() == buffer.data_ptr() and torch.equal(buffer[:_NUM_INPUT_TOKENS], out)
    verdict.require(in_place, "allocates")
    verdict.require(not synced, "syncs", f"(it called {', '.join(sorted(set(synced)))})")


# -- ch2.which_ops --------------------------------------------------------------------------------------

#: The kernel of the prediction: the one the embedding runs at a realistic batch size.
KERNEL = "vectorized_gather_kernel"


def assert_line(kernel: str = KERNEL) -> str:
    """One assert line of ``kernel`` exactly as the driver printed it in the recorded op table."""
    rows = recorded.load("embedding_assert_ops")["rows"]
    for row in sorted(rows, key=lambda row: (row["op"] != "F.embedding", -row["num_indices"])):
        for a in ea.device_asserts(row.get("transcript", "")):
            if a.kernel == kernel:
                where = f"{a.where}: {a.kernel}: block: [{a.block}], thread: [{a.thread}]"
                return f"{where} Assertion `{a.condition}` failed."
    raise LookupError(f"no assert line of {kernel!r} in the recorded op table")


def ops_with_minus_one(kernel: str = KERNEL) -> set[str]:
    """The ops whose CUDA run with a -1 among the indices asserted in ``kernel`` (at any recorded count)."""
    rows = recorded.load("embedding_assert_ops")["rows"]
    asserted = (row for row in rows if row["bad"] == "-1" and row["cuda"].get("outcome") == "device assert")
    return {row["op"] for row in asserted if row["cuda"]["kernel"] == kernel}


@checker(
    "ch2.which_ops",
    solution="embedding_assert:which_ops",
    todo=f"set which_ops to the set of ops (names from the op table) that can print this {KERNEL} line "
    "when the bad index is -1",
    hints={
        "not_ops": "answer with a set of op names as the op table writes them, e.g. {'torch.gather'}.",
        "wraps": "w[idx] and torch.take accept -1 (Python's wrap-around rule): w[idx] returns the last row, "
        "torch.take the last element, and neither asserts. Only an index equal to the size makes them "
        "assert.",
        "gather_only": "the kernel's name says gather, but it is not only gather's kernel: read the table's "
        "column for the larger index count, where other ops end in it too.",
        "missed_embedding": "F.embedding is missing: with the larger index count the embedding's lookup "
        "runs this kernel. That is the batch size of a serving engine.",
        "family_only": "you kept to the embedding's own family (F.embedding, index_select): at the larger "
        "index count this kernel is shared with an op outside that family.",
        "incomplete": "not the set the recorded table shows: compare each op's -1 row at both index counts.",
    },
)
def check_which_ops(answer, verdict):
    answer, names = as_str_set(value_of(answer)), set(ea.OPS)  # a set, or a function that returns one
    verdict.require(answer is not None and answer <= names, "not_ops", f"(names: {sorted(names)})")
    verdict.require(not answer & {"w[idx]", "torch.take"}, "wraps")
    verdict.require(answer != {"torch.gather"}, "gather_only")
    verdict.require("F.embedding" in answer, "missed_embedding")
    verdict.require(answer != {"F.embedding", "torch.index_select"}, "family_only")
    verdict.require(answer == ops_with_minus_one(), "incomplete")


# -- ch2.first_bad_op -----------------------------------------------------------------------------------


def _squeeze(line: str) -> str:
    """A line of code with its whitespace removed, so that spacing never decides a match."""
    return re.sub(r"\s+", "", line)


def forward_lines() -> list[str]:
    """The code lines of the model's forward (``specfix.models.NgramLM.forward``), comments left out."""
    lines = inspect.getsource(NgramLM.forward).splitlines()
    return [line.rstrip() for line in lines if line.strip() and not line.strip().startswith("#")]


@checker(
    "ch2.first_bad_op",
    solution="embedding_assert:first_bad_op",
    todo="set first_bad_op to the line of NgramLM.forward (from forward_lines()) whose kernel asserted",
    hints={
        "not_a_line": "answer with one line of NgramLM.forward, as a string copied from forward_lines().",
        "traceback_line": "that is the line where the traceback ends: where Python heard of the error, the "
        "first CUDA call after the kernel had trapped. The failing kernel ran earlier.",
        "not_in_forward": "that is not a line of NgramLM.forward: copy one from forward_lines().",
        "other_embedding": "that lookup is an embedding too (the same kernel family), but its ids come from "
        "searchsorted and torch.where and never go below 0: which lookup gets the raw input_ids?",
        "indexing": "that line indexes with x[idx], which can assert too, but its indices are never "
        "negative: they pass through torch.where(..., scratch) or a clamped searchsorted.",
        "wrong_line": "that line looks nothing up by index (no embedding, no x[idx]), and the kernel in the "
        "assert line is a lookup that read an index out of range: which lookup gets ids that can be -1?",
    },
)
def check_first_bad_op(answer, verdict):
    runs = recorded.load("embedding_assert_transcripts")["runs"]
    # "file:line in func: code" of each recorded run: the kernel that asserted, where Python heard of it
    expected, heard = (
        _squeeze(ea.where_python_heard(ea.ChildRun.from_json(runs[run])).partition(": ")[2])
        for run in ("pipeline_blocking", "pipeline")
    )
    answer = value_of(answer)  # a line, or a function that returns one
    verdict.require(isinstance(answer, str) and bool(answer.strip()), "not_a_line")
    line = _squeeze(answer)
    verdict.require(line != heard, "traceback_line")
    verdict.require(line in {_squeeze(code) for code in forward_lines()}, "not_in_forward")
    verdict.match(
        line == expected,
        "",
        "wrong_line",
        other_embedding=bool(re.search(r"\btable\(", line)),
        indexing=bool(re.search(r"[\w)]\[(?!:)", line)),
    )


# -- ch2.guard_positions ----------------------------------------------------------------------------------


@dataclass
class GuardReport:
    """The guard's error on the unfixed engine's first step, and that step's layout in batch order."""

    error: IndexGuardError
    positions: list[int]  # in input_ids, of the error's bad values
    req_ids: list[str]
    cu_num_tokens: list[int]  # inclusive running sum of each request's tokens in input_ids, no leading 0


def guard_report() -> GuardReport:
    """Chapter 2's demo batch on the unfixed engine, its first step run under ``check_indices`` on the CPU
    (the guard raises before any kernel runs, so the step is the same everywhere)."""
    engine = LLMEngine(num_speculative_tokens=3, fixes=Fixes(clamp_placeholders=False), device="cpu")
    params = SamplingParams(temperature=0.7, seed=0, max_tokens=24)
    for prompt, remote in zip(DEMO_PROMPTS, (True, False, True, False), strict=True):
        engine.add_request(prompt, params, remote_prefill=remote)
    layout, prepare = {}, engine.model_runner._prepare_inputs

    def recording_prepare(scheduler_output):  # the step's batch order and cu_num_scheduled_tokens
        req_ids, cu, *rest = prepare(scheduler_output)
        layout.update(req_ids=list(req_ids), cu=[int(c) for c in cu])
        return (req_ids, cu, *rest)

    engine.model_runner._prepare_inputs = recording_prepare
    try:
        with check_indices():
            engine.step()
    except IndexGuardError as error:
        return GuardReport(error, [p[0] for p in error.positions], layout["req_ids"], layout["cu"])
    raise RuntimeError("the unfixed engine's first step passed the index guard")


def _position_cases(seed: int = 0, count: int = 12) -> list[tuple[list[int], list[int], list[str]]]:
    """(positions, cu_num_tokens, req_ids): the guard's step, then a family with 0-token requests."""
    report = guard_report()
    cases = [(report.positions, report.cu_num_tokens, report.req_ids)]
    rng = random.Random(seed)
    for _ in range(count):
        counts = [rng.randint(0, 4) for _ in range(rng.randint(2, 6))]
        counts[rng.randrange(len(counts))] += 1  # at least one token
        cu = list(itertools.accumulate(counts))
        positions = sorted({c for c in cu[:-1] if c < cu[-1]} | {rng.randrange(cu[-1]) for _ in range(4)})
        cases.append((positions, cu, [f"req-{i}" for i in range(len(counts))]))
    return cases


@checker(
    "ch2.guard_positions",
    solution="embedding_assert:requests_at",
    todo="write requests_at(positions, cu_num_tokens, req_ids): the request id of each reported position",
    hints={
        "format": "return a list with one request id (a string from req_ids) per position.",
        "indices": "those are batch indices: give the request ids themselves (req_ids[i]).",
        "boundary": "a position equal to cu_num_tokens[i] is not request i's: cu[i] is where request i's "
        "tokens end (exclusive), so that position is the first of a later request.",
        "exclusive": "cu_num_tokens has no leading 0: entry i is where request i ends, not where it starts.",
        "empty_request": "you gave a position to a request that holds no token at all (its count is 0, so "
        "its cu entry equals the one before it).",
        "wrong": "a position was mapped to the wrong request.",
    },
)
def check_guard_positions(answer, verdict):
    for positions, cu, req_ids in _position_cases():
        got = answer(list(positions), list(cu), list(req_ids))
        truth = [bisect.bisect_right(cu, p) for p in positions]  # the first request ending past p
        verdict.require(as_int_list(got) != truth, "indices")
        ok = isinstance(got, (list, tuple)) and len(got) == len(positions) and all(g in req_ids for g in got)
        verdict.require(ok, "format", f"(you returned {got!r})")
        got = [req_ids.index(g) for g in got]
        empty = {i for i, c in enumerate(cu) if c == (cu[i - 1] if i else 0)}
        verdict.match(
            got == truth,
            f"(positions {positions}, cu_num_tokens {cu}: you said {[req_ids[g] for g in got]})",
            boundary=got == [bisect.bisect_left(cu, p) for p in positions],
            exclusive=got == [max(bisect.bisect_right(cu, p) - 1, 0) for p in positions],
            empty_request=bool(set(got) & empty),
        )
