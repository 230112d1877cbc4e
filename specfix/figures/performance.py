"""Chapter 5's tables, paragraphs and figures, all read from one ``specfix bench`` report (live, or the H200
recording ``specfix/recorded/bench_h200.json``).

Read :func:`load_report` first, then the tables, which the paragraphs and figures read. Chapter 2 imports
:func:`fix_costs`, so both chapters show the same placeholder-fix costs. The host-side recording lives in
:mod:`specfix.figures.host_trace`, the ncu profile and launch sweep in :mod:`specfix.figures.kernel_profile`.
"""

from __future__ import annotations

import itertools
import math
import re
import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from specfix.figures import style
from specfix.lab.placeholder_fixes import FIXES, LABELS
from specfix.tools import bench, recorded

#: Bytes per logit of each dtype the bench measures.
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
_MARKERS = {"fp32": "o-", "bf16": "s--"}

# --------------------------------------------------------------------------------------------- tables


def load_report(live: bool, scale: str) -> tuple[dict, str]:
    """The report chapter 5 plots and the line that says where it comes from: a live run on this GPU when
    ``live``, else the H200 recording (or, if none ships, a CPU smoke run whose timings mean nothing)."""
    if live:
        report = bench.run("cuda", scale)
        return report, "MEASURED LIVE on this machine, " + recorded.label(report["meta"])
    try:
        report = recorded.load("bench_h200")
        return report, "RECORDED ON THE H200, not on this machine: " + recorded.label(report["meta"])
    except FileNotFoundError:
        report = bench.run("cpu", "ci", progress=False)
        return report, (
            "NO H200 RECORDING SHIPPED: a CPU SMOKE RUN through Triton's interpreter, whose "
            "timings mean NOTHING about GPU speed"
        )


def fix_costs(report: dict | None = None) -> pd.DataFrame:
    """One row per (fix, tokens): the bench's ``placeholder_fixes`` case (default: the H200 recording) under
    the chapters' labels, with host syncs and host time behind a busy GPU where it ran on a GPU."""
    report = recorded.load("bench_h200") if report is None else report
    df = bench.frame(report, "placeholder_fixes")
    if df.empty:
        return pd.DataFrame(columns=["fix", "label", "num_tokens", "median_us", "p20_us", "p80_us"])
    unknown = sorted(set(df["impl"]) - set(FIXES))
    if unknown:
        raise ValueError(f"report names fixes {unknown} that specfix.lab.placeholder_fixes does not know")
    df = df.rename(columns={"impl": "fix"})
    df.insert(1, "label", df["fix"].map(LABELS))
    df["order"] = df["fix"].map(FIXES.index)
    keep = ["fix", "label", "num_tokens", "median_us", "p20_us", "p80_us"]
    keep += [c for c in ("host_syncs_per_step", "host_us_behind_busy_gpu") if c in df]
    return df.sort_values(["order", "num_tokens"])[keep].reset_index(drop=True)


def ceilings(report: dict) -> dict[str, float]:
    """The run's ceilings in TB/s: ``copy`` (read + write) and ``read`` (an fp32 argmax); NaN if absent."""
    df = bench.frame(report, "ceilings")
    pick = lambda impl: float(df.loc[df["impl"] == impl, "TB_per_s"].max()) if len(df) else math.nan
    return {"copy": pick("copy"), "read": pick("argmax_read")}


def floor_us(rows: int, vocab: int, dtype: str, read_tb_per_s: float) -> float:
    """The time a sampler that only reads its logits would take: bytes over the read ceiling, in us."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if not read_tb_per_s > 0:
        raise ValueError(f"read_tb_per_s must be a positive bandwidth, got {read_tb_per_s!r}")
    return rows * vocab * DTYPE_BYTES[dtype] / (read_tb_per_s * 1e6)


def _floors(df: pd.DataFrame, report: dict) -> list[float]:
    read = ceilings(report)["read"]
    return [floor_us(r, v, d, read) for r, v, d in zip(df["rows"], df["vocab"], df["dtype"], strict=True)]


def floor_table(report: dict) -> pd.DataFrame:
    """specfix's samplers at every measured shape: median, floor, and the fraction of the read ceiling."""
    g = bench.frame(report, "gumbel")
    if g.empty:
        return g
    g = g[g["impl"].isin(list(bench.OURS))].copy()
    g["floor_us"] = _floors(g, report)
    g["of_read_ceiling"] = g["TB_per_s_read"] / ceilings(report)["read"]
    cols = ["impl", "dtype", "vocab", "rows", "median_us", "floor_us", "G_logits_per_s", "of_read_ceiling"]
    return g[cols].reset_index(drop=True)


def goal(report: dict, case: str, unit: str) -> dict | None:
    """The report's goal for ``case`` measured in ``unit`` (None when the report judged none)."""
    return next((g for g in report["goals"] if g["case"] == case and g["unit"] == unit), None)


def mask_overhead(report: dict) -> pd.DataFrame:
    """Masked against unmasked kernel, one row per variant: both medians and p20-p80 spreads, the median
    per-call ratio - 1 (``overhead``), and whether the two spreads overlap."""
    gm = bench.frame(report, "gumbel_mask")
    if gm.empty:
        return gm
    times = {"median_us": "us", "p20_us": "p20", "p80_us": "p80"}
    part = lambda impl: gm[gm["impl"] == impl].set_index("store_processed_logits")
    masked, plain = part("masked"), part("unmasked")
    out = masked[list(times)].rename(columns=times).add_prefix("masked_")
    out = out.join(plain[list(times)].rename(columns=times).add_prefix("unmasked_")).join(masked["overhead"])
    out["spreads_overlap"] = (out.masked_p20 <= out.unmasked_p80) & (out.unmasked_p20 <= out.masked_p80)
    return out.reset_index()


def padding_price(report: dict) -> pd.DataFrame:
    """The drafter step per live batch: rows the graph replays, how many are padding, and the speedup of
    the replay over eager launches, per draft model."""
    cols = ["model", "live_batch", "padded_batch", "padded_rows", "padded_fraction", "speedup"]
    dg = bench.frame(report, "drafter_graph")
    if dg.empty or "speedup" not in dg:
        return pd.DataFrame(columns=cols)
    g = dg[dg["impl"] == "graph"].copy()
    g["padded_rows"] = g["padded_batch"] - g["live_batch"]
    g["padded_fraction"] = g["padded_rows"] / g["padded_batch"]
    return g[cols].sort_values(["model", "live_batch"]).reset_index(drop=True)


def peer_versions(report: dict) -> list[str]:
    """The vLLM versions whose Gumbel sampler the report timed beside specfix's, oldest first."""
    impls = bench.frame(report, "gumbel").get("impl", [])
    found = {impl.removeprefix("vllm_") for impl in impls if impl.startswith("vllm_")}
    return sorted(found, key=lambda v: tuple(int(p) for p in v.split(".")))


def peer_table(report: dict) -> pd.DataFrame:
    """Per shape (dtype, vocab, rows): the judged kernel's median, each vLLM version's, the floor at the read
    ceiling, and the speedup over each version (vLLM time / specfix time). Empty without a vLLM peer."""
    g, versions = bench.frame(report, "gumbel"), peer_versions(report)
    if not versions:
        return pd.DataFrame(columns=["dtype", "vocab", "rows", bench.JUDGED, "floor_us"])
    wide = g.pivot_table(index=["dtype", "vocab", "rows"], columns="impl", values="median_us").reset_index()
    wide["floor_us"] = _floors(wide, report)
    cols = ["dtype", "vocab", "rows", bench.JUDGED] + [bench.peer_impl(v) for v in versions] + ["floor_us"]
    for v in versions:
        wide[f"speedup_vs_{v}"] = wide[bench.peer_impl(v)] / wide[bench.JUDGED]
        cols.append(f"speedup_vs_{v}")
    return wide[cols].sort_values(["dtype", "vocab", "rows"]).reset_index(drop=True)


#: A goal's shape, cut from its text to name its family; a rejection goal keeps its mode.
_GOAL_SHAPE = (
    r" at (?:(?:[\d,]+ x )?[\d,]+(?: (?:fp32|bf16))?|B=\d+, k=\d+, V=[\d,]+, (?P<mode>\w+))"
    r"(?P<rest>.*)$"
)


def _margin_pct(g: dict) -> float:
    margin = re.match(r"([+-][\d.]+)%", g["margin"])
    return float(margin.group(1)) if margin else math.nan


def goal_families(report: dict) -> pd.DataFrame:
    """The report's goals grouped by what they demand, the shape cut out: per family the number of goals,
    passes and misses, and the worst margin (% of the target, below zero a miss) with its goal."""
    columns = ["family", "case", "goals", "passed", "missed", "worst_margin_pct", "worst_goal"]
    if not report["goals"]:
        return pd.DataFrame(columns=columns)
    family = lambda g: re.sub(_GOAL_SHAPE, lambda m: f" ({m['mode']})" if m["mode"] else m["rest"], g["goal"])
    df = pd.DataFrame(
        {
            "family": [family(g).replace(", (", " (") for g in report["goals"]],
            "case": [g["case"] for g in report["goals"]],
            "status": [g["status"] for g in report["goals"]],
            "goal": [g["goal"] for g in report["goals"]],
            "margin_pct": [_margin_pct(g) for g in report["goals"]],
        }
    )
    worst = df.sort_values("margin_pct", kind="stable").groupby("family", sort=False).first()
    out = df.groupby("family", sort=False).agg(
        case=("case", "first"),
        goals=("goal", "size"),
        passed=("status", lambda s: int((s == "pass").sum())),
        missed=("status", lambda s: int((s == "miss").sum())),
    )
    out["worst_margin_pct"], out["worst_goal"] = worst["margin_pct"], worst["goal"]
    return out.reset_index()[columns]


#: The five small-batch goals, by their ``issue_goal`` number in the report.
SMALL_BATCH = {
    1: "host cost per call",
    2: "back to back per call",
    3: "logits per second",
    4: "drafting step: no host sync, one graph replays eager",
    5: "mask overhead",
}


def _judged(report: dict, number: int) -> list[dict]:
    return [g for g in report["goals"] if g.get("issue_goal") == number and g["status"] in ("pass", "miss")]


def _figures(g: dict) -> tuple[str, str]:
    """A judged goal's figure against its target, and vLLM's figures beside it (in us where the goal is a
    ratio of times, else in the goal's unit)."""
    unit = "x" if g["unit"] == "x" else f" {g['unit']}"
    beside_unit = "us" if g["unit"] == "x" else g["unit"]
    beside = "; ".join(f"{v}: {x:,.3g} {beside_unit}" for v, x in g.get("vllm", {}).items())
    return f"{g['measured']:,.3g}{unit} (target {g['target']:g}{unit})", beside or "-"


def small_batch_goals(report: dict) -> pd.DataFrame:
    """One row per small-batch goal: met or missed (met only if every shape judged passes), how many
    shapes pass, and the worst shape's goal, figure, vLLM's figures and margin as the report states them."""
    rows = []
    for number, demand in SMALL_BATCH.items():
        goals = _judged(report, number)
        met = sum(g["status"] == "pass" for g in goals)
        row = {
            "goal": number,
            "demands": demand,
            "status": "not measured",
            "shapes met": f"{met} of {len(goals)}",
        }
        if goals:
            worst = min(goals, key=lambda g: (g["status"] == "pass", _margin_pct(g)))
            measured, beside = _figures(worst)
            status = "met" if met == len(goals) else "missed"
            row |= {"status": status, "worst": worst["goal"], "measured": measured, "vLLM": beside}
            row["margin"] = worst["margin"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("goal")


def rejection_table(report: dict) -> pd.DataFrame:
    """The rejection sampler's median us per step at the figure's shape (smallest k and vocabulary): one row
    per (mode, batch), one column per sampler, "-" where a sampler was not timed."""
    rj, shape = _smallest_rejection_shape(report)
    if rj.empty:
        return pd.DataFrame()
    table = rj.pivot_table(index=["mode", "batch"], columns="impl", values="median_us")
    table = table.rename(columns=lambda c: c.replace("_", " ")).rename_axis(columns=None)
    table = table.map(lambda us: "-" if pd.isna(us) else f"{us:,.1f}")
    table.attrs["shape"] = ", ".join(f"{c} = {v:,}" for c, v in shape.items())
    return table


def _smallest_rejection_shape(report: dict) -> tuple[pd.DataFrame, dict]:
    rj = bench.frame(report, "rejection")
    shape = {c: rj[c].min() for c in ("k", "vocab") if c in rj}
    for column, value in shape.items():
        rj = rj[rj[column] == value]
    return rj, shape


# fmt: off
#: The course in one table: per fix switch, the chapters that teach it, its vLLM PR, what breaks without it.
COURSE = (
    ("clamp_placeholders", "1, 2", "#47029",
     "a -1 reaches F.embedding: a device-side assert on the GPU, and every later CUDA call fails"),
    ("reject_negative_drafts", "1", "#46533",
     "the random rejection kernel reads a -1 draft's probability out of bounds and may accept it"),
    ("pad_idx_mapping", "3", "#47066",
     "padded rows of a graph replay keep stale idx_mapping entries and overwrite live draft logits"),
    ("dflash_pad_idx", "3", "#47066",
     "DFlash's padded sample slots point at request 0 and overwrite its draft logits"),
    ("mask_invalid_reqs", "3, 4", "#47066",
     "gumbel_block_argmax reads temperature[-1] and seed[-1] and writes a padded row's logits"),
)
# fmt: on


def course_table(report: dict) -> pd.DataFrame:
    """Every fix of the course: where it is taught, its PR, what breaks without it, and what ``report``
    measured it to cost (where the bench times it on its own)."""
    costs = {}
    clamp = fix_costs(report).query("fix == 'clamp'")
    if len(clamp):
        syncs = (
            f"; {clamp['host_syncs_per_step'].max():g} host syncs" if "host_syncs_per_step" in clamp else ""
        )
        low, high = clamp["median_us"].min(), clamp["median_us"].max()
        costs["clamp_placeholders"] = f"{low:.0f}-{high:.0f} us a step, launch included{syncs}"
    mo = mask_overhead(report)
    if len(mo):
        costs["mask_invalid_reqs"] = f"{mo['overhead'].max():+.1%} kernel time at most ({len(mo)} variants)"
    rows = [
        {"switch": name, "chapters": chapters, "vLLM PR": pr, "without it": breaks}
        | {"cost measured here": costs.get(name, "not timed on its own")}
        for name, chapters, pr, breaks in COURSE
    ]
    return pd.DataFrame(rows).set_index("switch")


# --------------------------------------------------------------------------------------------- paragraphs


def floor_text(report: dict) -> str:
    """The judged kernel at 256 x 151,936 fp32 against its floor, and what that floor means for a serving
    engine; empty when the report has not that shape."""
    floors = floor_table(report)
    if floors.empty:
        return ""
    shape = floors.query("impl == @bench.JUDGED and rows == 256 and vocab == 151_936 and dtype == 'fp32'")
    if not len(shape):
        return ""
    s = shape.iloc[0]
    return (
        f"At 256 x 151,936 fp32 the floor is **{s.floor_us:.1f} us**; `{bench.JUDGED}` takes "
        f"**{s.median_us:.1f} us**, {s.median_us / s.floor_us:.1f} times its floor "
        f"({s.of_read_ceiling:.0%} of the read ceiling).\n\n"
        f"**What it means for a serving engine.** The sampler runs after every forward pass, and with "
        f"speculative decoding on k + 1 rows per sequence. At 151,936 logits a row, 256 rows are "
        f"{256 * 151_936 * 4 / 1e6:.0f} MB of fp32 logits, a floor of {s.floor_us:.0f} us: small next to "
        f"a large model's forward pass, but not next to a small drafter's, and paid every step. The fast "
        f"kernel takes {s.median_us / s.floor_us:.1f} times its floor; the rest is the time it spends "
        "making the Gumbel noise (a hash and two logarithms per logit), which is why that noise has to "
        "be cheap to make. bf16 logits halve the bytes, so the same kernel shows fewer TB/s while "
        "consuming more logits per second."
    )


def mask_text(report: dict) -> str:
    """The mask's goal, its verdict on the largest overhead, and each variant's times with their spreads."""
    mask, mask_goal = mask_overhead(report), goal(report, "gumbel_mask", "%")
    if not len(mask) or not mask_goal:
        return ""
    lines = [
        f"- {'with the processed-logits store' if r.store_processed_logits else 'sampling only'}: "
        f"masked {r.masked_us:.1f} us (p20-p80 {r.masked_p20:.1f}-{r.masked_p80:.1f}), unmasked "
        f"{r.unmasked_us:.1f} us ({r.unmasked_p20:.1f}-{r.unmasked_p80:.1f}): overhead {r.overhead:+.1%}; "
        f"the spreads {'overlap' if r.spreads_overlap else 'do not overlap'}"
        for r in mask.itertuples()
    ]
    return (
        f"Goal: *{mask_goal['goal']}*. It judges the largest overhead, {mask_goal['measured']:+.2f}%: "
        f"**{mask_goal['status']}**.\n\n" + "\n".join(lines)
    )


def padding_price_text(report: dict) -> str:
    """The replay's speedup over the live batches, and at the batch with the most padding."""
    price = padding_price(report)
    if not len(price):
        return ""
    worst = price.loc[price["padded_fraction"].idxmax()]
    same = price[price.live_batch == worst.live_batch]
    there = ", ".join(f"{r.speedup:.1f}x ({r.model})" for r in same.itertuples())
    return (
        f"From live batch {price.live_batch.min()} to {price.live_batch.max()} the replay is "
        f"{price.speedup.min():.1f} to {price.speedup.max():.1f} times faster than eager launches. "
        f"The worst padding is at a live batch of {worst.live_batch}: {worst.padded_rows} of the "
        f"{worst.padded_batch} replayed rows ({worst.padded_fraction:.0%}) are padding, and the "
        f"replay there is still {there} faster."
    )


def rejection_graph_text(report: dict) -> str:
    """The verification step replayed from one CUDA graph: the goal, its fixed cost, replay against eager."""
    rj = bench.frame(report, "rejection")
    captured = goal(report, "rejection", "1 = identical")
    if rj.empty or "specfix_triton_graph" not in set(rj["impl"]) or not captured:
        return "This report has no captured verification step (the bench captures it on a GPU only)."
    steps = rj[rj.impl.isin(["specfix_triton", "specfix_triton_graph"])].pivot_table(
        index=["mode", "k", "vocab", "batch"], columns="impl", values="median_us"
    )
    replay = steps["specfix_triton_graph"]
    ratio = (replay / steps["specfix_triton"]).groupby("mode").median()
    (k_lo, v_lo), *_, (k_hi, v_hi) = sorted({key[1:3] for key in replay.index})

    def say(k, v):  # at 1 and 16 requests, or the fewest and the most this report has (a smaller run)
        parts = []
        for m in ("greedy", "random"):
            by_batch = replay.loc[(m, k, v)].sort_index()
            lo = 1 if 1 in by_batch.index else by_batch.index[0]
            hi = 16 if 16 in by_batch.index else by_batch.index[-1]
            req = "request" if lo == 1 else "requests"
            parts.append(f"{by_batch[lo]:.0f} us at {lo} {req} and {by_batch[hi]:.0f} at {hi} ({m})")
        return ", ".join(parts)

    return (
        f"Goal: *{captured['goal']}*: **{captured['status']}** ({captured['margin'].split('; ')[-1]}). "
        f"Replayed, the step takes {say(k_lo, v_lo)} at k = {k_lo} and {v_lo:,} logits: a fixed cost per "
        f"call. With more to read per request (k = {k_hi}, {v_hi:,} logits) it grows with the batch: "
        f"{say(k_hi, v_hi)}. In the median shape a replay takes {ratio['greedy']:.2f} times the eager "
        f"step's time (greedy) and {ratio['random']:.2f} times (random); where the eager step took much "
        "longer, its events counted a wait for the host (the figure above)."
    )


def core_text(report: dict) -> str:
    """The rejection core's GPU time over the goal's vLLM version's, per mode, over the shapes timed."""
    core = bench.frame(report, "rejection").query("impl == 'specfix_core'")
    key = bench.speedup_key(bench.GOAL_PEER)
    if key not in core:
        return ""
    ratio = (1 / core[key]).groupby(core["mode"]).agg(["min", "max"])
    per_mode = "; ".join(f"{mode} {lo:.2f} to {hi:.2f} times" for mode, (lo, hi) in ratio.iterrows())
    return (
        f"The rejection core's GPU time over vLLM {bench.GOAL_PEER}'s, over "
        f"{core.groupby('mode').size().iloc[0]} shapes per mode (batch, k, vocab): {per_mode}."
    )


def peer_text(report: dict) -> str:
    """Per vLLM version: the judged kernel's speedup per call, least and most, and the shapes where."""
    peers, lines = peer_table(report), []
    for v in peer_versions(report):
        x = peers[f"speedup_vs_{v}"]
        low, high = peers.loc[x.idxmin()], peers.loc[x.idxmax()]
        lines.append(
            f"- beside vLLM {v}: {x.min():.2f} to {x.max():.2f} times faster per call over all "
            f"{len(x)} shapes, least at {low.rows:,} x {low.vocab:,} {low['dtype']}, most at "
            f"{high.rows:,} x {high.vocab:,} {high['dtype']}"
        )
    if not lines:
        return "This report has no vLLM sampler beside specfix's (run the bench with `--peer`)."
    return f"`{bench.JUDGED}`, per call, GPU time:\n\n" + "\n".join(lines)


def missed_goals_text(report: dict) -> str:
    """Each goal family with a miss: how many miss, and the worst goal by how much."""
    families = goal_families(report)
    lines = [
        f"- *{f.family}*: {f.missed} of {f.goals} miss; the worst, *{f.worst_goal}*, by "
        f"{-f.worst_margin_pct:.1f}%"
        for f in families[families["missed"] > 0].itertuples()
    ]
    return "\n".join(lines) or "Every goal passes."


def small_batch_text(report: dict) -> str:
    """The goals met and missed, then each goal's worst shape in the report's own words."""
    table = small_batch_goals(report)
    say = lambda status: ", ".join(str(n) for n in table.index[table["status"] == status]) or "none"
    lines = [f"Met: goals {say('met')}. Missed: goals {say('missed')}."]
    for number, r in table[table["status"] != "not measured"].iterrows():
        which = "the worst shape" if r.status == "met" else "the worst miss"
        lines.append(
            f"- **{number}, {r.demands}: {r.status}**, {r['shapes met']} shapes; {which}: *{r.worst}*: "
            f"{r.measured}, {r.margin}" + ("." if r.vLLM == "-" else f"; vLLM beside it: {r.vLLM}.")
        )
    return "\n".join(lines)


def host_text(report: dict) -> str:
    """The judged kernel's host cost per call beside the goal's vLLM version, and the validation's share."""
    host, peer = bench.frame(report, "gumbel_host"), bench.peer_impl(bench.GOAL_PEER)
    if host.empty:
        return ""
    wide = host.pivot_table(index=["rows", "vocab"], columns="impl", values="median_us")
    if peer not in wide:
        return ""
    gap, times = wide[bench.JUDGED] - wide[peer], wide[bench.JUDGED] / wide[peer]
    text = (
        f"A call of `{bench.JUDGED}` costs the host {gap.min():+.1f} to {gap.max():+.1f} us beside vLLM "
        f"{bench.GOAL_PEER}'s ({times.min():.2f} to {times.max():.2f} times)."
    )
    if "specfix_validation_only" not in wide:  # reports made before the bench stopped timing it apart
        return text
    valid = wide["specfix_validation_only"]
    without = (wide[bench.JUDGED] - valid) / wide[peer]
    return (
        f"{text} Validating the arguments alone takes {valid.min():.1f} to {valid.max():.1f} us of it; "
        f"without it a call would cost the host {without.min():.2f} to {without.max():.2f} times vLLM's."
    )


def speedup_caption(report: dict) -> str:
    """How the median speedup over the shapes changes from the fewest rows to the most, per torch sampler."""
    g = bench.frame(report, "gumbel")
    if g.empty:
        return "No throughput case in this report."
    wide = g.pivot_table(index=["dtype", "vocab", "rows"], columns="impl", values="median_us").reset_index()
    parts = []
    for ref, name in (
        ("torch_softmax_multinomial", "softmax + multinomial"),
        ("torch_gumbel_max", "torch's Gumbel-max"),
    ):
        if ref not in wide:
            continue
        median = (wide[ref] / wide[bench.JUDGED]).groupby(wide["rows"]).median()
        lo, hi = median.index.min(), median.index.max()
        trend = (
            "grows" if median[hi] > median[lo] * 1.1 else "falls" if median[hi] < median[lo] / 1.1 else None
        )
        parts.append(
            f"against {name} the median speedup {trend or 'stays about the same'}, from {median[lo]:.1f}x "
            f"at {lo:,} row{'' if lo == 1 else 's'} to {median[hi]:.1f}x at {hi:,}"
        )
    return ("Over the shapes measured, " + "; ".join(parts) + ".") if parts else "No torch sampler was timed."


# --------------------------------------------------------------------------------------------- drawing


def log_x(ax, values=None) -> None:
    ax.set_xscale("log")
    style.log_ticks(ax.xaxis, values)


def log_y(ax, values=None) -> None:
    ax.set_yscale("log")
    style.log_ticks(ax.yaxis, values)


def missing(ax, report: dict, case: str, reason: str | None = None) -> None:
    """Turn ``ax`` into a note that ``case`` was not measured, and why (the report's reasons by default)."""
    if reason is None:
        reasons = [u["reason"] for u in report["unavailable"] if u["case"] == case]
        reasons += [e["error"] for e in report["errors"] if e["case"] == case]
        reason = "; ".join(reasons) or "not run in this report"
    kw = dict(ha="center", va="center", wrap=True, transform=ax.transAxes, fontsize=9)
    ax.text(0.5, 0.5, f"{case}: not measured\n{reason}", **kw)
    ax.set_axis_off()


def finish(fig, axes, title: str, source: str, caption: str) -> None:
    """Title and source over the panels, one legend (duplicates merged) in a strip under them, never over
    the data, the caption last: the figure keeps the column's width, growing taller by the strip."""
    fig.suptitle(f"{title}\n{style.wrap(source)}", fontsize=style.SMALLEST_PT)
    handles, labels = [], []
    for ax in (ax for ax in np.atleast_1d(axes) if ax.axison):
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    ncol = 2 if labels and max(map(len, labels)) <= 45 else 1
    strip = 0.15 + 0.2 * math.ceil(len(labels) / ncol) if labels else 0.0
    fig.set_figheight(fig.get_figheight() + strip)
    fig.tight_layout(rect=(0, strip / fig.get_figheight(), 1, 1))
    if handles:
        fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=ncol)
    style.caption(fig, caption)


def figure(report, case, empty, draw, shape, height, text, reason=None, **share):
    """The pattern of every figure here: ``shape`` (rows, columns) panels a column wide; ``draw(axes)`` on
    the flat axes, or, when ``empty``, each panel says why ``case`` is missing; then :func:`finish` with
    ``text`` = (title, source, caption)."""
    with style.apply():
        fig, axes = plt.subplots(*shape, figsize=(style.WIDTH_IN, height), squeeze=False, **share)
        for ax in axes.flat if empty else ():
            missing(ax, report, case, reason)
        if not empty:
            draw(axes)
        finish(fig, list(axes.flat), *text)
    return fig


def _errorbars(ax, rows, x, **kw) -> None:
    err = np.vstack([rows["median_us"] - rows["p20_us"], rows["p80_us"] - rows["median_us"]])
    ax.errorbar(rows[x], rows["median_us"], yerr=err, capsize=3, **kw)


def _goal_line(ax, report, target, label, ls="-") -> None:
    if report["config"]["device"] == "cuda":  # a CPU smoke run judges nothing
        ax.axhline(target, color=style.FIXED, lw=1.2, ls=ls, label=label)


# --------------------------------------------------------------------------------------------- figures


def bandwidth_figure(report: dict, source: str):
    """Read bandwidth of specfix's two samplers against the two ceilings, fp32 and bf16 side by side."""
    g, ceil = bench.frame(report, "gumbel"), ceilings(report)

    def draw(axes):
        ours = g[g["impl"].isin(list(bench.OURS))]
        for ax, dtype in zip(axes[:, 0], DTYPE_BYTES, strict=True):
            for (impl, vocab), rows in ours[ours["dtype"] == dtype].groupby(["impl", "vocab"]):
                fmt = "o-" if impl == bench.JUDGED else "x:"
                ax.plot(rows["rows"], rows["TB_per_s_read"], fmt, label=f"{impl}, vocab {vocab:,}")
            read = f"read ceiling (fp32 argmax): {ceil['read']:.2f} TB/s"
            ax.axhline(ceil["read"], color=style.CEILING, ls="--", lw=1, label=read)
            copy = f"copy (read + write): {ceil['copy']:.2f} TB/s"
            ax.axhline(ceil["copy"], color=style.PADDING, ls=":", lw=1, label=copy)
            ax.set(ylabel="logits read, TB/s", title=f"{dtype} logits")
            log_x(ax, ours["rows"])
        axes[-1, 0].set_xlabel("rows (sequences sampled at once)")

    caption = (
        "Read each line against the dashed read ceiling: at few rows fixed costs keep every kernel "
        "far below it; at many rows the gap left is the time spent making the noise."
    )
    text = ("Read bandwidth of gumbel_sample against the ceilings", source, caption)
    return figure(report, "gumbel", g.empty, draw, (2, 1), 5.4, text, sharex=True, sharey=True)


def throughput_figure(report: dict, source: str):
    """Logits per second of the judged (fast-noise) kernel per dtype and vocabulary, with its rate goals."""
    g = bench.frame(report, "gumbel")

    def draw(axes):
        ax, judged = axes[0, 0], g[g["impl"] == bench.JUDGED]
        for (dtype, vocab), rows in judged.groupby(["dtype", "vocab"]):
            ax.plot(rows["rows"], rows["G_logits_per_s"], _MARKERS[dtype], label=f"{dtype}, vocab {vocab:,}")
        shapes = {}  # target -> the shapes it is judged at, in order (a dict as an ordered set)
        for r in (r for r in report["goals"] if r["case"] == "gumbel" and r["unit"] == "G logits/s"):
            where = re.sub(r", apply_temperature=\w+", "", r["goal"].rsplit(" at ", 1)[-1])
            shapes.setdefault(r["target"], {})[where] = None
        for (target, where), ls in zip(sorted(shapes.items()), ("-", "--", ":", "-."), strict=False):
            _goal_line(ax, report, target, f"goal: {target:g} G/s at {'; '.join(where)}", ls)
        ax.set(xlabel="rows", ylabel="G logits / s")
        log_x(ax, judged["rows"])
        log_y(ax)

    caption = (
        "Each green line is a goal, judged only at the shapes its label names; read those shapes' lines "
        "against it. The other lines show how the rate grows with the rows."
    )
    text = (f"Throughput of gumbel_sample ({bench.JUDGED})", source, caption)
    return figure(report, "gumbel", g.empty, draw, (1, 1), 3.4, text)


def speedup_figure(report: dict, source: str):
    """How many times faster the judged kernel is than each torch sampler, per dtype and vocabulary."""
    g = bench.frame(report, "gumbel")

    def draw(axes):
        wide = g.pivot_table(
            index=["dtype", "vocab", "rows"], columns="impl", values="median_us"
        ).reset_index()
        for ax, ref in zip(axes[:, 0], ("torch_softmax_multinomial", "torch_gumbel_max"), strict=True):
            for (dtype, vocab), rows in wide.groupby(["dtype", "vocab"]):
                speedup = rows[ref] / rows[bench.JUDGED]
                ax.plot(rows["rows"], speedup, _MARKERS[dtype], label=f"{dtype}, vocab {vocab:,}")
            ax.axhline(1, color=style.CEILING, lw=0.8)
            ax.set(ylabel="torch time / specfix time", title=f"speedup against {ref}")
            log_x(ax, wide["rows"])
            log_y(ax)
        target = next((r for r in report["goals"] if "softmax + multinomial" in r["goal"]), None)
        if target:
            _goal_line(axes[0, 0], report, target["target"], f"goal: {target['goal']}")
        axes[-1, 0].set_xlabel("rows")

    title = "How much faster the fused Triton sampler is than the torch samplers"
    text = (title, source, speedup_caption(report))
    return figure(report, "gumbel", g.empty, draw, (2, 1), 5.4, text, sharex=True, sharey=True)


def graph_call_figure(report: dict, source: str):
    """GPU time of one call inside a CUDA graph, per implementation and shape (rows x vocabulary)."""
    gg = bench.frame(report, "gumbel_graph")

    def draw(axes):
        ax, impls = axes[0, 0], list(dict.fromkeys(gg["impl"]))
        shapes = sorted(set(zip(gg["rows"], gg["vocab"], strict=True)), key=lambda s: (s[1], s[0]))
        width = 0.8 / len(impls)
        colours = itertools.cycle(
            (style.NEUTRAL, style.ACCENT, style.PADDING, style.PLACEHOLDER, style.CEILING)
        )
        for i, (impl, colour) in enumerate(zip(impls, colours, strict=False)):
            rows = gg[gg["impl"] == impl].set_index(["rows", "vocab"]).reindex(shapes)
            err = np.vstack([rows["median_us"] - rows["p20_us"], rows["p80_us"] - rows["median_us"]])
            x = np.arange(len(shapes)) + (i - (len(impls) - 1) / 2) * width
            ax.bar(x, rows["median_us"], width, yerr=err, capsize=2, color=colour, label=impl)
        ax.set_xticks(np.arange(len(shapes)), [f"{r:,} x\n{v:,}" for r, v in shapes])
        ax.set(xlabel="rows x vocabulary", ylabel="GPU time per call, us")
        log_y(ax)
        target = goal(report, "gumbel_graph", "us")
        if target:
            _goal_line(ax, report, target["target"], f"goal: {target['goal']}")

    caption = (
        "Compare specfix_fast (the serving kernel, blue) with the vLLM bars beside it and, at one "
        "row, with the green goal: inside a graph no host launch cost is left, so this is GPU time alone."
    )
    text = ("Calls captured in one CUDA graph: GPU time per call", source, caption)
    return figure(report, "gumbel_graph", gg.empty, draw, (1, 1), 3.6, text)


def mask_figure(report: dict, source: str):
    """Overhead of the masked kernel over the unmasked one, against the one-sided goal (at most +target%)."""
    mo = mask_overhead(report)

    def draw(axes):
        ax, values = axes[0, 0], mo["overhead"] * 100
        labels = [
            "with processed-logits store" if s else "sampling only" for s in mo["store_processed_logits"]
        ]
        ax.bar(labels, values, width=0.5, color=[style.FIXED if v <= 0 else style.NEUTRAL for v in values])
        for x, v in enumerate(values):
            offset = (0, 4 if v >= 0 else -12)
            ax.annotate(
                f"{v:+.1f}%", (x, v), xytext=offset, ha="center", fontsize=9, textcoords="offset points"
            )
        target = goal(report, "gumbel_mask", "%")
        limit = target["target"] if target else 2.0
        top, bottom = max(limit * 2, float(values.max()) + 1), min(-limit, float(values.min()) - 1.5)
        miss = f"misses the goal (more than +{limit:g}%)"
        ax.axhspan(limit, top, color=style.BUGGY, alpha=0.12, label=miss)
        ax.axhline(limit, color=style.BUGGY, lw=1)
        ax.axhline(0, color=style.CEILING, lw=0.8)
        ax.set(ylim=(bottom, top), ylabel="masked / unmasked - 1, %")

    caption = (
        "The goal bounds the cost from above only: a bar below zero means the masked kernel ran "
        "faster than the unmasked one, which passes."
    )
    text = ("Cost of the is_valid_req mask (vLLM PR #47066)", source, caption)
    return figure(report, "gumbel_mask", mo.empty, draw, (1, 1), 3.2, text)


def fix_costs_figure(report: dict, source: str):
    """Per-step cost of each placeholder fix on an idle GPU, and its host time behind queued GPU work."""
    fc = fix_costs(report)
    colours = dict(zip(FIXES, (style.FIXED, style.BUGGY, style.PLACEHOLDER, style.PADDING), strict=True))

    def draw(axes):
        idle, busy = axes[:, 0]
        for fix, rows in fc.groupby("fix", sort=False):
            syncs = (
                f", {rows['host_syncs_per_step'].max():g} host sync / step"
                if "host_syncs_per_step" in rows
                else ""
            )
            _errorbars(idle, rows, "num_tokens", fmt="o-", color=colours[fix], label=LABELS[fix] + syncs)
            if "host_us_behind_busy_gpu" in fc:
                busy.plot(rows["num_tokens"], rows["host_us_behind_busy_gpu"], "o-", color=colours[fix])
        idle.set(ylabel="one step, us", title="idle GPU")
        for ax in (idle, busy):
            log_x(ax, fc["num_tokens"])
            log_y(ax)
        if "host_us_behind_busy_gpu" not in fc:
            return missing(
                busy, report, "host time behind a busy GPU", "needs a GPU; this report ran on a CPU"
            )
        title = "earlier GPU work still queued"
        busy.set(xlabel="tokens in the step", ylabel="host time of the call, us", title=title)
        idle.tick_params(labelbottom=False)

    caption = (
        "Compare the green clamp with the magenta host mask, above on an idle GPU, below with "
        "earlier GPU work queued: a call that synchronises waits for all of that work."
    )
    text = ("Cost per step of each way to keep -1 out of the embedding", source, caption)
    return figure(report, "placeholder_fixes", fc.empty, draw, (2, 1), 5.6, text, sharex=True)


def drafter_figure(report: dict, source: str):
    """The drafter step, eager launches against one graph replay: time per step and the speedup."""
    dg, price = bench.frame(report, "drafter_graph"), padding_price(report)

    def draw(axes):
        colours = dict(zip(sorted(dg["model"].unique()), itertools.cycle(style.SERIES)))
        for (model, impl), rows in dg.groupby(["model", "impl"]):
            fmt = "o-" if impl == "graph" else "s--"
            axes[0, 0].plot(
                rows["live_batch"],
                rows["median_us"],
                fmt,
                ms=3,
                color=colours[model],
                label=f"{model}: {impl}",
            )
        axes[0, 0].set(ylabel="time per drafter step, us")
        log_y(axes[0, 0])
        if price.empty:
            return missing(
                axes[1, 0], report, "graph replay", "CUDA graphs need a GPU; this report ran on a CPU"
            )
        for model, rows in price.groupby("model"):
            axes[1, 0].plot(rows["live_batch"], rows["speedup"], "o-", ms=3, color=colours[model])
        axes[1, 0].axhline(1, color=style.CEILING, lw=0.8)
        axes[1, 0].set(xlabel="live batch", ylabel="graph replay speedup over eager")

    caption = (
        "The replay (solid) stays flat and low while eager launches (dashed) cost the same at every "
        "batch: at small batch the host's launches, not the GPU, set the step time."
    )
    text = ("Drafter step: eager launches at the exact batch against one graph replay", source, caption)
    return figure(report, "drafter_graph", dg.empty, draw, (2, 1), 5.4, text, sharex=True)


def padding_price_figure(report: dict, source: str):
    """Per live batch: the fraction of replayed rows that are padding, and the replay's speedup."""
    price = padding_price(report)

    def draw(axes):
        top, bottom = axes[:, 0]
        one = price[price["model"] == price["model"].iloc[0]]
        top.bar(one["live_batch"], one["padded_fraction"] * 100, color=style.PADDING, label="padded rows")
        top.set(ylabel="padded rows, %")
        for model, rows in price.groupby("model"):
            bottom.plot(rows["live_batch"], rows["speedup"], "o-", ms=3, label=f"speedup, {model}")
        bottom.axhline(1, color=style.CEILING, lw=0.8)
        bottom.set(xlabel="live batch", ylabel="replay speedup")
        style.integer_ticks(bottom.xaxis)

    caption = (
        "The grey bars peak just past each captured size, where most of a replayed graph is padding; "
        "compare the speedup below at those batches with its neighbours."
    )
    text = ("What the padding costs, and what the graph gives back", source, caption)
    reason = "needs the graph replay, which needs a GPU"
    return figure(report, "drafter_graph", price.empty, draw, (2, 1), 4.6, text, reason, sharex=True)


#: The rejection figure's lines: label and colour per implementation.
_REJECTION_LINES = {
    "specfix_triton": ("Triton, eager", style.NEUTRAL),
    "specfix_triton_graph": ("Triton, one CUDA-graph replay", style.ACCENT),
    "torch_reference": ("torch reference, eager", style.PADDING),
}


def rejection_figure(report: dict, source: str):
    """Verification time per step (``RejectionSampler.forward``): specfix's Triton sampler, eager and replayed
    from one CUDA graph, and its torch reference, at the smallest k and vocabulary of the report."""
    rj, shape = _smallest_rejection_shape(report)
    rj = rj[rj["impl"].isin(list(_REJECTION_LINES))] if len(rj) else rj

    def draw(axes):
        ax = axes[0, 0]
        for (impl, mode), rows in rj.groupby(["impl", "mode"]):
            label, color = _REJECTION_LINES[impl]
            _errorbars(
                ax,
                rows,
                "batch",
                fmt="o-" if mode == "greedy" else "s--",
                color=color,
                label=f"{label}, {mode}",
            )
        title = ", ".join(f"{c} = {v:,}" for c, v in shape.items())
        ax.set(xlabel="requests in the batch", ylabel="time per verification step, us", title=title)
        log_x(ax, rj["batch"])
        log_y(ax)

    caption = (
        "A replay (purple) is GPU time alone. An eager step (blue) is timed between CUDA events, so "
        "it also counts any wait for the host's Python that the GPU work queued ahead did not cover."
    )
    text = ("Rejection sampler (verification of k drafts per request), per step", source, caption)
    return figure(report, "rejection", rj.empty, draw, (1, 1), 3.6, text)


def peer_figure(report: dict, source: str):
    """Logits per second of the judged kernel beside each vLLM version's sampler, one panel per dtype and
    vocabulary, under the read ceiling measured in the same run (in logits per second of that dtype)."""
    table, versions, read = peer_table(report), peer_versions(report), ceilings(report)["read"]
    vocabs = sorted(table["vocab"].unique()) if len(table) else [None]
    rate = lambda one, impl: one["rows"] * one["vocab"] / one[impl] / 1e3  # G logits/s
    colours = (style.ACCENT, style.PLACEHOLDER, style.PADDING)

    def draw(axes):
        for (row, dtype), (col, vocab) in itertools.product(enumerate(DTYPE_BYTES), enumerate(vocabs)):
            ax, one = axes[row, col], table[(table["dtype"] == dtype) & (table["vocab"] == vocab)]
            ax.plot(
                one["rows"],
                rate(one, bench.JUDGED),
                "o-",
                color=style.NEUTRAL,
                label=f"specfix {bench.JUDGED}",
            )
            for v, colour in zip(reversed(versions), itertools.cycle(colours)):
                impl, label = bench.peer_impl(v), f"vLLM {v} gumbel_sample"
                ax.plot(one["rows"], rate(one, impl), "s--", ms=4, color=colour, label=label)
            label = f"read ceiling: {read:.2f} TB/s (fp32 argmax), in logits/s of the dtype"
            ax.axhline(read * 1e3 / DTYPE_BYTES[dtype], color=style.CEILING, ls=":", lw=1.2, label=label)
            ax.set_title(f"{vocab:,} x {dtype}", fontsize=9)
            log_x(ax, sorted(table["rows"].unique())[::2])  # every other size: four panels a row
            log_y(ax)
        for ax in axes[-1]:
            ax.set_xlabel("rows")
        for ax in axes[:, 0]:
            ax.set_ylabel("G logits / s")

    names = " and ".join(f"vLLM {v}" for v in reversed(versions)) or "vLLM"
    caption = (
        "Higher is faster. The gap between the blue line and a dashed vLLM line is the speedup over "
        "that version; the gap up to the dotted read ceiling is what any sampler could still gain."
    )
    text = (f"specfix {bench.JUDGED} beside {names}: same inputs, same run", source, caption)
    shape, reason = (len(DTYPE_BYTES), len(vocabs)), "no vLLM sampler in this report (bench --peer)"
    return figure(report, "gumbel", table.empty, draw, shape, 5.6, text, reason, sharex=True, sharey=True)


def small_batch_figure(report: dict, source: str):
    """Every shape judged under the five small-batch goals: its margin (% of the target; below zero a miss),
    one column per goal, so each goal's verdict and spread read at a glance."""
    judged = {n: _judged(report, n) for n in SMALL_BATCH}

    def draw(axes):
        ax, rng = axes[0, 0], np.random.default_rng(0)  # a fixed jitter keeps the dots of a goal apart
        for n, goals in judged.items():
            margins = np.array([0.0 if math.isnan(m) else m for m in map(_margin_pct, goals)])
            x = n + rng.uniform(-0.25, 0.25, len(margins))
            ok = np.array([g["status"] == "pass" for g in goals], dtype=bool)
            ax.scatter(x[ok], margins[ok], s=12, color=style.FIXED, label="shape meets its goal")
            ax.scatter(x[~ok], margins[~ok], s=12, color=style.BUGGY, label="shape misses its goal")
        ax.axhline(0, color=style.CEILING, lw=0.8)
        names = [f"{n}. " + "\n".join(textwrap.wrap(d.split(":")[0], 16)) for n, d in SMALL_BATCH.items()]
        ax.set_xticks(list(SMALL_BATCH), names)
        ax.set(ylabel="margin, % of the target")
        ax.grid(axis="x", visible=False)

    caption = (
        "A goal is met only if every one of its dots lies at or above zero (host syncs and identical "
        "replays have no percentage and sit at zero when met); its worst dot is its figure in the table."
    )
    text = ("The five small-batch goals, every shape judged", source, caption)
    empty = not any(judged.values())
    return figure(report, "goals", empty, draw, (1, 1), 3.6, text, "the report judged no small-batch goal")
