#!/usr/bin/env python3
"""Two builds of `xlb-bench` side by side on the NAT cases: runs them
alternately (the order swapped every pair), `--only nat --rounds 6` each
run, and prints per NAT case its ratio to the same run's `dsr-ipip` case
(established hit for the established cases, new flow for the new flow),
the medians of each build and of new ÷ old, with every pair's.

    python3 docs/tools/abnat.py OLD_BENCH NEW_BENCH PAIRS

Keep a copy of target/release/xlb-bench before the change (as root)."""
import subprocess, sys, re, statistics as st
old, new, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
def run(b):
    out = subprocess.run([b, '--only', 'nat', '--rounds', '6'], capture_output=True, text=True).stdout
    r = {}
    for l in out.split('\n'):
        m = re.match(r'^\s+(.+?)\s{2,}([\d.]+)\s+\[[^\]]+\]\s+([\d.]+)x', l)
        if m and m.group(1) not in r: r[m.group(1)] = float(m.group(2))
    e = r.get('established hit, dsr-ipip'); n = r.get('new flow (SYN), dsr-ipip')
    out = {}
    for k, v in r.items():
        if k.startswith('nat, established'): out[k] = v / e
        if k == 'nat, new flow': out[k] = v / n
    return out
acc = {}
for i in range(pairs):
    order = [('old', old), ('new', new)]
    if i % 2: order.reverse()
    res = {k: run(b) for k, b in order}
    for c in res['old']:
        if c in res['new']: acc.setdefault(c, []).append((res['old'][c], res['new'][c]))
for c, v in acc.items():
    print('%-52s / dsr-ipip: old %.2f new %.2f  new/old %.3f %s' % (c, st.median([a for a, b in v]), st.median([b for a, b in v]), st.median([b / a for a, b in v]), [round(b / a, 3) for a, b in v]))
