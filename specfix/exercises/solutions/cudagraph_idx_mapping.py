"""Reference solutions of chapter 3's exercises (``specfix.exercises.cudagraph_idx_mapping``)."""

from __future__ import annotations

import torch

from specfix.lab.invariance import check_speculator
from specfix.mrv2.cudagraph import CudaGraphDispatcher


def pad_idx_mapping(buffer, idx_mapping, num_reqs):
    """Write the batch into the persistent buffer in place (the graph reads this address), -1 after it."""
    buffer[:num_reqs].copy_(idx_mapping[:num_reqs])
    buffer[num_reqs:].fill_(-1)  # every row past the batch: the replay's size is picked afterwards


# Row 5 names f's slot, but f finished: a free slot, no harm. Row 6 names slot 6: g's, still live at row 4.
# Row 7 was never written: it still holds the buffer's first value, 0, and slot 0 is a's.
stale_victims = {"a", "g"}


def find_stale_row(mystery):
    """The padded row whose stale entry names a slot that the invariance report shows corrupted."""
    report = check_speculator(mystery.spec, *mystery.inputs)
    corrupted = report.rows("draft_logits", "reference")  # live slots where the padding as left differs
    idx = mystery.spec.idx_mapping.tolist()
    row = next(r for r in range(len(mystery.batch), len(idx)) if idx[r] in corrupted)
    return row, idx[row]


def simulate_idx_mapping(events, max_num_reqs):
    """The persistent buffer of the unfixed speculator: each step overwrites only its own rows."""
    buffer = [0] * max_num_reqs  # created as zeros: a row never written names slot 0
    slots = {}  # live request -> its request-state slot
    for event in events:
        verb, names = event.split()
        if verb == "finish":
            for name in names:
                del slots[name]  # the slot is free again; idx_mapping is not touched
            continue
        for name in names:  # a newcomer takes the lowest free slot ("step" and "arrive" alike)
            if name not in slots:
                slots[name] = min(set(range(max_num_reqs)) - set(slots.values()))
        if verb == "step":
            for row, name in enumerate(names):  # batch row -> slot; rows past the batch keep old values
                buffer[row] = slots[name]
    return buffer


def sample_idx_mapping(idx_mapping, num_reqs, k, max_num_reqs):
    """DFlash's expanded idx_mapping: each live request's slot once per drafted token, then -1 up to the
    max_num_reqs * k entries a FULL graph samples (the rows past num_reqs are stale: never read them)."""
    live = idx_mapping[:num_reqs].long().repeat_interleave(k)  # request by request: s0 s0 s0 s1 s1 s1
    return torch.cat([live, torch.full(((max_num_reqs - num_reqs) * k,), -1, dtype=torch.long)])


def corrupted_responses(events, max_num_reqs):
    """Replay the buffer step by step: a padded row naming the slot of a request that waits with drafts
    overwrites their cached logits, and its response shows it when a later step verifies them."""
    graphs = CudaGraphDispatcher(max_num_reqs)  # the capture sizes: 1, 2, 4, 8, ...
    buffer, slots, drafted, hit, corrupted = [0] * max_num_reqs, {}, set(), set(), set()
    for event in events:
        verb, names = event.split()
        if verb == "finish":  # its response is complete: nothing overwritten now can reach it
            for name in names:
                del slots[name]
                hit.discard(name)
            continue
        for name in names:
            if name not in slots:
                slots[name] = min(set(range(max_num_reqs)) - set(slots.values()))
        if verb == "arrive":
            continue
        corrupted |= hit & set(names)  # the step verifies their drafts against the overwritten logits
        hit -= set(names)  # ... then drafts anew, caching fresh logits
        for row, name in enumerate(names):
            buffer[row] = slots[name]
        owner = {slot: name for name, slot in slots.items()}
        padded = graphs.dispatch(len(names)).num_reqs_padded
        waiting = {owner.get(slot) for slot in buffer[len(names) : padded]} - set(names)
        hit |= waiting & drafted  # a request that never drafted has no cache to lose yet (None: a free slot)
        drafted |= set(names)
    return corrupted
