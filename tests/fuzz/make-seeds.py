#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets into tests/fuzz/corpus/<target>/seed-*.

Run by hand (`make fuzz-seeds`) when a target's input format changes; the output is
deterministic and committed. Protobuf messages are encoded here field by field (no protobuf
package needed). Seeds are valid requests, frames and headers (the interesting
neighbourhood for mutation), plus a few near-misses. Regression inputs (crash-*) and merged
corpus files are left alone."""
import os
import struct
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(TOP, "tests", "fuzz", "corpus")
VERSION = b"0.23.12"


def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num, v):
    return varint(num << 3) + varint(v)


def f_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(num << 3 | 2) + varint(len(b)) + b


def f_fixed64(num, v):
    return varint(num << 3 | 1) + struct.pack("<Q", v)


def f_fixed32(num, v):
    return varint(num << 3 | 5) + struct.pack("<I", v)


def write(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


H = [bytes([i]) * 16 for i in range(1, 5)]
LEASE = bytes(range(16))


def ipc_sim(name="@kv", size=64 * 4096, dev=0, off=0):
    return f_varint(1, 2) + f_bytes(4, name) + f_varint(5, off) + f_varint(6, size) + f_varint(7, dev)


def ipc_cuda():
    return f_varint(1, 1) + f_bytes(2, b"\x11" * 16) + f_bytes(3, b"\x22" * 64) + f_varint(6, 4096)


def engine_seeds():
    m = {"health": 0, "shutdown": 1, "register": 2, "save": 3, "load": 4, "query": 5,
         "release": 6, "unregister": 7, "session": 8, "qbt": 9, "rtl": 10, "handshake": 11}
    w = lambda n, i, b: write("engine_rpc", n, bytes([i]) + b)
    w("health", m["health"], b"")
    reg = (f_bytes(1, "fz-new") + f_bytes(2, "fz") + f_varint(3, 0) + f_varint(4, 1) + f_varint(5, 1)
           + f_bytes(8, "L0") + f_bytes(9, ipc_sim()) + f_varint(10, 64) + f_varint(11, 4096)
           + f_varint(12, 0) + f_varint(13, 1) + f_bytes(15, VERSION))
    w("register", m["register"], reg)
    w("register-kv-split", m["register"],
      f_bytes(1, "fz-kv") + f_bytes(2, "fz") + f_varint(4, 1) + f_varint(5, 1)
      + f_bytes(8, "L0") + f_bytes(9, ipc_sim()) + f_varint(10, 32) + f_varint(11, 2048)
      + f_varint(12, 2048) + f_varint(13, 2) + f_bytes(15, VERSION))
    w("register-cuda", m["register"],
      f_bytes(1, "fz-cuda") + f_bytes(2, "fz") + f_bytes(8, "L0") + f_bytes(9, ipc_cuda())
      + f_varint(10, 1) + f_varint(11, 4096) + f_varint(12, 0) + f_varint(13, 1) + f_bytes(15, VERSION))
    w("register-pickle", m["register"], f_bytes(1, "x") + f_bytes(8, "L0") + f_bytes(9, b"\x80\x04K\x01."))
    layer = f_bytes(1, "L0") + f_bytes(2, varint(0) + varint(1) + varint(2)) + b"".join(f_bytes(3, h) for h in H[:3])
    w("save", m["save"], f_bytes(1, "fz") + f_varint(2, 0) + f_varint(3, 0) + f_bytes(4, layer))
    w("save-mismatch", m["save"], f_bytes(1, "fz") + f_bytes(4, f_bytes(1, "L0") + f_varint(2, 5) + f_bytes(3, H[0]) + f_bytes(3, H[1])))
    q = f_bytes(1, "fz") + b"".join(f_bytes(2, h) for h in H) + f_bytes(3, "req-1") + f_varint(4, 1) + f_varint(5, 0)
    w("query", m["query"], q)
    w("query-group", m["query"], f_bytes(1, "fz") + f_bytes(2, H[0]) + f_varint(5, 3))
    # QueryPrefetch validates in its decoding pass: refusals pf_rpc_validate would give
    w("query-nul", m["query"], f_bytes(1, "fz") + f_bytes(2, H[0]) + f_bytes(3, b"r\x00x"))
    w("query-long-id", m["query"], f_bytes(1, "i" * 1024) + f_bytes(2, H[0]) + f_bytes(3, "r"))
    w("query-type-then-nul", m["query"], f_varint(1, 1) + f_bytes(3, b"\x00x"))
    target = f_bytes(1, f_varint(1, 7))
    lease_load = f_bytes(1, LEASE) + f_bytes(2, target + target)
    w("load", m["load"], f_bytes(1, "fz") + f_varint(2, 0) + f_varint(3, 0) + f_bytes(4, "/pf_fuzz_no_such_shm")
      + f_bytes(5, f_bytes(1, "L0")) + f_bytes(6, lease_load))
    w("release", m["release"], f_bytes(1, LEASE))
    w("unregister", m["unregister"], f_bytes(1, "fz"))
    w("session", m["session"], f_bytes(1, "fz") + f_bytes(2, "fz") + f_varint(3, 1) + f_varint(4, 1))
    w("qbt", m["qbt"], f_bytes(1, "fz") + f_bytes(2, H[0]) + f_bytes(3, "127.0.0.1:5000"))
    w("rtl", m["rtl"], f_bytes(1, "sess-1"))
    w("handshake", m["handshake"], f_bytes(1, "127.0.0.1:5000") + f_bytes(2, handshake_meta()))
    # sequences (byte 0 >= 0x80): save, query (-> lease), load with "@lease" / "@ls", release
    rec = lambda i, body: bytes([i]) + struct.pack("<H", len(body)) + body
    save = f_bytes(1, "fz") + f_bytes(4, layer)
    query = f_bytes(1, "fz") + b"".join(f_bytes(2, h) for h in H[:3]) + f_bytes(3, "req-2")
    tgts = b"".join(f_bytes(1, f_varint(1, b)) for b in (5, 6, 7))
    load = (f_bytes(1, "fz") + f_bytes(4, "@ls") + f_bytes(5, f_bytes(1, "L0"))
            + f_bytes(6, f_bytes(1, b"@lease") + f_bytes(2, tgts)))
    write("engine_rpc", "seq-save-query-load", bytes([0x80]) + rec(m["save"], save) + rec(m["query"], query)
          + rec(m["load"], load) + rec(m["release"], f_bytes(1, b"@lease")))
    write("engine_rpc", "seq-double-release", bytes([0x80]) + rec(m["save"], save) + rec(m["query"], query)
          + rec(m["release"], f_bytes(1, b"@lease")) + rec(m["release"], f_bytes(1, b"@lease"))
          + rec(m["load"], load))
    qbt = f_bytes(1, "fz") + b"".join(f_bytes(2, h) for h in H[:3]) + f_bytes(3, "127.0.0.1:5000")
    write("engine_rpc", "seq-save-transfer-release", bytes([0x80]) + rec(m["save"], save) + rec(m["qbt"], qbt)
          + rec(m["rtl"], f_bytes(1, "@session")) + rec(m["rtl"], f_bytes(1, "@session")))
    # layouts: a hybrid instance (attention A0 in storage group 0, recurrent S0 in group 1)
    # and an MLA page-first instance, both over halves of the "@kv" object
    half = 32 * 4096
    two = (f_bytes(8, "A0") + f_bytes(8, "S0") + f_bytes(9, ipc_sim(size=half))
           + f_bytes(9, ipc_sim(size=half, off=half)) + f_bytes(10, varint(32) + varint(32))
           + f_bytes(11, varint(4096) + varint(4096)) + f_bytes(12, varint(0) + varint(0))
           + f_bytes(13, varint(1) + varint(1)) + f_varint(4, 1) + f_varint(5, 1) + f_bytes(15, VERSION))
    hy = f_bytes(1, "fz-hy") + f_bytes(2, "fz-hy") + two + f_bytes(19, varint(0) + varint(1))
    pg = f_bytes(1, "fz-pg") + f_bytes(2, "fz-pg") + two + f_varint(18, 1)
    w("register-hybrid", m["register"], hy)
    w("register-hybrid-gap", m["register"],
      f_bytes(1, "fz-gap") + f_bytes(2, "fz") + two + f_bytes(19, varint(0) + varint(2)))
    w("register-page-first", m["register"], pg)
    ids = f_bytes(2, varint(1) + varint(2) + varint(3))
    hs3 = b"".join(f_bytes(3, h) for h in H[:3])
    hsave = (f_bytes(1, "fz-hy") + f_bytes(4, f_bytes(1, "A0") + ids + hs3)
             + f_bytes(4, f_bytes(1, "S0") + f_bytes(2, varint(2)) + f_bytes(3, H[1])))
    hq1 = f_bytes(1, "fz-hy") + b"".join(f_bytes(2, h) for h in H[:3]) + f_bytes(3, "hy-1") + f_varint(5, 1)
    none3 = b"".join(f_bytes(1, b"") for _ in range(1))
    hload = (f_bytes(1, "fz-hy") + f_bytes(4, "@ls") + f_bytes(5, f_bytes(1, "A0"))
             + f_bytes(5, f_bytes(1, "S0"))
             + f_bytes(6, f_bytes(1, b"@lease") + f_bytes(2, none3) + f_bytes(2, f_bytes(1, f_varint(1, 9)))))
    write("engine_rpc", "seq-hybrid", bytes([0x80]) + rec(m["register"], hy) + rec(m["save"], hsave)
          + rec(m["query"], hq1) + rec(m["load"], hload) + rec(m["release"], f_bytes(1, b"@lease")))
    psave = (f_bytes(1, "fz-pg") + f_bytes(4, f_bytes(1, "A0") + ids + hs3)
             + f_bytes(4, f_bytes(1, "S0") + ids + hs3))
    pq = f_bytes(1, "fz-pg") + b"".join(f_bytes(2, h) for h in H[:3]) + f_bytes(3, "pg-1")
    tg3 = f_bytes(2, b"".join(f_bytes(1, f_varint(1, b)) for b in (5, 6, 7)))
    pload = (f_bytes(1, "fz-pg") + f_bytes(4, "@ls") + f_bytes(5, f_bytes(1, "A0") + f_bytes(1, "S0"))
             + f_bytes(6, f_bytes(1, b"@lease") + tg3))
    write("engine_rpc", "seq-page-first", bytes([0x80]) + rec(m["register"], pg) + rec(m["save"], psave)
          + rec(m["query"], pq) + rec(m["load"], pload))
    skip = f_bytes(1, f_varint(1, 1)) + f_bytes(1, b"")  # a block id, then a target without one
    write("engine_rpc", "seq-load-holes", bytes([0x80]) + rec(m["save"], save) + rec(m["query"], query)
          + rec(m["load"], f_bytes(1, "fz") + f_bytes(4, "@ls") + f_bytes(5, f_bytes(1, "L0"))
                + f_bytes(6, f_bytes(1, b"@lease") + f_bytes(2, skip))))
    # QueryPrefetch group 0 looks the request's hashes up in place (issue 27 item 4): a RAM
    # prefix then a miss of another length, a whole hit (released), hashes of 32 / 40 bytes
    # (misses), 41 and 0 bytes (INVALID_ARGUMENT), a 16-byte miss before a hit
    qh = lambda hs, rid: f_bytes(1, "fz") + b"".join(f_bytes(2, h) for h in hs) + f_bytes(3, rid)
    write("engine_rpc", "seq-query-lengths", bytes([0x80]) + rec(m["save"], save)
          + rec(m["query"], qh(H[:2] + [H[2] * 2], "ql-1"))
          + rec(m["query"], qh(H[:3], "ql-2")) + rec(m["release"], f_bytes(1, b"@lease"))
          + rec(m["query"], qh([H[0], H[1] * 2, b"\x07" * 40], "ql-3"))
          + rec(m["query"], qh([H[0], b"\x07" * 41], "ql-4"))
          + rec(m["query"], qh([H[0], b""], "ql-5"))
          + rec(m["query"], qh([H[3], H[0]], "ql-6")))


def handshake_meta(backend="tcp", nnics=1, qps=2, nregions=2):
    nics = b""
    for k in range(nnics):
        nic = b""
        for q in range(qps):
            ep = struct.pack("<IHH4sHHQ4x", 0x45544650, 1, 0, bytes([127, 0, 0, 1]), 40000 + q, 0, 0x1000 + q)
            nic += f_bytes(1, ep)
        for r in range(nregions):
            nic += f_bytes(2, f_varint(1, 0x10000 * (r + 1)) + f_varint(2, 0x8000) + f_varint(3, 7 + r))
        nic += f_varint(3, 0) + f_bytes(4, "lo")
        nics += f_bytes(2, nic)
    return f_bytes(1, backend) + nics + f_varint(3, qps) + f_bytes(4, "3f2504e0-4f89-41d3-9a0c-0305e82c3301")


def handshake_seeds():
    # byte 0: nnics (low 2 bits + 1), byte 1: qps (low 3 bits + 1), byte 2: backend choice
    write("handshake", "tcp-1x2", bytes([0, 1, 0]) + handshake_meta())
    write("handshake", "tcp-2x1", bytes([1, 0, 0]) + handshake_meta(nnics=2, qps=1, nregions=1))
    write("handshake", "verbs", bytes([0, 0, 1]) + handshake_meta(backend="verbs", qps=1, nregions=1))
    write("handshake", "faulty", bytes([0, 1, 0]) + handshake_meta(backend="faulty:tcp"))


def meta_seeds():
    node = f_bytes(1, "127.0.0.1:50055") + f_bytes(2, "3f2504e0-4f89-41d3-9a0c-0305e82c3301")
    write("meta_rpc", "heartbeat", bytes([0]) + node)
    write("meta_rpc", "unregister", bytes([1]) + node)
    ins = f_bytes(1, "ns") + b"".join(f_bytes(2, h) for h in H) + f_bytes(3, "127.0.0.1:50055") + f_bytes(4, "3f2504e0-4f89-41d3-9a0c-0305e82c3301")
    write("meta_rpc", "insert", bytes([2]) + ins)
    write("meta_rpc", "remove", bytes([3]) + ins)
    write("meta_rpc", "query", bytes([4]) + f_bytes(1, "ns") + b"".join(f_bytes(2, h) for h in H))
    # a sequence: byte 0 >= 0x80 means "several requests", see fuzz_meta_rpc.c
    seq = b""
    for i, body in ((0, node), (2, ins), (4, f_bytes(1, "ns") + f_bytes(2, H[0])), (0xff, b"\x28"),
                    (0, node), (2, ins), (0xff, b"\xf0"), (4, f_bytes(1, "ns") + f_bytes(2, H[0])), (3, ins), (1, node)):
        seq += bytes([i]) + struct.pack("<H", len(body)) + body
    write("meta_rpc", "sequence", bytes([0x80]) + seq)


def wire_seeds():
    write("wire", "query", f_bytes(1, "fz") + f_bytes(2, H[0]) + f_bytes(3, "r") + f_varint(4, 1) + f_varint(5, 2))
    write("wire", "all-types", f_varint(1, 300) + f_fixed64(2, 1) + f_bytes(3, b"abc") + f_fixed32(4, 5)
          + f_varint(536870911, 1))
    write("wire", "varint-max", f_varint(1, (1 << 64) - 1))
    write("wire", "truncated", f_bytes(1, b"abcdef")[:-2])


def config_seeds():
    # byte 0: 0 = pegaflow-server flags, 1 = pegaflow-metaserver flags, 2 = value parsers;
    # then NUL-separated arguments
    a = lambda *xs: b"\0".join(x.encode() for x in xs)
    write("config", "server", b"\0" + a("--addr", "127.0.0.1:50055", "--pool-size", "1.5gb",
                                         "--devices", "0,1", "--metric-hll-windows", "15m,1h,1d",
                                         "--enable-prometheus", "false", "--log-level=debug"))
    write("config", "server-p2p", b"\0" + a("--addr=10.0.0.1:50055", "--nics", "127.0.0.2", "127.0.0.3",
                                             "--metaserver-addr", "http://127.0.0.1:50056",
                                             "--insecure-cluster",  # P2P needs a token or this
                                             "--ssd-cache-path", "/tmp/x", "--ssd-cache-capacity", "512 MiB",
                                             "--trace-sample-rate", "0.5", "--enable-debug", "--fault-spec",
                                             "gpu.d2h:prob=0.5,error=EIO;net.read:nth=3,times=2,at=complete;seed=7"))
    write("config", "server-otel", b"\0" + a("--metrics-otel-endpoint", "http://127.0.0.1:4318",
                                              "--metrics-period-secs", "10", "--gpu-backend", "faulty:sim"))
    write("config", "meta", b"\x01" + a("--addr", "[::1]:50056", "--ttl-minutes", "5", "--node-stale-secs=30"))
    write("config", "meta-redis", b"\x01" + a("--addr", "0.0.0.0:50056", "--insecure-cluster", "--store",
                                             "redis://u:pw@10.0.0.5:7000,10.0.0.6:7000"))
    write("config", "values", b"\x02" + a("30gb", "1.5GB", "[::1]:80", "http://h:1/", "true", "18446744073709551615"))


def http_seeds():
    reqs = [
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /instances HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /instances/cleanup?id=fz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"POST /instances/cleanup?id= HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"POST /cache/memory/cleanup HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
        b"DELETE /health HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /nope?a=b&c=%41%zz HTTP/1.0\r\n\r\n",
        b"POST /instances/cleanup HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    ]
    for i, r in enumerate(reqs):
        write("http", "req%d" % i, r)


def tcpnet_seeds():
    # byte 0 flags (see fuzz_tcpnet.c): bit0 real HELLO token, bit1 raddr relative to the
    # region, bit2 readable region's rkey, bit3 the other region's; then the bytes sent
    hello = struct.pack("<IIQQ", 0x48544650, 1, 0, 0x77)
    rd = lambda seq, off, ln: struct.pack("<IIQQQ", 0x52544650, 0, seq, off, ln)
    write("tcpnet", "reads", bytes([7]) + hello + rd(1, 0, 64) + rd(2, 4000, 96) + rd(3, 4095, 1))
    write("tcpnet", "bounds", bytes([7]) + hello + rd(1, 4000, 97) + rd(2, 4096, 1) + rd(3, 0, 4096))
    write("tcpnet", "bad-rkey", bytes([3]) + hello + rd(1, 0, 8))
    write("tcpnet", "no-access", bytes([11]) + hello + rd(1, 0, 8))
    write("tcpnet", "unknown-qp", bytes([0]) + hello + rd(1, 0, 8))
    write("tcpnet", "bad-version", bytes([1]) + struct.pack("<IIQQ", 0x48544650, 2, 0, 1))
    write("tcpnet", "bad-magic", bytes([7]) + hello + rd(1, 0, 8) + b"XXXX" + rd(2, 0, 8)[4:])
    write("tcpnet", "zero-len", bytes([7]) + hello + rd(9, 16, 0) + rd(10, 0, 4096) + rd(11, 8, 8)[:20])


def tcpnet_rx_seeds():
    # byte 0 flags (see fuzz_tcpnet_rx.c), byte 1 READs - 1, byte 2 READ length - 1, script
    resp = lambda st, seq, ln: struct.pack("<IIQQ", 0x44544650, st, seq, ln)
    write("tcpnet_rx", "valid", bytes([7, 3, 63]) + bytes(range(256)))
    write("tcpnet_rx", "headers", bytes([3, 1, 15]) + resp(0, 0, 16) + b"A" * 16 + resp(3, 1, 0))
    write("tcpnet_rx", "raw", bytes([1, 0, 7]) + resp(0, 0, 8) + b"B" * 8 + resp(0, 1, 8) + b"C" * 8)
    write("tcpnet_rx", "refused", bytes([0, 0, 7]) + struct.pack("<II", 0x41544650, 4))
    write("tcpnet_rx", "bad-ack", bytes([0, 0, 7]) + b"XXXXXXXX")
    write("tcpnet_rx", "short", bytes([1, 2, 99]) + resp(0, 0, 100) + b"D" * 40)


def ssd_seeds():
    # see fuzz_ssd_layout.c: byte 0 slots - 1; per slot: nseg - 1, stride/512 - 1, data length
    # (2 bytes LE), flags (bit0 checksum, bit1 corrupt), corrupt position/256; then data
    write("ssd_layout", "one-slot", bytes([0, 0, 0, 0x00, 0x02, 1, 0]) + b"\x5a" * 64)
    write("ssd_layout", "kv-slots", bytes([1, 1, 1, 0xdc, 0x05, 1, 0, 0, 0, 0x00, 0x01, 1, 0]) + bytes(range(256)))
    write("ssd_layout", "corrupt-data", bytes([0, 1, 0, 0xe8, 0x01, 3, 5]) + b"\x01" * 32)
    write("ssd_layout", "corrupt-padding", bytes([0, 0, 1, 0x00, 0x01, 3, 200]) + b"\x02" * 32)
    write("ssd_layout", "no-checksum", bytes([2, 1, 0, 0x00, 0x02, 2, 10, 0, 0, 0x10, 0, 1, 0, 1, 3, 0xff, 0xff, 1, 0]) + b"\x07")


def tenants_seeds():
    tok = b"0123456789abcdef0123"
    write("tenants", "two", b"# tenants\ntenant=acme token=" + tok + b" namespaces=acme,acme-* ram=4gb ssd=64gb\r\n"
          b"tenant=beta token=" + tok[::-1] + b" namespaces=beta ram=unlimited ssd=unlimited\n")
    write("tenants", "overlap", b"tenant=a token=" + tok + b" namespaces=a-*\n"
          b"tenant=b token=" + tok[::-1] + b" namespaces=a-b\n")
    write("tenants", "catch-all", b"tenant=all token=" + tok + b" namespaces=*\n")
    write("tenants", "bad-size", b"tenant=a token=" + tok + b" namespaces=a ram=0\n")
    write("tenants", "bad-ssd", b"tenant=a token=" + tok + b" namespaces=a ssd=1gb ssd=0\n")


def ssd_record_seeds():
    # see fuzz_ssd_record.c: byte 0 odd: build + corrupt (slots-1, ns length, key length-1,
    # seq[8], key, uuid[16], ns, per slot: stride/512-1, seg_len seed, nseg-1, numa, checksum
    # seed; then flips-1 and per flip position (2 bytes), mask; then superblock bytes)
    one = bytes([1, 0, 7, 31]) + bytes(8) + bytes(range(32)) + bytes(range(16)) + b"default"
    one += bytes([7, 200, 1, 1, 9])
    write("ssd_record", "one-slot-flip-key", one + bytes([0, 0, 70, 0x01, 0, 0, 8, 0, 20, 0x04]))
    many = bytes([3, 63, 0, 15]) + bytes([1] * 8) + bytes(16) + bytes(16) + b"n" * 0
    many += bytes([3, 17, 0, 2, 5]) * 64
    write("ssd_record", "many-slots-flip-table", many + bytes([3, 1, 200, 0x80, 0, 5, 1, 6, 9, 7, 9, 0xff]))
    write("ssd_record", "flip-checksum", one + bytes([0, 0, 121, 0x10, 1, 2, 3, 1, 0xf8, 0x01]))
    write("ssd_record", "raw-zero", bytes([0]) + bytes(4096))
    write("ssd_record", "raw-magic", bytes([0]) + b"PFSSDREC" + bytes([1, 0, 0, 0, 0, 2, 0, 0]) + bytes(600))


def main():
    tenants_seeds()
    engine_seeds()
    handshake_seeds()
    meta_seeds()
    wire_seeds()
    config_seeds()
    http_seeds()
    tcpnet_seeds()
    tcpnet_rx_seeds()
    ssd_seeds()
    ssd_record_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
