"""CUDA-graph capture sizes, batch dispatch to a captured size, and real capture/replay on a GPU.

Mirrors vLLM 0.33.0's ``vllm/config/vllm.py`` (``_set_cudagraph_sizes``: which batch sizes get a graph) and
``vllm/v1/worker/gpu/cudagraph_utils.py`` (``dispatch``: the smallest captured size that fits). A graph
replays a step's many small launches with one call, so every replay must see the same shapes and buffer
addresses: a batch of 5 replays the graph captured for 8, and its 3 *padded rows* run too, reading whatever
the persistent buffers hold there. Read ``CudaGraphDispatcher.dispatch`` first.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specfix.checks import check_count, is_int
from specfix.timing import Settings, Timer

#: Largest graph vLLM captures by default (``max_cudagraph_capture_size``).
MAX_CAPTURE_SIZE = 512


def cudagraph_capture_sizes(max_capture_size: int = MAX_CAPTURE_SIZE) -> list[int]:
    """vLLM's default capture sizes: 1, 2, 4, then every 8 below 256, then every 16 up to the maximum."""
    check_count("max_capture_size", max_capture_size)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, max_capture_size + 1, 16)]
    return [s for s in sizes if s <= max_capture_size]


def capture_sizes(
    max_num_seqs: int,
    num_speculative_tokens: int = 0,
    max_num_batched_tokens: int = 8192,
    *,
    v1_runner: bool = False,
) -> list[int]:
    """vLLM 0.33.0's default capture sizes in tokens (``VllmConfig._set_cudagraph_sizes``, balanced mode):
    the grid, ``max_num_batched_tokens`` if it fits, and every uniform decode size ``n * (1 + k)``."""
    check_count("max_num_seqs", max_num_seqs)
    check_count("num_speculative_tokens", num_speculative_tokens, low=0)
    check_count("max_num_batched_tokens", max_num_batched_tokens)
    q = 1 + num_speculative_tokens
    ceiling = min(max_num_seqs * q * 2, MAX_CAPTURE_SIZE)  # vLLM's default max_cudagraph_capture_size
    seqs = {n for n in cudagraph_capture_sizes() if n <= max_num_seqs} | {min(max_num_seqs, MAX_CAPTURE_SIZE)}
    decode = [n * q for n in seqs if n * q <= ceiling]
    cap = min(ceiling, max_num_batched_tokens)
    sizes = {*cudagraph_capture_sizes(cap), *(s for s in decode if s <= max_num_batched_tokens)}
    if max_num_batched_tokens <= cap:
        sizes.add(max_num_batched_tokens)
    # The V1 runner under FULL decode graphs rounds each size up to a multiple of 1 + k and drops those past
    # the largest (adjust_cudagraph_sizes_for_spec_decode, vLLM 0.33.0's vllm/config/compilation.py); MRV2
    # skips that step (vLLM PR #45953).
    if v1_runner and q > 1:
        top = max(sizes)
        sizes = {-(-s // q) * q for s in sizes if -(-s // q) * q <= top}
        if not sizes:
            raise ValueError(f"no capture size is a multiple of 1 + k = {q} within {top}")
    return sorted(sizes)


@dataclass(frozen=True)
class BatchDescriptor:
    """What a batch runs as: a FULL graph replay at ``num_reqs_padded`` rows, or eager (``NONE``)."""

    num_reqs: int
    num_reqs_padded: int
    cg_mode: str  # "FULL" or "NONE"

    @property
    def padded_rows(self) -> range:
        """Batch rows the replay processes although no live request sits there."""
        return range(self.num_reqs, self.num_reqs_padded)


def check_num_reqs(num_reqs: object, max_num_reqs: int) -> None:
    """A batch holds 1 to ``max_num_reqs`` requests: the size every persistent buffer was allocated for."""
    if not is_int(num_reqs):
        raise TypeError(f"num_reqs must be an int, got {type(num_reqs).__name__}")
    if not 1 <= num_reqs <= max_num_reqs:
        raise ValueError(f"num_reqs={num_reqs} outside [1, max_num_reqs={max_num_reqs}]")


class CudaGraphDispatcher:
    """Maps a batch of ``num_reqs`` decode requests (one query token each, as in the drafter) to the
    smallest captured size that holds it, like vLLM's ``CudaGraphManager.dispatch``."""

    def __init__(self, max_num_reqs: int, capture_sizes: Sequence[int] | None = None):
        check_count("max_num_reqs", max_num_reqs)
        sizes = cudagraph_capture_sizes() if capture_sizes is None else list(capture_sizes)
        if any(not is_int(s) or s < 1 for s in sizes):
            raise ValueError(f"capture_sizes must be positive ints, got {sizes}")
        self.max_num_reqs = max_num_reqs
        self.capture_sizes = sorted({s for s in sizes if s <= max_num_reqs})

    def dispatch(self, num_reqs: int) -> BatchDescriptor:
        check_num_reqs(num_reqs, self.max_num_reqs)
        for size in self.capture_sizes:
            if size >= num_reqs:
                return BatchDescriptor(num_reqs, size, "FULL")
        return BatchDescriptor(num_reqs, num_reqs, "NONE")  # too big for every graph: eager, exact size


class CapturedStep:
    """One ``torch.cuda.CUDAGraph`` per size for ``step(size)``, which must touch only tensors that outlive
    the graphs, never sync with the host and launch the same kernels every call."""

    def __init__(self, step: Callable[[int], None], sizes: Sequence[int], device: torch.device | str):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        pool = None
        for size in sorted(set(sizes), reverse=True):  # PyTorch's recipe: largest first, one shared pool
            side = torch.cuda.Stream(device)  # warm-up here: Triton compiles, the allocator settles
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    step(size)
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                step(size)
            pool = graph.pool() if pool is None else pool
            self.graphs[size] = graph
        torch.cuda.synchronize(device)

    def replay(self, size: int) -> None:
        if size not in self.graphs:
            raise ValueError(f"no graph captured for size {size}; captured: {sorted(self.graphs)}")
        self.graphs[size].replay()


def time_eager_vs_graph(
    step: Callable[[int], None], sizes: Sequence[int], device: torch.device | str
) -> list[dict[str, float]]:
    """Median microseconds per call, eager launches versus one graph replay, for each size (GPU only): host
    wall time over back-to-back calls, what a serving loop pays per step, launch overhead included."""
    captured = CapturedStep(step, sizes, device)
    timer = Timer(Settings(torch.device(device), "full"))

    def median_us(fn, size: int) -> float:
        return statistics.median(timer.time_throughput(functools.partial(fn, size)))

    return [
        {"size": s, "eager_us": median_us(step, s), "graph_us": median_us(captured.replay, s)} for s in sizes
    ]
