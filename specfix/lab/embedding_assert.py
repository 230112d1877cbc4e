"""Re-create the embedding device-side assert for real, in child processes, and read what it leaves behind.

A device-side assert poisons the CUDA context of its process, so each reproduction runs in a child Python
whose output, exit status and ``@@ {json}`` events come back as a :class:`ChildRun`.

Read :func:`run_child` and :func:`minimal_crash_code` first; the comments above :func:`run_until_asserts`
and ``PRELUDE`` say why a child may end without its assert lines.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specfix.checks import is_int
from specfix.tools import recorded
from specfix.tools.diagnose import (  # noqa: F401  (chapter 2 names them here too)
    DeviceAssert,
    device_asserts,
    traceback_frames,
)

EVENT_PREFIX = "@@ "
_FILE_PATH = re.compile(r'File "([^"]+)"')
_CHAINED_NOTE = "During handling of the above exception, another exception occurred"


def _short_path(match: re.Match) -> str:
    """A ``File "..."`` without the machine's part: from ``site-packages/`` or ``specfix/``, else its name."""
    path = match.group(1)
    if "site-packages/" in path:
        return f'File "{path.split("site-packages/")[-1]}"'
    if "/specfix/" in path:
        return f'File "specfix/{path.split("/specfix/")[-1]}"'
    return f'File "{Path(path).name}"' if path.startswith("/") else match.group(0)


PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def parse_event(line: str) -> dict:
    """The event a ``@@ {json}`` line carries. A line that is not a JSON object (the child died mid-line,
    or printed ``@@`` itself) is kept as data too: ``{"kind": "malformed", "text": <the line>}``."""
    try:
        event = json.loads(line[len(EVENT_PREFIX) :])
    except json.JSONDecodeError:
        event = None
    if not isinstance(event, dict) or not isinstance(event.get("kind"), str):
        return {"kind": "malformed", "text": line}
    return event


@dataclass
class ChildRun:
    """What a child Python left behind: exit status, merged output, and its structured events."""

    label: str
    code: str
    env: dict[str, str]
    returncode: int | None  # None: killed at the timeout
    output: str  # stdout and stderr merged, in the order the child wrote them
    wall_s: float
    events: list[dict] = field(default_factory=list)
    attempts: int = 1  # runs made to get this one (run_until_asserts)

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def asserts(self) -> list[DeviceAssert]:
        return device_asserts(self.output)

    @property
    def failed_without_assert_line(self) -> bool:
        """The child failed (non-zero exit, or an exception it reported) yet printed no assert line."""
        failed = self.returncode not in (0, None) or self.first("raised") is not None
        return failed and not self.asserts

    def first(self, kind: str) -> dict | None:
        return next((e for e in self.events if e.get("kind") == kind), None)

    def transcript(self, max_asserts: int = 2) -> str:
        """The output as a terminal shows it, long assert runs cut, no machine paths."""
        lines, asserts = [], 0
        for line in self.output.splitlines():
            line = _FILE_PATH.sub(_short_path, line)
            if line.startswith(_CHAINED_NOTE):
                lines.append(
                    "[the engine's rollback then failed as well, on the same poisoned CUDA context: "
                    "its traceback is left out]"
                )
                break
            if line.startswith(EVENT_PREFIX):
                lines.append("[child] " + str(parse_event(line).get("text", "")))
            elif device_asserts(line):
                asserts += 1
                if asserts <= max_asserts:
                    lines.append(line)
                elif asserts == max_asserts + 1:
                    lines.append("... (more assert lines like these, one per failing GPU thread)")
            else:
                lines.append(line)
        return "\n".join(lines)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ChildRun:
        return cls(**data)


def run_child(
    code: str, *, label: str = "", env: dict[str, str] | None = None, timeout: float = 180.0
) -> ChildRun:
    """Run ``code`` as ``<label>.py`` in a fresh Python (tracebacks show its lines); failure is data."""
    if not isinstance(code, str) or not code.strip():
        raise ValueError("code must be a non-empty string of Python source")
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), full_env.get("PYTHONPATH")) if p)
    full_env["PYTHONUNBUFFERED"] = "1"
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / f"{re.sub(r'[^A-Za-z0-9_]+', '_', label) or 'child'}.py"
        script.write_text(code)
        try:
            done = subprocess.run(
                [sys.executable, "-u", str(script)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=full_env,
                timeout=timeout,
                cwd=PACKAGE_ROOT,
            )
            returncode, raw = done.returncode, done.stdout
        except subprocess.TimeoutExpired as expired:
            returncode, raw = None, expired.stdout or b""
    output = raw.decode("utf-8", errors="replace")
    events = [parse_event(line) for line in output.splitlines() if line.startswith(EVENT_PREFIX)]
    return ChildRun(label, code, dict(env or {}), returncode, output, time.perf_counter() - start, events)


# The assert lines are the device's printf, fetched only when the host next waits for the GPU: a process
# that dies at a mere launch can exit without them. So every child waits and flushes (``PRELUDE``), this
# re-runs one that lost them, and :func:`with_assert_lines` falls back to a recording, saying so.
def run_until_asserts(code: str, *, attempts: int = 3, **child) -> ChildRun:
    """:func:`run_child`, re-run (``attempts`` in all) while the child fails without an assert line."""
    if not is_int(attempts) or attempts < 1:
        raise ValueError(f"attempts must be an int >= 1, got {attempts!r}")
    for attempt in range(1, attempts + 1):
        run = run_child(code, **child)
        run.attempts = attempt
        if not run.failed_without_assert_line:
            break
    return run


def first_assert_text(run: ChildRun) -> str:
    """``kernel - condition`` of the run's first assert line, or a sentence saying it has none."""
    asserts = run.asserts
    if not asserts:
        return "none: this transcript holds no assert line"
    return f"{asserts[0].kernel} - {asserts[0].condition}"


def with_assert_lines(live: ChildRun, recording: dict, name: str) -> tuple[ChildRun, str]:
    """``live`` if it holds assert lines, else the recorded run, with a note that says why it stands in."""
    if live.asserts:
        return live, ""
    why = (
        f"This run exited with status {live.returncode} but printed no assert line"
        + (f" in {live.attempts} attempts" if live.attempts > 1 else "")
        + ": the device's assert text reaches the host only when the host waits for the GPU, and a "
        "process that dies at a mere launch can exit before that."
    )
    stored = recording.get("runs", {}).get(name)
    if stored is not None:
        fallback = ChildRun.from_json(stored)
        if fallback.asserts:
            return fallback, (
                f"{why} Shown instead: the recorded transcript of the same run, "
                f"{recorded.label(recording['meta'])}."
            )
    return live, f"{why} No recorded transcript with assert lines stands in for it."


# Helpers every child starts with. ``drain_device_output`` runs before an uncaught traceback and at exit:
# the host fetches the assert printf only when it waits for the GPU, and C's stdout buffers it in a pipe.
PRELUDE = r'''
import atexit, ctypes, json, os, sys, time, traceback
import torch
import torch.nn.functional as F

def drain_device_output():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        time.sleep(0.2)
    try:
        ctypes.CDLL(None).fflush(None)
    except Exception:
        pass
    sys.stdout.flush()
    sys.stderr.flush()

_excepthook = sys.excepthook

def excepthook(*exc_info):
    drain_device_output()
    _excepthook(*exc_info)

sys.excepthook = excepthook
atexit.register(drain_device_output)

def event(kind, text, **data):
    print("@@ " + json.dumps(dict(kind=kind, text=text, **data)), flush=True)

def first_line(exc):
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""

def report(during, exc):
    frame = traceback.extract_tb(exc.__traceback__)[-1]
    where = f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}: {frame.line}"
    event("raised", f"{during} raised {type(exc).__name__}: {first_line(exc)}", during=during,
          type=type(exc).__name__, message=first_line(exc), frame=where)
    sys.stdout.flush()
    drain_device_output()
    traceback.print_exc(file=sys.stdout)
    sys.stdout.flush()

def probe_context(before):
    """After an error: can this process still use the GPU? ``before`` is a tensor made before it."""
    probes = [
        ("torch.zeros(1, device='cuda')", lambda: torch.zeros(1, device="cuda")),
        ("torch.cuda.synchronize()", torch.cuda.synchronize),
        ("a matmul, read back with .item()", lambda: (torch.ones(64, 64, device="cuda") @
                                                       torch.ones(64, 64, device="cuda")).sum().item()),
        ("copy a tensor made before the assert to the CPU", lambda: before.cpu()),
    ]
    for name, fn in probes:
        try:
            fn()
            event("probe", f"{name}: works", probe=name, ok=True)
        except Exception as exc:
            event("probe", f"{name}: {type(exc).__name__}: {first_line(exc)}", probe=name, ok=False,
                  type=type(exc).__name__, message=first_line(exc))
'''


# Three kinds of child: :func:`minimal_crash_code` (``F.embedding`` of a ``-1``), :func:`pipeline_crash_code`
# (the engine as vLLM ran before PR #47029) and :func:`op_case_code` (one row of :data:`OPS`; its CPU
# column comes from :func:`cpu_outcome`, in-process since CPU errors are ordinary exceptions).
def minimal_crash_code() -> str:
    """``F.embedding`` on CUDA with a ``-1`` id, instrumented: a warm-up launch with valid ids (so that the
    timed launch carries no one-time set-up), then the bad launch, its return, synchronize, and probes."""
    body = """
ids_list = [5, -1, 7]
weight = torch.randn(32, 16, device="cuda")
ids = torch.tensor(ids_list, device="cuda")
torch.cuda.synchronize()
blocking = os.environ.get("CUDA_LAUNCH_BLOCKING") == "1"
# The first launch of a kernel pays one-time set-up on the host (CUDA loads the kernel's code on first
# use); a warm-up with valid ids takes that cost, so the timed call below shows a plain launch.
start = time.perf_counter()
F.embedding(ids.clamp(0, 31), weight)
first_us = (time.perf_counter() - start) * 1e6
torch.cuda.synchronize()
event("warmup", f"warm-up: F.embedding with valid ids returned after {first_us:.0f} us of host time "
      "(first launch, one-time set-up included)", first_launch_us=first_us)
event("start", f"CUDA_LAUNCH_BLOCKING={int(blocking)}; calling F.embedding(ids, weight) with "
      f"ids={ids_list} and a weight of shape {tuple(weight.shape)}", blocking=blocking)
start = time.perf_counter()
try:
    out = F.embedding(ids, weight)
except Exception as exc:
    report("F.embedding(ids, weight)", exc)
    probe_context(weight)
    sys.exit(1)
launch_us = (time.perf_counter() - start) * 1e6
event("returned", f"F.embedding returned normally after {launch_us:.0f} us of host time: out has shape "
      f"{tuple(out.shape)}, but the kernel computing it was only queued", launch_us=launch_us)
event("host", "the host keeps running Python; nothing has failed yet from its point of view")
event("sync", "calling torch.cuda.synchronize() (any call that waits for the GPU would do: .item(), .cpu())")
try:
    torch.cuda.synchronize()
    event("synced", "torch.cuda.synchronize() returned: no error")
except Exception as exc:
    report("torch.cuda.synchronize()", exc)
probe_context(weight)
event("exit", "exiting with status 1")
sys.exit(1)
"""
    return PRELUDE + textwrap.dedent(body)


# -- which operations assert, and how ------------------------------------------------------------------
ROWS, COLS = 1000, 64

#: op name -> (expression over ``w`` [ROWS, COLS] and ``idx``, size the index is checked against)
OPS = {
    "F.embedding": ("F.embedding(idx, w)", "w.shape[0]"),
    "torch.index_select": ("torch.index_select(w, 0, idx)", "w.shape[0]"),
    "torch.gather": ("torch.gather(w, 0, idx[:, None].expand(-1, w.shape[1]))", "w.shape[0]"),
    "w[idx]": ("w[idx]", "w.shape[0]"),
    "torch.take": ("torch.take(w, idx)", "w.numel()"),
}
#: the two bad values tried for every op: the placeholder, and one past the end
BAD_VALUES = ("-1", "size")


def _case_source(op: str, bad: str, num_indices: int) -> str:
    if op not in OPS:
        raise ValueError(f"op must be one of {list(OPS)}, got {op!r}")
    if bad not in BAD_VALUES:
        raise ValueError(f"bad must be one of {BAD_VALUES}, got {bad!r}")
    expr, size = OPS[op]
    return f"""
w = torch.arange({ROWS} * {COLS}, dtype=torch.float32, device=DEVICE).reshape({ROWS}, {COLS})
size = {size}
bad = -1 if {bad!r} == "-1" else size
idx = torch.arange({num_indices}, device=DEVICE) % {ROWS}
idx[1] = bad
out = {expr}
if DEVICE == "cuda":
    torch.cuda.synchronize()
# slot 1 of the result, and what it holds if the op wrapped -1 around to the last entry
got, wrapped = out[1].reshape(-1).tolist(), w.reshape(size, -1)[bad % size].tolist()
"""


def op_case_code(op: str, bad: str, num_indices: int = 3, device: str = "cuda") -> str:
    """A child program running ``op`` on ``device`` with a ``bad`` index at position 1 of ``num_indices``."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    case = _case_source(op, bad, num_indices)
    body = f"""
DEVICE = {device!r}
event("start", {f"{op} on {device}, index {bad} among {num_indices} indices"!r})
try:
{textwrap.indent(case, "    ")}
    event("result", "the call returned", outcome="returned", wrapped=got == wrapped)
except Exception as exc:
    report({op!r}, exc)
"""
    return PRELUDE + textwrap.dedent(body)


def cpu_outcome(op: str, bad: str, num_indices: int = 3) -> dict:
    """What the CPU does with the same call: an ordinary, synchronous Python exception, or a wrap-around."""
    namespace = {"torch": torch, "F": torch.nn.functional, "DEVICE": "cpu"}
    try:
        exec(_case_source(op, bad, num_indices), namespace)
    except Exception as exc:  # noqa: BLE001  (the exception *is* the result)
        return {"outcome": "raised", "type": type(exc).__name__, "message": str(exc).strip().splitlines()[0]}
    return {"outcome": "returned", "wrapped": namespace["got"] == namespace["wrapped"]}


def cuda_outcome(run: ChildRun) -> dict:
    """Summarise an :func:`op_case_code` child: which kernel asserted, with what, and what Python saw."""
    result, raised, asserts = run.first("result"), run.first("raised"), run.asserts
    summary: dict = {"returncode": run.returncode, "timed_out": run.timed_out, "assert_lines": len(asserts)}
    if asserts:
        a = asserts[0]
        summary.update(outcome="device assert", kernel=a.kernel, condition=a.condition, where=a.where)
    elif raised and "device-side assert" in raised["message"]:
        summary.update(outcome="device assert, line lost")  # the kernel asserted; its text never arrived
    elif result:
        summary.update(outcome="returned", wrapped=result["wrapped"])
    else:
        summary.update(outcome="raised" if raised else "no result")
    if raised:
        summary.update(type=raised["type"], message=raised["message"])
    return summary


def pipeline_crash_code(steps: int = 4) -> str:
    """The engine's demo on CUDA without the clamp, left to crash (no try/except: the real exit status and
    traceback)."""
    body = f"""
from torch import nn
from specfix import Fixes
from specfix.v1.engine import run_demo

seen = [0]

def after_embedding(module, args, output):
    if isinstance(module, nn.Embedding) and seen[0] < 3:
        seen[0] += 1
        event("embedding", f"nn.Embedding({{module.num_embeddings}}, {{module.embedding_dim}}) returned "
              f"normally: {{args[0].numel()}} ids in, a {{tuple(output.shape)}} output queued", call=seen[0])

nn.modules.module.register_module_forward_hook(after_embedding)
blocking = os.environ.get("CUDA_LAUNCH_BLOCKING") == "1"
event("start", f"run_demo(Fixes(clamp_placeholders=False), device='cuda', steps={steps}), "
      f"CUDA_LAUNCH_BLOCKING={{int(blocking)}}", blocking=blocking)
run_demo(Fixes(clamp_placeholders=False), device="cuda", steps={steps})
event("end", "run_demo returned without an error")
"""
    return PRELUDE + textwrap.dedent(body)


def where_python_heard(run: ChildRun) -> str:
    """The innermost frame inside specfix (else the innermost one) of the child's error."""
    frames = traceback_frames(run.output)
    if not frames:
        return "no traceback"
    ours = [f for f in frames if "/specfix/" in f["file"]] or frames
    f = ours[-1]
    return f"{Path(f['file']).name}:{f['line']} in {f['func']}: {f['source']}"


def op_table_rows(
    index_counts: tuple[int, ...] = (3, 4096), timeout: float = 180.0, progress=None
) -> list[dict]:
    """Every (op, bad index, index count) case: CUDA in its own child, the CPU in-process."""
    rows = []
    for op, bad, num_indices in itertools.product(OPS, BAD_VALUES, index_counts):
        if progress:
            progress(f"{op} bad={bad} n={num_indices}")
        run = run_until_asserts(
            op_case_code(op, bad, num_indices),
            label=f"{op} {bad} {num_indices}",
            env={"CUDA_LAUNCH_BLOCKING": "0"},
            timeout=timeout,
        )
        rows.append(
            {
                "op": op,
                "bad": bad,
                "num_indices": num_indices,
                "cpu": cpu_outcome(op, bad, num_indices),
                "cuda": dict(cuda_outcome(run), attempts=run.attempts),
                "transcript": run.transcript(max_asserts=1)[-3000:],
            }
        )
    return rows


def live_or_recorded_ops(live_rows: list[dict], recording: dict) -> tuple[list[dict], str]:
    """``live_rows`` if every asserting case left its line, else the recording's (the kernel names are what
    the table is read for), with a note."""
    lost = [
        f"{r['op']} ({r['bad']}, {r['num_indices']:,} indices)"
        for r in live_rows
        if r["cuda"].get("outcome") == "device assert, line lost"
    ]
    if not lost:
        return live_rows, ""
    return recording["rows"], (
        f"Live, {len(lost)} case(s) asserted but printed no assert line after "
        f"retries: {', '.join(lost)}. The table shows the recording instead, "
        f"{recorded.label(recording['meta'])}."
    )
