#!/usr/bin/env python3
"""One build of `xlb-katran-bench`, Katran built two ways side by side: runs
it alternately with Katran for clang's default BPF CPU and with
`KATRAN_MCPU=CPU` (the order swapped every pair), and prints per case the
median over the runs of xlb ÷ Katran, and Katran's own ratio to the
minimal program, for each Katran build.

    KATRAN_SRC=<checkout> python3 docs/tools/abkmcpu.py BENCH CPU PAIRS

BENCH: target/release/xlb-katran-bench (root). About 3 s per run."""
import os, re, sys, statistics as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import abkatran  # noqa: E402

CASES = dict(abkatran.CASES)
# The second of the two lines of each name is Katran's ratio to the minimal.
CASES['Katran × minimal, established'] = re.compile(r'^\s+Katran established, IPIP\s+([\d.]+)\s')
CASES['Katran × minimal, new flow'] = re.compile(r'^\s+Katran new flow \(SYN\), IPIP\s+([\d.]+)\s')

def run(bench, cpu):
    env = dict(os.environ)
    env.pop('KATRAN_MCPU', None)
    if cpu:
        env['KATRAN_MCPU'] = cpu
    return abkatran.run(bench, env, CASES)

bench, cpu, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
acc = {}
for i in range(pairs):
    order = [None, cpu] if i % 2 == 0 else [cpu, None]
    for c in order:
        for case, v in run(bench, c).items():
            acc.setdefault((case, c), []).append(v)
for case in CASES:
    d, m = acc[(case, None)], acc[(case, cpu)]
    print('%-29s Katran default: median %.3f [%.2f..%.2f]   Katran %s: median %.3f [%.2f..%.2f]  (n=%d)'
          % (case, st.median(d), min(d), max(d), cpu, st.median(m), min(m), max(m), len(d)))
