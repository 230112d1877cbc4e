"""The one timing harness: the bench, the recorders, chapter 4 and the lab's timers all time through it.

The recorders are ``scripts/time_gumbel.py`` and ``record_host_trace.py``; the lab's timers are
``time_fix``, ``time_guard`` and ``time_eager_vs_graph``.

On CUDA a call is bracketed by CUDA events after a warm-up, in four ways that each answer one question
(read :meth:`Timer.time`, ``time_in_graph``, ``host_cost`` and ``time_throughput``). On a CPU every way falls
back to ``perf_counter`` around each call: those timings say nothing about GPU speed.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch


def percentile(samples: list[float], q: float) -> float:
    """numpy's linear-interpolated percentile, q in [0, 100]."""
    if not len(samples):
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"q must lie in [0, 100], got {q}")
    return float(np.percentile(samples, q))


def summarize(samples_us: list[float]) -> dict:
    """Median and p20/p80 of per-call times in microseconds."""
    return {
        "median_us": statistics.median(samples_us),
        "p20_us": percentile(samples_us, 20),
        "p80_us": percentile(samples_us, 80),
        "n": len(samples_us),
    }


def tb_per_s(nbytes: float, time_us: float) -> float:
    """Terabytes (1e12 bytes) per second for ``nbytes`` moved in ``time_us`` microseconds."""
    return nbytes / (time_us * 1e-6) / 1e12


def g_logits_per_s(rows: int, vocab: int, time_us: float) -> float:
    """Billions of logits consumed per second."""
    return rows * vocab / (time_us * 1e-6) / 1e9


@dataclasses.dataclass(frozen=True)
class Settings:
    """Where and how hard to measure, and the peer (vLLM's own code, ``peer.Peer``) beside specfix, if any."""

    device: torch.device
    scale: str
    peer: object = None

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def pick(self, cpu, ci, full):
        if not self.cuda:
            return cpu
        return full if self.scale == "full" else ci


def _event_pair() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def _sync(settings: Settings) -> None:
    if settings.cuda:
        torch.cuda.synchronize()


def wall_us(fn: Callable[[], object], reps: int, setup: Callable[[], object] | None = None) -> list[float]:
    """Host wall time of each of ``reps`` calls of ``fn``, in us; ``setup()`` runs untimed before each."""
    out = []
    for _ in range(reps):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


@functools.cache
def _cycles_per_us() -> float:
    """How many ``torch.cuda._sleep`` cycles this GPU spins per microsecond, measured once."""
    start, end = _event_pair()
    torch.cuda._sleep(1_000_000)  # warm-up
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / (start.elapsed_time(end) * 1e3)


def spin(us: float) -> None:
    """Queue about ``us`` microseconds of GPU spinning: work queued next waits behind it, not the host."""
    torch.cuda._sleep(int(us * _cycles_per_us()))


class Timer:
    """Per-call times in microseconds: CUDA events on a GPU, ``perf_counter`` on a CPU."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.warmup = settings.pick(cpu=1, ci=3, full=5)
        self.budget_ms = settings.pick(cpu=0.0, ci=30.0, full=120.0)
        self.min_reps = settings.pick(cpu=3, ci=10, full=15)
        self.max_reps = settings.pick(cpu=3, ci=50, full=200)
        self.warm_ms = settings.pick(cpu=0.0, ci=5.0, full=20.0)
        self.host_us = 0.0  # one call's host time, set by warm(): sizes the spins queued before timed calls
        self.gpu_stayed_busy = True  # host_cost's last loops all returned before the GPU ran dry
        self._flush = None

    def _flush_l2(self):
        if self._flush is None:
            self._flush = torch.empty(256 * 2**20, dtype=torch.int8, device=self.settings.device)
        self._flush.zero_()

    def _reps(self, fn: Callable[[], object]) -> int:
        """As many repetitions as fit the budget, judged from a few timed calls."""
        start, end = _event_pair()
        start.record()
        for _ in range(3):
            fn()
        end.record()
        torch.cuda.synchronize()
        per_call_ms = max(start.elapsed_time(end) / 3, 1e-3)
        return int(min(self.max_reps, max(self.min_reps, self.budget_ms / per_call_ms)))

    def warm(self, fn: Callable[[], object]) -> None:
        """A few calls (compiles, first allocations), then, on a GPU, calls until ``warm_ms`` of wall time
        has passed: a path the process has not run yet can stay slow for many calls, not only the first."""
        for _ in range(self.warmup):
            fn()
        if not self.settings.cuda:
            return
        torch.cuda.synchronize()
        start = time.perf_counter()
        while (time.perf_counter() - start) * 1e3 < self.warm_ms:
            fn()
            torch.cuda.synchronize()
        self.host_us = min(min(wall_us(fn, 3)), 5000.0)  # capped: never minutes of spinning
        torch.cuda.synchronize()

    def time(self, fn: Callable[[], object], flush: bool = True, shield: bool = True) -> list[float]:
        """Per-call time of ``fn``, L2 flushed first (``flush``); ``shield`` keeps the GPU busy while the host
        launches, so a short kernel is timed alone (False: back-to-back as ``do_bench``, slow hosts show)."""
        self.warm(fn)
        if not self.settings.cuda:
            return wall_us(fn, self.min_reps)
        events = [_event_pair() for _ in range(self._reps(fn))]
        torch.cuda.synchronize()
        for start, end in events:
            if flush:
                self._flush_l2()
            if shield:  # outlasts the host's launch work twice over
                spin(2 * self.host_us + 500)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e3 for start, end in events]

    def time_step(self, fn: Callable[[], object], setup: Callable[[], object]) -> list[float]:
        """A step on an idle GPU: ``setup()`` (untimed), synchronise, then events around ``fn()`` (its host
        work included, since the end event is queued only when the call returns)."""
        for _ in range(self.warmup):
            setup()
            fn()
        if not self.settings.cuda:
            return wall_us(fn, self.min_reps, setup)
        samples = []
        for _ in range(self.max_reps):
            setup()
            torch.cuda.synchronize()
            start, end = _event_pair()
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        return samples

    def time_throughput(self, fn: Callable[[], object]) -> list[float]:
        """Host wall time per call over back-to-back calls, then one synchronise: what a serving loop pays
        per step, host launch cost included (no flush, which would hide launch gaps behind it)."""
        calls = self.settings.pick(cpu=1, ci=20, full=20)
        self.warm(fn)
        samples = []
        for _ in range(self.settings.pick(cpu=self.min_reps, ci=5, full=7)):
            _sync(self.settings)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            _sync(self.settings)
            samples.append((time.perf_counter() - t0) * 1e6 / calls)
        return samples

    def host_cost(self, fn: Callable[[], object]) -> list[float]:
        """Host wall time per call while the GPU is still busy with earlier work (nothing waits on it):
        argument checks, allocations and launches alone (:attr:`gpu_stayed_busy` says whether it did)."""
        # few calls a sample: 20 calls of ~20 launches stay under the ~1,000 launches CUDA queues before a
        # launch blocks, which would time the GPU's throughput instead of the host's work
        calls = self.settings.pick(cpu=3, ci=20, full=20)
        self.warm(fn)
        samples, self.gpu_stayed_busy = [], True
        for _ in range(self.settings.pick(cpu=3, ci=10, full=10)):
            if self.settings.cuda:
                torch.cuda.synchronize()
                spin(2 * calls * self.host_us + 1000)  # outlasts the loop twice over
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - t0) * 1e6 / calls)
            if self.settings.cuda:
                self.gpu_stayed_busy &= not torch.cuda.current_stream().query()
        _sync(self.settings)
        return samples

    def rounds(
        self, calls: dict, repeats: int, measure: str = "time", **kwargs
    ) -> dict[str, list[list[float]]]:
        """Each of ``calls`` (name -> call) measured by the method ``measure`` (with ``kwargs``) once a round,
        in turn, for ``repeats`` rounds (A, B, A, B...): a drift in the machine's speed hits every call
        alike. Each name gets one sample list per round."""
        out = {name: [] for name in calls}
        for _ in range(repeats):
            for name, fn in calls.items():
                out[name].append(getattr(self, measure)(fn, **kwargs))
        return out

    def interleaved(self, fn_a, fn_b, repeats: int) -> tuple[list[float], list[float]]:
        """``repeats`` medians of a full :meth:`time` of A and of B, in :meth:`rounds`: the spread of the
        medians is the measure's own uncertainty."""
        r = self.rounds({"a": fn_a, "b": fn_b}, repeats)
        return [statistics.median(x) for x in r["a"]], [statistics.median(x) for x in r["b"]]

    def time_in_graph(self, fn: Callable[[], object], calls: int) -> list[float]:
        """GPU time per call: ``calls`` calls captured in one CUDA graph, each replay divided by ``calls``.
        On a CPU (no graphs) the calls simply run in a loop."""

        def many():
            for _ in range(calls):
                fn()

        replay = capture_graph(many).replay if self.settings.cuda else many
        return [t / calls for t in self.time(replay, flush=False)]


def capture_graph(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream (compiles kernels, settles allocations), then capture it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph
