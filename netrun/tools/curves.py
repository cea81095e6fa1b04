"""Training curves from run folders' metrics.jsonl: series, PNG (Pillow), SVG, terminal charts."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from netrun.errors import NetrunError

DEFAULT_METRICS = ("loss", "lr", "accuracy")
# Line colours of the runs, in order (a colour-blind-safe palette, Okabe & Ito).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
           "#000000")
INSTALL_PLOTEXT = "install it with: pip install 'netrun[plot]'"


@dataclass
class Run:
    """One run folder's curves: metric -> [(iteration, value)], in iteration order."""

    name: str
    series: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def read_run(folder: str | os.PathLike) -> Run:
    """The curves of one run folder (NaN, null and unparsable lines skipped)."""
    folder = Path(folder)
    path = folder / "metrics.jsonl" if folder.is_dir() or not folder.exists() else folder
    if not path.is_file():
        raise NetrunError(f"{folder}: no metrics.jsonl here (is it a run folder? `netrun "
                          f"train` writes one into its output folder)")
    points: dict[str, dict[int, float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue                 # a line cut short by a crash: the rest still counts
            if not isinstance(record, dict) or "event" in record:
                continue
            it = record.get("iter")
            if not isinstance(it, int) or isinstance(it, bool):
                continue
            for key, value in record.items():
                if key in ("iter", "seconds") or isinstance(value, bool):
                    continue
                if isinstance(value, (int, float)) and math.isfinite(value):
                    # A resumed run logs its iterations again: the later value wins.
                    points.setdefault(key, {})[it] = float(value)
    name = (folder.name if folder.is_dir() else folder.parent.name) or str(folder)
    return Run(name, {k: sorted(v.items()) for k, v in points.items()})


def read_runs(folders) -> list[Run]:
    """Several runs; names made unique (a/run and b/run become a/run and b/run)."""
    runs = [read_run(f) for f in folders]
    names = [r.name for r in runs]
    for run, folder in zip(runs, folders):
        if names.count(run.name) > 1:
            run.name = str(folder)
    return runs


def metric_key(run: Run, metric: str) -> str | None:
    """The series a metric names: 'accuracy' is the test accuracy, 'loss' the training loss."""
    for key in (metric, f"test_{metric}"):
        if run.series.get(key):
            return key
    return None


def select(runs: list[Run], metrics) -> list[tuple[str, list[tuple[str, list]]]]:
    """[(metric, [(run name, points)])] for each metric some run has; error if none has any."""
    panels = []
    for metric in metrics:
        lines = [(r.name, r.series[k]) for r in runs if (k := metric_key(r, metric))]
        if lines:
            panels.append((metric, lines))
    if not panels:
        have = sorted({k for r in runs for k in r.series})
        raise NetrunError(f"none of the metrics {', '.join(metrics)} was logged in "
                          f"{', '.join(r.name for r in runs)} "
                          f"(logged: {', '.join(have) or 'nothing'})")
    return panels


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 × 10^k steps) covering [low, high]."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    if high <= low:
        high = low + (abs(low) or 1.0) * 0.1
    raw = (high - low) / max(count, 1)
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 5, 10) if raw <= step * m)
    first = math.floor(low / step) * step
    ticks, t = [], first
    while t <= high + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < high:
        ticks.append(round(t, 12))
    return ticks


def tick_text(value: float) -> str:
    if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
        return f"{value:.0e}"
    return f"{value:.6g}"


# A chart as primitives (lines, polylines, text), drawn by the PNG and SVG writers alike.
@dataclass
class Chart:
    width: int
    height: int
    items: list[tuple] = field(default_factory=list)

    def line(self, x0, y0, x1, y1, colour="#000000", width=1):
        self.items.append(("line", [(x0, y0), (x1, y1)], colour, width))

    def polyline(self, points, colour, width=2):
        self.items.append(("polyline", points, colour, width))

    def text(self, x, y, text, anchor="start", colour="#000000", size=12):
        self.items.append(("text", (x, y), text, anchor, colour, size))


def layout(runs: list[Run], metrics=DEFAULT_METRICS, width: int = 800,
           panel_height: int = 220) -> Chart:
    """One panel per metric, stacked, iterations on x, each run a coloured line; a legend on top."""
    panels = select(runs, metrics)
    names = [r.name for r in runs]
    colour = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    left, right, top, gap = 80, 20, 40, 50
    chart = Chart(width, top + len(panels) * (panel_height + gap) + 10)
    x = left                                  # legend: a short line and the run's name
    for n in names:
        chart.line(x, 18, x + 24, 18, colour[n], 3)
        chart.text(x + 30, 22, n)
        x += 30 + 8 * len(n) + 24
    all_x = [p[0] for _, lines in panels for _, pts in lines for p in pts]
    xt = nice_ticks(min(all_x), max(all_x))
    for i, (metric, lines) in enumerate(panels):
        y0 = top + i * (panel_height + gap) + 10
        y1 = y0 + panel_height - 30
        ys = [p[1] for _, pts in lines for p in pts]
        yt = nice_ticks(min(ys), max(ys), 4)

        def sx(v, xt=xt):
            return left + (v - xt[0]) / ((xt[-1] - xt[0]) or 1) * (width - left - right)

        def sy(v, yt=yt, y0=y0, y1=y1):
            return y1 - (v - yt[0]) / ((yt[-1] - yt[0]) or 1) * (y1 - y0)

        for t in yt:                          # grid, y ticks and their values
            chart.line(left, sy(t), width - right, sy(t), "#e0e0e0")
            chart.text(left - 6, sy(t) + 4, tick_text(t), "end", size=11)
        for t in xt:
            chart.line(sx(t), y1, sx(t), y1 + 4)
            chart.text(sx(t), y1 + 17, tick_text(t), "middle", size=11)
        chart.line(left, y0, left, y1)        # axes
        chart.line(left, y1, width - right, y1)
        chart.text(left, y0 - 6, metric, "start", size=13)
        chart.text(width - right, y1 + 32, "iteration", "end", size=11)
        for name, pts in lines:
            xy = [(round(sx(a), 2), round(sy(b), 2)) for a, b in pts]
            chart.polyline(xy if len(xy) > 1 else xy * 2, colour[name])
    return chart


def _escape(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def svg_text(chart: Chart) -> str:
    """The chart as SVG text, written by hand (no library needed to draw files)."""
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{chart.width}" '
           f'height="{chart.height}" viewBox="0 0 {chart.width} {chart.height}" '
           f'font-family="Helvetica, Arial, sans-serif">',
           f'<rect width="{chart.width}" height="{chart.height}" fill="#ffffff"/>']
    for item in chart.items:
        if item[0] in ("line", "polyline"):
            _, pts, colour, width = item
            points = " ".join(f"{x:g},{y:g}" for x, y in pts)
            out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" '
                       f'stroke-width="{width}"/>')
        else:
            _, (x, y), text, anchor, colour, size = item
            out.append(f'<text x="{x:g}" y="{y:g}" text-anchor="{anchor}" fill="{colour}" '
                       f'font-size="{size}">{_escape(text)}</text>')
    return "\n".join(out + ["</svg>"]) + "\n"


def write_png(chart: Chart, path: str | os.PathLike) -> None:
    """The chart as a PNG through Pillow (the `images` extra)."""
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError:
        raise NetrunError("drawing a PNG needs Pillow; install it with: pip install "
                          "'netrun[images]' (or write an .svg, which needs nothing)") from None
    image = Image.new("RGB", (chart.width, chart.height), "#ffffff")
    draw = ImageDraw.Draw(image)
    fonts: dict[int, object] = {}
    for item in chart.items:
        if item[0] in ("line", "polyline"):
            _, pts, colour, width = item
            draw.line(pts, fill=colour, width=width, joint="curve")
        else:
            _, (x, y), text, anchor, colour, size = item
            if size not in fonts:
                try:
                    fonts[size] = ImageFont.load_default(size=size)
                except TypeError:        # Pillow < 10.1: one bitmap size only
                    fonts[size] = ImageFont.load_default()
            # SVG anchors at the baseline: "ls", "ms", "rs" are Pillow's same points.
            draw.text((x, y), text, fill=colour, font=fonts[size],
                      anchor={"start": "ls", "middle": "ms", "end": "rs"}[anchor])
    image.save(path, format="PNG")


def terminal_chart(runs: list[Run], metrics=DEFAULT_METRICS, width: int | None = None,
                   height: int | None = None) -> str:
    """The curves as text for a terminal, drawn by plotext (the `plot` extra)."""
    try:
        import plotext as plt
    except ImportError:
        raise NetrunError(f"the terminal chart needs plotext; {INSTALL_PLOTEXT} (or write a "
                          f"file with -o curves.png|svg, which needs no plotext)") from None
    panels = select(runs, metrics)
    # plotext 6's explicit-figure API: plt.figure holds the grid of subplots.
    fig = plt.figure
    fig.clear.all()
    if len(panels) > 1:              # a 1×1 grid holds no subplot: the figure draws itself
        fig.subplots(len(panels), 1)
    if width and height:
        fig.plot_size(width, height)
    for i, (metric, lines) in enumerate(panels):
        sub = fig.subplot(i + 1, 1) if len(panels) > 1 else fig
        for name, pts in lines:
            sub.draw(sub.signal([p[0] for p in pts], [p[1] for p in pts]).label(name).lines())
        sub.title(metric)
        sub.label("iteration", axis=0)
        sub.label(metric, axis=1)
    text = plt.uncolorize(str(fig.build()))
    fig.clear.all()
    return text


def last_values(runs: list[Run], metrics=DEFAULT_METRICS) -> tuple[list[str], list[list]]:
    """Columns and rows of a table: each run's last iteration and last value of each metric."""
    columns = ["run", "iter", *metrics]
    rows = []
    for r in runs:
        keys = [metric_key(r, m) for m in metrics]
        last = max((r.series[k][-1][0] for k in keys if k), default=None)
        rows.append([r.name, "" if last is None else last,
                     *("" if k is None else f"{r.series[k][-1][1]:.6g}" for k in keys)])
    return columns, rows
