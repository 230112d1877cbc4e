"""The rejection sampler's bench cases, beside vLLM's: per step, in one CUDA graph, and host cost per call.

``RejectionSampler.forward``, ``rejection_sample`` and its core, greedy and random."""

from __future__ import annotations

import dataclasses
import functools
import statistics

import torch

from specfix.timing import capture_graph
from specfix.tools.bench import peer as vllm
from specfix.tools.bench.report import Job, find, goal, result, worst
from specfix.tools.syncs import count_host_syncs
from specfix.v1 import rejection_sampler as rs
from specfix.v1.sampling_metadata import SamplingMetadata
from specfix.v1.spec_decode_metadata import SpecDecodeMetadata

#: specfix's rejection calls each goal judges, by impl name.
FORWARD, PUBLIC, CORE = "specfix_triton", "specfix_rejection_sample", "specfix_core"
NAMES = {FORWARD: "RejectionSampler.forward", PUBLIC: "rejection_sample"}


@dataclasses.dataclass
class Step:
    """One verification step's inputs, specfix's and vLLM's calls on them."""

    batch: int
    k: int
    vocab: int
    mode: str
    device: torch.device

    def __post_init__(self):
        gen = torch.Generator(device=self.device).manual_seed(self.batch * 31 + self.k)
        drawn = {"generator": gen, "device": self.device}
        drafts = torch.randint(0, self.vocab, (self.batch, self.k), **drawn)
        drafts[::4, -1] = -1  # every fourth request left a slot empty
        self.metadata = SpecDecodeMetadata.make_dummy(drafts.tolist(), device=self.device)
        self.logits = torch.randn(self.batch * (self.k + 1), self.vocab, **drawn).mul_(3)
        self.target = self.logits[self.metadata.target_logits_indices.long()]  # temperature 1: scaled
        self.bonus = torch.randint(0, self.vocab, (self.batch,), dtype=torch.int32, **drawn)
        self.q = None
        if self.mode == "random":
            self.q = torch.softmax(torch.randn(self.batch * self.k, self.vocab, **drawn), dim=-1)
        self.sampler = rs.RejectionSampler(backend="triton")

    @property
    def params(self) -> dict:
        return {"batch": self.batch, "k": self.k, "vocab": self.vocab, "mode": self.mode}

    def sampling(self, seeds=None) -> SamplingMetadata:
        """Unseeded by default (a seeded request costs one torch launch per generator, in vLLM too)."""
        temps = [0.0 if self.mode == "greedy" else 1.0] * self.batch
        return SamplingMetadata.from_requests(temps, seeds or [None] * self.batch, device=self.device)

    def core_args(self, sampling) -> tuple:
        m = self.metadata
        drafts = (m.draft_token_ids, m.num_draft_tokens, m.max_spec_len, m.cu_num_draft_tokens)
        return (*drafts, self.q, self.target, self.bonus, sampling)

    def calls(self, sampler=None) -> dict:
        """impl -> a no-argument call of specfix's forward (``sampler``: a torch backend instead), public
        ``rejection_sample`` and core ``_rejection_sample``."""
        sampling = self.sampling()
        return {
            FORWARD: functools.partial(sampler or self.sampler, self.metadata, self.q, self.logits, sampling),
            PUBLIC: functools.partial(rs.rejection_sample, *self.core_args(sampling)),
            CORE: functools.partial(rs._rejection_sample, *self.core_args(sampling)),
        }

    def peer_core(self, module, seeds=None):
        meta = vllm.sampling_metadata(module, self.mode, seeds or [None] * self.batch, self.device)
        return functools.partial(
            module.rejection_sample, *self.core_args(meta)[:6], self.bonus.view(-1, 1), meta
        )

    def peer_forward(self, module):
        meta = vllm.sampling_metadata(module, self.mode, [None] * self.batch, self.device)
        return functools.partial(
            vllm.forward_sequence, module, self.metadata, self.q, self.logits, meta, self.mode
        )

    def tables_identical(self, module) -> float:
        seeds = [1000 + i for i in range(self.batch)]
        torch.manual_seed(0)
        theirs = self.peer_core(module, seeds)()
        torch.manual_seed(0)
        ours = rs._rejection_sample(*self.core_args(self.sampling(seeds)))
        return float(torch.equal(ours, theirs))


def _forward_in_graph(timer, step: Step) -> dict:
    """The whole ``RejectionSampler.forward`` captured in one CUDA graph: GPU time per replay and (greedy)
    whether a replay writes the eager call's table."""
    forward = step.calls()[FORWARD]
    tables = []
    graph = capture_graph(lambda: tables.append(forward()))
    t = timer.time(graph.replay)
    same = float(torch.equal(tables[-1], forward())) if step.mode == "greedy" else None
    return result("rejection", "specfix_triton_graph", step.params, t, graph_replays_eager_table=same)


def _shape(s, timer, step: Step) -> list[dict]:
    out = []
    torch_forward = step.calls(rs.RejectionSampler(backend="torch"))[FORWARD]
    peers = vllm.rejection_peers(s.peer, step.mode)
    calls = {**step.calls(), "torch_reference": torch_forward}
    calls.update({vllm.peer_impl(v): step.peer_core(module) for v, module in peers.items()})
    b2b = vllm.back_to_back(timer, s, calls, PUBLIC)
    for impl, call in calls.items():
        t = timer.time(call)
        metrics = {"draft_tokens_per_s": step.batch * step.k / (statistics.median(t) * 1e-6)}
        if impl in b2b:
            metrics["back_to_back_us"] = b2b[impl]
        if not impl.startswith("vllm_"):
            metrics["host_syncs_per_step"] = count_host_syncs(call, s.device)
        out.append(result("rejection", impl, step.params, t, **metrics))
    vllm.speedups(out, {CORE})
    vllm.speedups(out, {PUBLIC}, "back_to_back_us")
    core = next(r for r in out if r["impl"] == CORE)
    for v, module in peers.items():
        core["metrics"][f"tables_identical_{vllm.peer_impl(v)}"] = step.tables_identical(module)
    if s.cuda:
        out.append(_forward_in_graph(timer, step))
    return out


def plan_rejection(s, timer) -> list[Job]:
    batches = s.pick(cpu=(2,), ci=(64,), full=(1, 16, 64, 256))
    ks = s.pick(cpu=(2,), ci=(3,), full=(1, 5))
    vocabs = s.pick(cpu=(512,), ci=(151_936,), full=(32_000, 151_936))

    def run(batch: int, k: int, vocab: int) -> list[dict]:
        return [
            r
            for mode in ("greedy", "random")
            for r in _shape(s, timer, Step(batch, k, vocab, mode, s.device))
        ]

    return [
        Job(f"rejection sampler, batch {b} x k={k}, vocab {v:,}", functools.partial(run, b, k, v))
        for v in vocabs
        for k in ks
        for b in batches
    ]


def shape_label(p: dict) -> str:
    return f"B={p['batch']}, k={p['k']}, V={p['vocab']:,}, {p['mode']}"


def _sync_goals(results, s) -> list[dict]:
    syncs = {
        name: worst(find(results, "rejection", impl), "host_syncs_per_step")[0]
        for impl, name in NAMES.items()
    }
    return [goal("rejection_syncs", n, s, fn=name) for name, n in syncs.items()]


def _peer_goals(results, s) -> list[dict]:
    key = vllm.speedup_key(vllm.GOAL_PEER)
    goals = []
    for r in find(results, "rejection", CORE):
        if key in r["metrics"]:
            same = r["metrics"].get(f"tables_identical_{vllm.peer_impl(vllm.GOAL_PEER)}")
            goals.append(vllm.vs_peer("rejection_core", r, s, shape_label, invert=True))
            goals.append(
                goal("rejection_tables", same, s, peer=vllm.GOAL_PEER, shape=shape_label(r["params"]))
            )
    b2b = vllm.goals_beside("back_to_back", results, s, "rejection", PUBLIC, "rejection_sample", shape_label)
    return goals + b2b


def goals_rejection(results, s):
    goals = []
    graphs = find(results, "rejection", "specfix_triton_graph")
    if graphs:  # GPU runs only
        same, _ = worst(graphs, "graph_replays_eager_table", min)
        goals.append(goal("rejection_graph", same, s, f"{len(graphs)} shapes captured, greedy and random"))
    return goals + _sync_goals(results, s) + _peer_goals(results, s)


def plan_rejection_host(s, timer) -> list[Job]:
    batches = s.pick(cpu=(1,), ci=(1, 8), full=(1, 8, 64))
    k, vocab = 3, s.pick(cpu=512, ci=151_936, full=151_936)
    peers = vllm.rejection_peers(s.peer, "random")

    def run(batch: int) -> list[dict]:
        step = Step(batch, k, vocab, "random", s.device)
        ours = step.calls()
        out = []
        for impl, peer_call in ((FORWARD, step.peer_forward), (PUBLIC, step.peer_core)):
            theirs = {vllm.peer_impl(v): peer_call(module) for v, module in peers.items()}
            calls = {impl: ours[impl]} | theirs
            out += vllm.host_beside(timer, s, "rejection_host", step.params, calls, f"_{NAMES[impl]}")
        return out

    return [Job(f"rejection host cost per call, batch {b}", functools.partial(run, b)) for b in batches]


def goals_rejection_host(results, s):
    return [
        g
        for impl, fn in NAMES.items()
        for g in vllm.goals_beside("host_cost", results, s, "rejection_host", impl, fn, shape_label)
    ]
