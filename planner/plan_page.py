"""``shardplan report``: a plan as one self-contained HTML page, or one PNG / SVG image.

Consumes a :class:`~planner.plan_types.Plan`; produces the page's text (inline SVG figures
from :mod:`planner.plan_figures`, inline CSS, no script, no external resource) or image bytes.
Every string from the plan is HTML-escaped. Sections: the headline numbers, the pipeline
schedule as a timeline, memory per stage and category against capacity (with the plan's
error band, figure and table), per-layer placement
(stage, recomputation, layout) with a per-stage table, the runners-up and what each gives up
against the plan, and the solver record.
"""
from __future__ import annotations

import html
import re
from typing import Any

from planner.plan_diff import setting_changes
from planner.plan_figures import combined, image_bytes, memory_band, panel

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1140px;
color:#222;background:#fff}h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;
border-bottom:1px solid #ddd;padding-bottom:4px}.sub{color:#555;margin:0 0 12px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{border:1px solid #ddd;
padding:3px 8px;text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}
.kpi{display:flex;gap:12px;flex-wrap:wrap}.kpi div{border:1px solid #ddd;border-radius:6px;
padding:8px 12px}.kpi b{display:block;font-size:18px}.fit{color:#2a7a2a}.nofit{color:#b22}
figure{margin:0}svg{max-width:100%;height:auto}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _svg(fig, name: str) -> str:
    """The figure as inline SVG whose element ids start with ``name`` (unique on the page:
    markers and clip paths are referenced by id)."""
    text = image_bytes(fig, "svg", f"{name}-").decode("utf-8")
    text = re.sub(r"^<\?xml[^>]*>\s*", "", text)
    return re.sub(r"<!DOCTYPE[^>]*>\s*", "", text)


def _table(header: list[str], rows: list[list[Any]], left: int = 1) -> str:
    head = "".join(f"<th class='l'>{_e(h)}</th>" if i < left else f"<th>{_e(h)}</th>"
                   for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td class='l'>{_e(c)}</td>" if i < left else
                                    f"<td>{_e(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _degrees(p: dict[str, Any]) -> str:
    return (f"dp {p['dp']} x tp {p['tp']} x pp {p['pp']} x cp {p['cp']}, ep {p['ep']}, "
            f"ZeRO-{p['zero_stage']}, micro-batch {p['micro_batch']} x "
            f"{p['num_micro_batches']}, v {p['virtual_stages']}, sp {'on' if p['sp'] else 'off'}")


def _stage_rows(plan: Any) -> list[list[Any]]:
    rows = []
    by_stage: dict[int, list[dict]] = {}
    for layer in plan.layers:
        by_stage.setdefault(layer["stage"], []).append(layer)
    for stage in plan.document["stages"]:
        layers = by_stage.get(stage["index"], [])
        counts = {k: sum(1 for x in layers if x["recompute"] == k)
                  for k in ("none", "selective", "full")}
        layouts = sorted({x.get("layout", "mesh") for x in layers})
        names = [x["name"] for x in layers]
        span = f"{names[0]} .. {names[-1]}" if len(names) > 1 else (names[0] if names else "")
        rows.append([stage["index"], span, len(layers), counts["none"], counts["selective"],
                     counts["full"], ", ".join(layouts), f"{stage['memory_gib']['total']:.2f}",
                     f"{stage['time_s']:.4f}"])
    return rows


def _memory_table(doc: dict[str, Any]) -> str:
    """Memory per stage and category, with each stage's error band where the plan has one."""
    band = memory_band(doc)
    capacity = doc["cluster"]["gpu_memory_gib"]
    keys = ("params", "grads", "optimizer", "activations", "other", "total")
    header = ["stage", *keys]
    if band is not None:
        coverage = doc["predicted"].get("interval_coverage", 0.8)
        header += [f"{coverage:.0%} band low", "high", "fits at high"]
    rows = []
    for i, stage in enumerate(doc["stages"]):
        row = [stage["index"], *(f"{stage['memory_gib'][k]:.2f}" for k in keys)]
        if band is not None:
            low, high = band[i]
            fits = high <= stage.get("capacity_gib", capacity)  # its pool's GPU across pools
            row += [f"{low:.2f}", f"{high:.2f}", "yes" if fits else "no"]
        rows.append(row)
    low_peak, high_peak = doc["predicted"].get("peak_memory_gib_interval") or (0.0, 0.0)
    note = ("" if band is None else
            f"<p class='sub'>The band is the calibration's {_e(f'{coverage:.0%}')} error band "
            f"of the peak ({_e(f'{low_peak:.1f}')} - {_e(f'{high_peak:.1f}')} GiB), the same "
            f"relative "
            f"error on every stage; capacity {_e(f'{capacity:g}')} GiB.</p>")
    return _table(header, rows) + note


def _alternatives(doc: dict[str, Any]) -> str:
    alts = doc.get("alternatives") or []
    if not alts:
        return "<p>The plan records no runners-up (it was not made by a search).</p>"
    best = doc["parallelism"]
    rows = []
    for n, alt in enumerate(alts, 1):
        p = alt["parallelism"]
        changed = setting_changes(best, p)
        rows.append([n, "; ".join(changed) or "same degrees, other placement",
                     f"{alt['step_time_s']:.4f}", f"+{alt['slower_than_best']:.1%}",
                     f"{alt['peak_memory_gib']:.2f}",
                     f"{alt['peak_memory_gib'] - doc['predicted']['peak_memory_gib']:+.2f}"])
    return _table(["#", "differs from the plan in", "step s", "gives up (time)", "peak GiB",
                   "vs plan GiB"], rows, left=2)


def _solver(doc: dict[str, Any]) -> str:
    solver = doc.get("solver") or {}
    rows = [[k, solver[k]] for k in sorted(solver)]
    pins = doc.get("pins") or {}
    rows += [[f"pin {k}", v] for k, v in sorted(pins.items())]
    inputs = doc.get("inputs", {})
    for role in ("model", "cluster"):
        item = inputs.get(role) or {}
        rows.append([f"{role} input", f"{item.get('spec', '')} ({str(item.get('sha256', ''))[:19]})"])
    return _table(["field", "value"], rows, left=2)


def page(plan: Any) -> str:
    """The report as one HTML document (UTF-8 text)."""
    from planner.plan_figures import _rc
    from planner.schedule import plan_timeline

    doc = plan.document
    pred, p, c = doc["predicted"], doc["parallelism"], doc["cluster"]
    timeline = plan_timeline(plan)
    with _rc():
        figures = {name: _svg(panel(plan, name, timeline), name)
                   for name in ("timeline", "memory", "placement")}
    fits = ("<b class='fit'>fits</b>" if pred["fits"] else "<b class='nofit'>does NOT fit</b>")
    kpis = "".join(f"<div>{label}<b>{value}</b></div>" for label, value in (
        ("step time", f"{pred['step_time_s']:.3f} s"),
        ("throughput", f"{pred['tokens_per_s']:,.0f} tokens/s"),
        ("MFU", f"{pred['mfu']:.1%}"),
        ("peak memory", f"{pred['peak_memory_gib']:.1f} of {c['gpu_memory_gib']:g} GiB"
         + (" (band {:.1f}-{:.1f})".format(*pred["peak_memory_gib_interval"])
            if pred.get("peak_memory_gib_interval") else "")),
        ("bubble", f"{pred['time_breakdown_s']['bubble']:.3f} s")))
    bubbles = (", ".join(f"rank {r}: {timeline.bubble_s(r):.3f} s" for r in range(timeline.pp))
               if timeline is not None else
               f"not drawn for the {p['schedule']} schedule, whose bubble is a closed form")
    title = f"{doc['model']['name']} on {c['name']}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>shardplan report: {_e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{CSS}</style></head><body>
<h1>{_e(title)}</h1>
<p class="sub">{_e(c['num_nodes'])} x {_e(c['gpus_per_node'])} {_e(c['gpu'])}: {_e(_degrees(p))};
{_e(p['dtype'])}, sequence {_e(p['seq_len'])}, global batch {_e(p['global_batch'])}: {fits}</p>
<div class="kpi">{kpis}</div>
<h2>Pipeline schedule</h2>
<p class="sub">Each rank's operations in Megatron-LM's order, timed with the cost model's
per-layer forward, backward, recompute and exposed-communication terms; idle time per rank
(bubble and imbalance): {_e(bubbles)}.</p>
<figure id="timeline">{figures['timeline']}</figure>
<h2>Memory per stage</h2>
<figure id="memory">{figures['memory']}</figure>
<div id="memory-table">{_memory_table(doc)}</div>
<h2>Per-layer placement</h2>
<figure id="placement">{figures['placement']}</figure>
{_table(["stage", "first .. last layer", "count", "recompute none", "selective", "full", "layout",
         "GiB", "s / micro-batch"], _stage_rows(plan), left=2)}
<h2>Runners-up</h2>
{_alternatives(doc)}
<h2>Solver record</h2>
{_solver(doc)}
</body></html>
"""


def image(plan: Any, fmt: str) -> bytes:
    """The three panels in one PNG or SVG image."""
    from planner.plan_figures import _rc

    with _rc():
        return image_bytes(combined(plan), fmt)


def render(plan: Any, fmt: str) -> bytes:
    """``html`` (UTF-8), ``png`` or ``svg`` bytes of the report."""
    if fmt == "html":
        return page(plan).encode("utf-8")
    return image(plan, fmt)
