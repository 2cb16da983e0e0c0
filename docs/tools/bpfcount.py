#!/usr/bin/env python3
"""Counts the BPF instructions one packet executes in `xlb_lb`: a
deterministic figure for a per-packet path, where timings on a shared VM
drift by up to 2x (docs/benchmarks.md).

It interprets the eBPF object's code (before the verifier: the kernel
inlines array and per-CPU map lookups and `bpf_jiffies64` into a few more
instructions, the same for every build), with every map lookup answered
from the live maps of the benchmark's own world: `xlb-bench` runs in the
background while the paths are counted. Helpers that are
not map lookups are mocked (`bpf_fib_lookup` succeeds with what it was
given, the clock stands still), so each path is counted in its steady
state: the second of two runs, caches warm.

    python3 docs/tools/bpfcount.py target/release/xlb-bench OBJECT...

OBJECT: an eBPF object of xlb (the build's is
target/release/build/lb-user-*/out/aya-build/target/lb-ebpf/bpfel-unknown-none/release/xlb).
Needs root, pyelftools (`pip install pyelftools`) and llvm-objdump for
`--lines` (instructions per source line of each path; with `--own`, a line
of the Rust library counts for the line of xlb that inlined it); `--maps`
lists the map lookups and updates of each path. `BPFCOUNT_BENCH_ARGS="--only
established"` shortens the background run. Objects since issue 28 also
count `xlb_lb_untraced` (the benchmark's twin without the trace hook): the
cost of tracing off is the established rows minus these.
"""
import ctypes, os, struct, sys, collections
from elftools.elf.elffile import ELFFile

libc = ctypes.CDLL(None, use_errno=True)
def bpf(cmd, attr):
    buf = ctypes.create_string_buffer(bytes(attr), len(attr))
    r = libc.syscall(321, cmd, buf, len(attr))
    return r, buf.raw

M64 = (1 << 64) - 1
NCPU = os.cpu_count()

class LiveMaps:
    def __init__(self, prog_id):
        attr = struct.pack('<I', prog_id) + b'\0' * 124
        fd, _ = bpf(13, attr)
        assert fd >= 0, 'prog fd'
        ib = ctypes.create_string_buffer(240)
        a = struct.pack('<IIQ', fd, 240, ctypes.addressof(ib)) + b'\0' * 112
        bpf(15, a)
        nmaps, = struct.unpack_from('<I', ib.raw, 52)
        ids = ctypes.create_string_buffer(4 * nmaps)
        ib = ctypes.create_string_buffer(240)
        struct.pack_into('<I', ib, 52, nmaps); struct.pack_into('<Q', ib, 56, ctypes.addressof(ids))
        a = struct.pack('<IIQ', fd, 240, ctypes.addressof(ib)) + b'\0' * 112
        bpf(15, a)
        self.maps = {}
        for mid in struct.unpack('<%dI' % nmaps, ids.raw):
            mfd, _ = bpf(14, struct.pack('<I', mid) + b'\0' * 124)
            mi = ctypes.create_string_buffer(88)
            bpf(15, struct.pack('<IIQ', mfd, 88, ctypes.addressof(mi)) + b'\0' * 112)
            typ, _id, ks, vs, me, fl = struct.unpack_from('<IIIIII', mi.raw, 0)
            name = mi.raw[24:40].split(b'\0')[0].decode()
            self.maps[name] = (mfd, typ, ks, vs)
    def lookup(self, name, key):
        mfd, typ, ks, vs = self.maps[name]
        percpu = typ in (5, 6, 10)  # percpu hash, percpu array, lru percpu
        n = vs if not percpu else ((vs + 7) // 8 * 8) * NCPU
        kb = ctypes.create_string_buffer(bytes(key[:ks]), ks)
        vb = ctypes.create_string_buffer(n)
        a = struct.pack('<IIQQQ', mfd, 0, ctypes.addressof(kb), ctypes.addressof(vb), 0) + b'\0' * 96
        r, _ = bpf(1, a)
        if r < 0:
            return None
        if percpu:
            st = (vs + 7) // 8 * 8
            cpus = [vb.raw[i * st:i * st + vs] for i in range(NCPU)]
            nz = [c for c in cpus if any(c)]
            return bytearray(nz[0] if nz else cpus[0])
        return bytearray(vb.raw[:vs])

class Prog:
    def __init__(self, path):
        f = ELFFile(open(path, 'rb'))
        self.secs = {}
        for i, s in enumerate(f.iter_sections()):
            self.secs[i] = s
        symtab = f.get_section_by_name('.symtab')
        self.syms = list(symtab.iter_symbols())
        self.funcs = {}  # (secname, insn idx) -> name
        self.byname = {}
        for s in self.syms:
            if s['st_info']['type'] == 'STT_FUNC':
                sec = self.secs[s['st_shndx']].name
                self.funcs[(sec, s['st_value'] // 8)] = s.name
                self.byname[s.name] = (sec, s['st_value'] // 8)
        self.code = {}
        for s in f.iter_sections():
            if s['sh_type'] == 'SHT_PROGBITS' and s['sh_flags'] & 4:
                self.code[s.name] = s.data()
        # Globals (`.rodata*`, and `.data*` such as the trace flag) read
        # their initial value from the object.
        self.data = {s.name: s.data() for s in f.iter_sections()
                     if s.name.startswith(('.rodata', '.data'))}
        self.rel = {}
        for s in f.iter_sections():
            if s['sh_type'] == 'SHT_REL':
                tgt = self.secs[s['sh_info']].name
                for r in s.iter_relocations():
                    sym = self.syms[r['r_info_sym']]
                    self.rel[(tgt, r['r_offset'] // 8)] = (sym, self.secs[sym['st_shndx']].name if isinstance(sym['st_shndx'], int) else None)

class Mem:
    def __init__(self):
        self.regions = []  # (base, bytearray, name)
    def add(self, base, buf, name):
        self.regions.append((base, buf, name)); return base
    def find(self, addr, n):
        for base, buf, name in self.regions:
            if base <= addr and addr + n <= base + len(buf):
                return buf, addr - base, name
        raise RuntimeError('bad access %x+%d' % (addr, n))
    def load(self, addr, n):
        buf, o, _ = self.find(addr, n)
        return int.from_bytes(buf[o:o + n], 'little')
    def store(self, addr, n, v):
        buf, o, _ = self.find(addr, n)
        buf[o:o + n] = (v & ((1 << (8 * n)) - 1)).to_bytes(n, 'little')
    def bytes(self, addr, n):
        buf, o, _ = self.find(addr, n)
        return bytes(buf[o:o + n])

def s64(v):
    v &= M64
    return v - (1 << 64) if v >> 63 else v
def s32(v):
    v &= 0xffffffff
    return v - (1 << 32) if v >> 31 else v

class VM:
    def __init__(self, prog, live, jiffies=1000, coarse=5_000_000_000):
        self.p, self.live = prog, live
        self.mem = Mem()
        self.mapbase = {}  # name -> handle
        self.vals = {}     # (map, key) -> addr
        self.next_val = 0x40000000
        self.jiffies, self.coarse = jiffies, coarse
        for i, (name, data) in enumerate(prog.data.items()):
            self.mem.add(0x60000000 + i * 0x10000, bytearray(data), name)
            self.mapbase['sec:' + name] = 0x60000000 + i * 0x10000
        self.stack = bytearray(512 * 16)
        self.mem.add(0x10000000, self.stack, 'stack')
    def map_handle(self, name):
        if name not in self.mapbase:
            self.mapbase[name] = 0x50000000 + len(self.mapbase) * 0x100
        return self.mapbase[name]
    def map_name(self, h):
        for k, v in self.mapbase.items():
            if v == h: return k
        raise RuntimeError('not a map %x' % h)
    def helper(self, n, r):
        self.helpers[n] += 1
        if n == 1:  # map_lookup_elem
            name = self.map_name(r[1]); mfd, typ, ks, vs = self.live.maps[name]
            key = self.mem.bytes(r[2], ks)
            k = (name, key)
            if k not in self.vals:
                v = self.live.lookup(name, key)
                if v is None:
                    self.lookups.append((name, key.hex(), 'miss')); return 0
                self.vals[k] = self.mem.add(self.next_val, v, name); self.next_val += 0x10000
            self.lookups.append((name, key.hex(), 'hit'))
            return self.vals[k]
        if n == 2:  # map_update_elem
            self.lookups.append((self.map_name(r[1]), 'update', '')); return 0
        if n == 44:  # xdp_adjust_head
            d = s32(r[2]); self.data += d; self.mem.store(self.ctx, 4, 0); return 0
        if n == 118: return self.jiffies
        if n == 160: return self.coarse
        if n == 5: return self.coarse
        if n == 23: return 4
        if n == 69: return 0  # fib lookup: success, params as given
        if n == 8: return 0
        raise RuntimeError('helper %d' % n)
    def run(self, fn, packet, ifindex=2):
        self.helpers = collections.Counter(); self.lookups = []; self.trace = []
        pk = bytearray(256) + bytearray(packet) + bytearray(256)
        self.pkt = self.mem.add(0x20000000 + 0x10000 * len(self.mem.regions), pk, 'packet')
        self.data = self.pkt + 256; self.end = self.data + len(packet)
        self.ctx = self.mem.add(0x30000000 + 0x100 * len(self.mem.regions), bytearray(24), 'ctx')
        self.ifindex = ifindex
        sec, pc = self.p.byname[fn]
        r = [0] * 11
        r[1] = self.ctx; r[10] = 0x10000000 + 512 * 16
        frames = []; count = collections.Counter(); total = 0
        cur = fn
        code = self.p.code[sec]
        while True:
            op = code[pc * 8]; regs = code[pc * 8 + 1]; dst = regs & 15; src = regs >> 4
            off = struct.unpack_from('<h', code, pc * 8 + 2)[0]
            imm = struct.unpack_from('<i', code, pc * 8 + 4)[0]
            total += 1; count[cur] += 1; self.trace.append((sec, pc))
            cls = op & 7
            if op == 0x18:  # ld_imm64
                hi = struct.unpack_from('<i', code, pc * 8 + 12)[0]
                rel = self.p.rel.get((sec, pc))
                if rel:
                    sym, ssec = rel
                    if ssec == 'maps': val = self.map_handle(sym.name)
                    else: val = self.mapbase['sec:' + ssec] + sym['st_value'] + imm
                else:
                    val = (imm & 0xffffffff) | ((hi & 0xffffffff) << 32)
                r[dst] = val & M64; pc += 2; continue
            if cls in (4, 7):  # alu32 / alu64
                is64 = cls == 7
                sv = r[src] if op & 8 else imm
                a = r[dst]
                code_ = op & 0xf0
                if code_ == 0xd0:  # endian
                    if cls == 4:  # le/be
                        bits = imm
                        v = a & ((1 << bits) - 1)
                        if op & 8:  # be
                            v = int.from_bytes(v.to_bytes(bits // 8, 'little'), 'big')
                        r[dst] = v
                    else:  # bswap (v4)
                        bits = imm; v = a & ((1 << bits) - 1)
                        r[dst] = int.from_bytes(v.to_bytes(bits // 8, 'little'), 'big')
                    pc += 1; continue
                if not is64:
                    a &= 0xffffffff; sv &= 0xffffffff
                else:
                    sv = sv & M64 if op & 8 else imm & M64
                mask = M64 if is64 else 0xffffffff
                bits = 64 if is64 else 32
                if code_ == 0x00: v = a + sv
                elif code_ == 0x10: v = a - sv
                elif code_ == 0x20: v = a * sv
                elif code_ == 0x30: v = (a & mask) // (sv & mask) if sv & mask else 0
                elif code_ == 0x40: v = a | sv
                elif code_ == 0x50: v = a & sv
                elif code_ == 0x60: v = a << (sv & (bits - 1))
                elif code_ == 0x70: v = (a & mask) >> (sv & (bits - 1))
                elif code_ == 0x80: v = -a
                elif code_ == 0x90: v = (a & mask) % (sv & mask) if sv & mask else a
                elif code_ == 0xa0: v = a ^ sv
                elif code_ == 0xb0:
                    if off == 0: v = sv
                    else:  # movsx
                        v = sv & ((1 << off) - 1)
                        if v >> (off - 1): v -= 1 << off
                elif code_ == 0xc0:
                    sa = s64(a) if is64 else s32(a)
                    v = sa >> (sv & (bits - 1))
                else: raise RuntimeError('alu %x' % op)
                r[dst] = v & mask; pc += 1; continue
            if cls in (5, 6):  # jmp / jmp32
                code_ = op & 0xf0
                if cls == 5 and code_ == 0x80:  # call
                    if src == 1:  # bpf-to-bpf
                        rel = self.p.rel.get((sec, pc))
                        if rel:
                            sym, ssec = rel
                            if sym['st_info']['type'] == 'STT_FUNC':
                                nsec, npc = ssec, sym['st_value'] // 8
                            else:
                                nsec, npc = ssec, sym['st_value'] // 8 + imm + 1
                        else:
                            nsec, npc = sec, pc + imm + 1
                        frames.append((sec, pc + 1, cur, r[6:10], r[10]))
                        sec, pc, code = nsec, npc, self.p.code[nsec]
                        cur = self.p.funcs.get((sec, pc), '%s+%d' % (sec, pc))
                        r[10] -= 512
                        continue
                    r[0] = self.helper(imm, r) & M64
                    pc += 1; continue
                if cls == 5 and code_ == 0x90:  # exit
                    if not frames:
                        return r[0], total, count
                    sec, pc, cur, saved, fp = frames.pop()
                    code = self.p.code[sec]; r[6:10] = saved; r[10] = fp
                    continue
                if code_ == 0x00: pc += off + 1; continue
                a = r[dst]; b = r[src] if op & 8 else imm & M64
                if cls == 6: a &= 0xffffffff; b &= 0xffffffff; sa, sb = s32(a), s32(b)
                else: sa, sb = s64(a), s64(b)
                t = {0x10: a == b, 0x20: a > b, 0x30: a >= b, 0x40: a & b != 0, 0x50: a != b,
                     0x60: sa > sb, 0x70: sa >= sb, 0xa0: a < b, 0xb0: a <= b, 0xc0: sa < sb,
                     0xd0: sa <= sb}[code_]
                pc += off + 1 if t else 1; continue
            size = {0x00: 4, 0x08: 2, 0x10: 1, 0x18: 8}[op & 0x18]
            mode = op & 0xe0
            if cls == 1:  # ldx
                addr = (r[src] + off) & M64
                if addr == self.ctx: v = self.data
                elif addr == self.ctx + 4: v = self.end
                elif addr == self.ctx + 12: v = self.ifindex
                elif self.ctx <= addr < self.ctx + 24: v = 0
                else:
                    v = self.mem.load(addr, size)
                    if mode == 0x80:  # ldsx
                        if v >> (8 * size - 1): v -= 1 << (8 * size)
                r[dst] = v & M64; pc += 1; continue
            if cls == 3:  # stx
                addr = (r[dst] + off) & M64
                if mode == 0xc0:  # atomic
                    old = self.mem.load(addr, size)
                    if imm & 0xf0 == 0x00: self.mem.store(addr, size, old + r[src])
                    else: raise RuntimeError('atomic %x' % imm)
                    if imm & 1: r[src] = old
                else:
                    self.mem.store(addr, size, r[src])
                pc += 1; continue
            if cls == 2:  # st imm
                self.mem.store((r[dst] + off) & M64, size, imm); pc += 1; continue
            raise RuntimeError('op %x at %s %d' % (op, sec, pc))

def frame(dst, dport, flags):
    """A 72-byte frame of the benchmark's client (192.0.2.1:40001) to `dst`."""
    eth = bytes.fromhex('020000000001' '020000000002') + b'\x08\x00'
    ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 58, 0, 0x4000, 64, 6, 0,
                     bytes([192, 0, 2, 1]), bytes(map(int, dst.split('.'))))
    tcp = struct.pack('!HHIIBBHHH', 40001, dport, 1, 1, 0x50, flags, 65535, 0, 0)
    return eth + ip + tcp + bytes(18)

# The paths of `xlb-bench`, on the flows its world installs
# (tests/src/bench/dataplane.rs).
PATHS = [
    ('xlb_minimal', 'minimal program', frame('10.100.0.1', 80, 0x10)),
    ('xlb_lb', 'established hit, dsr-ipip', frame('10.100.0.1', 80, 0x10)),
    ('xlb_lb', 'established hit, dsr-l2', frame('10.100.0.2', 80, 0x10)),
    ('xlb_lb', 'new flow (SYN), dsr-ipip', frame('10.100.0.1', 80, 0x02)),
    ('xlb_lb', 'non-VIP pass', frame('10.0.0.1', 22, 0x02)),
    # The benchmark's twin without the trace hook (objects since issue 28).
    ('xlb_lb_untraced', 'est. dsr-ipip, no trace hook', frame('10.100.0.1', 80, 0x10)),
    ('xlb_lb_untraced', 'est. dsr-l2, no trace hook', frame('10.100.0.2', 80, 0x10)),
]

def source_lines(obj):
    import subprocess, re
    lines = {}
    for sec in ('xdp', '.text'):
        out = subprocess.run(['llvm-objdump', '-dl', '--section=' + sec, obj],
                             capture_output=True, text=True).stdout
        loc = '?'
        for l in out.split('\n'):
            if l.startswith('; /'):
                loc = re.sub(r'^.*/(\w+/src/\w+\.rs|\w+\.rs)', r'\1', l[2:])
                # Lines of the Rust library are marked: `--own` counts them
                # for the line of xlb that inlined them.
                if '/rustlib/' in l or '/.cargo/registry/' in l:
                    loc = '(' + loc + ')'
            m = re.match(r'\s*(\d+):\s', l)
            if m:
                lines[(sec, int(m.group(1)))] = loc
    return lines

def main():
    import subprocess, time, json
    args = [a for a in sys.argv[1:] if a not in ('--lines', '--maps', '--own')]
    if len(args) < 2:
        sys.exit(__doc__)
    bench, objs = args[0], args[1:]
    def lb_ids():
        out = subprocess.run(['bpftool', 'prog', 'show', 'name', 'xlb_lb', '-j'],
                             capture_output=True, text=True).stdout.strip()
        d = json.loads(out) if out else []
        return {x['id'] for x in (d if isinstance(d, list) else [d])}
    before = lb_ids()
    # Long enough to count while its world is up (its VIPs are removed
    # when it ends); it ends, and removes its namespace, on its own.
    # BPFCOUNT_BENCH_ARGS (e.g. `--only established`) makes the run shorter.
    extra = os.environ.get('BPFCOUNT_BENCH_ARGS', '').split()
    p = subprocess.Popen([bench, '--rounds', '60'] + extra, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        prog_id = None
        for _ in range(100):
            time.sleep(0.2)
            new = lb_ids() - before
            if new:
                prog_id = min(new)
                break
        assert prog_id, 'xlb-bench did not load xlb_lb'
        time.sleep(1)  # its world installs the VIPs and flows after the load
        live = LiveMaps(prog_id)
        for obj in objs:
            print('== %s' % obj)
            prog = Prog(obj)
            lines = source_lines(obj) if '--lines' in sys.argv else None
            for fn, name, pkt in PATHS:
                if fn not in prog.byname:
                    continue
                vm = VM(prog, live)
                vm.run(fn, pkt)
                rc, total, count = vm.run(fn, pkt)
                print('  %-28s %4d instructions  (verdict %d, %d map lookups)' % (
                    name, total, rc, vm.helpers[1]))
                if '--maps' in sys.argv:
                    for m, k, how in vm.lookups:
                        print('      %-12s %-40s %s' % (m, k, how))
                if lines:
                    # A line of the core library counts for the last line
                    # of xlb's own code run before it (what inlined it).
                    own, last = [], '?'
                    for t in vm.trace:
                        l = lines.get(t, '?')
                        if not l.startswith('('):
                            last = l
                        own.append(last)
                    c = collections.Counter(own if '--own' in sys.argv else
                                            (lines.get(t, '?') for t in vm.trace))
                    for k, v in c.most_common(60 if '--own' in sys.argv else 25):
                        print('      %4d %s' % (v, k))
    finally:
        p.wait()

if __name__ == '__main__':
    main()
