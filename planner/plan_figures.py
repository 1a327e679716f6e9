"""A plan drawn with matplotlib: pipeline timeline, memory per stage, per-layer placement.

Consumes a :class:`~planner.plan_types.Plan`; produces matplotlib figures (object API with the
Agg / SVG canvases, no pyplot and no global backend switch) and their PNG or SVG bytes. The
same deterministic output for the same plan (no dates in the SVG, fixed ids).

* timeline: :func:`planner.schedule.plan_timeline` per pipeline rank: forward, recompute,
  backward, exposed communication (hatched, at the end of each operation), idle (the bubble),
  then the step's exposed data-parallel sync and the optimizer step;
* memory: the recorded per-stage categories stacked against the GPU's capacity, with the
  plan's error band (``predicted.peak_memory_gib_interval``, the calibration's band of the
  peak: :func:`memory_band`) on each stage's total;
* placement: one column per layer: its stage (colour) and recomputation (marker).
"""
from __future__ import annotations

import io
from typing import Any

from planner.errors import invalid

COLOURS = {"forward": "#4C72B0", "backward": "#DD8452", "recompute": "#8172B3",
           "comm": "#C44E52", "idle": "#E4E4E4", "dp_sync": "#937860", "optimizer": "#55A868",
           "capacity": "#C44E52", "band": "#17BECF"}
MEMORY = (("params", "#4C72B0"), ("grads", "#DD8452"), ("optimizer", "#55A868"),
          ("activations", "#DA8BC3"), ("other", "#8C8C8C"))
RECOMPUTE_MARKERS = {"none": "o", "selective": "s", "full": "D"}
STAGE_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
                 "#8C8C8C", "#CCB974", "#64B5CD")  # tab10-like, one per pipeline rank
DPI = 100


def _matplotlib():
    try:
        import matplotlib  # noqa: F401
        from matplotlib.figure import Figure
    except ImportError:
        raise invalid("`shardplan report` draws with matplotlib, which is not installed",
                      "pip install 'shardplan[report]' (or pip install matplotlib)") from None
    return Figure


def _rc():
    _matplotlib()  # the clear "not installed" error before anything imports it
    import matplotlib

    return matplotlib.rc_context({"svg.hashsalt": "shardplan", "svg.fonttype": "none",
                                  "font.size": 9, "axes.titlesize": 10})


# the timeline's legend hangs this far below the axes, in points, clear of the tick labels and
# the x label at any figure height (a fraction of the axes overlapped them when pp is 1 or 2)
LEGEND_BELOW_PT = 30


def draw_timeline(ax, plan: Any, timeline) -> None:
    from matplotlib.patches import Patch
    from matplotlib.transforms import ScaledTranslation

    if timeline is None:  # a zero-bubble schedule: costed in closed form, not laid out
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"{plan.config.schedule}: no operation order is drawn for this "
                f"schedule (its bubble is the closed form of planner/cost/pipeline.py)",
                ha="center", va="center", transform=ax.transAxes)
        return
    doc = plan.document
    breakdown = doc["predicted"]["time_breakdown_s"]
    tail = [("dp_sync", breakdown.get("dp_exposed", 0.0)),
            ("optimizer", breakdown.get("optimizer", 0.0))]
    for rank in range(timeline.pp):
        y = timeline.pp - 1 - rank
        for start, end in timeline.idle_spans(rank):
            ax.broken_barh([(start, end - start)], (y - 0.4, 0.8), color=COLOURS["idle"])
        for op in (o for o in timeline.ops if o.rank == rank):
            x = op.start_s
            if op.recompute_s > 0:
                ax.broken_barh([(x, op.recompute_s)], (y - 0.4, 0.8),
                               color=COLOURS["recompute"], linewidth=0)
                x += op.recompute_s
            body = op.end_s - x - op.comm_s
            ax.broken_barh([(x, body)], (y - 0.4, 0.8), color=COLOURS[op.kind], linewidth=0)
            if op.comm_s > 0:
                ax.broken_barh([(op.end_s - op.comm_s, op.comm_s)], (y - 0.4, 0.8),
                               facecolor=COLOURS["comm"], edgecolor="white", hatch="////",
                               linewidth=0)
        x = timeline.pipeline_s
        for name, seconds in tail:
            if seconds > 0:
                ax.broken_barh([(x, seconds)], (y - 0.4, 0.8), color=COLOURS[name])
                x += seconds
    ax.set_yticks(range(timeline.pp))
    ax.set_yticklabels([f"rank {timeline.pp - 1 - y}" for y in range(timeline.pp)])
    ax.set_xlabel("seconds into the step")
    schedule = "interleaved 1F1B" if timeline.virtual_stages > 1 else "1F1B"
    m = timeline.num_micro_batches
    ax.set_title(f"Pipeline schedule ({schedule}, {m} micro-batch{'es' if m != 1 else ''}"
                 + (f", {timeline.virtual_stages} chunks per rank"
                    if timeline.virtual_stages > 1 else "")
                 + f"): {timeline.pipeline_s:.3f} s simulated, "
                   f"{breakdown['pipeline']:.3f} s predicted")
    ax.set_xlim(0, timeline.pipeline_s + sum(s for _, s in tail))
    ax.legend(handles=[Patch(color=COLOURS[k], label=label) for k, label in (
        ("forward", "forward"), ("recompute", "recompute"), ("backward", "backward"),
        ("comm", "exposed comm"), ("idle", "bubble / idle"), ("dp_sync", "DP sync"),
        ("optimizer", "optimizer"))], loc="upper center", bbox_to_anchor=(0.5, 0.0),
        bbox_transform=ax.transAxes + ScaledTranslation(0, -LEGEND_BELOW_PT / 72,
                                                          ax.figure.dpi_scale_trans),
        ncol=7, frameon=False)


def memory_band(doc: dict[str, Any]) -> list[tuple[float, float]] | None:
    """Each stage's total memory band [low, high] in GiB: the plan's band of the peak
    (``predicted.peak_memory_gib_interval``) as the same relative error on every stage (the
    calibration's band is a relative error of the prediction, planner.calibration.bands);
    None when the plan records no band."""
    predicted = doc["predicted"]
    interval, peak = predicted.get("peak_memory_gib_interval"), predicted["peak_memory_gib"]
    if not interval or peak <= 0:
        return None
    low, high = interval[0] / peak, interval[1] / peak
    return [(s["memory_gib"]["total"] * low, s["memory_gib"]["total"] * high)
            for s in doc["stages"]]


def draw_memory(ax, plan: Any) -> None:
    doc = plan.document
    stages = doc["stages"]
    capacity = doc["cluster"]["gpu_memory_gib"]
    xs = [s["index"] for s in stages]
    bottom = [0.0] * len(stages)
    for key, colour in MEMORY:
        values = [s["memory_gib"][key] for s in stages]
        ax.bar(xs, values, bottom=bottom, color=colour, label=key, width=0.6)
        bottom = [b + v for b, v in zip(bottom, values)]
    if all("capacity_gib" in s for s in stages):  # across pools: each stage's pool's GPU
        caps = [s["capacity_gib"] for s in stages]
        ax.hlines(caps, [x - 0.4 for x in xs], [x + 0.4 for x in xs], color=COLOURS["capacity"],
                  linestyle="--", linewidth=1.5, label="capacity of the stage's pool")
        labels = [f"stage {s['index']}\n{s['pool']}" for s in stages]
        capacity = max(caps)
    else:
        ax.axhline(capacity, color=COLOURS["capacity"], linestyle="--", linewidth=1.5,
                   label=f"capacity {capacity:g} GiB")
        labels = [f"stage {x}" for x in xs]
    band = memory_band(doc)
    top = list(bottom)
    if band is not None:
        coverage = doc["predicted"].get("interval_coverage", 0.8)
        ax.errorbar(xs, bottom, yerr=[[t - lo for t, (lo, _) in zip(bottom, band)],
                                      [hi - t for t, (_, hi) in zip(bottom, band)]],
                    fmt="none", ecolor=COLOURS["band"], elinewidth=3, capsize=10,
                    capthick=3, label=f"{coverage:.0%} error band")
        top = [max(t, hi) for t, (_, hi) in zip(bottom, band)]
    for x, total, y in zip(xs, bottom, top):
        ax.annotate(f"{total:.1f}", (x, y), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs)
    ax.set_xticklabels(labels)
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, max(capacity, max(top, default=0)) * 1.15)
    ax.set_title("Memory per stage and category"
                 + (" (bars: the error band of each stage's total)" if band else ""))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def draw_placement(ax, plan: Any) -> None:
    from matplotlib.lines import Line2D

    layers = plan.layers
    for layer in layers:
        ax.scatter(layer["index"], layer["stage"], s=22,
                   color=STAGE_COLOURS[layer["stage"] % len(STAGE_COLOURS)],
                   marker=RECOMPUTE_MARKERS.get(layer["recompute"], "o"))
    ax.set_yticks(range(plan.config.pp))
    ax.set_ylabel("pipeline rank")
    ax.set_xlabel("layer index (embedding ... blocks ... head)")
    ax.set_title("Per-layer placement: stage and recomputation")
    ax.invert_yaxis()
    ax.legend(handles=[Line2D([], [], marker=m, linestyle="", color="#444444", label=f"recompute "
                              f"{k}") for k, m in RECOMPUTE_MARKERS.items()],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


PANELS = ("timeline", "memory", "placement")
SIZES_IN = {"timeline": (11.0, 1.2 + 0.45 * 8), "memory": (11.0, 3.4),
            "placement": (11.0, 2.8)}


def panel(plan: Any, name: str, timeline=None):
    """One panel as a Figure."""
    Figure = _matplotlib()
    width, height = SIZES_IN[name]
    if name == "timeline":
        height = 1.6 + 0.4 * plan.config.pp
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    if name == "timeline":
        from planner.schedule import plan_timeline

        draw_timeline(ax, plan, timeline or plan_timeline(plan))
    elif name == "memory":
        draw_memory(ax, plan)
    else:
        draw_placement(ax, plan)
    return fig


def title(doc: dict[str, Any]) -> str:
    """What the drawn plan is: model, cluster and mesh (the exports' headline), then batch,
    ZeRO stage and the predicted step, so that an image read on its own names its plan."""
    from planner.export.base import headline

    p, pred = doc["parallelism"], doc["predicted"]
    return (f"{headline(doc)}\nglobal batch {doc['inputs']['global_batch']}, micro-batch "
            f"{p['micro_batch']}, ZeRO-{p['zero_stage']}, {pred['step_time_s']:.3f} s per step "
            f"predicted")


def combined(plan: Any, timeline=None):
    """The three panels in one figure (``report --format png|svg``)."""
    Figure = _matplotlib()
    heights = [1.6 + 0.4 * plan.config.pp, SIZES_IN["memory"][1], SIZES_IN["placement"][1]]
    fig = Figure(figsize=(11.0, sum(heights)), dpi=DPI, layout="constrained")
    axes = fig.subplots(3, 1, height_ratios=heights)
    from planner.schedule import plan_timeline

    draw_timeline(axes[0], plan, timeline or plan_timeline(plan))
    draw_memory(axes[1], plan)
    draw_placement(axes[2], plan)
    fig.suptitle(title(plan.document))
    return fig


def image_bytes(fig, fmt: str, id_prefix: str = "i") -> bytes:
    """PNG or SVG bytes of a figure, deterministic (no dates, fixed SVG ids numbered after
    ``id_prefix``: give each SVG of one page its own, or their ids collide)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.backends.backend_svg import FigureCanvasSVG

    buffer = io.BytesIO()
    with _rc():
        if fmt == "png":
            FigureCanvasAgg(fig).print_png(buffer, metadata={"Software": None})
        elif fmt == "svg":
            FigureCanvasSVG(fig).print_svg(buffer, metadata={"Date": None, "Creator": None})
            return _stable_ids(buffer.getvalue().decode("utf-8"), id_prefix).encode("utf-8")
        else:
            raise ValueError(f"no image format {fmt!r}")
    return buffer.getvalue()


def _stable_ids(svg: str, prefix: str = "i") -> str:
    """Renumber the SVG's element ids in order of appearance: matplotlib derives some (clip
    paths) from object reprs that hold memory addresses, so they change between runs."""
    import re

    mapping: dict[str, str] = {}
    for name in re.findall(r'\sid="([^"]+)"', svg):
        mapping.setdefault(name, f"{prefix}{len(mapping)}")
    if not mapping:
        return svg
    pattern = re.compile(r'(\sid="|#)(' + "|".join(re.escape(k) for k in sorted(
        mapping, key=len, reverse=True)) + r')(?=["\)])')
    return pattern.sub(lambda m: m.group(1) + mapping[m.group(2)], svg)


def pixel_size(fig) -> tuple[int, int]:
    width, height = fig.get_size_inches()
    return round(width * fig.dpi), round(height * fig.dpi)
