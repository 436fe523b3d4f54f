"""`tpuwatch report --html`: one self-contained HTML file with the report and a timeline.

The timeline is drawn with plotly, an optional extra (`pip install 'tpuwatch[report]'`) so the
core install stays light; its JavaScript is inlined, so the file opens with no network at all.
This module only draws what tpuwatch.report computed; it decides nothing.
"""

from __future__ import annotations

import html
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tpuwatch.durations import human
from tpuwatch.errors import UsageError
from tpuwatch.report import CATEGORIES, Report

PIP_EXTRA = "pip install 'tpuwatch[report]'"

COLORS: dict[str, str] = {
    "productive": "#2ca02c",
    "startup": "#17becf",
    "lost": "#d62728",
    "heal": "#ff7f0e",
    "recreate": "#9467bd",
    "hung": "#8c564b",
    "charged": "#e377c2",
    "person": "#7f7f7f",
}
# mark kind -> (legend name, marker symbol, colour)
MARKS: dict[str, tuple[str, str, str]] = {
    "checkpoint": ("checkpoint", "line-ns-open", "#2ca02c"),
    "disruption": ("disruption", "x", "#d62728"),
    "failure": ("charged failure", "x", "#e377c2"),
    "hung": ("hung, stopped", "x", "#8c564b"),
    "recreate": ("recreate started", "diamond", "#9467bd"),
    "person": ("stopped by / waiting for a person", "square", "#7f7f7f"),
    "end": ("end of the job", "star", "#000000"),
}
LANE_TIME, LANE_ATTEMPTS, LANE_MARKS = "where time went", "attempts", "events"


class ExtraMissing(ImportError):
    """plotly is not installed."""


def _plotly() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError as exc:
        raise ExtraMissing(f"the HTML report needs plotly: {PIP_EXTRA}") from exc
    return go


def available() -> bool:
    try:
        _plotly()
    except ExtraMissing:
        return False
    return True


def render(report: Report) -> str:
    """The whole HTML page; ExtraMissing when plotly is not installed."""
    go = _plotly()
    fig = go.Figure()
    for cat, label in CATEGORIES.items():
        spans = [s for s in report.spans if s.category == cat]
        if not spans:
            continue
        fig.add_trace(go.Bar(
            name=label, orientation="h", y=[LANE_TIME] * len(spans),
            base=[_t(s.start) for s in spans], x=[s.seconds * 1000 for s in spans],
            marker={"color": COLORS[cat], "line": {"width": 0}}, legendgroup="time",
            hovertext=[f"{label}: {human(s.seconds)}<br>{html.escape(s.why)}<br>{_t(s.start)} to {_t(s.end)}"
                       for s in spans], hoverinfo="text"))
    runs = _attempt_bars(report)
    if runs:
        fig.add_trace(go.Bar(
            name="attempt", orientation="h", y=[LANE_ATTEMPTS] * len(runs), base=[r[0] for r in runs],
            x=[r[1] for r in runs], text=[r[2] for r in runs], textposition="inside", insidetextanchor="middle",
            textfont={"color": "#ffffff"},
            marker={"color": [r[3] for r in runs], "line": {"color": "#ffffff", "width": 1}},
            hovertext=[r[4] for r in runs], hoverinfo="text", showlegend=False))
    for kind, (name, symbol, color) in MARKS.items():
        marks = [m for m in report.marks if m.kind == kind]
        if marks:
            fig.add_trace(go.Scatter(
                name=name, mode="markers", x=[_t(m.time) for m in marks], y=[LANE_MARKS] * len(marks),
                marker={"symbol": symbol, "size": 12 if kind != "checkpoint" else 14, "color": color,
                        "line": {"width": 2, "color": color}},
                hovertext=[f"{html.escape(m.text)}<br>{_t(m.time)}" for m in marks], hoverinfo="text"))
    fig.update_layout(
        barmode="overlay", height=380, margin={"l": 120, "r": 30, "t": 30, "b": 30},
        legend={"orientation": "h", "y": -0.25}, plot_bgcolor="#ffffff",
        xaxis={"type": "date", "showgrid": True, "gridcolor": "#eeeeee"},
        yaxis={"categoryorder": "array", "categoryarray": [LANE_MARKS, LANE_TIME, LANE_ATTEMPTS],
               "fixedrange": True},
    )
    chart = fig.to_html(full_html=False, include_plotlyjs=True, include_mathjax=False,
                        config={"displaylogo": False, "responsive": True})
    return _page(report, chart)


def _t(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


# Attempts in blues (the categories own the other colours): dark when it ended well or runs.
OUTCOME_COLORS = {"success": "#1f4e79", "running": "#1f4e79"}
OTHER_OUTCOME = "#6baed6"


def _attempt_bars(report: Report) -> list[tuple[str, float, str, str, str]]:
    """(start, milliseconds, label, colour, hover) per attempt."""
    return [(_t(r.start), (r.end - r.start).total_seconds() * 1000, f"#{r.number} {r.outcome.replace('_', ' ')}",
             OUTCOME_COLORS.get(r.outcome, OTHER_OUTCOME),
             f"attempt {r.number}: {r.outcome}, {human((r.end - r.start).total_seconds())}<br>{html.escape(r.reason)}")
            for r in report.runs]


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px 0; } .sub { color: #666; margin-bottom: 16px; }
.goodput { font-size: 28px; font-weight: 600; margin: 8px 0 16px 0; }
table { border-collapse: collapse; margin: 0 24px 16px 0; font-size: 14px; }
td, th { padding: 3px 10px; text-align: left; border-bottom: 1px solid #eee; } td.n { text-align: right; }
.sw { display: inline-block; width: 11px; height: 11px; margin-right: 6px; vertical-align: -1px; }
.row { display: flex; flex-wrap: wrap; align-items: flex-start; } .note { color: #666; font-size: 13px; }
"""


def _page(report: Report, chart: str) -> str:
    e = html.escape
    wall, secs = report.wall, report.seconds()
    when = (f"{_t(report.start)[:19]} to {_t(report.end)[:19]} UTC" if report.start and report.end
            else "nothing journaled yet")
    gp = "-" if report.goodput is None else f"{report.goodput:.1%}"
    cats = "".join(
        f"<tr><td><span class='sw' style='background:{COLORS[k]}'></span>{e(CATEGORIES[k])}</td>"
        f"<td class='n'>{human(v)}</td><td class='n'>{(v / wall if wall else 0):.1%}</td></tr>"
        for k, v in secs.items())
    causes = "".join(
        f"<tr><td>{e(c.what)}</td><td>{_t(c.at)[:19]}</td><td class='n'>{human(c.seconds)}</td>"
        f"<td>{e(', '.join(f'{CATEGORIES[k]} {human(v)}' for k, v in c.parts.items() if v > 0))}</td></tr>"
        for c in report.causes[:10]) or "<tr><td colspan='4'>none</td></tr>"
    notes = "".join(f"<p class='note'>{e(n)}</p>" for n in report.notes)
    pace = f"; pace {report.step_seconds:.3g} s per step" if report.step_seconds else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>tpuwatch report: {e(report.job)}</title>
<style>{STYLE}</style></head><body>
<h1>tpuwatch report: {e(report.job)}</h1>
<div class="sub">{e(when)}; {e(report.state)}; {report.attempts} attempts; wall time {human(wall)}{e(pace)}</div>
<div class="goodput">goodput {gp} <span class="note">productive training / wall time</span></div>
{chart}
<div class="row">
<table><tr><th>where the time went</th><th>time</th><th>share</th></tr>{cats}</table>
<table><tr><th>top causes</th><th>at (UTC)</th><th>cost</th><th>of which</th></tr>{causes}</table>
</div>
{notes}
</body></html>
"""


def write(report: Report, path: Path) -> None:
    """Render and write the HTML atomically (a reader never sees half a file); exit 2 naming --html."""
    page = render(report)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(page)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise UsageError(f"--html: cannot write {str(path)[:200]!r}: {exc.strerror or exc}; "
                         "give a path you can write") from None
