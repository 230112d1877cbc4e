"""The README's figures are the recordings' and the computations' figures: every number in "What you will see"
is recomputed here from its source (a recording in specfix/recorded/, or a cheap CPU run with the parameters
of the chapter it describes) and the test fails when one drifts. A number that no claim below accounts for
fails too, so a new figure cannot slip in unchecked."""

import functools
import json
import re
from pathlib import Path

import pytest

from specfix import runtime
from specfix.figures.kernel_profile import GOAL_SHAPE
from specfix.figures.performance import fix_costs, mask_overhead, padding_price
from specfix.tools import bench, recorded
from specfix.tools.mirrors import RELEASES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
#: Numbers in the section that are definitions, not measurements (the clamp's bound, an environment setting).
DEFINITIONS = ("becomes token 0", "Writing 0 instead", "CUDA_LAUNCH_BLOCKING=1")


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, flags=re.M | re.S)
    assert match, f"README has no '## {title}' section"
    return " ".join(match.group(1).split())


SEEN = _section("What you will see")


def _n(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _chapter0() -> dict[str, str]:
    """Chapter 0's whole generation, with the parameters of its own `parameters` cell, at CI scale."""
    from specfix.v1.engine import SamplingParams, generate

    cells = json.loads((ROOT / "notebooks" / "00_tour.ipynb").read_text())["cells"]
    (params,) = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    space: dict = {}
    saved, runtime.SCALE = runtime.SCALE, "ci"
    try:
        exec("".join(params["source"]), space)  # noqa: S102  (our own notebook's parameters cell)
    finally:
        runtime.SCALE = saved
    greedy = SamplingParams(temperature=0.0, max_tokens=space["MAX_TOKENS"])
    spec = generate(space["PROMPTS"], greedy, num_speculative_tokens=space["K"], device="cpu")
    plain = generate(space["PROMPTS"], greedy, num_speculative_tokens=None, device="cpu")
    same = all(a.token_ids == b.token_ids for a, b in zip(spec.outputs, plain.outputs, strict=True))
    return {
        "c0_prompts": WORDS[len(space["PROMPTS"])],
        "c0_k": str(space["K"]),
        "c0_same": "exactly" if same else "NOT",
        "c0_spec": str(spec.num_steps),
        "c0_plain": str(plain.num_steps),
        "c0_rate": f"{spec.stats.acceptance_rate:.0%}",
        "c0_length": f"{spec.stats.mean_acceptance_length:.2f}",
    }


def _chapter2() -> dict[str, str]:
    ops = recorded.load("embedding_assert_ops")["rows"]
    emb = sorted(
        (r["num_indices"], r["cuda"]["kernel"])
        for r in ops
        if r["op"] == "F.embedding" and r["bad"] == "-1" and r["cuda"]["outcome"] == "device assert"
    )
    costs = fix_costs()
    clamp, mask = costs[costs["fix"] == "clamp"], costs[costs["fix"] == "host_mask"]
    largest = mask.loc[mask["num_tokens"].idxmax()]
    return {
        "c2_small_kernel": emb[0][1],
        "c2_small_n": _n(emb[0][0]),
        "c2_large_kernel": emb[-1][1],
        "c2_large_n": _n(emb[-1][0]),
        "c2_clamp_lo": _n(clamp["median_us"].min()),
        "c2_clamp_hi": _n(clamp["median_us"].max()),
        "c2_clamp_never": "never" if clamp["host_syncs_per_step"].max() == 0 else "sometimes",
        "c2_mask_syncs": WORDS[int(mask["host_syncs_per_step"].max())],
        "c2_mask_us": _n(largest["median_us"]),
        "c2_mask_tokens": _n(largest["num_tokens"]),
    }


def _chapter3() -> dict[str, str]:
    rec = recorded.load("cudagraph_h200")
    off, on = rec["bench"]["fix_off"], rec["bench"]["fix_on"]
    chi_off, chi_on = rec["chi_square"]["False"]["positions"][0], rec["chi_square"]["True"]["positions"][0]
    return {
        "c3_requests": str(off["num_requests"]),
        "c3_off": str(off["differing"]),
        "c3_on": str(on["differing"]),
        "c3_trials": _n(chi_off["trials"]),
        "c3_chi_off": _n(chi_off["chi2"]),
        "c3_threshold": _n(chi_off["threshold"], 1),
        "c3_chi_on": _n(chi_on["chi2"], 1),
    }


def _chapter4() -> dict[str, str]:
    variants = recorded.load("gumbel_sanitizer")["variants"]
    ((kind, seen),) = variants["unmasked"]["kinds"].items()
    size = re.search(r"read of size (\d+) bytes", kind)
    noise = recorded.load("vllm_noise_comparison")
    return {
        "c4_masked": str(variants["masked"]["errors"]),
        "c4_reads": _n(seen["count"]),
        "c4_bytes": size.group(1) if size else "(not a read)",
        "c4_noise_version": noise["vllm_version"],
        "c4_noise_rows": _n(noise["rows"]),
        "c4_noise_same": "the same token" if noise["mismatches"] == 0 else "NOT always the same token",
        "c4_noise_differ": _n(noise["mismatches"]),
    }


def _chapter5() -> dict[str, str]:
    report = recorded.load("bench_h200")
    fast = bench.frame(report, "gumbel").query("impl == @bench.JUDGED")
    big = fast[(fast["rows"] >= 256) & (fast["vocab"] > fast["vocab"].min())]
    rows = sorted(big["rows"].unique())
    rates = [g for g in report["goals"] if g["case"] == "gumbel" and g["unit"] == "G logits/s"]
    missed = [g for g in rates if g["status"] == "miss"]
    worst = min(missed, key=lambda g: g["measured"] / g["target"])
    worst_shape = re.search(r"at ([\d,]+ x [\d,]+)", worst["goal"]).group(1)
    (graph_goal,) = [g for g in report["goals"] if g["case"] == "gumbel_graph" and g["unit"] == "us"]
    graph = bench.frame(report, "gumbel_graph").query("impl == @bench.JUDGED and rows == 1")
    graph = graph[graph["vocab"] == graph["vocab"].max()].iloc[0]
    (speed_goal,) = [g for g in report["goals"] if g["case"] == "gumbel" and "multinomial" in g["goal"]]
    peer = bench.GOAL_PEER
    eager = fast[bench.speedup_key(peer)]
    in_graph = bench.frame(report, "gumbel_graph").query("impl == @bench.JUDGED")[bench.speedup_key(peer)]
    host = bench.frame(report, "gumbel_host").query("impl == @bench.JUDGED")[f"host_ratio_vs_vllm_{peer}"]
    core = bench.frame(report, "rejection").query("impl == 'specfix_core'")
    ratio = 1 / core[bench.speedup_key(peer)]
    greedy, rand = ratio[core["mode"] == "greedy"], ratio[core["mode"] == "random"]
    identical = (core[f"tables_identical_vllm_{peer}"] == 1).all()
    (host_goal,) = {g["issue_goal"] for g in report["goals"] if g["id"] == "host_cost"}
    host_goals = [g for g in report["goals"] if g["issue_goal"] == host_goal]
    (host_target,) = {g["target"] for g in host_goals}
    host_missed = sorted(
        (int(re.search(r"B=(\d+)", g["goal"]).group(1)), g) for g in host_goals if g["status"] == "miss"
    )
    (host_call,) = {re.search(r"per call of (\S+) <=", g["goal"]).group(1) for _, g in host_missed}
    overheads = mask_overhead(report)["overhead"]
    price = padding_price(report)
    speedups = price.groupby("model")["speedup"].median()
    return {
        "c5_lo": _n(big["G_logits_per_s"].min()),
        "c5_hi": _n(big["G_logits_per_s"].max()),
        "c5_rows": " and ".join(_n(r) for r in rows),
        "c5_vocab_lo": _n(big["vocab"].min()),
        "c5_vocab_hi": _n(big["vocab"].max()),
        "c5_missed": str(len(missed)),
        "c5_rate_goals": str(len(rates)),
        "c5_goal_lo": _n(min(g["target"] for g in rates)),
        "c5_goal_hi": _n(max(g["target"] for g in rates)),
        "c5_worst": f"{1 - worst['measured'] / worst['target']:.1%}",
        "c5_worst_shape": worst_shape,
        "c5_graph_us": _n(graph["median_us"], 2),
        "c5_graph_vocab": _n(graph["vocab"]),
        "c5_graph_goal": f"{graph_goal['target']:g}",
        "c5_graph_status": "missed" if graph_goal["status"] == "miss" else "met",
        "c5_speedup": _n(speed_goal["measured"], 1),
        "c5_speedup_shape": "256 x 151,936",
        "c5_peer": peer,
        "c5_peer_lo": _n(eager.min(), 2),
        "c5_peer_hi": _n(eager.max(), 2),
        "c5_peer_shapes": _n(len(eager)),
        "c5_peer_graph_lo": _n(in_graph.min(), 2),
        "c5_peer_graph_hi": _n(in_graph.max(), 2),
        "c5_host_lo": _n(host.min(), 2),
        "c5_host_hi": _n(host.max(), 2),
        "c5_greedy_lo": _n(greedy.min(), 2),
        "c5_greedy_hi": _n(greedy.max(), 2),
        "c5_random_lo": _n(rand.min(), 2),
        "c5_random_hi": _n(rand.max(), 2),
        "c5_tables": "identical" if identical else "DIFFERENT",
        "c5_host_goal": str(host_goal),
        "c5_host_target": f"{host_target:g}",
        "c5_host_status": "missed" if host_missed else "met",
        "c5_host_call": host_call,
        "c5_host_missed": " and ".join(_n(g["measured"], 2) for _, g in host_missed),
        "c5_host_batches": " and ".join(str(b) for b, _ in host_missed),
        "c5_mask_min": f"{overheads.min():+.1%}",
        "c5_mask_max": f"{overheads.max():+.1%}",
        "c5_graph_ngram": _n(speedups["ngram_draft"], 1),
        "c5_graph_mlp": _n(speedups["standin_mlp"], 1),
        "c5_batch_lo": str(price["live_batch"].min()),
        "c5_batch_hi": str(price["live_batch"].max()),
    }


#: The recordings the README's labelling sentence dates together, by the name of the date it gives them.
DATED = {
    "date_ops": (
        "embedding_assert_ops",
        "gumbel_sanitizer",
        "cudagraph_h200",
        "embedding_assert_transcripts",
        "vllm_noise_comparison",
    ),
    "date_runs": ("bench_h200",),
}


def _labels() -> dict[str, str]:
    metas = {name: recorded.load(name)["meta"] for names in DATED.values() for name in names}
    devices = {m["device"] for m in metas.values()}
    assert len(devices) == 1, "the README names one device for all its recordings"
    labels = {"device": devices.pop().removeprefix("NVIDIA ")}
    for key, names in DATED.items():
        dates = sorted({metas[name]["date"] for name in names})
        labels[key] = dates[0] if len(dates) == 1 else f"several dates: {dates}"
    return labels


@functools.cache
def expected() -> dict[str, str]:
    return {**_labels(), **_chapter0(), **_chapter2(), **_chapter3(), **_chapter4(), **_chapter5()}


#: Each claim of "What you will see" (whitespace collapsed), its figures as named groups.
CLAIMS = {
    "recordings": (
        r"all made on an NVIDIA (?P<device>\w+): the embedding op table, the sanitizer run, the "
        r"CUDA-graph run, the assert transcripts and the vLLM noise comparison on "
        r"(?P<date_ops>[\d-]+); the bench on (?P<date_runs>[\d-]+)\."
    ),
    "chapter 0": (
        r"On its (?P<c0_prompts>\w+) prompts at k = (?P<c0_k>\d+), greedy, speculative "
        r"decoding writes (?P<c0_same>\w+) the text plain greedy decoding writes, in "
        r"(?P<c0_spec>\d+) target passes instead of (?P<c0_plain>\d+): (?P<c0_rate>\d+%) of the "
        r"drafts are accepted, and a "
        r"verification step emits (?P<c0_length>[\d.]+) tokens on average"
    ),
    "chapter 2 ops": (
        r"asserts in `(?P<c2_small_kernel>\w+)` with (?P<c2_small_n>[\d,]+) indices and in "
        r"`(?P<c2_large_kernel>\w+)` with (?P<c2_large_n>[\d,]+)\."
    ),
    "chapter 2 costs": (
        r"The clamp takes (?P<c2_clamp_lo>[\d,]+) to (?P<c2_clamp_hi>[\d,]+) us a step, "
        r"launch included, and (?P<c2_clamp_never>\w+) synchronises; the first version's "
        r"host-built mask makes (?P<c2_mask_syncs>\w+) blocking copy per step and takes "
        r"(?P<c2_mask_us>[\d,]+) us at (?P<c2_mask_tokens>[\d,]+) tokens"
    ),
    "chapter 3": (
        r"(?P<c3_requests>\d+) seeded requests batched under real CUDA-graph replays on the H200: "
        r"(?P<c3_off>\d+) responses differ from their solo runs with the stale `idx_mapping` rows, "
        r"(?P<c3_on>\d+) with the fix\. In a worst case built for the test \(every live slot "
        r"overwritten, (?P<c3_trials>[\d,]+) trials\), the first output position scores a "
        r"chi-square of (?P<c3_chi_off>[\d,]+) against a threshold of (?P<c3_threshold>[\d.]+) "
        r"without the fix, and (?P<c3_chi_on>[\d.]+) with it"
    ),
    "chapter 4": (
        r"compute-sanitizer finds (?P<c4_masked>\d+) errors with the mask and "
        r"(?P<c4_reads>[\d,]+) invalid (?P<c4_bytes>\d+)-byte reads"
    ),
    "chapter 4 noise": (
        r"With vLLM's noise, it picks (?P<c4_noise_same>[\w ]+) as vLLM "
        r"(?P<c4_noise_version>[\d.]+)'s own kernel in all (?P<c4_noise_rows>[\d,]+) rows "
        r"compared on the H200 \((?P<c4_noise_differ>[\d,]+) differ\)"
    ),
    "chapter 5": (
        r"The fast sampler reaches (?P<c5_lo>[\d,]+) to (?P<c5_hi>[\d,]+) G logits/s at "
        r"(?P<c5_rows>[\d,]+ and [\d,]+) rows of (?P<c5_vocab_lo>[\d,]+) to "
        r"(?P<c5_vocab_hi>[\d,]+) logits; (?P<c5_missed>\d+) of its (?P<c5_rate_goals>\d+) "
        r"throughput goals \((?P<c5_goal_lo>[\d,]+) to (?P<c5_goal_hi>[\d,]+) G logits/s\) miss, "
        r"by up to (?P<c5_worst>[\d.]+%) at (?P<c5_worst_shape>[\d,]+ x [\d,]+)\. It takes "
        r"(?P<c5_graph_us>[\d.]+) us for one row of (?P<c5_graph_vocab>[\d,]+) inside a CUDA graph "
        r"\(goal: at most (?P<c5_graph_goal>[\d.]+) us, (?P<c5_graph_status>\w+)\), and is "
        r"(?P<c5_speedup>[\d.]+) times faster than softmax \+ `torch.multinomial` at "
        r"(?P<c5_speedup_shape>\d+ x [\d,]+)\."
    ),
    "chapter 5 peer": (
        r"Beside vLLM (?P<c5_peer>[\d.]+) on the same H200 it is (?P<c5_peer_lo>[\d.]+) to "
        r"(?P<c5_peer_hi>[\d.]+) times faster per call at all (?P<c5_peer_shapes>\d+) shapes, "
        r"and (?P<c5_peer_graph_lo>[\d.]+) to (?P<c5_peer_graph_hi>[\d.]+) times faster "
        r"inside a CUDA graph; `gumbel_sample`'s host cost per call is (?P<c5_host_lo>[\d.]+) to "
        r"(?P<c5_host_hi>[\d.]+) times vLLM's, and its greedy rejection core takes "
        r"(?P<c5_greedy_lo>[\d.]+) to (?P<c5_greedy_hi>[\d.]+) times vLLM's GPU time "
        r"\(random: (?P<c5_random_lo>[\d.]+) to (?P<c5_random_hi>[\d.]+)\), "
        r"with (?P<c5_tables>\w+) output tables"
    ),
    "chapter 5 host goal": (
        r"The chapter's goal (?P<c5_host_goal>\d), a host cost per call of at most "
        r"(?P<c5_host_target>[\d.]+) times vLLM's, is (?P<c5_host_status>\w+) all the same: "
        r"`(?P<c5_host_call>\w+)` costs (?P<c5_host_missed>[\d.]+ and [\d.]+) times vLLM's at "
        r"(?P<c5_host_batches>\d+ and \d+) requests\."
    ),
    "chapter 5 mask": (
        r"The mask changes the kernel's time by (?P<c5_mask_min>[-+\d.]+%) to (?P<c5_mask_max>[-+\d.]+%)\."
    ),
    "chapter 5 drafter": (
        r"A CUDA-graph replay makes the drafter step (?P<c5_graph_ngram>[\d.]+) times "
        r"faster than eager launches with the n-gram drafter and "
        r"(?P<c5_graph_mlp>[\d.]+) times with a stand-in two-layer MLP drafter "
        r"\(medians over live batches (?P<c5_batch_lo>\d+) to (?P<c5_batch_hi>\d+)\)"
    ),
}


@pytest.mark.parametrize("claim", sorted(CLAIMS))
def test_each_readme_figure_equals_its_source(claim):
    match = re.search(CLAIMS[claim], SEEN)
    assert match, f"README's 'What you will see' lost its {claim} sentence (or its wording changed)"
    figures = expected()
    wrong = {name: (said, figures[name]) for name, said in match.groupdict().items() if said != figures[name]}
    assert not wrong, f"{claim}: README says / the source gives: {wrong}"


def test_every_number_in_the_section_is_checked():
    text = SEEN
    for pattern in CLAIMS.values():
        text = re.sub(pattern, " ", text)
    for phrase in DEFINITIONS:
        text = text.replace(phrase, " ")
    text = re.sub(r"\*\*Chapter \d\.\*\*|\bchapter \d\b", " ", text)
    versions = re.findall(r"\b\d+\.\d+\.\d+\b", text)  # a vLLM release it cites: one the course compares
    assert set(versions) <= {r.version for r in RELEASES}, versions
    text = re.sub(r"\b\d+\.\d+\.\d+\b", " ", text)
    unchecked = re.findall(r"(?<![\w#./\[-])\d+(?:[,.]\d+)*", text)
    assert not unchecked, f"numbers in 'What you will see' that no claim checks: {unchecked}"


def test_every_recording_label_in_the_readme_matches_the_recordings():
    # "the shipped recordings": every one in specfix/recorded, not only those the section quotes
    metas = [json.loads(path.read_text())["meta"] for path in sorted(recorded.RECORDED_DIR.glob("*.json"))]
    labels = re.findall(
        r"\(driver ([\w.]+), torch ([\w.+]+),\s+triton ([\w.]+)\) on ([\d-]+)(?: and ([\d-]+))?;", README
    )
    assert labels, "the README names the versions its recordings were made with"
    versions = {(m["driver"], m["torch"], m["triton"]) for m in metas}
    dates = sorted({m["date"] for m in metas})
    assert {label[:3] for label in labels} == versions
    assert {tuple(sorted(d for d in label[3:] if d)) for label in labels} == {tuple(dates)}


# -- every figure with a unit, in the README and in the chapters' markdown ---------------------------------
#: A number with a unit: a time, a rate, a size, a share, a multiple, a count of SMs.
UNIT = re.compile(
    r"(?<![\w.#/-])(\d[\d,]*(?:\.\d+)?)\s?(%|x\b|×|us\b|µs|ms\b|s\b|seconds?\b|minutes?\b|"
    r"G logits/s|[GT]B/s|[GMK]i?B\b|bytes?\b|times\b|SMs?\b|GHz|MHz)"
)


def _paragraphs(text: str) -> list[str]:
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


def _markdown_paragraphs() -> list[tuple[str, str]]:
    """(where, paragraph) for the README outside its code blocks and for every markdown cell of a chapter.
    The README's console block is the output of `specfix diagnose`, which tests/test_diagnose.py checks
    against the tool itself, and 'What you will see' is checked claim by claim above."""
    out = []
    readme = re.sub(r"^```.*?^```", "\n\n", README, flags=re.M | re.S)
    readme = re.sub(r"^## What you will see\n.*?(?=^## )", "", readme, flags=re.M | re.S)
    out += [("README", p) for p in _paragraphs(readme)]
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                out += [(path.name[:2], p) for p in _paragraphs("".join(cell["source"]))]
    return out


def _bench_warm_ms() -> str:
    source = (ROOT / "specfix" / "timing.py").read_text()
    full = float(re.search(r"warm_ms = settings.pick\(.*full=([\d.]+)\)", source).group(1))
    return f"{full:g} ms"


def _profiled_shape() -> str:
    """The rows of the largest shape profiled, as the chapter writes them ('1,024 x')."""
    kernels = recorded.load("gumbel_ncu_h200")["kernels"]
    return f"{max(kernels, key=lambda k: k['rows'] * k['vocab'])['rows']:,} x"


def _itemsize(dtype: str) -> str:
    import torch

    return f"{getattr(torch, dtype).itemsize} bytes"


#: Reader-time estimates (a chapter's **Time.** paragraph, an exercise's heading): the author's estimate of
#: how long reading or solving takes, not a measurement of the code.
ESTIMATE = "the author's estimate of reading or solving time"
CPU_RUN = "the suite's run time on a CPU machine, measured as the sentence says (not GPU data)"
H200_SMS = "the H200's SM count (NVIDIA's specification; multi_processor_count in torch's device properties)"
#: (where, figure as written, a phrase of its paragraph) -> where the figure comes from: a function that
#: returns the figure from the package or a recording (checked), or a sentence naming its source.
FIGURES = {
    ("05", "20 ms", "then more calls for"): _bench_warm_ms,
    ("05", "1,024 x", "the largest profiled shape"): _profiled_shape,
    ("05", "132 SMs", "the waves it makes on the"): H200_SMS,
    ("04", "132 SMs", "keeps one of the H200's"): H200_SMS,
    ("00", "132 SMs", "one of its compute units"): H200_SMS,
    ("04", "4 bytes", "a pointer offset of -1 is the"): lambda: _itemsize("float32"),
    ("04", "8 bytes", "the row reads the"): lambda: _itemsize("int64"),
    ("00", "20 s", "**Time.**"): CPU_RUN,
    ("01", "35 s", "**Time.**"): CPU_RUN,
    ("03", "30 s", "**Time.**"): CPU_RUN,
    ("03", "37 s", "**Time.**"): CPU_RUN,
    ("04", "40 s", "**Time.**"): CPU_RUN,
    ("05", "20 s", "**Time.**"): CPU_RUN,
    ("README", "80 s", "the build takes about"): CPU_RUN,
    ("README", "20 s", "the check about"): CPU_RUN,
    **{
        ("README", figure, "timed by the book build"): CPU_RUN
        for figure in ("8 s", "27 s", "108 s", "20 s", "85 s", "340 s", "130 s", "320 s")
    },
    **{("README", figure, "make lab-check"): CPU_RUN for figure in ("130 s", "28 s")},
}


def _source_of(where: str, figure: str, unit: str, paragraph: str):
    if unit.startswith("minute") and (paragraph.startswith(("**Time.**", "#")) or "minutes)" in paragraph):
        return ESTIMATE
    for (doc, fig, phrase), source in FIGURES.items():
        if doc == where and fig == figure and phrase in paragraph:
            return source
    return None


def test_every_figure_in_the_readme_and_the_chapters_markdown_has_a_source():
    """A figure typed into prose is either rendered by code (then it is not in a markdown cell), checked here
    against the package or a recording, or listed in FIGURES with where it comes from."""
    unlisted, wrong, used = [], [], set()
    for where, paragraph in _markdown_paragraphs():
        for m in UNIT.finditer(paragraph):
            figure = " ".join(m.group(0).split())
            source = _source_of(where, figure, m.group(2), paragraph)
            if source is None:
                unlisted.append(
                    f"{where}: {figure!r} in ...{paragraph[max(0, m.start() - 60) : m.end() + 20]}"
                )
                continue
            used.update(k for k, v in FIGURES.items() if v is source and k[0] == where and k[1] == figure)
            if callable(source) and source() != figure:
                wrong.append(f"{where}: the prose says {figure!r}, its source gives {source()!r}")
    assert not unlisted, (
        "figures with no source (render them from data, or list them in FIGURES):\n" + "\n".join(unlisted)
    )
    assert not wrong, "\n".join(wrong)
    assert not set(FIGURES) - used, f"FIGURES lists figures the text no longer has: {set(FIGURES) - used}"


def test_chapter5s_words_for_its_shapes_and_fixes_hold_in_the_recordings():
    """Chapter 5's comparisons in words: the largest profiled shape, the bf16 shape goal 3 misses by most
    (the one the profile explains), the clamp as the cheapest correct fix, zeroing's host work growing."""
    prose = " ".join(p for where, p in _markdown_paragraphs() if where == "05")
    kernels = recorded.load("gumbel_ncu_h200")["kernels"]
    largest = max(kernels, key=lambda k: k["rows"] * k["vocab"])
    assert f"the largest profiled shape ({largest['rows']:,} x {largest['vocab']:,})" in prose
    assert GOAL_SHAPE.startswith(f"{largest['rows']:,} x {largest['vocab']:,}")  # the same shape, both named
    report = recorded.load("bench_h200")
    bf16 = [g for g in report["goals"] if g["issue_goal"] == 3 and "bf16" in g["goal"]]
    worst = min(bf16, key=lambda g: g["measured"] / g["target"])
    assert worst["status"] == "miss" and f"at {GOAL_SHAPE}" in worst["goal"]
    assert "the bf16 shape goal 3 misses by most" in prose
    costs = fix_costs(report).pivot(index="num_tokens", columns="fix", values="median_us")
    assert "the cheapest of the three correct fixes at every size" in prose
    assert (costs["clamp"] < costs[["host_mask", "host_mask_async"]].min(axis=1)).all()
    zero = costs["scheduler_zero"] / costs["clamp"]
    assert "about the clamp's time at the fewest tokens, many times it at the most" in prose
    assert 0.8 < zero.iloc[0] < 1.2 and zero.iloc[-1] > 5


def _docs_and_comments(path: Path):
    """Each docstring paragraph and each block of consecutive comment lines of a Python file."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield from _paragraphs(ast.get_docstring(node, clean=False) or "")
    block, last = [], None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            if last is not None and tok.start[0] != last + 1:
                yield " ".join(block)
                block = []
            block.append(tok.string)
            last = tok.start[0]
    if block:
        yield " ".join(block)


#: What a measurement is stated in: a time, a rate, a share, a multiple (a size or an SM count is the
#: hardware's specification).
MEASURED = re.compile(
    r"(?<![\w.#/-])(\d[\d,]*(?:\.\d+)?)\s?"
    r"(%|x\b|×|us\b|µs|ms\b|G logits/s|[GT]B/s|times\b)"
)


def test_no_h200_measurement_is_typed_into_a_docstring_or_a_comment():
    """GPU figures live in the recordings, which name their code, and reach readers through rendered text; a
    measurement typed beside 'H200' in the package or a script goes stale without anyone noticing."""
    typed = []
    for path in sorted([*(ROOT / "specfix").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]):
        for text in _docs_and_comments(path):
            if "H200" in text and MEASURED.search(text):
                typed.append(f"{path.relative_to(ROOT)}: {MEASURED.search(text).group(0)!r} in {text[:160]}")
    assert not typed, "\n".join(typed)
