# Shared by the check scripts (sourced, from the repository's root): the qstore binary to
# run (built in release if missing), adya on PATH, a scratch directory removed on exit, and
# pass/fail counters.
QSTORE=${QSTORE:-${CARGO_TARGET_DIR:-target}/release/qstore}
[ -x "$QSTORE" ] || cargo build --release --locked -p qstore
command -v adya >/dev/null || { echo "adya not found: run scripts/setup.sh" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
