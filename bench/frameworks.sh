#!/usr/bin/env bash
# Runs bench/frameworks.py (Retrace's Python SDK vs Apache Burr's SQLite persister vs LangGraph's
# SqliteSaver, per step of an 8-step loop) from the venv target/bench-venv (RETRACE_BENCH_VENV
# overrides), which it creates or tops up with the pinned packages of
# bench/frameworks-requirements.txt and this checkout's SDK. A bench, not a test: test.sh
# doesn't run it. Needs target/release/retrace (RETRACE_BIN overrides).
#
#   bench/frameworks.sh [--loops N] [--warmup N] [--dir DIR] [--json]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${RETRACE_BENCH_VENV:-$root/target/bench-venv}"
req="$root/bench/frameworks-requirements.txt"

# The venv is shared with bench/vcr_baseline.py: packages are added, never removed.
[[ -x "$venv/bin/python" ]] || { mkdir -p "$(dirname "$venv")"; "${PYTHON:-python3}" -m venv "$venv"; }
stamp="$venv/.frameworks-requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    echo "$want" > "$stamp"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$root/sdk/python"

export RETRACE_BIN="${RETRACE_BIN:-$root/target/release/retrace}"
[[ -x "$RETRACE_BIN" ]] || { echo "error: no retrace binary at $RETRACE_BIN (cargo build --release -p retrace-cli)" >&2; exit 2; }
exec "$venv/bin/python" "$root/bench/frameworks.py" "$@"
