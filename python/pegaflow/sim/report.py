"""What a run shows: the per-node and total table, the JSON document, the SVG plot."""

from __future__ import annotations

import html
import json

TIERS = ("ram", "ssd", "remote", "miss")
COLORS = {"ram": "#2b8a3e", "ssd": "#e67700", "remote": "#1c7ed6", "miss": "#c92a2a"}


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f}"


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1000:.1f}"


def table(rows: list[dict], total: dict) -> str:
    """Blocks per tier as the query path decided (share of requested), MiB per tier, blocks
    the SSD and peers delivered, blocks loaded into the GPU and verified, integrity, P2P
    latency, prefill tokens saved."""
    head = ["node", "requested", "ram", "ssd", "remote", "miss", "MiB ram", "MiB ssd",
            "MiB remote", "ssd got", "remote got", "loaded", "integrity", "mismatch B",
            "ck-rejected", "p2p p50 ms", "p2p p99 ms", "prefill saved"]
    lines = []
    for r in rows + [total]:
        req = r["requested"] or 1

        def cell(t: str) -> str:
            return f"{r[t]} ({100 * r[t] / req:.0f}%)"

        lines.append([r["node"], str(r["requested"]), cell("ram"), cell("ssd"), cell("remote"),
                      cell("miss"), _mib(r["bytes"]["ram"]), _mib(r["bytes"]["ssd"]),
                      _mib(r["bytes"]["remote"]), str(r["ssd_delivered"]),
                      str(r["remote_delivered"]), str(r["verified_blocks"]),
                      str(r["integrity_failures"]),
                      str(r["bytes_mismatched"]), str(r["checksum_rejections"]),
                      _ms(r["p2p_fetch_p50_s"]), _ms(r["p2p_fetch_p99_s"]),
                      str(r["prefill_tokens_saved"])])
    w = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(cells))

    out = [fmt(head), fmt(["-" * x for x in w])]
    out += [fmt(l) for l in lines[:-1]]
    out += [fmt(["-" * x for x in w]), fmt(lines[-1])]
    return "\n".join(out)


def _f(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def delivery_table(doc: dict) -> str:
    """Per tier: blocks the query path decided, that arrived (the server's
    pegaflow_cache_tier_blocks_delivered_total, or an estimate), and the shortfall the
    server counted; then available / delivered / efficiency per node, load waits,
    Loading-then-nothing and the restarted nodes' time to their first hit."""
    tot = doc["total"]
    src = tot.get("delivered_source", "estimate")
    head = ["tier", "decided", f"delivered ({src})", "shortfall"]
    lines = [[t, str(tot["tier_decided"][t]), str(tot["tier_delivered"][t]),
              str(tot["tier_shortfall"][t])] for t in TIERS]
    w = [max(len(h), *(len(l[i]) for l in lines)) for i, h in enumerate(head)]
    fmt = lambda c: "  ".join(x.rjust(w[i]) if i else x.ljust(w[i])  # noqa: E731
                              for i, x in enumerate(c))
    out = [fmt(head), fmt(["-" * x for x in w])] + [fmt(l) for l in lines]
    reasons = tot.get("shortfall_reasons") or {}
    if reasons:
        out.append("shortfall by tier/reason: " + ", ".join(
            f"{k} {v}" for k, v in sorted(reasons.items())))
    out.append("")
    for r in doc["nodes"] + [tot]:
        out.append(f"{r['node']:>5}: available {r['available']}, delivered {r['delivered']}, "
                   f"efficiency {_f(r['efficiency'] and 100 * r['efficiency'])}%, "
                   f"Loading then nothing {r['loading_then_nothing']}, requests to a down "
                   f"server {r['unreachable_requests']}")
    lw = doc["load_wait_ms"]
    out.append(f"load wait (first query -> Ready) p50 {_f(lw['ready_p50'])} ms, p99 "
               f"{_f(lw['ready_p99'])} ms; (-> load complete) p50 {_f(lw['loaded_p50'])} ms, "
               f"p99 {_f(lw['loaded_p99'])} ms, over {lw['loaded_requests']} loading requests")
    for n, v in sorted(doc["restart_to_hit_s"].items()):
        rs = doc.get("restart_ssd", {}).get(n)
        out.append(f"restarted {n}: first hit {_f(v, '{:.2f}')} s after its ready"
                   + (" (no hit)" if v is None else "")
                   + (f"; recovered {rs['recovered_blocks']} blocks from its SSD, which "
                      f"delivered {rs['ssd_delivered']} since" if rs else ""))
    return "\n".join(out)


def write_json(path: str, doc: dict) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")


def windowed(timeline: list[dict], window_s: float = 2.0) -> list[tuple[float, dict]]:
    """Hit ratio per tier over the last ``window_s`` at each timeline point: from the
    cumulative block counts (all nodes) of the point and of the last point at least
    window_s older."""
    out = []
    j = 0
    for i, p in enumerate(timeline):
        while j < i and timeline[j + 1]["t"] <= p["t"] - window_s:
            j += 1
        base = timeline[j] if timeline[j]["t"] <= p["t"] - window_s else {"t": 0, **{
            t: 0 for t in TIERS}}
        d = {t: p[t] - base[t] for t in TIERS}
        n = sum(d.values())
        if n > 0:
            out.append((p["t"], {t: d[t] / n for t in TIERS}))
    return out


def svg(path: str, timeline: list[dict], events: list[dict], title: str,
        efficiency: list[tuple[float, float]] | None = None) -> None:
    """Hit ratio per tier over time (2 s window), efficiency (delivered / available of the
    requests asked in the last 4 s, black dotted), fault events as dashed lines."""
    W, H, L, R, T, B = 900, 420, 60, 130, 40, 50
    pts = windowed(timeline)
    tmax = max([p["t"] for p in timeline] + [e["t"] for e in events] + [1.0])
    x = lambda t: L + (W - L - R) * t / tmax  # noqa: E731
    y = lambda v: T + (H - T - B) * (1 - v)  # noqa: E731
    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="22" font-size="15">{html.escape(title)}</text>']
    for v in (0, 0.25, 0.5, 0.75, 1.0):
        s.append(f'<line x1="{L}" y1="{y(v):.1f}" x2="{W - R}" y2="{y(v):.1f}" '
                 f'stroke="#ddd"/>')
        s.append(f'<text x="{L - 8}" y="{y(v) + 4:.1f}" text-anchor="end">{int(v * 100)}%'
                 '</text>')
    step = max(1, int(tmax / 10))
    for t in range(0, int(tmax) + 1, step):
        s.append(f'<text x="{x(t):.1f}" y="{H - B + 18}" text-anchor="middle">{t}s</text>')
    s.append(f'<text x="{(L + W - R) / 2}" y="{H - 10}" text-anchor="middle">'
             'time since the workload started (hit ratio of queried blocks, 2 s window)</text>')
    s.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" '
             'stroke="#444"/>')
    for t in TIERS:
        if pts:
            d = " ".join(f"{x(pt):.1f},{y(v[t]):.1f}" for pt, v in pts)
            s.append(f'<polyline fill="none" stroke="{COLORS[t]}" stroke-width="2" '
                     f'points="{d}"><title>{t}</title></polyline>')
    if efficiency:
        d = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in efficiency)
        s.append(f'<polyline fill="none" stroke="#000" stroke-width="2" stroke-dasharray="2,3" '
                 f'points="{d}"><title>efficiency</title></polyline>')
    for i, e in enumerate(events):
        xe = x(e["t"])
        s.append(f'<line x1="{xe:.1f}" y1="{T}" x2="{xe:.1f}" y2="{H - B}" stroke="#000" '
                 'stroke-dasharray="5,4"/>')
        s.append(f'<text x="{xe + 3:.1f}" y="{T + 14 + 14 * (i % 4)}">'
                 f'{html.escape(e["what"])}</text>')
    for i, t in enumerate(TIERS):
        yy = T + 10 + 20 * i
        s.append(f'<line x1="{W - R + 15}" y1="{yy}" x2="{W - R + 40}" y2="{yy}" '
                 f'stroke="{COLORS[t]}" stroke-width="3"/>')
        s.append(f'<text x="{W - R + 46}" y="{yy + 4}">{t}</text>')
    if efficiency:
        yy = T + 10 + 20 * len(TIERS)
        s.append(f'<line x1="{W - R + 15}" y1="{yy}" x2="{W - R + 40}" y2="{yy}" '
                 'stroke="#000" stroke-width="3" stroke-dasharray="2,3"/>')
        s.append(f'<text x="{W - R + 46}" y="{yy + 4}">efficiency</text>')
    s.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(s) + "\n")
