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
from specfix.figures.performance import fix_costs, mask_overhead, padding_price
from specfix.tools import bench, recorded

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
    return {"c0_prompts": WORDS[len(space["PROMPTS"])], "c0_k": str(space["K"]),
            "c0_same": "exactly" if same else "NOT",
            "c0_spec": str(spec.num_steps), "c0_plain": str(plain.num_steps),
            "c0_rate": f"{spec.stats.acceptance_rate:.0%}",
            "c0_length": f"{spec.stats.mean_acceptance_length:.2f}"}


def _chapter2() -> dict[str, str]:
    ops = recorded.load("embedding_assert_ops")["rows"]
    emb = sorted((r["num_indices"], r["cuda"]["kernel"]) for r in ops
                 if r["op"] == "F.embedding" and r["bad"] == "-1" and r["cuda"]["outcome"] == "device assert")
    costs = fix_costs()
    clamp, mask = costs[costs["fix"] == "clamp"], costs[costs["fix"] == "host_mask"]
    largest = mask.loc[mask["num_tokens"].idxmax()]
    return {"c2_small_kernel": emb[0][1], "c2_small_n": _n(emb[0][0]),
            "c2_large_kernel": emb[-1][1], "c2_large_n": _n(emb[-1][0]),
            "c2_clamp_lo": _n(clamp["median_us"].min()), "c2_clamp_hi": _n(clamp["median_us"].max()),
            "c2_clamp_never": "never" if clamp["host_syncs_per_step"].max() == 0 else "sometimes",
            "c2_mask_syncs": WORDS[int(mask["host_syncs_per_step"].max())],
            "c2_mask_us": _n(largest["median_us"]), "c2_mask_tokens": _n(largest["num_tokens"])}


def _chapter3() -> dict[str, str]:
    rec = recorded.load("cudagraph_h200")
    off, on = rec["bench"]["fix_off"], rec["bench"]["fix_on"]
    chi_off, chi_on = rec["chi_square"]["False"]["positions"][0], rec["chi_square"]["True"]["positions"][0]
    return {"c3_requests": str(off["num_requests"]),
            "c3_off": str(off["differing"]), "c3_on": str(on["differing"]),
            "c3_trials": _n(chi_off["trials"]), "c3_chi_off": _n(chi_off["chi2"]),
            "c3_threshold": _n(chi_off["threshold"], 1), "c3_chi_on": _n(chi_on["chi2"], 1)}


def _chapter4() -> dict[str, str]:
    variants = recorded.load("gumbel_sanitizer")["variants"]
    (kind, seen), = variants["unmasked"]["kinds"].items()
    size = re.search(r"read of size (\d+) bytes", kind)
    return {"c4_masked": str(variants["masked"]["errors"]), "c4_reads": _n(seen["count"]),
            "c4_bytes": size.group(1) if size else "(not a read)"}


def _chapter5() -> dict[str, str]:
    report = recorded.load("bench_h200")
    goals = {(g["case"], g["unit"]): g for g in report["goals"]}
    fast = bench.frame(report, "gumbel").query("impl == @bench.JUDGED")
    big = fast[(fast["rows"] >= 256) & (fast["vocab"] > fast["vocab"].min())]
    rows = sorted(big["rows"].unique())
    rate_goal, speed_goal = goals["gumbel", "G logits/s"], goals["gumbel", "x"]
    worst = re.search(r"worst at (\d+) x ([\d,]+)", rate_goal["margin"])
    graph = bench.frame(report, "gumbel_graph").query("impl == @bench.JUDGED")
    graph = graph[graph["vocab"] == graph["vocab"].max()].iloc[0]
    overheads = mask_overhead(report)["overhead"]
    speedups = padding_price(report)["speedup"]
    return {"c5_lo": _n(big["G_logits_per_s"].min()), "c5_hi": _n(big["G_logits_per_s"].max()),
            "c5_rows": " and ".join(_n(r) for r in rows),
            "c5_vocab_lo": _n(big["vocab"].min()), "c5_vocab_hi": _n(big["vocab"].max()),
            "c5_goal": _n(rate_goal["target"]),
            "c5_status": "missed" if rate_goal["status"] == "miss" else "met",
            "c5_worst_rows": worst.group(1), "c5_worst_vocab": worst.group(2),
            "c5_worst": _n(rate_goal["measured"]),
            "c5_graph_us": _n(graph["median_us"], 1), "c5_graph_vocab": _n(graph["vocab"]),
            "c5_graph_goal": _n(goals["gumbel_graph", "us"]["target"]),
            "c5_speedup": _n(speed_goal["measured"], 1), "c5_speedup_shape": "256 x 151,936",
            "c5_mask_max": f"{overheads.max():+.1%}", "c5_mask_min": f"{-overheads.min():.1%}",
            "c5_graph_lo": _n(speedups.min(), 1), "c5_graph_hi": _n(speedups.max(), 1)}


def _labels() -> dict[str, str]:
    metas = [recorded.load(name)["meta"] for name in
             ("bench_h200", "cudagraph_h200", "gumbel_sanitizer", "embedding_assert_ops")]
    dates, devices = {m["date"] for m in metas}, {m["device"] for m in metas}
    assert len(dates) == 1 and len(devices) == 1, "the README names one date and one device for them all"
    return {"device": devices.pop().removeprefix("NVIDIA "), "date": dates.pop()}


@functools.cache
def expected() -> dict[str, str]:
    return {**_labels(), **_chapter0(), **_chapter2(), **_chapter3(), **_chapter4(), **_chapter5()}


#: Each claim of "What you will see" (whitespace collapsed), its figures as named groups.
CLAIMS = {
    "recordings": r"made on an NVIDIA (?P<device>\w+) on (?P<date>[\d-]+);",
    "chapter 0": (r"On its (?P<c0_prompts>\w+) prompts at k = (?P<c0_k>\d+), greedy, speculative "
                  r"decoding writes (?P<c0_same>\w+) the text plain greedy decoding writes, in "
                  r"(?P<c0_spec>\d+) target passes instead of (?P<c0_plain>\d+): (?P<c0_rate>\d+%) of the "
                  r"drafts are accepted, and a "
                  r"verification step emits (?P<c0_length>[\d.]+) tokens on average"),
    "chapter 2 ops": (r"asserts in `(?P<c2_small_kernel>\w+)` with (?P<c2_small_n>[\d,]+) indices and in "
                      r"`(?P<c2_large_kernel>\w+)` with (?P<c2_large_n>[\d,]+)\."),
    "chapter 2 costs": (r"The clamp takes (?P<c2_clamp_lo>[\d,]+) to (?P<c2_clamp_hi>[\d,]+) us a step, "
                        r"launch included, and (?P<c2_clamp_never>\w+) synchronises; the first version's "
                        r"host-built mask makes (?P<c2_mask_syncs>\w+) blocking copy per step and takes "
                        r"(?P<c2_mask_us>[\d,]+) us at (?P<c2_mask_tokens>[\d,]+) tokens"),
    "chapter 3": (r"(?P<c3_requests>\d+) seeded requests batched under real CUDA-graph replays on the H200: "
                  r"(?P<c3_off>\d+) responses differ from their solo runs with the stale `idx_mapping` rows, "
                  r"(?P<c3_on>\d+) with the fix\. In a worst case built for the test \(every live slot "
                  r"overwritten, (?P<c3_trials>[\d,]+) trials\), the first output position scores a "
                  r"chi-square of (?P<c3_chi_off>[\d,]+) against a threshold of (?P<c3_threshold>[\d.]+) "
                  r"without the fix, and (?P<c3_chi_on>[\d.]+) with it"),
    "chapter 4": (r"compute-sanitizer finds (?P<c4_masked>\d+) errors with the mask and "
                  r"(?P<c4_reads>[\d,]+) invalid (?P<c4_bytes>\d+)-byte reads"),
    "chapter 5": (r"The fast sampler reaches (?P<c5_lo>[\d,]+) to (?P<c5_hi>[\d,]+) G logits/s at "
                  r"(?P<c5_rows>[\d,]+ and [\d,]+) rows of (?P<c5_vocab_lo>[\d,]+) to "
                  r"(?P<c5_vocab_hi>[\d,]+) logits \(goal (?P<c5_goal>[\d,]+); (?P<c5_status>\w+) at "
                  r"(?P<c5_worst_rows>\d+) x (?P<c5_worst_vocab>[\d,]+): (?P<c5_worst>[\d,]+)\), takes "
                  r"(?P<c5_graph_us>[\d.]+) us for one row of (?P<c5_graph_vocab>[\d,]+) inside a CUDA graph "
                  r"\(goal (?P<c5_graph_goal>\d+)\), and is (?P<c5_speedup>[\d.]+) times faster than softmax "
                  r"\+ `torch.multinomial` at (?P<c5_speedup_shape>\d+ x [\d,]+)\. The mask costs at most "
                  r"(?P<c5_mask_max>[+\d.]+%) \(with the processed-logits store the masked kernel even ran "
                  r"(?P<c5_mask_min>[\d.]+%) faster\); a CUDA-graph replay makes the drafter step "
                  r"(?P<c5_graph_lo>[\d.]+) to (?P<c5_graph_hi>[\d.]+) times faster than eager launches"),
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
    unchecked = re.findall(r"(?<![\w#./\[-])\d+(?:[,.]\d+)*", text)
    assert not unchecked, f"numbers in 'What you will see' that no claim checks: {unchecked}"


def test_every_recording_label_in_the_readme_matches_the_recordings():
    meta = recorded.load("bench_h200")["meta"]
    labels = re.findall(r"\(driver ([\w.]+), torch ([\w.+]+),\s+triton ([\w.]+)\) on ([\d-]+)", README)
    assert labels, "the README names the versions its recordings were made with"
    assert set(labels) == {(meta["driver"], meta["torch"], meta["triton"], meta["date"])}
