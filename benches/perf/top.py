#!/usr/bin/env python3
"""Top callgrind entries per request, self and inclusive.

usage: top.py CALLGRIND_OUT REQUESTS [K] [--grep PATTERN]

Instruction counts are divided by REQUESTS; names are shortened (crate paths dropped).
"""
import re
import subprocess
import sys

path, n = sys.argv[1], float(sys.argv[2])
k = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3].isdigit() else 15
pattern = None
if "--grep" in sys.argv:
    pattern = re.compile(sys.argv[sys.argv.index("--grep") + 1])


def rows(inclusive):
    out = subprocess.run(
        ["callgrind_annotate", "--auto=no", "--threshold=100",
         f"--inclusive={'yes' if inclusive else 'no'}", path],
        capture_output=True, text=True, check=False).stdout
    result = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        cost = int(m.group(1).replace(",", ""))
        name = m.group(2)
        name = re.sub(r"\s*\[[^\]]*\]$", "", name)
        # file:function -> function (keep file when the function is a closure of an unnamed thing)
        if ":" in name:
            file, func = name.split(":", 1)
            name = func
            short_file = re.sub(r".*/(src/.*)", r"\1", file)
        else:
            short_file = ""
        name = re.sub(r"\b[a-z_]+::", "", name) if len(name) > 110 else name
        result.append((cost, name[:140], short_file))
    return result


self_rows = rows(False)
total = sum(c for c, _, _ in self_rows)
print(f"total (sum of self) {total:,.0f} Ir = {total / n:,.0f} Ir/request over {n:.0f} requests")
for inclusive in (True, False):
    print(f"\n{'inclusive' if inclusive else 'self'} Ir/request, top {k}:")
    data = rows(True) if inclusive else self_rows
    shown = 0
    for cost, name, file in data:
        if pattern and not pattern.search(name + file):
            continue
        print(f"  {cost / n:9,.0f}  {name}")
        shown += 1
        if shown >= k:
            break
