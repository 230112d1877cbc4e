"""Record chapter 5's host-side evidence: where a small speculative step spends its time, host against GPU.

    PYTHONPATH=$PWD python scripts/record_host_trace.py --peer .peer --out specfix/recorded   # on a GPU
    PYTHONPATH=$PWD python scripts/record_host_trace.py --device cpu                        # a CPU dry run

One *step* is what a decode step of speculative decoding samples after the target forward: the rejection
sampler verifies ``k`` drafts of each of ``batch`` requests (``rejection_sample``, random mode), and
``gumbel_sample`` draws one token for each request (``batch`` rows of ``vocab`` fp32 logits, temperature 1).
specfix's step and the same step made of vLLM 0.33's own functions (``.peer/``, from
``scripts/fetch_vllm_peer.py``) run on the same inputs. Three sections:

- ``timelines``: one step of each, at 1 and 8 requests, under ``torch.profiler``, reduced to spans (start and
  end in us from the step's start): the step's two calls, torch ops, launch calls, GPU kernels.
- ``rows``: ``gumbel_sample`` alone at 1 to 1,024 rows: host time per call (the GPU kept busy by earlier
  work, so that no call waits), GPU time per call (CUDA events, the host's launch work hidden behind a
  queued spin kernel) and back-to-back time per call (calls issued in a loop, as an eager engine does).
- ``graph``: the step eager against one CUDA-graph replay of it: the same three times per step.

On ``--device cpu`` (Triton's interpreter, tiny sizes) everything is host time; it exists to try the script,
and writes to a temporary folder unless ``--out`` says otherwise. Writes ``<out>/host_trace_h200.json``
labelled by ``specfix.tools.recorded.save``; stops starting new sizes once ``--budget-s`` has passed.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

NAME = "host_trace_h200"
#: The figure's lanes, top to bottom: the step's calls (record_function), the torch ops under them, the
#: driver calls that launch or copy, and what the GPU ran.
LANES = ("call", "op", "launch", "gpu")
_LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", help="folder for host_trace_h200.json (default: $OUT, else a temporary folder)")
    p.add_argument("--peer", default=".peer", help="folder holding vLLM's sampler files (fetch_vllm_peer.py)")
    p.add_argument("--version", default="0.33.0", help="the vLLM release to set beside specfix")
    p.add_argument("--budget-s", type=float, default=70.0, help="start no new size after this many seconds")
    return p.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    os.environ["SPECFIX_DEVICE"] = ARGS.device  # before specfix picks its device (and the interpreter)

import torch  # noqa: E402

import specfix  # noqa: E402,F401  (runtime first)
from specfix.lab.masked_gumbel import gumbel_batch, load_vllm_sampler  # noqa: E402
from specfix.timing import Settings, Timer, capture_graph, summarize  # noqa: E402
from specfix.tools import recorded  # noqa: E402
from specfix.tools.bench.gumbel_cases import call_gumbel  # noqa: E402
from specfix.tools.bench.peer import gumbel_call  # noqa: E402
from specfix.v1 import rejection_sampler as rs  # noqa: E402
from specfix.v1.sampling_metadata import SamplingMetadata  # noqa: E402
from specfix.v1.spec_decode_metadata import SpecDecodeMetadata  # noqa: E402


def sizes(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"vocab": 151_936, "k": 3, "trace_batches": [1, 8], "rows": [2**i for i in range(11)]}
    return {"vocab": 256, "k": 2, "trace_batches": [1, 2], "rows": [1, 4]}


# ---- inputs and the two steps


def step_inputs(batch: int, k: int, vocab: int, device) -> dict:
    """One verification's inputs (random mode, temperature 1, unseeded) and the draw's."""
    gen = torch.Generator(device=device).manual_seed(batch * 31 + k)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen, device=device)
    meta = SpecDecodeMetadata.make_dummy(drafts.tolist(), device=device)
    return {
        "draw": gumbel_batch(batch, vocab, seed=batch * 7919 + vocab, device=device),
        "core": (
            meta.draft_token_ids,
            meta.num_draft_tokens,
            meta.max_spec_len,
            meta.cu_num_draft_tokens,
            torch.softmax(torch.randn(batch * k, vocab, generator=gen, device=device), dim=-1),
            torch.randn(batch * k, vocab, generator=gen, device=device).mul_(3),
            torch.randint(0, vocab, (batch,), dtype=torch.int32, generator=gen, device=device),
        ),
        "batch": batch,
    }


def specfix_step(inp: dict, annotate: bool = False):
    sampling = SamplingMetadata.from_requests(
        [1.0] * inp["batch"], [None] * inp["batch"], device=inp["core"][5].device
    )
    draw = call_gumbel(inp["draw"], "fast")
    return _step(lambda: rs.rejection_sample(*inp["core"], sampling), draw, annotate)


def peer_step(module, rejection, inp: dict, annotate: bool = False):
    device = inp["core"][5].device
    sampling = rejection.SamplingMetadata(
        temperature=torch.ones(inp["batch"], device=device), all_greedy=False, all_random=True, generators={}
    )
    *head, bonus = inp["core"]
    draw = gumbel_call(module, inp["draw"])
    return _step(lambda: rejection.rejection_sample(*head, bonus.view(-1, 1), sampling), draw, annotate)


def _step(verify, draw, annotate: bool):
    if not annotate:
        return lambda: (verify(), draw())

    def step():
        with torch.profiler.record_function("rejection_sample"):
            verify()
        with torch.profiler.record_function("gumbel_sample"):
            draw()

    return step


# ---- timing (specfix.timing: the bench's timer)


def measure(timer: Timer, fn) -> dict:
    out = {
        "host": summarize(timer.host_cost(fn)),
        "gpu": summarize(timer.time(fn, flush=False)) if timer.settings.cuda else None,
        "back_to_back": summarize(timer.time_throughput(fn)),
    }
    if timer.settings.cuda:
        out["gpu_busy_throughout_host_timing"] = timer.gpu_stayed_busy
    return out


# ---- the profiler trace, reduced

#: Steps profiled in one session; only the last is kept. The profiler's own start-up lands in the first ones
#: (the first launch under CUPTI can take longer than the whole step).
PROFILED_STEPS = 4


def trace_step(step, cuda: bool) -> dict:
    """Profile ``step`` (annotated) after warm-up, each call on an idle GPU, and reduce the trace to the last
    call's spans."""
    for _ in range(5):
        step()
    if cuda:
        torch.cuda.synchronize()
    kinds = torch.profiler.ProfilerActivity
    activities = [kinds.CPU, kinds.CUDA] if cuda else [kinds.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            with torch.profiler.record_function("step"):
                step()
            if cuda:
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return reduce_trace(json.loads(path.read_text()))


def reduce_trace(trace: dict) -> dict:
    """The last step's spans from a Chrome trace: ``{"spans": [{lane, name, start_us, end_us}], ...}`` with
    times from the start of the last ``step`` annotation (the GPU idle when it began); host spans nested in
    another of their lane are dropped (the op lane keeps top-level torch ops only)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    step = max(
        (e for e in events if e.get("cat") == "user_annotation" and e["name"] == "step"),
        key=lambda e: float(e["ts"]),
    )
    t0, t1 = float(step["ts"]), float(step["ts"]) + float(step["dur"])
    spans = []
    for e in events:
        cat, name, ts, dur = e.get("cat", ""), e["name"], float(e["ts"]), float(e["dur"])
        if cat == "user_annotation" and name != "step":
            lane = "call"
        elif cat == "cpu_op":
            lane = "op"
        elif cat in ("cuda_runtime", "cuda_driver") and any(w in name for w in _LAUNCH_WORDS):
            lane = "launch"
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            lane = "gpu"
        else:
            continue
        if ts < t0 or (lane != "gpu" and ts > t1):
            continue
        spans.append(
            {
                "lane": lane,
                "name": name[:120],
                "start_us": ts - t0,
                "end_us": ts + dur - t0,
                "tid": e.get("tid"),
            }
        )
    spans.sort(key=lambda s: (LANES.index(s["lane"]), s["start_us"], -s["end_us"]))
    kept = []
    for s in spans:
        outer = next(
            (
                o
                for o in reversed(kept)
                if o["lane"] == s["lane"]
                and o["tid"] == s["tid"]
                and o["start_us"] <= s["start_us"]
                and s["end_us"] <= o["end_us"]
            ),
            None,
        )
        if outer is None or s["lane"] == "gpu":
            kept.append(s)
    kept = [{k: v for k, v in s.items() if k != "tid"} for s in kept]
    gpu = [s for s in kept if s["lane"] == "gpu"]
    return {
        "step_host_us": t1 - t0,
        "spans": kept,
        "kernels": len(gpu),
        "launches": sum(s["lane"] == "launch" for s in kept),
        "gpu_busy_us": _union([(s["start_us"], s["end_us"]) for s in gpu]),
        "gpu_end_us": max((s["end_us"] for s in gpu), default=None),
    }


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -float("inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


# ---- the sections


def peer_modules(args):
    gumbel = load_vllm_sampler(args.version, args.peer, kind="gumbel")
    rejection = load_vllm_sampler(args.version, args.peer, kind="rejection")
    files = {}
    for kind in ("gumbel", "rejection"):
        path = Path(args.peer) / f"vllm_{kind}_{args.version.replace('.', '_')}.py"
        if path.is_file():
            files[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    return gumbel, rejection, files


def header(args, s: dict, peer: str, gumbel_peer, rejection_peer, peer_files: dict) -> dict:
    """The recording's description, settings and peer, and its empty sections."""
    return {
        "what": (
            "one speculative step: rejection_sample (random mode, k drafts per request) then "
            "gumbel_sample (one fp32 row per request, temperature 1, specfix's fast noise); "
            "gumbel_sample alone by rows"
        ),
        "settings": {
            **s,
            "dtype": "fp32",
            "timing": (
                "specfix.timing.Timer at ci scale. host (host_cost): wall time per call over a "
                "loop of calls, the GPU kept busy by a spin kernel queued first; gpu (time, no flush): CUDA "
                "events around one call queued behind a spin kernel (L2 warm); back_to_back "
                "(time_throughput): wall time per call of a loop of calls, synchronised at the end; "
                "timelines: torch.profiler (which adds its own host time) over one step"
            ),
        },
        "peer": {
            "version": args.version,
            "impl": peer,
            "files_sha256_16": peer_files,
            "loaded": gumbel_peer is not None,
            "rejection_loaded": rejection_peer is not None,
        },
        "impls": ["specfix"] + ([peer] if gumbel_peer is not None else []),
        "timelines": [],
        "rows": [],
        "graph": [],
        "errors": [],
        "skipped": [],
    }


def graph_row(timer: Timer, head: dict, make) -> dict:
    """One step eager and, on a GPU, replayed from one CUDA graph (or why it could not be captured)."""
    row = {**head, "eager": measure(timer, make(False))}
    if timer.settings.cuda:
        try:
            row["graph"] = measure(timer, capture_graph(make(False)).replay)
        except Exception as exc:  # noqa: BLE001  (a step that cannot be captured says why)
            row["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def make_steps(s: dict, device, peer: str, gumbel_peer, rejection_peer) -> dict:
    """batch -> impl -> a maker of that step (annotated for the profiler or not) on one set of inputs."""
    steps = {}
    for batch in s["trace_batches"]:
        inp = step_inputs(batch, s["k"], s["vocab"], device)
        steps[batch] = {"specfix": lambda a, inp=inp: specfix_step(inp, a)}
        if gumbel_peer is not None and rejection_peer is not None:
            steps[batch][peer] = lambda a, inp=inp: peer_step(gumbel_peer, rejection_peer, inp, a)
    return steps


def main(args) -> int:
    device = torch.device(args.device)
    s = sizes(device)
    started = time.perf_counter()
    timer = Timer(Settings(device, "ci"))
    gumbel_peer, rejection_peer, peer_files = peer_modules(args)
    peer = f"vllm_{args.version}"
    data = header(args, s, peer, gumbel_peer, rejection_peer, peer_files)

    def over(section: str) -> bool:
        if time.perf_counter() - started <= args.budget_s:
            return False
        data["skipped"].append(f"{section}: over the {args.budget_s:.0f} s budget")
        return True

    def attempt(section: str, fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001  (a section's failure is recorded; the others still run)
            traceback.print_exc()
            data["errors"].append(f"{section}: {type(exc).__name__}: {exc}"[:500])
        print(f"{section} done ({time.perf_counter() - started:.0f} s)", flush=True)

    steps = make_steps(s, device, peer, gumbel_peer, rejection_peer)
    heads = {
        (i, b): {"impl": i, "batch": b, "k": s["k"], "vocab": s["vocab"]} for b in steps for i in steps[b]
    }

    for (impl, batch), head in heads.items():
        traced = lambda h=head, m=steps[batch][impl]: {**h, **trace_step(m(True), device.type == "cuda")}
        attempt(f"timeline {impl} batch {batch}", lambda traced=traced: data["timelines"].append(traced()))

    # specfix's steps first: a capture that fails can leave the device unusable for later captures
    for impl, batch in sorted(heads, key=lambda ib: ib[0] != "specfix"):
        if not over(f"graph {impl} batch {batch}"):
            row = functools.partial(graph_row, timer, heads[impl, batch], steps[batch][impl])
            attempt(f"graph {impl} batch {batch}", lambda row=row: data["graph"].append(row()))

    for rows in s["rows"]:
        if over(f"rows {rows}"):
            continue
        inp = gumbel_batch(rows, s["vocab"], seed=rows * 7919 + s["vocab"], device=device)
        calls = {"specfix": call_gumbel(inp, "fast")}  # the serving path: the target's draw, fast noise
        if gumbel_peer is not None:
            calls[peer] = gumbel_call(gumbel_peer, inp)
        for impl, call in calls.items():
            head = {"impl": impl, "rows": rows, "vocab": s["vocab"]}
            attempt(
                f"rows {impl} {rows}", lambda h=head, c=call: data["rows"].append({**h, **measure(timer, c)})
            )
        del inp, calls

    data["seconds"] = time.perf_counter() - started
    out = args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="host_trace_")
    path = recorded.save(NAME, data, out)
    errors, skipped = len(data["errors"]), len(data["skipped"])
    print(f"wrote {path} in {data['seconds']:.0f} s; errors: {errors}, skipped: {skipped}")
    for err in data["errors"]:
        print("ERROR", err, file=sys.stderr)
    return 1 if data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
