#!/usr/bin/env bash
# The proxy's end-to-end tests with the official `openai` and `anthropic` Python clients, and
# the Python SDK's tests against a real daemon:
# real processes (`retrace record` / `replay` / `simulate`) over loopback HTTP, no mocks.
#
#   tests/python/run.sh [PYTEST ARGS...]
#
# Needs only python3 (with venv) and cargo. Creates or reuses a venv in target/python-venv
# with the pinned packages of tests/python/requirements.txt, builds target/release/retrace
# when it is missing (RETRACE_BIN overrides the binary; RETRACE_REBUILD=1 rebuilds), and runs
# pytest. Exit status: pytest's (0 when every test passed).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/python-venv"
req="$here/requirements.txt"
python="${PYTHON:-python3}"

say() { printf '== %s\n' "$*" >&2; }

command -v "$python" >/dev/null || { echo "error: $python not found" >&2; exit 2; }

# The venv: rebuilt when requirements.txt changed since it was made.
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"
if [[ ! -x "$venv/bin/python" ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    say "creating $venv"
    rm -rf "$venv"
    mkdir -p "$root/target"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    echo "$want" > "$stamp"
else
    say "reusing $venv"
fi

# The SDK under test, from this checkout (pure Python, no dependencies).
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$root/sdk/python"

bin="${RETRACE_BIN:-$root/target/release/retrace}"
if [[ -z "${RETRACE_BIN:-}" && ( ! -x "$bin" || "${RETRACE_REBUILD:-0}" == 1 ) ]]; then
    say "building retrace (cargo build --release -p retrace-cli)"
    (cd "$root" && cargo build --release -p retrace-cli)
fi
[[ -x "$bin" ]] || { echo "error: no retrace binary at $bin" >&2; exit 2; }
export RETRACE_BIN="$bin"

say "$("$venv/bin/python" -c 'import openai, anthropic, pytest; print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, pytest {pytest.__version__}")')"
say "retrace: $bin"

cd "$root"
set +e
"$venv/bin/python" -m pytest "$here/proxy" "$root/sdk/python/tests" "$here/agents" "$here/api" "$here/privacy" -p no:cacheprovider -v -rfE --durations=5 "$@"
status=$?
set -e
if [[ $status -eq 0 ]]; then
    say "python proxy tests: PASSED"
else
    say "python proxy tests: FAILED (pytest exit $status)"
fi
exit $status
