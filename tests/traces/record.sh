#!/usr/bin/env bash
# Regenerates the golden traces of tests/traces/, which `./test.sh` gates with
# `retrace gate tests/traces` (issue 8, item 5): the built-in demos' runs (the migration trio's
# bad run under chaos and its counterfactual fork, the 8-step pipeline and its fork, the
# single-agent triage) and the Python examples (the trio as asyncio tasks and as three
# processes, the unmodified program using the official clients), recorded against
# `retrace simulate`.
#
#   tests/traces/record.sh            # then review `git diff --stat tests/traces` and commit
#
# Re-record when the stored bytes change on purpose (the canonical event, masking, the export
# format) or when a program under tests/traces changes what it asks. Every trace is recorded with
# masking on, as a user's would be: the default rules (there is no retrace.toml at the top level)
# under the project's fixed test mask key; the script checks each header says so. Deterministic
# enough: fixed seeds, commands recorded from the git top level (so they replay from any clone);
# the simulator's words and the schedulers' timing still vary, so the files differ run to run
# but each replays exactly. Needs cargo and python3 (with venv); uses
# $RETRACE_BIN or target/release/retrace (built when missing) and target/python-venv (made with
# tests/python/requirements.txt and the SDK when missing).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="$root/tests/traces"
bin="${RETRACE_BIN:-$root/target/release/retrace}"
say() { printf '== %s\n' "$*" >&2; }

if [[ ! -x "$bin" ]]; then
    say "building retrace"
    cargo build --release --locked -p retrace-cli
fi
venv="$root/target/python-venv"
if [[ ! -x "$venv/bin/python" ]]; then
    say "creating $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
    sha256sum tests/python/requirements.txt | cut -d' ' -f1 > "$venv/.requirements.sha256"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall ./sdk/python

# `retrace` and `python` as the recorded commands name them: this build, the venv's python.
PATH="$(dirname "$bin"):$venv/bin:$PATH"
export PATH
# The project's fixed test mask key (SPEC §3), as tests/python uses.
export RETRACE_MASK_KEY="AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
export OPENAI_API_KEY="sk-golden-traces-not-a-key" ANTHROPIC_API_KEY="sk-ant-golden-traces-not-a-key"
unset OPENAI_BASE_URL ANTHROPIC_BASE_URL RETRACE_STORE RETRACE_BLOBS RETRACE_URL RETRACE_RUN RETRACE_MODE
RETRACE_HOME="$(mktemp -d)"
export RETRACE_HOME
sim_pid=""
cleanup() {
    [[ -n "$sim_pid" ]] && kill "$sim_pid" 2>/dev/null || true
    rm -rf "$RETRACE_HOME"
}
trap cleanup EXIT

json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
export_to() { retrace export "$1" -o "$out/$2.jsonl"; }

say "the demos"
trio=$(retrace demo --seed 7 --json)
bad=$(echo "$trio" | json 'd["replayed"]["run"] if d["replayed"] else ""')
fork=$(echo "$trio" | json 'd["forked"]["fork"] if d["forked"] else ""')
[[ -n "$bad" && -n "$fork" ]] || { echo "error: the trio demo found no bad run this time; run again" >&2; exit 1; }
export_to "$bad" demo-trio-bad-migration
export_to "$fork" demo-trio-bad-migration-fork
pipeline=$(retrace demo pipeline --seed 7 --json)
export_to "$(echo "$pipeline" | json 'd["source"]')" demo-pipeline
export_to "$(echo "$pipeline" | json 'd["fork"]')" demo-pipeline-fork
single=$(retrace demo --json single --runs 1 --replays 0 --seed 7)
export_to "$(echo "$single" | json 'd["runs"][0]["recorded"]')" demo-single

say "the Python examples, against retrace simulate"
sim_out="$RETRACE_HOME/simulate.out"
retrace simulate --addr 127.0.0.1:0 > "$sim_out" 2>/dev/null &
sim_pid=$!
for _ in $(seq 100); do [[ -s "$sim_out" ]] && break; sleep 0.05; done
sim=$(head -1 "$sim_out")
record() {
    local name=$1; shift
    local run
    run=$(retrace record --json --name "$name" --upstream-openai "$sim/v1" --upstream-anthropic "$sim" -- "$@" \
        | tail -1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["run"])')
    export_to "$run" "$name"
}
record python-trio-async python examples/python/agents/app_async.py --max-sleep 0.05
record python-trio-procs python examples/python/agents/app_procs.py --max-sleep 0.05
APP_JITTER_SEED=7 record python-unmodified python examples/python/unmodified/app.py --threads 4
kill "$sim_pid"
wait "$sim_pid" 2>/dev/null || true
sim_pid=""

say "checking that every trace was recorded with masking"
for trace in "$out"/*.jsonl; do
    head -1 "$trace" | python3 -c 'import json, sys; h = json.load(sys.stdin); sys.exit(not (h["masking_rules"]["rules"] and h["mask_key_fingerprint"]))' \
        || { echo "error: $trace was recorded without masking (no rule set or no mask key)" >&2; exit 1; }
done

say "gating what was written (no upstream from here on)"
RETRACE_HOME="$(mktemp -d)" retrace gate "$out"
ls -l "$out"/*.jsonl >&2
