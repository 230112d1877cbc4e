"""`make gpu-check`: what only a GPU can check, run the way a user runs it, with a report of every part.

    python scripts/gpu_check.py [--only tests,chapters,solutions,bench] [--chapters 0,2,5] [--run ID]
                                [--json PATH] [--deadline-s S] [--jobs N] [--alone 5]
    python scripts/gpu_check.py --aggregate REPORT.json ... [--out specfix/recorded/gpu_check_h200.json]
    python scripts/gpu_check.py --show specfix/recorded/gpu_check_h200.json

Parts: ``tests`` (the ``cuda``-marked tests, one at a time), ``chapters`` (every chapter top to bottom at
``SPECFIX_SCALE=full`` through nbclient, as JupyterLab would run it), ``solutions`` (the chapters with
exercises again, with ``SOLUTIONS = True``, each required to report every exercise solved; at
``--solutions-scale``, ci by default, since the chapters part has already run them at full) and ``bench``
(a quick ``specfix bench --scale ci`` on the GPU). It prints a table (part, time, outcome, first error) and
writes a JSON report (commit, device, driver, versions, each part's time and outcome) to ``--json``
(default ``$OUT/gpu_check.json`` where ``$OUT`` is set, else ``build/gpu_check/``).

It runs with whichever Python runs it (one with torch, nbclient, ipykernel and pytest: the venv on a GPU
box, or ``python3`` with ``PYTHONPATH`` as README.md's GPU section says for a machine without network).
With ``--jobs N`` the parts run N at a time, each in its own process on the one GPU, except the cuda tests,
which run by themselves first, and the chapters named by ``--alone`` (chapter 5, which times the GPU),
which run by themselves after the rest; each chapter reports its slowest cells. A part not started
before ``--deadline-s`` is reported as not run, so that a report is always written within a command time
limit. A long check can be split over several invocations with
``--only`` and ``--chapters``, given the same ``--run``; ``--aggregate`` merges the reports of each run and
writes the recording (the runs in order, each green or not), and ``--show`` prints a recording's table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCHEMA = "specfix.gpu_check/1"
PARTS = ("tests", "chapters", "solutions", "bench")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
CELL_TIMEOUT_S = 600
CHECK_SOLVED = (
    "from specfix.exercises.core import summary\n_done = summary()\n"
    "assert _done and all(_done.values()), _done\nprint(len(_done), 'solved')"
)


def first_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:limit]


def run_tests(*, deadline: float) -> dict:
    """The ``cuda``-marked tests in a child pytest (only the files that have some are imported, which needs
    fewer packages); counts and the first failure from its JUnit XML."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        marked = [
            str(f.relative_to(ROOT))
            for f in sorted((ROOT / "tests").glob("test_*.py"))
            if re.search(r"pytest\.mark\.cuda[\s,\])]", f.read_text())
        ]
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-m",
            "cuda",
            "-p",
            "no:cacheprovider",
            f"--junitxml={xml}",
            *marked,
        ]
        try:
            done = subprocess.run(
                cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic())
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": "out of time: the cuda tests did not finish before the deadline"}
        if not xml.exists():
            return {
                "ok": False,
                "error": first_line(done.stderr or done.stdout) or f"pytest exited {done.returncode}",
            }
        suite = ET.parse(xml).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        error = ""
        for case in suite.iter("testcase"):
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                error = f"{case.get('name')}: {first_line(bad.get('message') or bad.text or '')}"
                break
        skipped = [
            f"{c.get('name')}: {first_line(c.find('skipped').get('message', ''))}"
            for c in suite.iter("testcase")
            if c.find("skipped") is not None
        ]
    # a skipped test is not a passed one: on a GPU, every cuda test must run (carry .peer/ for vLLM's)
    ok = done.returncode == 0 and counts["tests"] > 0
    ok = ok and not (counts["failures"] or counts["errors"] or skipped)
    if skipped and not error:
        error = f"{len(skipped)} skipped, e.g. {skipped[0]}"
    if not ok and not error:
        error = first_line((done.stdout.strip().splitlines() or [done.stderr])[-1])
    return {"ok": ok, "error": error, **counts, "skipped_tests": skipped}


def run_notebook(path: Path, solutions: bool, scale: str = "full", *, deadline: float) -> dict:
    """One chapter top to bottom in a fresh kernel at ``scale``; the first failing cell's error."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    if solutions:
        params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        params.source = params.source.replace("SOLUTIONS = False", "SOLUTIONS = True")
        nb.cells.append(nbformat.v4.new_code_cell(CHECK_SOLVED))
    timeout = int(min(CELL_TIMEOUT_S, max(1.0, deadline - time.monotonic())))
    env = {**os.environ, "SPECFIX_SCALE": scale}  # the chapter's kernel gets its own environment
    with tempfile.TemporaryDirectory() as tmp:  # the chapter's working folder: it leaves nothing behind
        client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": tmp}},
            on_cell_start=_deadline_hook(deadline),
        )
        try:
            client.execute(env=env)
            error = ""
        except (CellExecutionError, CellTimeoutError, DeadKernelError, OutOfTime) as exc:
            error = _first_error(nb) or f"{type(exc).__name__}: {first_line(exc)}"
        except Exception as exc:  # noqa: BLE001  (nbclient or the kernel's start failed, not a cell)
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            error = (
                f"{type(exc).__name__} outside the chapter's cells, at {Path(frame.filename).name}:"
                f"{frame.lineno} ({frame.line}): {first_line(exc)}"
            )
    result = {"ok": not error, "error": error, "scale": scale, "slowest_cells": _slowest_cells(nb)}
    if solutions and not error:
        result["solved"] = first_line("".join(o.get("text", "") for o in nb.cells[-1].outputs))
    return result


def _slowest_cells(nb, n: int = 3) -> list[dict]:
    """The ``n`` slowest cells (index, seconds, first line), from the timing nbclient records in each cell:
    where a chapter's time goes at full scale, to keep ``make gpu-check`` within the command limit."""
    from datetime import datetime

    spans = []
    for index, cell in enumerate(nb.cells):
        timing = cell.get("metadata", {}).get("execution", {})
        start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
        if start and end:
            seconds = (
                datetime.fromisoformat(end.replace("Z", "+00:00"))
                - datetime.fromisoformat(start.replace("Z", "+00:00"))
            ).total_seconds()
            spans.append({"cell": index, "seconds": round(seconds, 1), "source": first_line(cell.source, 80)})
    return sorted(spans, key=lambda span: -span["seconds"])[:n]


class OutOfTime(Exception):
    """The deadline passed before a cell could start."""


def _deadline_hook(deadline: float):
    def check(cell, cell_index):
        if time.monotonic() >= deadline:
            raise OutOfTime(f"the deadline passed before cell {cell.get('id')} ({cell_index}) could start")

    return check


def _first_error(nb) -> str:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"cell {cell.get('id')}: {out['ename']}: {first_line(out['evalue'])}"
    return ""


def run_bench(*, deadline: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        cmd = [
            sys.executable,
            "-m",
            "specfix",
            "bench",
            "--device",
            "cuda",
            "--scale",
            "ci",
            "--no-progress",
            "--json",
            str(path),
        ]
        try:
            done = subprocess.run(
                cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic())
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": "out of time: the bench did not finish before the deadline"}
        report = json.loads(path.read_text()) if path.exists() else {}
    errors = report.get("errors", [])
    error = (
        ""
        if done.returncode == 0
        else (
            f"{errors[0].get('case', '?')}: {first_line(errors[0].get('error', errors[0]))}"
            if errors
            else first_line(done.stderr[-2000:] or done.stdout[-2000:]) or f"exit status {done.returncode}"
        )
    )
    return {
        "ok": done.returncode == 0 and bool(report),
        "error": error,
        "results": len(report.get("results", [])),
        "errors": len(errors),
    }


def environment() -> dict:
    from specfix.tools import recorded

    meta = recorded.gpu_meta("gpu_check_h200")
    for name in ("nbclient", "ipykernel", "pytest"):
        try:
            meta[name] = __import__(name).__version__
        except ImportError:
            meta[name] = None
    return meta


def missing_requirements() -> list[str]:
    missing = []
    for name in ("torch", "nbclient", "nbformat", "ipykernel", "pytest"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def plan(parts: list[str], chapters: list[Path], solutions_scale: str = "ci") -> list[tuple]:
    """The jobs of a run, in order: (part, name, job function, its arguments)."""
    jobs = [("tests", "cuda tests", run_tests, ())] if "tests" in parts else []
    for solutions in (False, True):
        if ("solutions" if solutions else "chapters") not in parts:
            continue
        for path in chapters:
            nb = json.loads(path.read_text())
            if solutions and not any("exercise" in c["metadata"].get("tags", []) for c in nb["cells"]):
                continue
            jobs.append(
                (
                    "solutions" if solutions else "chapters",
                    path.stem,
                    run_notebook,
                    (path, solutions, "full" if not solutions else solutions_scale),
                )
            )
    if "bench" in parts:
        jobs.append(("bench", "specfix bench --scale ci", run_bench, ()))
    return jobs


def run_job(part: str, name: str, job, args: tuple, deadline: float) -> dict:
    """One job's result; a broken part is a result too, and the others still run."""
    t0 = time.monotonic()
    if t0 >= deadline:
        result = {"ok": False, "error": "not run: the deadline had passed"}
    else:
        try:
            result = job(*args, deadline=deadline)
        except Exception as exc:  # noqa: BLE001
            result = {"ok": False, "error": f"{type(exc).__name__}: {first_line(exc)}"}
    result = {"part": part, "name": name, "seconds": round(time.monotonic() - t0, 1), **result}
    print(row(result), flush=True)
    return result


def check(
    parts: list[str],
    chapters: list[Path],
    run_id: str,
    deadline_s: float,
    solutions_scale: str = "ci",
    jobs: int = 1,
    alone: frozenset[str] = frozenset(),
) -> dict:
    """Run the jobs: the cuda tests first, by themselves (they time the GPU and count its syncs); then the
    rest ``jobs`` at a time (each chapter is its own kernel process, the bench its own child process, so
    they share the GPU as several users would); chapters named in ``alone`` (those that time the GPU) run
    by themselves after the others, so that nothing else loads the GPU."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.monotonic()
    deadline = started + deadline_s  # CLOCK_MONOTONIC: one clock for this process and its threads
    os.environ.pop("SPECFIX_DEVICE", None)  # the GPU, whatever the caller's shell says
    os.environ.pop("SPECFIX_SCALE", None)  # the tests at their default; each chapter run sets its own
    report = {
        "schema": SCHEMA,
        "run": run_id,
        "meta": environment(),
        "parts": parts,
        "jobs": jobs,
        "alone": sorted(alone),
        "chapters_asked": [p.stem for p in chapters],
        "results": [],
    }
    planned = plan(parts, chapters, solutions_scale)
    first = [j for j in planned if j[0] == "tests"]  # they time the GPU and count its syncs: by themselves
    last = [j for j in planned if j[0] == "chapters" and j[1] in alone]
    shared = [j for j in planned if j not in first and j not in last]
    results = [run_job(*j, deadline=deadline) for j in first]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results += list(pool.map(lambda j: run_job(*j, deadline=deadline), shared))
    results += [run_job(*j, deadline=deadline) for j in last]
    order = {(j[0], j[1]): i for i, j in enumerate(planned)}
    report["results"] = sorted(results, key=lambda r: order[(r["part"], r["name"])])
    report["ok"] = bool(report["results"]) and all(r["ok"] for r in report["results"])
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    return report


def row(r: dict) -> str:
    outcome = "pass" if r["ok"] else "FAIL"
    return f"{r['part']:10s} {r['name']:34s} {r['seconds']:7.1f} s  {outcome:4s}  {r['error']}"


def table(report: dict) -> str:
    lines = [f"{'part':10s} {'name':34s} {'time':>9s}  {'':4s}  first error", *map(row, report["results"])]
    return "\n".join(lines)


# -- the recording: several runs, each possibly split over several invocations ---------------------------
def aggregate(reports: list[dict]) -> dict:
    """The runs of ``reports`` (grouped by ``run``, in the order first seen), each merged and judged green
    when every part passed and it covered the cuda tests, every chapter, the solutions and the bench."""
    if not reports:
        raise ValueError("no reports to aggregate")
    runs: dict[str, dict] = {}
    for rep in reports:
        if rep.get("schema") != SCHEMA:
            raise ValueError(f"not a gpu_check report: schema {rep.get('schema')!r}")
        run = runs.setdefault(rep["run"], {"run": rep["run"], "meta": rep["meta"], "results": []})
        run["results"] += rep["results"]
    commits = {r["meta"].get("commit") for r in runs.values()}
    hashes = {json.dumps(r["meta"].get("source_hash"), sort_keys=True) for r in runs.values()}
    if len(commits) > 1 or len(hashes) > 1:
        raise ValueError(f"the runs were made at different commits or sources: {sorted(map(str, commits))}")
    want = (
        {("tests", "cuda tests"), ("bench", "specfix bench --scale ci")}
        | {("chapters", p.stem) for p in NOTEBOOKS}
        | {
            ("solutions", p.stem)
            for p in NOTEBOOKS
            if any("exercise" in c["metadata"].get("tags", []) for c in json.loads(p.read_text())["cells"])
        }
    )
    for run in runs.values():
        done = {(r["part"], r["name"]) for r in run["results"]}
        run["missing"] = sorted(" ".join(k) for k in want - done)
        run["green"] = not run["missing"] and all(r["ok"] for r in run["results"])
    green = 0
    for run in runs.values():  # consecutive green runs, counted from the last one back
        green = green + 1 if run["green"] else 0
    first = next(iter(runs.values()))["meta"]
    return {
        "schema": SCHEMA,
        "meta": first,
        "runs": [{k: v for k, v in r.items() if k != "meta"} for r in runs.values()],
        "consecutive_green_runs": green,
    }


def show(recording: dict) -> str:
    from specfix.tools import recorded

    out = [recorded.label(recording["meta"])]
    for run in recording["runs"]:
        out += [
            "",
            f"run {run['run']}: {'green' if run['green'] else 'NOT green'}"
            + (f" (missing: {', '.join(run['missing'])})" if run["missing"] else ""),
            table(run),
        ]
    out += ["", f"consecutive green runs at the end: {recording['consecutive_green_runs']}"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {PARTS}")
    parser.add_argument("--chapters", default="", help="comma-separated chapter numbers (default: all)")
    parser.add_argument("--run", default=time.strftime("%Y%m%dT%H%M%S"), help="run id: same for a split run")
    parser.add_argument("--json", type=Path, help="where the report goes")
    parser.add_argument("--deadline-s", type=float, default=570.0, help="start no part after this many s")
    parser.add_argument(
        "--solutions-scale",
        choices=("ci", "full"),
        default="ci",
        help="SPECFIX_SCALE of the SOLUTIONS = True runs (the chapters part runs at full)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="jobs run at once (chapters, tests, bench: each its own process on the one GPU)",
    )
    parser.add_argument(
        "--alone",
        default="05",
        help="comma-separated chapter numbers that time the GPU: run by themselves, last",
    )
    parser.add_argument("--aggregate", nargs="+", type=Path, metavar="REPORT", help="merge reports of runs")
    parser.add_argument(
        "--out",
        type=Path,
        default=ROOT / "specfix" / "recorded" / "gpu_check_h200.json",
        help="where --aggregate writes the recording",
    )
    parser.add_argument("--show", type=Path, metavar="RECORDING", help="print a recording's tables")
    args = parser.parse_args(argv)
    if args.show:
        print(show(json.loads(args.show.read_text())))
        return 0
    if args.aggregate:
        recording = aggregate([json.loads(p.read_text()) for p in args.aggregate])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(recording, indent=1) + "\n")
        print(show(recording), f"\nwrote {args.out}", sep="\n")
        return 0
    parts = [p for p in args.only.split(",") if p]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--only takes a comma-separated list of {PARTS}, got {args.only!r}")
    wanted = {int(c) for c in args.chapters.split(",") if c.strip()} if args.chapters else None
    chapters = [p for p in NOTEBOOKS if wanted is None or int(p.name[:2]) in wanted]
    if wanted and len(chapters) != len(wanted):
        parser.error(f"--chapters: no such chapter among {[p.name[:2] for p in NOTEBOOKS]}")
    missing = missing_requirements()
    if missing:
        sys.exit(
            f"{sys.executable} lacks {', '.join(missing)}: run it with the Python that has them "
            "(make gpu-check GPU_PYTHON=...; on a machine without network, see README.md's GPU section)"
        )
    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_check.py checks the GPU: torch sees no CUDA device here")
    numbers = {c.strip().zfill(2) for c in args.alone.split(",") if c.strip()}
    alone = frozenset(p.stem for p in NOTEBOOKS if p.name[:2] in numbers)
    report = check(parts, chapters, args.run, args.deadline_s, args.solutions_scale, args.jobs, alone)
    out = args.json or (
        Path(os.environ["OUT"]) / "gpu_check.json"
        if os.environ.get("OUT")
        else ROOT / "build" / "gpu_check" / f"gpu_check-{args.run}.json"
    )
    if out.exists() and out.is_dir():
        out = out / f"gpu_check-{args.run}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    verdict = "all passed" if report["ok"] else "FAILED"
    print(f"\n{table(report)}\n\n{verdict} in {report['elapsed_s']:.0f} s; report: {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
