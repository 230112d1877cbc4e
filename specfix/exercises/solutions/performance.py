"""Reference solutions of chapter 5's exercises (shown in the notebook by ``show_solution``)."""

from specfix.figures.performance import ceilings
from specfix.tools.recorded import load

answer_floor_us = 256 * 151_936 * 4 / (ceilings(load("bench_h200"))["read"] * 1e6)  # bytes / (bytes/us)


def replayed_rows(live_batch: int, capture_sizes: list[int]) -> int:
    """The smallest captured size that holds the batch; with none, the batch runs eagerly at its own size."""
    fitting = [size for size in capture_sizes if size >= live_batch]
    return min(fitting) if fitting else live_batch


# torch.tensor(..., device=...) copies from pageable memory and waits; a pinned non-blocking copy does not.
which_syncs = {"host_mask"}
