"""Chapter 1's exercises on the ``-1`` placeholder's path through one engine step, with their checkers.

Each runs the reader's answer against specfix's own model runner, engine or rejection sampler on the CPU, on
the chapter's batch and on crafted and seeded ones it never prints.
"""

from __future__ import annotations

import random

import pandas as pd
import torch

from specfix.exercises.core import as_int, as_int_list, checker, value_of
from specfix.fixes import Fixes
from specfix.lab.guard import IndexGuardError, check_indices
from specfix.models import load_models
from specfix.tokenizer import get_tokenizer
from specfix.v1 import rejection_kernels
from specfix.v1.engine import LLMEngine, generate
from specfix.v1.model_runner import GPUModelRunner, StepTrace
from specfix.v1.scheduler import CachedRequestData, NewRequestData, SamplingParams, SchedulerOutput

_GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


# -- ch1.metadata ----------------------------------------------------------------------------------------

#: The debug exercise's batch, in batch order: (request, token ids so far, tokens computed, drafts).
#: "a" and "d" decode: a two-token prompt and the token they sampled last step, whose KV is computed in this
#: step with three draft slots after it. "b" prefills six prompt tokens. "c" is the first decode on a P/D
#: decode node (padded): all three are prompt tokens, two computed on the prefill node. "d"'s last two
#: drafts were rejected by a grammar (-1 too in vLLM, on the async path with structured output).
METADATA_BATCH = (
    ("a", [5, 11, 30], 2, [17, 4, 9]),
    ("b", [40, 41, 42, 43, 44, 45], 0, []),
    ("c", [8, 2, 22], 2, [-1, -1, -1]),
    ("d", [3, 14, 35], 2, [13, -1, -1]),
)
_METADATA_KEYS = ("num_draft_tokens", "cu_num_draft_tokens", "placeholder_indices")


def metadata_scheduler_output(batch=METADATA_BATCH) -> SchedulerOutput:
    """The scheduler output of ``batch`` (by default ``ch1.metadata``'s), every request new to the runner,
    which takes a request's token ids so far (prompt and sampled tokens alike) as its row."""
    new = [NewRequestData(r, prompt, _GREEDY, computed) for r, prompt, computed, _ in batch]
    scheduled = {r: len(prompt) - computed + len(drafts) for r, prompt, computed, drafts in batch}
    drafts = {r: list(d) for r, _, _, d in batch if d}
    return SchedulerOutput(new, CachedRequestData(), scheduled, sum(scheduled.values()), drafts, {}, set())


def _prepared(batch=METADATA_BATCH):
    """A fresh model runner after ``_prepare_inputs`` on ``batch``: (runner, cu_num_scheduled, metadata)."""
    target, _ = load_models("cpu")
    runner = GPUModelRunner(target, device="cpu")
    output = metadata_scheduler_output(batch)
    runner._update_states(output)
    _, cu_num_scheduled, _, metadata = runner._prepare_inputs(output)
    return runner, cu_num_scheduled, metadata


def _metadata_truth() -> dict[str, list[int]]:
    """What the model runner builds from :func:`metadata_scheduler_output`, plus where its ``-1``s sit."""
    runner, cu_num_scheduled, metadata = _prepared()
    drafts = metadata.draft_token_ids.cpu()
    return {
        "num_draft_tokens": list(metadata.num_draft_tokens),
        "cu_num_draft_tokens": metadata.cu_num_draft_tokens.cpu().tolist(),
        "placeholder_indices": torch.nonzero(drafts == -1).flatten().tolist(),
        "input_ids": runner.input_ids.cpu[: int(cu_num_scheduled[-1])].tolist(),
    }


def metadata_table():
    """The ``ch1.metadata`` batch as the reader sees it: one row per request, in batch order."""
    scheduled = metadata_scheduler_output().num_scheduled_tokens
    columns = ["tokens so far", "already computed", "num_scheduled_tokens", "scheduled_spec_decode_tokens"]
    rows = {r: (len(tokens), computed, scheduled[r], d) for r, tokens, computed, d in METADATA_BATCH}
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns).rename_axis("request")


@checker(
    "ch1.metadata",
    solution="placeholder_lifecycle:metadata_answer",
    todo="fill in the three lists of `answer` for the scheduler output shown above",
    hints={
        "format": "answer must be a dict with the keys num_draft_tokens, cu_num_draft_tokens and "
        "placeholder_indices, each a list of ints.",
        "missing_request": "every request in the batch has an entry, 0 for a request without drafts (the "
        "prefill 'b'): the per-request tensors have one entry per request.",
        "placeholders_not_counted": "placeholders count as drafts: num_draft_tokens[i] is "
        "len(scheduled_spec_decode_tokens[req]), -1s included. The sampler needs a slot for each -1 to "
        "reject it.",
        "num_draft_tokens": "num_draft_tokens is not right yet: one entry per request in batch order, the "
        "number of draft slots it verifies.",
        "exclusive_cumsum": "cu_num_draft_tokens is an inclusive running sum with no leading 0: entry i is "
        "where request i's drafts end (a kernel takes cu[i - 1], or 0 for i = 0, as the start).",
        "cu_num_draft_tokens": "cu_num_draft_tokens is not right yet: the running sum of num_draft_tokens.",
        "input_ids_positions": "those are positions in input_ids; draft_token_ids holds only the draft "
        "slots, request after request, without the last tokens or the prefill.",
        "placeholder_indices": "placeholder_indices is not right yet: list every i with draft_token_ids[i] "
        "== -1 (flattened drafts, request after request).",
    },
)
def check_metadata(answer, verdict):
    value = value_of(answer)
    verdict.require(isinstance(value, dict) and set(value) >= set(_METADATA_KEYS), "format")
    got = {key: as_int_list(value[key]) for key in _METADATA_KEYS}  # lists, tuples, arrays, tensors alike
    verdict.require(all(v is not None for v in got.values()), "format")
    truth = _metadata_truth()
    real = [len([t for t in d if t >= 0]) for *_, d in METADATA_BATCH]
    num, size = got["num_draft_tokens"], len(METADATA_BATCH)
    verdict.require(len(num) == size, "missing_request", f"(you gave {len(num)} entries for {size} requests)")
    verdict.require(num != real, "placeholders_not_counted")
    verdict.require(num == truth["num_draft_tokens"], "num_draft_tokens")
    cu, want = got["cu_num_draft_tokens"], truth["cu_num_draft_tokens"]
    verdict.require(cu not in ([0] + want[:-1], [0] + want), "exclusive_cumsum")
    verdict.require(cu == want, "cu_num_draft_tokens")
    in_input_ids = [i for i, t in enumerate(truth["input_ids"]) if t == -1]
    verdict.require(sorted(got["placeholder_indices"]) != in_input_ids, "input_ids_positions")
    verdict.require(sorted(got["placeholder_indices"]) == truth["placeholder_indices"], "placeholder_indices")


# -- ch1.draft_ids ---------------------------------------------------------------------------------------


def _draft_ids_batches(seed: int = 0, count: int = 4) -> list[tuple]:
    """Steps with a ``-1`` draft and a real one each: one request alone, ch1.metadata's, a seeded family."""
    batches = [(("a", [5, 11, 30], 2, [17, -1, -1]),), METADATA_BATCH]  # alone: a slice gives its drafts
    rng = random.Random(seed)

    def ids(n):
        return [rng.randint(1, 400) for _ in range(n)]

    for _ in range(count):
        # a prefill and a decode with a real draft and a -1, then others
        rows = [("p0", ids(rng.randint(2, 6)), 0, []), ("d0", ids(3), 2, [ids(1)[0], -1])]
        for i in range(rng.randint(1, 3)):
            drafts = [-1 if rng.random() < 0.4 else ids(1)[0] for _ in range(rng.randint(0, 4))]
            prompt = ids(rng.randint(2, 5))
            rows.append((f"r{i}", prompt, len(prompt) - 1 if drafts else 0, drafts))
        rng.shuffle(rows)
        batches.append(tuple(rows))
    return batches


@checker(
    "ch1.draft_ids",
    solution="placeholder_lifecycle:gather_draft_token_ids",
    todo="write gather_draft_token_ids: the step's draft_token_ids, a tensor of its own",
    hints={
        "format": "return a 1-D sequence of token ids (a tensor, array or list of ints), one per draft slot.",
        "mutated": "your function changed input_ids: that buffer is what the embedding reads next, and only "
        "_preprocess edits it, after the metadata is built. Read it, do not write it.",
        "constant": "your answer is the same for every step the checker runs (the draft_token_ids printed "
        "above belong to the chapter's step alone): build it from the arguments.",
        "echo": "you returned the flat token stream itself: draft_token_ids holds only the draft slots, "
        "request after request; a prefill's prompt and each request's last real token are no drafts.",
        "logits_rows": "you returned the token at every logits row: k + 1 per request, and each request's "
        "first row reads its last real token, which is no draft.",
        "unshifted": "you read the token at each verifying row's own position: the logits of a position "
        "predict the token after it, not the one sitting there.",
        "positions": "target_logits_indices number rows of the compact logits, not positions in input_ids: "
        "the two differ once a request schedules tokens without a logits row (a prefill).",
        "view": "your answer shares memory with input_ids (a view): when _preprocess clamps input_ids in "
        "place, your draft_token_ids loses its -1, and the sampler judges the placeholder as token 0.",
        "length": "draft_token_ids has one entry per draft slot: as many as target_logits_indices.",
        "wrong": "not the draft ids of this step.",
    },
    forbid=(
        "specfix.v1.model_runner:GPUModelRunner._calc_spec_decode_metadata",
        "specfix.v1.model_runner:GPUModelRunner._prepare_inputs",
        "specfix.mrv2.draft_slots:gather_draft_sampled",
    ),
)
def check_draft_ids(answer, verdict):
    seen = []  # per step: your ids, them after the clamp, its metadata, input_ids before, tokens scheduled
    for batch in _draft_ids_batches():
        runner, cu_num_scheduled, metadata = _prepared(batch)
        input_ids = runner.input_ids.gpu  # the whole persistent buffer, as the runner gathers from it
        before = input_ids.clone()
        returned = answer(input_ids, metadata.logits_indices.clone(), metadata.target_logits_indices.clone())
        got = as_int_list(returned)
        verdict.require(torch.equal(input_ids, before), "mutated")
        verdict.require(got is not None, "format", f"(you returned {type(returned).__name__})")
        input_ids.clamp_(min=0)  # what _preprocess does next, in place: a view of input_ids loses its -1
        seen.append((got, as_int_list(returned), metadata, before, int(cu_num_scheduled[-1])))
    verdict.require(any(g != seen[0][0] for g, *_ in seen), "constant")  # the steps' ids are not all one
    for got, after, metadata, before, num_tokens in seen:
        want = metadata.draft_token_ids.tolist()
        said = f"(a step with num_draft_tokens {metadata.num_draft_tokens}: you returned {got})"
        if got == want:
            verdict.require(after == want, "view", said)  # every step has a -1 draft for the clamp to take
            continue
        rows, targets = metadata.logits_indices.long(), metadata.target_logits_indices.long()
        verdict.match(
            False,
            said,
            logits_rows=got == before[rows].tolist(),
            echo=got in (before.tolist(), before[:num_tokens].tolist()),
            unshifted=got == before[rows][targets].tolist(),
            positions=got == before[targets + 1].tolist(),
            length=len(got) != len(want),
        )


# -- ch1.zero_accepts ------------------------------------------------------------------------------------

#: The prediction exercise's batch: every request arrives prefilled, so its first decode is padded.
ZERO_BATCH = (
    "the hare ran as fast as",
    "a lion was asleep",
    "the crow sat in",
    "the lion was caught in",
    "the north wind",
)


def zero_batch_continuations(num_words: int = 3) -> list[list[str]]:
    """The first ``num_words`` words plain greedy decoding (no speculation) writes after each prompt."""
    greedy = SamplingParams(temperature=0.0, max_tokens=num_words)
    result = generate(list(ZERO_BATCH), greedy, num_speculative_tokens=None, device="cpu")
    vocab = get_tokenizer().vocab
    return [[vocab[t] for t in out.token_ids] for out in result.outputs]


def zero_batch_table():
    """The ``ch1.zero_accepts`` batch: each prompt and the words plain greedy decoding writes next."""
    words = [" ".join(w) for w in zero_batch_continuations()]
    return pd.DataFrame(
        {"prompt": list(ZERO_BATCH), "plain greedy decoding continues": words},
        index=[f"r{i}" for i in range(len(ZERO_BATCH))],
    )


def run_zero_batch() -> StepTrace:
    """One greedy step of :data:`ZERO_BATCH` under ``placeholder_policy="zero"``: k = 3 slots of token 0."""
    engine = LLMEngine(num_speculative_tokens=3, placeholder_policy="zero", device="cpu", record=True)
    for i, prompt in enumerate(ZERO_BATCH):
        engine.add_request(prompt, _GREEDY, request_id=f"r{i}", remote_prefill=True)
    engine.step()
    return engine.model_runner.trace[0]


@checker(
    "ch1.zero_accepts",
    solution="placeholder_lifecycle:zero_accepts",
    todo="set `answer` to the number of placeholder slots you expect the zero policy to get accepted",
    hints={
        "type": "answer must be a whole number of slots (an int).",
        "none": "a zeroed slot is a draft of token 0, 'the': greedy verification accepts it wherever the "
        "target's own next token is 'the'.",
        "every_the": "you counted every 'the' in the continuations: slot 2 is verified only if slot 1 was "
        "accepted, and a request whose next word is not 'the' rejects slot 1 already.",
        "count": "not the count the engine gets: for each request, ask what the target's greedy token is at "
        "each draft slot, and remember that a request's slots are verified in order.",
    },
)
def check_zero_accepts(answer, verdict):
    value = as_int(value_of(answer))
    verdict.require(value is not None, "type")
    step = run_zero_batch()
    truth = sum(len(tokens) - 1 for tokens in step.sampled_token_ids)
    every_the = sum(words.count("the") for words in zero_batch_continuations())
    verdict.require(value != 0 or truth == 0, "none")
    verdict.require(value != every_the or every_the == truth, "every_the")
    verdict.require(value == truth, "count")  # neither "too many" nor "too few": that would invite bisection


# -- ch1.reject_negative ---------------------------------------------------------------------------------


#: Six slots over a vocabulary of 5, each built to catch one slip: (draft, uniform, p row, q row).
_CRAFTED = (
    (2, 0.9, [0.1, 0.1, 0.5, 0.2, 0.1], [0.25, 0.25, 0.25, 0.15, 0.1]),  # p/q = 2 beats u (p alone does not)
    (1, 0.3, [0.3, 0.2, 0.2, 0.2, 0.1], [0.1, 0.5, 0.2, 0.1, 0.1]),  # p/q = 0.4 beats u
    (-1, 0.5, [0.9, 0.025, 0.025, 0.025, 0.025], [0.3, 0.2, 0.2, 0.2, 0.1]),  # column 0 would pass
    (-1, 0.5, [0.01, 0.01, 0.01, 0.07, 0.9], [0.5, 0.2, 0.1, 0.1, 0.1]),  # the last column would pass
    (3, 0.1, [0.1, 0.1, 0.1, 0.6, 0.1], [0.4, 0.3, 0.3, 0.0, 0.0]),  # the drafter gave d q = 0
    (0, 0.5, [0.2, 0.2, 0.2, 0.2, 0.2], [0.8, 0.05, 0.05, 0.05, 0.05]),  # p/q = 0.25 loses to u
)


def _crafted_rows():
    drafts, uniforms, p, q = zip(*_CRAFTED, strict=True)
    return torch.tensor(drafts), torch.tensor(p), torch.tensor(q), torch.tensor(uniforms, dtype=torch.float64)


def _random_rows(num_slots: int = 64, vocab_size: int = 16, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.randint(0, vocab_size, (num_slots,), generator=gen)
    drafts[torch.rand(num_slots, generator=gen) < 0.25] = -1
    p = torch.softmax(2 * torch.randn(num_slots, vocab_size, generator=gen), dim=-1)
    q = torch.softmax(2 * torch.randn(num_slots, vocab_size, generator=gen), dim=-1)
    q[torch.rand(num_slots, vocab_size, generator=gen) < 0.2] = 0.0
    uniforms = torch.rand(num_slots, generator=gen, dtype=torch.float64)
    return drafts, p, q, uniforms


def expected_acceptance(drafts, target_probs, draft_probs, uniforms) -> torch.Tensor:
    """Which slots specfix's rejection sampler accepts, each slot run as a request with one draft."""
    n = drafts.numel()
    output = torch.full((n, 2), -1, dtype=torch.int32)
    cu, bonus = torch.arange(1, n + 1, dtype=torch.int32), torch.zeros(n, dtype=torch.int32)
    rejected = torch.full((n,), -2)  # the "recovered token": no draft can equal it
    args = (output, cu, drafts, draft_probs, target_probs, bonus, rejected, uniforms, None, 1)
    # through the module, so that the checker's forbid refuses an answer that calls this function
    rejection_kernels.rejection_random_sample(*args, reject_negative_drafts=True, backend="torch")
    return output[:, 0] != -2


@checker(
    "ch1.reject_negative",
    solution="placeholder_lifecycle:accept_drafts",
    todo="write accept_drafts(draft_ids, target_probs, draft_probs, uniforms) -> [T] bool",
    hints={
        "shape": "return a bool tensor with one entry per slot ([T]).",
        "gather_negative": "the -1 draft reached an index op (gather, index_select), which refuses it: read "
        "a safe column for negative drafts and reject those slots outright.",
        "mutated": "your function changed its inputs in place: the caller's draft_ids (with its -1) or a "
        "probability table is no longer what the next stage expects.",
        "wrapped": "you indexed the probabilities with the -1 draft: torch wraps it to the last column (the "
        "old kernel's flat offset read the previous row's last entry), so another token's p/q judges the "
        "placeholder. Masking afterwards does not undo the read: read a safe column instead.",
        "clamp_only": "you read column 0 for the -1 draft (a clamp) but never rejected the slot: p/q of "
        "token 0 beat the uniform, and the placeholder was accepted as token 0.",
        "q_zero": "a draft the drafter gave probability q = 0 was accepted: p / 0 is inf, which beats every "
        "uniform; require q > 0.",
        "ratio": "a real draft was judged wrongly: accept d iff q(d) > 0 and p(d) / q(d) >= u.",
        "mismatch": "your answer disagrees with specfix's rejection sampler on a random batch.",
    },
    forbid=(  # the torch twin of the kernel, as this module and RejectionSampler call it
        "specfix.v1.rejection_kernels:rejection_random_sample",
        "specfix.v1.rejection_sampler:rejection_random_sample",
    ),
)
def check_reject_negative(answer, verdict):
    for rows, crafted in ((_crafted_rows(), True), (_random_rows(), False)):
        inputs = [t.clone() for t in rows]
        try:
            with check_indices():  # every index op checked before it runs: a -1 is caught, wrapped or not
                got = answer(*inputs)
        except IndexGuardError as error:
            hint = "wrapped" if error.op in ("Tensor.__getitem__", "take") else "gather_negative"
            verdict.require(False, hint, f"({error.op} read {error.values})")
        said = f"(got {type(got).__name__} {getattr(got, 'dtype', '')} {tuple(getattr(got, 'shape', ()))})"
        ok = isinstance(got, torch.Tensor) and got.dtype == torch.bool and got.shape == (rows[0].numel(),)
        verdict.require(ok, "shape", said)
        verdict.require(all(torch.equal(a, b) for a, b in zip(inputs, rows, strict=True)), "mutated")
        want = expected_acceptance(*rows)
        if crafted:
            verdict.require(not got[3], "wrapped")
            verdict.require(not got[2], "clamp_only")
            verdict.require(not got[4], "q_zero")
        for slot in torch.nonzero(got != want).flatten().tolist()[:1]:
            said = f"(slot {slot}: draft {int(rows[0][slot])}, you said {bool(got[slot])})"
            verdict.require(False, "ratio" if crafted else "mismatch", said)


# -- ch1.emitted (warm-up: needs only chapter 0) ----------------------------------------------------------


def _emitted_cases(seed: int = 0, count: int = 24) -> list[tuple[list[int], list[int]]]:
    """(drafts, the target's greedy choices at the k + 1 positions): crafted cases, then a seeded family."""
    crafted = [
        ([5, 7, 2], [5, 7, 2, 9]),  # all accepted: the bonus token too
        ([5, 7, 2], [5, 3, 2, 9]),  # a mismatch in the middle, a match after it
        ([5, 7, 2], [4, 7, 2, 9]),  # rejected at once: one token, the recovered one
        ([-1, -1, -1], [0, 6, 1, 2]),  # placeholders: never equal to a token id
        ([8, -1, -1], [8, 0, 3, 3]),  # a real draft, then placeholders
        ([], [4]),  # no drafts: one plain decode step
    ]
    rng = random.Random(seed)
    for _ in range(count):
        choices = [rng.randint(0, 3) for _ in range(rng.randint(1, 5))]  # k + 1 of them, k from 0 to 4
        crafted.append(([c if rng.random() < 0.7 else rng.randint(-1, 3) for c in choices[:-1]], choices))
    return crafted


@checker(
    "ch1.emitted",
    solution="placeholder_lifecycle:emitted_tokens",
    todo="write emitted_tokens(drafts, choices) -> the list of token ids one greedy step emits",
    hints={
        "format": "return a list of token ids (ints).",
        "no_bonus": "every draft was accepted, yet you emitted no token after them: the target's choice "
        "after the last draft (the bonus token) comes for free with the same forward pass.",
        "no_recovered": "at the first mismatch the step still emits a token: the target's own choice there.",
        "emits_draft": "at the first mismatch you emitted the draft; the step emits the target's choice "
        "there, since that is what plain greedy decoding would write.",
        "not_prefix": "you kept verifying after a mismatch: once a draft is rejected, every later draft was "
        "drafted after a wrong token, so they are all thrown away.",
        "placeholder": "a -1 placeholder was accepted: it never equals a token the target chooses.",
        "wrong": "not what greedy verification emits.",
    },
    forbid=("specfix.v1.rejection_sampler:RejectionSampler.forward",),
)
def check_emitted(answer, verdict):
    for drafts, choices in _emitted_cases():
        got = as_int_list(answer(list(drafts), list(choices)))
        verdict.require(got is not None, "format")
        n = 0  # greedy verification (chapter 0): drafts accepted while they match, then the target's choice
        while n < len(drafts) and drafts[n] == choices[n]:
            n += 1
        want = choices[: n + 1]
        verdict.match(
            got == want,
            f"(drafts {drafts}, target choices {choices}: you emitted {got})",
            placeholder=-1 in got,
            no_bonus=got == want[:-1] and n == len(drafts),
            no_recovered=got == want[:-1],
            emits_draft=n < len(drafts) and got == want[:-1] + [drafts[n]],
            not_prefix=len(got) > len(want),
        )


# -- ch1.clamp_point (predict, then run) ---------------------------------------------------------------------

#: Where a clamp of -1 to 0 can go, in the order one step runs them.
CLAMP_POINTS = ("scheduler", "before_metadata", "preprocess")


def step_with_clamp_at(point: str) -> StepTrace:
    """One greedy step of a P/D decode ("pd", padded with -1) beside a fresh prompt, clamped at ``point``."""
    if point not in CLAMP_POINTS:
        raise ValueError(f"point must be one of {CLAMP_POINTS}, got {point!r}")
    engine = LLMEngine(
        num_speculative_tokens=3,
        device="cpu",
        record=True,
        fixes=Fixes(clamp_placeholders=point == "preprocess"),
        placeholder_policy="zero" if point == "scheduler" else "minus_one",
    )
    runner = engine.model_runner
    if point == "before_metadata":
        calc = runner._calc_spec_decode_metadata

        def clamp_then_calc(*args):
            runner.input_ids.gpu.clamp_(min=0)
            return calc(*args)

        runner._calc_spec_decode_metadata = clamp_then_calc
    engine.add_request("the crow sat in", _GREEDY, request_id="pd", remote_prefill=True)
    engine.add_request("a lion was asleep", _GREEDY, request_id="fresh")
    engine.step()
    return runner.trace[0]


def sampler_sees(point: str) -> int:
    """The draft id the rejection sampler gets in "pd"'s placeholder slots with the clamp at ``point``."""
    drafts = step_with_clamp_at(point).spec_decode_metadata.draft_token_ids.tolist()
    (value,) = set(drafts)  # "pd" is the only request with draft slots, all of them placeholders
    return value


@checker(
    "ch1.clamp_point",
    solution="placeholder_lifecycle:clamp_point",
    todo="set clamp_point to a dict: for each of CLAMP_POINTS, the draft id (0 or -1) the rejection sampler "
    "gets in a placeholder slot when the clamp sits there",
    hints={
        "format": "answer with a dict whose keys are CLAMP_POINTS and whose values are 0 or -1.",
        "scheduler": "follow the scheduler's draft list down the step: which of token_ids_cpu, input_ids and "
        "draft_token_ids are filled from it, and does any stage in between write -1 into a slot?",
        "before_metadata": "which runs first, this clamp or the gather that builds draft_token_ids from "
        "input_ids? And which values does a gather copy: those input_ids holds at the moment it runs?",
        "preprocess": "which runs first, _calc_spec_decode_metadata or _preprocess? And is draft_token_ids a "
        "view of input_ids, which an in-place clamp would change, or a tensor of its own?",
    },
)
def check_clamp_point(answer, verdict):
    value = value_of(answer)
    ok = isinstance(value, dict) and set(value) == set(CLAMP_POINTS)
    got = {p: as_int(value[p]) for p in CLAMP_POINTS} if ok else {}
    verdict.require(ok and all(v in (0, -1) for v in got.values()), "format")
    for point in CLAMP_POINTS:
        verdict.require(got[point] == sampler_sees(point), point)
