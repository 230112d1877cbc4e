"""Where the verification and drafting steps make the host wait for the GPU (run on a CUDA machine).

    python scripts/find_host_syncs.py [--json OUT.json]

Runs each step once under torch's sync debug mode set to "error", so that the first synchronising call
raises, and prints the specfix frame it came from; a step that makes none says so. Complements
``specfix bench``'s counts (which say how many, not where).
"""

from __future__ import annotations

import argparse
import json
import traceback

import torch

from specfix.models import load_models
from specfix.mrv2.speculator import DraftModelSpeculator
from specfix.tools import recorded
from specfix.v1.rejection_sampler import RejectionSampler, _rejection_sample, rejection_sample
from specfix.v1.sampling_metadata import SamplingMetadata
from specfix.v1.spec_decode_metadata import SpecDecodeMetadata


def first_sync(fn) -> str:
    """'none', or the innermost specfix frame of the first synchronising call ``fn`` makes."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "specfix" in f.filename]
        where = frames[-1] if frames else traceback.extract_tb(exc.__traceback__)[-1]
        return f"{where.filename.split('specfix/')[-1]}:{where.lineno} {where.line}"
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return "none"


def _propose_syncs(dev, gen, k: int) -> dict:
    """The draft model's propose, eager then captured in CUDA graphs."""
    model = load_models(dev)[1]
    spec = DraftModelSpeculator(
        model,
        max_num_reqs=16,
        num_speculative_steps=k,
        vocab_size=model.vocab_size,
        context_len=model.order - 1,
        device=dev,
    )
    ctx = torch.randint(0, model.vocab_size, (16, model.order - 1), generator=gen, device=dev)
    args = (
        5,
        torch.arange(16, dtype=torch.int32, device=dev),
        torch.ones(16, device=dev),
        torch.arange(16, dtype=torch.int64, device=dev),
        ctx[:5].clone(),
        torch.zeros(5, dtype=torch.int64, device=dev),
    )
    spec.propose(*args)
    eager = first_sync(lambda: spec.propose(*args))
    spec.capture_cuda_graphs()
    return {
        "DraftModelSpeculator.propose (eager)": eager,
        "DraftModelSpeculator.propose (graph)": first_sync(lambda: spec.propose(*args)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    dev = torch.device("cuda")
    batch, k, vocab = 8, 3, 32_000
    gen = torch.Generator(device=dev).manual_seed(0)
    drafts = torch.randint(0, vocab, (batch, k), generator=gen, device=dev).tolist()
    meta = SpecDecodeMetadata.make_dummy(drafts, device=dev)
    logits = torch.randn(batch * (k + 1), vocab, generator=gen, device=dev)
    target = logits[meta.target_logits_indices.long()]
    bonus = torch.zeros(batch, dtype=torch.int32, device=dev)
    probs = torch.softmax(torch.randn(batch * k, vocab, generator=gen, device=dev), -1)
    sampler = RejectionSampler(backend="triton")
    out = {}
    for mode, temp in (("greedy", 0.0), ("random", 1.0)):
        sm = SamplingMetadata.from_requests([temp] * batch, [7 + i for i in range(batch)], device=dev)
        q = None if mode == "greedy" else probs
        core = (
            meta.draft_token_ids,
            meta.num_draft_tokens,
            meta.max_spec_len,
            meta.cu_num_draft_tokens,
            q,
            target,
            bonus,
            sm,
        )
        out[f"SpecDecodeMetadata.make_dummy ({mode})"] = first_sync(
            lambda: SpecDecodeMetadata.make_dummy(drafts, dev)
        )
        out[f"SamplingMetadata.from_requests ({mode})"] = first_sync(
            lambda t=temp: SamplingMetadata.from_requests([t] * batch, [None] * batch, device=dev)
        )
        out[f"RejectionSampler.forward ({mode})"] = first_sync(lambda: sampler(meta, q, logits, sm))  # noqa: B023
        out[f"rejection_sample ({mode})"] = first_sync(lambda: rejection_sample(*core))  # noqa: B023
        out[f"_rejection_sample ({mode})"] = first_sync(lambda: _rejection_sample(*core))  # noqa: B023
    out.update(_propose_syncs(dev, gen, k))
    for name, where in out.items():
        print(f"{name:45s} first host sync: {where}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": recorded.gpu_meta(), "first_sync": out}, f, indent=1)


if __name__ == "__main__":
    main()
