"""Chapter 5's tables and paragraphs, read from one ``specfix bench`` report: a live run or the recording.

Read :func:`load_report` first, then the tables, which the paragraphs and the figures
(:mod:`specfix.figures.performance_figures`) read; chapter 2 shows :func:`fix_costs` too."""

from __future__ import annotations

import collections
import math
import re

import pandas as pd

from specfix.lab.placeholder_fixes import FIXES, LABELS
from specfix.tools import bench, recorded
from specfix.tools.bench.rejection_cases import NAMES
from specfix.tools.bench.report import find

#: Bytes per logit of each dtype the bench measures.
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
#: The torch samplers the judged kernel is timed against, and their names in prose.
TORCH_SAMPLERS = {
    "torch_softmax_multinomial": "softmax + multinomial",
    "torch_gumbel_max": "torch's Gumbel-max",
}


def load_report(live: bool, scale: str) -> tuple[dict, str]:
    """The report chapter 5 plots (``live``: run on this GPU, else the H200 recording) and its source line."""
    report = bench.run("cuda", scale) if live else recorded.load("bench_h200")
    return report, source_line(report["meta"], live)


def source_line(meta: dict, live: bool = False) -> str:
    """The line under a figure's title that says, once, where its numbers were taken."""
    said = recorded.label(meta).removeprefix("recorded on ")
    return f"Measured live on this machine: {said}" if live else f"Recorded on {said} (not on this machine)"


def fix_costs(report: dict | None = None) -> pd.DataFrame:
    """The bench's ``placeholder_fixes`` rows (default: the H200 recording) under the chapters' labels."""
    report = recorded.load("bench_h200") if report is None else report
    df = bench.frame(report, "placeholder_fixes")
    keep = ["fix", "label", "num_tokens", "median_us", "p20_us", "p80_us"]
    if df.empty:
        return pd.DataFrame(columns=keep)
    unknown = sorted(set(df["impl"]) - set(FIXES))
    if unknown:
        raise ValueError(f"report names fixes {unknown} that specfix.lab.placeholder_fixes does not know")
    df["fix"], df["label"], df["order"] = df["impl"], df["impl"].map(LABELS), df["impl"].map(FIXES.index)
    keep += [c for c in ("host_syncs_per_step", "host_us_behind_busy_gpu") if c in df]
    return df.sort_values(["order", "num_tokens"])[keep].reset_index(drop=True)


def ceilings(report: dict) -> dict[str, float]:
    """The run's ceilings in TB/s: ``copy`` (read + write) and ``read`` (an fp32 argmax); NaN if absent."""
    df = bench.frame(report, "ceilings")
    pick = lambda impl: float(df.loc[df["impl"] == impl, "TB_per_s"].max()) if len(df) else math.nan
    return {"copy": pick("copy"), "read": pick("argmax_read")}


def medians(report: dict, case: str = "gumbel") -> pd.DataFrame:
    """A Gumbel case's median us, a row per shape (dtype, vocab, rows) and a column per sampler."""
    g = bench.frame(report, case)
    if g.empty:
        return pd.DataFrame(columns=["dtype", "vocab", "rows"])
    return g.pivot_table(index=["dtype", "vocab", "rows"], columns="impl", values="median_us").reset_index()


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
    g = g[g["impl"].isin(list(bench.OURS))].copy()
    read = ceilings(report)["read"]
    g["floor_us"] = [floor_us(*shape, read) for shape in zip(g["rows"], g["vocab"], g["dtype"], strict=True)]
    g["of_read_ceiling"] = g["TB_per_s_read"] / read
    cols = ["impl", "dtype", "vocab", "rows", "median_us", "floor_us", "G_logits_per_s", "of_read_ceiling"]
    return g[cols].reset_index(drop=True)


def goal(report: dict, case: str, unit: str) -> dict | None:
    """The report's goal for ``case`` measured in ``unit`` (None when the report judged none)."""
    return next((g for g in report["goals"] if g["case"] == case and g["unit"] == unit), None)


def mask_overhead(report: dict) -> pd.DataFrame:
    """Masked against unmasked kernel per variant: medians, spreads, ``overhead``, overlap."""
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
    """Per draft model and live batch: the rows replayed, how many are padding, and the replay's speedup."""
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
    """Per shape: the judged kernel's median, each vLLM version's, and the speedup over each."""
    wide, versions = medians(report), peer_versions(report)
    if not versions:
        return pd.DataFrame(columns=["dtype", "vocab", "rows", bench.JUDGED])
    speedups = {f"speedup_vs_{v}": wide[bench.peer_impl(v)] / wide[bench.JUDGED] for v in versions}
    cols = ["dtype", "vocab", "rows", bench.JUDGED, *map(bench.peer_impl, versions), *speedups]
    return wide.assign(**speedups)[cols].sort_values(["dtype", "vocab", "rows"]).reset_index(drop=True)


#: A goal's shape, cut from its text to name its family; a rejection goal keeps its mode.
_GOAL_SHAPE = (
    r" at (?:(?:[\d,]+ x )?[\d,]+(?: (?:fp32|bf16))?|B=\d+, k=\d+, V=[\d,]+, (?P<mode>\w+))"
    r"(?P<rest>.*)$"
)


def margin_pct(g: dict) -> float:
    """A judged goal's margin in % of its target (below zero a miss); NaN where it is not a percentage."""
    margin = re.match(r"([+-][\d.]+)%", g["margin"])
    return float(margin.group(1)) if margin else math.nan


def goal_family(g: dict) -> str:
    """What a goal demands, its shape cut out (a rejection goal keeps its mode)."""
    cut = re.sub(_GOAL_SHAPE, lambda m: f" ({m['mode']})" if m["mode"] else m["rest"], g["goal"])
    return cut.replace(", (", " (")


def goal_families(report: dict) -> pd.DataFrame:
    """Goals grouped by what they demand: per family the counts, the worst margin and goal."""
    columns = ["family", "goals", "passed", "missed", "worst_margin_pct", "worst_goal"]
    if not report["goals"]:
        return pd.DataFrame(columns=columns)
    df = pd.DataFrame(report["goals"])[["status", "goal"]]
    df["family"] = [goal_family(g) for g in report["goals"]]
    df["margin_pct"] = [margin_pct(g) for g in report["goals"]]
    df["passed"], df["missed"] = df["status"] == "pass", df["status"] == "miss"
    worst = df.sort_values("margin_pct", kind="stable").groupby("family", sort=False).first()
    out = df.groupby("family", sort=False).agg(
        goals=("goal", "size"), passed=("passed", "sum"), missed=("missed", "sum")
    )
    out["worst_margin_pct"], out["worst_goal"] = worst["margin_pct"], worst["goal"]
    return out.reset_index()[columns]


#: The five small-batch goals, by their ``issue_goal`` number in the report.
SMALL_BATCH = {
    1: "host cost per call",
    2: "back to back per call",
    3: "logits per second",
    4: "drafting steps: no sync, replay = eager",
    5: "mask overhead",
}


def judged_goals(report: dict, number: int) -> list[dict]:
    """The goals of small-batch goal ``number`` that the report judged (passed or missed)."""
    return [g for g in report["goals"] if g.get("issue_goal") == number and g["status"] in ("pass", "miss")]


def _figures(g: dict) -> tuple[str, str]:
    """A judged goal's figure against its target, and vLLM's beside it (in us for a ratio of times)."""
    unit = g["unit"] if g["unit"] in ("x", "%") else f" {g['unit']}"
    beside_unit = "us" if g["unit"] == "x" else g["unit"]
    beside = "; ".join(f"{v}: {x:,.3g} {beside_unit}" for v, x in g.get("vllm", {}).items())
    measured = f"{g['measured']:+.2f}" if g["unit"] == "%" else f"{g['measured']:,.3g}"  # not -0.00884%
    return f"{measured}{unit} (target {g['target']:g}{unit})", beside or "-"


def small_batch_goals(report: dict) -> pd.DataFrame:
    """Per small-batch goal: met (every shape passes) or missed, shapes met, and the worst shape's figures."""
    rows = []
    for number, demand in SMALL_BATCH.items():
        goals = judged_goals(report, number)
        met = sum(g["status"] == "pass" for g in goals)
        shapes = f"{met} of {len(goals)}"
        row = {"goal": number, "demands": demand, "status": "not measured", "shapes met": shapes}
        if goals:
            worst = min(goals, key=lambda g: (g["status"] == "pass", margin_pct(g)))
            measured, beside = _figures(worst)
            status = "met" if met == len(goals) else "missed"
            row |= {"status": status, "worst": worst["goal"], "measured": measured, "vLLM": beside}
            row["margin"] = worst["margin"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("goal")


def rejection_table(report: dict) -> pd.DataFrame:
    """The rejection sampler's median us per (mode, batch) and sampler, at the figure's shape."""
    rj, shape = smallest_rejection_shape(report)
    if rj.empty:
        return pd.DataFrame()
    table = rj.pivot_table(index=["mode", "batch"], columns="impl", values="median_us")
    table = table.rename(columns=lambda c: c.replace("_", " ")).rename_axis(columns=None)
    table = table.map(lambda us: "-" if pd.isna(us) else f"{us:,.1f}")
    table.attrs["shape"] = shape
    return table


def smallest_rejection_shape(report: dict) -> tuple[pd.DataFrame, str]:
    """The rejection case's rows at its smallest k and vocabulary, and that shape in words."""
    rj = bench.frame(report, "rejection")
    shape = {c: rj[c].min() for c in ("k", "vocab") if c in rj}
    for column, value in shape.items():
        rj = rj[rj[column] == value]
    return rj, ", ".join(f"{c} = {v:,}" for c, v in shape.items())


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
    """Every fix of the course: chapters, PR, what breaks without it, and its cost where timed on its own."""
    costs = {}
    clamp = fix_costs(report).query("fix == 'clamp'")
    if len(clamp):
        syncs = clamp.get("host_syncs_per_step")
        syncs = "" if syncs is None else f"; {syncs.max():g} host syncs"
        low, high = clamp["median_us"].min(), clamp["median_us"].max()
        costs["clamp_placeholders"] = f"{low:.0f}-{high:.0f} us a step, launch included{syncs}"
    mo = mask_overhead(report)
    if len(mo):
        costs["mask_invalid_reqs"] = f"{mo['overhead'].max():+.1%} kernel time at most ({len(mo)} variants)"
    table = pd.DataFrame(COURSE, columns=["switch", "chapters", "vLLM PR", "without it"]).set_index("switch")
    table["cost measured here"] = [costs.get(name, "not timed on its own") for name in table.index]
    return table


def floor_text(report: dict) -> str:
    """The judged kernel at 256 x 151,936 fp32 against its floor, and what it means for a serving engine."""
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
        "be cheap to make. bf16 logits halve the bytes, so the same kernel shows fewer TB/s"
        f"{_dtype_rates(floors)}."
    )


def _dtype_rates(floors: pd.DataFrame) -> str:
    """The judged kernel's G logits/s in bf16 against fp32 at 256 and 1,024 rows of 151,936, where timed."""
    at = floors.query("impl == @bench.JUDGED and vocab == 151_936 and rows in (256, 1024)")
    rates = at.pivot_table(index="rows", columns="dtype", values="G_logits_per_s").dropna()
    if not {"bf16", "fp32"} <= set(rates.columns) or rates.empty:
        return ""
    said = ", and ".join(
        f"{r.bf16:.0f} in bf16 against {r.fp32:.0f} in fp32 at {n:,} rows" for n, r in rates.iterrows()
    )
    return f"; in G logits/s at 151,936 logits a row it gets {said}"


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
    each = replay / steps["specfix_triton"]
    ratio = each.groupby("mode").median()
    shapes = sorted({key[1:3] for key in replay.index})  # (k, vocab): one pair in a ci run, two at full
    (k_lo, v_lo), (k_hi, v_hi) = shapes[0], shapes[-1]

    def say(k, v):  # at 1 and 16 requests, or the fewest and the most this report has (a smaller run)
        parts = []
        for m in ("greedy", "random"):
            by_batch = replay.loc[(m, k, v)].sort_index()
            lo = 1 if 1 in by_batch.index else by_batch.index[0]
            hi = 16 if 16 in by_batch.index else by_batch.index[-1]
            req = "request" if lo == 1 else "requests"
            upto = f" and {by_batch[hi]:.0f} at {hi}" if hi != lo else ""
            parts.append(f"{by_batch[lo]:.0f} us at {lo} {req}{upto} ({m})")
        return ", ".join(parts)

    grows = ""
    if len(shapes) > 1:
        grows = (
            f": a fixed cost per call. With more to read per request (k = {k_hi}, {v_hi:,} logits) it grows "
            f"with the batch: {say(k_hi, v_hi)}"
        )
    return (
        f"Goal: *{captured['goal']}*: **{captured['status']}** ({captured['margin'].split('; ')[-1]}). "
        f"Replayed, the step takes {say(k_lo, v_lo)} at k = {k_lo} and {v_lo:,} logits{grows}"
        f". In the median shape a replay takes {ratio['greedy']:.2f} times the eager "
        f"step's time (greedy) and {ratio['random']:.2f} times (random), {each.min():.2f} to "
        f"{each.max():.2f} times over all {len(each)} shapes; an eager step's events also count any wait "
        "for the host that the GPU work queued ahead did not cover (the figure above)."
    )


def core_text(report: dict) -> str:
    """The rejection core's GPU time over the goal's vLLM version's, per mode, over the shapes timed."""
    core, key = bench.frame(report, "rejection"), bench.speedup_key(bench.GOAL_PEER)
    if key not in core:
        return ""
    core = core[core["impl"] == "specfix_core"]
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
        goals = judged_goals(report, number)
        judged = collections.Counter(goal_family(g) for g in goals)
        missed = collections.Counter(goal_family(g) for g in goals if g["status"] == "miss")
        lines += [f"  - *{family}*: {n} of {judged[family]} shapes miss" for family, n in missed.items()]
    return "\n".join(lines)


def host_spread(report: dict) -> pd.DataFrame:
    """Goal 1's shapes, by call and shape: specfix's and vLLM's host us per call, median (p20..p80), and the
    ratio it judges."""
    peer = bench.peer_impl(bench.GOAL_PEER)
    ratio = f"host_ratio_vs_{peer}"
    spread = lambda r: f"{r['median_us']:,.0f} ({r['p20_us']:,.0f}..{r['p80_us']:,.0f})"
    rows = []
    for case in ("gumbel_host", "rejection_host"):
        for ours in (r for r in find(report["results"], case) if ratio in r["metrics"]):
            # the bench timed vLLM at ours' params, its rows named peer + "_<call>" in the rejection case
            call = NAMES.get(ours["impl"])
            (theirs,) = find(report["results"], case, peer + (f"_{call}" if call else ""), **ours["params"])
            shape = {k: v for k, v in ours["params"].items() if k in ("rows", "batch", "k", "vocab")}
            rows.append(
                {
                    "call": call or "gumbel_sample",
                    "shape": ", ".join(f"{k} {v:,}" for k, v in shape.items()),
                    "specfix us": spread(ours),
                    f"vLLM {bench.GOAL_PEER} us": spread(theirs),
                    "ratio": round(ours["metrics"][ratio], 2),
                }
            )
    columns = ["call", "shape", "specfix us", f"vLLM {bench.GOAL_PEER} us", "ratio"]
    return pd.DataFrame(rows, columns=columns).set_index(["call", "shape"])


def host_text(report: dict) -> str:
    """The judged kernel's host cost per call beside the goal's vLLM version's."""
    wide, peer = medians(report, "gumbel_host"), bench.peer_impl(bench.GOAL_PEER)
    if peer not in wide:
        return ""
    gap, times = wide[bench.JUDGED] - wide[peer], wide[bench.JUDGED] / wide[peer]
    lo, hi = gap.min(), gap.max()
    if hi < 0:
        span = f"{-hi:.1f} to {-lo:.1f} us less than"
    elif lo > 0:
        span = f"{lo:.1f} to {hi:.1f} us more than"
    else:
        span = f"from {-lo:.1f} us less to {hi:.1f} us more than"
    return (
        f"A call of `{bench.JUDGED}` costs the host {span} one of vLLM {bench.GOAL_PEER}'s "
        f"({times.min():.2f} to {times.max():.2f} times its host time)."
    )


def speedup_caption(report: dict) -> str:
    """How the median speedup over the shapes changes from the fewest rows to the most, per torch sampler."""
    wide, parts = medians(report), []
    if wide.empty:
        return "No throughput case in this report."
    for ref, name in TORCH_SAMPLERS.items():
        if ref not in wide:
            continue
        median = (wide[ref] / wide[bench.JUDGED]).groupby(wide["rows"]).median()
        lo, hi = median.index.min(), median.index.max()
        trend = "grows" if median[hi] > median[lo] * 1.1 else "stays about the same"
        trend = "falls" if median[hi] < median[lo] / 1.1 else trend
        parts.append(
            f"against {name} the median speedup {trend}, from {median[lo]:.1f}x "
            f"at {lo:,} row{'' if lo == 1 else 's'} to {median[hi]:.1f}x at {hi:,}"
        )
    return ("Over the shapes measured, " + "; ".join(parts) + ".") if parts else "No torch sampler was timed."
