#!/usr/bin/env bash
# The numeric tests (pytest marker `numeric`: two computations of the same numbers compared to a rounding
# bound, tests/rounding.py) at 1 and 2 torch threads, natively and with torch held to its AVX2 kernels,
# so that a CPU with AVX-512 or AMX catches what an AVX2-only one would fail. One line per configuration.
#
#   bash scripts/numeric_matrix.sh                 # the fast numeric tests (no real model, no engine)
#   bash scripts/numeric_matrix.sh -m numeric       # all of them, the slow ones (real model) included
#
# Extra arguments go to pytest (the default selection is -m "numeric and not slow"). Threads are set with
# UDPO_NUM_THREADS (udpo/threads.py: an explicit choice wins) and OMP_NUM_THREADS (read by torch at import).
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
[ $# -gt 0 ] || set -- -m "numeric and not slow"
AVX2="ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2"
failed=0
for kernels in native avx2; do
  for threads in 1 2; do
    vars="UDPO_NUM_THREADS=$threads OMP_NUM_THREADS=$threads"
    [ "$kernels" = avx2 ] && vars="$vars $AVX2"
    start=$(date +%s)
    out=$(env $vars "$PYTHON" -m pytest -q -p no:randomly "$@" 2>&1)
    rc=$?
    summary=$(printf '%s\n' "$out" | grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' | tail -1)
    header=$(printf '%s\n' "$out" | grep -m1 '^cpu:')
    printf '%-6s threads %s: %s (%ss; %s)\n' "$kernels" "$threads" "${summary:-no summary, rc $rc}" \
      "$(($(date +%s) - start))" "$header"
    [ $rc -eq 0 ] || { failed=1; printf '%s\n' "$out" | grep -E '^(FAILED|ERROR)'; }
  done
done
exit $failed
