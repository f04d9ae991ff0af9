#!/usr/bin/env bash
# The one test command: formatting, lints, docs, every test tier, and the demo end to end.
# It installs what it needs itself, so it passes on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")"

step() { printf '\n== %s (at %dm%02ds)\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)); }

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
# Every test binary runs even after one fails, so one run shows every failure.
cargo test --workspace --locked --release --no-fail-fast 2>&1 | tee target/test-output.txt
read -r passed failed < <(grep -E "^test result:" target/test-output.txt | awk '{p+=$4; f+=$6} END {print p+0, f+0}')
echo "rust: $passed passed, $failed failed"

step "benchmarks compile"
cargo bench --workspace --locked --no-run --quiet

step "demos, end to end, on a fresh store"
cargo build --release --locked --quiet
demo_home=$(mktemp -d)
trap 'rm -rf "$demo_home"' EXIT
export PATH="$PWD/target/release:$PATH"
export RETRACE_HOME="$demo_home"
retrace demo | tee target/demo-output.txt
grep -q "the same wrong approval every time, 0 live calls" target/demo-output.txt
grep -q "decision moved: reviewer on step:backfill_users: approve -> reject" target/demo-output.txt
read -r bad forked < <(retrace demo --json --runs 3 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["replayed"]["run"] if d["replayed"] else "-", d["forked"]["fork"] if d["forked"] else "-")')
retrace demo pipeline | tee target/pipeline-output.txt
grep -q "dry_run" target/pipeline-output.txt
retrace demo single --runs 1 >/dev/null
retrace verify --all
if [ "$bad" != "-" ]; then
  retrace replay "$bad"
fi
if [ "$forked" != "-" ]; then
  # The fork's recorded command (its own simulator seed, no chaos) replays it exactly.
  retrace replay "$forked"
fi
run_id=$(retrace runs --json | python3 -c 'import json,sys; print([r for r in json.load(sys.stdin) if r["mode"]=="record"][0]["id"])')
retrace export "$run_id" -o "$demo_home/a.jsonl"
other=$(mktemp -d)
RETRACE_HOME="$other" retrace import "$demo_home/a.jsonl"
RETRACE_HOME="$other" retrace export "$run_id" -o "$other/b.jsonl"
cmp "$demo_home/a.jsonl" "$other/b.jsonl"
rm -rf "$other"
echo "demos ok"

step "the proxy with the official openai and anthropic Python clients"
unset RETRACE_HOME
RETRACE_BIN="$PWD/target/release/retrace" tests/python/run.sh 2>&1 | tee target/python-output.txt
py_passed=$(grep -Eo '[0-9]+ passed' target/python-output.txt | tail -1 | awk '{print $1}')
passed=$((passed + ${py_passed:-0}))

step "the project's own gate: the golden traces of tests/traces, no API key, no upstream"
gate_home=$(mktemp -d)
env -u OPENAI_API_KEY -u ANTHROPIC_API_KEY -u OPENAI_BASE_URL -u ANTHROPIC_BASE_URL \
    RETRACE_HOME="$gate_home" PATH="$PWD/target/python-venv/bin:$PATH" \
    retrace gate tests/traces --junit target/gate-junit.xml
rm -rf "$gate_home"

step "summary"
echo "tests: $passed passed, $failed failed"
