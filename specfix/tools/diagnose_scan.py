"""One pass over a pasted vLLM log: the facts whose verdict :mod:`specfix.tools.diagnose` gives.

Read :func:`read_lines` (how a log is read, whatever its size), then :class:`Scan` (what each line adds),
then :func:`python_error` and :func:`spec_state` (what the scanned log says about the fault and the setup).
Chapter 2 (:mod:`specfix.lab.embedding_assert`) reads its own transcripts with the same parsers,
:func:`device_asserts` and :func:`traceback_frames`.
"""

from __future__ import annotations

import codecs
import contextlib
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_LINE = 65536  # characters; a longer line is read as several
BLOCK = 1 << 20  # bytes read at a time
MAX_DISTINCT_ASSERTS = 64
MAX_TRACEBACKS = 32  # completed tracebacks kept (the first ones: the root cause comes first)
MAX_TRACEBACK_LINES = 400  # lines kept per traceback (its innermost frames)

_ASSERT = re.compile(
    r"(?P<file>\S+?\.cuh?):(?P<line>\d+): (?P<kernel>.+?): block: \[(?P<block>[\d,\s]+)\], "
    r"thread: \[(?P<thread>[\d,\s]+)\] Assertion `(?P<condition>.+?)` failed\."
)
_FRAME = re.compile(
    r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)\n(?:    (?P<source>.*))?', re.M
)
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\):$", re.M)
_CHAINED = (  # what Python prints between the tracebacks of one chain of exceptions (oldest first)
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# what a log collector puts before vLLM's own line: `docker logs -t`'s timestamp, docker compose's `web-1  | `
_OUTER = re.compile(r"^(?:\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-][\d:]+)? |[\w.-]+ +\| )+")
_PREFIX = re.compile(r"^(?:\s*(?:\([^()]*?pid=\d+\)|\[rank\d+\]:))+ ?")  # (EngineCore_DP0 pid=12), [rank0]:
_PROC = re.compile(r"\(([^()]*?pid=\d+)\)")
_HEADER = re.compile(
    r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) +\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? +"
    r"(?:\[[^\]]*\]|[\w.]+:\d+\]) ?"
)
_EXCEPTION = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Fault))(?::\s*(?P<msg>.*))?$"
)
_BOOL = {"true": True, "false": False, "none": None}

# setup key -> patterns; the first match in the log wins (flags become booleans in _setup_value)
# fmt: off
SETUP = {
    "vllm_version": [r"vLLM API server version (\S+)", r"Initializing a V1 LLM engine \(v([^)\s]+)\)",
                     r"vLLM Version\s*:\s*(\S+)", r"\bvllm[= ]=(\d\S*)"],
    # vllm/v1/worker/gpu_worker.py logs the first, vllm/config/vllm.py the fall-back (0.24.0 to 0.33.0);
    # else a frame of V2's vllm/v1/worker/gpu/ (whose eplb_utils.py V1 imports too) or of V1's runner
    "model_runner": [r"Using (V2) Model Runner", r"using the (V1) model runner instead",
                     r"/vllm/v1/worker/(gpu)/(?!eplb_utils)", r"/vllm/v1/worker/(gpu_model_runner)\.py"],
    "speculative_method": [r"speculative[-_]config\W.*?\bmethod\W{1,4}([\w-]+)"],
    "num_speculative_tokens": [r"num_spec(?:ulative)?_tokens\W{1,4}(\d+)"],
    "draft_sample_method": [r"draft_sample_method\W{1,4}(\w+)"],
    "async_scheduling": [
        r"async_scheduling\W{1,4}(True|False|true|false)", r"(--(?:no-)?async-scheduling)\b"
    ],
    "cudagraph_mode": [
        r"cudagraph_mode\W{1,4}(?:CUDAGraphMode\.)?(FULL_AND_PIECEWISE|FULL_DECODE_ONLY|PIECEWISE|FULL|NONE)\b"
    ],
    "enforce_eager": [r"enforce_eager\W{1,4}(True|False|true|false)", r"(--enforce-eager)\b"],
    "tensor_parallel_size": [
        r"tensor_parallel_size\W{1,4}(\d+)", r"(?:--tensor-parallel-size|\s-tp)[ =](\d+)"
    ],
    "pipeline_parallel_size": [
        r"pipeline_parallel_size\W{1,4}(\d+)", r"(?:--pipeline-parallel-size|\s-pp)[ =](\d+)"
    ],
    "prefix_caching": [
        r"enable_prefix_caching\W{1,4}(True|False|true|false|None)", r"(--(?:no-)?enable-prefix-caching)\b"
    ],
    "kv_role": [r"kv_role\W{1,4}(kv_producer|kv_consumer|kv_both)"],
    "kv_connector": [r"kv_connector\W{1,4}(\w+)"],
}
# fmt: on
_SETUP_RE = {key: [re.compile(p) for p in pats] for key, pats in SETUP.items()}
_SETUP_HINT = re.compile(
    r"version|Version|speculative|num_spec|parallel|async|cudagraph|eager|prefix|kv_|draft_sample|-tp|-pp|"
    r"odel [Rr]unner|/v1/worker/gpu"
)
_ACCEPTANCE = re.compile(r"SpecDecoding metrics:.*?Avg Draft acceptance rate: ([\d.]+)%")
# error kind -> (substring that marks it, how the report names it)
ERRORS = {
    "device_assert": ("device-side assert triggered", "CUDA error: device-side assert triggered"),
    "cuda_oom": ("out of memory", "CUDA out of memory"),
    "illegal_address": ("illegal memory access", "CUDA error: an illegal memory access was encountered"),
    "nccl": ("NCCL", "an NCCL (collective communication) error"),
    "negative_token": (
        "out of range integral type conversion",
        "a negative token id reached the detokenizer",
    ),
}
_SPEC_AT_WORK = ("SpecDecoding metrics", "/spec_decode/", "rejection_sampler")
_PRE_V1_MARKS = ("spec_decode_worker", "/vllm/worker/", "/vllm/spec_decode/", "VLLM_USE_V1=0")


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


def traceback_frames(text: str) -> list[dict]:
    """The frames of the last Python error in ``text``, outermost first (file, line, func, source).

    Of a chain of errors, the earliest's: where the failure was first heard of, not the clean-up code that
    failed after it (after a device-side assert, any CUDA call in a handler fails too)."""
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


class LogError(ValueError):
    """The input cannot be diagnosed (missing, a directory, binary, empty): the message says why."""


def open_log(path: str):
    """The log as a binary stream to read in a ``with``; ``-``: standard input (left open)."""
    if path == "-":
        return contextlib.nullcontext(sys.stdin.buffer)
    try:
        return open(path, "rb")  # noqa: SIM115  (the caller's ``with`` closes it)
    except FileNotFoundError:
        raise LogError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise LogError(f"{path} is a directory: give the log file itself") from None
    except OSError as exc:
        raise LogError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def read_lines(stream, name: str) -> Iterator[str]:
    """The text lines of a binary stream, decoded as UTF-8 (bad bytes replaced), at most MAX_LINE long; read a
    block at a time, so memory stays bounded whatever the log's size."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    rest, first = "", True
    while block := stream.read(BLOCK):
        if first and b"\0" in block[:8192]:
            raise LogError(
                f"{name} looks binary (NUL bytes near its start); if it is UTF-16 text "
                "(a Windows redirect), convert it to UTF-8 first"
            )
        first = False
        lines = (rest + decoder.decode(block)).split("\n")
        rest = lines.pop()
        for line in lines:
            yield from _pieces(line)
        while len(rest) > MAX_LINE:  # a line still being read can grow without bound
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


@dataclass
class _Traceback:
    process: str | None
    start: int
    lines: list[str]
    exception: tuple[str, str, int] | None = None  # (type, message, line number) of its first error
    reading: bool = True  # inside frames, before the exception line
    chained: bool = False  # a "During handling..." line followed the exception


class Scan:
    """What one pass over a log collects; :meth:`feed` it every line, then :meth:`finish`."""

    def __init__(self):
        self.lines = self.assert_lines = 0
        self.asserts: dict[tuple, dict] = {}
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

    @property
    def blocking(self) -> bool:
        """Whether launches were blocking: stated, or CUDA's error text without its advice to make them so."""
        return self.blocking_stated or (self.cuda_error_text and not self.async_hint)

    def feed(self, raw: str) -> None:
        self.lines += 1
        n = self.lines
        line = (_ANSI.sub("", raw) if "\x1b" in raw else raw).rstrip("\r")
        if m := _OUTER.match(line):
            line = line[m.end() :]
        if "Assertion `" in line:
            # The lines of one assert differ only in block and thread: a seen signature skips the parse.
            sig = line[: line.find(": block: [")] + line[line.find("] Assertion `") :]
            if (entry := self.seen.get(sig)) is not None:
                self.assert_lines += 1
                entry["count"] += 1
                return
            if found := device_asserts(line):
                self._assert(found[0], n, sig)
                return
        process = None
        if line[:1] in "([" and (m := _PREFIX.match(line)):  # interleaved processes: kept apart by prefix
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
            entry = {"where": a.where, "file": a.file, "line": a.line, "kernel": a.kernel}
            self.asserts[key] = {**entry, "condition": a.condition, "count": 1, "first_line": n}
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
        elif tb is not None and line in _CHAINED:
            tb.chained = True
            tb.lines.append(line)
        elif tb is not None and tb.reading:
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
        for kind, (mark, _) in ERRORS.items():
            if mark in line:
                err = self.errors.setdefault(kind, {"count": 0, "line": n, "text": line.strip()[:300]})
                err["count"] += 1
        if "consider passing CUDA_LAUNCH_BLOCKING" in line:
            self.async_hint = True
        elif "CUDA_LAUNCH_BLOCKING" in line and re.search(r"CUDA_LAUNCH_BLOCKING\W{1,3}1\b", line):
            self.blocking_stated = True
        if line.startswith("Search for `cudaErrorAssert'"):
            self.cuda_error_text = True
        if "speculative_config=None" in line or ("non-default args" in line and "speculative" not in line):
            self.spec_off_line = self.spec_off_line or n
        if self.spec_marker is None and any(mark in line for mark in _SPEC_AT_WORK):
            self.spec_marker = n
        if self.engine_v0 is None and any(mark in line for mark in _PRE_V1_MARKS):
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
        for process, tb in list(self.open.items()):
            if tb.reading and tb.lines[-1].startswith("    ") and tb.lines[-2].startswith("  File "):
                tb.lines[-1] = ""  # the log ends inside the traceback: its last source line may be cut short
            self._close(process)


def _setup_value(key: str, text: str):
    if text.startswith("--"):
        return not text.startswith("--no-")
    if key.endswith("_size") or key == "num_speculative_tokens":
        return int(text)
    if key == "model_runner":
        return {"gpu": "V2", "gpu_model_runner": "V1"}.get(text, text)
    return _BOOL.get(text.lower(), text)


# -- what the log says about the fault and the setup ------------------------------------------------------
# Exceptions that re-raise another process's error: the traceback under them says less.
# fmt: off
_WRAPPERS = ("EngineDeadError", "Worker failed with error", "Engine core initialization failed",
             "EngineCore encountered an issue")
# fmt: on


def engine_frames(frames: list[dict]) -> list[dict]:
    return [f for f in frames if "/vllm/" in f["file"] or "/specfix/" in f["file"]]


def _frame_text(f: dict) -> str:
    return f"{Path(f['file']).name}:{f['line']} in {f['func']}" + (f": {f['source']}" if f["source"] else "")


def python_error(scan: Scan) -> dict | None:
    """The traceback that says most about the fault: among those that do not re-raise another process's
    error, the first that reports a CUDA error, else the first; else the first of all."""
    done = [(tb, frames) for tb, frames in scan.done if frames or tb.exception]
    if not done:
        return None
    plain = [d for d in done if d[0].exception and not any(w in _raised(d[0]) for w in _WRAPPERS)]
    cuda = [d for d in plain if "CUDA" in _raised(d[0]) or "AcceleratorError" in _raised(d[0])]
    tb, frames = (cuda or plain or done)[0]
    ours, exc = engine_frames(frames), tb.exception or (None, None, tb.start)
    if scan.blocking:
        why = (
            "The launches were blocking (CUDA_LAUNCH_BLOCKING=1), so each one waited for its kernel: the "
            "traceback ends at the op that failed."
        )
    elif not scan.asserts and "CUDA" not in (exc[1] or ""):
        why = "A Python error: it is raised where it happened."
    else:
        why = (
            "CUDA reports a kernel's failure asynchronously: the launch returned long before the kernel "
            "failed, and the error reached Python at the next call that waited for the GPU. The traceback "
            "shows that call, not the op whose kernel asserted (chapter 2, section 1)."
        )
    return {
        "process": tb.process,
        "exception": exc[0],
        "message": exc[1],
        "line": exc[2],
        "complete": tb.exception is not None,
        "frames": frames[-12:],
        "ends_at": _frame_text(frames[-1]) if frames else None,
        "last_engine_frame": _frame_text(ours[-1]) if ours else None,
        "processes": sorted({t.process for t, _ in scan.done if t.process}),
        "why_not_there": why,
    }


def _raised(tb) -> str:
    return f"{tb.exception[0]}: {tb.exception[1]}" if tb.exception else ""


def spec_state(scan: Scan) -> tuple[bool | None, list[tuple[str, list[int]]]]:
    """Whether speculative decoding was on (None: the log does not say), and the reason to show."""
    s, lines = scan.setup, scan.setup_lines
    if "speculative_method" in s or "num_speculative_tokens" in s:
        key = "speculative_method" if "speculative_method" in s else "num_speculative_tokens"
        what = f"method {s['speculative_method']}" if "speculative_method" in s else "drafts"
        k = f", k = {s['num_speculative_tokens']}" if "num_speculative_tokens" in s else ""
        return True, [(f"speculative decoding is on ({what}{k})", [lines[key]])]
    if scan.spec_marker:
        text = "the log shows speculative decoding at work (spec-decode code or metrics)"
        return True, [(text, [scan.spec_marker])]
    if scan.spec_off_line:
        text = "the engine arguments hold no speculative config: speculative decoding is off"
        return False, [(text, [scan.spec_off_line])]
    return None, [("the log does not say whether speculative decoding was on", [])]
