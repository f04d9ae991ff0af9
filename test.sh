#!/usr/bin/env bash
# The one test command: formatting, lints, docs, every test tier, and the demo end to end.
# It installs what it needs itself, so it passes on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")"

step() { printf '\n== %s\n' "$*"; }

step "toolchain"
cargo --version
rustup component add rustfmt clippy >/dev/null 2>&1 || true

step "format"
cargo fmt --all -- --check

step "clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "tests (unit, integration, property, conformance, crash)"
export RETRACE_TEST_KEY=1
cargo test --workspace --locked --release 2>&1 | tee target/test-output.txt
grep -E "^test result:" target/test-output.txt | awk '{p+=$4; f+=$6} END {printf "%d passed, %d failed\n", p, f}'

step "benchmarks compile"
cargo bench --workspace --locked --no-run --quiet

step "demo, end to end, on a fresh store"
demo_home=$(mktemp -d)
trap 'rm -rf "$demo_home"' EXIT
RETRACE_HOME="$demo_home" cargo run --release --locked --quiet -- demo --runs 2 | tee target/demo-output.txt
grep -q "identical every time, 0 live calls" target/demo-output.txt
run_id=$(RETRACE_HOME="$demo_home" cargo run --release --locked --quiet -- runs --json | python3 -c 'import json,sys; print([r for r in json.load(sys.stdin) if r["mode"]=="record"][0]["id"])')
RETRACE_HOME="$demo_home" cargo run --release --locked --quiet -- verify --all
RETRACE_HOME="$demo_home" cargo run --release --locked --quiet -- export "$run_id" -o "$demo_home/a.jsonl"
other=$(mktemp -d)
RETRACE_HOME="$other" cargo run --release --locked --quiet -- import "$demo_home/a.jsonl"
RETRACE_HOME="$other" cargo run --release --locked --quiet -- export "$run_id" -o "$other/b.jsonl"
cmp "$demo_home/a.jsonl" "$other/b.jsonl"
rm -rf "$other"
echo "demo ok"
