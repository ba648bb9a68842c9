#!/usr/bin/env bash
# The crate's rust-version must not be lower than what its locked dependencies declare: a user on
# an older toolchain should get cargo's clear "requires rustc X" message, not a build error deep
# in a dependency. Only one toolchain is installed in CI, so instead of building with the old one
# this reads the resolved graph (`cargo metadata --locked`, offline) and compares every package
# that is built for this machine's target — normal and build dependencies of everything, plus our
# own dev-dependencies (the tests and benches build them) — with ours. Prints the highest
# requirement and who has it; exits non-zero, naming the crates, when ours is below it.
#
#   .ci/msrv.sh [--manifest-path PATH]   check (default: ./Cargo.toml)
#   .ci/msrv.sh --self-test              also show that a lowered rust-version is caught
set -euo pipefail
cd "$(dirname "$0")/.."

check() { # check MANIFEST
    local host
    host=$(rustc -vV | sed -n 's/^host: //p')
    cargo metadata --locked --offline --format-version 1 --filter-platform "$host" \
        --manifest-path "$1" | python3 -c '
import json, sys

meta = json.load(sys.stdin)
packages = {p["id"]: p for p in meta["packages"]}
nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
root = meta["resolve"]["root"]

def version(text):
    parts = [int(x) for x in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))

# What gets built: from the root, normal + build edges everywhere; dev edges only from the root.
built, todo = set(), [root]
while todo:
    node = nodes[todo.pop()]
    for dep in node["deps"]:
        kinds = {k["kind"] for k in dep["dep_kinds"]}
        if node["id"] != root:
            kinds.discard("dev")
        if kinds and dep["pkg"] not in built:
            built.add(dep["pkg"])
            todo.append(dep["pkg"])

ours = packages[root].get("rust_version")
if not ours:
    sys.exit("Cargo.toml has no rust-version")
needs = sorted(((version(packages[i]["rust_version"]), packages[i]["name"], packages[i]["version"], packages[i]["rust_version"])
                for i in built if packages[i].get("rust_version")), reverse=True)
if not needs:
    print(f"rust-version {ours}: no dependency declares one")
    sys.exit(0)
top = needs[0][0]
by = ", ".join(f"{n} {v}" for t, n, v, _ in needs if t == top)
print(f"rust-version {ours}; the locked dependencies ({len(built)} built) need at most {needs[0][3]} ({by})")
above = [f"{n} {v} (rust-version {r})" for t, n, v, r in needs if t > version(ours)]
if above:
    print(f"ERROR rust-version {ours} in Cargo.toml is below what these need; raise it to {needs[0][3]}:")
    print("\n".join(f"  {a}" for a in above))
    sys.exit(1)
'
}

# A copy of the crate whose rust-version is lowered to 1.60 must fail, naming a crate; the real
# one must pass. The copy links src/, tests/, benches/ and examples/ so cargo finds its targets.
self_test() {
    local tmp status=0
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    for d in src tests benches examples; do ln -s "$PWD/$d" "$tmp/$d"; done
    cp Cargo.lock "$tmp/"
    sed 's/^rust-version = ".*"/rust-version = "1.60"/' Cargo.toml >"$tmp/Cargo.toml"
    grep -q '^rust-version = "1.60"' "$tmp/Cargo.toml" || { echo "self-test: could not lower rust-version"; return 1; }
    if check "$tmp/Cargo.toml" >"$tmp/out" 2>&1; then
        echo "self-test FAILED: rust-version 1.60 was accepted"
        status=1
    elif ! grep -q '^  [a-z0-9_-]* [0-9]' "$tmp/out"; then
        echo "self-test FAILED: the error names no crate:"
        cat "$tmp/out"
        status=1
    else
        echo "self-test: rust-version 1.60 is refused ($(grep -c '^  ' "$tmp/out") crates named)"
    fi
    return $status
}

manifest=Cargo.toml
run_self_test=0
# `cargo metadata --offline` below reads the registry's local copy: on a fresh machine nothing has
# been downloaded yet, so fetch the locked packages first (a no-op once they are here).
cargo fetch --locked --quiet
while [ $# -gt 0 ]; do
    case $1 in
        --self-test) run_self_test=1 ;;
        --manifest-path) manifest=$2; shift ;;
        *) echo "usage: $0 [--self-test] [--manifest-path PATH]" >&2; exit 2 ;;
    esac
    shift
done
if [ $run_self_test = 1 ]; then self_test; fi
check "$manifest"
