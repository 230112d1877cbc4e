"""The bench's report: one result row per timed call, the goals in one table (:data:`GOALS`), the schema.

JSON schema (``SCHEMA`` = "specfix.bench/1"), written by :func:`write_json`::

    {"schema": "specfix.bench/1",
     "meta": {device, driver, torch, triton, triton_mode, python, scale, date[, cuda], commit, source_hash
              [, peer: {vllm, gumbel, rejection}]},
     "config": {"device": "cpu"|"cuda", "scale": "ci"|"full", "cases": [names run]},
     "timing_note": str, "elapsed_s": float,
     "results": [{"case", "impl", "params": {str: int|float|str|bool},
                  "median_us", "p20_us", "p80_us", "n", "metrics": {str: float}}, ...],  # us per call
     "goals": [{"case", "goal", "status": "pass"|"miss"|"not measured"|"n/a", "measured": float|None,
                "target", "unit", "margin"[, "id", "issue_goal": 1..5|None, "vllm": {version: us}]}, ...],
     "unavailable": [{"case", "reason"}, ...], "errors": [{"case", "job", "error"}, ...]}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from specfix.checks import is_int
from specfix.timing import summarize
from specfix.tools import recorded

SCHEMA = "specfix.bench/1"
TIME_FIELDS = ("median_us", "p20_us", "p80_us", "n")
GOAL_STATUSES = ("pass", "miss", "not measured", "n/a")
# fmt: off
_TOP = {"schema": str, "meta": dict, "config": dict, "timing_note": str, "elapsed_s": float | int,
        "results": list, "goals": list, "unavailable": list, "errors": list}
# fmt: on


class Unavailable(Exception):
    """The code a case measures cannot run here."""


@dataclasses.dataclass(frozen=True)
class Job:
    label: str
    run: Callable[[], list[dict]]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    summary: str
    plan: Callable
    goals: Callable[[list[dict], object], list[dict]] = lambda results, settings: []


@dataclasses.dataclass(frozen=True)
class Goal:
    """One line of the goals table: ``text`` is formatted with the goal's shape and figures."""

    case: str
    target: float
    unit: str
    higher_is_better: bool
    issue_goal: int | None  # which small-batch goal: 1 host cost, 2 back to back, 3 rate, 4 steps, 5 mask
    text: str


# fmt: off
#: Every goal the bench judges: id, case, target, unit, higher is better, small-batch goal, text.
GOALS: dict[str, Goal] = {row[0]: Goal(*row[1:]) for row in [
    ("host_cost", "host", 0.6, "x", False, 1,
     "host cost per call of {fn} <= {target:g}x vLLM {peer}'s at {shape}"),
    ("back_to_back", "b2b", 1.0, "x", True, 2,
     "back-to-back per call (L2 flushed), {fn} ahead of vLLM {peer} at {shape}"),
    ("rate_bf16", "gumbel", 1000.0, "G logits/s", True, 3,
     "fast >= {target:g} G logits/s at {shape}, apply_temperature={temp}"),
    ("rate_fp32", "gumbel", 600.0, "G logits/s", True, 3, "fast >= {target:g} G logits/s at {shape}"),
    ("step_syncs", "drafter_graph", 0.0, "syncs/step", False, 4, "{fn} makes no host sync"),
    ("step_graph", "drafter_graph", 1.0, "1 = identical", True, 4,
     "{fn} captured in one CUDA graph replays the eager drafts"),
    ("mask", "gumbel_mask", 1.0, "%", False, 5,
     "masked kernel overhead <= {target:g}% of the unmasked one (median of {repeats} interleaved repeats)"),
    ("gpu_vs_peer", "gumbel", 1.0, "x", True, None, "fast >= {target:g}x vLLM {peer} at {shape}"),
    ("gpu_vs_peer_many", "gumbel", 1.5, "x", True, None, "fast >= {target:g}x vLLM {peer} at {shape}"),
    ("never_falls", "gumbel", 1.0, "x", True, None, "fast: time never falls as rows grow at {shape}"),
    ("vs_multinomial", "gumbel", 5.0, "x", True, None,
     "gumbel_sample (fast) >= {target:g}x faster than softmax + multinomial at 256 x 151,936 (worst)"),
    ("graph_one_row", "gumbel_graph", 4.0, "us", False, None,
     "one row of 248,320 in a CUDA graph <= {target:g} us GPU time per call (fast noise)"),
    ("graph_vs_peer", "gumbel_graph", 1.0, "x", False, None,
     "in a CUDA graph, fast <= {target:g}x vLLM {peer}'s time at {shape}"),
    ("clamp_syncs", "placeholder_fixes", 0.0, "syncs/step", False, None,
     "the clamp makes no host synchronisation (any token count)"),
    ("rejection_syncs", "rejection", 0.0, "syncs/step", False, None,
     "{fn} makes no host sync (any batch, k, vocab, mode)"),
    ("rejection_graph", "rejection", 1.0, "1 = identical", True, None,
     "RejectionSampler.forward captured in one CUDA graph replays the eager greedy tables (every shape)"),
    ("rejection_core", "rejection", 1.0, "x", False, None,
     "rejection core <= {target:g}x vLLM {peer}'s GPU time at {shape}"),
    ("rejection_tables", "rejection", 1.0, "1 = identical", True, None,
     "tables identical to vLLM {peer}'s, same seeds, at {shape}"),
]}
# fmt: on


def goal(
    goal_id: str, measured, settings, detail: str = "", case: str | None = None, vllm=None, **fmt
) -> dict:
    """Judge ``measured`` against :data:`GOALS` ``[goal_id]``; margins are relative to the target.
    ``vllm``: the peer's figures beside it ({version: figure}); ``fmt`` fills the goal's text."""
    spec = GOALS[goal_id]
    out = {
        "case": case or spec.case,
        "goal": spec.text.format(target=spec.target, **fmt),
        "id": goal_id,
        "issue_goal": spec.issue_goal,
        "measured": measured,
        "target": spec.target,
        "unit": spec.unit,
        "margin": detail,
    }
    if vllm:
        out["vllm"] = vllm
    if measured is None:
        out["status"] = "not measured"
    elif not settings.cuda:
        out["status"], out["margin"] = "n/a", "CPU smoke run: not judged"
    else:
        ok = measured >= spec.target if spec.higher_is_better else measured <= spec.target
        if spec.target == 0:  # no relative margin: the excess, in the unit
            margin = f"{measured:+g} {spec.unit}"
        else:
            rel = measured / spec.target - 1 if spec.higher_is_better else 1 - measured / spec.target
            margin = f"{rel:+.1%}"
        out["status"] = "pass" if ok else "miss"
        out["margin"] = f"{margin} vs target" + (f"; {detail}" if detail else "")
    return out


def result(case: str, impl: str, params: dict, samples_us: list[float], **metrics: float) -> dict:
    return {
        "case": case,
        "impl": impl,
        "params": params,
        **summarize(samples_us),
        "metrics": {k: float(v) for k, v in metrics.items() if v is not None},
    }


def find(results, case, impl=None, **params) -> list[dict]:
    return [
        r
        for r in results
        if r["case"] == case
        and (impl is None or r["impl"] == impl)
        and all(r["params"].get(k) == v for k, v in params.items())
    ]


def worst(rows: list[dict], metric: str, pick=max) -> tuple[float | None, dict | None]:
    """The worst ``metric`` of the rows that carry it (``pick``: max for a count, min for a 1/0 check), and
    its row; (None, None) when no row carries it."""
    row = pick((r for r in rows if metric in r["metrics"]), key=lambda r: r["metrics"][metric], default=None)
    return (None if row is None else row["metrics"][metric]), row


def shape_label(p: dict) -> str:
    return f"{p['rows']:,} x {p['vocab']:,} {p['dtype']}"


def validate(report: dict) -> None:
    """Raise ValueError if ``report`` does not follow the schema in the module docstring."""
    for key, kind in _TOP.items():
        if not isinstance(report.get(key), kind):
            raise ValueError(f"report[{key!r}] missing or not {kind}")
    if report["schema"] != SCHEMA:
        raise ValueError(f"schema {report['schema']!r} is not {SCHEMA!r}")
    missing = [k for k in ("device", "driver", "torch", "triton", "date") if k not in report["meta"]]
    if missing:
        raise ValueError(f"meta lacks {missing[0]!r}")
    for r in report["results"]:
        known = r.get("case") in report["config"].get("cases", ())
        if not (known and isinstance(r.get("impl"), str) and isinstance(r.get("params"), dict)):
            raise ValueError(f"bad result {r}")
        if not all(isinstance(r.get(k), float | int) for k in TIME_FIELDS) or not (
            r["p20_us"] <= r["median_us"] <= r["p80_us"]
        ):
            raise ValueError(f"bad timing fields in {r}")
        if not isinstance(r.get("metrics"), dict):
            raise ValueError(f"result without metrics: {r}")
    for g in report["goals"]:
        if g.get("status") not in GOAL_STATUSES or not {"case", "goal", "target", "unit", "margin"} <= set(g):
            raise ValueError(f"bad goal {g}")


def write_json(report: dict, path: str | Path) -> Path:
    """Write ``report`` to ``path``, then validate it: a long GPU run is never lost to a schema slip."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    validate(report)
    return path


def frame(report: dict, case: str):
    """One case's results as a DataFrame: impl, one column per param, the times, one column per metric."""
    import pandas as pd

    rows = find(report["results"], case)
    return pd.DataFrame(
        [{"impl": r["impl"], **r["params"], **{k: r[k] for k in TIME_FIELDS}, **r["metrics"]} for r in rows]
    )


def _goal_line(g: dict) -> str:
    measured = "-" if g["measured"] is None else f"{g['measured']:,.3g} {g['unit']}"
    beside = "".join(f"; vLLM {v}: {x:,.3g}" for v, x in g.get("vllm", {}).items())
    margin = f"  {g['margin']}" if g["margin"] else ""
    target = f"target {g['target']:g} {g['unit']}{beside}"
    return f"[{g['status'].upper():>12}] {g['goal']}: {measured} ({target}){margin}"


def render(report: dict) -> str:
    """The end-of-run text: label, timing note, results table, goals (the five small-batch goals first),
    what was not available, errors."""
    import pandas as pd

    lines = [recorded.label(report["meta"]), report["timing_note"], ""]
    rows = [
        {
            **{k: r[k] for k in ("case", "impl")},
            "params": ", ".join(f"{k}={v:,}" if is_int(v) else f"{k}={v}" for k, v in r["params"].items()),
            **{k: r[k] for k in TIME_FIELDS},
            "metrics": ", ".join(f"{k}={v:.3g}" for k, v in r["metrics"].items()),
        }
        for r in report["results"]
    ]
    table = pd.DataFrame(rows).to_string(index=False, float_format="{:,.2f}".format)
    lines.append(table if rows else "(no results)")
    ordered = sorted(report["goals"], key=lambda g: g.get("issue_goal") or 99)
    lines += ["", "Goals (1-5: the small-batch goals, beside vLLM):"] + [_goal_line(g) for g in ordered]
    lines += [f"[NOT AVAILABLE] {u['case']}: {u['reason']}" for u in report["unavailable"]]
    lines += [f"[ERROR] {e['case']} / {e['job']}: {e['error']}" for e in report["errors"]]
    lines.append(f"elapsed {report['elapsed_s']:.1f} s")
    return "\n".join(lines)
