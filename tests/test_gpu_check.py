"""`make gpu-check`'s script, on the CPU: its report of a failing cell, its refusal without a GPU, and the
recording it makes of several runs (each possibly split over several invocations)."""

import importlib.util

import nbformat
import pytest
import torch

from specfix.tools import recorded

spec = importlib.util.spec_from_file_location("gpu_check", recorded.ROOT / "scripts" / "gpu_check.py")
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)


def _report(run, results, commit="abc"):
    return {
        "schema": gc.SCHEMA,
        "run": run,
        "results": results,
        "meta": {"device": "NVIDIA H200", "commit": commit, "source_hash": {"scripts/gpu_check.py": "1"}},
    }


def _result(part, name, ok=True, error=""):
    return {"part": part, "name": name, "seconds": 1.0, "ok": ok, "error": error}


def _whole_run(run, failing=None):
    """A run split as the lead splits it: the tests and the bench, then the chapters, then the solutions."""
    every = (
        [("tests", "cuda tests"), ("bench", "specfix bench --scale ci")]
        + [("chapters", p.stem) for p in gc.NOTEBOOKS]
        + [("solutions", p.stem) for p in gc.NOTEBOOKS if not p.name.startswith("00")]
    )
    results = [
        _result(part, name, ok=(part, name) != failing, error="boom" * ((part, name) == failing))
        for part, name in every
    ]
    return [_report(run, results[:2]), _report(run, results[2:8]), _report(run, results[8:])]


def test_three_consecutive_green_runs_are_counted_and_a_failure_or_a_gap_breaks_the_count():
    rec = gc.aggregate(_whole_run("1") + _whole_run("2") + _whole_run("3"))
    assert [r["green"] for r in rec["runs"]] == [True] * 3 and rec["consecutive_green_runs"] == 3
    assert rec["meta"]["commit"] == "abc"
    failed = gc.aggregate(
        _whole_run("1") + _whole_run("2", failing=("chapters", gc.NOTEBOOKS[2].stem)) + _whole_run("3")
    )
    assert [r["green"] for r in failed["runs"]] == [True, False, True]
    assert failed["consecutive_green_runs"] == 1
    gap = gc.aggregate(_whole_run("1")[:2])
    assert not gap["runs"][0]["green"] and "solutions 05_performance" in gap["runs"][0]["missing"]
    shown = gc.show(failed)
    assert "run 2: NOT green" in shown and "boom" in shown and recorded.label(failed["meta"]) in shown
    with pytest.raises(ValueError, match="different commits"):
        gc.aggregate(_whole_run("1") + [_report("2", [], commit="def")])
    with pytest.raises(ValueError, match="schema"):
        gc.aggregate([{"schema": "other"}])


def test_a_failing_cell_is_reported_with_its_id_and_error(tmp_path):
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("SOLUTIONS = False", metadata={"tags": ["parameters"]}),
            nbformat.v4.new_code_cell("x = 1", id="fine"),
            nbformat.v4.new_code_cell("1 / 0", id="bad"),
        ]
    )
    path = tmp_path / "07_toy.ipynb"
    nbformat.write(nb, path)
    got = gc.run_notebook(path, solutions=False, deadline=float("inf"))
    slowest = got.pop("slowest_cells")
    assert got == {"ok": False, "error": "cell bad: ZeroDivisionError: division by zero", "scale": "full"}
    assert {c["cell"] for c in slowest} == {0, 1, 2} and all(c["seconds"] >= 0 for c in slowest)
    assert {c["source"] for c in slowest} == {"SOLUTIONS = False", "x = 1", "1 / 0"}
    # with SOLUTIONS = True the chapter must report every exercise solved: a chapter that solved none fails
    del nb.cells[-1]
    nbformat.write(nb, path)
    assert gc.run_notebook(path, solutions=False, deadline=float("inf"), scale="ci")["ok"]
    got = gc.run_notebook(path, solutions=True, deadline=float("inf"), scale="ci")
    assert not got["ok"] and "AssertionError" in got["error"]


def test_without_a_gpu_it_refuses_and_says_why(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a machine without one
    with pytest.raises(SystemExit, match="no CUDA device"):
        gc.main(["--only", "tests"])
    with pytest.raises(SystemExit):
        gc.main(["--only", "tests,lint"])
    assert "--only takes" in capsys.readouterr().err


def test_a_chapter_stops_at_the_deadline_and_says_so(tmp_path):
    path = tmp_path / "08_toy.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1", id="first")]), path)
    got = gc.run_notebook(path, solutions=False, deadline=0.0)
    assert not got["ok"] and got["error"].startswith("OutOfTime: the deadline passed before cell first")


def test_jobs_share_the_gpu_but_a_chapter_that_times_it_runs_alone_after_them(monkeypatch):
    import threading
    import time

    spans, lock = {}, threading.Lock()

    def fake(name):
        def job(*args, deadline):
            t0 = time.monotonic()
            time.sleep(0.2)
            with lock:
                spans[name(args)] = (t0, time.monotonic())
            return {"ok": True, "error": ""}

        return job

    monkeypatch.setattr(gc, "environment", lambda: {"device": "fake"})
    monkeypatch.setattr(gc, "run_tests", fake(lambda a: "tests"))
    monkeypatch.setattr(gc, "run_bench", fake(lambda a: "bench"))
    monkeypatch.setattr(gc, "run_notebook", fake(lambda a: f"{a[0].stem}:{a[1]}"))
    timed = gc.NOTEBOOKS[-1].stem
    report = gc.check(
        ["tests", "chapters", "bench"], gc.NOTEBOOKS, "r", 60.0, jobs=8, alone=frozenset({timed})
    )
    assert report["ok"] and [r["name"] for r in report["results"]] == [
        "cuda tests",
        *[p.stem for p in gc.NOTEBOOKS],
        "specfix bench --scale ci",
    ]
    others = {k: v for k, v in spans.items() if k not in (f"{timed}:False", "tests")}
    assert max(start for start, _ in others.values()) < min(end for _, end in others.values())  # overlapped
    assert spans["tests"][1] <= min(start for start, _ in others.values())  # the tests first, alone
    assert spans[f"{timed}:False"][0] >= max(end for _, end in others.values())  # and the timed one alone
