"""The HTML report of bench/compare.py: one self-contained file (inline CSS, inline SVG drawn
here; no JavaScript, no external files, no plotting library).

render(report) takes the dict compare.py writes as compare.json and returns the page. The page is
well-formed XML (XHTML syntax: every element closed, only XML's own entities), so it can be
checked with an XML parser.

Per model: the table of compare.md, a latency distribution (box: p25-p75, line: p50, whisker:
min-p99, a tick at max, and a strip of up to STRIP_POINTS sampled calls) and a bar chart of the
first call (compile included). Latency axes switch to log scale when the fastest and slowest
systems are more than LOG_RATIO apart; the first-call axis is always logarithmic (microseconds to
minutes).
"""
from __future__ import annotations

import html
import math

STRIP_POINTS = 300
LOG_RATIO = 10.0

# Kiln in warm colours, peers in cool ones; unknown systems fall back to grey.
COLORS = {
    "kiln-eager": "#f4a261",
    "kiln-compiled": "#e76f51",
    "kiln-compiled-reduce-overhead": "#d62828",
    "kiln-compiled-max-autotune": "#9d0208",
    "ort": "#2a9d8f",
    "torch-eager": "#457b9d",
    "torch-compile": "#1d3557",
    "torch-compile-reduce-overhead": "#457b9d",
    "torch-compile-max-autotune": "#6a4c93",
    "torchscript": "#8ab17d",
    "kiln-torch-compile": "#e9c46a",
}

CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Roboto, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.4; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f3f3f3; } td.sys, th.sys { text-align: left; white-space: nowrap; }
td.bad { color: #b00020; text-align: left; }
td.good { background: #e8f5e9; } td.worse { background: #fdecea; }
code { background: #f5f5f5; padding: 1px 4px; border-radius: 3px; }
.meta { font-size: 0.92em; color: #444; }
.note { font-size: 0.88em; color: #555; }
svg { display: block; margin: 0.5em 0 1.2em 0; }
"""


def esc(s):
    return html.escape(str(s), quote=True)


def fmt_ms(x):
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if x == 0:
        return "0"
    d = max(0, 3 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{d}f}"


def fmt_s(x):
    if x is None:
        return "—"
    if x >= 1:
        return f"{x:.1f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.0f} µs"


class Scale:
    """Maps a value to an x pixel; linear from 0, or log10."""

    def __init__(self, lo, hi, x0, x1, log):
        self.log, self.x0, self.x1 = log, x0, x1
        if log:  # a little room either side; ticks at 1, 2, 5 x 10^k inside
            self.lo, self.hi = lo / 1.25, max(hi, lo * 1.01) * 1.25
        else:
            self.lo, self.hi = 0.0, nice_ceil(hi)

    def __call__(self, v):
        v = min(max(v, self.lo), self.hi)
        if self.log:
            t = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            t = (v - self.lo) / (self.hi - self.lo)
        return self.x0 + t * (self.x1 - self.x0)

    def ticks(self):
        if self.log:
            out, k = [], math.floor(math.log10(self.lo))
            while 10 ** k <= self.hi * 1.0001:
                for m in (1, 2, 5):
                    v = m * 10 ** k
                    if self.lo * 0.9999 <= v <= self.hi * 1.0001:
                        out.append((v, m == 1))
                k += 1
            return out
        step = nice_step(self.hi / 5)
        n = int(round(self.hi / step))
        return [(i * step, True) for i in range(n + 1)]


def nice_step(x):
    if x <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(x))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= x:
            return m * e
    return 10 * e


def nice_ceil(x):
    if x <= 0:
        return 1.0
    step = nice_step(x / 5)
    return math.ceil(x / step - 1e-9) * step


def tick_label(v):
    if v == 0:
        return "0"
    if v >= 1000:
        return f"{v:g}"
    if v >= 1:
        return f"{v:g}"
    return f"{v:.3g}"


def axis(scale, y_top, y_bottom, unit):
    parts = []
    for v, major in scale.ticks():
        x = scale(v)
        parts.append(f'<line x1="{x:.1f}" y1="{y_top}" x2="{x:.1f}" y2="{y_bottom}" '
                     f'stroke="{"#ddd" if major else "#eee"}" stroke-width="1"/>')
        if major or not scale.log or len(scale.ticks()) <= 10:
            parts.append(f'<text x="{x:.1f}" y="{y_bottom + 14}" font-size="11" '
                         f'text-anchor="middle" fill="#555">{esc(tick_label(v))}</text>')
    parts.append(f'<text x="{(scale.x0 + scale.x1) / 2:.1f}" y="{y_bottom + 30}" font-size="12" '
                 f'text-anchor="middle" fill="#333">{esc(unit)}'
                 f'{" (log scale)" if scale.log else ""}</text>')
    return parts


def jitter(i):
    """Deterministic pseudo-random in [-1, 1] (the report must not change between renders)."""
    x = (i * 2654435761) % 2**32
    return (x / 2**32) * 2 - 1


def subsample(samples, n):
    if len(samples) <= n:
        return list(enumerate(samples))
    stride = len(samples) / n
    return [(int(k * stride), samples[int(k * stride)]) for k in range(n)]


def plot_stats(r):
    """The plot draws the raw distribution: all calls where there are samples, else the pooled
    per-round summaries (no box: no quartiles)."""
    return r.get("latency_all_calls") or r["latency"]


def svg_open(width, height, title):
    """The opening of a self-contained SVG plot: the root element and its (escaped) title."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" font-family="sans-serif">',
            f'<title>{esc(title)}</title>']


def latency_svg(model):
    systems = list(model["systems"].values())
    ok = [r for r in systems if r["status"] == "ok"]
    W, left, right, row_h, top = 1000, 210, 200, 34, 10
    parts = svg_open(W, top + row_h * len(systems) + 45, f'{model["model"]}: latency per call (ms)')
    if ok:
        lo = min(plot_stats(r)["min_ms"] for r in ok)
        hi = max(plot_stats(r)["p99_ms"] for r in ok) * 1.1
        scale = Scale(max(lo, 1e-6), max(hi, lo * 1.01), left, W - right, hi / max(lo, 1e-9) > LOG_RATIO)
        parts += axis(scale, top, top + row_h * len(systems), "latency per call, ms")
    for i, r in enumerate(systems):
        yc = top + row_h * i + row_h / 2
        color = COLORS.get(r["system"], "#888")
        parts.append(f'<text x="{left - 10}" y="{yc + 4:.1f}" font-size="12" text-anchor="end" '
                     f'fill="#222">{esc(r["system"])}</text>')
        if r["status"] != "ok":
            parts.append(f'<text x="{left + 6}" y="{yc + 4:.1f}" font-size="12" fill="#b00020">'
                         f'{esc(r["status"])}: {esc(short(r.get("error"), 110))}</text>')
            continue
        lat = plot_stats(r)
        samples = r.get("samples_ms") or []
        for k, v in subsample(samples, STRIP_POINTS):
            parts.append(f'<circle cx="{scale(v):.1f}" cy="{yc + jitter(k) * row_h * 0.38:.1f}" '
                         f'r="1.6" fill="{color}" fill-opacity="0.25"/>')
        x_min, x_p99, x50 = scale(lat["min_ms"]), scale(lat["p99_ms"]), scale(lat["p50_ms"])
        parts.append(f'<line x1="{x_min:.1f}" y1="{yc:.1f}" x2="{x_p99:.1f}" y2="{yc:.1f}" '
                     f'stroke="#333" stroke-width="1.2"/>')
        for x in (x_min, x_p99):
            parts.append(f'<line x1="{x:.1f}" y1="{yc - 6:.1f}" x2="{x:.1f}" y2="{yc + 6:.1f}" '
                         f'stroke="#333" stroke-width="1.2"/>')
        if lat.get("p25_ms") is not None:
            x25, x75 = scale(lat["p25_ms"]), scale(lat["p75_ms"])
            parts.append(f'<rect x="{x25:.1f}" y="{yc - 9:.1f}" width="{max(x75 - x25, 1):.1f}" '
                         f'height="18" fill="{color}" fill-opacity="0.55" stroke="#333" '
                         f'stroke-width="1"/>')
        parts.append(f'<line x1="{x50:.1f}" y1="{yc - 11:.1f}" x2="{x50:.1f}" y2="{yc + 11:.1f}" '
                     f'stroke="#000" stroke-width="2.2"/>')
        x_max = scale(lat["max_ms"])
        clipped = lat["max_ms"] > scale.hi
        parts.append(f'<path d="M {x_max:.1f} {yc - 4:.1f} l 4 4 l -4 4 l -4 -4 z" fill="#333"/>')
        label = f'p50 {fmt_ms(lat["p50_ms"])}  p99 {fmt_ms(lat["p99_ms"])}'
        if clipped:
            label += f'  max {fmt_ms(lat["max_ms"])}'
        if not r.get("samples_ms"):
            label += " (rounds)"
        parts.append(f'<text x="{W - right + 8}" y="{yc + 4:.1f}" font-size="11" fill="#333">'
                     f'{esc(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def first_call_svg(model):
    systems = list(model["systems"].values())
    vals = [r["first_call_s"] for r in systems if r["status"] == "ok" and r.get("first_call_s")]
    W, left, right, row_h, top = 1000, 210, 200, 26, 10
    parts = svg_open(W, top + row_h * len(systems) + 45,
                     f'{model["model"]}: first call including compile (s)')
    if vals:
        scale = Scale(min(vals), max(vals) * 1.01, left, W - right, True)
        parts += axis(scale, top, top + row_h * len(systems), "first call incl. compile, seconds")
    for i, r in enumerate(systems):
        y = top + row_h * i
        parts.append(f'<text x="{left - 10}" y="{y + row_h / 2 + 4:.1f}" font-size="12" '
                     f'text-anchor="end" fill="#222">{esc(r["system"])}</text>')
        v = r.get("first_call_s")
        if r["status"] != "ok" or not v:
            parts.append(f'<text x="{left + 6}" y="{y + row_h / 2 + 4:.1f}" font-size="12" '
                         f'fill="#b00020">{esc(r["status"])}</text>')
            continue
        x = scale(v)
        parts.append(f'<rect x="{left}" y="{y + 4}" width="{max(x - left, 1):.1f}" '
                     f'height="{row_h - 8}" fill="{COLORS.get(r["system"], "#888")}"/>')
        parts.append(f'<text x="{x + 6:.1f}" y="{y + row_h / 2 + 4:.1f}" font-size="11" '
                     f'fill="#333">{esc(fmt_s(v))}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def short(text, limit):
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit - 1] + "…"


def table_html(model, reference):
    systems = model["systems"]
    ref = systems.get(reference)
    ref_p50 = ref["latency"]["p50_ms"] if ref and ref["status"] == "ok" else None
    head = ["system", "p50 ms", "p99 ms", "p99/p50", "first call s", "peak RSS MB",
            f"p50 / {reference} p50", "round p50s ms (min–max)"]
    rows = ["<table>", "<tr>" + "".join(
        ('<th class="sys">' if i == 0 else "<th>") + f"{esc(h)}</th>" for i, h in enumerate(head))
        + "</tr>"]
    for name, r in systems.items():
        cells = [f'<td class="sys">{esc(name)}</td>']
        if r["status"] != "ok":
            cells.append(f'<td class="bad" colspan="7">{esc(r["status"])}: '
                         f'{esc(short(r.get("error"), 200))}</td>')
        else:
            lat = r["latency"]
            mark = " †" if r.get("latency_method") == "round-pooled" else ""
            ratio = lat["p50_ms"] / ref_p50 if ref_p50 else None
            cls = "" if ratio is None or name == reference else (
                ' class="worse"' if ratio > 1.05 else (' class="good"' if ratio < 0.95 else ""))
            rss = r.get("peak_rss_bytes")
            cells += [f"<td>{esc(fmt_ms(lat['p50_ms']) + mark)}</td>",
                      f"<td>{esc(fmt_ms(lat['p99_ms']) + mark)}</td>",
                      f"<td>{lat['p99_ms'] / lat['p50_ms']:.2f}</td>",
                      f"<td>{esc(fmt_ms(r.get('first_call_s')))}</td>",
                      f"<td>{rss / 2**20:.0f}</td>" if rss else "<td>—</td>",
                      f"<td{cls}>{ratio:.2f}</td>" if ratio is not None else "<td>—</td>"]
            rp = [x for x in (r.get("round_p50_ms") or []) if x is not None]
            cells.append(f"<td>{esc(fmt_ms(min(rp)))}–{esc(fmt_ms(max(rp)))}</td>" if rp
                         else "<td>—</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    rows.append("</table>")
    return "\n".join(rows)


def summary_html(report, reference):
    """p50 of every system on every model, with the ratio to the reference."""
    systems = report["settings"]["systems"]
    rows = ["<table>", '<tr><th class="sys">model</th>' +
            "".join(f"<th>{esc(s)}</th>" for s in systems) + "</tr>"]
    for m in report["models"]:
        ref = m["systems"].get(reference)
        ref_p50 = ref["latency"]["p50_ms"] if ref and ref["status"] == "ok" else None
        cells = [f'<td class="sys">{esc(m["model"])}</td>']
        for s in systems:
            r = m["systems"].get(s)
            if not r or r["status"] != "ok":
                cells.append(f'<td class="bad">{esc(r["status"] if r else "absent")}</td>')
                continue
            p50 = r["latency"]["p50_ms"]
            ratio = f" ({p50 / ref_p50:.2f}×)" if ref_p50 and s != reference else ""
            cells.append(f"<td>{esc(fmt_ms(p50) + ratio)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    rows.append("</table>")
    return "\n".join(rows)


def page_head(title, report):
    """The page's opening and the run's header (command, host, versions, settings)."""
    h, v, a = report["host"], report["versions"], report["settings"]
    work = f"{a['seconds']:g} s" if a.get("seconds") else f"{a['iters']} timed calls"
    return ['<!DOCTYPE html>', '<html xmlns="http://www.w3.org/1999/xhtml" lang="en">', "<head>",
            '<meta charset="utf-8"/>', f"<title>{esc(title)}</title>",
            f"<style>{CSS}</style>", "</head>", "<body>", f"<h1>{esc(title)}</h1>",
            '<div class="meta">',
            f"<p>Measured {esc(report['date'])} with <code>{esc(report['command'])}</code></p>",
            f"<p>Host: {esc(h['cpu_model'])}, {esc(h['cores'])} cores "
            f"({esc(', '.join(h['isa']) or 'no AVX2')}), {esc(h.get('mem_total_gib'))} GiB, "
            f"{esc(h.get('os'))}, kernel {esc(h.get('kernel'))}. Load average "
            f"{report['load_avg_start'][0]:.2f} at the start, "
            f"{report.get('load_avg_end', [float('nan')])[0]:.2f} at the end.</p>",
            "<p>Versions: " + esc(", ".join(f"{k} {val}" for k, val in v.items()
                                            if val and k != "kiln_binary")) +
            f", Kiln {esc(report.get('kiln_version') or '?')}.</p>",
            f"<p>Each system: {esc(work)} per model in {a['rounds']} alternating rounds "
            f"({a['warmup']} warm-up calls per round), {a['threads']} threads, batch "
            f"{a['batch']}, device {esc(a['device'])}. Compile budget "
            f"{a['compile_budget_s']:g} s per system.</p>", "</div>"]


def render_page(title, report, body_html):
    """A page with the run's header and `body_html` (bench/compare.py's set summary)."""
    out = page_head(title, report)
    if report.get("notes"):
        out.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in report["notes"]) + "</ul>")
    out += [body_html, '<p class="note">Written by bench/compare.py; method: bench/README.md.'
            "</p>", "</body>", "</html>"]
    return "\n".join(out) + "\n"


def render(report, reference="kiln-compiled", pooled_note="", summary_extra=""):
    """The page of one run; summary_extra (HTML) goes before the per-model sections."""
    out = page_head("Kiln against its peers", report)
    if report.get("notes"):
        out.append("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in report["notes"]) + "</ul>")
    if summary_extra:
        out.append(summary_extra)
    out += ["<h2>Summary: p50 ms (ratio to " + esc(reference) + ")</h2>",
            summary_html(report, reference)]
    for m in report["models"]:
        out.append(f'<h2 id="{esc(m["model"])}">{esc(m["model"])} (batch {m["batch"]})</h2>')
        out.append(table_html(m, reference))
        if m.get("latency_method") == "round-pooled":
            out.append(f'<p class="note">{esc(pooled_note)}</p>')
        if m.get("other_load_cores") is not None:
            out.append(f'<p class="note">Other processes used {m["other_load_cores"]:.2f} cores '
                       f'on average during this model\'s {m["wall_s"]:.0f} s.</p>')
        out.append("<h3>Latency per call</h3>")
        pooled = (" (Kiln: pooled per-round summaries, no box)"
                  if m.get("latency_method") == "round-pooled" else "")
        out.append('<p class="note">The raw distribution of every call' + pooled + ". "
                   "Box: p25–p75; thick line: p50; whisker: min–p99; "
                   "diamond: max; dots: up to " + str(STRIP_POINTS) + " calls in time order.</p>")
        out.append(latency_svg(m))
        out.append("<h3>First call, compile included</h3>")
        out.append(first_call_svg(m))
    out.append('<p class="note">Written by bench/compare.py; method: bench/README.md. Raw '
               "data: compare.json next to this file.</p>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"

