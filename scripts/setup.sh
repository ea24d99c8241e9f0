#!/usr/bin/env bash
# Installs what qstore needs on a fresh Debian machine. Idempotent: skips what is present.
set -euo pipefail

need_apt=()
command -v cargo >/dev/null 2>&1 || need_apt+=(cargo rustc)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
# ZooKeeper (Debian's server and its Java runtime): Calvin's replication through a
# middleware (--replication-layer zookeeper), its tests and its figure.
[ -r /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeperd)
# Redis (server and redis-cli): the oracle the Redis port's replies are compared with, and a
# real client of it.
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need_apt+=(redis-tools)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]} with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# rustfmt and clippy come with rustup toolchains; add them if this toolchain lacks them.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  if command -v rustup >/dev/null 2>&1; then
    rustup component add rustfmt clippy
  else
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustfmt rust-clippy
  fi
fi
echo "setup: $(cargo --version), $(rustc --version)"

# adya: an independent, Elle-style checker of list-append histories, used by the tests.
if ! command -v adya >/dev/null 2>&1; then
  echo "setup: installing adya (checker only)"
  cargo install adya --version 0.1.0 --no-default-features --locked
fi

# redis-py: a real Redis client library, driven against the Redis port by the tests.
if ! python3 -c 'import redis' >/dev/null 2>&1; then
  echo "setup: installing Python's redis package"
  python3 -m pip install --quiet 'redis==8.1.0' ||
    python3 -m pip install --quiet --break-system-packages 'redis==8.1.0'
fi
