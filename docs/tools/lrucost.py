#!/usr/bin/env python3
"""What one lookup and one update of a hash or LRU hash map cost, by key
and value size: the kernel's side of a conntrack hit or insert, without the
rest of `xlb_lb` (docs/benchmarks.md, "Conntrack key and element size").

For each key size it makes a map of 1,048,576 entries holding one entry,
and two tiny XDP programs: one looks that entry up, one updates it (the
same key: the LRU allocates a new element and frees the old one). Each is
timed by BPF_PROG_TEST_RUN beside an empty program, the cases alternated
round by round; medians of the rounds.

    python3 docs/tools/lrucost.py [--repeat] [--type lru|hash] [--value N]
                                  [--rounds N] KEY_SIZE...

--repeat: 200,000 runs per test run (the kernel's loop; else one run per
call, the median of 3,000 calls, as `xlb-bench`'s "one per run").
Needs root. Pin it to one CPU (`taskset -c 1`): the LRU's free lists are
per CPU.
"""
import ctypes, os, statistics, struct, sys

libc = ctypes.CDLL(None, use_errno=True)
SYS_BPF = 321  # x86-64
MAP_TYPES = {'hash': 1, 'lru': 9}


def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(attr, len(attr))
    r = libc.syscall(SYS_BPF, cmd, buf, len(attr))
    if r < 0:
        raise OSError(ctypes.get_errno(), 'bpf command %d' % cmd)
    return r, buf.raw


def ins(op, dst=0, src=0, off=0, imm=0):
    return struct.pack('<BBhi', op, dst | (src << 4), off, imm)


def key_bytes(size):
    return b''.join(struct.pack('<Q', 0x0102030405060708 + 8 * i) for i in range(8))[:size]


def program(map_fd, update):
    """Stores the key (and the value, the same bytes) at fp-64, then looks
    it up or updates it; returns XDP_PASS."""
    p = b''
    for i in range(8):
        lo, hi = struct.unpack('<ii', key_bytes(64)[8 * i:8 * i + 8])
        p += ins(0x18, 1, 0, 0, lo) + ins(0, 0, 0, 0, hi)  # r1 = word i
        p += ins(0x7b, 10, 1, -64 + 8 * i)  # *(u64 *)(fp - 64 + 8i) = r1
    p += ins(0xbf, 2, 10) + ins(0x07, 2, 0, 0, -64)  # r2 = fp - 64
    p += ins(0x18, 1, 1, 0, map_fd) + ins(0, 0, 0, 0, 0)  # r1 = map
    if update:
        p += ins(0xbf, 3, 10) + ins(0x07, 3, 0, 0, -64)  # r3 = fp - 64
        p += ins(0xb7, 4, 0, 0, 0) + ins(0x85, 0, 0, 0, 2)  # BPF_ANY, update
    else:
        p += ins(0x85, 0, 0, 0, 1)  # lookup
    return p + ins(0xb7, 0, 0, 0, 2) + ins(0x95)


def load(insns):
    lic = ctypes.create_string_buffer(b'GPL')
    code = ctypes.create_string_buffer(insns, len(insns))
    log = ctypes.create_string_buffer(65536)
    attr = struct.pack('<IIQQIIQI', 6, len(insns) // 8, ctypes.addressof(code),
                       ctypes.addressof(lic), 1, len(log), ctypes.addressof(log), 0)
    try:
        return bpf(5, attr + b'\0' * 80)[0]
    except OSError:
        sys.exit(log.value.decode())


def test_run(prog, repeat):
    data = ctypes.create_string_buffer(64)
    attr = struct.pack('<IIIIQQII', prog, 0, 64, 0, ctypes.addressof(data), 0, repeat, 0)
    return struct.unpack_from('<I', bpf(10, attr + b'\0' * 64)[1], 36)[0]


def main():
    args = sys.argv[1:]
    def opt(name, default):
        if name in args:
            i = args.index(name)
            v = args[i + 1]
            del args[i:i + 2]
            return v
        return default
    repeat = '--repeat' in args
    args = [a for a in args if a != '--repeat']
    kind = opt('--type', 'lru')
    value = int(opt('--value', '24'))
    rounds = int(opt('--rounds', '15'))
    if not args or kind not in MAP_TYPES or not 1 <= value <= 64:
        sys.exit(__doc__)
    progs = {'empty program': load(ins(0xb7, 0, 0, 0, 2) + ins(0x95))}
    for ks in map(int, args):
        if not 1 <= ks <= 64:
            sys.exit('key size %d: 1 to 64 bytes' % ks)
        m = bpf(0, struct.pack('<IIIII', MAP_TYPES[kind], ks, value, 1 << 20, 0) + b'\0' * 100)[0]
        k = ctypes.create_string_buffer(key_bytes(ks), ks)
        v = ctypes.create_string_buffer(value)
        bpf(2, struct.pack('<IIQQQ', m, 0, ctypes.addressof(k), ctypes.addressof(v), 0) + b'\0' * 80)
        # The kernel's element: a 48-byte header, then key and value, each
        # rounded up to 8 bytes (struct htab_elem, kernel/bpf/hashtab.c).
        elem = 48 + (ks + 7) // 8 * 8 + (value + 7) // 8 * 8
        progs['lookup, key %d (element %d)' % (ks, elem)] = load(program(m, False))
        progs['update, key %d (element %d)' % (ks, elem)] = load(program(m, True))
    res = {}
    for _ in range(rounds):
        for name, p in progs.items():
            if repeat:
                t = test_run(p, 200_000)
            else:
                t = statistics.median(test_run(p, 1) for _ in range(3000))
            res.setdefault(name, []).append(t)
    print('%s map, %d-byte values, %s, %d rounds (ns per run: median [min..max])' % (
        kind, value, 'repeat mode' if repeat else 'one run per call', rounds))
    for name, v in res.items():
        print('  %-34s %7.1f  [%s..%s]' % (name, statistics.median(v), min(v), max(v)))


if __name__ == '__main__':
    main()
