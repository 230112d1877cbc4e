"""Whole-step bench cases: chapter 2's placeholder fixes, chapter 3's drafter step and the DFlash step.

Each counts its host syncs, and checks that one CUDA graph of the step replays the eager drafts."""

from __future__ import annotations

import functools
import statistics

import torch

from specfix.lab import placeholder_fixes as pf
from specfix.models import load_models
from specfix.mrv2.dflash import DFlashDrafter, ToyDFlashModel
from specfix.mrv2.speculator import DraftModelSpeculator
from specfix.timing import capture_graph
from specfix.tools.bench.report import Job, find, goal, result, worst
from specfix.tools.syncs import count_host_syncs


def plan_placeholder_fixes(s, timer) -> list[Job]:
    token_counts = s.pick(cpu=(256,), ci=(256, 8192), full=(256, 2048, 8192))

    def run(num_tokens: int) -> list[dict]:
        step = pf.make_step(num_tokens, device=s.device)
        restore = functools.partial(step.input_ids.copy_, step.pristine)
        out = []
        for fix in pf.FIXES:
            metrics = {}
            if s.cuda:
                syncs = pf.count_syncs(fix, step)
                metrics["host_syncs_per_step"] = syncs["debug_mode"]
                metrics["host_syncs_profiler"] = syncs.get("profiler")
                # a fix that synchronises makes the host wait for the GPU work queued before it
                behind = pf.time_fix(fix, step, repeats=50, busy_us=200.0)
                metrics["host_us_behind_busy_gpu"] = behind["host_us"]
            t = timer.time_step(functools.partial(pf.APPLY[fix], step), setup=restore)
            out.append(result("placeholder_fixes", fix, {"num_tokens": num_tokens, "k": 3}, t, **metrics))
        return out

    return [Job(f"placeholder fixes at {n:,} tokens", functools.partial(run, n)) for n in token_counts]


def goals_placeholder_fixes(results, s):
    syncs, _ = worst(find(results, "placeholder_fixes", "clamp"), "host_syncs_per_step")
    return [goal("clamp_syncs", syncs, s)]


class StandInDrafter(torch.nn.Module):
    """A drafter head of realistic shape (embedding, two MLP layers, LM head): the n-gram draft model is a few
    table lookups, this gives chapter 3's step the kernels and weight traffic of a small MTP/EAGLE head."""

    def __init__(self, vocab_size: int, hidden: int, device):
        super().__init__()
        gen = torch.Generator().manual_seed(0)

        def init(*shape):
            return torch.nn.Parameter(torch.randn(*shape, generator=gen) / shape[-1] ** 0.5)

        self.vocab_size = vocab_size
        self.embed = init(vocab_size, hidden)
        self.layers = torch.nn.ParameterList([init(hidden, hidden) for _ in range(2)])
        self.lm_head = init(vocab_size, hidden)
        self.requires_grad_(False)
        self.to(device)

    def next_token_logits(self, context_ids: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.embedding(context_ids[:, -1], self.embed)
        for w in self.layers:
            h = torch.nn.functional.silu(h @ w.T)
        return h @ self.lm_head.T


MAX_REQS, K = 64, 3


class Drafter:
    """One drafter model behind chapter 3's speculator, with the inputs of a step at live batch ``b``."""

    def __init__(self, s, model_name: str):
        vocab, hidden = s.pick(cpu=(512, 32), ci=(32_000, 512), full=(32_000, 512))
        if model_name == "ngram_draft":
            model = load_models(s.device)[1]
            context_len, extra = model.order - 1, {}
        else:
            model, context_len, extra = StandInDrafter(vocab, hidden, s.device), 1, {"hidden": hidden}
        self.device = s.device
        sizes = {"max_num_reqs": MAX_REQS, "num_speculative_steps": K, "vocab_size": model.vocab_size}
        self.spec = DraftModelSpeculator(model, **sizes, context_len=context_len, device=s.device)
        gen = torch.Generator(device=s.device).manual_seed(3)
        shape = (MAX_REQS, context_len)
        self.context = torch.randint(0, model.vocab_size, shape, generator=gen, device=s.device)
        self.spec.context_ids.copy_(self.context)
        self.params = {"k": K, "vocab": model.vocab_size, "model": model_name, **extra}
        self.eager_us: dict[int, float] = {}
        self._inputs: dict[int, tuple] = {}

    def _requests(self, b: int) -> tuple:
        """Slots 0..63, temperature 1, seeds drawn for ``b``; made once (a graph capture reuses them)."""
        if b not in self._inputs:
            gen = torch.Generator(device=self.device).manual_seed(b)
            self._inputs[b] = (
                torch.arange(MAX_REQS, dtype=torch.int32, device=self.device),
                torch.ones(MAX_REQS, dtype=torch.float32, device=self.device),
                torch.randint(0, 2**31, (MAX_REQS,), generator=gen, device=self.device),
                self.context[:b].clone(),
                torch.zeros(b, dtype=torch.int64, device=self.device),
            )
        return self._inputs[b]

    def live(self, b: int) -> int:
        """Make rows 0..b-1 live; return the padded size b dispatches to."""
        self.spec._copy_request_inputs(b, *self._requests(b)[:3])
        return self.spec.dispatcher.dispatch(b).num_reqs_padded

    def propose(self, b: int):
        """A whole drafting step: request inputs copied in, k draft steps; returns the drafts."""
        return self.spec.propose(b, *self._requests(b)).draft_tokens

    def draft(self, b: int, graph: bool, padded: int):
        """k draft steps over rows 0..b-1: eager, or (``graph``) the graph captured for ``padded`` replays."""
        self.spec.context_ids.copy_(self.context)  # a step feeds its drafts back: reset, so all draft alike
        if graph:
            self.spec.graphs.replay(padded)
        else:
            self.spec._draft_step(b)


def replays_eager(step, s) -> float | None:
    """1.0 when ``step()`` captured whole in one CUDA graph replays the eager result, 0.0 when it does not
    (or cannot be captured); None on a CPU."""
    if not s.cuda:
        return None
    eager = step().clone()
    outputs = []
    try:
        graph = capture_graph(lambda: outputs.append(step()))
    except RuntimeError:  # a host sync or a host read inside the step: it cannot be captured
        torch.cuda.synchronize()
        return 0.0
    graph.replay()
    torch.cuda.synchronize()
    return float(torch.equal(outputs[-1], eager))


def plan_drafter_graph(s, timer) -> list[Job]:
    batches = s.pick(cpu=(3,), ci=(1, 5, 16, 64), full=tuple(range(1, MAX_REQS + 1)))
    built: dict[str, Drafter] = {}

    def run(name: str, graph: bool) -> list[dict]:
        if name not in built:  # the eager and the graph job share one drafter (the graph job reads its times)
            built[name] = Drafter(s, name)
        d = built[name]
        if graph:
            d.spec.capture_cuda_graphs()
        out = []
        for b in batches:
            padded = d.live(b)
            t = timer.time_throughput(functools.partial(d.draft, b, graph, padded))
            if not graph:
                d.eager_us[b] = statistics.median(t)
            propose = functools.partial(d.propose, b)
            metrics = {"host_syncs_per_step": count_host_syncs(propose, s.device)}
            if graph and b in d.eager_us:
                metrics["speedup"] = d.eager_us[b] / statistics.median(t)
            if not graph and b == batches[-1]:
                metrics["whole_step_graph_replays_eager"] = replays_eager(propose, s)
            params = {"live_batch": b, "padded_batch": padded, **d.params}
            out.append(result("drafter_graph", "graph" if graph else "eager", params, t, **metrics))
        return out

    span = f"live batches {batches[0]}..{batches[-1]}"
    jobs = [Job("DFlash drafting step", functools.partial(run_dflash, s, timer))]
    for m in ("standin_mlp", "ngram_draft"):
        for graph in (False, True) if s.cuda else (False,):
            how = "CUDA-graph replay" if graph else "eager"
            jobs.append(Job(f"drafter step ({m}), {how}, {span}", functools.partial(run, m, graph)))
    return jobs


def run_dflash(s, timer) -> list[dict]:
    """The DFlash drafting step (inputs prepared, block drafter, every draft sampled), eager: its time,
    host syncs, and whether the whole step captured in one CUDA graph replays the eager drafts."""
    vocab, m, k, live = s.pick(cpu=(64, 4, 3, 2), ci=(4096, 16, 3, 8), full=(32_000, 64, 3, 32))
    model = ToyDFlashModel(vocab).to(s.device)
    drafter = DFlashDrafter(model, max_num_reqs=m, num_speculative_steps=k, device=s.device)
    gen = torch.Generator(device=s.device).manual_seed(5)
    idx = torch.randperm(m, generator=gen, device=s.device)[:live].int()
    last = torch.randint(0, vocab, (m,), generator=gen, device=s.device)
    num_computed = torch.randint(8, 4096, (m,), generator=gen, device=s.device)
    step = functools.partial(drafter.propose, live, idx, last, num_computed, padded=False)
    t = timer.time_throughput(step)
    params = {"live_batch": live, "padded_batch": m, "k": k, "vocab": vocab, "model": "toy_dflash"}
    metrics = {"host_syncs_per_step": count_host_syncs(step, s.device)}
    metrics["whole_step_graph_replays_eager"] = replays_eager(step, s)
    return [result("drafter_graph", "dflash_eager", params, t, **metrics)]


def goals_drafter_graph(results, s):
    goals = []
    dflash = find(results, "drafter_graph", "dflash_eager")
    drafter = [r for r in find(results, "drafter_graph") if r["impl"] != "dflash_eager"]
    for fn, rows in (
        ("the DFlash drafting step", dflash),
        ("a drafting step (propose, eager or replayed)", drafter),
    ):
        syncs, row = worst(rows, "host_syncs_per_step")
        p = row["params"] if row else {}
        detail = f"worst: {row['impl']}, {p['model']}, live batch {p['live_batch']}" if row else ""
        goals.append(goal("step_syncs", syncs, s, detail, fn=fn))
        goals.append(goal("step_graph", worst(rows, "whole_step_graph_replays_eager", min)[0], s, fn=fn))
    return goals
