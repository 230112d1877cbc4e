"""vLLM's own samplers, timed beside specfix's on the same inputs (``specfix bench --peer .peer``).

``scripts/fetch_vllm_peer.py`` takes them from vLLM's released wheels into a folder outside git; they are only
imported and timed here, never copied into specfix. Per-shape goals are judged against :data:`GOAL_PEER`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import statistics
from pathlib import Path

import torch

from specfix.lab.masked_gumbel import BATCH_KEYS, load_vllm_sampler
from specfix.tools.bench.report import find, goal, result

#: The vLLM release every per-shape goal is judged against.
GOAL_PEER = "0.33.0"


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


@dataclasses.dataclass(frozen=True)
class Peer:
    """The imported modules: ``gumbel`` and ``rejection`` map a version ("0.33.0") to vLLM's module."""

    gumbel: dict[str, object]
    rejection: dict[str, object]

    def describe(self) -> dict:
        gumbel, rejection = (sorted(m, key=_version_key) for m in (self.gumbel, self.rejection))
        return {
            "vllm": sorted({*gumbel, *rejection}, key=_version_key),
            "gumbel": gumbel,
            "rejection": rejection,
        }


def load_peer(path: str | Path) -> Peer:
    """Every ``vllm_gumbel_<version>.py`` and ``vllm_rejection_<version>.py`` in ``path``, imported; a
    missing or empty folder raises, naming the script that fills it."""
    folder = Path(path).resolve()
    found = {kind: sorted(folder.glob(f"vllm_{kind}_*.py")) for kind in ("gumbel", "rejection")}
    if not folder.is_dir() or not any(found.values()):
        raise ValueError(
            f"--peer {path}: no vllm_gumbel_*.py or vllm_rejection_*.py there; fill it with "
            "scripts/fetch_vllm_peer.py"
        )
    modules: dict[str, dict[str, object]] = {"gumbel": {}, "rejection": {}}
    for kind, files in found.items():
        for f in files:
            version = f.stem.removeprefix(f"vllm_{kind}_").replace("_", ".")
            modules[kind][version] = load_vllm_sampler(version, folder, kind=kind)
    return Peer(modules["gumbel"], modules["rejection"])


#: The first vLLM release whose random rejection kernel rejects a ``-1`` draft outright (PR #46533). Before
#: it, the kernel read ``target_probs[row, -1]``: out of bounds for a placeholder in the first row, an
#: illegal address on the H200 at 256 requests. Such a release is timed on greedy steps only.
PLACEHOLDER_GUARD = "0.25.0"


def rejection_peers(peer: Peer | None, mode: str) -> dict[str, object]:
    """The vLLM rejection modules that may take ``mode`` steps holding ``-1`` drafts (version -> module)."""
    if peer is None:
        return {}
    guard = _version_key(PLACEHOLDER_GUARD)
    return {v: m for v, m in peer.rejection.items() if mode == "greedy" or _version_key(v) >= guard}


def peer_impl(version: str) -> str:
    """The ``impl`` name of a vLLM release's results: "vllm_0.33.0"."""
    return f"vllm_{version}"


def speedup_key(version: str) -> str:
    """The metric on specfix's results that says how many times faster than that vLLM release it ran."""
    return f"speedup_vs_{peer_impl(version)}"


def gumbel_call(module, inp: dict):
    """A no-argument call of a vLLM release's ``gumbel_sample`` on ``inp`` (a target draw: 0.33's
    ``is_drafting`` False), built as specfix's call is (``gumbel_cases.call_gumbel``): a partial."""
    drafting = "is_drafting" in inspect.signature(module.gumbel_sample).parameters
    extra = {"is_drafting": False} if drafting else {}
    args = (*(inp[k] for k in BATCH_KEYS), False)  # apply_temperature False: vLLM applies it beforehand
    return functools.partial(module.gumbel_sample, *args, **extra)


def sampling_metadata(module, mode: str, seeds: list, device):
    """vLLM's SamplingMetadata (its shim's dataclass) for a batch all greedy or all random at temperature 1,
    request i seeded with ``seeds[i]`` (None: unseeded) as specfix's ``from_requests`` seeds it."""
    return module.SamplingMetadata(
        temperature=None if mode == "greedy" else torch.ones(len(seeds), device=device),
        all_greedy=mode == "greedy",
        all_random=mode == "random",
        generators={
            i: torch.Generator(device=device).manual_seed(x) for i, x in enumerate(seeds) if x is not None
        },
    )


def forward_sequence(module, metadata, draft_probs, logits, sampling, mode: str) -> torch.Tensor:
    """The calls vLLM's ``RejectionSampler.forward`` makes, without logprobs and logits processors (which
    specfix's forward has not either), so that both sides time the same work."""
    bonus = logits[metadata.bonus_logits_indices]
    if mode == "greedy":
        bonus_ids = bonus.argmax(dim=-1)
    else:
        probs = bonus.float().div_(sampling.temperature.unsqueeze(-1)).softmax(dim=-1)
        bonus_ids = probs.div_(torch.empty_like(probs).exponential_()).argmax(dim=-1)
    target = logits[metadata.target_logits_indices].to(torch.float32)
    target = module.apply_sampling_constraints(target, metadata.cu_num_draft_tokens, sampling)
    return module.rejection_sample(
        metadata.draft_token_ids,
        metadata.num_draft_tokens,
        metadata.max_spec_len,
        metadata.cu_num_draft_tokens,
        draft_probs,
        target,
        bonus_ids.view(-1, 1).int(),
        sampling,
    )


def back_to_back(timer, s, calls: dict, mine: str) -> dict[str, float]:
    """Goal 2 (GPU only): specfix's call ``mine`` and vLLM's unshielded, in turn, a few rounds; median us."""
    beside = {i: c for i, c in calls.items() if s.cuda and (i == mine or i.startswith(peer_impl("")))}
    rounds = timer.rounds(beside, s.pick(cpu=1, ci=2, full=3), shield=False)
    return {i: statistics.median(itertools.chain(*t)) for i, t in rounds.items()}


def host_beside(timer, s, case: str, params: dict, calls: dict, suffix: str = "") -> list[dict]:
    """Goal 1: host cost per call of specfix's call (first in ``calls``) and vLLM's, in turn, a few rounds;
    specfix's result gets ``host_ratio_vs_<impl>`` (ours over theirs); vLLM's are named impl + ``suffix``."""
    rounds = timer.rounds(calls, s.pick(cpu=1, ci=2, full=3), "host_cost")
    ours, *theirs = (result(case, impl, params, list(itertools.chain(*t))) for impl, t in rounds.items())
    for r in theirs:
        ours["metrics"][f"host_ratio_vs_{r['impl']}"] = ours["median_us"] / r["median_us"]
        r["impl"] += suffix
    return [ours, *theirs]


def speedups(shape: list[dict], ours, field: str = "median_us") -> list[dict]:
    """vLLM's ``field`` over specfix's (impls ``ours``), as metric ``[back_to_back_]speedup_vs_vllm_<v>``."""

    def us(r: dict) -> float | None:
        return r.get(field, r["metrics"].get(field))

    prefix = "" if field == "median_us" else "back_to_back_"
    for mine in (r for r in shape if r["impl"] in ours and us(r)):
        for theirs in (r for r in shape if r["impl"].startswith(peer_impl("")) and us(r)):
            mine["metrics"][f"{prefix}speedup_vs_{theirs['impl']}"] = us(theirs) / us(mine)
    return shape


def vs_peer(goal_id: str, r: dict, s, shape, invert: bool = False) -> dict:
    """Goal ``goal_id`` on ``r``'s speedup over :data:`GOAL_PEER` (its time over ours; ``invert``: 1 / it)."""
    speedup = r["metrics"][speedup_key(GOAL_PEER)]
    detail = f"{r['median_us']:,.2f} us vs {r['median_us'] * speedup:,.2f} us"
    measured = 1 / speedup if invert else speedup
    return goal(goal_id, measured, s, detail, peer=GOAL_PEER, shape=shape(r["params"]))


def goals_beside(goal_id: str, results, s, case: str, impl: str, fn: str, shape) -> list[dict]:
    """Goal ``host_cost`` (our host time over vLLM's) or ``back_to_back`` (vLLM's time over ours) on each
    ``case``/``impl`` result at :data:`GOAL_PEER`, each vLLM version's time beside; else not measured."""
    host = goal_id == "host_cost"
    prefix = "host_ratio_vs_vllm_" if host else "back_to_back_speedup_vs_vllm_"
    common = {"case": case, "fn": fn, "peer": GOAL_PEER}
    goals = []
    for r in find(results, case, impl):
        ratios = {k.removeprefix(prefix): x for k, x in r["metrics"].items() if k.startswith(prefix)}
        if GOAL_PEER in ratios:
            mine = r["median_us"] if host else r["metrics"]["back_to_back_us"]
            beside = {v: mine / x if host else mine * x for v, x in ratios.items()}
            label = shape(r["params"])
            goals.append(
                goal(goal_id, ratios[GOAL_PEER], s, f"{mine:,.1f} us", vllm=beside, shape=label, **common)
            )
    missing = "no vLLM timed beside it (bench --peer, on a GPU)"
    return goals or [goal(goal_id, None, s, missing, shape="every shape", **common)]
