"""Chapter 5's figures and tables, all read from one ``specfix bench`` report (live, or the H200 recording).

For chapter 2: :func:`fix_costs` is the one table of what the placeholder fixes cost per step, read from the
bench's ``placeholder_fixes`` case of ``specfix/recorded/bench_h200.json``, with the fixes named as
``specfix.lab.placeholder_fixes.LABELS`` names them. Import it (``from specfix.figures.performance import
fix_costs``) instead of reading another recording, so both chapters show the same numbers.

The host side of a small step (section 10: :func:`host_timeline_figure`, :func:`host_regime_figure`,
:func:`host_trace_text`) reads ``scripts/record_host_trace.py``'s recording instead (:func:`load_host_trace`).

One function per figure; each returns the Figure (drawn in :mod:`specfix.figures.style`, captioned, its
legend outside the data, log axes labelled at the measured sizes only) and leaves showing it to the notebook.
A case the report lacks is drawn as a panel that says why it is missing.
"""

from __future__ import annotations

import itertools
import math
import re

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

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
    """What each way of keeping ``-1`` out of the embedding costs per step: one row per (fix, tokens).

    ``report`` is a bench report; by default the H200 recording ``bench_h200``. Columns: ``fix`` (the
    bench's name), ``label`` (the chapters' name for it), ``num_tokens``, ``median_us``/``p20_us``/
    ``p80_us`` (one step on an idle GPU, host work included), and, where the report ran on a GPU,
    ``host_syncs_per_step`` and ``host_us_behind_busy_gpu`` (the call's host time with earlier GPU work
    still queued)."""
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
    """The two ceilings measured in the report's own run, in TB/s: ``copy`` (read + write) and ``read``
    (a plain fp32 argmax). NaN where the report has no ceilings case."""
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


def floor_table(report: dict) -> pd.DataFrame:
    """specfix's samplers at every measured shape: median, floor, and the fraction of the read ceiling."""
    g = bench.frame(report, "gumbel")
    if g.empty:
        return g
    read = ceilings(report)["read"]
    g = g[g["impl"].isin(list(bench.OURS))].copy()
    shapes = zip(g["rows"], g["vocab"], g["dtype"], strict=True)
    g["floor_us"] = [floor_us(rows, vocab, dtype, read) for rows, vocab, dtype in shapes]
    g["of_read_ceiling"] = g["TB_per_s_read"] / read
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
    key = ["store_processed_logits"]
    masked = gm[gm["impl"] == "masked"].set_index(key)
    plain = gm[gm["impl"] == "unmasked"].set_index(key)
    out = pd.DataFrame(
        {
            "masked_us": masked["median_us"],
            "masked_p20": masked["p20_us"],
            "masked_p80": masked["p80_us"],
            "unmasked_us": plain["median_us"],
            "unmasked_p20": plain["p20_us"],
            "unmasked_p80": plain["p80_us"],
            "overhead": masked["overhead"],
        }
    )
    out["spreads_overlap"] = (out["masked_p20"] <= out["unmasked_p80"]) & (
        out["unmasked_p20"] <= out["masked_p80"]
    )
    return out.reset_index()


def padding_price(report: dict) -> pd.DataFrame:
    """The drafter step per live batch: rows the graph replays, how many are padding, and the speedup of
    the replay over eager launches, per draft model."""
    dg = bench.frame(report, "drafter_graph")
    if dg.empty or "speedup" not in dg:
        return pd.DataFrame(
            columns=["model", "live_batch", "padded_batch", "padded_rows", "padded_fraction", "speedup"]
        )
    g = dg[dg["impl"] == "graph"].copy()
    g["padded_rows"] = g["padded_batch"] - g["live_batch"]
    g["padded_fraction"] = g["padded_rows"] / g["padded_batch"]
    cols = ["model", "live_batch", "padded_batch", "padded_rows", "padded_fraction", "speedup"]
    return g[cols].sort_values(["model", "live_batch"]).reset_index(drop=True)


def peer_versions(report: dict) -> list[str]:
    """The vLLM versions whose Gumbel sampler the report timed beside specfix's, oldest first."""
    found = {
        impl.removeprefix("vllm_")
        for impl in bench.frame(report, "gumbel").get("impl", [])
        if impl.startswith("vllm_")
    }
    return sorted(found, key=lambda v: tuple(int(p) for p in v.split(".")))


def peer_table(report: dict) -> pd.DataFrame:
    """Per shape (dtype, vocab, rows): the judged kernel's median, each vLLM version's, the floor at the read
    ceiling, and the speedup over each version (vLLM time / specfix time). Empty without a vLLM peer."""
    g, versions = bench.frame(report, "gumbel"), peer_versions(report)
    if not versions:
        return pd.DataFrame(columns=["dtype", "vocab", "rows", bench.JUDGED, "floor_us"])
    wide = g.pivot_table(index=["dtype", "vocab", "rows"], columns="impl", values="median_us").reset_index()
    read = ceilings(report)["read"]
    shapes = zip(wide["rows"], wide["vocab"], wide["dtype"], strict=True)
    wide["floor_us"] = [floor_us(rows, vocab, dtype, read) for rows, vocab, dtype in shapes]
    cols = ["dtype", "vocab", "rows", bench.JUDGED] + [bench.peer_impl(v) for v in versions] + ["floor_us"]
    for v in versions:
        wide[f"speedup_vs_{v}"] = wide[bench.peer_impl(v)] / wide[bench.JUDGED]
        cols.append(f"speedup_vs_{v}")
    return wide[cols].sort_values(["dtype", "vocab", "rows"]).reset_index(drop=True)


#: A goal's shape, cut from its text to name its family ("at 256 x 32,000 fp32", "at B=1, k=1, V=32,000,
#: greedy"); a rejection goal keeps its mode.
_GOAL_SHAPE = (
    r" at (?:(?:[\d,]+ x )?[\d,]+(?: (?:fp32|bf16))?|B=\d+, k=\d+, V=[\d,]+, (?P<mode>\w+))"
    r"(?P<rest>.*)$"
)


def goal_families(report: dict) -> pd.DataFrame:
    """The report's goals grouped by what they demand, the shape cut out (a rejection goal keeps its mode):
    per family the number of goals, how many pass and miss, and the worst margin (in % of the target; below
    zero is a miss; NaN where the goal's margin is not a percentage) with the goal that has it."""
    rows = []
    for g in report["goals"]:
        family = re.sub(_GOAL_SHAPE, lambda m: f" ({m['mode']})" if m["mode"] else m["rest"], g["goal"])
        family = family.replace(", (", " (")
        margin = re.match(r"([+-][\d.]+)%", g["margin"])
        rows.append(
            {
                "family": family,
                "case": g["case"],
                "status": g["status"],
                "goal": g["goal"],
                "margin_pct": float(margin.group(1)) if margin else math.nan,
            }
        )
    if not rows:
        return pd.DataFrame(
            columns=["family", "case", "goals", "passed", "missed", "worst_margin_pct", "worst_goal"]
        )
    df = pd.DataFrame(rows)
    worst = df.sort_values("margin_pct", kind="stable").groupby("family", sort=False).first()
    out = df.groupby("family", sort=False).agg(
        case=("case", "first"),
        goals=("goal", "size"),
        passed=("status", lambda s: int((s == "pass").sum())),
        missed=("status", lambda s: int((s == "miss").sum())),
    )
    out["worst_margin_pct"] = worst["margin_pct"]
    out["worst_goal"] = worst["goal"]
    return out.reset_index()


#: The kernels a ``scripts/time_gumbel.py --before NAME=PATH`` sweep times beside today's default: the
#: multi-tile kernel of 2026-11-29 (a running best per lane) and the first kernel with vLLM's per-tile
#: contract (1-D tiles, a reduction across the program per tile).
SWEEP_KERNELS = {"before: old": "multi_tile_us", "before: head": "first_per_tile_us", "default": "now_us"}


def before_after(sweep: dict) -> pd.DataFrame:
    """Per shape of a ``scripts/time_gumbel.py --before`` sweep, the time of each of ``SWEEP_KERNELS`` and
    ``now_us / multi_tile_us - 1`` as ``slower`` (above zero: today's kernel is slower than the old one)."""
    df = pd.DataFrame(sweep["configs"])
    df = df[df["config"].isin(list(SWEEP_KERNELS))]
    for config in SWEEP_KERNELS:
        if not (df["config"] == config).any():
            raise ValueError(
                f"the sweep has no {config!r} rows: run scripts/time_gumbel.py --sweep "
                "--before old=PATH --before head=PATH"
            )
    wide = df.pivot_table(index=["dtype", "vocab", "rows"], columns="config", values="us").reset_index()
    wide = wide.rename(columns=SWEEP_KERNELS)
    wide["slower"] = wide["now_us"] / wide["multi_tile_us"] - 1
    return wide.sort_values(["dtype", "vocab", "rows"]).reset_index(drop=True)


#: Columns of ``profile_table``: what ncu measured per kernel, in the order the chapter reads them.
PROFILE_COLUMNS = (
    "kernel",
    "shape",
    "store",
    "masked",
    "register_cap",
    "time_us",
    "dram_pct_of_peak",
    "issue_active_pct",
    "instructions_per_logit",
    "registers_per_thread",
    "grid_size",
    "block_size",
    "waves_per_sm",
    "achieved_occupancy_pct",
    "stall_long_scoreboard",
)


def profile_table(profile: dict) -> pd.DataFrame:
    """One row per kernel of a ``scripts/profile_gumbel.py`` recording (``gumbel_ncu_h200``): the final run's
    kernels, then those of the run before the register cap (``register_cap`` None on today's kernel)."""
    rows = profile["kernels"] + profile.get("before_register_cap", [])
    missing = [c for c in PROFILE_COLUMNS if any(c not in r for r in rows)]
    if missing:
        raise ValueError(f"the profile lacks {missing}: record it with scripts/profile_gumbel.py")
    df = pd.DataFrame(rows)[list(PROFILE_COLUMNS)]
    final = len(profile["kernels"])
    df["run"] = ["final"] * final + ["before the register cap"] * (len(df) - final)
    return df


_PROFILE_SHOWN = {
    "kernel": "kernel",
    "shape": "shape",
    "store": "store",
    "run": "run",
    "time_us": "time (us)",
    "dram_pct_of_peak": "DRAM % of peak",
    "instructions_per_logit": "instructions per logit",
    "registers_per_thread": "registers per thread",
    "achieved_occupancy_pct": "occupancy %",
}


def profile_summary(profile: dict) -> pd.DataFrame:
    """:func:`profile_table`'s columns that the chapter's text reads, under short names, formatted for the
    page (:func:`specfix.figures.style.tidy`): the table fits the column where all 15 would not."""
    table = profile_table(profile)
    shown = [c for c in _PROFILE_SHOWN if c in table]
    return style.tidy(table[shown].rename(columns=_PROFILE_SHOWN), digits=2)


def _profiled(
    prof: pd.DataFrame,
    shape: str,
    kernel: str = "today",
    store: bool = False,
    masked: bool = True,
    run: str = "final",
) -> pd.Series:
    rows = prof[
        (prof.kernel == kernel)
        & (prof["shape"] == shape)
        & (prof.store == store)
        & (prof.masked == masked)
        & (prof.run == run)
    ]
    if rows.empty:
        raise ValueError(
            f"the profile has no {kernel!r} kernel at {shape} (store={store}, masked={masked}, "
            f"run {run!r}): record it with scripts/profile_gumbel.py --before old=PATH"
        )
    return rows.iloc[0]


def profile_text(profile: dict, sweep: dict) -> str:
    """Chapter 5's reading of the ncu profile: why 256 x 32,000 and 256 x 151,936 miss their goals, every
    figure taken from ``profile`` (``gumbel_ncu_h200``) and the launch ``sweep``."""
    prof = profile_table(profile)
    small, big = _profiled(prof, "256 x 32,000 fp32"), _profiled(prof, "256 x 151,936 fp32")
    many, old = _profiled(prof, "1,024 x 151,936 fp32"), _profiled(prof, "256 x 151,936 fp32", "before: old")
    old_small = {d: _profiled(prof, f"256 x 32,000 {d}", "before: old").time_us for d in ("fp32", "bf16")}
    goal_us = 256 * 151_936 / 700e3  # 700 G logits/s
    configs = pd.DataFrame(sweep["configs"])
    tried = configs[
        (configs.rows == 256)
        & (configs.vocab == 32_000)
        & (configs.dtype == "fp32")
        & ~configs.config.str.startswith("before")
    ].set_index("config")["us"]
    small_bf16 = _profiled(prof, "256 x 32,000 bf16").time_us
    return (
        f"- **256 x 32,000: too little work in flight.** {small.grid_size:,.0f} programs of "
        f"{small.block_size:.0f} threads make {small.waves_per_sm:.2f} of one wave: the SMs hold "
        f"{small.achieved_occupancy_pct:.0f}% of the warps they could, schedulers issue in "
        f"{small.issue_active_pct:.0f}% of cycles and DRAM runs at {small.dram_pct_of_peak:.0f}% of its "
        f"peak. In {small.time_us:.1f} us the kernel cannot hide a load's latency behind other warps' work, "
        "and its ramp-up and tail are a large part of the whole. More programs would each walk fewer tiles "
        "and pay their fixed costs (the row's key, a first load with nothing in front of it, the final "
        f"reductions) more often: of the {len(tried)} launch configurations the sweep timed at 256 x 32,000 "
        f"fp32, the fastest, {tried.idxmin()}, took {tried.min():.1f} us, and today's "
        f"{tried['default']:.1f} us. The multi-tile kernel is in the same place: {old_small['fp32']:.1f} us "
        f"against {small.time_us:.1f} (fp32), {old_small['bf16']:.1f} against {small_bf16:.1f} (bf16).\n"
        f"- **256 x 151,936: bound by instruction issue.** Each logit costs {big.instructions_per_logit:.0f} "
        "instructions (the hash, the uniform, the logarithms of the noise, the argmax), schedulers issue in "
        f"{big.issue_active_pct:.0f}% of cycles and DRAM runs at {big.dram_pct_of_peak:.0f}% of its peak. "
        "Issuing in every cycle, the same instructions would take about "
        f"{big.time_us * big.issue_active_pct / 100:.0f} us; the goal of 700 G logits/s needs "
        f"{goal_us:.1f} us. At 1,024 rows ({many.waves_per_sm:.1f} waves) the same kernel issues in "
        f"{many.issue_active_pct:.0f}% of cycles and meets its goal; at 256 rows ({big.waves_per_sm:.1f} "
        "waves) its ramp-up and its last wave weigh more.\n"
        f"- **{_instructions_head(big, old)}**: at 256 x 151,936 the multi-tile kernel spends "
        f"{old.instructions_per_logit:.1f} instructions per logit, today's {big.instructions_per_logit:.1f}, "
        f"and today's is {'faster' if big.time_us < old.time_us else 'slower'} there "
        f"({big.time_us:.1f} us against {old.time_us:.1f}) with "
        f"{big.achieved_occupancy_pct:.0f}% occupancy and {big.issue_active_pct:.0f}% issue against "
        f"{old.achieved_occupancy_pct:.0f}% and {old.issue_active_pct:.0f}%."
    )


def _instructions_head(new: pd.Series, old: pd.Series) -> str:
    """What the two profiled kernels say about instruction count and time, as the recording has them."""
    fewer, faster = new.instructions_per_logit < old.instructions_per_logit, new.time_us < old.time_us
    if fewer == faster:
        return f"{'Fewer' if fewer else 'More'} instructions, {'less' if faster else 'more'} time"
    return (
        f"{'Fewer' if fewer else 'More'} instructions, yet {'less' if faster else 'more'} time: the "
        "count alone does not decide, how many cycles issue does too"
    )


def mask_profile_text(profile: dict) -> str:
    """The masked and unmasked kernels with the processed-logits store, per profiled run."""
    prof = profile_table(profile)
    lines = []
    for run in [r for r in ("before the register cap", "final") if (prof.run == r).any()]:
        m, u = (_profiled(prof, "256 x 151,936 fp32", store=True, masked=x, run=run) for x in (True, False))
        lines.append(
            f"- {run}: masked {m.time_us:.1f} us with {m.registers_per_thread:.0f} registers and "
            f"{m.achieved_occupancy_pct:.0f}% occupancy; unmasked {u.time_us:.1f} us with "
            f"{u.registers_per_thread:.0f} registers and {u.achieved_occupancy_pct:.0f}% occupancy: "
            f"{m.time_us / u.time_us - 1:+.1%}"
        )
    if (prof.run == "before the register cap").any():
        capped = _profiled(prof, "256 x 151,936 fp32")
        uncapped = _profiled(prof, "256 x 151,936 fp32", run="before the register cap")
        lines.append(
            f"\nThe cap helped the kernel without the store too: {uncapped.time_us:.1f} us before, "
            f"{capped.time_us:.1f} us after at 256 x 151,936 fp32."
        )
    return "\n".join(lines)


def sweep_text(sweep: dict, report: dict) -> str:
    """Today's kernel against the multi-tile and the first per-tile kernel, from a ``--before`` sweep."""
    ba = before_after(sweep)
    big, graph = ba[ba["rows"] >= 256], {g["config"]: g["us_per_call"] for g in sweep["graph_one_row"]}
    first = big.first_per_tile_us / big.multi_tile_us - 1
    now_graph = bench.frame(report, "gumbel_graph")
    if len(now_graph):
        now_graph = now_graph[
            (now_graph.impl == bench.JUDGED) & (now_graph.rows == 1) & (now_graph.vocab == 248_320)
        ]["median_us"]
    per_dtype = "; ".join(
        f"{d} {x.slower.min():+.1%} to {x.slower.max():+.1%}" for d, x in big.groupby("dtype")
    )
    now = now_graph.iloc[0] if len(now_graph) else float("nan")
    return (
        f"At 256 rows and more today's kernel takes {per_dtype} of the multi-tile kernel's time "
        f"(faster at {(big.slower < 0).sum()} of {len(big)} shapes; at {(ba.slower < 0).sum()} of all "
        f"{len(ba)}), where the first per-tile kernel took {first.min():+.0%} to {first.max():+.0%}. "
        f"One row of 248,320 in a graph: {graph['before: old']:.2f} us (multi-tile), "
        f"{graph['before: head']:.2f} us (first per-tile), {graph['256 programs b512 w1']:.2f} us with "
        f"today's launch for up to 4 rows "
        f"(one-warp programs; the bench above: {now:.2f} us)."
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
    shapes = sorted({key[1:3] for key in replay.index})
    (k_lo, v_lo), (k_hi, v_hi) = shapes[0], shapes[-1]

    def say(k, v):  # at 1 and 16 requests, or the fewest and the most this report has (a smaller run)
        parts = []
        for m in ("greedy", "random"):
            by_batch = replay.loc[(m, k, v)].sort_index()
            lo = 1 if 1 in by_batch.index else by_batch.index[0]
            hi = 16 if 16 in by_batch.index else by_batch.index[-1]
            parts.append(
                f"{by_batch[lo]:.0f} us at {lo} request{'' if lo == 1 else 's'} and "
                f"{by_batch[hi]:.0f} at {hi} ({m})"
            )
        return ", ".join(parts)

    return (
        f"Goal: *{captured['goal']}*: **{captured['status']}** ({captured['margin'].split('; ')[-1]}). "
        f"Replayed, the step takes {say(k_lo, v_lo)} at k = {k_lo} and {v_lo:,} logits: a fixed cost per "
        f"call. With more to read per request (k = {k_hi}, {v_hi:,} logits) it grows with the batch: "
        f"{say(k_hi, v_hi)}. In the median shape a replay takes {ratio['greedy']:.2f} times the eager "
        f"step's time (greedy) and {ratio['random']:.2f} times (random); where the eager step took much "
        "longer, its events counted a wait for the host (the figure above)."
    )


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
        f"{r.unmasked_us:.1f} us ({r.unmasked_p20:.1f}-{r.unmasked_p80:.1f}): "
        f"overhead {r.overhead:+.1%}; "
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
    there = ", ".join(
        f"{r.speedup:.1f}x ({r.model})" for r in price[price.live_batch == worst.live_batch].itertuples()
    )
    return (
        f"From live batch {price.live_batch.min()} to {price.live_batch.max()} the replay is "
        f"{price.speedup.min():.1f} to {price.speedup.max():.1f} times faster than eager launches. "
        f"The worst padding is at a live batch of {worst.live_batch}: {worst.padded_rows} of the "
        f"{worst.padded_batch} replayed rows ({worst.padded_fraction:.0%}) are padding, and the "
        f"replay there is still {there} faster."
    )


def core_text(report: dict) -> str:
    """The rejection core's GPU time over the goal's vLLM version's, per mode, over the shapes timed."""
    core = bench.frame(report, "rejection").query("impl == 'specfix_core'")
    key = bench.speedup_key(bench.GOAL_PEER)
    if key not in core:
        return ""
    ratio = (1 / core[key]).groupby(core["mode"]).agg(["min", "max"])
    return (
        f"The rejection core's GPU time over vLLM {bench.GOAL_PEER}'s, over "
        f"{core.groupby('mode').size().iloc[0]} shapes per mode (batch, k, vocab): "
        + "; ".join(f"{mode} {lo:.2f} to {hi:.2f} times" for mode, (lo, hi) in ratio.iterrows())
        + "."
    )


def peer_text(report: dict) -> str:
    """Per vLLM version: the judged kernel's speedup per call, least and most, and the shapes where."""
    peers = peer_table(report)
    lines = []
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
    missed = families[families["missed"] > 0] if len(families) else families
    return (
        "\n".join(
            f"- *{f.family}*: {f.missed} of {f.goals} miss; the worst, *{f.worst_goal}*, by "
            f"{-f.worst_margin_pct:.1f}%"
            for f in missed.itertuples()
        )
        or "Every goal passes."
    )


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


#: The course in one table: per fix switch, the chapters that teach it, its vLLM PR, what breaks without it.
COURSE = (
    (
        "clamp_placeholders",
        "1, 2",
        "#47029",
        "a -1 reaches F.embedding: a device-side assert on the GPU, and every later CUDA call fails",
    ),
    (
        "reject_negative_drafts",
        "1",
        "#46533",
        "the random rejection kernel reads a -1 draft's probability out of bounds and may accept it",
    ),
    (
        "pad_idx_mapping",
        "3",
        "#47066",
        "padded rows of a graph replay keep stale idx_mapping entries and overwrite live draft logits",
    ),
    (
        "dflash_pad_idx",
        "3",
        "#47066",
        "DFlash's padded sample slots point at request 0 and overwrite its draft logits",
    ),
    (
        "mask_invalid_reqs",
        "3, 4",
        "#47066",
        "gumbel_block_argmax reads temperature[-1] and seed[-1] and writes a padded row's logits",
    ),
)


def course_table(report: dict) -> pd.DataFrame:
    """Every fix of the course: where it is taught, its PR, what breaks without it, and what ``report``
    measured it to cost (where the bench times it on its own)."""
    costs = {}
    fc = fix_costs(report)
    clamp = fc[fc["fix"] == "clamp"]
    if len(clamp):
        low, high = clamp["median_us"].min(), clamp["median_us"].max()
        syncs = ""
        if "host_syncs_per_step" in clamp:
            syncs = f"; {clamp['host_syncs_per_step'].max():g} host syncs"
        costs["clamp_placeholders"] = f"{low:.0f}-{high:.0f} us a step, launch included{syncs}"
    mo = mask_overhead(report)
    if len(mo):
        costs["mask_invalid_reqs"] = f"{mo['overhead'].max():+.1%} kernel time at most ({len(mo)} variants)"
    rows = [
        {
            "switch": name,
            "chapters": chapters,
            "vLLM PR": pr,
            "without it": breaks,
            "cost measured here": costs.get(name, "not timed on its own"),
        }
        for name, chapters, pr, breaks in COURSE
    ]
    return pd.DataFrame(rows).set_index("switch")


# --------------------------------------------------------------------------------------------- helpers


def _log_ticks(axis, values=None) -> None:
    """Labels on a log axis that never collide: ticks at the measured ``values`` when given, otherwise at
    1, 2 and 5 times each power of ten; no labels on minor ticks."""
    if values is not None:
        axis.set_major_locator(FixedLocator(sorted({float(v) for v in values})))
    else:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_locator(NullLocator())


def _log_x(ax, values=None):
    ax.set_xscale("log")
    _log_ticks(ax.xaxis, values)


def _log_y(ax, values=None):
    ax.set_yscale("log")
    _log_ticks(ax.yaxis, values)


def _missing(ax, report: dict, case: str, reason: str | None = None) -> None:
    if reason is None:
        reasons = [u["reason"] for u in report["unavailable"] if u["case"] == case]
        reasons += [e["error"] for e in report["errors"] if e["case"] == case]
        reason = "; ".join(reasons) or "not run in this report"
    ax.text(
        0.5,
        0.5,
        f"{case}: not measured\n{reason}",
        ha="center",
        va="center",
        wrap=True,
        transform=ax.transAxes,
        fontsize=9,
    )
    ax.set_axis_off()


def _handles(axes) -> tuple[list, list]:
    """The legend entries of every axes drawn, duplicate labels merged."""
    handles, labels = [], []
    for ax in np.atleast_1d(axes):
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if ax.axison and lab not in labels:
                handles.append(h)
                labels.append(lab)
    return handles, labels


def _finish(fig, axes, title: str, source: str, caption: str) -> None:
    """Title and source over the panels, one legend in a strip under them (never over the data), the
    caption last: the figure keeps the column's width, growing taller by the legend's strip."""
    fig.suptitle(f"{title}\n{style.wrap(source)}", fontsize=style.SMALLEST_PT)
    handles, labels = _handles(axes)
    ncol = 2 if labels and max(map(len, labels)) <= 45 else 1
    strip = 0.15 + 0.2 * math.ceil(len(labels) / ncol) if labels else 0.0
    fig.set_figheight(fig.get_figheight() + strip)
    fig.tight_layout(rect=(0, strip / fig.get_figheight(), 1, 1))
    if handles:
        fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=ncol)
    style.caption(fig, caption)


def _on_gpu(report: dict) -> bool:
    return report["config"]["device"] == "cuda"


# --------------------------------------------------------------------------------------------- figures


def bandwidth_figure(report: dict, source: str):
    """Read bandwidth of specfix's two samplers against the two ceilings, fp32 and bf16 side by side."""
    g = bench.frame(report, "gumbel")
    ceil = ceilings(report)
    with style.apply():
        fig, axes = plt.subplots(2, 1, figsize=(style.WIDTH_IN, 5.4), sharex=True, sharey=True)
        if g.empty:
            for ax in axes:
                _missing(ax, report, "gumbel")
        else:
            ours = g[g["impl"].isin(list(bench.OURS))]
            for ax, dtype in zip(axes, DTYPE_BYTES, strict=True):
                for (impl, vocab), rows in ours[ours["dtype"] == dtype].groupby(["impl", "vocab"]):
                    ax.plot(
                        rows["rows"],
                        rows["TB_per_s_read"],
                        "o-" if impl == bench.JUDGED else "x:",
                        label=f"{impl}, vocab {vocab:,}",
                    )
                ax.axhline(
                    ceil["read"],
                    color=style.CEILING,
                    ls="--",
                    lw=1,
                    label=f"read ceiling (fp32 argmax): {ceil['read']:.2f} TB/s",
                )
                ax.axhline(
                    ceil["copy"],
                    color=style.PADDING,
                    ls=":",
                    lw=1,
                    label=f"copy (read + write): {ceil['copy']:.2f} TB/s",
                )
                ax.set(ylabel="logits read, TB/s", title=f"{dtype} logits")
                _log_x(ax, ours["rows"])
            axes[-1].set_xlabel("rows (sequences sampled at once)")
        _finish(
            fig,
            axes,
            "Read bandwidth of gumbel_sample against the ceilings",
            source,
            "Read each line against the dashed read ceiling: at few rows fixed costs keep every kernel "
            "far below it; at many rows the gap left is the time spent making the noise.",
        )
    return fig


def throughput_figure(report: dict, source: str):
    """Logits per second of the judged (fast-noise) kernel per dtype and vocabulary, with its goal."""
    g = bench.frame(report, "gumbel")
    with style.apply():
        fig, ax = plt.subplots(figsize=(style.WIDTH_IN, 3.4))
        if g.empty:
            _missing(ax, report, "gumbel")
        else:
            judged = g[g["impl"] == bench.JUDGED]
            for (dtype, vocab), rows in judged.groupby(["dtype", "vocab"]):
                ax.plot(
                    rows["rows"], rows["G_logits_per_s"], _MARKERS[dtype], label=f"{dtype}, vocab {vocab:,}"
                )
            targets = {}
            for g in report["goals"]:
                if g["case"] == "gumbel" and g["unit"] == "G logits/s":
                    vocab = re.search(r" x ([\d,]+)", g["goal"])
                    targets.setdefault(g["target"], set()).add(vocab.group(1) if vocab else "any vocab")
            for (target, vocabs), ls in zip(sorted(targets.items()), ("-", "--", ":", "-."), strict=False):
                if _on_gpu(report):
                    ax.axhline(
                        target,
                        color=style.FIXED,
                        lw=1.2,
                        ls=ls,
                        label=f"goal at >= 256 rows: {target:g} G/s ({', '.join(sorted(vocabs))})",
                    )
            ax.set(xlabel="rows", ylabel="G logits / s")
            _log_x(ax, judged["rows"])
            _log_y(ax)
        _finish(
            fig,
            ax,
            f"Throughput of gumbel_sample ({bench.JUDGED})",
            source,
            "Read the lines at 256 rows and more against the green goal of their vocabulary; below 256 "
            "rows a batch is too small to keep the GPU busy, so those points are not judged.",
        )
    return fig


def speedup_figure(report: dict, source: str):
    """How many times faster the judged kernel is than each torch sampler, per dtype and vocabulary."""
    g = bench.frame(report, "gumbel")
    refs = ("torch_softmax_multinomial", "torch_gumbel_max")
    with style.apply():
        fig, axes = plt.subplots(2, 1, figsize=(style.WIDTH_IN, 5.4), sharex=True, sharey=True)
        if g.empty:
            for ax in axes:
                _missing(ax, report, "gumbel")
        else:
            wide = g.pivot_table(index=["dtype", "vocab", "rows"], columns="impl", values="median_us")
            wide = wide.reset_index()
            for ax, ref in zip(axes, refs, strict=True):
                for (dtype, vocab), rows in wide.groupby(["dtype", "vocab"]):
                    ax.plot(
                        rows["rows"],
                        rows[ref] / rows[bench.JUDGED],
                        _MARKERS[dtype],
                        label=f"{dtype}, vocab {vocab:,}",
                    )
                ax.axhline(1, color=style.CEILING, lw=0.8)
                ax.set(ylabel="torch time / specfix time", title=f"speedup against {ref}")
                _log_x(ax, wide["rows"])
                _log_y(ax)
            target = goal(report, "gumbel", "x")
            if _on_gpu(report) and target:
                axes[0].axhline(target["target"], color=style.FIXED, lw=1.2, label=f"goal: {target['goal']}")
            axes[-1].set_xlabel("rows")
        _finish(
            fig,
            axes,
            "How much faster the fused Triton sampler is than the torch samplers",
            source,
            speedup_caption(report),
        )
    return fig


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
            "grows"
            if median[hi] > median[lo] * 1.1
            else "falls"
            if median[hi] < median[lo] / 1.1
            else "stays about the same"
        )
        parts.append(
            f"against {name} the median speedup {trend}, from {median[lo]:.1f}x at {lo:,} "
            f"row{'' if lo == 1 else 's'} to {median[hi]:.1f}x at {hi:,}"
        )
    return ("Over the shapes measured, " + "; ".join(parts) + ".") if parts else "No torch sampler was timed."


def graph_call_figure(report: dict, source: str):
    """GPU time of one call inside a CUDA graph, per implementation and shape (rows x vocabulary)."""
    gg = bench.frame(report, "gumbel_graph")
    with style.apply():
        fig, ax = plt.subplots(figsize=(style.WIDTH_IN, 3.6))
        if gg.empty:
            _missing(ax, report, "gumbel_graph")
        else:
            impls = list(dict.fromkeys(gg["impl"]))
            shapes = sorted(set(zip(gg["rows"], gg["vocab"], strict=True)), key=lambda s: (s[1], s[0]))
            width = 0.8 / len(impls)
            colours = [style.NEUTRAL, style.ACCENT, style.PADDING, style.PLACEHOLDER, style.CEILING]
            for i, impl in enumerate(impls):
                rows = gg[gg["impl"] == impl].set_index(["rows", "vocab"]).reindex(shapes)
                err = np.vstack([rows["median_us"] - rows["p20_us"], rows["p80_us"] - rows["median_us"]])
                ax.bar(
                    np.arange(len(shapes)) + (i - (len(impls) - 1) / 2) * width,
                    rows["median_us"],
                    width,
                    yerr=err,
                    capsize=2,
                    color=colours[i % len(colours)],
                    label=impl,
                )
            ax.set_xticks(np.arange(len(shapes)), [f"{r:,} x\n{v:,}" for r, v in shapes])
            ax.set_xlabel("rows x vocabulary")
            _log_y(ax)
            target = goal(report, "gumbel_graph", "us")
            if _on_gpu(report) and target:
                ax.axhline(target["target"], color=style.FIXED, lw=1.2, label=f"goal: {target['goal']}")
            ax.set_ylabel("GPU time per call, us")
        _finish(
            fig,
            ax,
            "Calls captured in one CUDA graph: GPU time per call",
            source,
            "Compare specfix_fast (the serving kernel, blue) with the vLLM bars beside it and, at one "
            "row, with the green goal: inside a graph no host launch cost is left, so this is GPU time "
            "alone.",
        )
    return fig


def mask_figure(report: dict, source: str):
    """Overhead of the masked kernel over the unmasked one, against the one-sided goal (at most +target%)."""
    mo = mask_overhead(report)
    with style.apply():
        fig, ax = plt.subplots(figsize=(style.WIDTH_IN, 3.2))
        if mo.empty:
            _missing(ax, report, "gumbel_mask")
        else:
            labels = [
                "with processed-logits store" if store else "sampling only"
                for store in mo["store_processed_logits"]
            ]
            values = mo["overhead"] * 100
            ax.bar(
                labels, values, width=0.5, color=[style.FIXED if v <= 0 else style.NEUTRAL for v in values]
            )
            for x, v in enumerate(values):
                ax.annotate(
                    f"{v:+.1f}%",
                    (x, v),
                    xytext=(0, 4 if v >= 0 else -12),
                    ha="center",
                    fontsize=9,
                    textcoords="offset points",
                )
            target = goal(report, "gumbel_mask", "%")
            limit = target["target"] if target else 2.0
            top = max(limit * 2, float(values.max()) + 1)
            bottom = min(-limit, float(values.min()) - 1.5)
            ax.axhspan(
                limit, top, color=style.BUGGY, alpha=0.12, label=f"misses the goal (more than +{limit:g}%)"
            )
            ax.axhline(limit, color=style.BUGGY, lw=1)
            ax.axhline(0, color=style.CEILING, lw=0.8)
            ax.set(ylim=(bottom, top), ylabel="masked / unmasked - 1, %")
        _finish(
            fig,
            ax,
            "Cost of the is_valid_req mask (vLLM PR #47066)",
            source,
            "The goal bounds the cost from above only: a bar below zero means the masked kernel ran "
            "faster than the unmasked one, which passes.",
        )
    return fig


def fix_costs_figure(report: dict, source: str):
    """Per-step cost of each placeholder fix on an idle GPU, and its host time behind queued GPU work."""
    fc = fix_costs(report)
    with style.apply():
        fig, axes = plt.subplots(2, 1, figsize=(style.WIDTH_IN, 5.6), sharex=True)
        if fc.empty:
            for ax in axes:
                _missing(ax, report, "placeholder_fixes")
        else:
            colours = dict(
                zip(FIXES, (style.FIXED, style.BUGGY, style.PLACEHOLDER, style.PADDING), strict=True)
            )
            for fix, rows in fc.groupby("fix", sort=False):
                syncs = (
                    f", {rows['host_syncs_per_step'].max():g} host sync / step"
                    if "host_syncs_per_step" in rows
                    else ""
                )
                err = np.vstack([rows["median_us"] - rows["p20_us"], rows["p80_us"] - rows["median_us"]])
                axes[0].errorbar(
                    rows["num_tokens"],
                    rows["median_us"],
                    yerr=err,
                    fmt="o-",
                    capsize=3,
                    color=colours[fix],
                    label=LABELS[fix] + syncs,
                )
            axes[0].set(ylabel="one step, us", title="idle GPU")
            if "host_us_behind_busy_gpu" in fc:
                for fix, rows in fc.groupby("fix", sort=False):
                    axes[1].plot(
                        rows["num_tokens"], rows["host_us_behind_busy_gpu"], "o-", color=colours[fix]
                    )
                axes[1].set(
                    xlabel="tokens in the step",
                    ylabel="host time of the call, us",
                    title="earlier GPU work still queued",
                )
                axes[0].tick_params(labelbottom=False)
                _log_x(axes[1], fc["num_tokens"])
                _log_y(axes[1])
            else:
                _missing(
                    axes[1], report, "host time behind a busy GPU", "needs a GPU; this report ran on a CPU"
                )
            _log_x(axes[0], fc["num_tokens"])
            _log_y(axes[0])
        _finish(
            fig,
            axes,
            "Cost per step of each way to keep -1 out of the embedding",
            source,
            "Compare the green clamp with the magenta host mask, above on an idle GPU, below with "
            "earlier GPU work queued: a call that synchronises waits for all of that work.",
        )
    return fig


def drafter_figure(report: dict, source: str):
    """The drafter step, eager launches against one graph replay: time per step and the speedup."""
    dg = bench.frame(report, "drafter_graph")
    with style.apply():
        fig, axes = plt.subplots(2, 1, figsize=(style.WIDTH_IN, 5.4), sharex=True)
        if dg.empty:
            for ax in axes:
                _missing(ax, report, "drafter_graph")
        else:
            models = sorted(dg["model"].unique())
            colours = dict(zip(models, itertools.cycle(style.SERIES)))
            for (model, impl), rows in dg.groupby(["model", "impl"]):
                axes[0].plot(
                    rows["live_batch"],
                    rows["median_us"],
                    "o-" if impl == "graph" else "s--",
                    ms=3,
                    color=colours[model],
                    label=f"{model}: {impl}",
                )
            axes[0].set(ylabel="time per drafter step, us")
            _log_y(axes[0])
            price = padding_price(report)
            if len(price):
                for model, rows in price.groupby("model"):
                    axes[1].plot(rows["live_batch"], rows["speedup"], "o-", ms=3, color=colours[model])
                axes[1].axhline(1, color=style.CEILING, lw=0.8)
                axes[1].set(xlabel="live batch", ylabel="graph replay speedup over eager")
            else:
                _missing(axes[1], report, "graph replay", "CUDA graphs need a GPU; this report ran on a CPU")
        _finish(
            fig,
            axes,
            "Drafter step: eager launches at the exact batch against one graph replay",
            source,
            "The replay (solid) stays flat and low while eager launches (dashed) cost the same at every "
            "batch: at small batch the host's launches, not the GPU, set the step time.",
        )
    return fig


def padding_price_figure(report: dict, source: str):
    """Per live batch: the fraction of replayed rows that are padding, and the replay's speedup."""
    price = padding_price(report)
    with style.apply():
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(style.WIDTH_IN, 4.6), sharex=True)
        if price.empty:
            for ax in (top, bottom):
                _missing(ax, report, "drafter_graph", "needs the graph replay, which needs a GPU")
        else:
            one = price[price["model"] == price["model"].iloc[0]]
            top.bar(one["live_batch"], one["padded_fraction"] * 100, color=style.PADDING, label="padded rows")
            top.set(ylabel="padded rows, %")
            for model, rows in price.groupby("model"):
                bottom.plot(rows["live_batch"], rows["speedup"], "o-", ms=3, label=f"speedup, {model}")
            bottom.axhline(1, color=style.CEILING, lw=0.8)
            bottom.set(xlabel="live batch", ylabel="replay speedup")
            style.integer_ticks(bottom.xaxis)
        _finish(
            fig,
            (top, bottom),
            "What the padding costs, and what the graph gives back",
            source,
            "The grey bars peak just past each captured size, where most of a replayed graph is padding; "
            "compare the speedup below at those batches with its neighbours.",
        )
    return fig


#: The rejection figure's lines: label and colour per implementation.
_REJECTION_LINES = {
    "specfix_triton": ("Triton, eager", style.NEUTRAL),
    "specfix_triton_graph": ("Triton, one CUDA-graph replay", style.ACCENT),
    "torch_reference": ("torch reference, eager", style.PADDING),
}


def rejection_figure(report: dict, source: str):
    """Verification time per step (``RejectionSampler.forward``): specfix's Triton sampler, eager and replayed
    from one CUDA graph, and its torch reference, at the smallest k and vocabulary of the report."""
    rj = bench.frame(report, "rejection")
    with style.apply():
        fig, ax = plt.subplots(figsize=(style.WIDTH_IN, 3.6))
        if rj.empty:
            _missing(ax, report, "rejection")
        else:
            shape = {c: rj[c].min() for c in ("k", "vocab") if c in rj}
            for column, value in shape.items():
                rj = rj[rj[column] == value]
            rj = rj[rj["impl"].isin(list(_REJECTION_LINES))]
            for (impl, mode), rows in rj.groupby(["impl", "mode"]):
                err = np.vstack([rows["median_us"] - rows["p20_us"], rows["p80_us"] - rows["median_us"]])
                label, color = _REJECTION_LINES[impl]
                ax.errorbar(
                    rows["batch"],
                    rows["median_us"],
                    yerr=err,
                    capsize=3,
                    fmt="o-" if mode == "greedy" else "s--",
                    color=color,
                    label=f"{label}, {mode}",
                )
            ax.set(
                xlabel="requests in the batch",
                ylabel="time per verification step, us",
                title=", ".join(f"{c} = {v:,}" for c, v in shape.items()),
            )
            _log_x(ax, rj["batch"])
            _log_y(ax)
        _finish(
            fig,
            ax,
            "Rejection sampler (verification of k drafts per request), per step",
            source,
            "A replay (purple) is GPU time alone. An eager step (blue) is timed between CUDA events, so "
            "it also counts any wait for the host's Python that the GPU work queued ahead did not cover.",
        )
    return fig


def rejection_table(report: dict) -> pd.DataFrame:
    """The rejection sampler's median us per step at the figure's shape (smallest k and vocabulary): one row
    per (mode, batch), one column per sampler, "-" where a sampler was not timed."""
    rj = bench.frame(report, "rejection")
    if rj.empty:
        return pd.DataFrame()
    shape = {c: rj[c].min() for c in ("k", "vocab") if c in rj}
    for column, value in shape.items():
        rj = rj[rj[column] == value]
    table = rj.pivot_table(index=["mode", "batch"], columns="impl", values="median_us")
    table = table.rename(columns=lambda c: c.replace("_", " ")).rename_axis(columns=None)
    table.index.names = ["mode", "batch"]
    table = table.map(lambda us: "-" if pd.isna(us) else f"{us:,.1f}")
    table.attrs["shape"] = ", ".join(f"{c} = {v:,}" for c, v in shape.items())
    return table


def peer_figure(report: dict, source: str):
    """Logits per second of the judged kernel beside each vLLM version's sampler, one panel per dtype and
    vocabulary, under the read ceiling measured in the same run (in logits per second of that dtype)."""
    table, versions = peer_table(report), peer_versions(report)
    vocabs = sorted(table["vocab"].unique()) if len(table) else [None]
    read = ceilings(report)["read"]
    rate = lambda one, impl: one["rows"] * one["vocab"] / one[impl] / 1e3  # G logits/s
    with style.apply():
        fig, axes = plt.subplots(
            len(DTYPE_BYTES),
            len(vocabs),
            figsize=(style.WIDTH_IN, 5.6),
            sharex=True,
            sharey=True,
            squeeze=False,
        )
        if table.empty:
            for ax in axes.flat:
                _missing(ax, report, "gumbel", "no vLLM sampler in this report (bench --peer)")
        else:
            colours = [style.ACCENT, style.PLACEHOLDER, style.PADDING]
            for (row, dtype), (col, vocab) in itertools.product(enumerate(DTYPE_BYTES), enumerate(vocabs)):
                ax, one = axes[row, col], table[(table["dtype"] == dtype) & (table["vocab"] == vocab)]
                ax.plot(
                    one["rows"],
                    rate(one, bench.JUDGED),
                    "o-",
                    color=style.NEUTRAL,
                    label=f"specfix {bench.JUDGED}",
                )
                for i, v in enumerate(reversed(versions)):
                    ax.plot(
                        one["rows"],
                        rate(one, bench.peer_impl(v)),
                        "s--",
                        ms=4,
                        color=colours[i % len(colours)],
                        label=f"vLLM {v} gumbel_sample",
                    )
                ax.axhline(
                    read * 1e3 / DTYPE_BYTES[dtype],
                    color=style.CEILING,
                    ls=":",
                    lw=1.2,
                    label=f"read ceiling: {read:.2f} TB/s (fp32 argmax), in logits/s of the dtype",
                )
                ax.set_title(f"{vocab:,} x {dtype}", fontsize=9)
                _log_x(ax, sorted(table["rows"].unique())[::2])  # every other size: four panels a row
                _log_y(ax)
            for ax in axes[-1]:
                ax.set_xlabel("rows")
            for ax in axes[:, 0]:
                ax.set_ylabel("G logits / s")
        names = " and ".join(f"vLLM {v}" for v in reversed(versions)) or "vLLM"
        _finish(
            fig,
            list(axes.flat),
            f"specfix {bench.JUDGED} beside {names}: same inputs, same run",
            source,
            "Higher is faster. The gap between the blue line and a dashed vLLM line is the speedup over "
            "that version; the gap up to the dotted read ceiling is what any sampler could still gain.",
        )
    return fig


# --------------------------------------------------------------------------------------------- host side

#: The recording of ``scripts/record_host_trace.py``: one small speculative step under the profiler,
#: ``gumbel_sample`` by rows, eager against a graph replay; specfix beside vLLM's own functions.
HOST_TRACE = "host_trace_h200"
#: The timeline's lanes, top to bottom: label and colour.
_LANES = {
    "call": ("call", style.PADDING),
    "op": ("torch ops", style.NEUTRAL),
    "launch": ("launch calls", style.CEILING),
    "gpu": ("GPU kernels", style.ACCENT),
}
#: The step figure's bars: what each times, its label, its colour.
_STEP_BARS = (
    ("eager", "back_to_back", "eager, back to back", style.NEUTRAL),
    ("graph", "back_to_back", "one graph replay, back to back", style.ACCENT),
    ("eager", "gpu", "GPU time alone", style.PADDING),
)


def load_host_trace() -> tuple[dict, str]:
    """The host-side recording and the line that says where it comes from (it is always a recording: the
    profiler run takes a minute on a GPU and is made by ``scripts/record_host_trace.py``)."""
    trace = recorded.load(HOST_TRACE)
    return trace, "RECORDED, not on this machine: " + recorded.label(trace["meta"])


def _impl_name(trace: dict, impl: str) -> str:
    return "specfix" if impl == "specfix" else f"vLLM {trace['peer']['version']}"


def _median(timing: dict | None, key: str) -> float:
    part = (timing or {}).get(key)
    return part["median_us"] if part else math.nan


def host_rows(trace: dict) -> pd.DataFrame:
    """``gumbel_sample`` by rows: one line per (impl, rows) with the medians ``host_us`` (the host's work per
    call, nothing waiting), ``gpu_us`` (the GPU's) and ``back_to_back_us`` (a call in a loop of calls), and
    ``host_bound`` (the host's work takes longer than the GPU's)."""
    rows = [
        {
            "impl": r["impl"],
            "rows": r["rows"],
            "host_us": _median(r, "host"),
            "gpu_us": _median(r, "gpu"),
            "back_to_back_us": _median(r, "back_to_back"),
        }
        for r in trace["rows"]
    ]
    df = pd.DataFrame(rows, columns=["impl", "rows", "host_us", "gpu_us", "back_to_back_us"])
    df["host_bound"] = df["host_us"] > df["gpu_us"]
    return df.sort_values(["impl", "rows"]).reset_index(drop=True)


def host_bound_until(trace: dict, impl: str) -> int | None:
    """The most rows at which ``impl``'s ``gumbel_sample`` is still host-bound (every smaller size measured
    is too); None when it is not host-bound even at the fewest rows, or the recording has no GPU times."""
    one = host_rows(trace).query("impl == @impl")
    bound = None
    for r in one.itertuples():
        if not r.host_bound:
            break
        bound = int(r.rows)
    return bound


def step_table(trace: dict) -> pd.DataFrame:
    """The step (verification, then the draw) per (impl, batch): medians of host, GPU and back-to-back time
    per step, eager and replayed from one CUDA graph (NaN where it was not captured)."""
    out = []
    for r in trace["graph"]:
        row = {"impl": r["impl"], "batch": r["batch"]}
        for mode in ("eager", "graph"):
            for key in ("host", "gpu", "back_to_back"):
                row[f"{mode}_{key}_us"] = _median(r.get(mode), key)
        out.append(row)
    df = pd.DataFrame(out, columns=["impl", "batch", *(c for r in out[:1] for c in r if c.endswith("_us"))])
    df["order"] = df["impl"].map(trace["impls"].index)
    return df.sort_values(["order", "batch"]).drop(columns="order").reset_index(drop=True)


def _timeline(trace: dict, impl: str, batch: int) -> dict | None:
    return next((t for t in trace["timelines"] if t["impl"] == impl and t["batch"] == batch), None)


def host_timeline_figure(trace: dict, source: str, batch: int | None = None):
    """One step at ``batch`` requests (default the largest traced), one panel per implementation: the
    step's two calls, the torch ops and launch calls under them on the host, and the kernels on the GPU,
    in microseconds from the step's start."""
    batch = max(t["batch"] for t in trace["timelines"]) if batch is None else batch
    impls = [i for i in trace["impls"] if _timeline(trace, i, batch)]
    end = max((s["end_us"] for i in impls for s in _timeline(trace, i, batch)["spans"]), default=1.0)
    with style.apply():
        fig, axes = plt.subplots(
            len(impls), 1, figsize=(style.WIDTH_IN, 1.0 + 1.5 * len(impls)), sharex=True, squeeze=False
        )
        axes = axes[:, 0]
        for ax, impl in zip(axes, impls, strict=True):
            t = _timeline(trace, impl, batch)
            for y, (lane, (label, colour)) in enumerate(_LANES.items()):
                spans = [
                    (s["start_us"], max(s["end_us"] - s["start_us"], end / 1500))
                    for s in t["spans"]
                    if s["lane"] == lane
                ]
                ax.broken_barh(spans, (len(_LANES) - y - 1.4, 0.8), color=colour, label=label)
            for s in (s for s in t["spans"] if s["lane"] == "call" and s["end_us"] - s["start_us"] > end / 8):
                ax.text(
                    (s["start_us"] + s["end_us"]) / 2,
                    len(_LANES) - 1,
                    s["name"],
                    ha="center",
                    va="center",
                    fontsize=style.SMALLEST_PT,
                    clip_on=True,
                )
            ax.set_yticks(range(len(_LANES)), [label for label, _ in reversed(_LANES.values())])
            ax.set_ylim(-0.6, len(_LANES) - 0.4)
            ax.grid(axis="y", visible=False)
            ax.set_title(
                f"{_impl_name(trace, impl)}: host {t['step_host_us']:,.0f} us, GPU busy "
                f"{t['gpu_busy_us']:,.0f} us, {t['kernels']} kernels, {t['launches']} launch calls",
                fontsize=9,
            )
        axes[-1].set(xlim=(0, end * 1.02), xlabel="microseconds from the start of the step")
        k, vocab = t["k"], t["vocab"]
        _finish(
            fig,
            axes,
            f"One speculative step at {batch} requests (k = {k}, vocabulary {vocab:,}), host against GPU",
            source,
            "Read down a column: wherever the top three lanes are busy and the GPU lane is empty, the "
            "GPU waits for the host. The profiler adds its own time to every host span.",
        )
    return fig


def host_regime_figure(trace: dict, source: str):
    """Above: ``gumbel_sample``'s host and GPU time per call by rows, for each implementation. Below: the
    step per batch, eager against one CUDA-graph replay, beside its GPU time alone."""
    df, steps = host_rows(trace), step_table(trace)
    colours = dict(zip(trace["impls"], itertools.cycle(style.SERIES)))
    with style.apply():
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(style.WIDTH_IN, 6.0))
        for impl, one in df.groupby("impl", sort=False):
            name = _impl_name(trace, impl)
            top.plot(one["rows"], one["host_us"], "o-", ms=3, color=colours[impl], label=f"{name}: host")
            if one["gpu_us"].notna().any():
                top.plot(one["rows"], one["gpu_us"], "s--", ms=3, color=colours[impl], label=f"{name}: GPU")
        top.set(xlabel="rows sampled by one gumbel_sample call", ylabel="time per call, us")
        _log_x(top, df["rows"])
        _log_y(top)
        if steps.empty:
            _missing(bottom, {"unavailable": [], "errors": []}, "graph", "the recording has no step timings")
        else:
            width = 0.8 / len(_STEP_BARS)
            x = np.arange(len(steps))
            for i, (mode, key, label, colour) in enumerate(_STEP_BARS):
                bottom.bar(x + (i - 1) * width, steps[f"{mode}_{key}_us"], width, color=colour, label=label)
            for xi in x[steps["graph_back_to_back_us"].isna().to_numpy()]:
                bottom.text(xi, 0, "not\ncaptured", ha="center", va="bottom", fontsize=style.SMALLEST_PT)
            bottom.set_xticks(x, [f"{_impl_name(trace, r.impl)}\n{r.batch} req." for r in steps.itertuples()])
            bottom.set(ylabel="time per step, us")
            bottom.grid(axis="x", visible=False)
        _finish(
            fig,
            (top, bottom),
            "Where the host sets the pace, and what a CUDA graph takes away",
            source,
            "Above, where a solid line (host) lies over the dashed one of its colour (GPU), the host "
            "sets the pace. Below, the replay's bar drops to its GPU time: the graph removes the host's "
            "work, not the GPU's.",
        )
    return fig


def host_trace_text(trace: dict) -> str:
    """What the host-side recording says, in numbers read from it: the step's timeline, where the
    host-bound regime ends, the per-call host cost beside vLLM's, and what a graph replay removes."""
    names = {impl: _impl_name(trace, impl) for impl in trace["impls"]}
    lines = []
    batch = max((t["batch"] for t in trace["timelines"]), default=None)
    for impl in trace["impls"]:
        t = _timeline(trace, impl, batch) if batch is not None else None
        if t:
            share = t["gpu_busy_us"] / t["step_host_us"] if t["step_host_us"] else math.nan
            lines.append(
                f"- **{names[impl]}, one step at {batch} requests** (profiled): the host worked "
                f"{t['step_host_us']:,.0f} us, the GPU was busy {t['gpu_busy_us']:,.0f} us of it "
                f"({share:.0%}) in {t['kernels']} kernels from {t['launches']} launch calls."
            )
    df = host_rows(trace)
    if df["gpu_us"].notna().any():
        for impl in trace["impls"]:
            until = host_bound_until(trace, impl)
            one = df.query("impl == @impl")
            after = one[one["rows"] > (until or 0)]["rows"].min()
            where = (
                "not host-bound even at the fewest rows measured"
                if until is None
                else f"host-bound up to {until:,} rows"
            )
            if until is not None and not math.isnan(after):
                where += f"; from {int(after):,} rows the GPU sets the pace"
            lines.append(f"- **{names[impl]} `gumbel_sample` by rows**: {where}.")
    peer = trace["peer"]["impl"]
    wide = df.pivot_table(index="rows", columns="impl", values="host_us")
    if peer in wide and "specfix" in wide:
        ours, theirs = wide["specfix"], wide[peer]
        at = [
            f"{ours[r] / theirs[r]:.2f}x at {r:,} row{'s' * (r > 1)} ({ours[r]:.1f} against "
            f"{theirs[r]:.1f} us)"
            for r in (1, 8, 64)
            if r in wide.index
        ]
        lines.append(f"- **Host cost per call**, specfix over {names[peer]}: " + "; ".join(at) + ".")
    for r in step_table(trace).itertuples():
        if not math.isnan(r.graph_back_to_back_us):
            lines.append(
                f"- **{names[r.impl]}, the step at {r.batch} request{'s' * (r.batch > 1)}**: "
                f"{r.eager_back_to_back_us:,.0f} us back to back eager, "
                f"{r.graph_back_to_back_us:,.0f} us replayed from one CUDA graph; the host's work "
                f"per step {r.eager_host_us:,.0f} us eager, {r.graph_host_us:,.0f} us for a replay; "
                f"the GPU's {r.eager_gpu_us:,.0f} and {r.graph_gpu_us:,.0f} us."
            )
    idle = [
        f"{r['impl']} at {r['rows']:,} rows"
        for r in trace["rows"]
        if r.get("gpu_busy_throughout_host_timing") is False
    ]
    if idle:
        lines.append(
            "- The GPU ran out of queued work before the host's timing loop ended "
            f"({', '.join(idle)}): there the host's times include waiting for the GPU."
        )
    if not df["gpu_us"].notna().any():
        lines.append("- This recording ran without a GPU: every time in it is the host's.")
    return "\n".join(lines)
