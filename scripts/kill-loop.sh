#!/usr/bin/env bash
# The kill -9 test of replication, repeated: N runs (default 20) of `qstore cluster` (qstore
# or calvin) with 3 partitions x 3 copies on a verified list-append workload, each killing the
# leader of a random partition's group with SIGKILL at a random moment. A run passes when every transaction is
# answered, the surviving copies agree (--verify), no element is appended twice, and adya
# accepts the clients' history. Prints one line per run (when the kill struck, how long the
# group was without a leader, the longest time without any commit) and a summary.
#
# With RESTART=1, the killed server is started again at a random moment after
# the kill, and a run passes only if it rejoined: its cluster instance rebuilt from another
# instance's copies and back in service by the end, every copy equal.
#
# ARGS adds flags to every run (e.g. ARGS="--replication-point 3").
#
# usage: [RESTART=1] [ARGS=...] scripts/kill-loop.sh [RUNS] [SEED] [PROTOCOL]   (qstore, the
#        default, or calvin; needs a release build and adya on PATH)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
RANDOM=${2:-$$}
protocol=${3:-qstore}
restart=${RESTART:-0}
read -r -a args <<<"${ARGS:-}"
. scripts/checks.sh
for i in $(seq 1 "$runs"); do
  partition=$((RANDOM % 3))
  after=$((500 + RANDOM % 3000))
  duration=5 extra=()
  if [ "$restart" = 1 ]; then
    after=$((500 + RANDOM % 2000))
    duration=7 extra=(--restart-after-ms $((300 + RANDOM % 1500)))
  fi
  h="$work/history-$i.jsonl" j="$work/out-$i.json" log="$work/log-$i.txt"
  rc=0
  "$QSTORE" cluster --protocol "$protocol" --workload append --nodes 3 --replication-factor 3 --duration "$duration" \
    --warmup 0 --kill-partition "$partition" --kill-leader-after-ms "$after" "${extra[@]}" "${args[@]}" \
    --history "$h" --output "$j" --verify -q >"$log" 2>&1 || rc=$?
  election=$(sed -n 's/.*leads partition [0-9]* \([0-9]*\) ms after its leader was killed.*/\1/p' "$log")
  stall=$(grep -o '"longest_stall_ms": *[0-9]*' "$j" 2>/dev/null | grep -o '[0-9]*$' || true)
  committed=$(grep -o '"committed": *[0-9]*' "$j" 2>/dev/null | grep -o '[0-9]*$' || true)
  verdict="ok"
  if [ "$rc" != 0 ]; then
    verdict="FAIL (qstore cluster exit $rc)"
  elif ! grep -q "copies in service equal" "$log"; then
    verdict="FAIL (no fail-over verdict)"
  elif [ "$restart" = 1 ] && ! grep -q "instances out of service \[\]" "$log"; then
    verdict="FAIL (the restarted server's instance was not back in service)"
  elif ! adya check -m list-append -c serializable "$h" >"$work/adya-$i.txt" 2>&1; then
    verdict="FAIL (adya: $(tail -n 1 "$work/adya-$i.txt"))"
  fi
  printf 'run %2d: kill partition %d leader at %4d ms: new leader after %s ms, longest time without a commit %s ms, %s committed: %s\n' \
    "$i" "$partition" "$after" "${election:-?}" "${stall:-?}" "${committed:-?}" "$verdict"
  if [ "$verdict" = ok ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    tail -n 30 "$log"
  fi
done
echo "kill loop: $passed passed, $failed failed"
[ "$failed" = 0 ]
