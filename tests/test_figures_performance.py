"""Chapter 5's figures and tables: content read from the report, legends off the data, tick labels apart."""

import itertools
import json

import matplotlib.pyplot as plt
import pytest
from matplotlib import colors

from specfix.figures import kernel_profile, style
from specfix.figures import performance as perf
from specfix.figures import performance_figures as figs
from specfix.lab.placeholder_fixes import FIXES, LABELS
from specfix.tools import bench, recorded

H200 = recorded.load("bench_h200")
SOURCE = "test source label"
FIGURES = [name for name in vars(figs) if name.endswith("_figure")]


def _report(results, device="cuda", goals=()):
    return {
        "config": {"device": device},
        "results": results,
        "goals": list(goals),
        "unavailable": [],
        "errors": [],
    }


def _result(case, impl, median, **params_and_metrics):
    metrics = {k: params_and_metrics.pop(k) for k in list(params_and_metrics) if k in _METRICS}
    return bench.result(case, impl, params_and_metrics, [median * 0.9, median, median * 1.1], **metrics)


_METRICS = {"overhead", "speedup", "host_syncs_per_step", "host_us_behind_busy_gpu", "TB_per_s"}


def _assert_legends_outside_the_axes(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    for legend, ax in itertools.product(legends, [ax for ax in fig.axes if ax.axison]):
        assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer)), (
            f"legend over the data of {ax.get_title()!r}"
        )


def _inside(box, area, axis_name):
    """Whether a tick label's centre lies along the axes (labels of ticks outside the view are not drawn)."""
    if axis_name == "x":
        return area.x0 - 1 <= (box.x0 + box.x1) / 2 <= area.x1 + 1
    return area.y0 - 1 <= (box.y0 + box.y1) / 2 <= area.y1 + 1


def _assert_tick_labels_apart(fig):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in [ax for ax in fig.axes if ax.axison]:
        area = ax.get_window_extent(renderer)
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            labels = axis.get_ticklabels() + axis.get_ticklabels(minor=True)
            boxes = [t.get_window_extent(renderer) for t in labels if t.get_visible() and t.get_text()]
            boxes = [b for b in boxes if _inside(b, area, name)]
            for a, b in itertools.combinations(boxes, 2):
                assert not a.overlaps(b), f"tick labels collide on {ax.get_ylabel() or ax.get_xlabel()!r}"


def _caption(fig):
    return [t.get_text() for t in fig.texts if t.get_style() == "italic"]


@pytest.mark.parametrize("name", FIGURES)
def test_each_figure_of_the_recording_is_captioned_labelled_and_readable(name):
    fig = getattr(figs, name)(H200, SOURCE)
    try:
        assert len(_caption(fig)) == 1 and len(_caption(fig)[0]) > 40
        assert SOURCE in " ".join(fig._suptitle.get_text().split("\n"))  # wrapped to the figure's width
        _assert_legends_outside_the_axes(fig)
        _assert_tick_labels_apart(fig)
        seen = style.legibility(fig)  # drawn for the book's column
        assert seen["natural_px"] <= style.COLUMN_PX and seen["smallest_pt"] >= style.SMALLEST_PT, seen
    finally:
        plt.close(fig)


@pytest.mark.parametrize("name", FIGURES)
def test_each_figure_says_what_an_empty_report_lacks(name):
    empty = _report([], device="cpu")
    empty["unavailable"] = [{"case": c, "reason": "module missing"} for c in bench.CASES]
    fig = getattr(figs, name)(empty, SOURCE)
    try:
        texts = [t.get_text() for ax in fig.axes for t in ax.texts]
        assert texts and all("not measured" in t for t in texts)
    finally:
        plt.close(fig)


def test_fix_costs_reads_the_bench_recording_with_the_chapters_names():
    costs = perf.fix_costs()
    results = json.loads((recorded.RECORDED_DIR / "bench_h200.json").read_text())["results"]
    raw = [r for r in results if r["case"] == "placeholder_fixes"]
    assert len(costs) == len(raw)
    assert list(dict.fromkeys(costs["fix"])) == [f for f in FIXES if f in set(costs["fix"])]
    assert (costs["label"] == costs["fix"].map(LABELS)).all()
    for r in raw:
        row = costs[(costs["fix"] == r["impl"]) & (costs["num_tokens"] == r["params"]["num_tokens"])]
        assert row["median_us"].item() == r["median_us"]
        assert row["host_syncs_per_step"].item() == r["metrics"]["host_syncs_per_step"]


def test_fix_costs_refuses_a_fix_it_cannot_name():
    report = _report([_result("placeholder_fixes", "clamp_twice", 3.0, num_tokens=256, k=3)])
    with pytest.raises(ValueError, match="clamp_twice"):
        perf.fix_costs(report)


def test_floor_is_bytes_over_the_read_ceiling():
    assert perf.floor_us(1, 1_000_000, "fp32", 4.0) == pytest.approx(1.0)  # 4 MB at 4 MB/us
    assert perf.floor_us(2, 1_000_000, "bf16", 4.0) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="dtype"):
        perf.floor_us(1, 10, "fp64", 4.0)
    with pytest.raises(ValueError, match="read_tb_per_s"):
        perf.floor_us(1, 10, "fp32", 0.0)


def test_mask_overhead_says_whether_the_spreads_overlap():
    params = {"vocab": 8, "rows": 2, "dtype": "fp32"}
    report = _report(
        [
            _result("gumbel_mask", "masked", 100.0, store_processed_logits=False, overhead=0.01, **params),
            _result("gumbel_mask", "unmasked", 99.0, store_processed_logits=False, **params),
            _result("gumbel_mask", "masked", 50.0, store_processed_logits=True, overhead=-0.5, **params),
            _result("gumbel_mask", "unmasked", 100.0, store_processed_logits=True, **params),
        ]
    )
    table = perf.mask_overhead(report).set_index("store_processed_logits")
    assert table.loc[False, "spreads_overlap"] and not table.loc[True, "spreads_overlap"]
    assert table.loc[True, "overhead"] == -0.5


def test_mask_figure_draws_the_goal_as_an_upper_bound():
    fig = figs.mask_figure(H200, SOURCE)
    try:
        (ax,) = fig.axes
        target = perf.goal(H200, "gumbel_mask", "%")["target"]
        spans = [p for p in ax.patches if p.get_label().startswith("misses the goal")]
        assert len(spans) == 1
        assert spans[0].get_y() == pytest.approx(target) and spans[0].get_height() > 0
        bars = [p for p in ax.patches if p not in spans]
        assert len(bars) == len(perf.mask_overhead(H200))
    finally:
        plt.close(fig)


def test_padding_price_counts_the_padded_rows():
    rows = [
        _result("drafter_graph", "graph", 10.0, live_batch=5, padded_batch=8, model="m", speedup=3.0),
        _result("drafter_graph", "graph", 10.0, live_batch=8, padded_batch=8, model="m", speedup=2.0),
        _result("drafter_graph", "eager", 30.0, live_batch=5, padded_batch=8, model="m"),
    ]
    price = perf.padding_price(_report(rows))
    assert price[["live_batch", "padded_rows"]].values.tolist() == [[5, 3], [8, 0]]
    assert price["padded_fraction"].tolist() == [3 / 8, 0.0]


def test_fix_costs_figure_has_one_line_per_fix_in_each_panel():
    fig = figs.fix_costs_figure(H200, SOURCE)
    try:
        fixes = perf.fix_costs(H200)["fix"].nunique()
        assert [len(ax.get_lines()) >= fixes for ax in fig.axes] == [True, True]
        assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in fig.axes)
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert "clamp (a), 0 host sync / step" in legend and "host_mask (b), 1 host sync / step" in legend
    finally:
        plt.close(fig)


def test_peer_table_puts_each_vllm_version_beside_the_judged_kernel_at_every_shape():
    table = perf.peer_table(H200)
    raw = [r for r in H200["results"] if r["case"] == "gumbel" and r["impl"] == bench.JUDGED]
    assert perf.peer_versions(H200) and len(table) == len(raw)
    for r in raw:
        p = r["params"]
        row = table[
            (table["rows"] == p["rows"]) & (table["vocab"] == p["vocab"]) & (table["dtype"] == p["dtype"])
        ]
        assert row[bench.JUDGED].item() == r["median_us"]
        for v in perf.peer_versions(H200):
            assert row[f"speedup_vs_{v}"].item() == pytest.approx(r["metrics"][bench.speedup_key(v)])


def test_peer_figure_draws_every_version_and_the_read_ceiling_in_each_panel():
    fig = figs.peer_figure(H200, SOURCE)
    try:
        versions = perf.peer_versions(H200)
        for ax in fig.axes:
            labels = [line.get_label() for line in ax.get_lines()]
            assert [lab for lab in labels if lab.startswith("vLLM")] == [
                f"vLLM {v} gumbel_sample" for v in reversed(versions)
            ]
            assert sum(lab.startswith("read ceiling") for lab in labels) == 1
        title = fig._suptitle.get_text().split("\n")[0]
        assert title.startswith(f"{bench.JUDGED} beside vLLM ") and all(v in title for v in versions)
        # versions whose times coincide stay apart: each its own marker and line style, hollow
        vllm = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("vLLM")]
        assert len({(line.get_marker(), line.get_linestyle()) for line in vllm}) == len(versions)
        assert all(line.get_markerfacecolor() == "none" for line in vllm)
    finally:
        plt.close(fig)


def _series_colours(fig) -> dict:
    """Each drawn line's or bar's colour by its label ("_" labels: the unlabelled data lines)."""
    seen = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            seen.setdefault(line.get_label(), set()).add(colors.to_hex(line.get_color()))
        for bars in ax.containers:
            for bar in getattr(bars, "patches", []):
                seen.setdefault(bars.get_label(), set()).add(colors.to_hex(bar.get_facecolor()))
    return seen


@pytest.mark.parametrize("name", ["bandwidth_figure", "throughput_figure", "speedup_figure"])
def test_the_gumbel_figures_colour_by_vocabulary_and_draw_goals_in_no_data_colour(name):
    fig = getattr(figs, name)(H200, SOURCE)
    try:
        vocabs = sorted(bench.frame(H200, "gumbel")["vocab"].unique())
        shades = figs.vocab_colours(vocabs)
        assert len(set(shades.values())) == len(vocabs)
        data = {line.get_color() for ax in fig.axes for line in ax.get_lines() if line.get_label()[0] == "_"}
        data = {colors.to_hex(c) for c in data} - {colors.to_hex(style.CEILING)}  # the speedup's 1x line
        assert data == set(shades.values())
        goals = [line for ax in fig.axes for line in ax.get_lines() if line.get_label().startswith("goal")]
        assert all(colors.to_hex(line.get_color()) == colors.to_hex(style.CEILING) for line in goals)
        assert name == "bandwidth_figure" or goals
        assert style.FIXED not in {colors.to_hex(c) for c in data}
        legend = fig.legends[0] if fig.legends else fig.axes[0].get_legend()
        assert len(legend.get_texts()) <= len(vocabs) + 6  # a key, not one entry per series
    finally:
        plt.close(fig)


def test_the_graph_call_figure_gives_each_sampler_its_own_colour():
    fig = figs.graph_call_figure(H200, SOURCE)
    try:
        impls = list(dict.fromkeys(bench.frame(H200, "gumbel_graph")["impl"]))
        seen = _series_colours(fig)
        assert all(len(seen[i]) == 1 for i in impls) and len({seen[i].pop() for i in impls}) == len(impls)
        assert figs.impl_colours(impls)[bench.JUDGED] == colors.to_hex(style.NEUTRAL)
        assert "dark blue" in _caption(fig)[0] and "purple vLLM" in _caption(fig)[0]
    finally:
        plt.close(fig)


def test_the_drafter_and_padding_figures_give_a_model_the_same_colour():
    drafter, price = figs.drafter_figure(H200, SOURCE), figs.padding_price_figure(H200, SOURCE)
    try:
        first = {k.split(":")[0]: v for k, v in _series_colours(drafter).items() if ":" in k}
        second = {k.removeprefix("speedup, "): v for k, v in _series_colours(price).items() if "," in k}
        assert second and all(second[m] == first[m] for m in second)
        once = {r["params"]["model"] for r in H200["results"] if r["impl"] == "dflash_eager"}
        assert once and not once & set(first)  # timed once, for a goal: said in the caption, not drawn
        assert all(m in _caption(drafter)[0] for m in once)
    finally:
        plt.close(drafter)
        plt.close(price)


def test_the_source_line_says_once_where_the_numbers_were_taken():
    meta = H200["meta"]
    _, line = perf.load_report(False, "ci")
    assert line.lower().count("recorded") == 1 and line.count(meta["device"]) == 1
    assert line.endswith("(not on this machine)") and meta["commit"][:7] in line and "RECORDED" not in line
    live = perf.source_line(meta, live=True)
    assert live.startswith("Measured live on this machine: ") and "recorded" not in live.lower()


def test_peer_table_is_empty_without_a_vllm_sampler():
    report = _report([_result("gumbel", bench.JUDGED, 5.0, vocab=8, rows=1, dtype="fp32")])
    assert perf.peer_versions(report) == [] and perf.peer_table(report).empty


def test_goal_families_cut_the_shape_and_keep_the_worst_margin():
    def g(goal, status, margin):
        return {"case": "c", "goal": goal, "status": status, "margin": margin}

    core = "rejection core <= 1.0x vLLM's GPU time at B=1, k=1, V=32,000"
    report = _report(
        [],
        goals=[
            g("fast >= 700 G logits/s at 256 x 151,936 fp32", "miss", "-21.0% vs target"),
            g("fast >= 700 G logits/s at 1,024 x 151,936 bf16", "pass", "+9.6% vs target"),
            g(f"{core}, greedy", "miss", "-10.8% vs target"),
            g(f"{core}, random", "pass", "+0.1% vs target"),
            g("the clamp makes no host synchronisation (any token count)", "pass", "+0 syncs/step vs target"),
        ],
    )
    table = perf.goal_families(report).set_index("family")
    assert list(table.index) == [
        "fast >= 700 G logits/s",
        "rejection core <= 1.0x vLLM's GPU time (greedy)",
        "rejection core <= 1.0x vLLM's GPU time (random)",
        "the clamp makes no host synchronisation (any token count)",
    ]
    first = table.loc["fast >= 700 G logits/s"]
    assert (first["goals"], first["passed"], first["missed"], first["worst_margin_pct"]) == (2, 1, 1, -21.0)
    assert first["worst_goal"].endswith("256 x 151,936 fp32")
    assert table["worst_margin_pct"].isna().tolist() == [False, False, False, True]


def test_before_after_compares_the_older_kernels_with_the_default_per_shape():
    row = {"rows": 256, "vocab": 32_000, "dtype": "fp32"}
    sweep = {
        "configs": [
            {**row, "config": "before: old", "us": 20.0},
            {**row, "config": "before: head", "us": 30.0},
            {**row, "config": "default", "us": 25.0},
            {**row, "config": "row per program b2048 w8", "us": 90.0},
        ]
    }
    (only,) = kernel_profile.before_after(sweep).to_dict("records")
    assert (only["multi_tile_us"], only["first_per_tile_us"], only["default_us"]) == (20.0, 30.0, 25.0)
    assert only["slower"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="no 'before: old' rows"):
        kernel_profile.before_after({"configs": [{**row, "config": "default", "us": 25.0}]})
    older = [{**row, "config": config, "us": 25.0} for config in ("before: old", "before: head")]
    with pytest.raises(ValueError, match="no 'default' rows"):
        kernel_profile.before_after({"configs": older})


def test_profile_table_reads_both_runs_of_the_recorded_profile():
    profile = recorded.load("gumbel_ncu_h200")
    table = kernel_profile.profile_table(profile)
    assert len(table) == len(profile["kernels"]) + len(profile["before_register_cap"])
    assert set(table["run"]) == {"final", "before the register cap"}
    final = table[(table.run == "final") & (table.kernel == "today")]
    assert (final["registers_per_thread"] <= final["register_cap"]).all()  # the cap held in the final run
    assert (table["time_us"] > 1).all() and (table["time_us"] < 1e4).all()  # microseconds, not ns
    with pytest.raises(ValueError, match="lacks"):
        kernel_profile.profile_table({"kernels": [{"kernel": "today"}]})


def test_chapter_5_texts_are_rendered_from_the_recordings():
    profile, sweep = recorded.load("gumbel_ncu_h200"), recorded.load("gumbel_sweep_before_after_h200")
    table = kernel_profile.profile_table(profile)
    today = table[(table.run == "final") & (table.kernel == "today")].set_index("shape").iloc[0]
    text = kernel_profile.profile_text(profile, sweep)
    assert f"{today.grid_size:,.0f} programs" in text and f"{today.waves_per_sm:.2f} of one wave" in text
    masked = kernel_profile.mask_profile_text(profile)
    uncapped = table[(table.run != "final") & table.store & table.masked].iloc[0]
    assert masked.count("- ") == 2  # before the cap, then capped
    assert f"{uncapped.registers_per_thread:.0f} registers" in masked.split("\n")[0]
    # where the final run changed more than the cap (its instructions per logit), the text does not credit it
    unstored = table[~table.store & (table.kernel == "today") & (table["shape"] == "256 x 151,936 fp32")]
    ipl = unstored.set_index("run").instructions_per_logit
    changed = abs(ipl["final"] / ipl["before the register cap"] - 1) > 0.01
    assert ("do not separate what the cap gave" in masked) == changed and "The cap helped" not in masked
    no_history = dict(profile, before_register_cap=[])
    assert kernel_profile.mask_profile_text(no_history).count("- ") == 1
    ba = kernel_profile.before_after(sweep)
    said = kernel_profile.sweep_text(sweep, H200)
    assert f"at {(ba.slower < 0).sum()} of all {len(ba)}" in said
    # the sweep ran older code than today's (its label says so): its default is not called today's kernel
    assert "OLDER CODE" in recorded.label(sweep["meta"]) and "today's kernel" not in said
    assert said.startswith("At 256 rows and more the time of the default kernel when the sweep was recorded")
    graph = perf.rejection_graph_text(H200)
    assert graph.startswith("Goal: *RejectionSampler.forward captured") and "at 16 (random)" in graph
    # in every shape the replay takes most of the eager step's time: the range is said, no "much longer"
    steps = bench.frame(H200, "rejection").pivot_table(
        index=["mode", "k", "vocab", "batch"], columns="impl", values="median_us"
    )
    each = steps["specfix_triton_graph"] / steps["specfix_triton"]
    assert each.min() > 0.8 and "much longer" not in graph
    assert f"{each.min():.2f} to {each.max():.2f} times over all {len(each)} shapes" in graph
    cpu = {**H200, "results": [r for r in H200["results"] if r["impl"] != "specfix_triton_graph"]}
    assert perf.rejection_graph_text(cpu).startswith("This report has no captured verification step")
    # a smaller run (the GPU at ci scale) has other batches: the text names the fewest and the most it has
    few = [r for r in H200["results"] if r["case"] != "rejection" or r["params"]["batch"] not in (1, 16)]
    batches = sorted({r["params"]["batch"] for r in few if r["case"] == "rejection"})
    text = perf.rejection_graph_text({**H200, "results": few})
    assert f"at {batches[0]} requests and" in text and f"at {batches[-1]} (random)" in text
    # the GPU's ci run: one k, one vocab, one batch (the text once unpacked two (k, vocab) pairs from it)
    ci_shape = lambda p: (p["k"], p["vocab"], p["batch"]) == (5, 151_936, 64)
    ci = [r for r in H200["results"] if r["case"] != "rejection" or ci_shape(r["params"])]
    text = perf.rejection_graph_text({**H200, "results": ci})
    assert "at 64 requests (greedy)" in text and "at k = 5 and 151,936" in text
    assert "grows with the batch" not in text
    with pytest.raises(ValueError, match="before: old"):
        only_today = [k for k in profile["kernels"] if k["kernel"] == "today"]
        kernel_profile.profile_text({**profile, "kernels": only_today}, sweep)


def test_speedup_caption_and_goal_3_paragraph_say_what_the_recordings_show():
    """The speedup over softmax + multinomial falls with the rows on the H200 (it once said it grew), and
    goal 3's paragraph names its shape as the bf16 one goal 3 misses by most and sets the two kernels'
    instruction counts side by side without their ncu times (one launch each, far apart from the sweep's
    times of the two, and an earlier profile had the older kernel the faster one)."""
    g = bench.frame(H200, "gumbel")
    wide = g.pivot_table(index=["dtype", "vocab", "rows"], columns="impl", values="median_us").reset_index()
    caption = perf.speedup_caption(H200)
    for ref, name in (
        ("torch_softmax_multinomial", "softmax + multinomial"),
        ("torch_gumbel_max", "torch's Gumbel-max"),
    ):
        by_rows = (wide[ref] / wide[bench.JUDGED]).groupby(wide["rows"]).median()
        first, last = by_rows.iloc[0], by_rows.iloc[-1]
        verb = "grows" if last > first * 1.1 else "falls" if last < first / 1.1 else "stays about the same"
        assert f"against {name} the median speedup {verb}, from {first:.1f}x" in caption
    prof = kernel_profile.profile_table(recorded.load("gumbel_ncu_h200"))
    final = prof[(prof.run == "final") & (prof["shape"] == kernel_profile.GOAL_SHAPE) & ~prof.store]
    new, old = (final[final.kernel == k].iloc[0] for k in ("today", "before: old"))
    text = kernel_profile.rate_goal_text(recorded.load("gumbel_ncu_h200"), H200)
    bf16 = [g for g in H200["goals"] if g.get("issue_goal") == 3 and "bf16" in g["goal"]]
    worst = min(bf16, key=lambda g: g["measured"] / g["target"])
    assert f"at {kernel_profile.GOAL_SHAPE}" in worst["goal"]
    assert text.startswith(f"**Goal 3 at {kernel_profile.GOAL_SHAPE}, the bf16 shape it misses by most.**")
    assert f"ncu counts {new.instructions_per_logit:.1f}" in text
    assert f"profiled beside it executes {old.instructions_per_logit:.1f}" in text
    assert f"{old.time_us:.1f}" not in text and "less time" not in text and "own shape" not in text


def test_chapter_5_paragraphs_are_rendered_from_the_report():
    floors = perf.floor_table(H200)
    s = floors.query("impl == @bench.JUDGED and rows == 256 and vocab == 151_936 and dtype == 'fp32'").iloc[0]
    assert f"the floor is **{s.floor_us:.1f} us**" in perf.floor_text(H200)
    assert perf.floor_text({**H200, "results": []}) == ""
    mask = perf.mask_overhead(H200)
    text = perf.mask_text(H200)
    assert text.count("\n- ") == len(mask) and f"{mask.overhead.iloc[0]:+.1%}" in text
    price = perf.padding_price(H200)
    text = perf.padding_price_text(H200)
    assert f"From live batch {price.live_batch.min()} to {price.live_batch.max()}" in text
    assert perf.core_text(H200).startswith(f"The rejection core's GPU time over vLLM {bench.GOAL_PEER}'s")
    assert perf.peer_text(H200).count("- beside vLLM ") == len(perf.peer_versions(H200))
    assert perf.peer_text({**H200, "results": []}).startswith("This report has no vLLM sampler")
    families = perf.goal_families(H200)
    assert perf.missed_goals_text(H200).count("- *") == int((families.missed > 0).sum())
    # at every shape the call costs the host less than vLLM's: said as "less", not as a negative cost
    host = bench.frame(H200, "gumbel_host").pivot_table(
        index=["dtype", "vocab", "rows"], columns="impl", values="median_us"
    )
    gap = host[bench.JUDGED] - host[bench.peer_impl(bench.GOAL_PEER)]
    assert (gap < 0).all()
    said = perf.host_text(H200)
    assert said.startswith(
        f"A call of `{bench.JUDGED}` costs the host {-gap.max():.1f} to {-gap.min():.1f} us less"
    )
    assert "-" not in said.split("costs the host")[1].split("us")[0]
    # bf16 against fp32 at 151,936 a row: bf16 gets more logits per second at 256 rows, fewer at 1,024
    rate = bench.frame(H200, "gumbel").query("impl == @bench.JUDGED and vocab == 151_936")
    rate = rate.pivot_table(index="rows", columns="dtype", values="G_logits_per_s")
    assert rate.loc[256, "bf16"] > rate.loc[256, "fp32"] and rate.loc[1024, "bf16"] < rate.loc[1024, "fp32"]
    floor = perf.floor_text(H200)
    assert "consuming more logits per second" not in floor
    for rows in (256, 1024):
        r = rate.loc[rows]
        assert f"{r.bf16:.0f} in bf16 against {r.fp32:.0f} in fp32 at {rows:,} rows" in floor


def test_rejection_table_fits_the_page_one_row_per_mode_and_batch():
    table = perf.rejection_table(H200)
    rows = bench.frame(H200, "rejection")
    small = rows[(rows.k == rows.k.min()) & (rows.vocab == rows.vocab.min())]
    assert len(table) == small.groupby(["mode", "batch"]).ngroups < len(rows)  # not the raw dump
    assert len(table.columns) == small.impl.nunique()
    assert table.attrs["shape"] == f"k = {rows.k.min()}, vocab = {rows.vocab.min():,}"
    one = small[(small.impl == "torch_reference") & (small["mode"] == "greedy")].sort_values("batch").iloc[0]
    assert table.loc[("greedy", one.batch), "torch reference"] == f"{one.median_us:,.1f}"
    cells = table.to_numpy().ravel()
    assert all(cell == "-" or cell.replace(",", "").replace(".", "").isdigit() for cell in cells)
    assert perf.rejection_table({"results": [], "goals": []}).empty


def test_profile_summary_shows_the_columns_the_text_reads_formatted():
    profile = recorded.load("gumbel_ncu_h200")
    full, shown = kernel_profile.profile_table(profile), kernel_profile.profile_summary(profile)
    assert len(shown) == len(full) and len(shown.columns) < len(full.columns)
    assert {"time, us", "registers", "occupancy, %"} <= set(shown.columns)
    registers = shown["registers"].tolist()
    assert registers == [f"{n:,.0f}" for n in full["registers_per_thread"]]  # counts: 95, not 95.0
    # the masked and unmasked kernels with the store share kernel, shape, store and run: the index parts them
    keys = ["kernel", "shape", "store", "run"]
    assert full.duplicated(keys).any() and shown.index.is_unique
    assert list(shown.index.names) == ["run", "shape", "kernel"]
    stored = full[full["store"] & ~full["masked"]].iloc[0]
    assert (stored["run"], stored["shape"], f"{stored['kernel']}, store, unmasked") in shown.index


def _kernel(kernel: str, shape: str, **metrics) -> dict:
    """A profiled kernel with every column profile_table requires, ``metrics`` over the defaults."""
    row = dict.fromkeys(kernel_profile.PROFILE_COLUMNS, 1.0)
    return row | {"kernel": kernel, "shape": shape, "store": False, "masked": True, **metrics}


_LOOP = {"hash": 12.0, "logarithms": 9.0, "argmax": 4.0, "logits in": 3.0, "loop": 0.5}
_STALLED = dict(stall_not_selected=2.0, stall_math_pipe_throttle=1.5, stall_wait=0.5, stall_selected=1.0)
_PROFILE = {
    "kernels": [
        _kernel(
            "today",
            kernel_profile.GOAL_SHAPE,
            hot_loop={"per_logit": _LOOP, "total_per_logit": 28.5},
            instructions_per_logit=30.0,
            issue_active_pct=80.0,
            dram_pct_of_peak=35.0,
            time_us=200.0,
            stall_long_scoreboard=0.25,
            stall_barrier=0.1,
            **_STALLED,
        ),
        _kernel("before: old", kernel_profile.GOAL_SHAPE, instructions_per_logit=36.0, time_us=240.0),
    ]
}


def _rate_goal(measured: float, temperature: bool) -> dict:
    text = f"fast >= 1000 G logits/s at {kernel_profile.GOAL_SHAPE}, apply_temperature={temperature}"
    return {"goal": text, "issue_goal": 3, "status": "miss", "measured": measured, "target": 1000.0}


def test_hot_loop_table_has_one_row_per_kernel_with_a_hot_loop():
    table = kernel_profile.hot_loop_table(_PROFILE)  # the old kernel has no hot loop: one row
    assert table.index.tolist() == ["1,024 x 151,936 bf16"]
    assert table.iloc[0].to_dict() == {
        **_LOOP,
        "hot loop": 28.5,
        "kernel (ncu)": 30.0,
        "issue active %": 80.0,
        "time (us)": 200.0,
    }
    with pytest.raises(ValueError, match="no hot loop"):
        kernel_profile.hot_loop_table({"kernels": _PROFILE["kernels"][1:]})


def test_rate_goal_text_explains_goal_3_from_the_profile_and_the_bench():
    report = {"goals": [_rate_goal(800.0, False), _rate_goal(750.0, True)]}
    text = kernel_profile.rate_goal_text(_PROFILE, report)
    assert "750 to 800 G logits/s" in text and "at least 1.25x faster" in text  # 1000 / 800
    assert (
        "28.5 SASS instructions per logit (12.0 hash, 9.0 logarithms, 4.0 argmax, 3.0 logits in, 0.5 loop)"
        in text
    )
    assert "ncu counts 30.0" in text and "the multi-tile kernel profiled beside it executes 36.0" in text
    assert "240.0" not in text  # one ncu launch each: the count is compared, not the time
    assert "DRAM runs at 35% of its peak" in text and "issue in 80% of cycles" in text
    # the three leading reasons by size, then memory; "selected" is the issuing warp, not a stall
    said = [text.index(f"*{r}* {x}") for r, x in (("not selected", "2.00"), ("math pipe throttle", "1.50"))]
    said += [text.index("*wait* 0.50"), text.index("*long scoreboard* 0.25 (waiting for memory)")]
    assert said == sorted(said) and "*selected*" not in text and "barrier" not in text
    assert "about 24 instructions per logit" in text  # 30 / 1.25
    assert "issuing in 100% of cycles" in text  # 80 x 1.25
    assert "compare it within this run only" not in text  # no earlier run to set the old kernel beside
    # the older kernel's count at 1,024 x 151,936 fp32 moved between the runs: the text says so
    old_fp32 = lambda n: _kernel("before: old", "1,024 x 151,936 fp32", instructions_per_logit=n)
    drifted = {"kernels": [*_PROFILE["kernels"], old_fp32(36.0)], "before_register_cap": [old_fp32(30.0)]}
    assert "executed 30.0 instructions per logit in the run before the register cap and 36.0 in this one" in (
        kernel_profile.rate_goal_text(drifted, report)
    )
    with pytest.raises(ValueError, match="goal 3 lacks"):
        kernel_profile.rate_goal_text(_PROFILE, {"goals": []})


def test_goal_3_paragraph_reads_what_the_recording_shows():
    """The paragraph says goal 3's shape is bound by neither memory nor issue, led by warps not selected."""
    profile = recorded.load("gumbel_ncu_h200")
    table = kernel_profile.profile_table(profile)
    now = table.query("kernel == 'today' and shape == @kernel_profile.GOAL_SHAPE and ~store").iloc[0]
    assert now.dram_pct_of_peak < 50 and now.issue_active_pct < 90  # "neither bound by memory nor issuing..."
    reasons = {c: now[c] for c in table if c.startswith("stall_") and c != "stall_selected"}
    assert max(reasons, key=reasons.get) == "stall_not_selected"
    text = kernel_profile.rate_goal_text(profile, H200)
    assert f"that issued: *not selected* {now.stall_not_selected:.2f}" in text
    old = table[(table.kernel == "before: old") & (table["shape"] == "1,024 x 151,936 fp32")]
    was = old.set_index("run").instructions_per_logit
    moved = abs(was["final"] / was["before the register cap"] - 1) > 0.01
    assert (f"executed {was['before the register cap']:.1f} instructions per logit" in text) == moved


def test_the_drafter_figure_gives_each_drafter_its_own_colour():
    """The bench times three drafters (two toy draft models and DFlash's): each gets a colour of its own."""
    models = ("toy_dflash", "toy_draft", "toy_draft_small")
    rows = [
        _result("drafter_graph", impl, 10.0 * (1 + i), live_batch=b, padded_batch=8, model=m)
        for i, m in enumerate(models)
        for impl in ("graph", "eager")
        for b in (4, 8)
    ]
    fig = figs.drafter_figure(_report(rows), SOURCE)
    lines = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("toy")]
    assert len(lines) == 6
    colours = {line.get_label().split(":")[0]: line.get_color() for line in lines}
    assert set(colours) == set(models) and len(set(colours.values())) == 3
    plt.close(fig)


def test_the_drafter_caption_says_what_the_recording_shows():
    """A replay's time is not flat (it grows with the batch for one model), nor eager's the same at every
    batch; what holds at every batch is that eager takes several times as long: the caption says so."""
    dg = bench.frame(H200, "drafter_graph")
    wide = dg.pivot_table(index=["model", "live_batch"], columns="impl", values="median_us")
    graph, eager = (wide[impl].unstack("model").dropna(axis=1, how="all") for impl in ("graph", "eager"))
    assert (graph.iloc[-1] > 2 * graph.iloc[0]).any() and (eager.max() > 1.5 * eager.min()).all()
    longer = (wide["eager"] / wide["graph"]).dropna()
    fig = figs.drafter_figure(H200, SOURCE)
    caption = " ".join(t.get_text() for t in fig.texts)
    assert f"take {longer.min():.1f} to {longer.max():.1f} times as long as its replay" in " ".join(
        caption.split()
    )
    assert longer.min() > 2 and "stays flat" not in caption and "the same at every" not in caption
    plt.close(fig)


def test_small_batch_goals_give_each_goal_its_verdict_and_its_worst_shape():
    def g(number, status, margin, measured, goal="a goal at some shape"):
        judged = {"measured": measured, "target": 1.0, "unit": "x"}
        return {"case": "c", "goal": goal, "issue_goal": number, "status": status, "margin": margin, **judged}

    report = _report(
        [],
        goals=[
            g(1, "pass", "+10.0% vs target", 0.9),
            g(1, "miss", "-5.0% vs target", 1.05, "the worse one"),
            g(1, "miss", "-2.0% vs target", 1.02),
            g(2, "pass", "+3.0% vs target", 1.03, "the tighter one"),
            g(2, "pass", "+30.0% vs target", 1.3),
            g(3, "not measured", "", None),
            {**g(4, "pass", "+0.0% vs target", 1.0), "vllm": {"0.33.0": 7.0}},
            {**g(5, "pass", "+100.9% vs target", -0.00884), "unit": "%"},
        ],
    )
    table = perf.small_batch_goals(report)
    assert list(table.index) == [1, 2, 3, 4, 5]
    assert table["status"].tolist() == ["missed", "met", "not measured", "met", "met"]
    assert table.loc[5, "measured"] == "-0.01% (target 1%)"  # a percentage to two decimals
    assert table.loc[1, "shapes met"] == "1 of 3" and table.loc[1, "worst"] == "the worse one"
    assert table.loc[1, "measured"] == "1.05x (target 1x)" and table.loc[1, "margin"] == "-5.0% vs target"
    assert table.loc[2, "worst"] == "the tighter one" and table.loc[4, "vLLM"] == "0.33.0: 7 us"
    text = perf.small_batch_text(report)
    assert text.startswith("Met: goals 2, 4, 5. Missed: goals 1.")
    assert "- **1, host cost per call: missed**, 1 of 3 shapes; the worst miss: *the worse one*" in text
    assert text.count("\n- ") == 4 and "vLLM beside it: 0.33.0: 7 us." in text
    assert "\n  - *the worse one*: 1 of 1 shapes miss" in text  # each family's misses under its goal


def test_small_batch_goals_of_the_recording_match_its_goal_list():
    table = perf.small_batch_goals(H200)
    judged_goals = [g for g in H200["goals"] if g.get("issue_goal") and g["status"] in ("pass", "miss")]
    for number, row in table.iterrows():
        judged = [g for g in judged_goals if g["issue_goal"] == number]
        passed = sum(g["status"] == "pass" for g in judged)
        assert row["shapes met"] == f"{passed} of {len(judged)}"
        assert row["status"] == ("met" if passed == len(judged) else "missed")
    fig = figs.small_batch_figure(H200, SOURCE)
    try:
        dots = sum(len(c.get_offsets()) for c in fig.axes[0].collections)
        assert dots == len(judged_goals)
    finally:
        plt.close(fig)


def test_host_spread_pairs_each_call_with_vllms_same_call_at_its_shape():
    table = perf.host_spread(H200)
    hosts = [r for r in H200["results"] if r["case"] in ("gumbel_host", "rejection_host")]
    ours = [r for r in hosts if r["impl"].startswith("specfix")]
    assert len(table) == len(ours) == 10
    row = table.query("call == 'rejection_sample' and shape == 'batch 64, k 3, vocab 151,936'").iloc[0]
    at_64 = lambda impl: next(r for r in hosts if r["impl"] == impl and r["params"]["batch"] == 64)
    mine, vllm = at_64("specfix_rejection_sample"), at_64("vllm_0.33.0_rejection_sample")
    assert row["specfix us"] == f"{mine['median_us']:,.0f} ({mine['p20_us']:,.0f}..{mine['p80_us']:,.0f})"
    assert row["vLLM 0.33.0 us"] == f"{vllm['median_us']:,.0f} ({vllm['p20_us']:,.0f}..{vllm['p80_us']:,.0f})"
    assert row["ratio"] == round(mine["median_us"] / vllm["median_us"], 2)
