#!/usr/bin/env bash
# The test command: every unit and integration test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --locked "$@"
