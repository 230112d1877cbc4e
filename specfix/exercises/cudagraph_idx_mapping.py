"""Chapter 3's exercises on the ``-1`` padding of ``idx_mapping`` and the stale rows that corrupt responses.

Each checker runs the chapter's history, then crafted and seeded ones the reader never sees, against the real
speculator on the CPU.
"""

from __future__ import annotations

import random

import torch

from specfix.exercises.core import as_int_list, as_str_set, checker, value_of
from specfix.fixes import Fixes
from specfix.lab.padding_bench import SpecDecodeEngine, _Live, make_requests
from specfix.lab.stale_rows import ORIGIN_FRESH, PaddedWrite, StaleRowScenario, padded_step_scenario
from specfix.models import load_models
from specfix.mrv2 import dflash

#: ch3.pad_idx_mapping: the buffer as an earlier batch of 8 left it, and the two batches written into it.
STALE_BUFFER = (7, 6, 5, 4, 3, 2, 1, 0)
BATCHES = ((5, 3, 0, 1, 4, 2), (4, 0, 2))
#: ch3.stale_victims: the history to predict from (requests are letters; see StaleRowScenario.play).
PREDICT_EVENTS = ("step abcdefg", "finish cf", "step abdeg")
UNFIXED = Fixes(pad_idx_mapping=False)
#: The hints of the exercises answered with a set of requests.
_NAME_HINTS = {
    "format": "answer with a set of request names (letters), e.g. {'b', 'e'}.",
    "unknown": "name only requests of the history.",
}


@checker(
    "ch3.pad_idx_mapping",
    solution="cudagraph_idx_mapping:pad_idx_mapping",
    todo="write pad_idx_mapping: the batch into buffer[:num_reqs], -1 into every row after it, in place",
    hints={
        "new_tensor": "the persistent buffer did not change: you built a new tensor (or rebound `buffer`). "
        "A captured CUDA graph reads the address fixed at capture: write in place (.copy_(), .fill_()).",
        "padded_live": "the live rows came out -1 too: the -1 must go only after the batch "
        "(buffer[num_reqs:]), or the live requests themselves are skipped by the sampler.",
        "live_rows": "the live rows must hold this step's idx_mapping in batch order: buffer[:num_reqs] = "
        "idx_mapping[:num_reqs].",
        "fill_zero": "you padded with 0, but 0 is a real request-state slot: every padded row would write "
        "its garbage logits into draft_logits[0], the request in slot 0. The sampler skips -1 only.",
        "stale_tail": "rows past num_reqs still hold slots an earlier, larger batch left. The copy knows "
        "num_reqs, not the captured size the step replays (picked afterwards): every later row must be -1.",
        "pad_value": "the padded rows must be -1, the value the sampler's req_state_idx >= 0 mask skips.",
        "changed_input": "you changed the idx_mapping argument: it is the batch's own table, read again by "
        "verification; write only the persistent buffer.",
    },
)
def check_pad_idx_mapping(answer, verdict):
    buffer = torch.tensor(STALE_BUFFER, dtype=torch.int32)
    address = buffer.data_ptr()
    for batch in BATCHES:
        before, idx, n = buffer.clone(), torch.tensor(batch, dtype=torch.int32), len(batch)
        answer(buffer, idx, n)
        shown = f"(after the batch {list(batch)} the buffer is {buffer.tolist()})"
        verdict.require(idx.tolist() == list(batch), "changed_input")
        verdict.require(buffer.data_ptr() == address and not torch.equal(buffer, before), "new_tensor", shown)
        verdict.require(not bool((buffer[:n] == -1).any()), "padded_live", shown)
        verdict.require(torch.equal(buffer[:n], idx), "live_rows", shown)
        tail, old_tail = buffer[n:], before[n:]
        verdict.require(not bool((tail == 0).all()), "fill_zero", shown)
        verdict.require(not bool(((tail == old_tail) & (old_tail >= 0)).any()), "stale_tail", shown)
        verdict.require(bool((tail == -1).all()), "pad_value", shown)


def _names(verdict, answer, events) -> set[str]:
    """The request letters of a set, list or string of names, each of them a request of ``events``."""
    names = as_str_set([answer] if isinstance(answer, str) else answer)
    verdict.require(names is not None, "format")
    names = {c for name in names for c in name if c.isalpha()}
    everyone = {c for event in events for c in event.split()[1]}
    verdict.require(names <= everyone, "unknown", f"(the history has {sorted(everyone)})")
    return names


@checker(
    "ch3.stale_victims",
    solution="cudagraph_idx_mapping:stale_victims",
    todo="set stale_victims to the set of live requests whose slot a padded row names, e.g. {'b', 'e'}",
    hints={
        **_NAME_HINTS,
        "finished": "a finished request has no draft logits to lose: its slot is free, and a padded row "
        "writing a free slot harms nobody (until a new request takes that slot).",
        "not_written": "you missed a victim of a padded row that no step ever wrote: such a row still holds "
        "what the buffer was created with, and that value can name a live slot.",
        "moved": "you missed a victim of a row a request left: a request that moved to an earlier row keeps "
        "its slot, and the row it left still names that slot.",
        "too_many": "a live request is overwritten only if some padded row names its slot.",
    },
)
def check_stale_victims(answer, verdict):
    names = _names(verdict, value_of(answer), PREDICT_EVENTS)  # a function may compute the prediction
    state = padded_step_scenario(list(PREDICT_EVENTS), fixes=UNFIXED)
    live, truth = set(state.owners.values()), set(state.victims)
    verdict.require(not names - live, "finished", f"({sorted(names - live)} finished)")
    for w in state.writes:
        if w.victim in truth - names:
            # No row or slot in the message: the hint names the misconception, not where the answer sits.
            verdict.require(False, "not_written" if w.origin == ORIGIN_FRESH else "moved")
    verdict.require(names == truth, "too_many", f"({sorted(names - truth)} are not named by a padded row)")


# -- ch3.corrupted_responses --------------------------------------------------------------------------------

#: The history to predict from. Steps run in vLLM's order: each scheduled request first verifies the drafts
#: of its last step (against the draft logits cached then), then drafts anew. A live request left out of a
#: step waits with its drafts and their cached logits.
RESPONSE_EVENTS = ("arrive abcdefgh", "step bhdgfc", "step hbe", "finish c", "step hbefg")
#: The checker's histories: the chapter's, one crafted to hit a request while it waits for good (c), then two
#: drawn once from a seeded family. In each, no padded row names a slot of its own batch, and every
#: overwritten cache that a verification reads changes its response (the tests check both).
_RESPONSE_CASES = (
    RESPONSE_EVENTS,
    ("arrive abcdefgh", "step bhdgfc", "step hba", "step hbefg"),
    ("arrive abcdef", "step cdae", "finish a", "step bcf", "step bfc", "step debcf"),
    ("arrive abcdefgh", "step dhgc", "step fdcbehg", "step bhcfde", "step gdehbcaf"),
)


def run_schedule(events, fixes: Fixes, max_num_reqs: int = 8) -> dict[str, list[int]]:
    """Each request's emitted token ids after ``events`` on the CPU, the drafter padded to capture sizes."""
    target, draft = load_models("cpu")
    engine = SpecDecodeEngine(  # two draft tokens per step
        target, draft, max_num_reqs=max_num_reqs, num_speculative_steps=2, device="cpu", fixes=fixes
    )
    width = engine.spec.context_ids.shape[1]
    requests = {chr(ord("a") + i): r for i, r in enumerate(make_requests(26, seed=3, max_tokens=(1, 1)))}
    live, drafts = {}, {}
    for event in events:
        verb, names = event.split()
        if verb == "finish":
            for name in names:
                engine.states.remove_request(name)
            continue
        for name in (n for n in names if n not in live):  # arrives: a slot, its prompt prefilled
            req = requests[name]
            live[name] = _Live(req, engine.states.add_request(name, 1.0, req.seed), list(req.prompt))
            engine._prefill(live[name])
        if verb == "arrive":
            continue
        verify = [n for n in names if n in drafts]  # a request's first step has nothing to verify
        if verify:
            rows, proposed = [live[n] for n in verify], torch.stack([drafts[n] for n in verify])
            idx, pos = _batch(rows)
            # MRV2's rejection step: draws keyed by (seed, position), so only overwritten logits change them
            sampled, num_sampled = engine._verify(rows, idx, pos, proposed)
            for e, row, count in zip(rows, sampled.tolist(), num_sampled.tolist(), strict=True):
                e.tokens += row[:count]
                e.out += row[:count]
        rows = [live[n] for n in names]
        idx, pos = _batch(rows)
        context = torch.tensor([e.tokens[-width:] for e in rows])
        proposal = engine.spec.propose(
            len(names), idx, engine.states.temperature, engine.states.seeds, context, pos
        )
        drafts.update((n, d.clone()) for n, d in zip(names, proposal.draft_tokens, strict=True))
    return {name: e.out for name, e in live.items()}


def _batch(rows: list[_Live]) -> tuple[torch.Tensor, torch.Tensor]:
    """``idx_mapping`` and the last token's position of each row."""
    idx = torch.tensor([e.slot for e in rows], dtype=torch.int32)
    return idx, torch.tensor([len(e.tokens) - 1 for e in rows])


def padded_writes(events, max_num_reqs: int = 8) -> list[tuple[int, PaddedWrite]]:
    """(event index, write) of each padded row naming a slot in ``events``, on the unfixed speculator."""
    return [(i, w) for i, w, _ in _played(events, max_num_reqs)]


def _played(events, max_num_reqs: int = 8):
    """:func:`padded_writes`, each with the slot every request that finished before it held last."""
    scenario, freed = StaleRowScenario(fixes=UNFIXED, max_num_reqs=max_num_reqs, device="cpu"), {}
    for number, event in enumerate(events):
        verb, names = event.split()
        if verb == "finish":
            freed |= {n: scenario.states.req_id_to_index[n] for n in names}
        state = scenario.play([event])
        if verb == "step":
            yield from ((number, w, dict(freed)) for w in state.writes)


def _write_kinds(events: tuple[str, ...]) -> dict[str, set[str]]:
    """Requests by what a padded write did to them, each kind named by the hint it earns."""
    kinds = {k: set() for k in ("victim", "undrafted", "unread", "finished", "earlier")}
    ran = [(i, e.split()[1]) for i, e in enumerate(events) if e.startswith("step")]
    writes = list(_played(events))
    last = max((i for i, *_ in writes), default=-1)
    for i, w, freed in writes:
        if w.victim is None:  # a free slot: whoever held it has finished
            kinds["finished"] |= {n for n, slot in freed.items() if slot == w.slot}
            continue
        if not any(w.victim in names for j, names in ran if j < i):
            kind = "undrafted"  # waiting, nothing drafted yet
        elif not any(w.victim in names for j, names in ran if j > i):
            kind = "unread"  # waiting, never runs again
        else:
            kind = "victim"
        kinds[kind].add(w.victim)
        if kind == "victim" and i != last:  # hit by a padded step before the last one
            kinds["earlier"].add(w.victim)
    return kinds


@checker(
    "ch3.corrupted_responses",
    solution="cudagraph_idx_mapping:corrupted_responses",
    todo="write corrupted_responses: the set of requests whose response the unfixed engine corrupts",
    hints={
        **_NAME_HINTS,
        "finished": "a padded row that names the slot of a finished request writes a free slot: that "
        "request's response is complete, and a later owner of the slot writes its own draft logits before "
        "anything reads them.",
        "undrafted": "a waiting request that has not run yet has no cached draft logits to lose: its first "
        "step drafts, and writes its own, before any verification reads them.",
        "unread": "overwritten draft logits corrupt a response only when a verification reads them: that "
        "request never runs again after the padded step that hit its slot.",
        "earlier": "you missed a victim of an earlier padded step: every padded step can hit a waiting "
        "request's cache, and the damage waits for its next verification.",
        "missed": "you missed a request whose cached draft logits a padded row overwrote while it waited.",
        "too_many": "a response comes out corrupted only if a padded row named the request's slot while it "
        "waited with drafts, and a later step verified them.",
    },
    forbid=(
        "specfix.exercises.cudagraph_idx_mapping:run_schedule",
        "specfix.lab.stale_rows:StaleRowScenario.play",
        "specfix.mrv2.speculator:DraftModelSpeculator.propose",
    ),
)
def check_corrupted_responses(answer, verdict):
    for events in _RESPONSE_CASES:
        names = _names(verdict, answer(list(events), 8), events)
        kinds = _write_kinds(events)
        truth = kinds["victim"]  # on these cases, the responses real runs change (the tests run them)
        said = f"(history {list(events)})"
        for kind in ("finished", "undrafted", "unread"):
            verdict.require(not names & (kinds[kind] - truth), kind, said)
        missed = truth - names
        verdict.require(not missed & kinds["earlier"], "earlier", said)
        verdict.require(not missed, "missed", said)
        verdict.require(names == truth, "too_many", said)


# -- ch3.find_stale_row -------------------------------------------------------------------------------------

#: The history that left the mystery drafter corrupted (hidden in the notebook), and the step that goes wrong.
_MYSTERY_HISTORY = ("step abcdefgh", "step hgfedcba", "finish abe")
MYSTERY_BATCH = "hgfdc"


class Mystery(StaleRowScenario):
    """A drafter as an unfixed engine left it, and its next step (``check_speculator(spec, *inputs)``)."""

    def __init__(self, events, batch: str):
        super().__init__(fixes=UNFIXED, max_num_reqs=8, device="cpu")
        self.play(list(events))
        self.batch = batch

    @property
    def inputs(self) -> tuple:
        return self.step_inputs(self.batch)


#: The checker's mysteries after the notebook's, drawn once from a seeded family of histories whose next batch
#: runs every live request: the first padded row of the first names a free slot, the culprit row of the second
#: was never written (it names slot 0 from the buffer's zeros).
_HIDDEN_MYSTERIES = (
    (("step abcdefg", "finish cf"), "dbaeg"),
    (("step abc", "finish b", "arrive defg"), "efadgc"),
    (("step abcde", "finish abde", "arrive fghijk"), "gkjhfic"),
)


def mystery_batch(events=None, batch: str | None = None) -> Mystery:
    """A fresh copy of the corrupted drafter and its next batch (the notebook's, unless ``events`` and
    ``batch`` are given), on the CPU, where the padded row's store lands after the live row's (a GPU launch
    leaves that to chance). No defaults in the signature Jupyter shows: the history is the puzzle."""
    if (events is None) != (batch is None):
        raise ValueError("give events and batch together, or neither (the notebook's mystery)")
    return Mystery(_MYSTERY_HISTORY if events is None else events, MYSTERY_BATCH if batch is None else batch)


def _culprits(mystery: Mystery) -> set[tuple[int, int]]:
    """(padded row, slot) of every padded row whose stale entry names a live request's slot."""
    n = len(mystery.batch)
    padded = mystery.spec.dispatcher.dispatch(n).num_reqs_padded
    idx = mystery.spec.idx_mapping.tolist()
    return {(r, idx[r]) for r in range(n, padded) if mystery.states.owner(idx[r]) is not None}


@checker(
    "ch3.find_stale_row",
    solution="cudagraph_idx_mapping:find_stale_row",
    todo="write find_stale_row: (row, slot) of the padded row whose stale entry corrupts a live request",
    hints={
        "format": "return a pair of ints: (padded row, request-state slot).",
        "swapped": "row and slot are swapped: the row is a position in idx_mapping, the slot its value.",
        "live_row": "a request of this batch sits at that row: the culprit is a padded row, >= num_reqs.",
        "beyond_graph": "that row lies beyond the graph this batch replays: the replay never reads it.",
        "not_there": "that row does not hold that slot: the slot is idx_mapping[row].",
        "free_slot": "that padded row names a free slot: its write harms nobody. The report's draft_logits "
        "rows are the live slots that changed; find the padded row naming one of them.",
    },
    forbid=("specfix.lab.stale_rows:StaleRowScenario.play", "specfix.lab.stale_rows:StaleRowScenario._step"),
)
def check_find_stale_row(answer, verdict):
    for case in ((), *_HIDDEN_MYSTERIES):  # the notebook's mystery, then histories the reader never saw
        mystery = mystery_batch(*case)
        found = as_int_list(answer(mystery))
        verdict.require(found is not None and len(found) == 2, "format")
        (row, slot), truth = found, _culprits(mystery)
        n, idx = len(mystery.batch), mystery.spec.idx_mapping.tolist()
        verdict.require((slot, row) not in truth or (row, slot) in truth, "swapped")
        if 0 <= row < n:
            verdict.require(False, "live_row", f"(row {row} holds request {mystery.batch[row]})")
        padded = mystery.spec.dispatcher.dispatch(n).num_reqs_padded
        verdict.require(n <= row < padded, "beyond_graph", f"(the graph has {padded} rows)")
        verdict.require(idx[row] == slot, "not_there", f"(row {row} holds {idx[row]})")
        verdict.require((row, slot) in truth, "free_slot")


# -- ch3.simulate_idx_mapping -------------------------------------------------------------------------------


#: (events, max_num_reqs): the chapter's two histories, one where f and g reuse b's and d's slots, then a
#: family drawn once from a seeded generator (the tests hold it, and check the reference on more of it).
_SIMULATION_CASES = ((PREDICT_EVENTS, 8), ((*_MYSTERY_HISTORY, f"step {MYSTERY_BATCH}"), 8)) + tuple(
    (tuple(history.split(", ")), max_num_reqs)
    for history, max_num_reqs in (
        ("step abcde, finish bd, arrive f, step eafg", 8),
        ("step dbca, step abe, step abd, arrive fgh, step haegf", 8),
        ("step a, step ba, arrive c, step cba", 4),
        ("arrive abcdef, step cb, finish cdaefb", 8),
        ("step badc, step c", 4),
        ("step acedb, arrive fg, step a, step g, finish befagd, arrive h, step c, arrive ijk, step c", 8),
        ("arrive a, step a, finish a, arrive bcde, step edcb", 4),
        ("step ba, finish ba, step ced", 4),
        ("arrive abcd, step bd, step bdc, step ab", 4),
    )
)


@checker(
    "ch3.simulate_idx_mapping",
    solution="cudagraph_idx_mapping:simulate_idx_mapping",
    todo="write simulate_idx_mapping: the unfixed idx_mapping buffer (max_num_reqs ints) after events",
    hints={
        "format": "return the whole buffer: a list of max_num_reqs ints.",
        "starts_minus_one": "the buffer is created as zeros, not -1: a row no step ever wrote names slot 0.",
        "pads_minus_one": "you wrote -1 after each batch: that is the fix. Without it a step writes only "
        "its own rows, and every row after them keeps what an earlier step left there.",
        "finish_clears": "finishing frees a slot but writes nothing to idx_mapping: rows naming it still do.",
        "slot_not_reused": "a new request takes the lowest free slot, and a finished request's slot is free "
        "again: slots are reused, they do not keep counting up.",
        "rows_by_name": "a request's row is its position in this step's batch, not a place of its own: the "
        "same request can sit at a different row in every step.",
        "wrong": "not the buffer the unfixed speculator ends with.",
    },
    forbid=(
        "specfix.lab.stale_rows:StaleRowScenario.play",
        "specfix.mrv2.speculator:DraftModelSpeculator.propose",
    ),
)
def check_simulate_idx_mapping(answer, verdict):
    for events, max_num_reqs in _SIMULATION_CASES:
        events = list(events)
        got = as_int_list(answer(list(events), max_num_reqs))
        verdict.require(got is not None and len(got) == max_num_reqs, "format", f"(you returned {got!r})")
        scenario = StaleRowScenario(fixes=UNFIXED, max_num_reqs=max_num_reqs)  # the real thing, unfixed
        scenario.play(list(events))
        want = scenario.spec.idx_mapping.tolist()
        slips = _wrong_simulations(events, max_num_reqs) if got != want else {}
        verdict.match(
            got == want, f"(after {events} you gave {got})", **{h: got == s for h, s in slips.items()}
        )


def _wrong_simulations(events: list[str], max_num_reqs: int) -> dict[str, list[int]]:
    """The buffer each typical slip gives, by the hint that names it."""

    def simulate(start=0, pad=False, clear=False, reuse=True, by_name=False):
        buffer, slots, next_new = [start] * max_num_reqs, {}, 0
        for event in events:
            verb, names = event.split()
            if verb == "finish":
                for n in names:
                    gone = slots.pop(n)
                    buffer = [-1 if clear and s == gone else s for s in buffer]
                continue
            for n in (n for n in names if n not in slots):
                slots[n] = min(set(range(max_num_reqs)) - set(slots.values())) if reuse else next_new
                next_new += 1
            if verb == "step":
                for row, n in enumerate(names):
                    buffer[slots[n] if by_name else row] = slots[n]
                if pad:
                    buffer[len(names) :] = [-1] * (max_num_reqs - len(names))
        return buffer

    return {
        "starts_minus_one": simulate(start=-1),
        "pads_minus_one": simulate(pad=True),
        "finish_clears": simulate(clear=True),
        "slot_not_reused": simulate(reuse=False),
        "rows_by_name": simulate(by_name=True),
    }


# -- ch3.dflash_padding --------------------------------------------------------------------------------------


def _dflash_cases(seed: int = 0, count: int = 8) -> list[tuple[list[int], int, int, int]]:
    """(idx_mapping, num_reqs, k, max_num_reqs): the chapter's step, then a family with stale slots."""
    cases = [([2, 0, 1, 3], 2, 3, 4)]
    rng = random.Random(seed)
    for _ in range(count):
        max_num_reqs, k = rng.choice((4, 8)), rng.randint(1, 4)
        idx = rng.sample(range(max_num_reqs), max_num_reqs)
        cases.append((idx, rng.randint(1, max_num_reqs - 1), k, max_num_reqs))
    return cases


def _dflash_truth(idx_mapping: list[int], num_reqs: int, k: int, max_num_reqs: int) -> list[int]:
    out = dflash.DFlashInputs.allocate(max_num_reqs, k)
    out.sample_idx_mapping.fill_(99)  # what an earlier step left: the preparation must write every entry
    table, idx = torch.arange(max_num_reqs), torch.tensor(idx_mapping, dtype=torch.int32)
    dflash.prepare_dflash_inputs(num_reqs, idx, table, table + 5, 16, out, Fixes(), use_triton=False)
    return out.sample_idx_mapping.tolist()


@checker(
    "ch3.dflash_padding",
    solution="cudagraph_idx_mapping:sample_idx_mapping",
    todo="write sample_idx_mapping: the max_num_reqs * k entries DFlash's sampler reads, padded with the fix",
    hints={
        "format": "return max_num_reqs * k ints: one entry per drafted token the graph samples.",
        "pads_zero": "you padded with 0, request-state slot 0: that is the bug. Every padded entry would "
        "write its logits into slot 0's draft logits; pad with -1, which the sampler skips.",
        "not_expanded": "each request drafts k tokens, so it has k entries in a row, all naming its slot.",
        "interleaved": "the entries are request by request: all k of the first request, then all k of the "
        "next (repeat each slot k times, do not repeat the list k times).",
        "stale_rows": "rows past num_reqs hold stale slots of earlier steps: padding, not requests.",
        "wrong": "not the sample_idx_mapping the fixed preparation writes.",
    },
    forbid=("specfix.mrv2.dflash:prepare_dflash_inputs", "specfix.mrv2.dflash:_prepare_reference"),
)
def check_dflash_padding(answer, verdict):
    for idx, n, k, max_num_reqs in _dflash_cases():
        got = as_int_list(answer(torch.tensor(idx, dtype=torch.int32), n, k, max_num_reqs))
        verdict.require(got is not None and len(got) == max_num_reqs * k, "format", f"(you returned {got!r})")
        want, pad = _dflash_truth(idx, n, k, max_num_reqs), [-1] * ((max_num_reqs - n) * k)
        verdict.match(
            got == want,
            f"(idx_mapping {idx}, num_reqs {n}, k {k}: you returned {got})",
            pads_zero=got == want[: n * k] + [0] * len(pad),
            interleaved=got == idx[:n] * k + pad and n > 1 and k > 1,
            not_expanded=got[:n] == idx[:n] and k > 1,
            stale_rows=got[n * k :] == [s for s in idx[n:] for _ in range(k)],
        )
