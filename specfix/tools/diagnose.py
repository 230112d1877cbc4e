"""``specfix diagnose LOG``: from a crashed vLLM server's log to the cause, the fix and its first release.

    specfix diagnose server.log            # a report to read
    specfix diagnose - < server.log        # from standard input
    specfix diagnose --json server.log     # the same report as JSON (schema: SCHEMA below)

Read :func:`diagnose` first: :mod:`specfix.tools.diagnose_scan` reads the log in one pass, and
:mod:`specfix.tools.diagnose_rules` gives the verdict, how sure it is and the log lines that made it so.
This module builds the report from them, renders it as text and holds its JSON Schema.
"""

from __future__ import annotations

import functools
import json
import sys
import textwrap
from collections.abc import Iterable

from specfix.tools import recorded
from specfix.tools.diagnose_rules import FIXES, VERDICTS, Facts, advice, has_fix, kernel_note, ops_for
from specfix.tools.diagnose_scan import (  # noqa: F401  (chapter 2 imports the parsers from here)
    ERRORS,
    SETUP,
    DeviceAssert,
    LogError,
    Scan,
    device_asserts,
    open_log,
    read_lines,
    traceback_frames,
)

# The fields the JSON report gives of each fix, besides its PR and verdict.
_FIX_KEYS = ("short", "what", "where", "first_release", "verified", "chapter")
_fill = functools.partial(textwrap.fill, break_long_words=False, break_on_hyphens=False)


def diagnose(lines: Iterable[str], source: str = "<log>") -> dict:
    """The report (a dict following SCHEMA) for the lines of one log."""
    scan = Scan()
    for line in lines:
        scan.feed(line)
    scan.finish()
    table = recorded.load("embedding_assert_ops")
    meta, rows = table["meta"], table["rows"]
    facts = Facts(scan, rows)
    verdict, confidence, reasons = facts.verdict()
    asserts = facts.asserts  # in log order
    version = scan.setup.get("vllm_version")
    fixed = {v: has_fix(version, fix) for v, fix in FIXES.items()}
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
        "ops": [_op(a, rows) for a in asserts[:4]],
        "op_table": f"chapter 2's op table, recorded on {meta.get('device')} with torch {meta.get('torch')} "
        f"on {meta.get('date')}",
        "fixes": [_fix(v, f, fixed[v]) for v, f in fixes],
        "advice": advice(verdict, fixed.get(verdict), scan.blocking),
        "chapter": FIXES[verdict].chapter if verdict in FIXES else "notebooks/02_embedding_assert.ipynb",
    }


def _op(a: dict, rows: list[dict]) -> dict:
    return {
        "kernel": a["kernel"],
        "where": a["where"],
        "cases": ops_for(a, rows),
        "note": kernel_note(a, rows),
    }


def _fix(verdict: str, fix, has_it: bool | None) -> dict:
    return {
        "pr": fix.pr,
        "verdict": verdict,
        **{k: getattr(fix, k) for k in _FIX_KEYS},
        "logged_version_has_it": has_it,
    }


# -- the report as text -------------------------------------------------------------------------------------
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
    return "\n".join([*out, "", f"Explained in {report['chapter']}."])


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


def _object(fields: str = "", required: list[str] | None = None, **schemas: dict) -> dict:
    """A closed object: the properties ``"name: type, ..."`` gives in short, then ``schemas``; every property
    required unless ``required`` names some."""
    short = {name: _type(t) for name, t in (f.split(": ") for f in fields.split(", ") if f)}
    properties = short | schemas
    return {
        "type": "object",
        "required": list(properties if required is None else required),
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
    required=["speculative_decoding", "launch_blocking", "lines"],
    lines={"type": "object", "additionalProperties": _TYPES["int"]},
    **{k: {"type": ["string", "integer", "boolean", "null"]} for k in SETUP},
)
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


def run(path: str, as_json: bool = False, progress: bool = True) -> tuple[int, str]:
    """(exit status, text to print) for ``specfix diagnose``; bad input: status 2 and a one-line message."""
    try:
        stream, size, name = open_log(path)
        bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=size, unit="B", unit_scale=True, desc="reading", leave=False, file=sys.stderr)
        try:
            report = diagnose(read_lines(stream, name, bar.update if bar else (lambda n: None)), name)
        finally:
            if bar:
                bar.close()
            if stream is not sys.stdin.buffer:
                stream.close()
    except LogError as exc:
        return 2, f"specfix diagnose: {exc}"
    return 0, json.dumps(report, indent=1) if as_json else render(report)
