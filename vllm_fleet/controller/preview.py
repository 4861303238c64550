"""`vllm-fleet preview`: the generated dashboard's panels, each query run against a real Prometheus and
drawn as SVG in one HTML page.

Why: Grafana is not in Debian's archive, and a dashboard nobody has seen draw is a guess. The page runs
the very expressions of the dashboard JSON (Grafana's variables set to "All", `$__rate_interval` to 1 m),
so an empty panel here is an empty panel in Grafana; a headless browser turns the page into a PNG.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from html import escape
from pathlib import Path

import httpx

from vllm_fleet.core import observe, svgplot

# Grafana's unit ids as a person reads them on an axis
UNIT_LABELS = {"short": "", "percentunit": "ratio", "s": "seconds", "reqps": "req/s"}


class PreviewError(RuntimeError):
    """Prometheus refused a query or could not be reached."""


@dataclass(frozen=True)
class Page:
    html: str
    panels: int
    empty: int


def _legend(template: str, labels: dict[str, str]) -> str:
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)
    return text.strip() or ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")


def query_range(client: httpx.Client, expr: str, start: float, end: float, step: float) -> list[dict]:
    try:
        r = client.get("/api/v1/query_range",
                       params={"query": expr, "start": start, "end": end, "step": step})
    except httpx.HTTPError as e:
        raise PreviewError(f"Prometheus at {client.base_url}: {e}") from None
    body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
    if r.status_code != 200 or body.get("status") != "success":
        raise PreviewError(f"Prometheus refused {expr!r}: {body.get('error') or r.text[:300]}")
    result = body.get("data", {}).get("result")
    if not isinstance(result, list):
        raise PreviewError(f"Prometheus answered {expr!r} without a result list: {r.text[:300]}")
    return result


def page(dashboard: Path, prometheus: str, minutes: int = 15, now: float | None = None) -> Page:
    model = json.loads(dashboard.read_text())
    if not isinstance(model, dict) or not all(isinstance(p, dict) and "title" in p and "targets" in p
                                              for p in model.get("panels", [])):
        raise PreviewError(f"{dashboard}: not a dashboard of titled panels with targets")
    end = now if now is not None else time.time()
    start, step = end - minutes * 60, max(1.0, minutes * 60 / 180)
    charts, empty = [], 0
    with httpx.Client(base_url=prometheus, timeout=30) as client:
        for panel in model.get("panels", []):
            lines = []
            for target in panel.get("targets", []):
                for s in query_range(client, observe.concrete(target["expr"]), start, end, step):
                    points = [(float(t), float(v)) for t, v in s["values"]
                              if v not in ("NaN", "+Inf", "-Inf")]
                    if points:
                        lines.append((_legend(target.get("legendFormat", ""), s["metric"]), points))
            empty += not lines
            unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            chart = svgplot.line_chart(panel["title"], lines, UNIT_LABELS.get(unit, unit))
            charts.append(f'<figure class="panel" data-title="{escape(panel["title"])}" '
                          f'data-series="{len(lines)}">{chart}</figure>')
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(end))
    html = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{escape(model.get("title", "vLLM fleet"))}</title>
<style>
body {{ font-family: sans-serif; margin: 16px; background: #fff; color: #222; }}
.grid {{ display: grid; grid-template-columns: repeat(2, 470px); gap: 10px; }}
figure {{ margin: 0; border: 1px solid #ddd; }}
p.note {{ color: #555; font-size: 13px; }}
</style></head><body>
<h1>{escape(model.get("title", "vLLM fleet"))}</h1>
<p class="note">The dashboard's {len(charts)} panels, queried from {escape(prometheus)} over the
{minutes} minutes to {stamp} by <code>vllm-fleet preview</code> (every variable "All").
{escape(model.get("description", ""))}.</p>
<div class="grid">
{chr(10).join(charts)}
</div></body></html>
"""
    return Page(html, len(charts), empty)
