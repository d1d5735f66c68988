"""How cost grows: the curves of `make bench` (bench/report.py runs them unless --no-curves).

run_curves() measures, within a time budget, and returns one JSON document (curves.json):
  engine      bench/engine_curve: Save / QueryPrefetch latency and server memory per block at
              10^4 .. 10^7 resident blocks (the program itself stops where memory or its
              budget ends, and says so)
  p2p         bench/p2p --concurrent N for N = 1, 2, 4 (not measured when bench/p2p has no
              --concurrent)
  metaserver  bench/metaserver --keys K: memory per key and queries/s of the memory store at
              10^5 .. 10^8 keys and of the Redis store (--store redis) at 10^5, 3x10^5, 10^6,
              10^7, each store within its own budget; each next point is first estimated from
              the last one (memory against MemAvailable less a reserve, time linear in keys
              against what is left of the budget) and not started when it does not fit: the
              document says where it stopped and why
SSD throughput at depth 1 .. 32 comes from bench/ssd's own JSON ("depths").

draw_curves() turns that document (and ssd.json) into SVG files (plain <svg>, no library:
axes, log-x where x is a count, labelled units) and the Markdown that links them."""
import json
import math
import os
import subprocess
import time
from xml.sax.saxutils import escape

RESERVE = 4 << 30  # bytes of MemAvailable left to the rest of the machine


def count(n):
    """10^7, 3x10^5 or 1234: a count as the report writes it."""
    n = int(n)
    e = len(str(n)) - 1
    m = n // 10 ** e
    if n >= 1000 and m * 10 ** e == n:
        return f"10^{e}" if m == 1 else f"{m}x10^{e}"
    return str(n)


def mem_available():
    try:
        with open("/proc/meminfo") as f:
            for ln in f:
                if ln.startswith("MemAvailable:"):
                    return int(ln.split()[1]) * 1024
    except OSError:
        pass
    return None


# ---- running ----

def _run(cmd, log, env, timeout):
    t0 = time.time()
    with open(log, "w") as f:
        try:
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                 timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.time() - t0


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def plan(quick):
    """Points and budgets (seconds) of each curve."""
    if quick:
        return {"engine_points": [10 ** 4, 10 ** 5, 10 ** 6], "engine_budget": 40,
                "p2p_args": ["--size", "64m", "--reps", "1", "--lat-reps", "1",
                             "--blocks", "1m"],
                "meta_memory": [10 ** 4, 10 ** 5], "meta_redis": [10 ** 4, 3 * 10 ** 4],
                "meta_memory_budget": 30, "meta_redis_budget": 30, "meta_query_secs": "0.4"}
    return {"engine_points": [10 ** 4, 10 ** 5, 10 ** 6, 10 ** 7], "engine_budget": 80,
            "p2p_args": ["--size", "256m", "--reps", "2", "--lat-reps", "1"],
            "meta_memory": [10 ** 5, 10 ** 6, 10 ** 7, 10 ** 8],
            "meta_redis": [10 ** 5, 3 * 10 ** 5, 10 ** 6, 10 ** 7],
            "meta_memory_budget": 140, "meta_redis_budget": 140, "meta_query_secs": "1"}


def run_engine_curve(bindir, outdir, env, p):
    path = os.path.join(outdir, "engine_curve.json")
    cmd = [os.path.join(bindir, "bench", "engine_curve"), "--points",
           ",".join(str(x) for x in p["engine_points"]), "--budget", str(p["engine_budget"]),
           "--json", path]
    rc, secs = _run(cmd, os.path.join(outdir, "engine_curve.log"), env,
                    p["engine_budget"] * 2 + 120)
    doc = _load(path) if rc == 0 else None
    if doc is None:
        return {"error": f"exit {rc} (see engine_curve.log)", "seconds": secs}
    doc["seconds"] = secs
    return doc


def p2p_has_concurrent(log_text):
    """bench/p2p answered --concurrent with its usage line, which does not name it."""
    return not ("usage:" in log_text and "--concurrent" not in log_text)


def run_p2p_curve(bindir, outdir, env, p):
    out = {"runs": {}, "seconds": 0.0}
    for n in (1, 2, 4):
        path = os.path.join(outdir, f"p2p-concurrent-{n}.json")
        log = os.path.join(outdir, f"p2p-concurrent-{n}.log")
        cmd = [os.path.join(bindir, "bench", "p2p"), "--concurrent", str(n)] + p["p2p_args"] + \
            ["--json", path]
        rc, secs = _run(cmd, log, env, 600)
        out["seconds"] += secs
        with open(log, errors="replace") as f:
            text = f.read()
        if rc != 0 and not p2p_has_concurrent(text):
            return {"not_measured": "bench/p2p has no --concurrent", "seconds": out["seconds"]}
        if rc == 77:
            return {"not_measured": "skipped: " + next(
                (ln.strip() for ln in text.splitlines() if "SKIP" in ln), "exit 77"),
                "seconds": out["seconds"]}
        doc = _load(path) if rc == 0 else None
        if doc is None:
            out.setdefault("errors", {})[str(n)] = f"exit {rc} (see {os.path.basename(log)})"
            continue
        out["runs"][str(n)] = doc
    return out


def _meta_point(doc, store):
    """(bytes per key, queries/s) of one bench/metaserver run for a store."""
    if store == "memory":
        return {"keys": doc["keys"], "bytes_per_key": doc["rpc"]["rss_bytes_per_key"],
                "store_query_per_s": doc["store"]["query_per_s"],
                "rpc_query_per_s": doc["rpc"]["query_per_s"]}
    r = doc["redis"]
    return {"keys": doc["keys"], "bytes_per_key": r["redis_rss_bytes_per_key"],
            "store_query_per_s": r["store_query_per_s"], "rpc_query_per_s": r["rpc_query_per_s"]}


def meta_does_not_fit(keys, last, left_s, avail):
    """Why the next metaserver point (keys) is not started, or None. last: the previous
    point (keys, seconds, bytes a key over both processes)."""
    if last is None:
        return None
    scale = keys / last["keys"]
    need = keys * (last["bytes_per_key_all"] * 1.5)
    if avail is not None and need > avail - RESERVE:
        return (f"memory: ~{need / 2 ** 30:.1f} GiB needed at {count(keys)} keys "
                f"({last['bytes_per_key_all']:.0f} B a key measured at {count(last['keys'])}), "
                f"MemAvailable less the {RESERVE >> 30} GiB reserve is "
                f"{(avail - RESERVE) / 2 ** 30:.1f} GiB")
    if last["seconds"] * scale > left_s:
        return (f"time: ~{last['seconds'] * scale:.0f} s needed at {count(keys)} keys "
                f"({last['seconds']:.0f} s at {count(last['keys'])}), {max(left_s, 0):.0f} s of "
                "the budget left")
    return None


def run_meta_curve(bindir, outdir, env, p):
    """The memory store at p['meta_memory'] keys, then the Redis store (--store redis) at
    p['meta_redis'], each within its own budget; one run per key count, each store stops at
    its first point that does not fit (or fails)."""
    out = {"memory": [], "redis": [], "stopped": {}, "seconds": 0.0}
    for store in ("memory", "redis"):
        t_end = time.time() + p[f"meta_{store}_budget"]
        last = None
        for keys in p[f"meta_{store}"]:
            why = meta_does_not_fit(keys, last, t_end - time.time(), mem_available())
            if why:
                out["stopped"][store] = f"stopped at {count(keys)} keys: {why}"
                break
            name = f"metaserver-{store}-{keys}"
            path = os.path.join(outdir, name + ".json")
            cmd = [os.path.join(bindir, "bench", "metaserver"), "--keys", str(keys),
                   "--query-secs", p["meta_query_secs"], "--store", store, "--json", path]
            rc, secs = _run(cmd, os.path.join(outdir, name + ".log"), env,
                            max(60, t_end - time.time() + 60))
            out["seconds"] += secs
            doc = _load(path) if rc == 0 else None
            if doc is None:
                out["stopped"][store] = f"stopped at {count(keys)} keys: exit {rc} (see {name}.log)"
                break
            pt = _meta_point(doc, store)
            out[store].append(pt)
            allb = doc["rpc"]["rss_bytes_per_key"] + doc["store"].get("store_bytes_per_key", 0) + 32
            if store == "redis":
                allb += pt["bytes_per_key"] + doc["redis"]["metaserver_rss_bytes_per_key"]
            last = {"keys": keys, "seconds": secs, "bytes_per_key_all": allb}
    return out


def run_curves(bindir, outdir, quick, env):
    p = plan(quick)
    t0 = time.time()
    print("report: curves (engine, p2p concurrency, metaserver)", flush=True)
    doc = {"quick": quick, "plan": p,
           "engine": run_engine_curve(bindir, outdir, env, p),
           "p2p": run_p2p_curve(bindir, outdir, env, p),
           "metaserver": run_meta_curve(bindir, outdir, env, p)}
    doc["seconds"] = time.time() - t0
    with open(os.path.join(outdir, "curves.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(f"report: curves took {doc['seconds']:.0f} s", flush=True)
    return doc


# ---- drawing ----

W, H = 780, 400
ML, MR, MT, MB = 78, 280, 40, 56  # margins: left, right (legend), top, bottom
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]


def _fmt(v):
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 1:
        return f"{v:.4g}"
    return f"{v:.2g}"


def _ticks(lo, hi, log):
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        if b - a < 1:
            b = a + 1
        t = [10.0 ** e for e in range(a, b + 1)]
        if len(t) <= 2:  # a narrow range: 1-2-5 steps too, up to the first at or above hi
            t = sorted({m * 10.0 ** e for e in range(a, b + 1) for m in (1, 2, 5)})
            lo_t = max(x for x in t if x <= lo * (1 + 1e-9))
            hi_t = min(x for x in t if x >= hi * (1 - 1e-9))
            t = [x for x in t if lo_t <= x <= hi_t]
        return t[0], t[-1], t
    if hi <= lo:
        hi = lo + 1
    span = hi - lo
    step = 10 ** math.floor(math.log10(span / 5))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= 6:
            step *= m
            break
    a = math.floor(lo / step) * step
    b = math.ceil(hi / step) * step
    n = int(round((b - a) / step))
    return a, b, [a + i * step for i in range(n + 1)]


def svg_chart(title, xlabel, ylabel, series, logx=True, logy=False, xticks=None):
    """series: [(name, [(x, y), ...])]; points with y None or (log) <= 0 are left out.
    Returns the SVG text: axes with ticks and labels, one <g class="series"> per series."""
    pts = [(x, y) for _, s in series for x, y in s if y is not None and
           (not logy or y > 0) and (not logx or x > 0)]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{ML}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>']
    if not pts:
        out.append(f'<text x="{ML}" y="{H // 2}">no points measured</text></svg>')
        return "\n".join(out) + "\n"
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    x0, x1, xt = _ticks(min(xs), max(xs), logx)
    if xticks:
        xt = xticks
        x0, x1 = min(xt + [min(xs)]), max(xt + [max(xs)])
    ylo = min(ys) if logy else min(0.0, min(ys))
    y0, y1, yt = _ticks(ylo, max(ys) * (1.0 if logy else 1.08), logy)
    pw, ph = W - ML - MR, H - MT - MB

    def fx(x):
        if logx:
            return ML + pw * (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0) or 1)
        return ML + pw * (x - x0) / ((x1 - x0) or 1)

    def fy(y):
        if logy:
            return MT + ph - ph * (math.log10(y) - math.log10(y0)) / (math.log10(y1) - math.log10(y0) or 1)
        return MT + ph - ph * (y - y0) / ((y1 - y0) or 1)

    out.append(f'<g class="axes" stroke="#333" fill="none">'
               f'<line x1="{ML}" y1="{MT + ph}" x2="{ML + pw}" y2="{MT + ph}"/>'
               f'<line x1="{ML}" y1="{MT}" x2="{ML}" y2="{MT + ph}"/></g>')
    for t in xt:
        px = fx(t)
        out.append(f'<line x1="{px:.1f}" y1="{MT + ph}" x2="{px:.1f}" y2="{MT + ph + 5}" '
                   f'stroke="#333"/><text x="{px:.1f}" y="{MT + ph + 18}" '
                   f'text-anchor="middle">{escape(_fmt(t))}</text>')
    for t in yt:
        py = fy(t)
        out.append(f'<line x1="{ML}" y1="{py:.1f}" x2="{ML + pw}" y2="{py:.1f}" stroke="#ddd"/>'
                   f'<text x="{ML - 6}" y="{py + 4:.1f}" text-anchor="end">'
                   f'{escape(_fmt(t))}</text>')
    out.append(f'<text x="{ML + pw / 2:.0f}" y="{H - 14}" text-anchor="middle">'
               f'{escape(xlabel)}{" (log scale)" if logx else ""}</text>')
    out.append(f'<text transform="translate(16 {MT + ph / 2:.0f}) rotate(-90)" '
               f'text-anchor="middle">{escape(ylabel)}{" (log scale)" if logy else ""}</text>')
    for i, (name, s) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        keep = [(x, y) for x, y in s if y is not None and (not logy or y > 0) and
                (not logx or x > 0)]
        poly = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in keep)
        out.append(f'<g class="series" data-name="{escape(name, {chr(34): "&quot;"})}">')
        if len(keep) > 1:
            out.append(f'<polyline points="{poly}" fill="none" stroke="{c}" stroke-width="2"/>')
        for x, y in keep:
            out.append(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3" fill="{c}">'
                       f'<title>{escape(name)}: {escape(_fmt(x))} -&gt; {y:.4g}</title></circle>')
        ly = MT + 10 + 18 * i
        out.append(f'<line x1="{ML + pw + 12}" y1="{ly}" x2="{ML + pw + 32}" y2="{ly}" '
                   f'stroke="{c}" stroke-width="2"/><text x="{ML + pw + 36}" y="{ly + 4}">'
                   f'{escape(name)}</text></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _chart(outdir, fname, title, xlabel, ylabel, series, notes, rows_hdr, rows, **kw):
    with open(os.path.join(outdir, fname), "w") as f:
        f.write(svg_chart(title, xlabel, ylabel, series, **kw))
    return {"file": fname, "title": title, "series": [n for n, _ in series], "notes": notes,
            "table": [rows_hdr] + rows}


def charts_engine(e, outdir):
    if not e or "points" not in e:
        return [], [f"engine curve: {e.get('error', 'not run') if e else 'not run'}"]
    pts = e["points"]
    notes = [f"stopped at {e['stopped_at']:.0f} blocks: {e['stopped_why']}"] \
        if "stopped_at" in e else []
    lat = [("Save p50 (%d new blocks a call)" % max((p.get("save_batch", 0) for p in pts),
                                                     default=0),
            [(p["blocks"], p.get("save_p50_us")) for p in pts]),
           ("QueryPrefetch 1 hash p50", [(p["blocks"], p["query1_p50_us"]) for p in pts]),
           ("QueryPrefetch 4096 hashes p50", [(p["blocks"], p["query_p50_us"]) for p in pts])]
    rows = [[f"{p['blocks']:.0f}", f"{p.get('save_p50_us', 0):.0f}", f"{p['query1_p50_us']:.0f}",
             f"{p['query_p50_us']:.0f}", f"{p['bytes_per_block']:.0f}"] for p in pts]
    hdr = ["resident blocks", "Save p50 us", "Query 1 p50 us", "Query 4096 p50 us",
           "server B/block"]
    c1 = _chart(outdir, "curve_engine_latency.svg",
                f"Save and QueryPrefetch latency vs resident blocks ({e['block_bytes']:.0f} B blocks)",
                "resident blocks", "latency (us)", lat, notes, hdr, rows, logy=True)
    c2 = _chart(outdir, "curve_engine_memory.svg", "Server memory per resident block",
                "resident blocks", "bytes per block (RSS delta / blocks)",
                [("server RSS / block", [(p["blocks"], p["bytes_per_block"]) for p in pts])],
                notes, hdr, [], logy=False)
    return [c1, c2], []


def charts_p2p(p, outdir):
    if not p:
        return [], ["P2P concurrency: not run"]
    if "not_measured" in p:
        return [], [f"P2P throughput with 1, 2 and 4 concurrent requesters: not measured: "
                    f"{p['not_measured'].removeprefix('not measured: ')}"]
    by = {}
    for n, doc in sorted(p.get("runs", {}).items(), key=lambda kv: int(kv[0])):
        conc = doc.get("concurrent", int(n))
        for t in doc.get("throughput", []):
            by.setdefault(t["block"], []).append((conc, t["p2p_gbps"], t.get("raw_gbps")))
    series = [(f"P2P {b >> 10} KiB blocks", [(c, g) for c, g, _ in v]) for b, v in sorted(by.items())]
    rows = [[f"{b >> 10} KiB", str(c), f"{g:.2f}", "-" if r is None else f"{r:.2f}"]
            for b, v in sorted(by.items()) for c, g, r in v]
    notes = [f"{n} requesters: {e}" for n, e in sorted(p.get("errors", {}).items())]
    return [_chart(outdir, "curve_p2p_concurrent.svg", "P2P fetch throughput vs concurrent requesters",
                   "concurrent requesters", "GB/s (1e9 bytes/s)", series, notes,
                   ["block", "requesters", "P2P GB/s", "raw GB/s"], rows, xticks=[1, 2, 4])], []


def charts_ssd(s, outdir):
    d = (s or {}).get("depths")
    if not d:
        return [], ["SSD throughput at depth 1 to 32: not measured (bench/ssd without "
                    "--depth-curve, or it failed)"]
    keys = [("tier write", "tier_write_bytes_per_s"), ("raw write", "raw_write_bytes_per_s"),
            ("tier read", "tier_read_bytes_per_s"), ("raw read", "raw_read_bytes_per_s")]
    series = [(n, [(x["depth"], x[k] / 1e9) for x in d]) for n, k in keys]
    rows = [[str(x["depth"])] + [f"{x[k] / 1e9:.2f}" for _, k in keys] for x in d]
    return [_chart(outdir, "curve_ssd_depth.svg",
                   f"SSD throughput vs requests in flight ({s.get('block_bytes', 0) / 2 ** 20:g} MiB blocks)",
                   "requests in flight (depth)", "GB/s (1e9 bytes/s)", series, [],
                   ["depth"] + [n + " GB/s" for n, _ in keys], rows,
                   xticks=[x["depth"] for x in d])], []


def charts_meta(m, outdir):
    if not m:
        return [], ["MetaServer curves: not run"]
    notes = [f"{s} store: {v}" for s, v in sorted(m.get("stopped", {}).items())]
    mem, red = m.get("memory", []), m.get("redis", [])
    ser_b = [("memory store (MetaServer RSS)", [(p["keys"], p["bytes_per_key"]) for p in mem]),
             ("Redis store (redis-server RSS)", [(p["keys"], p["bytes_per_key"]) for p in red])]
    ser_q = [("memory store, in-process", [(p["keys"], p["store_query_per_s"]) for p in mem]),
             ("memory store, gRPC", [(p["keys"], p["rpc_query_per_s"]) for p in mem]),
             ("Redis store, gRPC", [(p["keys"], p["rpc_query_per_s"]) for p in red])]
    rows = [[s, f"{p['keys']:.0f}", f"{p['bytes_per_key']:.0f}", f"{p['store_query_per_s']:.0f}",
             f"{p['rpc_query_per_s']:.0f}"] for s, pts in (("memory", mem), ("redis", red))
            for p in pts]
    hdr = ["store", "keys", "B/key", "in-process queries/s", "gRPC queries/s"]
    return [_chart(outdir, "curve_meta_memory.svg", "MetaServer memory per key", "keys",
                   "bytes per key (RSS delta / keys)", ser_b, notes, hdr, rows),
            _chart(outdir, "curve_meta_qps.svg", "MetaServer prefix queries/s vs keys", "keys",
                   "queries/s (64-block prefixes)", ser_q, notes, hdr, [], logy=True)], []


def plan_note(p):
    """Where each curve was meant to go (the points a run tries before any stop)."""
    if not p:
        return []
    f = lambda v: ", ".join(count(x) for x in v)  # noqa: E731
    return [f"Points tried: engine {f(p['engine_points'])} blocks (budget "
            f"{p['engine_budget']} s); MetaServer memory store {f(p['meta_memory'])} keys, "
            f"Redis store {f(p['meta_redis'])} keys ({p['meta_memory_budget']} s and "
            f"{p['meta_redis_budget']} s); P2P 1, 2, 4 requesters; SSD depths 1 .. 32."]


def draw_curves(doc, ssd, outdir):
    """Writes the SVG files into outdir; returns (charts, notes) for the report."""
    charts, notes = [], plan_note(doc.get("plan"))
    for c, n in (charts_engine(doc.get("engine"), outdir), charts_p2p(doc.get("p2p"), outdir),
                 charts_ssd(ssd, outdir), charts_meta(doc.get("metaserver"), outdir)):
        charts += c
        notes += n
    return charts, notes


def markdown(charts, notes, seconds):
    lines = ["", "## How cost grows", ""]
    if seconds is not None:
        lines += [f"The curves took {seconds:.0f} s of this run (`make bench CURVES=0` skips "
                  "them).", ""]
    for c in charts:
        lines += [f"### {c['title']}", "", f"![{c['title']}]({c['file']})", ""]
        lines += [f"- {n}" for n in c["notes"]]
        if c["notes"]:
            lines.append("")
        t = c["table"]
        if len(t) > 1:
            lines += ["| " + " | ".join(t[0]) + " |", "|" + "---|" * len(t[0])]
            lines += ["| " + " | ".join(r) + " |" for r in t[1:]]
            lines.append("")
    plan = [n for n in notes if n.startswith("Points tried:")]
    rest = [n for n in notes if not n.startswith("Points tried:")]
    lines[3:3] = plan + ([""] if plan else [])
    if rest:
        lines += ["Not drawn:", ""] + [f"- {n}" for n in rest]
    return lines
