#!/usr/bin/env bash
# Refresh every GPU recording the notebooks show on CPU-only machines, in one go, on a CUDA machine.
#
#   [PEER=.peer] [BEFORE=old_gumbel.py] scripts/record_all_gpu.sh [OUT]
#       OUT: default . (writes into specfix/recorded and tests/golden); PEER: vLLM's sampler fetched by
#       shared/peer, timed beside ours; BEFORE: an older specfix gumbel.py, profiled beside today's
#
# Timing-sensitive recorders run one after another with the GPU to themselves. Each step's log goes to
# OUT/logs; a failing step is reported and the others still run. Commit what lands in specfix/recorded
# and tests/golden afterwards.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.}
REC=$OUT/specfix/recorded GOLD=$OUT/tests/golden LOGS=$OUT/logs
mkdir -p "$REC" "$GOLD" "$LOGS"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
status=0
step() {  # step NAME COMMAND...: run, log, time, remember failure
  local name=$1; shift
  local t0=$SECONDS
  if "$@" >"$LOGS/$name.log" 2>&1; then r=ok; else r="FAILED ($?)"; status=1; fi
  printf '%-22s %-12s %4ds\n' "$name" "$r" $((SECONDS - t0))
}
step gumbel_golden    python3 scripts/record_gumbel_golden.py --out "$GOLD"
step gumbel_sanitizer python3 scripts/sanitize_gumbel.py --out "$REC"
step embedding_assert python3 scripts/record_embedding_assert.py --out "$REC"
step cudagraph        env SPECFIX_SCALE=full python3 scripts/record_cudagraph.py --out "$REC" --golden "$GOLD"
# chapter 5 sets today's kernel beside the older one in the profile, so it is refreshed only with BEFORE
[ -n "${BEFORE:-}" ] && step gumbel_profile python3 scripts/profile_gumbel.py --out "$REC" --before "old=$BEFORE"
step bench            python3 -m specfix bench --device cuda --scale full --no-progress ${PEER:+--peer "$PEER"} --json "$REC/bench_h200.json"
exit $status
