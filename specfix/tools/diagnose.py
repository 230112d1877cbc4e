"""``specfix diagnose LOG``: from a crashed vLLM server's log to the cause, the fix and its first release.

``specfix diagnose -`` reads standard input; ``--json`` prints the report as JSON following ``SCHEMA``.
Read :func:`diagnose` first: :mod:`specfix.tools.diagnose_scan` reads the log in one pass, the first of
``_RULES`` that fits gives the verdict with the log lines behind it, and :data:`specfix.tools.mirrors.FIXES`
whether the logged release has the fix.
"""

from __future__ import annotations

import functools
import json
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from specfix.tools import recorded
from specfix.tools.diagnose_scan import (  # noqa: F401  (chapter 2 imports the parsers from here)
    ERRORS,
    SETUP,
    DeviceAssert,
    LogError,
    Scan,
    device_asserts,
    engine_frames,
    open_log,
    python_error,
    read_lines,
    spec_state,
    traceback_frames,
)
from specfix.tools.mirrors import FIXES, has_fix

# -- from facts to a verdict: the first of _RULES that returns one ------------------------------------------
VERDICTS = {
    "placeholder_embedding": "a -1 placeholder draft token reached an embedding lookup "
    "(the vLLM PR #47029 pattern)",
    "negative_draft": "a negative (placeholder) draft token reached the rejection sampler "
    "(the vLLM PR #46533 pattern)",
    "other_index": "an out-of-range index, but not this suite's placeholder bug",
    "cudagraph_outputs": "no crash, but a setup whose outputs CUDA-graph padding corrupted "
    "(the vLLM PR #47066 pattern)",
    "different_error": "no device-side assert: the log shows a different failure",
    "no_crash": "no crash in this log",
    "inconclusive": "the log does not say enough to tell",
}


# (file name, text in the condition) -> what the kernel is, for asserts outside the recorded table.
_KNOWN_ELSEWHERE = [
    ("Indexing.cu", "srcIndex", "the index_select family (F.embedding, torch.index_select)"),
    (
        "ScatterGatherKernel.cu",
        "",
        "a gather or scatter along a dimension (torch.gather, scatter_): a "
        "sampler's or a model's own gather, not an embedding lookup",
    ),
    ("IndexKernel.cu", "sizes[i]", "advanced indexing (x[idx], index_put_), not an embedding lookup"),
]


def ops_for(a: dict, rows: list[dict]) -> list[dict]:
    """The recorded cases whose CUDA run failed the same condition in the same kernel of the same file."""
    name, c = Path(a["file"]).name, ("kernel", "condition")
    return [
        {"op": r["op"], "bad": r["bad"], "num_indices": r["num_indices"]}
        for r in rows
        if [r["cuda"].get(k) for k in c] == [a[k] for k in c]
        and r["cuda"].get("where", "").split(":")[0] == name
    ]


def kernel_note(a: dict, rows: list[dict]) -> str:
    if ops := ops_for(a, rows):
        return "in chapter 2's op table only " + ", ".join(sorted({o["op"] for o in ops})) + " failed there"
    name = Path(a["file"]).name
    for file, mark, note in _KNOWN_ELSEWHERE:
        if name == file and mark in a["condition"]:
            return note
    return "a kernel chapter 2's op table never reached"


@dataclass
class Facts:
    """What the rules read of one scanned log."""

    scan: Scan
    rows: list[dict]  # chapter 2's op table

    def __post_init__(self):
        self.err = python_error(self.scan)
        self.asserts = list(self.scan.asserts.values())  # in log order: each is added where first seen
        self.spec, self.spec_reasons = spec_state(self.scan)
        self.fixed = {v: has_fix(self.scan.setup.get("vllm_version"), fix) for v, fix in FIXES.items()}
        self.frames = self.err["frames"] if self.err else []
        self.runner = self.scan.setup.get("model_runner")
        self.first = self.asserts[0] if self.asserts else None
        if self.first:  # how the first reason of every rule about an assert starts, and its line
            self.at = f"the first assert is in {self.first['kernel']} ({self.first['where']})"
            self.kernel_line = [self.first["first_line"]]

    def fix_reason(self, verdict: str) -> tuple[bool | None, tuple[str, list[int]]]:
        """Whether the logged version carries the fix for ``verdict``, and the reason that says so."""
        fix, version, state = FIXES[verdict], self.scan.setup.get("vllm_version"), self.fixed[verdict]
        if version is None:
            return state, ("the log does not state the vLLM version", [])
        said = {
            True: f"carries PR #{fix.pr} (first in {fix.first_release})",
            False: f"predates PR #{fix.pr} (first in {fix.first_release})",
            None: f"is a build the release list cannot place against PR #{fix.pr}",
        }[state]
        return state, (f"vLLM {version} {said}", [self.scan.setup_lines["vllm_version"]])


_PRE_V1 = (
    "the log comes from vLLM's pre-V1 engine (vllm/spec_decode/, vllm/worker/), not the V1 engine whose "
    "placeholder paths this suite studies"
)
_PP = (
    "the traceback runs through the pipeline-parallel hand-off (pp_utils.py), not the embedding; vLLM PR "
    "#55745 reports an index assert from that broadcast"
)


def _other_index(f: Facts):
    """An index assert that no -1 placeholder explains: the first row that fits says why."""
    if not f.first:
        return None
    note = kernel_note(f.first, f.rows)
    kernels = {r["cuda"]["kernel"] for r in f.rows if r["op"] == "F.embedding" and "kernel" in r["cuda"]}
    kernels.add("indexSelectLargeIndex")  # the table never reached this many-indices sibling (Indexing.cu)
    in_pp = any("pp_utils" in fr["file"] or "broadcast" in fr["func"] for fr in f.frames)
    guarded = f.runner == "V2" or f.fixed["placeholder_embedding"] is True
    no_spec = ("but without speculative decoding there are no -1 placeholder drafts", [])
    err_line = [f.err["line"]] if f.err else []
    table = [  # (when, confidence, what follows "the first assert is in K (where)", more reasons)
        (f.scan.engine_v0, "medium", "", [(_PRE_V1, [f.scan.engine_v0])]),
        (in_pp, "medium", f": {note}", [(_PP, err_line)]),
        (
            f.first["kernel"] not in kernels,
            "high" if f.spec is not True else "medium",
            f": {note}; an embedding asserts in {', '.join(sorted(kernels))}",
            f.spec_reasons,
        ),
        (f.spec is False, "medium", ", which an embedding can launch", [*f.spec_reasons, no_spec]),
        (guarded, "low", ", which an embedding launches", [*f.spec_reasons, *_no_placeholder(f)]),
    ]
    for when, confidence, more, reasons in table:
        if when:
            return "other_index", confidence, [(f.at + more, f.kernel_line), *reasons]
    return None


def _no_placeholder(f: Facts) -> list[tuple[str, list[int]]]:
    """Why no -1 placeholder reaches the embedding: Model Runner V2 never reads them, V1 clamps them."""
    text, lines = f.fix_reason("placeholder_embedding")[1]
    if f.runner == "V2":
        text = "Model Runner V2 runs: it feeds drafts from its own table, zeroed per request, never the -1 "
        text += "placeholders (vllm/v1/worker/gpu/states.py, input_batch.py in 0.24.0, 0.25.0 and 0.33.0)"
        lines = []
    else:
        text += ": the V1 runner's _preprocess clamps -1 placeholders to 0 before the embedding"
        text += ", and the log's runner is V1" if f.runner else ", and Model Runner V2 never feeds them"
    other = (
        "so the id out of range came another way: one at least the vocabulary size (a draft whose vocabulary "
        "is larger than the target's, tokens added past the embedding table) or a -1 from another path"
    )
    return [(text, lines + ([f.scan.setup_lines["model_runner"]] if f.runner else [])), (other, [])]


def _placeholder_embedding(f: Facts):
    if not f.first:
        return None
    shared = sorted({o["op"] for o in ops_for(f.first, f.rows)} - {"F.embedding"})
    also = f", as do {', '.join(shared)}" if shared else ""
    reasons = [(f"{f.at}, a kernel an embedding launches (chapter 2's op table){also}", f.kernel_line)]
    reasons += f.spec_reasons
    last = f.frames[-1] if f.frames else None
    at_embedding = bool(last) and "embed" in f"{last['func']} {last['source']}".lower() and f.scan.blocking
    if at_embedding:
        text = f"with blocking launches the traceback ends at the embedding call: {f.err['ends_at']}"
        reasons.append((text, [f.err["line"]]))
    state, reason = f.fix_reason("placeholder_embedding")  # not True: _other_index took those
    reasons.append(reason)
    if f.spec is True and state is False:
        confidence = "high"
    elif f.spec is True or at_embedding or f.first["kernel"].startswith("indexSelect"):
        confidence = "medium"
    else:
        confidence = "low"
    return "placeholder_embedding", confidence, reasons


def _negative_draft(f: Facts):
    negative = f.scan.errors.get("negative_token")
    ours = engine_frames(f.frames)
    cuda_fault = f.scan.errors.get("illegal_address") or f.scan.errors.get("device_assert")
    in_sampler = bool(cuda_fault and ours and "rejection_sampler" in ours[-1]["file"])
    if not ((negative and f.spec is not False) or in_sampler):
        return None
    reasons = []
    if negative:
        text = "a negative token id reached the detokenizer: a -1 was emitted as a real token"
        reasons.append((text, [negative["line"]]))
    if in_sampler:
        how = (
            "with blocking launches, so the fault is there"
            if f.scan.blocking
            else "(launches were asynchronous: the sampler may only be where the host waited)"
        )
        text = f"the CUDA error surfaced in the rejection sampler {how}: {f.err['last_engine_frame']}"
        reasons.append((text, [f.err["line"]]))
    state, reason = f.fix_reason("negative_draft")
    reasons += [*f.spec_reasons, reason]
    strong = (in_sampler and f.scan.blocking) or (negative and f.spec is True)
    confidence = "high" if strong and state is False else "medium" if strong or state is False else "low"
    return "negative_draft", confidence, reasons


def _other_failure(f: Facts):
    fatal = [k for k in ("cuda_oom", "illegal_address", "nccl", "device_assert") if k in f.scan.errors]
    raised = f.err and f.err["complete"]
    if not (fatal or raised):
        return None
    reasons = []
    if fatal:
        reasons.append((f"the log reports {ERRORS[fatal[0]][1]}", [f.scan.errors[fatal[0]]["line"]]))
    if fatal[:1] == ["device_assert"]:
        text = (
            "but no 'Assertion ... failed' line: the device prints it only when the host next waits, and a "
            "process can die first; paste the lines above the traceback, or rerun with CUDA_LAUNCH_BLOCKING=1"
        )
        reasons.append((text, []))
    if raised:
        reasons.append((f"Python raised {f.err['exception']}: {f.err['message']}"[:300], [f.err["line"]]))
    if fatal == ["device_assert"]:
        return "inconclusive", "low", reasons
    return "different_error", "high", reasons


def _cudagraph_outputs(f: Facts):
    s, lines = f.scan.setup, f.scan.setup_lines
    if not (f.spec is True and s.get("draft_sample_method") == "probabilistic"):
        return None
    state, reason = f.fix_reason("cudagraph_outputs")
    sampled = (
        "drafts are sampled probabilistically: Model Runner V2's drafter caches their logits, which the "
        "padded rows of a CUDA-graph replay could overwrite"
    )
    reasons = [*f.spec_reasons, (sampled, [lines["draft_sample_method"]]), reason]
    if s.get("enforce_eager") is True or s.get("cudagraph_mode") == "NONE":
        off_line = lines.get("enforce_eager", lines.get("cudagraph_mode"))
        off = ("CUDA graphs are off, so no padded rows replay", [off_line])
        return "inconclusive", "low", [*reasons, off]
    if f.scan.acceptance:
        rate, n = min(f.scan.acceptance)
        reasons.append((f"the lowest logged draft acceptance rate is {rate:g}%", [n]))
    if state is True:
        return "inconclusive", "low", reasons
    if "cudagraph_mode" in s:
        reasons.append((f"CUDA graph mode {s['cudagraph_mode']}", [lines["cudagraph_mode"]]))
    else:
        text = "CUDA graphs are on unless --enforce-eager is given, and the log does not give it"
        reasons.append((text, []))
    graphs = s.get("cudagraph_mode") not in ("NONE", None) or s.get("enforce_eager") is False
    return "cudagraph_outputs", "medium" if state is False and graphs else "low", reasons


def _nothing_found(f: Facts):
    if f.err:  # cut short before its exception line: what failed is in the part not pasted
        return "inconclusive", "low", [("a traceback the log cuts short, and no assert or CUDA error", [])]
    text = f"no 'Assertion ... failed' line, no Python error and no CUDA error in {f.scan.lines:,} lines"
    if not (f.scan.setup or f.scan.spec_marker):
        return "inconclusive", "low", [(text, []), ("nothing in it shows a vLLM server", [])]
    first = min(f.scan.setup_lines.values(), default=f.scan.spec_marker)
    return "no_crash", "medium", [(text, []), ("the lines it has are a vLLM server's", [first])]


# Asserts first (the first kernel says most), then what can happen without one; the last rule always fits.
# fmt: off
_RULES = (_other_index, _placeholder_embedding, _negative_draft, _other_failure, _cudagraph_outputs,
          _nothing_found)
# fmt: on

_RESTART = "Restart the worker: after a device-side assert its CUDA context is unusable."
# verdict -> what to do; advice() fills in {upgrade} (left out once fixed), {until} and {name_op}.
_ADVICE = {
    "placeholder_embedding": [
        "{upgrade}",
        "{until}: the -1 drafts exist only with speculative decoding; serving without --speculative-config "
        "avoids the path. --no-async-scheduling removes the async-scheduling placeholders; the synchronous "
        "scheduler's padding of new decodes (PR #45237) remains in the releases that have it.",
        "{name_op}",
        _RESTART,
    ],
    "negative_draft": [
        "{upgrade}",
        "{until}: greedy requests (temperature 0) always rejected a -1 draft (it never equals the "
        "argmax); the sampled path is the one PR #46533 fixed.",
        "{name_op}",
    ],
    "other_index": ["This is not the placeholder bug this suite covers. {name_op}", _RESTART],
    "cudagraph_outputs": [
        "{upgrade}",
        "{until}: draft_sample_method='greedy' (the default) caches no draft logits, and "
        "--enforce-eager replays no padded rows.",
        "To test an engine for this class of bug: specfix.lab.invariance.check_padding_invariance "
        "(chapter 3) runs a step with garbage in its padded rows and compares the live rows.",
    ],
    "different_error": [
        "Not one of the bugs this suite covers: read the error above from its first traceback."
    ],
    "no_crash": [
        "Nothing to diagnose. If the server did fail, paste the log up to the end of the first traceback."
    ],
    "inconclusive": [
        "Paste more of the log: from the server's start (the version banner and the engine arguments) to "
        "the end of the first traceback, including the first 'Assertion ... failed' line."
    ],
}


def advice(verdict: str, fixed: bool | None, blocking: bool) -> list[str]:
    """What to do now, given whether the logged version carries the verdict's fix and the launches blocked."""
    guard = "specfix.lab.guard.check_indices()"
    fix = FIXES.get(verdict)
    upgrade = (
        f"Upgrade to vLLM {fix.first_release} or later (PR #{fix.pr})." if fix and fixed is not True else ""
    )
    name_op = (
        f"The launches were blocking, so the traceback names the op; {guard} also gives the bad values and "
        "their positions."
        if blocking
        else f"To name the op: rerun with CUDA_LAUNCH_BLOCKING=1 (slow, for debugging only) or wrap the step "
        f"in {guard}."
    )
    words = {"upgrade": upgrade, "until": "Meanwhile" if fixed is True else "Until then", "name_op": name_op}
    return [text for line in _ADVICE[verdict] if (text := line.format(**words))]


_FIX_KEYS = ("short", "what", "where", "first_release", "verified", "chapter")  # in the JSON report's order


def diagnose(lines: Iterable[str], source: str = "<log>") -> dict:
    """The report (a dict following SCHEMA) for the lines of one log."""
    scan = Scan()
    for line in lines:
        scan.feed(line)
    scan.finish()
    table = recorded.load("embedding_assert_ops")
    meta, rows = table["meta"], table["rows"]
    facts = Facts(scan, rows)
    verdict, confidence, reasons = next(found for rule in _RULES if (found := rule(facts)))
    asserts, fixed = facts.asserts, facts.fixed
    fixes = sorted(FIXES.items(), key=lambda item: item[0] != verdict)  # the verdict's own fix first
    return {
        "schema": SCHEMA_ID,
        "source": source,
        "lines": scan.lines,
        "verdict": {
            "id": verdict,
            "title": VERDICTS[verdict],
            "confidence": confidence,
            "reasons": [{"text": t, "lines": ls} for t, ls in reasons],
        },
        "asserts": {
            "lines": scan.assert_lines,
            "distinct": asserts,
            "first_kernel": asserts[0]["kernel"] if asserts else None,
        },
        "python_error": facts.err,
        "errors": dict(scan.errors),
        "setup": {
            "speculative_decoding": facts.spec,
            "launch_blocking": scan.blocking,
            **scan.setup,
            "lines": dict(scan.setup_lines),
        },
        "ops": [
            dict(kernel=a["kernel"], where=a["where"], cases=ops_for(a, rows), note=kernel_note(a, rows))
            for a in asserts[:4]
        ],
        "op_table": f"chapter 2's op table, recorded on {meta.get('device')} with torch {meta.get('torch')} "
        f"on {meta.get('date')}",
        "fixes": [
            dict(pr=f.pr, verdict=v, **{k: getattr(f, k) for k in _FIX_KEYS}, logged_version_has_it=fixed[v])
            for v, f in fixes
        ],
        "advice": advice(verdict, fixed.get(verdict), scan.blocking),
        "chapter": FIXES[verdict].chapter if verdict in FIXES else FIXES["placeholder_embedding"].chapter,
    }


# -- the report as text -------------------------------------------------------------------------------------
_fill = functools.partial(textwrap.fill, break_long_words=False, break_on_hyphens=False)


def render(report: dict, width: int = 100) -> str:
    """The report as a person reads it: verdict first, then the evidence, then what to do."""

    def para(text: str, indent: str = "  ", first: str | None = None) -> str:
        first = indent if first is None else first
        return _fill(text, width, initial_indent=first, subsequent_indent=indent)

    v, s = report["verdict"], report["setup"]
    out = [f"specfix diagnose: {report['source']} ({report['lines']:,} lines)", ""]
    out += [para(f"Verdict: {v['title']}", "  ", ""), f"  confidence: {v['confidence']}"]
    for r in v["reasons"]:
        at = f" (line {', '.join(map(str, r['lines']))})" if r["lines"] else ""
        out.append(para(f"{r['text']}{at}", "    ", "  - "))
    out += ["", "Device-side asserts:", *_asserts_text(report["asserts"], para)]
    out += ["", "What Python raised:", *_error_text(report["python_error"], para)]
    shown = "; ".join(f"{k.replace('_', ' ')} {s[k]}" for k in SETUP if k in s)
    out += ["", "Setup stated in the log:", para(shown or "nothing (no version banner, no engine arguments)")]
    for o in report["ops"]:
        out += ["", para(f"Ops that assert in {o['kernel']} ({report['op_table']}):", "  ", "")]
        out.append(para(_cases_text(o["cases"]) or o["note"]))
    out += ["", "Fixes:"]
    for f in report["fixes"]:
        has = {True: "yes", False: "no", None: "cannot tell"}[f["logged_version_has_it"]]
        text = f"PR #{f['pr']}, {f['short']} ({f['where']}): first release {f['first_release']}; "
        out.append(para(f"{text}in the logged version: {has}", "    ", "  "))
    out += ["", "What to do now:"] + [para(line, "    ", "  - ") for line in report["advice"]]
    if report["verdict"]["id"] != "no_crash":
        out += ["", f"Explained in {report['chapter']}."]
    return "\n".join(out)


def _asserts_text(a: dict, para) -> list[str]:
    if not a["distinct"]:
        return ["  none"]
    head = f"  {a['lines']:,} assert line(s), {len(a['distinct'])} distinct; "
    out = [f"{head}the first printed is in {a['first_kernel']}:"]
    for d in a["distinct"]:
        text = f"{d['count']:,} x {d['where']}: {d['kernel']}: `{d['condition']}`"
        out.append(para(f"{text} (first at line {d['first_line']})", "      ", "  "))
    return out


def _error_text(e: dict | None, para) -> list[str]:
    if not e:
        return ["  no Python traceback"]
    who = f" in {e['process']}" if e["process"] else ""
    raised = f"{e['exception']}: {e['message']}" if e["complete"] else "a traceback cut short"
    out = [para(f"{raised}{who} (line {e['line']})")]
    if e["ends_at"]:
        out.append(para(f"the traceback ends at {e['ends_at']}"))
    if e["last_engine_frame"] and e["last_engine_frame"] != e["ends_at"]:
        out.append(para(f"its innermost engine frame: {e['last_engine_frame']}"))
    return [*out, para(e["why_not_there"])]


def _cases_text(cases: list[dict]) -> str:
    ops: dict[str, tuple[set, set]] = {}
    for c in cases:
        bads, counts = ops.setdefault(c["op"], (set(), set()))
        bads.add(c["bad"])
        counts.add(c["num_indices"])
    return "; ".join(
        f"{op} (index {' or '.join(sorted(b))}, {' or '.join(f'{n:,}' for n in sorted(k))} ids)"
        for op, (b, k) in ops.items()
    )


# -- the JSON report: its JSON Schema (draft 2020-12), written in short -------------------------------------
SCHEMA_ID = "specfix.diagnose/1"
# A type in short: a name in _TYPES, "T?" (T or null), "[T]" (an array of T) or "[T]+" (at least one T).
_TYPES = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "size": {"type": "integer", "minimum": 0},
    "count": {"type": "integer", "minimum": 1},
    "bool": {"type": "boolean"},
}


def _type(short: str) -> dict:
    if short.endswith("+"):
        return {**_type(short[:-1]), "minItems": 1}
    if short.startswith("["):
        return {"type": "array", "items": _type(short[1:-1])}
    if short.endswith("?"):
        return {"type": [_TYPES[short[:-1]]["type"], "null"]}
    return _TYPES[short]


def _object(fields: str = "", **schemas: dict) -> dict:
    """A closed object; its properties, all required: ``"name: type, ..."`` in short, then ``schemas``."""
    properties = {name: _type(t) for name, t in (f.split(": ") for f in fields.split(", ") if f)} | schemas
    return {
        "type": "object",
        "required": list(properties),
        "additionalProperties": False,
        "properties": properties,
    }


_TYPES["reason"] = _object("text: str, lines: [count]")
_TYPES["frame"] = _object("file: str, line: int, func: str, source: str")
_TYPES["assert"] = _object(
    "where: str, file: str, line: int, kernel: str, condition: str, count: count, first_line: count"
)
_TYPES["case"] = _object("op: str, bad: str, num_indices: int")
_TYPES["ops"] = _object("kernel: str, where: str, note: str, cases: [case]")
_TYPES["fix"] = _object(
    "pr: int, logged_version_has_it: bool?",
    verdict={"enum": list(FIXES)},
    **dict.fromkeys(_FIX_KEYS, _TYPES["str"]),
)
_ERROR = _object(
    "process: str?, exception: str?, message: str?, line: count, complete: bool, frames: [frame], "
    "ends_at: str?, last_engine_frame: str?, processes: [str], why_not_there: str"
)
_SETUP = _object(
    "speculative_decoding: bool?, launch_blocking: bool",
    lines={"type": "object", "additionalProperties": _TYPES["int"]},
)
_SETUP["properties"] |= {k: {"type": ["string", "integer", "boolean", "null"]} for k in SETUP}  # optional
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    **_object(
        "source: str, lines: size, ops: [ops], op_table: str, fixes: [fix], advice: [str]+, chapter: str",
        schema={"const": SCHEMA_ID},
        verdict=_object(
            "title: str, reasons: [reason]+",
            id={"enum": list(VERDICTS)},
            confidence={"enum": ["high", "medium", "low"]},
        ),
        asserts=_object("lines: size, first_kernel: str?, distinct: [assert]"),
        python_error={"oneOf": [{"type": "null"}, _ERROR]},
        errors={
            "type": "object",
            "propertyNames": {"enum": list(ERRORS)},
            "additionalProperties": _object("count: count, line: count, text: str"),
        },
        setup=_SETUP,
    ),
}


def run(path: str, as_json: bool = False) -> tuple[int, str]:
    """(exit status, text to print) for ``specfix diagnose``; bad input: status 2 and a one-line message."""
    name = "standard input" if path == "-" else path
    try:
        with open_log(path) as stream:
            report = diagnose(read_lines(stream, name), name)
    except LogError as exc:
        return 2, f"specfix diagnose: {exc}"
    return 0, json.dumps(report, indent=1) if as_json else render(report)
