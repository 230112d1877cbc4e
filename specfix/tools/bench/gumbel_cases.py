"""The Gumbel sampler's bench cases: hardware ceilings, eager, graph and host timings, the mask's cost."""

from __future__ import annotations

import functools
import itertools
import statistics

import torch

from specfix.fixes import Fixes
from specfix.lab.masked_gumbel import BATCH_KEYS, gumbel_batch
from specfix.mrv2.gumbel import gumbel_sample
from specfix.timing import g_logits_per_s, percentile, tb_per_s
from specfix.tools.bench import peer as vllm
from specfix.tools.bench.report import Job, find, goal, result, shape_label, worst
from specfix.tools.syncs import count_host_syncs

VOCABS = (32_000, 129_280, 151_936, 248_320)
ROWS = (1, 8, 64, 256, 1024)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: specfix's two noise modes: "fast" is the serving kernel the goals judge, "exact" the bit-reproducible one.
OURS = {"specfix_fast": "fast", "specfix_exact": "exact"}
JUDGED = "specfix_fast"
#: The judged kernel with the temperature applied in it (the drafter's path), timed from 256 rows.
WITH_TEMPERATURE = "fast_apply_temperature"
#: The per-shape goals' vocabularies; from GOAL_MANY_ROWS rows the GPU-time goal asks 1.5x vLLM's speed.
GOAL_VOCABS, GOAL_MANY_ROWS = (32_000, 151_936, 248_320), 64


def call_gumbel(
    inp: dict, noise: str, fixes: Fixes | None = None, logits_cache=None, apply_temperature: bool = False
):
    """A no-argument call of specfix's gumbel_sample on ``inp`` (with a ``logits_cache``, column 0 of it is
    filled as a drafter's call fills it)."""
    col = None if logits_cache is None else 0
    args = (*(inp[k] for k in BATCH_KEYS), apply_temperature, False, logits_cache, col)
    return functools.partial(gumbel_sample, *args, noise=noise, fixes=fixes or Fixes())


def _batch(s, rows: int, vocab: int, dname: str = "fp32") -> dict:
    return gumbel_batch(rows, vocab, dtype=DTYPES[dname], seed=rows * 7919 + vocab, device=s.device)


def _impls(s, inp: dict, ours: dict[str, str]) -> dict:
    """specfix's calls (``ours``: impl -> noise) and each vLLM release's, on one batch."""
    peers = s.peer.gumbel if s.peer else {}
    impls = {impl: call_gumbel(inp, noise) for impl, noise in ours.items()}
    return impls | {vllm.peer_impl(v): vllm.gumbel_call(m, inp) for v, m in peers.items()}


def torch_softmax_multinomial(logits: torch.Tensor) -> torch.Tensor:
    """The textbook sampler: probabilities, then torch.multinomial."""
    return torch.multinomial(torch.softmax(logits, dim=-1, dtype=torch.float32), 1).squeeze(-1)


def torch_gumbel_max(logits: torch.Tensor) -> torch.Tensor:
    """Gumbel-max in plain torch: argmax(logits + G) with G = -log(E), E ~ Exp(1)."""
    noise = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_().log_()
    return (logits.float() - noise).argmax(dim=-1)


def plan_ceilings(s, timer) -> list[Job]:
    copy_elems = s.pick(cpu=2**20, ci=2**26, full=2**28)
    rows, vocab = s.pick(cpu=(8, 4096), ci=(256, 248_320), full=(1024, 248_320))

    def copy():
        src = torch.rand(copy_elems, device=s.device)
        dst = torch.empty_like(src)
        t = timer.time(functools.partial(dst.copy_, src))
        nbytes = 2 * src.numel() * src.element_size()
        rate = tb_per_s(nbytes, statistics.median(t))
        return [result("ceilings", "copy", {"bytes_moved": nbytes, "dtype": "fp32"}, t, TB_per_s=rate)]

    def argmax():
        x = torch.randn(rows, vocab, device=s.device)
        t = timer.time(functools.partial(x.argmax, dim=-1))
        rate = tb_per_s(x.numel() * x.element_size(), statistics.median(t))
        params = {"rows": rows, "vocab": vocab, "dtype": "fp32"}
        return [result("ceilings", "argmax_read", params, t, TB_per_s=rate)]

    return [Job("copy bandwidth", copy), Job("fp32 argmax read bandwidth", argmax)]


def _gumbel_shape(s, timer, rows: int, vocab: int, dname: str) -> list[dict]:
    inp = _batch(s, rows, vocab, dname)
    nbytes, params = rows * vocab * DTYPES[dname].itemsize, {"vocab": vocab, "rows": rows, "dtype": dname}
    impls = _impls(s, inp, OURS)
    if rows >= 256:
        impls[WITH_TEMPERATURE] = call_gumbel(inp, OURS[JUDGED], apply_temperature=True)
    impls["torch_softmax_multinomial"] = functools.partial(torch_softmax_multinomial, inp["logits"])
    impls["torch_gumbel_max"] = functools.partial(torch_gumbel_max, inp["logits"])
    b2b = vllm.back_to_back(timer, s, impls, JUDGED)
    shape = []
    for impl, call in impls.items():
        t = timer.time(call)
        med = statistics.median(t)
        m = {
            "G_logits_per_s": g_logits_per_s(rows, vocab, med),
            "TB_per_s_read": tb_per_s(nbytes, med),
            "host_syncs_per_call": count_host_syncs(call, s.device),
        }
        if impl in b2b:
            m["back_to_back_us"] = b2b[impl]
        shape.append(result("gumbel", impl, params, t, **m))
    vllm.speedups(shape, OURS)
    return vllm.speedups(shape, OURS, "back_to_back_us")


def plan_gumbel(s, timer) -> list[Job]:
    vocabs = s.pick(cpu=(4096,), ci=(151_936,), full=VOCABS)
    rows_list = s.pick(cpu=(1, 4), ci=(1, 256), full=ROWS)
    dtypes = s.pick(cpu=("fp32", "bf16"), ci=("fp32", "bf16"), full=tuple(DTYPES))

    def run(vocab: int, dname: str) -> list[dict]:
        return [r for rows in rows_list for r in _gumbel_shape(s, timer, rows, vocab, dname)]

    return [
        Job(f"gumbel_sample vocab {v:,} {d}", functools.partial(run, v, d)) for v in vocabs for d in dtypes
    ]


def _rate_goals(results, s) -> list[dict]:
    """Goal 3, with vLLM's rate at the same shape beside the path it has (temperature applied before)."""
    cases = [
        ("rate_bf16", {"rows": 1024, "vocab": v, "dtype": "bf16"}, impl, temp)
        for v in (151_936, 248_320)
        for impl, temp in ((JUDGED, False), (WITH_TEMPERATURE, True))
    ]
    cases.append(("rate_fp32", {"rows": 256, "vocab": 32_000, "dtype": "fp32"}, JUDGED, False))
    goals = []
    for gid, p, impl, temp in cases:
        rate = {r["impl"]: r["metrics"]["G_logits_per_s"] for r in find(results, "gumbel", **p)}
        beside = {i.removeprefix("vllm_"): x for i, x in rate.items() if i.startswith("vllm_") and not temp}
        goals.append(goal(gid, rate.get(impl), s, vllm=beside, shape=shape_label(p), temp=temp))
    return goals


def _never_falls(ours, s) -> list[dict]:
    """``ours`` sorted by vocab, dtype and rows: each series' worst step from one row count to the next."""
    goals = []
    for (vocab, dname), rs in itertools.groupby(ours, lambda r: (r["params"]["vocab"], r["params"]["dtype"])):
        steps = [(b["median_us"] / a["median_us"], a, b) for a, b in itertools.pairwise(rs)]
        if not steps:
            continue
        ratio, a, b = min(steps, key=lambda x: x[0])
        detail = (
            f"worst step {a['params']['rows']:,} -> {b['params']['rows']:,} rows: "
            f"{a['median_us']:,.1f} -> {b['median_us']:,.1f} us"
        )
        goals.append(goal("never_falls", ratio, s, detail, shape=f"{vocab:,} {dname}"))
    return goals


def goals_gumbel(results, s):
    ours = sorted(
        find(results, "gumbel", JUDGED),
        key=lambda r: (r["params"]["vocab"], r["params"]["dtype"], r["params"]["rows"]),
    )
    key = vllm.speedup_key(vllm.GOAL_PEER)
    judged = [r for r in ours if key in r["metrics"] and r["params"]["vocab"] in GOAL_VOCABS]
    many = {True: "gpu_vs_peer_many", False: "gpu_vs_peer"}
    peer = [vllm.vs_peer(many[r["params"]["rows"] >= GOAL_MANY_ROWS], r, s, shape_label) for r in judged]
    speedups = []
    for dname in DTYPES:
        mine = find(results, "gumbel", JUDGED, rows=256, vocab=151_936, dtype=dname)
        ref = find(results, "gumbel", "torch_softmax_multinomial", rows=256, vocab=151_936, dtype=dname)
        if mine and ref:
            speedups.append((ref[0]["median_us"] / mine[0]["median_us"], dname))
    slowest, dname = min(speedups, default=(None, None))
    multinomial = goal("vs_multinomial", slowest, s, f"worst in {dname}" if dname else "")
    b2b = vllm.goals_beside("back_to_back", results, s, "gumbel", JUDGED, "gumbel_sample", shape_label)
    return peer + b2b + _rate_goals(results, s) + _never_falls(ours, s) + [multinomial]


def plan_gumbel_graph(s, timer) -> list[Job]:
    vocabs = s.pick(cpu=(4096,), ci=(248_320,), full=(151_936, 248_320))
    rows_list = s.pick(cpu=(1,), ci=(1,), full=(1, 8, 64))

    def run(vocab: int) -> list[dict]:
        out = []
        for rows in rows_list:
            calls = s.pick(cpu=2, ci=50, full=max(10, 200 // rows))
            inp = _batch(s, rows, vocab)
            params = {"vocab": vocab, "rows": rows, "dtype": "fp32", "calls_per_graph": calls}
            impls = _impls(s, inp, OURS)
            impls["torch_gumbel_max"] = functools.partial(torch_gumbel_max, inp["logits"])
            timed = {impl: timer.time_in_graph(call, calls) for impl, call in impls.items()}
            out += vllm.speedups([result("gumbel_graph", i, params, t) for i, t in timed.items()], OURS)
        return out

    return [Job(f"gumbel_sample in a CUDA graph, vocab {v:,}", functools.partial(run, v)) for v in vocabs]


def goals_gumbel_graph(results, s):
    r = find(results, "gumbel_graph", JUDGED, vocab=248_320, rows=1)
    goals = [goal("graph_one_row", r[0]["median_us"] if r else None, s)]
    key = vllm.speedup_key(vllm.GOAL_PEER)
    judged = [r for r in find(results, "gumbel_graph", JUDGED) if key in r["metrics"]]
    return goals + [vllm.vs_peer("graph_vs_peer", r, s, shape_label, invert=True) for r in judged]


def plan_gumbel_host(s, timer) -> list[Job]:
    shapes = s.pick(
        cpu=((1, 4096),),
        ci=((1, 151_936), (8, 151_936)),
        full=((1, 151_936), (8, 151_936), (64, 151_936), (8, 32_000)),
    )

    def run(rows: int, vocab: int) -> list[dict]:
        impls = _impls(s, _batch(s, rows, vocab), {JUDGED: OURS[JUDGED]})
        params = {"rows": rows, "vocab": vocab, "dtype": "fp32"}
        return vllm.host_beside(timer, s, "gumbel_host", params, impls)

    return [
        Job(f"gumbel_sample host cost per call, {r} x {v:,}", functools.partial(run, r, v)) for r, v in shapes
    ]


def goals_gumbel_host(results, s):
    return vllm.goals_beside("host_cost", results, s, "gumbel_host", JUDGED, "gumbel_sample", shape_label)


def plan_gumbel_mask(s, timer) -> list[Job]:
    rows, vocab = s.pick(cpu=(2, 1024), ci=(256, 151_936), full=(256, 151_936))
    repeats = s.pick(cpu=2, ci=10, full=20)

    def run(store: bool):
        inp = _batch(s, rows, vocab)
        processed = torch.empty(rows, 1, vocab, dtype=torch.float32, device=s.device) if store else None
        masked = call_gumbel(inp, OURS[JUDGED], Fixes(), processed)
        unmasked = call_gumbel(inp, OURS[JUDGED], Fixes(mask_invalid_reqs=False), processed)
        a, b = timer.interleaved(masked, unmasked, repeats)
        over = [x / y - 1 for x, y in zip(a, b, strict=True)]
        params = {"vocab": vocab, "rows": rows, "dtype": "fp32", "store_processed_logits": store}
        spread = {"overhead_p20": percentile(over, 20), "overhead_p80": percentile(over, 80)}
        masked = result("gumbel_mask", "masked", params, a, overhead=statistics.median(over), **spread)
        masked["metrics"]["repeats"] = float(repeats)
        return [masked, result("gumbel_mask", "unmasked", params, b)]

    return [
        Job("masked vs unmasked, sampling only", functools.partial(run, False)),
        Job("masked vs unmasked, with processed-logits store", functools.partial(run, True)),
    ]


def goals_gumbel_mask(results, s):
    _, row = worst(find(results, "gumbel_mask", "masked"), "overhead")
    if row is None:
        return [goal("mask", None, s, repeats=10)]
    m = row["metrics"]
    spread = f"spread p20..p80 {m['overhead_p20'] * 100:+.2f}..{m['overhead_p80'] * 100:+.2f}%"
    detail = f"{spread}; worst with store={row['params']['store_processed_logits']}"
    return [goal("mask", m["overhead"] * 100, s, detail, repeats=int(m["repeats"]))]
