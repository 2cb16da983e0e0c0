#!/usr/bin/env python3
"""Two builds of `xlb-bench` side by side: runs them alternately (the order
swapped every pair, so drift falls on both), `--rounds 3` each run, and
prints per case the median over the pairs of new ÷ old, where each side is
that run's median ratio to the minimal program, with the range, and each
side's median ratio.

    python3 docs/tools/abbench.py OLD_BENCH NEW_BENCH PAIRS [xlb-bench arguments]

Keep a copy of target/release/xlb-bench before the change (as root)."""
import subprocess, sys, re, statistics as st
old, new, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3]); extra = sys.argv[4:]
def run(b):
    out = subprocess.run([b, '--rounds', '3'] + extra, capture_output=True, text=True).stdout
    r = {}; sec = None
    for l in out.split('\n'):
        if 'x the minimal' in l: sec = 'x'; continue
        if l.startswith('per packet') or l.startswith('fall'): sec = None
        m = re.match(r'\s+(established hit, dsr-l2|established hit, dsr-ipip|new flow \(SYN\), dsr-ipip|new flow \(SYN\), dsr-l2|non-VIP pass)\s+([\d.]+)\s', l)
        if m and sec == 'x': r[m.group(1)] = float(m.group(2))
    return r
acc = {}; vals = {}
for i in range(pairs):
    order = [(0, old), (1, new)] if i % 2 == 0 else [(1, new), (0, old)]
    res = {}
    for k, b in order: res[k] = run(b)
    for c in res[0]:
        if c in res[1]:
            acc.setdefault(c, []).append(res[1][c] / res[0][c])
            vals.setdefault(c, ([], []))
            vals[c][0].append(res[0][c]); vals[c][1].append(res[1][c])
for c, v in acc.items():
    print('%-28s new/old median %.3f [%.3f..%.3f]  old x %.2f  new x %.2f  (n=%d)' % (c, st.median(v), min(v), max(v), st.median(vals[c][0]), st.median(vals[c][1]), len(v)))
