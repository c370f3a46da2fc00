"""A look at the dashboard without Grafana: its panels laid out on Grafana's 24-column grid, each
filled from a real Prometheus with the panel's own queries ($node and $namespace at "All"), as one
HTML page that headless Chromium (Debian's chromium) turns into a PNG.

A stand-in for Grafana's renderer, named as such: stat panels show the last value on their threshold
colour, time series draw their lines with the legend Grafana would print (legendFormat), tables merge
their queries by labels as the dashboard's merge and organize transformations do, and a panel with
runbook links shows them in its header. Units are Grafana's `bytes` (IEC) and `short`.

Usage: python tests/cluster/dashboard_preview.py PROMETHEUS_URL OUT.png [DASHBOARD.json]
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

WINDOW_S = 600
"""The time range asked for; the plot starts at its first sample."""
ROW_PX = 30
"""Grafana's grid row height; panels are h rows high."""
WIDTH_PX = 1600
GAP_PX = 8
COLOURS = {"green": "#73BF69", "red": "#F2495C", "yellow": "#FADE2A", "orange": "#FF9830", "blue": "#5794F2"}
PALETTE = ["#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9", "#705DA0", "#37872D", "#FADE2A"]
VARIABLES = {"$node": ".*", "$namespace": ".*"}


def query(base: str, path: str, **params: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=30) as response:
        body = json.load(response)
    if body["status"] != "success":
        raise RuntimeError(f"{params}: {body}")
    return list(body["data"]["result"])


def expand(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__") + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def formatted(value: float, unit: str, decimals: int | None = None) -> str:
    if math.isnan(value):
        return "NaN"
    if unit == "bytes":
        size, prefix = abs(value), ""
        for prefix in ("", "Ki", "Mi", "Gi", "Ti", "Pi"):
            if size < 1024 or prefix == "Pi":
                break
            size /= 1024
        places = 1 if decimals is None else decimals
        return f"{math.copysign(size, value):.{places if prefix else 0}f} {prefix}B"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if abs(value) < 1 and value else f"{value:.1f} s"
    if decimals is not None:
        return f"{value:.{decimals}f}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"


def threshold_colour(panel: dict[str, Any], value: float) -> str:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    colour = "#3a3f47"
    for step in steps:
        if step["value"] is None or value >= step["value"]:
            colour = COLOURS.get(step["color"], step["color"])
    return colour


def stat_html(base: str, panel: dict[str, Any]) -> str:
    defaults = panel["fieldConfig"]["defaults"]
    (target,) = panel["targets"]
    result = query(base, "query", query=expand(target["expr"]))
    if not result:
        return f'<div class="stat" style="background:#3a3f47">{html.escape(defaults.get("noValue", "No data"))}</div>'
    value = float(result[0]["value"][1])
    text = formatted(value, defaults.get("unit", "short"), defaults.get("decimals"))
    return f'<div class="stat" style="background:{threshold_colour(panel, value)}">{html.escape(text)}</div>'


def timeseries_html(base: str, panel: dict[str, Any], width: int, height: int, now: float) -> str:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
    start, step = now - WINDOW_S, 1
    lines = []
    for target in panel["targets"]:
        result = query(
            base, "query_range", query=expand(target["expr"]), start=str(start), end=str(now), step=str(step)
        )
        for series in result:
            points = [(float(t), float(v)) for t, v in series["values"]]
            lines.append((legend(target.get("legendFormat", ""), series["metric"]), points))
    if not lines:
        return '<div class="nodata">No data</div>'
    values = [v for _, pts in lines for _, v in pts if not math.isnan(v)]
    low, high = min(0.0, *values), max(values)
    high = low + 1 if high == low else high + 0.15 * (high - low)  # a line at the top stays visible
    start = min(t for _, pts in lines for t, _ in pts)  # from the first sample, as Grafana's "since" would
    plot_w, plot_h = width - 70, max(40, height - 30 - 18 * min(len(lines), 4))
    paths = []
    for i, (_, points) in enumerate(lines):
        xy = " ".join(
            f"{60 + (t - start) / (now - start) * plot_w:.1f},{5 + (1 - (v - low) / (high - low)) * plot_h:.1f}"
            for t, v in points
        )
        colour = PALETTE[i % len(PALETTE)]
        paths.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{xy}"/>')
        x, y = xy.split()[-1].split(",")
        paths.append(f'<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}"/>')  # the last sample, seen even alone
    axis = "".join(
        f'<text x="55" y="{5 + (1 - f) * plot_h + 4:.0f}" text-anchor="end">{html.escape(formatted(low + f * (high - low), unit))}</text>'
        f'<line x1="60" x2="{60 + plot_w}" y1="{5 + (1 - f) * plot_h:.0f}" y2="{5 + (1 - f) * plot_h:.0f}" class="grid"/>'
        for f in (0, 0.5, 1)
    )
    svg = f'<svg width="{width}" height="{plot_h + 10}">{axis}{"".join(paths)}</svg>'
    shown = lines[:4]
    legend_rows = "".join(
        f'<div class="legend"><span style="background:{PALETTE[i % len(PALETTE)]}"></span>{html.escape(name)}'
        f" <b>{html.escape(formatted(points[-1][1], unit))}</b></div>"
        for i, (name, points) in enumerate(shown)
    )
    more = f'<div class="legend">… {len(lines) - len(shown)} more</div>' if len(lines) > len(shown) else ""
    return svg + legend_rows + more


def table_html(base: str, panel: dict[str, Any]) -> str:
    rows: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for target in panel["targets"]:
        for series in query(base, "query", query=expand(target["expr"])):
            key = tuple(sorted((k, v) for k, v in series["metric"].items() if k != "__name__"))
            column = "Value" if len(panel["targets"]) == 1 else f"Value #{target['refId']}"
            rows.setdefault(key, {})[column] = series["value"][1]
    if not rows:
        return '<div class="nodata">No data</div>'
    rename: dict[str, str] = {}
    for transformation in panel.get("transformations", []):
        if transformation["id"] == "organize":
            rename = transformation["options"].get("renameByName", {})
    labels = sorted({k for key in rows for k, _ in key})
    values = sorted({c for row in rows.values() for c in row})
    head = "".join(f"<th>{html.escape(rename.get(c, c))}</th>" for c in [*labels, *values])
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(dict(key).get(label, ''))}</td>" for label in labels)
        + "".join(f"<td>{html.escape(row.get(c, ''))}</td>" for c in values)
        + "</tr>"
        for key, row in list(rows.items())[:12]
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def page(base: str, board: dict[str, Any]) -> str:
    col = WIDTH_PX / 24
    now = time.time()
    cells = []
    for panel in board["panels"]:
        g = panel["gridPos"]
        left, top = g["x"] * col, g["y"] * ROW_PX
        width, height = g["w"] * col - GAP_PX, g["h"] * ROW_PX - GAP_PX
        style = f"left:{left:.0f}px;top:{top:.0f}px;width:{width:.0f}px;height:{height:.0f}px"
        if panel["type"] == "row":
            cells.append(f'<div class="row" style="{style}">▾ {html.escape(panel["title"])}</div>')
            continue
        links = "".join(
            f'<a title="{html.escape(link["url"])}">↗ {html.escape(link["title"].removeprefix("Runbook: Gpuzombie"))}</a>'
            for link in panel.get("links", [])
        )
        try:
            if panel["type"] == "stat":
                content = stat_html(base, panel)
            elif panel["type"] == "table":
                content = table_html(base, panel)
            else:
                content = timeseries_html(base, panel, int(width) - 12, int(height) - 30, now)
        except (OSError, RuntimeError, ValueError) as exc:
            content = f'<div class="nodata">query failed: {html.escape(str(exc))}</div>'
        cells.append(
            f'<div class="panel" style="{style}"><div class="title">{html.escape(panel["title"])}'
            f'<span class="links">{links}</span></div><div class="body">{content}</div></div>'
        )
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"]) * ROW_PX
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin: 0; background: #111217; color: #ccccdc; font: 12px 'DejaVu Sans', sans-serif; }}
header {{ padding: 8px 12px; font-size: 16px; }} header small {{ color: #8e8e9e; }}
.grid {{ position: relative; height: {bottom}px; margin: 0 4px; }}
.panel {{ position: absolute; background: #181b1f; border: 1px solid #2c3235; border-radius: 2px; overflow: hidden; }}
.row {{ position: absolute; font-size: 14px; font-weight: bold; padding-top: 6px; }}
.title {{ padding: 4px 6px; font-weight: 500; white-space: nowrap; overflow: hidden; }}
.links a {{ color: #6e9fff; margin-left: 6px; font-weight: normal; font-size: 10px; }}
.body {{ padding: 0 6px; }}
.stat {{ display: flex; align-items: center; justify-content: center; height: 72px; font-size: 30px;
  font-weight: bold; color: #fff; border-radius: 2px; }}
.nodata {{ color: #8e8e9e; padding: 20px; text-align: center; }}
svg text {{ fill: #8e8e9e; font-size: 10px; }} svg line.grid {{ stroke: #2c3235; }}
.legend {{ white-space: nowrap; overflow: hidden; font-size: 11px; }}
.legend span {{ display: inline-block; width: 12px; height: 3px; margin: 0 4px 3px 0; }}
table {{ border-collapse: collapse; font-size: 10px; }} th, td {{ border-bottom: 1px solid #2c3235; padding: 2px 4px; text-align: left; }}
</style></head><body><header>{html.escape(board["title"])} <small>(preview: tests/cluster/dashboard_preview.py,
not Grafana; Node: All, Namespace: All; runbook links ↗)</small></header><div class="grid">{"".join(cells)}</div></body></html>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(base: str, out: Path, board: dict[str, Any]) -> Path:
    """The dashboard filled from the Prometheus at ``base``, as a PNG at ``out``."""
    browser = chromium()
    if browser is None:
        raise RuntimeError("chromium is not installed (Debian package chromium)")
    text = page(base, board)
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"]) * ROW_PX + 60
    out.with_suffix(".html").write_text(text)  # beside the PNG: the page it shows
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "dashboard.html"
        source.write_text(text)
        subprocess.run(
            [
                browser,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={tmp}/profile",
                f"--window-size={WIDTH_PX + 8},{bottom}",
                f"--screenshot={out}",
                source.as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=True,
        )
    return out


if __name__ == "__main__":
    board_path = (
        Path(sys.argv[3])
        if len(sys.argv) > 3
        else Path(__file__).parents[2] / "charts/gpuzombie/dashboards/gpuzombie.json"
    )
    print(screenshot(sys.argv[1].rstrip("/"), Path(sys.argv[2]).resolve(), json.loads(board_path.read_text())))
