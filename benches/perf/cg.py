#!/usr/bin/env python3
"""Reads a callgrind.out file: self cost per function, and call edges (inclusive cost of calls).

usage:
  cg.py FILE REQUESTS top [K]            self and inclusive top K per request
  cg.py FILE REQUESTS callers REGEX [K]  who calls functions matching REGEX, cost per request
  cg.py FILE REQUESTS callees REGEX [K]  what functions matching REGEX call
  cg.py FILE REQUESTS calls REGEX        calls per request into functions matching REGEX
  cg.py FILE REQUESTS diff OTHER OTHER_REQUESTS [K]
                                         self cost per request, FILE's against OTHER's, by function
                                         (the K that FILE pays most more for; a program's own
                                         crate name and symbol hashes left out, so two programs
                                         on the same crates line up)

Inclusive cost = self + calls out (recursion counted once per edge, so recursive functions are
over-counted; fine for a hot-path overview).
"""
import collections
import re
import sys


def parse(path):
    names = {"fn": {}, "fl": {}}
    self_cost = collections.Counter()
    edges = collections.Counter()  # (caller, callee) -> inclusive cost
    edge_calls = collections.Counter()
    fn = None
    pending_call = None
    cfn = None
    # The cost follows the positions: one (line), or two with `--dump-instr=yes` (instr line).
    at = 1

    def name(kind, rest):
        m = re.match(r"\((\d+)\)(?: (.*))?", rest)
        if not m:
            return rest
        if m.group(2) is not None:
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), "?")

    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            if line.startswith("positions:"):
                at = len(line.split()) - 1
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                parts = line.split()
                cost = int(parts[at]) if len(parts) > at else 0
                if pending_call is not None:
                    edges[(fn, cfn)] += cost
                    edge_calls[(fn, cfn)] += pending_call
                    pending_call = None
                else:
                    self_cost[fn] += cost
                continue
            key, _, rest = line.partition("=")
            if key == "fn":
                fn = name("fn", rest)
            elif key == "cfn":
                cfn = name("fn", rest)
            elif key in ("fl", "fi", "fe", "cfi", "cfl"):
                name("fl", rest)
            elif key == "calls":
                pending_call = int(rest.split()[0])
    return self_cost, edges, edge_calls


def short(n, width=150):
    n = re.sub(r"<([^<>]*?) as ([^<>]*?)>", lambda m: f"<{m.group(1).split('::')[-1]} as {m.group(2).split('::')[-1]}>", n)
    return n[:width]


def main():
    path, reqs, cmd = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    self_cost, edges, edge_calls = parse(path)
    total = sum(self_cost.values())
    if cmd == "top":
        k = int(sys.argv[4]) if len(sys.argv) > 4 else 15
        incl = collections.Counter(self_cost)
        for (a, b), c in edges.items():
            if a != b:
                incl[a] += c
        print(f"total {total / reqs:,.0f} Ir/request ({reqs:.0f} requests)")
        print(f"\ninclusive, top {k} (Ir/request):")
        for n, c in incl.most_common(k):
            print(f"  {c / reqs:9,.0f}  {short(n)}")
        print(f"\nself, top {k} (Ir/request):")
        for n, c in self_cost.most_common(k):
            print(f"  {c / reqs:9,.0f}  {short(n)}")
        return
    if cmd == "diff":
        def per_fn(costs, n):
            out = collections.Counter()
            for name, c in costs.items():
                name = re.sub(r"::h[0-9a-f]{16}$", "", name)
                name = re.sub(r"^(<?)(agent_reach|hop_on_hyper|hop_by_hand)::", r"\1APP::", name)
                out[name] += c / n
            return out
        mine = per_fn(self_cost, reqs)
        theirs = per_fn(parse(sys.argv[4])[0], float(sys.argv[5]))
        k = int(sys.argv[6]) if len(sys.argv) > 6 else 40
        print(f"total {sum(mine.values()):,.0f} against {sum(theirs.values()):,.0f} Ir/request")
        print(f"  {'more':>8} {'this':>8} {'other':>8}")
        for n in sorted(set(mine) | set(theirs), key=lambda n: theirs[n] - mine[n])[:k]:
            print(f"  {mine[n] - theirs[n]:8,.0f} {mine[n]:8,.0f} {theirs[n]:8,.0f}  {short(n)}")
        return
    if cmd == "crates":
        agg = collections.Counter()
        for n, c in self_cost.items():
            m = re.match(r"<?([A-Za-z_][A-Za-z0-9_]*)::", re.sub(r"^[<&*]+(mut )?", "", n))
            crate = m.group(1) if m else ("libc/malloc" if re.match(r"_?_?(int_)?(malloc|free|realloc|calloc|memcpy|memmove|memset|memcmp|cfree|tcache|unlink|arena)|malloc_", n.lstrip("_")) or "memcpy" in n or "memcmp" in n or "memset" in n or "malloc" in n else n[:40])
            if crate in ("core", "alloc", "std"):
                # generic std code is charged to the crate in the type it runs for
                m2 = re.search(r"(hyper_util|hyper|tokio|http|httparse|bytes|agent_reach|metrics_util|metrics_exporter_prometheus|metrics|hashbrown|futures_util|tower|http_body_util)::", n)
                crate = (m2.group(1) + " (via std)") if m2 else crate
            agg[crate] += c
        for n, c in agg.most_common(25):
            print(f"  {c / reqs:9,.0f}  {c / total * 100:5.1f}%  {n}")
        return
    rx = re.compile(sys.argv[4])
    k = int(sys.argv[5]) if len(sys.argv) > 5 else 25
    if cmd == "callers":
        agg = collections.Counter()
        calls = collections.Counter()
        for (a, b), c in edges.items():
            if rx.search(b):
                agg[a] += c
                calls[a] += edge_calls[(a, b)]
        for n, c in agg.most_common(k):
            print(f"  {c / reqs:9,.0f} Ir  {calls[n] / reqs:6.2f} calls  {short(n)}")
    elif cmd == "callees":
        agg = collections.Counter()
        calls = collections.Counter()
        for (a, b), c in edges.items():
            if rx.search(a):
                agg[b] += c
                calls[b] += edge_calls[(a, b)]
        for n, c in agg.most_common(k):
            print(f"  {c / reqs:9,.0f} Ir  {calls[n] / reqs:6.2f} calls  {short(n)}")
    elif cmd == "calls":
        n = sum(v for (a, b), v in edge_calls.items() if rx.search(b) and not rx.search(a))
        print(f"{n / reqs:.2f} calls/request into /{sys.argv[4]}/")


if __name__ == "__main__":
    main()
