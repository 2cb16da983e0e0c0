#!/usr/bin/env python3
"""Two builds of `xlb-tput-bench` side by side: runs them alternately (the
order swapped every pair, so drift falls on both), `--rounds 3` each run,
and prints per case each build's median over the runs of its offered rate
as a fraction of the bare floor's in the same run, with the range.

    python3 docs/tools/abtput.py OLD_BENCH NEW_BENCH PAIRS

Keep a copy of target/release/xlb-tput-bench before the change (as root;
each binary embeds its own xlb object). About a minute per pair."""
import subprocess, sys, statistics as st

CASES = [
    'xlb dsr-ipip, established',
    'xlb dsr-l2, established',
    'xlb dsr-ipip, new flows (many sources)',
    'kernel forwarding, no nftables',
    'nftables DNAT (numgen random mod 3)',
]

def run(bench):
    out = subprocess.run([bench, '--rounds', '3'], capture_output=True, text=True).stdout
    found = {}
    for line in out.split('\n'):
        for case in CASES:
            if line.startswith(case + ' '):
                # case, Mpps, spread, ns/pkt, cpu ns, ÷floor, ...
                found[case] = float(line[len(case):].split()[4].rstrip('x'))
    if len(found) != len(CASES):
        sys.exit(f'{bench}: no ÷floor figures in its output\n{out[-2000:]}')
    return found

old, new, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
acc = {c: ([], []) for c in CASES}
for i in range(pairs):
    order = [(0, old), (1, new)] if i % 2 == 0 else [(1, new), (0, old)]
    for k, bench in order:
        for case, v in run(bench).items():
            acc[case][k].append(v)
for case, (o, n) in acc.items():
    print('%-40s x floor: old median %.3f [%.2f..%.2f]  new median %.3f [%.2f..%.2f]  (n=%d)'
          % (case, st.median(o), min(o), max(o), st.median(n), min(n), max(n), len(o)))
