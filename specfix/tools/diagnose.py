"""``specfix diagnose LOG``: from a crashed vLLM server's log to the cause, the fix and its first release.

    specfix diagnose server.log            # a report to read
    specfix diagnose - < server.log        # from standard input
    specfix diagnose --json server.log     # the same report as JSON (schema: SCHEMA below)

Verdicts (``VERDICTS``): a ``-1`` placeholder reaching an embedding (vLLM PR #47029), a negative draft
reaching the rejection sampler (PR #46533), another out-of-range index, no assert but a setup whose outputs
CUDA-graph padding corrupted (PR #47066), a different error, or a log that does not say enough. Each comes
with how sure it is and the log lines that made it so.

Read :func:`diagnose` first; :func:`read_lines` says how a pasted log is read, ``FIXES`` where each fix's
first release was checked.
"""

from __future__ import annotations

import codecs
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from specfix.tools import recorded

MAX_LINE = 65536  # characters; a longer line is read as several
BLOCK = 1 << 20  # bytes read at a time
MAX_DISTINCT_ASSERTS = 64
MAX_TRACEBACKS = 32  # completed tracebacks kept (the first ones: the root cause comes first)
MAX_TRACEBACK_LINES = 400  # lines kept per traceback (its innermost frames)

VERDICTS = {
    "placeholder_embedding": "a -1 placeholder draft token reached an embedding lookup "
    "(the vLLM PR #47029 pattern)",
    "negative_draft": "a negative (placeholder) draft token reached the rejection sampler "
    "(the vLLM PR #46533 pattern)",
    "other_index": "an out-of-range index, but not this suite's placeholder bug",
    "cudagraph_outputs": "no crash, but a setup whose outputs CUDA-graph padding corrupted "
    "(the vLLM PR #47066 pattern)",
    "different_error": "no device-side assert: the log shows a different failure",
    "inconclusive": "the log does not say enough to tell",
}

# -- the parsers chapter 2 uses on its own transcripts too (specfix.lab.embedding_assert) -------------------

_ASSERT = re.compile(
    r"(?P<file>\S+?\.cuh?):(?P<line>\d+): (?P<kernel>.+?): block: \[(?P<block>[\d,\s]+)\], "
    r"thread: \[(?P<thread>[\d,\s]+)\] Assertion `(?P<condition>.+?)` failed\."
)


@dataclass
class DeviceAssert:
    """One ``file:line: kernel: block: [...], thread: [...] Assertion `cond` failed.`` line."""

    file: str
    line: int
    kernel: str
    block: str
    thread: str
    condition: str

    @property
    def where(self) -> str:
        return f"{Path(self.file).name}:{self.line}"


def device_asserts(text: str) -> list[DeviceAssert]:
    """Every device-side assert line in ``text`` (one per failing GPU thread, so often many)."""
    return [
        DeviceAssert(m["file"], int(m["line"]), m["kernel"], m["block"], m["thread"], m["condition"])
        for m in _ASSERT.finditer(text)
    ]


_FRAME = re.compile(
    r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n(?:    (?P<source>.*))?', re.M
)


_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):$", re.M)
#: What Python prints between the tracebacks of one chain of exceptions (oldest first).
_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


def traceback_frames(text: str) -> list[dict]:
    """The frames of the last Python error in ``text``, outermost first (file, line, func, source).

    If that error was raised while handling an earlier one (a chain: Python prints the oldest first), the
    frames are the earliest error's, where the failure was first heard of, not those of the clean-up code
    that failed after it (after a device-side assert, any CUDA call in a handler fails too)."""
    starts = [m.start() for m in _TRACEBACK.finditer(text)]
    if not starts:
        return []
    first = len(starts) - 1
    while first > 0 and any(mark in text[starts[first - 1] : starts[first]] for mark in _CHAINED):
        first -= 1
    end = starts[first + 1] if first + 1 < len(starts) else len(text)
    return [
        {"file": m["file"], "line": int(m["line"]), "func": m["func"], "source": (m["source"] or "").strip()}
        for m in _FRAME.finditer(text[starts[first] : end])
    ]


@dataclass(frozen=True)
class Fix:
    pr: int
    short: str
    what: str
    where: str  # vLLM file (and function) the fix changed
    verified: str  # what was read in the release source, and where
    chapter: str
    first_release: str = "0.25.0"
    last_release_without: str = "0.24.0"


# The first release of each fix (``FIXES``) was checked in the source of vLLM's release wheels (unpacked into
# ``.peer/src/<version>/`` by ``scripts/fetch_vllm_peer.py``): each fix's code is present in 0.25.0 and
# 0.33.0 and absent in 0.24.0, and PyPI lists no vLLM release between 0.24.0 and 0.25.0 (``pip index versions
# vllm``, 2026-12-01), so 0.25.0 is the first release that carries all three.
FIXES = {
    "placeholder_embedding": Fix(
        47029,
        "the clamp before the embedding",
        "clamps input_ids to >= 0 before the embedding lookup, after the drafts were copied for the "
        "rejection sampler",
        "vllm/v1/worker/gpu_model_runner.py, GPUModelRunner._preprocess",
        "`input_ids.gpu[:num_input_tokens].clamp_(min=0)` under the comment 'Clamp speculative scheduler "
        "placeholders (-1) before embedding lookup' in _preprocess: in 0.25.0 and 0.33.0, not in 0.24.0",
        "notebooks/02_embedding_assert.ipynb",
    ),
    "negative_draft": Fix(
        46533,
        "negative drafts always rejected",
        "always rejects a negative draft id in the rejection sampler (V1 and Model Runner V2 kernels)",
        "vllm/v1/sample/rejection_sampler.py (rejection_random_sample_kernel); "
        "vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py",
        "`if draft_token_id < 0: accepted = False` in rejection_random_sample_kernel and `is_valid_draft = "
        "draft_sampled >= 0` in rejection_sampler_utils.py: in 0.25.0 and 0.33.0, not in 0.24.0",
        "notebooks/01_placeholder_lifecycle.ipynb",
    ),
    "cudagraph_outputs": Fix(
        47066,
        "-1 padding of the drafter's idx_mapping",
        "pads the drafter's idx_mapping with -1 and makes Gumbel sampling skip those rows, so padded "
        "rows of a CUDA-graph replay no longer overwrite live requests' draft logits",
        "vllm/v1/worker/gpu/spec_decode/speculator.py; vllm/v1/worker/gpu/sample/gumbel.py",
        "`self.idx_mapping[num_reqs:].fill_(-1)` in speculator.py and `is_valid_req = req_state_idx >= 0` in "
        "gumbel.py: in 0.25.0 and 0.33.0, not in 0.24.0",
        "notebooks/03_cudagraph_idx_mapping.ipynb",
    ),
}

#: Kernels an embedding can assert in: those of F.embedding in chapter 2's op table, and the many-indices
#: sibling of indexSelectSmallIndex in PyTorch's Indexing.cu, which the recording never reached.
_OTHER_EMBEDDING_KERNELS = {"indexSelectLargeIndex"}
#: (file name, text in the condition) -> what the kernel is, for asserts outside the recorded table.
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

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PREFIX = re.compile(r"^(?:\s*(?:\([^()]*?pid=\d+\)|\[rank\d+\]:))+ ?")
_PROC = re.compile(r"\(([^()]*?pid=\d+)\)")
_HEADER = re.compile(
    r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) +\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? +"
    r"(?:\[[^\]]*\]|[\w.]+:\d+\]) ?"
)
_EXCEPTION = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault))"
    r"(?::\s*(?P<msg>.*))?$"
)
_BOOL = {"true": True, "false": False, "none": None}

#: setup key -> patterns; the first match in the log wins (flags become booleans in _setup_value)
_SETUP = {
    "vllm_version": [
        r"vLLM API server version (\S+)",
        r"Initializing a V1 LLM engine \(v([^)\s]+)\)",
        r"vLLM Version\s*:\s*(\S+)",
        r"\bvllm[= ]=(\d\S*)",
    ],
    "speculative_method": [r"speculative[-_]config\W.*?\bmethod\W{1,4}([\w-]+)"],
    "num_speculative_tokens": [r"num_spec(?:ulative)?_tokens\W{1,4}(\d+)"],
    "draft_sample_method": [r"draft_sample_method\W{1,4}(\w+)"],
    "async_scheduling": [
        r"async_scheduling\W{1,4}(True|False|true|false)",
        r"(--(?:no-)?async-scheduling)\b",
    ],
    "cudagraph_mode": [
        r"cudagraph_mode\W{1,4}(?:CUDAGraphMode\.)?(FULL_AND_PIECEWISE|FULL_DECODE_ONLY|"
        r"PIECEWISE|FULL|NONE)\b"
    ],
    "enforce_eager": [r"enforce_eager\W{1,4}(True|False|true|false)", r"(--enforce-eager)\b"],
    "tensor_parallel_size": [
        r"tensor_parallel_size\W{1,4}(\d+)",
        r"(?:--tensor-parallel-size|\s-tp)[ =](\d+)",
    ],
    "pipeline_parallel_size": [
        r"pipeline_parallel_size\W{1,4}(\d+)",
        r"(?:--pipeline-parallel-size|\s-pp)[ =](\d+)",
    ],
    "prefix_caching": [
        r"enable_prefix_caching\W{1,4}(True|False|true|false|None)",
        r"(--(?:no-)?enable-prefix-caching)\b",
    ],
    "kv_role": [r"kv_role\W{1,4}(kv_producer|kv_consumer|kv_both)"],
    "kv_connector": [r"kv_connector\W{1,4}(\w+)"],
}
_SETUP_RE = {key: [re.compile(p) for p in pats] for key, pats in _SETUP.items()}
_SETUP_HINT = re.compile(
    r"version|Version|speculative|num_spec|parallel|async|cudagraph|eager|prefix|kv_|"
    r"draft_sample|-tp|-pp"
)
_ACCEPTANCE = re.compile(r"SpecDecoding metrics:.*?Avg Draft acceptance rate: ([\d.]+)%")
#: error kind -> (substring that marks it, how the report names it)
_ERRORS = {
    "device_assert": ("device-side assert triggered", "CUDA error: device-side assert triggered"),
    "cuda_oom": ("out of memory", "CUDA out of memory"),
    "illegal_address": ("illegal memory access", "CUDA error: an illegal memory access was encountered"),
    "nccl": ("NCCL", "an NCCL (collective communication) error"),
    "negative_token": (
        "out of range integral type conversion",
        "a negative token id reached the detokenizer",
    ),
}
_WRAPPERS = (
    "EngineDeadError",
    "Worker failed with error",
    "Engine core initialization failed",
    "EngineCore encountered an issue",
)


class LogError(ValueError):
    """The input cannot be diagnosed (missing, a directory, binary, empty): the message says why."""


# -- reading ----------------------------------------------------------------------------------------------
def _open(path: str):
    if path == "-":
        return sys.stdin.buffer, None, "standard input"
    p = Path(path)
    if not p.exists():
        raise LogError(f"{path}: no such file")
    if p.is_dir():
        raise LogError(f"{path} is a directory: give the log file itself")
    try:
        return p.open("rb"), p.stat().st_size, path
    except OSError as exc:
        raise LogError(f"{path}: cannot be read ({exc.strerror or exc})") from None


# The log is read as users paste it: one line at a time (memory stays bounded whatever its size; a line longer
# than MAX_LINE characters is cut into pieces), ANSI colours, Windows line ends and vLLM's process prefixes
# (``(EngineCore_DP0 pid=12)``, ``(VllmWorker TP1 pid=34)``, ``[rank0]:``) and log headers removed, the
# tracebacks of interleaved processes kept apart by prefix. Assert lines and tracebacks are parsed here by
# the parsers chapter 2 (:mod:`specfix.lab.embedding_assert`) uses on its own transcripts; which ops
# launch a kernel comes from chapter 2's op table recorded on the H200
# (``specfix/recorded/embedding_assert_ops.json``).
def read_lines(stream, name: str, progress: Callable[[int], None] = lambda n: None) -> Iterator[str]:
    """The text lines of a binary stream, decoded as UTF-8 (bad bytes replaced), at most MAX_LINE long."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    rest, first = "", True
    while block := stream.read(BLOCK):
        if first:
            if b"\0" in block[:8192]:
                raise LogError(
                    f"{name} looks binary (NUL bytes near its start); if it is UTF-16 text "
                    "(a Windows redirect), convert it to UTF-8 first"
                )
            first = False
        progress(len(block))
        lines = (rest + decoder.decode(block)).split("\n")
        rest = lines.pop()
        for line in lines:
            if len(line) <= MAX_LINE:
                yield line
            else:
                yield from _pieces(line)
        while len(rest) > MAX_LINE:
            yield rest[:MAX_LINE]
            rest = rest[MAX_LINE:]
    if first:
        raise LogError(f"{name} is empty: nothing to diagnose")
    rest += decoder.decode(b"", final=True)
    if rest:
        yield from _pieces(rest)


def _pieces(line: str) -> Iterator[str]:
    for start in range(0, max(len(line), 1), MAX_LINE):
        yield line[start : start + MAX_LINE]


# -- what one pass over the log collects ------------------------------------------------------------------
@dataclass
class _Traceback:
    process: str | None
    start: int
    lines: list[str]
    exception: tuple[str, str, int] | None = None  # (type, message, line number) of its first error
    reading: bool = True  # inside frames, before the exception line
    chained: bool = False  # a "During handling..." line followed the exception


class _Scan:
    def __init__(self):
        self.lines = 0
        self.asserts: dict[tuple, dict] = {}
        self.assert_lines = 0
        self.seen: dict[str, dict] = {}  # assert line without block and thread -> entry
        self.open: dict[str | None, _Traceback] = {}  # per process: the traceback being read
        self.done: list[tuple[_Traceback, list[dict]]] = []
        self.setup: dict[str, object] = {}
        self.setup_lines: dict[str, int] = {}
        self.errors: dict[str, dict] = {}
        self.async_hint = self.blocking_stated = self.cuda_error_text = False
        self.spec_off_line: int | None = None
        self.spec_marker: int | None = None  # a line that shows speculative decoding at work
        self.engine_v0: int | None = None
        self.acceptance: list[tuple[float, int]] = []

    def feed(self, raw: str) -> None:
        self.lines += 1
        n = self.lines
        if "\x1b" in raw:
            raw = _ANSI.sub("", raw)
        line = raw.rstrip("\r")
        if "Assertion `" in line:
            # The lines of one assert differ only in block and thread: a seen signature skips the parse.
            sig = line[: line.find(": block: [")] + line[line.find("] Assertion `") :]
            if (entry := self.seen.get(sig)) is not None:
                self.assert_lines += 1
                entry["count"] += 1
                return
            found = device_asserts(line)
            if found:
                self._assert(found[0], n, sig)
                return
        process = None
        if line[:1] in "([" and (m := _PREFIX.match(line)):
            procs = _PROC.findall(m.group(0))
            process = procs[-1] if procs else None
            line = line[m.end() :]
        if line[:1] in "DIWEC" and (m := _HEADER.match(line)):
            line = line[m.end() :]
        self._traceback(process, line, n)
        self._facts(line, n)

    def _assert(self, a: DeviceAssert, n: int, sig: str) -> None:
        self.assert_lines += 1
        key = (a.file, a.line, a.kernel, a.condition)
        if key in self.asserts:
            self.asserts[key]["count"] += 1
        elif len(self.asserts) < MAX_DISTINCT_ASSERTS:
            self.asserts[key] = {
                "where": a.where,
                "file": a.file,
                "line": a.line,
                "kernel": a.kernel,
                "condition": a.condition,
                "count": 1,
                "first_line": n,
            }
        if key in self.asserts and len(self.seen) < 4 * MAX_DISTINCT_ASSERTS:
            self.seen[sig] = self.asserts[key]

    def _traceback(self, process: str | None, line: str, n: int) -> None:
        tb = self.open.get(process)
        if line.startswith("Traceback (most recent call last)"):
            if tb is not None and not tb.reading and not tb.chained:
                self._close(process)
                tb = None
            if tb is None:
                self.open[process] = tb = _Traceback(process, n, [])
            tb.lines.append(line)
            tb.reading, tb.chained = True, False
            return
        if tb is None:
            return
        if line in _CHAINED:
            tb.chained = True
            tb.lines.append(line)
        elif tb.reading:
            if not line.startswith(" ") and (m := _EXCEPTION.match(line)):
                tb.reading = False
                if tb.exception is None:  # the first error of a chain is where the failure was first heard of
                    tb.exception = (m["type"], (m["msg"] or "").strip(), n)
            if len(tb.lines) >= MAX_TRACEBACK_LINES:  # keep the header and the innermost frames
                del tb.lines[1 : len(tb.lines) - MAX_TRACEBACK_LINES + 2]
            tb.lines.append(line)

    def _close(self, process: str | None) -> None:
        tb = self.open.pop(process)
        if len(self.done) < MAX_TRACEBACKS:
            self.done.append((tb, traceback_frames("\n".join(tb.lines))))

    def _facts(self, line: str, n: int) -> None:
        for kind, (mark, _) in _ERRORS.items():
            if mark in line:
                err = self.errors.setdefault(kind, {"count": 0, "line": n, "text": line.strip()[:300]})
                err["count"] += 1
        if "CUDA_LAUNCH_BLOCKING" in line:
            if "consider passing CUDA_LAUNCH_BLOCKING" in line:
                self.async_hint = True
            elif re.search(r"CUDA_LAUNCH_BLOCKING\W{1,3}1\b", line):
                self.blocking_stated = True
        if line.startswith("Search for `cudaErrorAssert'"):
            self.cuda_error_text = True
        if "speculative_config=None" in line or ("non-default args" in line and "speculative" not in line):
            self.spec_off_line = self.spec_off_line or n
        if self.spec_marker is None and (
            "SpecDecoding metrics" in line or "/spec_decode/" in line or "rejection_sampler" in line
        ):
            self.spec_marker = n
        if self.engine_v0 is None and (
            "spec_decode_worker" in line
            or "/vllm/worker/" in line
            or "/vllm/spec_decode/" in line
            or "VLLM_USE_V1=0" in line
        ):
            self.engine_v0 = n
        if "SpecDecoding" in line and len(self.acceptance) < 10000 and (m := _ACCEPTANCE.search(line)):
            self.acceptance.append((float(m.group(1)), n))
        if _SETUP_HINT.search(line):
            for key, patterns in _SETUP_RE.items():
                if key in self.setup:
                    continue
                for pattern in patterns:
                    if (m := pattern.search(line)) and (value := _setup_value(key, m.group(1))) is not None:
                        self.setup[key], self.setup_lines[key] = value, n
                        break

    def finish(self) -> None:
        for process in list(self.open):
            self._close(process)


def _setup_value(key: str, text: str):
    if text.startswith("--"):
        return not text.startswith("--no-")
    if key.endswith("_size") or key == "num_speculative_tokens":
        return int(text)
    if text.lower() in _BOOL:
        return _BOOL[text.lower()]
    return text


# -- from facts to a verdict --------------------------------------------------------------------------------
def has_fix(version: str | None, fix: Fix) -> bool | None:
    """Whether a logged vLLM version carries ``fix``: True, False, or None when the log cannot say (no
    version, or a development build between the last release without the fix and the first with it)."""
    try:
        v = Version(version or "")
    except InvalidVersion:
        return None
    first, last = Version(fix.first_release), Version(fix.last_release_without)
    base = Version(v.base_version)
    if not (v.is_prerelease or v.is_devrelease or v.is_postrelease):
        return base >= first
    if base > first:
        return True
    return False if base <= last and not v.is_postrelease else None


def _op_table() -> tuple[dict, list[dict]]:
    rec = recorded.load("embedding_assert_ops")
    return rec["meta"], rec["rows"]


def _ops_for(a: dict, rows: list[dict]) -> list[dict]:
    """The recorded cases whose CUDA run failed the same condition in the same kernel of the same file."""
    name, c = Path(a["file"]).name, ("kernel", "condition")
    return [
        {"op": r["op"], "bad": r["bad"], "num_indices": r["num_indices"]}
        for r in rows
        if [r["cuda"].get(k) for k in c] == [a[k] for k in c]
        and r["cuda"].get("where", "").split(":")[0] == name
    ]


def _embedding_kernels(rows: list[dict]) -> set[str]:
    return {
        r["cuda"]["kernel"] for r in rows if r["op"] == "F.embedding" and "kernel" in r["cuda"]
    } | _OTHER_EMBEDDING_KERNELS


def _is_embedding_frame(frame: dict) -> bool:
    text = f"{frame['func']} {frame['source']}".lower()
    return "embed" in text


def _engine_frames(frames: list[dict]) -> list[dict]:
    return [f for f in frames if "/vllm/" in f["file"] or "/specfix/" in f["file"]]


def _python_error(scan: _Scan) -> dict | None:
    """The traceback that says most about the fault: among those that do not re-raise another process's
    error, the first that reports a CUDA error, else the first; else the first of all."""
    done = [(tb, frames) for tb, frames in scan.done if frames or tb.exception]
    if not done:
        return None

    def text(tb):
        return f"{tb.exception[0]}: {tb.exception[1]}" if tb.exception else ""

    plain = [d for d in done if d[0].exception and not any(w in text(d[0]) for w in _WRAPPERS)]
    cuda = [d for d in plain if "CUDA" in text(d[0]) or "AcceleratorError" in text(d[0])]
    tb, frames = (cuda or plain or done)[0]
    last = frames[-1] if frames else None
    ours = _engine_frames(frames)
    return {
        "process": tb.process,
        "exception": tb.exception[0] if tb.exception else None,
        "message": tb.exception[1] if tb.exception else None,
        "line": tb.exception[2] if tb.exception else tb.start,
        "complete": tb.exception is not None,
        "frames": frames[-12:],
        "ends_at": _frame_text(last) if last else None,
        "last_engine_frame": _frame_text(ours[-1]) if ours else None,
        "processes": sorted({t.process for t, _ in scan.done if t.process}),
    }


def _frame_text(f: dict) -> str:
    return f"{Path(f['file']).name}:{f['line']} in {f['func']}" + (f": {f['source']}" if f["source"] else "")


def _spec_state(scan: _Scan) -> tuple[bool | None, list[tuple[str, list[int]]]]:
    s, lines = scan.setup, scan.setup_lines
    if "speculative_method" in s or "num_speculative_tokens" in s:
        key = "speculative_method" if "speculative_method" in s else "num_speculative_tokens"
        what = f"method {s['speculative_method']}" if "speculative_method" in s else "drafts"
        k = f", k = {s['num_speculative_tokens']}" if "num_speculative_tokens" in s else ""
        return True, [(f"speculative decoding is on ({what}{k})", [lines[key]])]
    if scan.spec_marker:
        return True, [
            ("the log shows speculative decoding at work (spec-decode code or metrics)", [scan.spec_marker])
        ]
    if scan.spec_off_line:
        return False, [
            (
                "the engine arguments hold no speculative config: speculative decoding is off",
                [scan.spec_off_line],
            )
        ]
    return None, [("the log does not say whether speculative decoding was on", [])]


def _verdict(scan: _Scan, err: dict | None, asserts: list[dict], rows: list[dict]):
    """(verdict id, confidence, reasons); a reason is (text, [line numbers])."""
    spec, spec_reasons = _spec_state(scan)
    version = scan.setup.get("vllm_version")
    blocking = scan.blocking_stated or (scan.cuda_error_text and not scan.async_hint)
    frames = err["frames"] if err else []
    ours = _engine_frames(frames)
    in_rejection = bool(ours) and "rejection_sampler" in ours[-1]["file"]
    in_pp = any("pp_utils" in f["file"] or "broadcast" in f["func"] for f in frames)
    reasons: list[tuple[str, list[int]]] = []

    def fix_reason(verdict: str):
        fix = FIXES[verdict]
        state = has_fix(version, fix)
        if version is None:
            return state, ("the log does not state the vLLM version", [])
        line = [scan.setup_lines["vllm_version"]]
        said = {
            True: f"carries PR #{fix.pr} (first in {fix.first_release})",
            False: f"predates PR #{fix.pr} (first in {fix.first_release})",
            None: f"is a build the release list cannot place against PR #{fix.pr}",
        }[state]
        return state, (f"vLLM {version} {said}", line)

    if asserts:
        first = asserts[0]
        kernel_line = [first["first_line"]]
        embedding = first["kernel"] in _embedding_kernels(rows)
        if scan.engine_v0:
            return (
                "other_index",
                "medium",
                [
                    (f"the first assert is in {first['kernel']} ({first['where']})", kernel_line),
                    (
                        "the log comes from vLLM's pre-V1 engine (vllm/spec_decode/, vllm/worker/), "
                        "not the V1 "
                        "engine whose placeholder paths this suite studies",
                        [scan.engine_v0],
                    ),
                ],
            )
        if in_pp:
            return (
                "other_index",
                "medium",
                [
                    (
                        f"the first assert is in {first['kernel']} ({first['where']}): "
                        f"{_kernel_note(first, rows)}",
                        kernel_line,
                    ),
                    (
                        "the traceback runs through the pipeline-parallel hand-off (pp_utils.py), not the "
                        "embedding; vLLM PR #55745 reports an index assert from that broadcast",
                        [err["line"]],
                    ),
                ],
            )
        if not embedding:
            return (
                "other_index",
                "high" if spec is not True else "medium",
                [
                    (
                        f"the first assert is in {first['kernel']} ({first['where']}): "
                        f"{_kernel_note(first, rows)}; "
                        "an embedding asserts in " + ", ".join(sorted(_embedding_kernels(rows))),
                        kernel_line,
                    ),
                    *spec_reasons,
                ],
            )
        if spec is False:
            return (
                "other_index",
                "medium",
                [
                    (
                        f"the first assert is in {first['kernel']} ({first['where']}), "
                        "which an embedding can "
                        "launch",
                        kernel_line,
                    ),
                    *spec_reasons,
                    ("but without speculative decoding there are no -1 placeholder drafts", []),
                ],
            )
        shared = sorted({o["op"] for o in _ops_for(first, rows)} - {"F.embedding"})
        also = f", as do {', '.join(shared)}" if shared else ""
        reasons.append(
            (
                f"the first assert is in {first['kernel']} ({first['where']}), a kernel an embedding "
                f"launches (chapter 2's op table){also}",
                kernel_line,
            )
        )
        reasons += spec_reasons
        embed_frame = bool(frames) and _is_embedding_frame(frames[-1])
        if embed_frame and blocking:
            reasons.append(
                (
                    f"with blocking launches the traceback ends at the embedding call: {err['ends_at']}",
                    [err["line"]],
                )
            )
        state, reason = fix_reason("placeholder_embedding")
        reasons.append(reason)
        if spec is True and state is False:
            confidence = "high"
        elif spec is True or embed_frame and blocking or first["kernel"].startswith("indexSelect"):
            confidence = "medium"
        else:
            confidence = "low"
        if state is True:
            confidence = "low" if spec is not True else "medium"
            reasons.append(
                (
                    "this version clamps in the V1 runner's _preprocess, so the -1 came another way "
                    "(a multimodal embedding path: PR #46947 reports one)",
                    [],
                )
            )
        return "placeholder_embedding", confidence, reasons

    negative = scan.errors.get("negative_token")
    cuda_fault = scan.errors.get("illegal_address") or scan.errors.get("device_assert")
    if (negative and spec is not False) or (cuda_fault and in_rejection):
        if negative:
            reasons.append(
                (
                    "a negative token id reached the detokenizer: a -1 was emitted as a real token",
                    [negative["line"]],
                )
            )
        if cuda_fault and in_rejection:
            how = (
                "with blocking launches, so the fault is there"
                if blocking
                else "(launches were asynchronous: the sampler may only be where the host waited)"
            )
            reasons.append(
                (
                    f"the CUDA error surfaced in the rejection sampler {how}: {err['last_engine_frame']}",
                    [err["line"]],
                )
            )
        reasons += spec_reasons
        state, reason = fix_reason("negative_draft")
        reasons.append(reason)
        strong = (cuda_fault and in_rejection and blocking) or (negative and spec is True)
        confidence = "high" if strong and state is False else "medium" if strong or state is False else "low"
        return "negative_draft", confidence, reasons

    fatal = [k for k in ("cuda_oom", "illegal_address", "nccl", "device_assert") if k in scan.errors]
    if fatal or (err and err["complete"]):
        if fatal:
            e = scan.errors[fatal[0]]
            reasons.append((f"the log reports {_ERRORS[fatal[0]][1]}", [e["line"]]))
            if fatal[0] == "device_assert":
                reasons.append(
                    (
                        "but no 'Assertion ... failed' line: the device prints it only when the host "
                        "next waits, and a process can die first; paste the lines above the "
                        "traceback, or rerun with CUDA_LAUNCH_BLOCKING=1",
                        [],
                    )
                )
        if err and err["complete"]:
            reasons.append((f"Python raised {err['exception']}: {err['message']}"[:300], [err["line"]]))
        kind = "inconclusive" if fatal == ["device_assert"] else "different_error"
        return kind, "high" if kind == "different_error" else "low", reasons

    s = scan.setup
    if spec is True and s.get("draft_sample_method") == "probabilistic":
        graphs = s.get("cudagraph_mode") not in ("NONE", None) or (s.get("enforce_eager") is False)
        eager = s.get("enforce_eager") is True or s.get("cudagraph_mode") == "NONE"
        reasons += spec_reasons
        reasons.append(
            (
                "drafts are sampled probabilistically: Model Runner V2's drafter caches their "
                "logits, which the padded rows of a CUDA-graph replay could overwrite",
                [scan.setup_lines["draft_sample_method"]],
            )
        )
        state, reason = fix_reason("cudagraph_outputs")
        reasons.append(reason)
        if eager:
            reasons.append(
                (
                    "CUDA graphs are off, so no padded rows replay",
                    [scan.setup_lines.get("enforce_eager", scan.setup_lines.get("cudagraph_mode"))],
                )
            )
            return "inconclusive", "low", reasons
        if scan.acceptance:
            rate, n = min(scan.acceptance)
            reasons.append((f"the lowest logged draft acceptance rate is {rate:g}%", [n]))
        if state is True:
            return "inconclusive", "low", reasons
        graph_text = (
            f"CUDA graph mode {s['cudagraph_mode']}"
            if "cudagraph_mode" in s
            else "CUDA graphs are on unless --enforce-eager is given, and the log does not give it"
        )
        reasons.append((graph_text, [scan.setup_lines["cudagraph_mode"]] if "cudagraph_mode" in s else []))
        confidence = "medium" if state is False and graphs else "low"
        return "cudagraph_outputs", confidence, reasons
    reasons.append(
        (f"no 'Assertion ... failed' line, no Python error and no CUDA error in {scan.lines:,} lines", [])
    )
    if spec is True:
        reasons.append(
            (
                "drafts are sampled greedily (vLLM's default draft_sample_method): no draft logits "
                "are cached for padded rows to overwrite, which PR #47066's bug needs",
                [scan.setup_lines["draft_sample_method"]] if "draft_sample_method" in s else [],
            )
        )
    return "inconclusive", "low", reasons


def _kernel_note(a: dict, rows: list[dict]) -> str:
    ops = _ops_for(a, rows)
    if ops:
        return "in chapter 2's op table only " + ", ".join(sorted({o["op"] for o in ops})) + " failed there"
    name = Path(a["file"]).name
    for file, mark, note in _KNOWN_ELSEWHERE:
        if name == file and mark in a["condition"]:
            return note
    return "a kernel chapter 2's op table never reached"


def _advice(verdict: str, fix_state: bool | None, blocking: bool) -> list[str]:
    name = "specfix.lab.guard.check_indices()"
    restart = "Restart the worker: after a device-side assert its CUDA context is unusable."
    name_op = (
        f"To name the op: rerun with CUDA_LAUNCH_BLOCKING=1 (slow, for debugging only) or wrap the "
        f"step in {name}."
        if not blocking
        else f"The launches were blocking, so the traceback names the op; {name} also gives the bad values "
        "and their positions."
    )
    upgrade = "Upgrade to vLLM {} or later (PR #{})."
    if verdict == "placeholder_embedding":
        fix = FIXES[verdict]
        return (
            [upgrade.format(fix.first_release, fix.pr)]
            if fix_state is not True
            else [
                "Report it to vLLM with the first assert line and the engine arguments: this version "
                "already clamps in the V1 runner."
            ]
        ) + [
            ("Until then" if fix_state is not True else "Meanwhile")
            + ": the -1 drafts exist only with speculative decoding; serving without "
            "--speculative-config avoids the path. --no-async-scheduling removes the async-scheduling "
            "placeholders; the synchronous scheduler's padding of new decodes (PR #45237) remains in the "
            "releases that have it.",
            name_op,
            restart,
        ]
    if verdict == "negative_draft":
        fix = FIXES[verdict]
        return ([upgrade.format(fix.first_release, fix.pr)] if fix_state is not True else []) + [
            "Until then: greedy requests (temperature 0) always rejected a -1 draft (it never equals the "
            "argmax); the sampled path is the one PR #46533 fixed.",
            name_op,
        ]
    if verdict == "other_index":
        return ["This is not the placeholder bug this suite covers. " + name_op, restart]
    if verdict == "cudagraph_outputs":
        fix = FIXES[verdict]
        return [
            upgrade.format(fix.first_release, fix.pr),
            "Until then: draft_sample_method='greedy' (the default) caches no draft logits, and "
            "--enforce-eager replays no padded rows.",
            "To test an engine for this class of bug: specfix.lab.invariance.check_padding_invariance "
            "(chapter 3) runs a step with garbage in its padded rows and compares the live rows.",
        ]
    if verdict == "different_error":
        return ["Not one of the bugs this suite covers: read the error above from its first traceback."]
    return [
        "Paste more of the log: from the server's start (the version banner and the engine arguments) to "
        "the end of the first traceback, including the first 'Assertion ... failed' line."
    ]


def diagnose(lines: Iterable[str], source: str = "<log>") -> dict:
    """The report (a dict following SCHEMA) for the lines of one log."""
    scan = _Scan()
    for line in lines:
        scan.feed(line)
    scan.finish()
    meta, rows = _op_table()
    asserts = sorted(scan.asserts.values(), key=lambda a: a["first_line"])
    err = _python_error(scan)
    verdict, confidence, reasons = _verdict(scan, err, asserts, rows)
    blocking = scan.blocking_stated or (scan.cuda_error_text and not scan.async_hint)
    version = scan.setup.get("vllm_version")
    fixes = [
        {
            "pr": f.pr,
            "verdict": v,
            "short": f.short,
            "what": f.what,
            "where": f.where,
            "first_release": f.first_release,
            "verified": f.verified,
            "chapter": f.chapter,
            "logged_version_has_it": has_fix(version, f),
        }
        for v, f in sorted(FIXES.items(), key=lambda item: item[0] != verdict)
    ]
    if err:
        err["why_not_there"] = _why(err, asserts, blocking)
    spec, _ = _spec_state(scan)
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
        "python_error": err,
        "errors": {k: v for k, v in scan.errors.items()},
        "setup": {
            "speculative_decoding": spec,
            "launch_blocking": blocking,
            **scan.setup,
            "lines": dict(scan.setup_lines),
        },
        "ops": [
            {
                "kernel": a["kernel"],
                "where": a["where"],
                "cases": _ops_for(a, rows),
                "note": _kernel_note(a, rows),
            }
            for a in asserts[:4]
        ],
        "op_table": f"chapter 2's op table, recorded on {meta.get('device')} with torch {meta.get('torch')} "
        f"on {meta.get('date')}",
        "fixes": fixes,
        "advice": _advice(verdict, has_fix(version, FIXES[verdict]) if verdict in FIXES else None, blocking),
        "chapter": FIXES[verdict].chapter if verdict in FIXES else "notebooks/02_embedding_assert.ipynb",
    }


def _why(err: dict, asserts: list[dict], blocking: bool) -> str:
    if blocking:
        return (
            "The launches were blocking (CUDA_LAUNCH_BLOCKING=1), so each one waited for its kernel: the "
            "traceback ends at the op that failed."
        )
    if not asserts and "CUDA" not in (err.get("message") or ""):
        return "A Python error: it is raised where it happened."
    return (
        "CUDA reports a kernel's failure asynchronously: the launch returned long before the kernel "
        "failed, and the error reached Python at the next call that waited for the GPU. The traceback "
        "shows that call, not the op whose kernel asserted (chapter 2, section 1)."
    )


# -- the report as text -------------------------------------------------------------------------------------
def render(report: dict, width: int = 100) -> str:
    """The report as a person reads it: verdict first, then the evidence, then what to do."""

    def para(text: str, indent: str = "  ", first: str | None = None) -> str:
        return textwrap.fill(
            text,
            width,
            initial_indent=indent if first is None else first,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )

    v = report["verdict"]
    out = [
        f"specfix diagnose: {report['source']} ({report['lines']:,} lines)",
        "",
        para(f"Verdict: {v['title']}", "  ", ""),
        f"  confidence: {v['confidence']}",
    ]
    for r in v["reasons"]:
        at = f" (line {', '.join(map(str, r['lines']))})" if r["lines"] else ""
        out.append(para(f"{r['text']}{at}", "    ", "  - "))
    a = report["asserts"]
    out += ["", "Device-side asserts:"]
    if a["distinct"]:
        out.append(
            f"  {a['lines']:,} assert line(s), {len(a['distinct'])} distinct; the first printed is in "
            f"{a['first_kernel']}:"
        )
        for d in a["distinct"]:
            out.append(
                para(
                    f"{d['count']:,} x {d['where']}: {d['kernel']}: `{d['condition']}` "
                    f"(first at line {d['first_line']})",
                    "      ",
                    "  ",
                )
            )
    else:
        out.append("  none")
    e = report["python_error"]
    out += ["", "What Python raised:"]
    if e:
        who = f" in {e['process']}" if e["process"] else ""
        raised = f"{e['exception']}: {e['message']}" if e["complete"] else "a traceback cut short"
        out.append(para(f"{raised}{who} (line {e['line']})"))
        if e["ends_at"]:
            out.append(para(f"the traceback ends at {e['ends_at']}"))
        if e["last_engine_frame"] and e["last_engine_frame"] != e["ends_at"]:
            out.append(para(f"its innermost engine frame: {e['last_engine_frame']}"))
        out.append(para(e["why_not_there"]))
    else:
        out.append("  no Python traceback")
    s = report["setup"]
    shown = [f"{k.replace('_', ' ')} {s[k]}" for k in _SETUP if k in s]
    out += [
        "",
        "Setup stated in the log:",
        para("; ".join(shown) if shown else "nothing (no version banner, no engine arguments)"),
    ]
    for o in report["ops"]:
        out += [
            "",
            para(f"Ops that assert in {o['kernel']} ({report['op_table']}):", "  ", ""),
            para(_cases_text(o["cases"]) or o["note"]),
        ]
    out += ["", "Fixes:"]
    for f in report["fixes"]:
        has = {True: "yes", False: "no", None: "cannot tell"}[f["logged_version_has_it"]]
        out.append(
            para(
                f"PR #{f['pr']}, {f['short']} ({f['where']}): first release {f['first_release']}; "
                f"in the logged version: {has}",
                "    ",
                "  ",
            )
        )
    out += ["", "What to do now:"] + [para(line, "    ", "  - ") for line in report["advice"]]
    out += ["", f"Explained in {report['chapter']}."]
    return "\n".join(out)


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


# -- the JSON report ----------------------------------------------------------------------------------------
SCHEMA_ID = "specfix.diagnose/1"
_LINES = {"type": "array", "items": {"type": "integer", "minimum": 1}}
_STR_OR_NULL = {"type": ["string", "null"]}
#: JSON Schema (draft 2020-12) of ``specfix diagnose --json``.
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": [
        "schema",
        "source",
        "lines",
        "verdict",
        "asserts",
        "python_error",
        "errors",
        "setup",
        "ops",
        "op_table",
        "fixes",
        "advice",
        "chapter",
    ],
    "additionalProperties": False,
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "source": {"type": "string"},
        "lines": {"type": "integer", "minimum": 0},
        "verdict": {
            "type": "object",
            "required": ["id", "title", "confidence", "reasons"],
            "additionalProperties": False,
            "properties": {
                "id": {"enum": list(VERDICTS)},
                "title": {"type": "string"},
                "confidence": {"enum": ["high", "medium", "low"]},
                "reasons": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["text", "lines"],
                        "additionalProperties": False,
                        "properties": {"text": {"type": "string"}, "lines": _LINES},
                    },
                },
            },
        },
        "asserts": {
            "type": "object",
            "required": ["lines", "distinct", "first_kernel"],
            "additionalProperties": False,
            "properties": {
                "lines": {"type": "integer", "minimum": 0},
                "first_kernel": _STR_OR_NULL,
                "distinct": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["where", "file", "line", "kernel", "condition", "count", "first_line"],
                        "properties": {
                            "where": {"type": "string"},
                            "file": {"type": "string"},
                            "line": {"type": "integer"},
                            "kernel": {"type": "string"},
                            "condition": {"type": "string"},
                            "count": {"type": "integer", "minimum": 1},
                            "first_line": {"type": "integer", "minimum": 1},
                        },
                    },
                },
            },
        },
        "python_error": {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": False,
                    "required": [
                        "process",
                        "exception",
                        "message",
                        "line",
                        "complete",
                        "frames",
                        "ends_at",
                        "last_engine_frame",
                        "processes",
                        "why_not_there",
                    ],
                    "properties": {
                        "process": _STR_OR_NULL,
                        "exception": _STR_OR_NULL,
                        "message": _STR_OR_NULL,
                        "line": {"type": "integer", "minimum": 1},
                        "complete": {"type": "boolean"},
                        "frames": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["file", "line", "func", "source"],
                                "properties": {
                                    "file": {"type": "string"},
                                    "line": {"type": "integer"},
                                    "func": {"type": "string"},
                                    "source": {"type": "string"},
                                },
                            },
                        },
                        "ends_at": _STR_OR_NULL,
                        "last_engine_frame": _STR_OR_NULL,
                        "processes": {"type": "array", "items": {"type": "string"}},
                        "why_not_there": {"type": "string"},
                    },
                },
            ]
        },
        "errors": {
            "type": "object",
            "propertyNames": {"enum": list(_ERRORS)},
            "additionalProperties": {
                "type": "object",
                "required": ["count", "line", "text"],
                "properties": {
                    "count": {"type": "integer", "minimum": 1},
                    "line": {"type": "integer", "minimum": 1},
                    "text": {"type": "string"},
                },
            },
        },
        "setup": {
            "type": "object",
            "required": ["speculative_decoding", "launch_blocking", "lines"],
            "properties": {
                "speculative_decoding": {"type": ["boolean", "null"]},
                "launch_blocking": {"type": "boolean"},
                "lines": {"type": "object", "additionalProperties": {"type": "integer"}},
                **{k: {"type": ["string", "integer", "boolean", "null"]} for k in _SETUP},
            },
            "additionalProperties": False,
        },
        "ops": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["kernel", "where", "cases", "note"],
                "additionalProperties": False,
                "properties": {
                    "kernel": {"type": "string"},
                    "where": {"type": "string"},
                    "note": {"type": "string"},
                    "cases": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["op", "bad", "num_indices"],
                            "properties": {
                                "op": {"type": "string"},
                                "bad": {"type": "string"},
                                "num_indices": {"type": "integer"},
                            },
                        },
                    },
                },
            },
        },
        "op_table": {"type": "string"},
        "fixes": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": [
                    "pr",
                    "verdict",
                    "short",
                    "what",
                    "where",
                    "first_release",
                    "verified",
                    "chapter",
                    "logged_version_has_it",
                ],
                "properties": {
                    "pr": {"type": "integer"},
                    "verdict": {"enum": list(FIXES)},
                    "short": {"type": "string"},
                    "what": {"type": "string"},
                    "where": {"type": "string"},
                    "first_release": {"type": "string"},
                    "verified": {"type": "string"},
                    "chapter": {"type": "string"},
                    "logged_version_has_it": {"type": ["boolean", "null"]},
                },
            },
        },
        "advice": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "chapter": {"type": "string"},
    },
}


# -- command line -------------------------------------------------------------------------------------------
def run(path: str, as_json: bool = False, progress: bool = True) -> tuple[int, str]:
    """(exit status, text to print) for ``specfix diagnose``; bad input: status 2 and a one-line message."""
    try:
        stream, size, name = _open(path)
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
