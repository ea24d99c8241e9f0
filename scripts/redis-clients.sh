#!/usr/bin/env bash
# redis-py (a real Redis client library) against `qstore redis` on several protocols:
# commands, errors, MULTI/EXEC, WATCH, RESP3 and concurrent transfers (tests/redis-py).
# Needs a release build and Python's `redis` package (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
qstore=target/release/qstore
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
"$qstore" secret "$work/secret" 2>/dev/null
printf '[cluster]\nsecret_file = "%s"\n' "$work/secret" > "$work/cluster.toml"
password=$("$qstore" redis-password --cluster "$work/cluster.toml")
passed=0 failed=0
for protocol in ${REDIS_PROTOCOLS:-qstore no_wait calvin}; do
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$qstore" redis --protocol "$protocol" --nodes 2 --listen "127.0.0.1:$port" \
    --secret-file "$work/secret" --serve-for 300 --verify > "$work/out" 2> "$work/err" &
  server=$!
  for _ in $(seq 100); do grep -q "ready on" "$work/out" && break; sleep 0.1; done
  echo "== redis-py against qstore redis --protocol $protocol (port $port)"
  ok=1
  timeout 240 python3 tests/redis-py/check_redis_py.py "$port" "$password" || ok=0
  # Stopped, the server checks the history of everything the clients ran.
  kill "$server"
  wait "$server" || ok=0
  grep -E "serializable|serial oracle|invariants" "$work/out" || true
  if [ "$ok" -eq 1 ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    cat "$work/out" "$work/err"
  fi
done
echo "redis-clients: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
