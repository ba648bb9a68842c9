#!/usr/bin/env python3
"""Where a sidecar copies memory: every call site of memcpy/memmove, per request.

usage: copies.py CALLGRIND_OUT BINARY REQUESTS [K] [REGEX]

CALLGRIND_OUT must come from `--dump-instr=yes` (benches/perf/hop.sh callgrind). Prints the top K
call sites by the instructions their copies cost, with calls per request, instructions per call
(which grows with the bytes moved: about 11 a 128 bytes past the first 256) and the source line
of the call (`addr2line` on BINARY's line tables). REGEX picks the callee (default: the memcpy
and memmove variants).

Why: a future moved from the stack into its caller's state, or a request head moved down a
layer, is a `memcpy` of its whole size; the big ones are worth finding (docs/perf-levers.md).
"""
import collections
import re
import subprocess
import sys

from locked import Profile


def main():
    path, binary, reqs = sys.argv[1], sys.argv[2], float(sys.argv[3])
    k = int(sys.argv[4]) if len(sys.argv) > 4 else 30
    wanted = re.compile(sys.argv[5] if len(sys.argv) > 5 else r"mem(cpy|move)")
    profile = Profile(path)
    bases = profile.bases(binary)
    sites = collections.Counter()
    calls = collections.Counter()
    for (a, callee), ir in profile.inclusive.items():
        # Only this binary's call sites: a library's addresses are not in its line tables.
        if wanted.search(callee or "") and profile.object.get(a) in bases:
            sites[a] += ir
            calls[a] += profile.calls[(a, callee)]
    top = sites.most_common(k)
    # With -i an address prints the frames inlined there, innermost first: the first names
    # the function, and the first three lines say where the copy is written.
    where = []
    for a, _ in top:
        at = a - bases[profile.object[a]]
        out = subprocess.run(["addr2line", "-f", "-C", "-i", "-e", binary, hex(at)],
                             capture_output=True, text=True, check=True).stdout.splitlines()
        frames = list(zip(out[0::2], out[1::2]))
        where.append((frames[0][0] if frames else "?", " < ".join(
            re.sub(r".*/(src|registry/src/[^/]+)/", "", f[1]) for f in frames[:3])))
    total = sum(sites.values())
    print(f"copies: {total / reqs:,.0f} Ir/req in {sum(calls.values()) / reqs:.1f} calls/req")
    print(f"{'Ir/req':>8} {'calls/req':>9} {'Ir/call':>8}  call site")
    for (a, ir), (fn, line) in zip(top, where):
        n = calls[a]
        print(f"{ir / reqs:8.0f} {n / reqs:9.2f} {ir / max(n, 1):8.0f}  {line[:110]}  [{fn[:70]}]")


if __name__ == "__main__":
    main()
