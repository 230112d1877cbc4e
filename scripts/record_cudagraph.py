"""Record chapter 3's GPU evidence: real CUDA graphs, launch overhead, full-scale counts, DFlash golden.

    PYTHONPATH=$PWD SPECFIX_SCALE=full python3 scripts/record_cudagraph.py --out specfix/recorded \
        --golden tests/golden

Writes ``<out>/cudagraph_h200.json`` (labelled with device, driver, versions and date) and
``<golden>/dflash_prepare.json`` (the compiled prepare kernel's outputs, checked bit for bit on CPU by
tests/test_dflash.py). Each section records its own error instead of losing the others; the script exits
non-zero if any section failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

import specfix  # noqa: F401  (runtime first)
from specfix import Fixes
from specfix.lab.invariance import check_dflash, check_speculator
from specfix.lab.padding_bench import (
    ORIGIN_FREE,
    TableDraft,
    mark_differences,
    one_step_distribution,
    run_padding_bench,
)
from specfix.models import load_models
from specfix.mrv2.cudagraph import time_eager_vs_graph
from specfix.mrv2.dflash import DFlashDrafter, DFlashInputs, ToyDFlashModel, prepare_dflash_inputs
from specfix.mrv2.speculator import DraftModelSpeculator
from specfix.tools import recorded

OFF = Fixes(pad_idx_mapping=False)


def launch_overhead(device) -> list[dict]:
    """Host time per drafter step (k=3 forwards + samplers), eager launches vs one graph replay."""
    _, draft = load_models(device)
    spec = DraftModelSpeculator(
        draft,
        max_num_reqs=64,
        num_speculative_steps=3,
        vocab_size=draft.vocab_size,
        context_len=draft.order - 1,
        device=device,
    )
    spec.idx_mapping.copy_(torch.arange(64, dtype=torch.int32))
    spec.temperature.fill_(1.0)
    with torch.no_grad():
        return time_eager_vs_graph(spec._draft_step, [1, 2, 4, 8, 16, 32, 64], device)


def bench_section(device, num_requests: int) -> dict:
    models = load_models(device)
    out = {}
    t0 = time.perf_counter()
    on = run_padding_bench(num_requests, fixes=Fixes(), device=device, models=models)
    off = run_padding_bench(num_requests, fixes=OFF, device=device, models=models, solo=on.solo)
    out["seconds"] = time.perf_counter() - t0
    out["fix_on"], out["fix_off"] = on.summary(), off.summary()
    examples = []
    for req in off.differing[:4]:
        index, step, writes = off.cause(req)
        solo_text, batched_text = mark_differences(off.solo.outputs[req], off.batched.outputs[req])
        examples.append(
            {
                "req_id": req,
                "first_diverging_token": index,
                "step": step,
                "batch": off.batched.steps[step].req_ids,
                "slots": off.batched.steps[step].slots,
                "num_reqs_padded": off.batched.steps[step].num_reqs_padded,
                "writes": [dict(w.__dict__, overwritten_cols=list(w.overwritten_cols)) for w in writes],
                "solo": solo_text,
                "batched": batched_text,
            }
        )
    out["examples"] = examples
    return out


def invariance_section(device) -> dict:
    res = {}
    for fix in (True, False):
        table = torch.randn(16, 16, generator=torch.Generator().manual_seed(0))
        spec = DraftModelSpeculator(
            TableDraft(table).to(device),
            max_num_reqs=8,
            num_speculative_steps=2,
            vocab_size=16,
            context_len=1,
            device=device,
            fixes=Fixes(pad_idx_mapping=fix),
        )
        spec.capture_cuda_graphs()
        idx = torch.tensor([5, 3, 0, 1], dtype=torch.int32, device=device)
        ones, seeds = torch.ones(8, device=device), torch.arange(8, device=device) * 11
        ar = torch.arange(4, device=device)
        args = (3, idx[:3], ones, seeds, ar[:3, None], ar[:3] + 4)
        # Padded row 3 names slot 0 (zeroed at capture), which live row 2 writes in the same launch: a race.
        rep = check_speculator(spec, *args)
        res[f"speculator_fix_{fix}"] = {"ok": rep.ok, "report": str(rep)}
        # After a step of four, row 3 names slot 1, whose request sits this step out: its only writer.
        spec.propose(4, idx, ones, seeds, ar[:, None] + 7, ar + 4)
        rep = check_speculator(spec, *args, unscheduled=[1])
        res[f"speculator_unscheduled_fix_{fix}"] = {"ok": rep.ok, "report": str(rep)}
        drafter = DFlashDrafter(
            ToyDFlashModel(16).to(device),
            max_num_reqs=4,
            num_speculative_steps=3,
            device=device,
            fixes=Fixes(dflash_pad_idx=fix),
        )
        drafter.capture_cuda_graph()
        rep = check_dflash(
            drafter,
            2,
            torch.tensor([2, 0], dtype=torch.int32, device=device),
            torch.arange(4, device=device),
            torch.arange(4, device=device) + 5,
        )
        res[f"dflash_fix_{fix}"] = {"ok": rep.ok, "report": str(rep)}
    return res


def dflash_golden(device) -> dict:
    cases = []
    for fix in (True, False):
        for num_reqs, idx in ((1, (3,)), (3, (4, 0, 2)), (4, (0, 1, 2, 3)), (6, (5, 4, 3, 2, 1, 0))):
            out = DFlashInputs.allocate(6, 3, device)
            for t in out.as_dict().values():
                t.fill_(77)
            prepare_dflash_inputs(
                num_reqs,
                torch.tensor(idx, dtype=torch.int32, device=device),
                torch.arange(100, 106, device=device),
                torch.arange(10, 70, 10, device=device),
                99,
                out,
                Fixes(dflash_pad_idx=fix),
            )
            torch.cuda.synchronize()
            cases.append(
                {
                    "fix": fix,
                    "num_reqs": num_reqs,
                    "idx": list(idx),
                    "outputs": {n: t.cpu().tolist() for n, t in out.as_dict().items()},
                }
            )
    return {"meta": recorded.gpu_meta("dflash_prepare"), "cases": cases}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(recorded.RECORDED_DIR))
    parser.add_argument("--golden", default=str(Path(__file__).resolve().parents[1] / "tests" / "golden"))
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--trials", type=int, default=4000)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("record_cudagraph.py needs a CUDA GPU", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    data, failed = {}, []
    sections = {
        "launch_overhead": lambda: launch_overhead(device),
        "bench": lambda: bench_section(device, args.requests),
        "chi_square": lambda: {
            str(f): one_step_distribution(
                args.trials, fixes=Fixes(pad_idx_mapping=f), device=device, sampler="kernel"
            )
            for f in (True, False)
        },
        "invariance": lambda: invariance_section(device),
    }
    for name, fn in sections.items():
        t0 = time.perf_counter()
        try:
            data[name] = fn()
            print(f"{name}: ok ({time.perf_counter() - t0:.1f} s)")
        except Exception:
            failed.append(name)
            data[name] = {"error": traceback.format_exc()}
            print(f"{name}: FAILED\n{data[name]['error']}", file=sys.stderr)
    print("wrote", recorded.save("cudagraph_h200", data, args.out))
    try:
        golden = Path(args.golden) / "dflash_prepare.json"
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(json.dumps(dflash_golden(device)) + "\n")
        print("wrote", golden)
    except Exception:
        failed.append("dflash_golden")
        traceback.print_exc()
    if "bench" in data and "fix_on" in data["bench"]:
        bench = data["bench"]
        print(
            "counts: fix on",
            bench["fix_on"]["differing"],
            "/ fix off",
            bench["fix_off"]["differing"],
            "of",
            args.requests,
            "; padded stores that landed in a live slot (fix off):",
            bench["fix_off"]["writes_landed"],
            "of",
            sum(n for o, n in bench["fix_off"]["writes_by_origin"].items() if o != ORIGIN_FREE),
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
