#!/usr/bin/env python3
"""Writes the linker script that gathers the functions a sidecar runs into one stretch of .text.

usage: hot_text.py OUT.ld PROFILE_DIR... [-- LATER_PROFILE_DIR...]
       (each directory from `OUT=DIR benches/perf/hop.sh order`: callgrind files of one binary,
       run with --demangle=no, and that binary's `nm` in symbols.txt)

Every function with a cost in any profile, hottest first; those only the profiles after `--` ran
(mutual TLS) after all the others, so a sidecar that never runs them maps less of them. A Rust function with one or a few
instances is named without its hash (`17h<16 hex>E`), so the pattern matches it in a build of
another profile (whose hashes differ) or of slightly different code. A generic one with many
instances (a tokio task's poll, a table's rehash) is named exactly, or the pattern would gather
every instance: profile the build that uses the list (dist, the image). The
standard library's v0 symbols (`_R`) are the toolchain's and carry no build hash; a C function
(the allocator) is named exactly when the binary defines it. Any `.llvm.N` LTO suffix is matched
by `*`. Why, and what it saves: docs/development.md#hot-text.
"""
import collections
import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cg  # noqa: E402

HASH = re.compile(r"17h[0-9a-f]{16}E$")
LTO = re.compile(r"\.llvm\.\d+$")
# What a linker-script pattern can hold unquoted; anything else is left out.
PLAIN = re.compile(r"^[A-Za-z0-9_$.]+$")
# More instances than this of one path: named exactly.
FEW = 3


def read_symbols(path):
    names = set()
    for line in open(path):
        f = line.split()
        if len(f) == 3 and f[1] in "tT":
            names.add(f[2])
    return names


def instances(names):
    count = collections.Counter()
    for n in names:
        stem = HASH.sub("", LTO.sub("", n))
        count[stem] += 1
    return count


def pattern(symbol, defined, count):
    symbol = re.sub(r"'\d+$", "", symbol)  # callgrind's recursion marker
    bare = LTO.sub("", symbol)
    if bare.startswith("_ZN") and HASH.search(bare):
        stem = HASH.sub("", bare)
        out = stem + "17h*" if count[stem] <= FEW else bare + "*"
    elif bare.startswith("_R"):
        out = bare + "*"
    elif symbol in defined:
        out = symbol
    else:
        return None  # the C library's, or an address
    return out if PLAIN.match(out.replace("*", "")) else None


def main():
    out, args = sys.argv[1], sys.argv[2:]
    later = args[args.index("--") + 1 :] if "--" in args else []
    first = args[: args.index("--")] if "--" in args else args
    cost = collections.Counter()
    group = {}
    for d in first + later:
        defined = read_symbols(os.path.join(d, "symbols.txt"))
        count = instances(defined)
        for path in sorted(glob.glob(os.path.join(d, "order.*.out*"))):
            self_cost, _, _ = cg.parse(path)
            for fn, c in self_cost.items():
                p = pattern(fn or "", defined, count)
                if p:
                    cost[p] += c
                    group.setdefault(p, 1 if d in later else 0)
    lines = [
        # LLVM puts a function it takes for cold (`#[cold]`, or every path ends in a cold call:
        # a growing table's rehash, `main`) under `.text.unlikely.`.
        f"    *(.text.{p} .text.unlikely.{p})"
        for p, _ in sorted(cost.most_common(), key=lambda pc: group[pc[0]])
    ]
    with open(out, "w") as f:
        f.write(
            "/* The functions a sidecar pair ran from start-up under load, hottest first; those\n"
            "   only mutual TLS ran come last. Written by benches/perf/hot_text.py from\n"
            "   `benches/perf/hop.sh order` profiles; read by build.rs for optimised builds\n"
            "   (docs/development.md#hot-text). A function not named here is only placed after\n"
            "   them: a stale list costs locality, never correctness. */\n"
            "SECTIONS\n{\n  .text.hot : {\n" + "\n".join(lines) + "\n  }\n}\nINSERT BEFORE .text;\n"
        )
    print(f"{out}: {len(lines)} patterns from {len(first) + len(later)} profile(s)")


if __name__ == "__main__":
    main()
