#!/usr/bin/env bash
# Builds target/sdk-venv with tests/sdk/requirements.txt, once: a marker named for the
# requirements' hash makes a second run instant, and flock keeps two test processes (or CI and
# a developer) from building it at the same time. Prints the venv's python on its last line.
# Exit 0: ready; 3: PyPI is unreachable (the caller skips); anything else: a real failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
venv="$target/sdk-venv"
requirements="$here/requirements.txt"
marker="$venv/.installed-$(sha256sum "$requirements" | cut -c1-16)"

if [ -f "$marker" ]; then
    echo "$venv/bin/python"
    exit 0
fi

mkdir -p "$target"
exec 9>"$target/sdk-venv.lock"
flock 9
# Another process may have finished it while this one waited for the lock.
if [ -f "$marker" ]; then
    echo "$venv/bin/python"
    exit 0
fi

python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "venv.sh: $python is missing or older than 3.10 (a2a-sdk and mcp need 3.10+)" >&2
    exit 1
fi

# A half-built venv (an interrupted run) is rebuilt from scratch.
rm -rf "$venv"
"$python" -m venv "$venv"
log="$target/sdk-venv.log"
if ! "$venv/bin/python" -m pip install --disable-pip-version-check -q -r "$requirements" >"$log" 2>&1; then
    # Tell an unreachable index (skip) from a broken install (fail), asking the index pip is
    # configured with.
    if ! "$venv/bin/python" -m pip index versions mcp >/dev/null 2>&1; then
        rm -rf "$venv"
        echo "venv.sh: the package index is unreachable" >&2
        exit 3
    fi
    echo "venv.sh: pip install -r $requirements failed; its log ($log):" >&2
    tail -n 30 "$log" >&2
    rm -rf "$venv"
    exit 1
fi
touch "$marker"
echo "$venv/bin/python"
