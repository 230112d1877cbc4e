"""`python -m specfix bench`: what each fix costs, how close the kernels come to the hardware limit, and the
five small-batch goals beside vLLM's own samplers.

Chapter 5's measurement harness; it has no vLLM counterpart. Read first: :mod:`specfix.timing` (the one timing
harness: what each timer measures), :mod:`.report` (the schema and the goals table), then one module per case
family: :mod:`.gumbel_cases`, :mod:`.rejection_cases`, :mod:`.step_cases` (placeholder fixes, drafter and
DFlash steps); :mod:`.peer` imports vLLM's samplers for ``--peer``. On a CPU only tiny smoke sizes run, Triton
kernels through the interpreter: those timings say nothing about speed, and no goal is judged. Every report
carries one ``meta`` block (``recorded.gpu_meta("bench_h200")``): one run, one machine.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

import torch

from specfix import runtime
from specfix.timing import Settings, Timer, capture_graph  # noqa: F401
from specfix.tools import recorded
from specfix.tools.bench import gumbel_cases as gc
from specfix.tools.bench import rejection_cases as rc
from specfix.tools.bench import step_cases as sc
from specfix.tools.bench.gumbel_cases import JUDGED, OURS  # noqa: F401  (the names chapters and scripts use)
from specfix.tools.bench.peer import GOAL_PEER, load_peer, peer_impl, speedup_key  # noqa: F401
from specfix.tools.bench.report import SCHEMA, Case, Unavailable, frame, render, result, validate, write_json  # noqa: F401

CPU_NOTE = (
    "CPU smoke run: Triton kernels ran in the interpreter and GPU work on the CPU. These timings mean "
    "nothing about GPU speed; they only show that every case runs. Goals are not judged."
)
CUDA_NOTE = (
    "CUDA events after warm-up, L2 flushed before each call, the host shielded (back_to_back_us: "
    "not shielded); graph cases divide one replay of many captured calls by their number; host "
    "cases time the host alone. Medians with p20/p80."
)

# fmt: off
#: Every case: name, what it measures, its planner and its goals.
CASES: dict[str, Case] = {c.name: c for c in [
    Case("ceilings", "device copy and fp32 argmax read bandwidth", gc.plan_ceilings),
    Case("gumbel", "gumbel_sample vs softmax+multinomial and torch Gumbel-max, GPU time and back to back",
         gc.plan_gumbel, gc.goals_gumbel),
    Case("gumbel_graph", "few rows per call in a CUDA graph", gc.plan_gumbel_graph, gc.goals_gumbel_graph),
    Case("gumbel_host", "gumbel_sample's host cost per call", gc.plan_gumbel_host, gc.goals_gumbel_host),
    Case("gumbel_mask", "masked vs unmasked gumbel kernel, interleaved repeats", gc.plan_gumbel_mask,
         gc.goals_gumbel_mask),
    Case("placeholder_fixes", "chapter 2's three placeholder fixes per step, host syncs counted",
         sc.plan_placeholder_fixes, sc.goals_placeholder_fixes),
    Case("drafter_graph", "chapter 3's drafter step and the DFlash step: eager, CUDA-graph replay, syncs",
         sc.plan_drafter_graph, sc.goals_drafter_graph),
    Case("rejection", "RejectionSampler per step (greedy, random) at realistic sizes", rc.plan_rejection,
         rc.goals_rejection),
    Case("rejection_host", "RejectionSampler.forward's and rejection_sample's host cost per call",
         rc.plan_rejection_host, rc.goals_rejection_host),
]}
# fmt: on


def _settings(device, scale: str, only, peer) -> tuple[Settings, list[str]]:
    """Checked arguments: the settings and the case names to run."""
    if str(device) not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {str(device)!r}")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for, but torch sees no CUDA GPU")
    if device.type == "cuda" and runtime.INTERPRET:
        raise ValueError("device 'cuda' asked for, but specfix.runtime chose the CPU (check SPECFIX_DEVICE)")
    if scale not in ("ci", "full"):
        raise ValueError(f"scale must be 'ci' or 'full', got {scale!r}")
    names = list(CASES) if only is None else list(dict.fromkeys(only))
    if not names:
        raise ValueError(f"--only names no case (leave it out to run them all); known: {', '.join(CASES)}")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise ValueError(f"--only: unknown case name(s) {unknown}; known: {', '.join(CASES)}")
    loaded = load_peer(peer) if peer is not None else None  # a wrong folder is an error on a CPU too
    # vLLM's kernels need the GPU (they call libdevice, which Triton's interpreter lacks)
    return Settings(device, scale, loaded if device.type == "cuda" else None), names


def _run_jobs(report: dict, names: list[str], settings: Settings, progress: bool) -> None:
    from tqdm.auto import tqdm

    timer = Timer(settings)
    jobs = []
    for name in names:
        try:
            jobs += [(name, job) for job in CASES[name].plan(settings, timer)]
        except Unavailable as exc:
            report["unavailable"].append({"case": name, "reason": str(exc)})
    for name, job in tqdm(jobs, desc="specfix bench", unit="job", disable=not progress):
        try:
            report["results"] += job.run()
        except Unavailable as exc:
            report["unavailable"].append({"case": name, "reason": f"{job.label}: {exc}"})
        except Exception as exc:  # noqa: BLE001  (one failing job must not lose the rest of the run)
            report["errors"].append(_error(name, job.label, exc))
            if _gpu_lost(exc):
                break
        if settings.cuda:
            try:
                torch.cuda.empty_cache()
            except Exception as exc:  # noqa: BLE001  (an asynchronous fault of this job surfaces here)
                report["errors"].append(_error(name, job.label, exc))
                break


def _error(case: str, job: str, exc: BaseException) -> dict:
    text = "".join(traceback.format_exception_only(exc)).strip()
    if _gpu_lost(exc):  # the process's CUDA context is unusable from here on: the run stops, and says so
        text += " (the run stopped here: after a CUDA error no later job can run in this process)"
    return {"case": case, "job": job, "error": text}


def _gpu_lost(exc: BaseException) -> bool:
    """A CUDA error (an illegal address, a device-side assert) poisons the process's GPU context."""
    return isinstance(exc, getattr(torch, "AcceleratorError", ())) or "CUDA error" in str(exc)


def run(
    device: str | torch.device = "cpu",
    scale: str = "ci",
    only: list[str] | None = None,
    progress: bool = True,
    peer: str | Path | None = None,
) -> dict:
    """Run the named cases (all by default) and return the report (schema: :mod:`.report`); with ``peer``
    (filled by ``scripts/fetch_vllm_peer.py``) vLLM's samplers are timed beside specfix's."""
    settings, names = _settings(device, scale, only, peer)
    started = time.perf_counter()
    report = {
        "schema": SCHEMA,
        "meta": {**recorded.gpu_meta("bench_h200"), "scale": scale},
        "config": {"device": settings.device.type, "scale": scale, "cases": names},
        "timing_note": CUDA_NOTE if settings.cuda else CPU_NOTE,
        **{key: [] for key in ("results", "goals", "unavailable", "errors")},
    }
    if peer is not None and settings.peer is None:
        why = "vLLM's kernels were not timed: they need a GPU (they call libdevice, the interpreter lacks it)"
        report["unavailable"].append({"case": "peer", "reason": why})
    if settings.peer:
        report["meta"]["peer"] = settings.peer.describe()
    _run_jobs(report, names, settings, progress)
    for name in names:
        if not any(u["case"] == name for u in report["unavailable"]):
            report["goals"] += CASES[name].goals(report["results"], settings)
    report["elapsed_s"] = round(time.perf_counter() - started, 2)
    return report
