#!/usr/bin/env python3
"""What callgrind's instruction count does not price: locked instructions and clock reads.

usage: locked.py CALLGRIND_OUT BINARY REQUESTS [K]

CALLGRIND_OUT must come from `--dump-instr=yes` (benches/perf/hop.sh callgrind writes it so).
Prints, per request, the locked instructions BINARY executed (atomic read-modify-writes: `lock`
prefixed, and `xchg` with memory, which locks without one), by kind and by function (top K), and
the clock reads (calls of `clock_gettime`).

Why: callgrind counts a locked instruction as one, and under valgrind a clock read is a system
call it does not count at all. Natively each costs far more than an ordinary instruction
(docs/perf-levers.md, "What the count does not price").
"""
import collections
import re
import subprocess
import sys


def locked_in(binary):
    """Address -> (function, kind) of every locked instruction in BINARY's disassembly."""
    out = {}
    fn = None
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", binary],
                         capture_output=True, text=True, check=True).stdout
    for line in dis.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.*)>:", line)
        if m:
            fn = m.group(2)
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(\S*)", line)
        if not m:
            continue
        op, arg = m.group(2), m.group(3)
        if op == "lock":
            out[int(m.group(1), 16)] = (fn, arg)
        elif op.startswith("xchg") and "(" in line.split(":", 1)[1]:
            out[int(m.group(1), 16)] = (fn, "xchg")
    return out


def symbols(binary):
    """Demangled name -> address, for names that occur once."""
    seen = collections.Counter()
    addr = {}
    nm = subprocess.run(["nm", "-C", binary], capture_output=True, text=True, check=True).stdout
    for line in nm.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] and parts[1] in "tTwW":
            seen[parts[2]] += 1
            addr[parts[2]] = int(parts[0], 16)
    return {n: a for n, a in addr.items() if seen[n] == 1}


class Profile:
    """A callgrind file read at instruction level."""

    def __init__(self, path):
        self.executed = collections.Counter()  # (object, address) -> executions
        self.first = {}  # function -> its lowest executed address
        self.calls = collections.Counter()  # (call site address, callee) -> calls
        self.inclusive = collections.Counter()  # (call site address, callee) -> inclusive Ir
        self.object = {}  # call site address -> the object (binary or library) it is in
        self.fn_object = {}  # function -> the object it is in
        self.objects = set()  # every object named
        names = {}
        objects = {}
        ob = None
        fn = None
        addr = 0
        pending = None  # a `calls=` line's count, applied to the next position line
        callee = None
        instr = False
        with open(path, errors="replace") as f:
            for line in f:
                if line.startswith("positions:"):
                    instr = "instr" in line.split()
                    continue
                c = line[:1]
                if c.isdigit() or c in "+-*":
                    parts = line.split()
                    p = parts[0]
                    if not instr:
                        continue
                    a = int(p, 16) if p.startswith("0x") else addr + int(p) if p[0] in "+-" else addr
                    addr = a
                    if pending is not None:
                        self.calls[(a, callee)] += pending
                        self.inclusive[(a, callee)] += int(parts[2]) if len(parts) >= 3 else 0
                        self.object[a] = ob
                        pending = None
                        continue
                    if len(parts) >= 3:
                        self.executed[(ob, a)] += int(parts[2])
                        self.first[fn] = min(self.first.get(fn, a), a)
                        self.fn_object.setdefault(fn, ob)
                    continue
                key, _, rest = line.rstrip("\n").partition("=")
                if key in ("fn", "cfn"):
                    m = re.match(r"\((\d+)\)(?: (.*))?", rest)
                    if m and m.group(2) is not None:
                        names[m.group(1)] = m.group(2)
                    name = names.get(m.group(1), rest) if m else rest
                    if key == "fn":
                        fn = name
                    else:
                        callee = name
                elif key == "calls":
                    pending = int(rest.split()[0])
                elif key in ("ob", "cob"):
                    # One numbering for both: a callee's object may be named first.
                    m = re.match(r"\((\d+)\)(?: (.*))?", rest)
                    if m and m.group(2) is not None:
                        objects[m.group(1)] = m.group(2)
                        self.objects.add(m.group(2))
                    if key == "ob":
                        ob = objects.get(m.group(1), rest) if m else rest
        if not instr:
            sys.exit(f"{path}: no instruction addresses; run callgrind with --dump-instr=yes")

    def bases(self, binary):
        """The objects of the profile that are BINARY, each with what to subtract from its
        addresses to find them in BINARY. Callgrind gives an object it knows by offsets, and
        one it does not by address; the functions `benches/perf/hot_text.ld` moves are such a one
        (`???`), the rest of the binary the other."""
        syms = symbols(binary)
        deltas = collections.defaultdict(collections.Counter)
        for n, a in self.first.items():
            if n in syms and a >= syms[n]:
                deltas[self.fn_object.get(n)][a - syms[n]] += 1
        # Not a shared library's, though one defines a name BINARY does too.
        mine = {o: d.most_common(1)[0][0] for o, d in deltas.items()
                if ".so" not in (o or "")}
        if not mine:
            sys.exit(f"no function of {binary} found in the profile")
        return mine


def main():
    path, binary, reqs = sys.argv[1], sys.argv[2], float(sys.argv[3])
    k = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    profile = Profile(path)
    clock = sum(n for (_, callee), n in profile.calls.items() if callee.startswith("clock_gettime"))
    bases = profile.bases(binary)
    locked = locked_in(binary)
    by_kind = collections.Counter()
    by_fn = collections.Counter()
    total = 0
    for (ob, a), n in profile.executed.items():
        hit = ob in bases and locked.get(a - bases[ob])
        if hit:
            by_kind[hit[1]] += n
            by_fn[hit[0]] += n
            total += n
    print(f"locked instructions {total / reqs:.1f}/req, clock reads {clock / reqs:.1f}/req")
    print("  by kind: " + ", ".join(f"{kind} {n / reqs:.1f}" for kind, n in by_kind.most_common()))
    for name, n in by_fn.most_common(k):
        print(f"{n / reqs:7.2f}  {name[:150]}")


if __name__ == "__main__":
    main()
