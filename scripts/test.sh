#!/usr/bin/env bash
# The test command: every unit and integration test of the workspace, then the end-to-end
# history checks (our checker and the independent adya) on a release build, and a real
# Redis client library against the Redis port.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked
cargo build --release --locked -p qstore
scripts/redis-clients.sh
scripts/check-histories.sh
