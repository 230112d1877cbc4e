#!/usr/bin/env bash
# Refresh every GPU recording the chapters show on CPU-only machines and the golden outputs, on a CUDA machine.
#
#   [PYTHON=.venv/bin/python] [PEER=.peer] [BEFORE=old_gumbel.py] scripts/record_all_gpu.sh [OUT]
#       OUT: default . (writes into specfix/recorded and tests/golden)
#       PYTHON: a Python with torch and triton (default: the venv's if there is one, else python3)
#       PEER: the folder scripts/fetch_vllm_peer.py fills: vLLM's samplers, timed beside specfix's in the
#             bench and compared token for token (vllm_noise_comparison); without it those two are skipped
#       BEFORE: an older specfix gumbel.py (e.g. `git show REV:specfix/mrv2/gumbel.py > old.py`): the
#             before/after sweep and the ncu profile set today's kernel beside it; without it, skipped
#
# Each recording names the commit and the hashes of the code it measured (specfix.tools.recorded.SOURCES);
# where the checkout has no git history, set SPECFIX_COMMIT. Timing-sensitive recorders run one after
# another with the GPU to themselves. Each step's log goes to OUT/logs; a failing step is reported and the
# others still run; a step whose tool or input is missing says so. Commit what lands in specfix/recorded and
# tests/golden afterwards.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.}
REC=$OUT/specfix/recorded GOLD=$OUT/tests/golden LOGS=$OUT/logs
if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c "import torch, triton" 2>/dev/null; then
  echo "record_all_gpu.sh: $PYTHON cannot import torch and triton; set PYTHON to one that can" >&2
  exit 2
fi
mkdir -p "$REC" "$GOLD" "$LOGS"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
status=0
step() {  # step NAME COMMAND...: run, log, time, remember failure
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$LOGS/$name.log" 2>&1; then r=ok; else r="FAILED ($?)"; status=1; fi
  printf '%-22s %-12s %4ds\n' "$name" "$r" $((SECONDS - t0))
}
skip() { printf '%-22s %s\n' "$1" "skipped: $2"; }
step gumbel_golden    "$PYTHON" scripts/record_gumbel_golden.py --out "$GOLD"
if command -v compute-sanitizer >/dev/null; then
  step gumbel_sanitizer "$PYTHON" scripts/sanitize_gumbel.py --out "$REC"
else
  skip gumbel_sanitizer "compute-sanitizer is not on PATH (it comes with the CUDA toolkit)"; status=1
fi
step embedding_assert "$PYTHON" scripts/record_embedding_assert.py --out "$REC"
step cudagraph        env SPECFIX_SCALE=full "$PYTHON" scripts/record_cudagraph.py --out "$REC" --golden "$GOLD"
step gumbel_perf      "$PYTHON" scripts/time_gumbel.py --out "$REC"
if [ -n "${BEFORE:-}" ]; then
  step gumbel_sweep   "$PYTHON" scripts/time_gumbel.py --out "$REC" --sweep-only --before "old=$BEFORE"
  if command -v ncu >/dev/null; then
    step gumbel_profile "$PYTHON" scripts/profile_gumbel.py --out "$REC" --before "old=$BEFORE"
  else
    skip gumbel_profile "ncu (Nsight Compute) is not on PATH"; status=1
  fi
else
  skip gumbel_sweep   "needs BEFORE=<an older gumbel.py> (chapter 5 sets today's kernel beside it)"
  skip gumbel_profile "needs BEFORE=<an older gumbel.py>"
fi
if [ -n "${PEER:-}" ]; then
  step vllm_noise     "$PYTHON" scripts/compare_vllm_noise.py --peer "$PEER" --out "$REC"
else
  skip vllm_noise     "needs PEER=<the folder scripts/fetch_vllm_peer.py fills>"
fi
step bench            "$PYTHON" -m specfix bench --device cuda --scale full --no-progress ${PEER:+--peer "$PEER"} --json "$REC/bench_h200.json"
exit $status
