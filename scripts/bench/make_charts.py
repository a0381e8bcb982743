#!/usr/bin/env python3
"""Draw the documentation's charts from the benchmarks' JSON under benchmarks/results/, and two diagrams.

    pip install matplotlib          # not a dependency of fimoe-convert; only this script needs it
    python3 scripts/bench/make_charts.py [--results benchmarks/results] [--out docs/img] [--no-docs]

Reads (every file is optional; a chart whose data is missing is skipped, with a line saying so):
    benchmarks/results/2026-11-29-{convert,load,memory,decode}.jsonl
        transcribed from the 2026-11-29 logs (H200 and CPU)
    benchmarks/results/cpu/2026-12-01-convert.jsonl                    scripts/bench/bench_convert.py --json
    benchmarks/results/cpu/2026-12-01-{memory,decode,startup}.json
        bench_memory.py / bench_decode.py / bench_startup.py --json
    benchmarks/results/cpu/2026-12-01-peers.json                       bench_peers.py's final table
    benchmarks/results/h200/2026-12-01-{v4-flash-geometry-bf16-fp8,v4-geometry-megamoe-and-pro,
        v4-flash-geometry-all-targets}.jsonl,
    benchmarks/results/h200/2026-12-02-{chunked-sm90-*,whole-block-cake-run2}.jsonl
        bench_convert.py --json on the H200 at V4 geometry
    benchmarks/results/h200/2026-12-02-stream-50MBps-all.json           bench_stream.py --json (--stream vs download)
    docs/img/terminal-convert.txt                            a tmux capture-pane of a conversion in progress
Writes docs/img/*.png, and (unless --no-docs) the table between the `h200-v4-geometry` markers in
docs/PERFORMANCE.md, from the V4-geometry files ("not yet measured" when there are none).
Every chart's title says what was measured, where and when; axes carry units."""

from __future__ import annotations

import argparse
import glob
import json
import re
import statistics
import sys
from pathlib import Path

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
except ImportError:
    sys.exit("make_charts.py needs matplotlib: pip install matplotlib")

REPO = Path(__file__).resolve().parents[2]
GiB = 2**30
OURS, PEER, FLOOR, FLOOR2, OTHER = "#1f77b4", "#d62728", "#7f7f7f", "#bcbcbc", "#2ca02c"
MARK_BEGIN, MARK_END = "<!-- h200-v4-geometry:begin -->", "<!-- h200-v4-geometry:end -->"

plt.rcParams.update({"font.size": 11, "axes.titlesize": 12.5, "axes.titleweight": "bold", "axes.labelsize": 11,
                     "legend.fontsize": 10, "figure.dpi": 110, "savefig.bbox": "tight", "axes.spines.top": False,
                     "axes.spines.right": False})


# Reading ----------------------------------------------------------------------------------------------------------

def jsonl(path: Path) -> list[dict]:
    """The records of a JSON-lines file (a first `_note` line is skipped); [] when the file is absent."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "_note" not in r]


def jsonf(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


# The V4-geometry runs on the H200 (the moe_ep rows: the target's units as they are now, expert chunks or two whole
# blocks in flight; 2026-12-01-v4-flash-geometry-moe-ep-fp8 measured whole-block units without overlap)
V4_GEOMETRY = ("2026-12-01-v4-flash-geometry-bf16-fp8.jsonl", "2026-12-01-v4-geometry-megamoe-and-pro.jsonl",
               "2026-12-01-v4-flash-geometry-all-targets.jsonl", "2026-12-02-chunked-sm90-*.jsonl",
               "2026-12-02-whole-block-cake-run2.jsonl")


def v4_geometry(ev: Path) -> list[dict]:
    rows = []
    for p in [p for pattern in V4_GEOMETRY for p in sorted(glob.glob(str(ev / "h200" / pattern)))]:
        for r in jsonl(Path(p)):
            rows.append(dict(r, _file=str(Path(p).resolve().relative_to(REPO))))
    return rows


def machine_label(r: dict) -> str:
    return "H200" if r.get("device") == "cuda" else "CPU"


def save(fig, out: Path, name: str, made: list[str]) -> None:
    fig.savefig(out / name)
    plt.close(fig)
    made.append(name)
    print(f"wrote {out / name}")


def skip(name: str, why: str) -> None:
    print(f"skipped {name}: {why}")


# Charts -----------------------------------------------------------------------------------------------------------

def chart_load(ev: Path, out: Path, made: list[str]) -> None:
    rows = jsonl(ev / "2026-11-29-load.jsonl")
    if not rows:
        return skip("load-time.png", "no benchmarks/results/2026-11-29-load.jsonl")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((machine_label(r), r["target"], r["experts"]), []).append(r)
    keys = sorted(groups, key=lambda k: (k[0] != "CPU", k[1] != "megamoe_sm90_mxfp4", k[2]))
    fig, ax = plt.subplots(figsize=(12.5, 5.8))
    x = range(len(keys))
    today = [statistics.median(r["today_s"] for r in groups[k]) for k in keys]
    shim = [statistics.median(r["shim_s"] for r in groups[k]) for k in keys]
    w = 0.38
    ax.bar(
        [i - w / 2 for i in x], today, w, color=PEER, label="today: read FP4 + dequant/repack + FlashInfer preprocess"
    )
    ax.bar([i + w / 2 for i in x], shim, w, color=OURS, label="converted once: the runtime shim reads the output")
    for i, k in enumerate(keys):
        ratios = sorted(r["ratio"] for r in groups[k])
        txt = f"{ratios[0]:g}x" if len(ratios) == 1 else f"{ratios[0]:g}-{ratios[-1]:g}x\n({len(ratios)} runs)"
        ax.annotate(txt, (i, max(today[i], shim[i]) * 1.15), ha="center", va="bottom", fontsize=10, weight="bold")
    ax.set_yscale("log")
    ax.set_ylim(top=max(today) * 6)
    ax.set_xticks(list(x), [f"{m}, {e} experts\n{t.replace('_bf16', chr(10) + '_bf16')}" for m, t, e in keys],
                  fontsize=9.5)
    ax.set_ylabel("seconds to load one MoE layer (log scale, median of runs)")
    ax.set_title("Load time of one MoE layer (H=4096, I=2048): today's load-time path vs the converted output\n"
                 "2026-11-29, a 2-core CPU and an H200 host (scripts/bench/bench_load.py); label: speed-up")
    ax.legend(loc="upper right")
    save(fig, out, "load-time.png", made)


def _convert_label(r: dict) -> str:
    when = r.get("date", "")
    shards = "" if r.get("shard_size", "5GB") == "5GB" else f", {r['shard_size']} shards"
    return (f"{machine_label(r)} {r['target']}, {r['layers']} layers{shards}\n"
            f"{r['out_bytes'] / 1e9:.1f} GB out ({when})")


def chart_convert(ev: Path, out: Path, made: list[str]) -> None:
    old = jsonl(ev / "2026-11-29-convert.jsonl")
    new = [dict(r, date="2026-12-01") for r in jsonl(ev / "cpu" / "2026-12-01-convert.jsonl")]
    if not old and not new:
        return skip("convert-floor.png", "no conversion benchmarks")
    latest: dict[tuple, dict] = {}
    for r in old + new:  # the latest run of each configuration (files and records are in time order)
        latest[(machine_label(r), r["target"], r["layers"], r.get("shard_size", "5GB"), r.get("date"))] = r
    rows = sorted(
        latest.values(), key=lambda r: (machine_label(r) != "H200", r["target"], r["out_bytes"], r.get("date"))
    )
    fig, ax = plt.subplots(figsize=(11, 0.95 * len(rows) + 1.8))
    h = 0.2
    series = [("floor: read SRC once + write the output (buffered)", "floor_s", FLOOR2),
              ("floor with O_DIRECT writes (what the converter does)", "floor_direct_s", FLOOR),
              ("fimoe-convert, whole CLI process", "wall_s", OURS),
              ("fimoe-convert, convert() alone (no interpreter start-up)", "convert_s", "#9ecae1")]
    for j, (label, key, color) in enumerate(series):
        ys = [i + (j - 1.5) * h for i in range(len(rows))]
        ax.barh(ys, [r.get(key) or 0 for r in rows], h, color=color, label=label)
    for i, r in enumerate(rows):
        ax.annotate(f"{r['wall_s'] / r['floor_s']:.2f}x floor, {r['wall_s'] / r['floor_direct_s']:.2f}x O_DIRECT floor",
                    (max(r["wall_s"], r["floor_s"], r["floor_direct_s"]) + 0.3, i), va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), [_convert_label(r) for r in rows], fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (one run each; the latest run of every configuration)")
    ax.set_xlim(right=max(max(r["wall_s"], r["floor_s"]) for r in rows) * 1.55)
    ax.set_title(
        "Conversion time against the disk floor (flash-geometry fixtures: H=4096, I=2048, 16 experts a layer)\n"
        "H200 host 2026-11-29; a 2-core CPU 2026-11-29 (load ~0) and 2026-12-01 (load ~5)"
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.4, -0.06 * 12 / len(rows)), ncol=2, fontsize=9)
    save(fig, out, "convert-floor.png", made)


def chart_memory(ev: Path, out: Path, made: list[str]) -> None:
    lines = []
    for r in jsonl(ev / "2026-11-29-memory.jsonl"):
        if r.get("median"):  # the runs that took medians of 3 (the older script printed single runs)
            lines.append(
                (f"{machine_label(r)} 2026-11-29", r["rows"])
            )
    new = jsonf(ev / "cpu" / "2026-12-01-memory.json")
    if new:
        lines.append((f"CPU 2026-12-01 (load {new['loadavg'][0]:.1f})", new["rows"]))
    if not lines:
        return skip("memory.png", "no memory benchmarks")
    fig, ax = plt.subplots(figsize=(10, 5.2))
    colors = [OURS, OTHER, "#9467bd", "#ff7f0e"]
    for (label, rows), color in zip(lines, colors):
        for mem, style in (("8GiB", "-"), ("2GiB", "--")):
            pts = sorted((r["layers"], r["median_peak_rss"] / GiB) for r in rows if r["max_memory"] == mem)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", color=color, lw=2,
                    label=f"{label}, --max-memory {mem}")
    ax.axhline(3, color=PEER, lw=1, ls=":")
    ax.annotate("goal with --max-memory 2GiB: below 3 GiB", (2.05, 3.05), color=PEER, fontsize=9.5)
    ax.set_xticks([2, 8], ["2 MoE layers + 1 MTP\n(0.48 GB of source)", "8 MoE layers + 1 MTP\n(1.34 GB of source)"])
    ax.set_xlim(1.5, 8.5)
    ax.set_ylim(0, 3.5)
    ax.set_ylabel("peak RSS of the conversion, GiB (median of 3 runs)")
    ax.set_title("Peak memory stays flat as the model grows (bf16, flash-geometry, 8 experts a layer)\n"
                 "scripts/bench/bench_memory.py: a 2-core CPU and an H200 host")
    ax.legend(loc="center right", fontsize=9)
    save(fig, out, "memory.png", made)


def chart_decode(ev: Path, out: Path, made: list[str]) -> None:
    old = jsonl(ev / "2026-11-29-decode.jsonl")
    # the H200's sweep run, and the proof run's decode (the kernel before the rewrite), by their logs
    gpu = {log: r for r in old if r["device"] == "cuda"
           for log in [r["log"].rsplit("/", 1)[-1].removeprefix("2026-11-29-").removesuffix(".log")]}
    cpu_old = [r for r in old if r["device"] == "cpu"]
    cpu_new = jsonf(ev / "cpu" / "2026-12-01-decode.json")
    if "tests-decode-sweep-memory" not in gpu and not cpu_old and not cpu_new:
        return skip("decode.png", "no decode benchmarks")
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13.5, 5.4), gridspec_kw={"width_ratios": [1.35, 1]})
    if "tests-decode-sweep-memory" in gpu:
        big = next(x for x in gpu["tests-decode-sweep-memory"]["rows"] if x["matrices"] == 256)
        bars = [("seed formula\n(vLLM, one\nexpert at a time)", big["seed_gbps"], PEER)]
        if "prove-megamoe" in gpu:
            before = next(x for x in gpu["prove-megamoe"]["rows"] if x["matrices"] == 256)
            bars.append(("earlier kernel\n(the proof run,\nsame day)", before["ours_out_gbps"], FLOOR2))
        bars += [
            ("ours, fresh\noutput", big["ours_gbps"], "#9ecae1"),
            ("ours, into a\nreused output", big["ours_out_gbps"], OURS),
            ("device copy\n(same bytes)", big["copy_gbps"], FLOOR),
        ]
        a1.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
        for i, (_, v, _) in enumerate(bars):
            a1.annotate(f"{v:,.0f}\n({100 * v / big['copy_gbps']:.0f}% of copy)", (i, v + 60), ha="center", fontsize=9)
        a1.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=9)
        a1.set_ylim(0, big["copy_gbps"] * 1.22)
        a1.set_ylabel("GB/s (bytes read + written)")
        a1.set_title("H200: 256 expert matrices 2048x4096\n(--sweep, 2026-11-29; bit-exact vs the seed)")
    cpu = [("2026-11-29\n(load ~0)", next(x for x in cpu_old[-1]["rows"] if x["matrices"] == 8))] if cpu_old else []
    if cpu_new:
        cpu.append(
            (f"2026-12-01\n(load {cpu_new['loadavg'][0]:.1f})", next(x for x in cpu_new["rows"] if x["matrices"] == 8))
        )
    w = 0.26
    for j, (label, key, color) in enumerate(
        (
            ("seed formula", "seed_gbps", PEER),
            ("ours, fresh output", "ours_gbps", "#9ecae1"),
            ("ours, into a reused output", "ours_out_gbps", OURS),
        )
    ):
        xs = [i + (j - 1) * w for i in range(len(cpu))]
        vals = [row[key] for _, row in cpu]
        a2.bar(xs, vals, w, color=color, label=label)
        for xx, v in zip(xs, vals):
            a2.annotate(f"{v:.1f}", (xx, v + 0.12), ha="center", fontsize=9)
    a2.set_xticks(range(len(cpu)), [c[0] for c in cpu])
    a2.set_ylim(0, max(row[k] for _, row in cpu for k in ("seed_gbps", "ours_gbps", "ours_out_gbps")) * 1.45)
    a2.set_ylabel("GB/s (bytes read + written)")
    a2.set_title("a 2-core CPU: 8 matrices 2048x4096\n(bit-exact vs the seed)")
    a2.legend(loc="upper right", fontsize=9)
    fig.suptitle("FP4 + E8M0 -> BF16 decode bandwidth (scripts/bench/bench_decode.py)", weight="bold", y=1.02)
    save(fig, out, "decode.png", made)


def chart_startup(ev: Path, out: Path, made: list[str]) -> None:
    s = jsonf(ev / "cpu" / "2026-12-01-startup.json")
    if not s:
        return skip("startup.png", "no benchmarks/results/cpu/2026-12-01-startup.json")
    names = list(s["rows"])
    ms = [s["rows"][n]["median_s"] * 1000 for n in names]
    fig, ax = plt.subplots(figsize=(9, 4.6))
    ax.bar(range(len(names)), ms, color=[FLOOR] + [OURS] * (len(names) - 1))
    floor = ms[0]
    ax.axhline(2 * floor, color=PEER, ls="--", lw=1.2, label="goal: within 2x of `import click`")
    ax.legend(loc="upper left")
    for i, (n, v) in enumerate(zip(names, ms)):
        ax.annotate(f"{v:.0f} ms\n({s['rows'][n]['ratio']:.1f}x)", (i, v + 8), ha="center", fontsize=9.5)
    ax.set_xticks(range(len(names)), ["python -c\n'import click'"] + [f"fimoe-convert\n{n}" for n in names[1:]])
    ax.set_ylim(0, max(ms) * 1.3)
    ax.set_ylabel(f"wall time, ms (median of {s['runs']} runs)")
    load = f", load average {s['loadavg'][0]:.1f}" if "loadavg" in s else ""
    ax.set_title("Start-up of the light commands vs `import click` (scripts/bench/bench_startup.py)\n"
                 f"a {s.get('cores', 2)}-core CPU, {s.get('date', '2026-12-01')}{load}")
    save(fig, out, "startup.png", made)


def chart_stream(ev: Path, out: Path, made: list[str]) -> None:
    """--stream against a plain download: bench_stream.py draws it (one chart, one place)."""
    results = jsonf(ev / "h200" / "2026-12-02-stream-50MBps-all.json")
    if results is None:
        return skip("stream.png", "no benchmarks/results/h200/2026-12-02-stream-50MBps-all.json")
    from bench_stream import chart

    chart(results, out / "stream.png")
    made.append("stream.png")


def chart_peers(ev: Path, out: Path, made: list[str]) -> None:
    p = jsonf(ev / "cpu" / "2026-12-01-peers.json")
    if not p:
        return skip("peers.png", "no benchmarks/results/cpu/2026-12-01-peers.json")
    rows = sorted(p["rows"], key=lambda r: (r["output"], r["median_s"]))
    names = [f"{r['command']}  [{r['output'].upper()}]" for r in rows]
    colors = [(FLOOR2 if "before" in r["command"] else OURS) if r["ours"] else PEER for r in rows]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True, gridspec_kw={"width_ratios": [1.4, 1]})
    a1.barh(range(len(rows)), [r["median_s"] for r in rows], color=colors)
    for i, r in enumerate(rows):
        a1.annotate(f"{r['median_s']:.1f} s", (r["median_s"] + 1.5, i), va="center", fontsize=9.5)
    a1.set_xlim(0, max(r["median_s"] for r in rows) * 1.18)
    a1.set_yticks(range(len(rows)), names)
    a1.invert_yaxis()
    a1.set_xlabel("seconds, median of 3 interleaved rounds")
    a1.set_title("conversion time")
    a2.barh(range(len(rows)), [r["peak_rss_gb"] for r in rows], color=colors)
    for i, r in enumerate(rows):
        a2.annotate(f"{r['peak_rss_gb']:.2f} GB", (r["peak_rss_gb"] + 0.04, i), va="center", fontsize=9.5)
    a2.set_xlim(0, max(r["peak_rss_gb"] for r in rows) * 1.25)
    a2.set_xlabel("peak RSS, GB (median)")
    a2.set_title("peak memory")
    fig.suptitle("fimoe-convert (blue; grey: its fp8_block before the speed-up) vs the converters people run today "
                 f"(red)\nsame fixture and output format: {p['fixture']}\n{p['machine']}; {p['date']} "
                 "(scripts/bench/bench_peers.py)", weight="bold", y=1.08, fontsize=11.5)
    save(fig, out, "peers.png", made)


def _fixture19(r: dict) -> str:
    experts = r.get("experts") or "the preset's"
    return f"{r.get('preset', '')}, {experts} experts x {r.get('layers')} layers"


def chart_v4_geometry(rows: list[dict], out: Path, made: list[str]) -> None:
    if not rows:
        return skip(
            "h200-v4-geometry.png", "no benchmarks/results/h200/2026-12-01-v4-geometry*.jsonl (not yet measured)"
        )
    fig, ax = plt.subplots(figsize=(12, 0.85 * len(rows) + 2.2))
    labels = [f"{r['target']}, {_fixture19(r)}\n{r['out_bytes'] / 1e9:.1f} GB out, "
              f"{r['out_bytes'] / r['wall_s'] / 1e9:.2f} GB/s written" for r in rows]
    h = 0.38
    ax.barh([i - h / 2 for i in range(len(rows))], [r["floor_direct_s"] for r in rows], h, color=FLOOR,
            label="floor: read SRC once + write the output with O_DIRECT")
    ax.barh([i + h / 2 for i in range(len(rows))], [r["wall_s"] for r in rows], h, color=OURS,
            label="fimoe-convert, whole CLI process")
    for i, r in enumerate(rows):
        ax.annotate(f"{r['wall_s'] / r['floor_direct_s']:.2f}x", (max(r["wall_s"], r["floor_direct_s"]) * 1.01, i),
                    va="center", fontsize=9.5, weight="bold")
    ax.set_xlim(right=max(max(r["wall_s"], r["floor_direct_s"]) for r in rows) * 1.12)
    ax.set_yticks(range(len(rows)), labels, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (scripts/bench/bench_convert.py --device cuda --floors direct)")
    ax.set_title("H200, real V4 expert geometry: conversion vs the O_DIRECT disk floor (2026-12-01 and 02)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.4, -0.8 / (0.85 * len(rows) + 1.0)), ncol=2, fontsize=9)
    save(fig, out, "h200-v4-geometry.png", made)


# Diagrams ---------------------------------------------------------------------------------------------------------

def _box(ax, x, y, w, h, text, color, fontsize=10.5, weight="normal"):
    ax.add_patch(
        FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08", fc=color, ec="#333333", lw=1.2)
    )
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, weight=weight, wrap=True)


def _arrow(ax, x0, y0, x1, y1, text="", color="#333333"):
    ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=16, lw=1.6, color=color))
    if text:
        ax.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, text, ha="center", va="bottom", fontsize=9, color="#333333")


def diagram_pipeline(out: Path, made: list[str]) -> None:
    fig, ax = plt.subplots(figsize=(14, 6.4))
    ax.set_xlim(0, 14.4)
    ax.set_ylim(0, 6.7)
    ax.axis("off")
    _box(ax, 0.1, 2.55, 1.9, 1.6, "SRC\nsafetensors shards\n(folder or Hub\ncache), read only", "#f2f2f2", fontsize=9.5)
    lanes_y = [4.75, 2.95, 0.95]
    for k, y in enumerate(lanes_y):
        tag = f"lane {k + 1}" if k < 2 else "lane N (--writers N)"
        ax.text(2.65, y + 1.0, tag, fontsize=9.5, weight="bold", color="#555555")
        _box(ax, 2.6, y, 2.1, 0.9, "reader thread:\nsource tensors\n-> host memory", "#deebf7", fontsize=9)
        _box(
            ax,
            5.3,
            y,
            2.7,
            0.9,
            "converter thread: one unit\nat a time (CPU, or GPU:\nTriton / FlashInfer)",
            "#c6dbef",
            fontsize=9,
        )
        _box(ax, 8.6, y, 2.5, 0.9, "writer: 16 MiB blocks,\nO_DIRECT where possible;\nsha256 on its own thread",
             "#9ecae1", fontsize=9)
        _arrow(ax, 2.0, 3.35, 2.6, y + 0.45)
        _arrow(ax, 4.7, y + 0.45, 5.3, y + 0.45)
        _arrow(ax, 8.0, y + 0.45, 8.6, y + 0.45)
        _arrow(ax, 11.1, y + 0.45, 11.7, max(y + 0.45, 2.6))
    ax.text(6.65, 2.25, "...", fontsize=18, ha="center", va="center")
    _box(ax, 11.7, 2.3, 2.6, 3.8, "OUT\n\nmodel-00001-of-000NN\n.safetensors: written\nunder a temporary name,\n"
         "fsync, rename\n...\n\nindex, config.json,\nREADME.md (model card)", "#f2f2f2", fontsize=9)
    _box(
        ax,
        11.7,
        0.35,
        2.6,
        1.4,
        "fimoe-manifest.json:\nper-shard status and\nsha256; complete: true\nonly at the end",
        "#fff2cc",
        fontsize=9,
    )
    _arrow(ax, 13.0, 2.3, 13.0, 1.75)
    ax.add_patch(FancyBboxPatch((2.6, 0.2), 8.5, 0.45, boxstyle="round,pad=0.02", fc="#fde0dd", ec="#c0392b", lw=1))
    ax.text(6.85, 0.42, "one byte budget, from --max-memory, covers everything between reading and writing",
            ha="center", va="center", fontsize=9.5, color="#7b241c")
    ax.set_title("How a conversion moves bytes: reader -> converter -> writer lanes -> shards + manifest\n"
                 "each lane takes the next output shard from one shared queue; the output is the same for any "
                 "number of lanes", fontsize=12)
    save(fig, out, "pipeline.png", made)


def diagram_ep(out: Path, made: list[str]) -> None:
    E, N = 256, 8
    fig, ax = plt.subplots(figsize=(13, 5.8))
    ax.set_xlim(-0.2, 13.6)
    ax.set_ylim(-0.9, 6.2)
    ax.axis("off")
    cmap = plt.get_cmap("tab10")
    ax.text(0, 5.8, f"one MoE layer of V4-Flash: {E} routed experts, --ep-size {N}", fontsize=11, weight="bold")
    width = 12.4 / E
    for e in range(E):
        r = e * N // E
        ax.add_patch(plt.Rectangle((e * width, 4.6), width, 0.8, fc=cmap(r), ec="white", lw=0.2))
    for r in range(N):
        lo, hi = r * E // N, (r + 1) * E // N
        ax.text((lo + hi) / 2 * width, 4.35, f"rank {r}\n[{lo}, {hi})", ha="center", va="top", fontsize=9)
    ax.text(0, 3.2, "rank r holds experts [r*E/N, (r+1)*E/N) of every MoE block (layers.* and mtp.*), "
            "in output shards of its own:", fontsize=10.5)
    step = 12.4 / N
    for r in range(N):
        x = r * step + 0.05
        for s in range(2):
            _box(
                ax, x, 2.0 - s * 0.72, step - 0.2, 0.58, f"rank {r} shard {s + 1}", cmap(r)[:3] + (0.35,), fontsize=8.5
            )
        ax.text(x + (step - 0.2) / 2, 0.75, "...", ha="center", fontsize=12)
        ax.annotate("", (x + (step - 0.2) / 2, -0.05), (x + (step - 0.2) / 2, 0.55),
                    arrowprops=dict(arrowstyle="-|>", color="#333333"))
        ax.text(x + (step - 0.2) / 2, -0.3, f"GPU {r}", ha="center", va="top", fontsize=9.5, weight="bold")
    ax.text(0, -0.85, "Each GPU's process reads only its own shards: load_megamoe_weights(out, block, rank=r) or "
            "mega_config(out, block, rank=r).\nThe other tensors (attention, embeddings, norms, router) are in shards "
            "that every rank reads.", fontsize=9.5, color="#333333", va="top")
    ax.set_title("Expert-parallel sharding (--ep-size N): rank r gets experts [r*E/N, (r+1)*E/N)", fontsize=12.5)
    save(fig, out, "ep-sharding.png", made)


def render_terminal(txt: Path, png: Path, title: str, made: list[str]) -> None:
    """A tmux capture (text) drawn as a terminal window: monospace on a dark background."""
    if not txt.exists():
        return skip(png.name, f"no {txt}")
    lines = txt.read_text().rstrip("\n").splitlines()
    cols = max(len(line) for line in lines)
    height = len(lines) * 0.21 + 0.75  # inches: a 0.42 in title bar, 0.21 in a line, margins
    fig = plt.figure(figsize=(cols * 0.083 + 0.4, height))
    fig.patch.set_facecolor("#1e1e1e")
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    top = 1 - 0.42 / height
    ax.add_patch(plt.Rectangle((0, top), 1, 1 - top, fc="#3a3a3a", ec="none"))
    for i, c in enumerate(("#ff5f56", "#ffbd2e", "#27c93f")):
        ax.plot([0.014 + i * 0.014], [(1 + top) / 2], "o", ms=7, color=c)
    ax.text(0.5, (1 + top) / 2, title, ha="center", va="center", color="#d0d0d0", fontsize=9, family="DejaVu Sans")
    for i, line in enumerate(lines):
        y = (height - 0.42 - 0.12 - (i + 0.5) * 0.21) / height
        color = "#8ae234" if line.startswith("$ ") else "#e6e6e6"
        ax.text(0.012, y, line, ha="left", va="center", color=color, fontsize=9.5, family="DejaVu Sans Mono")
    fig.savefig(png, facecolor=fig.get_facecolor(), bbox_inches=None)
    plt.close(fig)
    made.append(png.name)
    print(f"wrote {png}")


# The V4-geometry table in docs/PERFORMANCE.md -------------------------------------------------------------------


def v4_geometry_table(rows: list[dict]) -> str:
    if not rows:
        return ("**Not yet measured.** When `benchmarks/results/h200/2026-12-01-v4-geometry*.jsonl` exists, "
                "`python3 scripts/bench/make_charts.py` fills this table and draws `docs/img/h200-v4-geometry.png`.")
    head = (
        "| target | fixture | out GB | CLI s | O_DIRECT floor s | ratio (CLI / floor) | convert() s | peak RSS GiB "
        "| peak GPU memory GiB | whole model, estimate | file |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
    )
    lines = [head]
    for r in rows:
        whole = r.get("whole_model_s")
        lines.append(
            f"| `{r['target']}` | {_fixture19(r)} | "
            f"{r['out_bytes'] / 1e9:.1f} | {r['wall_s']:.1f} | {r['floor_direct_s']:.1f} | "
            f"{r['wall_s'] / r['floor_direct_s']:.2f}x | {r['convert_s']:.1f} | {r['peak_rss'] / GiB:.2f} | "
            f"{(r.get('device_peak_bytes') or 0) / GiB:.2f} | "
            + (f"{r.get('variant', '')}: about {whole / 60:.0f} min" if whole else "-")
            + f" | [{Path(r['_file']).name}](../{r['_file']}) |")
    return "\n".join(lines) + ("\n\nRatio: the whole CLI process against reading SRC once and writing the output's "
                               "bytes with O_DIRECT, measured in the same run. \"Whole model\": convert() seconds x "
                               "(the published model's bytes / the fixture's), an estimate.")


def update_docs(doc: Path, rows: list[dict]) -> None:
    text = doc.read_text()
    if MARK_BEGIN not in text or MARK_END not in text:
        print(f"{doc}: no {MARK_BEGIN} ... {MARK_END} markers; table not written")
        return
    head, rest = text.split(MARK_BEGIN, 1)
    _, tail = rest.split(MARK_END, 1)
    new = f"{head}{MARK_BEGIN}\n{v4_geometry_table(rows)}\n{MARK_END}{tail}"
    if new != text:
        doc.write_text(new)
        print(f"updated the h200-v4-geometry table in {doc}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--out", default=str(REPO / "docs" / "img"))
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite the table in docs/PERFORMANCE.md")
    args = ap.parse_args()
    ev, out = Path(args.results), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    made: list[str] = []
    chart_load(ev, out, made)
    chart_convert(ev, out, made)
    chart_memory(ev, out, made)
    chart_decode(ev, out, made)
    chart_startup(ev, out, made)
    chart_peers(ev, out, made)
    chart_stream(ev, out, made)
    rows_v4 = v4_geometry(ev)
    chart_v4_geometry(rows_v4, out, made)
    diagram_pipeline(out, made)
    diagram_ep(out, made)
    capture = out / "terminal-convert.txt"
    pct = re.search(r"converting: +(\d+)%", capture.read_text()) if capture.exists() else None
    render_terminal(capture, out / "terminal-convert.png",
                    "tmux capture-pane -p: fimoe-convert --dry-run, then the conversion at "
                    f"{pct.group(1) if pct else '?'}% (2026-12-03, a 2-core CPU)", made)
    if not args.no_docs:
        update_docs(REPO / "docs" / "PERFORMANCE.md", rows_v4)
    print(f"{len(made)} images: {', '.join(made)}")


if __name__ == "__main__":
    main()
