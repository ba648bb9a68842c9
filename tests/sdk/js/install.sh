#!/usr/bin/env bash
# Installs tests/sdk/js/package-lock.json's packages into target/sdk-js, once: a marker named for
# the lock's hash makes a second run instant, and flock keeps two test processes from installing
# at the same time. Prints the directory holding node_modules and the scripts on its last line.
# Exit 0: ready; 3: no Node.js, or the npm registry is unreachable (the caller says so and skips,
# except in CI); anything else: a real failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
dir="$target/sdk-js"
marker="$dir/.installed-$(cat "$here/package-lock.json" "$here"/*.mjs | sha256sum | cut -c1-16)"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "install.sh: node and npm are not installed (Debian: apt-get install nodejs npm)" >&2
    exit 3
fi
if [ -f "$marker" ]; then
    echo "$dir"
    exit 0
fi

mkdir -p "$target"
exec 9>"$target/sdk-js.lock"
flock 9
if [ -f "$marker" ]; then
    echo "$dir"
    exit 0
fi

rm -rf "$dir"
mkdir -p "$dir"
cp "$here/package.json" "$here/package-lock.json" "$here"/*.mjs "$dir/"
log="$target/sdk-js.log"
if ! (cd "$dir" && npm ci --no-audit --no-fund >"$log" 2>&1); then
    if ! npm view @modelcontextprotocol/sdk version >/dev/null 2>&1; then
        rm -rf "$dir"
        echo "install.sh: the npm registry is unreachable" >&2
        exit 3
    fi
    echo "install.sh: npm ci failed; its log ($log):" >&2
    tail -n 30 "$log" >&2
    rm -rf "$dir"
    exit 1
fi
touch "$marker"
echo "$dir"
