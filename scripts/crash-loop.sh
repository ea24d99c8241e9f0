#!/usr/bin/env bash
# The crash test of durability, repeated: for each protocol, N rounds (default 20) of
#  1. `qstore cluster` (3 servers, bank) with data directories, every server killed with
#     SIGKILL at a random moment while the client runs (the whole cluster crashes);
#  2. the same cluster started again on its directories, running 2,000 more transactions
#     with --verify: the bank's total holds, and the history has no anomaly. For qstore and
#     calvin the history holds every transaction of the recovered logs and the new ones, and
#     replaying it serially gives every partition's hash (from the checkpoint they restored,
#     the transactions after it); for the interactive protocols
#     (write-ahead logging with 2PC) it holds the new ones, which start from the recovered
#     state (transactions in doubt at the crash settled by their coordinators' logs).
# Prints one line per round (when the crash struck, how many transactions the recovered
# history holds) and a summary.
#
# With WORKLOAD=append the clients also write their histories (Elle JSON lines), and the
# crashed run's history joined with the restart's (scripts/join-histories.py) must satisfy
# adya's strict serializability: every append acknowledged before the crash is in every
# later read of its list, and none twice. (The timestamp protocols, TIMESTAMP, MVCC, MaaT
# and Sundial, order transactions by timestamps rather than real time: for them adya checks
# serializability, which sees a lost append only through reads that disagree.)
#
# With KILL=one, step 1 kills one server (chosen at random) with SIGKILL, lets the others
# run on without it for a second (their transactions with it stall or end in doubt), and
# only then kills them too: the restart must settle what the first crash left half done.
# (A server restarted alone, into a cluster still running, is refused by its peers: that
# rejoin is not built yet.)
#
# With RF=2 or 3 (qstore and calvin only) every partition has that many copies: a server
# killed alone is then survived (its groups elect other leaders, its cluster instance goes
# out of service) until the rest are killed; the restart brings every copy back and
# `--verify` checks that all copies in service agree.
#
# usage: [WORKLOAD=bank|append] [KILL=all|one] [RF=1|2|3] scripts/crash-loop.sh [ROUNDS] [SEED] [PROTOCOLS...]
#        (default: qstore calvin no_wait occ maat sundial; needs a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-20}
RANDOM=${2:-$$}
shift $(($# < 2 ? $# : 2))
protocols=("$@")
workload=${WORKLOAD:-bank}
kill=${KILL:-all}
rf=${RF:-1}
case "$kill" in all | one) ;; *)
  echo "KILL must be all or one, not $kill" >&2
  exit 2
  ;;
esac
# The consistency model adya holds protocol $1's history to.
model_of() {
  case "$1" in
    timestamp | mvcc | maat | sundial) echo serializable ;;
    *) echo strict-serializable ;;
  esac
}
[ ${#protocols[@]} -gt 0 ] || protocols=(qstore calvin no_wait occ maat sundial)
. scripts/checks.sh
for protocol in "${protocols[@]}"; do
  for i in $(seq 1 "$rounds"); do
    d="$work/$protocol-$i" after=$((500 + RANDOM % 3000))
    mkdir -p "$d"
    common=(--protocol "$protocol" --workload "$workload" --nodes 3 --replication-factor "$rf" --data-dir "$d"
      --cluster-file "$d/cluster.toml" -q)
    # Every protocol checkpoints every second: the kill strikes before, during or after one,
    # and recovery starts from the checkpoint in place (qstore and calvin: the newest every
    # server holds, and their history and serial replay start there).
    common+=(--checkpoint-interval-s 1)
    crash_history=() restart_history=()
    if [ "$workload" = append ]; then
      crash_history=(--history "$d/crash.jsonl") restart_history=(--history "$d/restart.jsonl")
    fi
    # The client fails when its servers vanish: that is the crash, not a failure here.
    "$QSTORE" cluster "${common[@]}" "${crash_history[@]}" --duration 30 >"$d/crash.txt" 2>&1 &
    launch=$!
    sleep "$(awk "BEGIN { print $after / 1000 }")"
    what="all servers killed"
    if [ "$kill" = one ]; then
      victim=$((RANDOM % (3 * rf)))
      pkill -9 -f "server --cluster $d/cluster.toml --node $victim( |\$)" || true
      what="server $victim killed, the rest 1 s later,"
      sleep 1
    fi
    pkill -9 -f "server --cluster $d/cluster.toml" || true
    wait "$launch" || true
    rc=0
    "$QSTORE" cluster "${common[@]}" "${restart_history[@]}" --txns 2000 --duration 0 --verify \
      >"$d/restart.txt" 2>&1 || rc=$?
    recovered=$(sed -n 's/^serializable: yes (\([0-9]*\) transactions.*/\1/p' "$d/restart.txt")
    verdict=ok
    if [ "$rc" != 0 ]; then
      verdict="FAIL (restart exit $rc)"
    elif ! grep -q "^serializable: yes" "$d/restart.txt"; then
      verdict="FAIL (history)"
    elif grep "^serial oracle:" "$d/restart.txt" | grep -vq "match\|not applicable"; then
      verdict="FAIL (serial oracle)"
    elif ! grep -q "^invariants: ok" "$d/restart.txt"; then
      verdict="FAIL (invariants)"
    elif [ "$workload" = append ] && ! {
      scripts/join-histories.py "$d/crash.jsonl" "$d/restart.jsonl" >"$d/joined.jsonl" &&
        adya check -m list-append -c "$(model_of "$protocol")" "$d/joined.jsonl" >>"$d/restart.txt" 2>&1
    }; then
      verdict="FAIL (adya across the crash)"
    fi
    printf '%-7s round %2d: %s at %4d ms; after the restart the history holds %s transactions: %s\n' \
      "$protocol" "$i" "$what" "$after" "${recovered:-?}" "$verdict"
    if [ "$verdict" = ok ]; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      tail -n 30 "$d/restart.txt"
    fi
    rm -rf "$d"
  done
done
echo "crash loop: $passed passed, $failed failed"
[ "$failed" = 0 ]
