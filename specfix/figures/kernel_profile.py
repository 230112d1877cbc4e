"""Why the Gumbel kernel lands where it does, for chapter 5: its Nsight Compute profile with each case's hot
loop by part (``scripts/profile_gumbel.py``) and a launch sweep against the older kernels
(``scripts/time_gumbel.py --sweep --before``). Read :func:`profile_table` and :func:`before_after` first: the
paragraphs read them.
"""

from __future__ import annotations

import pandas as pd

from specfix.figures import performance as perf
from specfix.figures import style
from specfix.tools import bench

#: The kernels a ``--before`` sweep times beside the default of the code it ran: the multi-tile kernel
#: (a running best per lane) and the first kernel with vLLM's per-tile contract (1-D tiles, a reduction per
#: tile).
SWEEP_KERNELS = {"before: old": "multi_tile_us", "before: head": "first_per_tile_us", "default": "default_us"}
#: What ncu measured per kernel, in the order the chapter reads them.
PROFILE_COLUMNS = tuple(
    "kernel shape store masked register_cap time_us dram_pct_of_peak issue_active_pct "
    "instructions_per_logit registers_per_thread grid_size block_size waves_per_sm "
    "achieved_occupancy_pct stall_long_scoreboard".split()
)
#: The columns the chapter's text reads, under short names (one line each in the book's column).
_PROFILE_NAMES = {
    "time_us": "time, us",
    "dram_pct_of_peak": "DRAM, % of peak",
    "instructions_per_logit": "instr. per logit",
    "registers_per_thread": "registers",
    "achieved_occupancy_pct": "occupancy, %",
}
#: The bf16 shape goal 3 misses by most, the one the profile explains the rate goal's miss at.
GOAL_SHAPE = "1,024 x 151,936 bf16"
#: ncu's stall reasons in plain words (a reason not named here is shown by its own name).
_STALLS = {
    "not_selected": "ready, but the scheduler issued another warp's instruction",
    "math_pipe_throttle": "waiting for a busy execution pipe",
    "wait": "waiting out the fixed latency of an instruction it depends on",
    "long_scoreboard": "waiting for memory",
    "short_scoreboard": "waiting for shared memory or a special-function result",
    "barrier": "waiting at a barrier for the program's other warps",
}


def before_after(sweep: dict) -> pd.DataFrame:
    """Per shape of a ``--before`` sweep, each kernel's time and ``slower`` (default / multi-tile - 1)."""
    df = pd.DataFrame(sweep["configs"])
    df = df[df["config"].isin(list(SWEEP_KERNELS))]
    for config in [c for c in SWEEP_KERNELS if c not in set(df["config"])]:  # in order: the first one missing
        run = "run scripts/time_gumbel.py --sweep --before old=PATH --before head=PATH"
        raise ValueError(f"the sweep has no {config!r} rows: {run}")
    wide = df.pivot_table(index=["dtype", "vocab", "rows"], columns="config", values="us").reset_index()
    wide = wide.rename(columns=SWEEP_KERNELS)
    wide["slower"] = wide["default_us"] / wide["multi_tile_us"] - 1
    return wide.sort_values(["dtype", "vocab", "rows"]).reset_index(drop=True)


def profile_table(profile: dict) -> pd.DataFrame:
    """One row per profiled kernel: the final run's, then the run's before the register cap."""
    rows = profile["kernels"] + profile.get("before_register_cap", [])
    missing = [c for c in PROFILE_COLUMNS if any(c not in r for r in rows)]
    if missing:
        raise ValueError(f"the profile lacks {missing}: record it with scripts/profile_gumbel.py")
    df = pd.DataFrame(rows)
    df = df[list(PROFILE_COLUMNS) + [c for c in df if c.startswith("stall_") and c not in PROFILE_COLUMNS]]
    final = len(profile["kernels"])
    df["run"] = ["final"] * final + ["before the register cap"] * (len(df) - final)
    return df


def profile_summary(profile: dict) -> pd.DataFrame:
    """:func:`profile_table`'s columns that the text reads, a row per kernel under (run, shape, kernel): the
    kernel names its variant (with the processed-logits store, unmasked) where it is not the default."""
    table = profile_table(profile)
    variant = table["store"].map({True: ", store", False: ""}) + table["masked"].map(
        {True: "", False: ", unmasked"}
    )
    shown = table.assign(kernel=table["kernel"] + variant).set_index(["run", "shape", "kernel"])
    return style.tidy(shown[list(_PROFILE_NAMES)].rename(columns=_PROFILE_NAMES), digits=2)


def hot_loop_table(profile: dict) -> pd.DataFrame:
    """Per profiled case (by shape) that has its hot loop: SASS instructions per logit by part and in all,
    beside ncu's count for the whole kernel, how often its schedulers issued, and its time."""
    rows = {
        k["shape"]: {
            **k["hot_loop"]["per_logit"],
            "hot loop": k["hot_loop"]["total_per_logit"],
            "kernel (ncu)": k["instructions_per_logit"],
            "issue active %": k["issue_active_pct"],
            "time (us)": k["time_us"],
        }
        for k in profile["kernels"]
        if "hot_loop" in k
    }
    if not rows:
        raise ValueError("the profile has no hot loop: record it with scripts/profile_gumbel.py")
    return pd.DataFrame.from_dict(rows, orient="index")


def _profiled(prof, shape, kernel="today", store=False, masked=True, run="final") -> pd.Series:
    rows = prof.query(
        "kernel == @kernel and shape == @shape and store == @store and masked == @masked and run == @run"
    )
    if rows.empty:
        raise ValueError(
            f"the profile has no {kernel!r} kernel at {shape} (store={store}, masked={masked}, "
            f"run {run!r}): record it with scripts/profile_gumbel.py --before old=PATH"
        )
    return rows.iloc[0]


def profile_text(profile: dict, sweep: dict) -> str:
    """Why 256 x 32,000 has too little in flight, and what 256 x 151,936 shares with 1,024 rows."""
    prof = profile_table(profile)
    small, big = _profiled(prof, "256 x 32,000 fp32"), _profiled(prof, "256 x 151,936 fp32")
    many = _profiled(prof, "1,024 x 151,936 fp32")
    old_small = {d: _profiled(prof, f"256 x 32,000 {d}", "before: old").time_us for d in ("fp32", "bf16")}
    configs = pd.DataFrame(sweep["configs"])
    at_small = (configs.rows == 256) & (configs.vocab == 32_000) & (configs.dtype == "fp32")
    tried = configs[at_small & ~configs.config.str.startswith("before")].set_index("config")["us"]
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
        f"fp32, the fastest, {tried.idxmin()}, took {tried.min():.1f} us, and the sweep's default "
        f"{tried['default']:.1f} us. The multi-tile kernel is in the same place: {old_small['fp32']:.1f} us "
        f"against {small.time_us:.1f} (fp32), {old_small['bf16']:.1f} against {small_bf16:.1f} (bf16).\n"
        f"- **256 x 151,936: the same kernel over fewer waves.** Each logit costs "
        f"{big.instructions_per_logit:.1f} instructions, schedulers issue in {big.issue_active_pct:.0f}% of "
        f"cycles and DRAM runs at {big.dram_pct_of_peak:.0f}% of its peak. At 1,024 rows "
        f"({many.waves_per_sm:.1f} waves, {many.instructions_per_logit:.1f} instructions per logit) the same "
        f"kernel issues in {many.issue_active_pct:.0f}% of cycles; at 256 rows ({big.waves_per_sm:.1f} "
        "waves) its ramp-up and its last wave weigh more."
    )


def rate_goal_text(profile: dict, report: dict) -> str:
    """Goal 3's miss at the bf16 shape it misses by most: where the instructions go, how often they issue,
    what the warps wait for, and how much faster the bench's rate would have to be."""
    prof, loops = profile_table(profile), hot_loop_table(profile)
    now, old = _profiled(prof, GOAL_SHAPE), _profiled(prof, GOAL_SHAPE, "before: old")
    goals = [g for g in perf.judged_goals(report, 3) if f"at {GOAL_SHAPE}" in g["goal"]]
    if GOAL_SHAPE not in loops.index or not goals:
        raise ValueError(f"the profile's hot loop or the report's goal 3 lacks {GOAL_SHAPE}")
    loop, rates, target = loops.loc[GOAL_SHAPE], [g["measured"] for g in goals], goals[0]["target"]
    need = target / max(rates)  # the kernel's best rate at this shape against the goal
    # time = instructions / issue rate: the goal at today's issue rate, or at today's instructions
    fewer, busier = now.instructions_per_logit / need, now.issue_active_pct * need
    parts = ", ".join(f"{loop[p]:.1f} {p}" for p in loops.columns[: loops.columns.get_loc("hot loop")])
    reasons = now[[c for c in now.index if c.startswith("stall_") and c != "stall_selected"]]
    reasons = reasons.astype(float).sort_values(ascending=False)
    lead = list(reasons.index[:3]) + [r for r in ["stall_long_scoreboard"] if r not in reasons.index[:3]]
    runs = prof.query("kernel == 'before: old' and shape == '1,024 x 151,936 fp32' and not store")
    was = runs.set_index("run").instructions_per_logit.to_dict()  # the older kernel's count, per run
    drifted = ""
    if len(was) == 2 and abs(was["final"] / was["before the register cap"] - 1) > 0.01:
        drifted = (
            f" (at 1,024 x 151,936 fp32 the same older kernel executed {was['before the register cap']:.1f} "
            f"instructions per logit in the run before the register cap and {was['final']:.1f} in this "
            "one: compare it within this run only)"
        )
    said = "; ".join(
        f"*{r[6:].replace('_', ' ')}* {reasons[r]:.2f} ({_STALLS.get(r[6:], r[6:])})" for r in lead
    )
    return (
        f"**Goal 3 at {GOAL_SHAPE}, the bf16 shape it misses by most.** The bench measured "
        f"{min(rates):,.0f} to {max(rates):,.0f} G logits/s there (with and without the temperature) against "
        f"{target:,.0f}: the kernel has to get at least {need:.2f}x faster. Its hot loop spends "
        f"{loop['hot loop']:.1f} SASS instructions per logit ({parts}); ncu counts "
        f"{now.instructions_per_logit:.1f} for the whole kernel, the row's setup and final reductions "
        f"included; the multi-tile kernel profiled beside it executes {old.instructions_per_logit:.1f}"
        f"{drifted}. DRAM runs at {now.dram_pct_of_peak:.0f}% of its peak and the schedulers issue in "
        f"{now.issue_active_pct:.0f}% of cycles: the kernel is neither bound by memory nor issuing in every "
        f"cycle. Its leading stall reasons, in warps waiting per cycle that issued: {said}. At this shape "
        "the limit is how fast the schedulers and the execution pipes get through "
        f"{loop['hot loop']:.0f} instructions per logit. If the time is the instructions over the issue "
        f"rate, {target:,.0f} G logits/s would take about {fewer:.0f} instructions per logit at today's "
        f"issue rate, or issuing in {busier:.0f}% of cycles at today's count."
    )


def mask_profile_text(profile: dict) -> str:
    """The masked and unmasked kernels with the processed-logits store, per profiled run."""
    prof, lines = profile_table(profile), []
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
        ipl = uncapped.instructions_per_logit, capped.instructions_per_logit
        other = (  # the final run's code changed beyond the cap where its instruction count did
            f", whose code differs in more than the cap ({ipl[0]:.1f} and {ipl[1]:.1f} instructions per "
            "logit): these runs do not separate what the cap gave"
        )
        lines.append(
            f"\nWithout the store, at 256 x 151,936 fp32: {uncapped.time_us:.1f} us before the cap, "
            f"{capped.time_us:.1f} us in the final run{other if abs(ipl[1] / ipl[0] - 1) > 0.01 else ''}."
        )
    return "\n".join(lines)


def sweep_text(sweep: dict, report: dict) -> str:
    """The sweep's default kernel (the code it ran, older than today's where its label says so) against the
    multi-tile and the first per-tile kernel, from a ``--before`` sweep."""
    ba = before_after(sweep)
    big, graph = ba[ba["rows"] >= 256], {g["config"]: g["us_per_call"] for g in sweep["graph_one_row"]}
    first = big.first_per_tile_us / big.multi_tile_us - 1
    now = bench.frame(report, "gumbel_graph")
    if len(now):
        now = now[(now.impl == bench.JUDGED) & (now.rows == 1) & (now.vocab == 248_320)]["median_us"]
    per_dtype = "; ".join(
        f"{d} {x.slower.min():+.1%} to {x.slower.max():+.1%}" for d, x in big.groupby("dtype")
    )
    return (
        f"At 256 rows and more the time of the default kernel when the sweep was recorded differed from the "
        f"multi-tile kernel's by {per_dtype} (faster at {(big.slower < 0).sum()} of {len(big)} shapes; at "
        f"{(ba.slower < 0).sum()} of all {len(ba)}), where the first per-tile kernel's differed by "
        f"{first.min():+.0%} to {first.max():+.0%}. "
        f"One row of 248,320 in a graph: {graph['before: old']:.2f} us (multi-tile), "
        f"{graph['before: head']:.2f} us (first per-tile), {graph['256 programs b512 w1']:.2f} us with "
        "the launch the kernel uses today for up to 4 rows (one-warp programs; the bench above, today's "
        f"code: {now.iloc[0] if len(now) else float('nan'):.2f} us)."
    )
