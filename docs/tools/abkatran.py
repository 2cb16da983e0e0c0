#!/usr/bin/env python3
"""Two builds of `xlb-katran-bench` side by side: runs them alternately (the
order swapped every pair, so drift falls on both) and prints, per case, each
build's xlb ÷ Katran of every run, their medians, and the median over the
pairs of new ÷ old. Each run is the benchmark's own (15 rounds, medians of
per-round ratios), so Katran, built once from the same source, is the
yardstick both builds are held to in the same minute.

    KATRAN_SRC=<checkout> python3 docs/tools/abkatran.py OLD_BENCH NEW_BENCH PAIRS

Keep a copy of target/release/xlb-katran-bench before the change (as root;
each binary embeds its own xlb object)."""
import os, re, subprocess, sys, statistics as st

CASES = {
    'established': re.compile(r'^\s+established, dsr-ipip against IPIP\s+([\d.]+)\s'),
    'new flow': re.compile(r'^\s+new flow \(SYN\)\s+([\d.]+)\s'),
}

def run(bench, env=None, cases=CASES):
    """One run of `bench` (with `env`, else this environment): the figure
    of each of `cases` (name -> pattern; the last matching line counts)."""
    out = subprocess.run([bench], capture_output=True, text=True,
                         env=os.environ if env is None else env).stdout
    found = {}
    for line in out.split('\n'):
        for case, pat in cases.items():
            m = pat.match(line)
            if m:
                found[case] = float(m.group(1))
    if len(found) != len(cases):
        sys.exit(f'{bench}: no xlb ÷ Katran figures in its output (is KATRAN_SRC set?)\n{out[-2000:]}')
    return found

def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    old, new, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    runs = {'old': [], 'new': []}
    for i in range(pairs):
        order = [('old', old), ('new', new)] if i % 2 == 0 else [('new', new), ('old', old)]
        for name, bench in order:
            runs[name].append(run(bench))
        print(f'pair {i + 1}: old {runs["old"][-1]}  new {runs["new"][-1]}', flush=True)
    for case in CASES:
        o = [r[case] for r in runs['old']]
        n = [r[case] for r in runs['new']]
        ratio = [b / a for a, b in zip(o, n)]
        print(f'{case:12} xlb ÷ Katran: old median {st.median(o):.3f} [{min(o):.2f}..{max(o):.2f}]'
              f'  new median {st.median(n):.3f} [{min(n):.2f}..{max(n):.2f}]'
              f'  new ÷ old {st.median(ratio):.3f}  (n={pairs})')

if __name__ == '__main__':
    main()
