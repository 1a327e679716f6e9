"""``shardplan report`` (pipeline timeline, memory, placement) and ``shardplan diff``.

The timeline is checked against the closed forms of 1F1B and interleaved 1F1B and against the
plan's own predicted pipeline time; the PNG by its pixels; the page by its content (escaped
user text, one inline SVG per figure, no script, no external resource, deterministic).
"""
from __future__ import annotations

import copy
import io
import json
import re
import xml.etree.ElementTree as ET

import pytest

from export_corpus import corpus_plan
from planner.plan_types import Plan
from planner.schedule import ChunkTimes, order, plan_timeline, simulate
from conftest import build_plan, run_cli, write

matplotlib = pytest.importorskip("matplotlib", reason="report needs the 'report' extra")

from planner.plan_figures import COLOURS, combined, pixel_size  # noqa: E402
from planner.plan_page import page, render  # noqa: E402


# -- the schedule ---------------------------------------------------------------------------

@pytest.mark.parametrize("pp,v,m", [(1, 1, 4), (2, 1, 8), (4, 1, 8), (4, 1, 3), (2, 2, 8),
                                    (4, 2, 8), (3, 3, 9), (4, 4, 16)])
def test_uniform_stages_match_the_closed_form(pp, v, m):
    """Equal chunks of forward F and backward B: (m v + pp - 1)(F + B) (Narayanan et al.
    2021, the interleaved bubble is (pp - 1)/v of the non-interleaved one per micro-batch)."""
    f, b = 0.25, 0.5
    timeline = simulate([[ChunkTimes(f, b, 0.0, 0.0)] * v for _ in range(pp)], m)
    assert timeline.pipeline_s == pytest.approx((m * v + pp - 1) * (f + b))
    for rank in range(pp):
        assert timeline.bubble_s(rank) == pytest.approx((pp - 1) * (f + b))


@pytest.mark.parametrize("pp,v,m", [(4, 1, 8), (4, 2, 8), (2, 4, 6)])
def test_every_operation_runs_once_in_dependency_order(pp, v, m):
    for rank in range(pp):
        ops = order(rank, pp, v, m)
        assert sorted(ops) == sorted((kind, mb, c) for kind in ("backward", "forward")
                                     for mb in range(m) for c in range(v))
    timeline = simulate([[ChunkTimes(0.1 * (r + 1), 0.2, 0.05, 0.01)] * v for r in range(pp)], m)
    end = {(o.kind, o.micro_batch, o.chunk * pp + o.rank): o.end_s for o in timeline.ops}
    for o in timeline.ops:
        stage = o.chunk * pp + o.rank
        if o.kind == "forward" and stage > 0:
            assert o.start_s >= end[("forward", o.micro_batch, stage - 1)] - 1e-12
        if o.kind == "backward":
            dep = ("backward", o.micro_batch, stage + 1) if stage < pp * v - 1 else \
                ("forward", o.micro_batch, stage)
            assert o.start_s >= end[dep] - 1e-12
    for rank in range(pp):  # one operation at a time per rank
        mine = sorted((o for o in timeline.ops if o.rank == rank), key=lambda o: o.start_s)
        assert all(x.end_s <= y.start_s + 1e-12 for x, y in zip(mine, mine[1:]))


@pytest.mark.parametrize("name", ["zero1-tp2-pp2", "interleaved-v4", "pp4-layout",
                                  "per-layer-recompute", "mixtral-ep"])
def test_timeline_is_the_plans_prediction(name):
    """Laid out with the cost model's own layer terms, the schedule ends within 2 % of the
    plan's predicted pipeline time (the rest: stage-boundary transfers, ZeRO traffic)."""
    doc = corpus_plan(name)
    timeline = plan_timeline(Plan.from_dict(doc))
    assert timeline.pipeline_s == pytest.approx(doc["predicted"]["time_breakdown_s"]["pipeline"],
                                                rel=0.02)
    recompute = sum(o.recompute_s for o in timeline.ops)
    assert (recompute > 0) == any(x["recompute"] != "none" for x in doc["layers"])


# -- the page and the images ----------------------------------------------------------------

@pytest.fixture(scope="module")
def hostile_plan():
    doc = build_plan(tp=2, pp=2, global_batch=16, cluster="tiny",
                     block_recompute=["full", "none", "selective", "none"])
    doc["model"]["name"] = "<script>alert(1)</script> [bold]x[/] & \"q\""
    return Plan.from_dict(doc)


def test_page_is_self_contained_and_escaped(hostile_plan):
    text = page(hostile_plan)
    assert text.startswith("<!DOCTYPE html>")
    assert "<script" not in text.lower().replace("&lt;script", "")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    for figure in ("timeline", "memory", "placement"):
        block = re.search(rf'<figure id="{figure}">(.*?)</figure>', text, re.S).group(1)
        ET.fromstring(block)  # one well-formed inline SVG each
    assert page(hostile_plan) == text  # deterministic
    # the figures reference markers and clip paths by id: one page, no id twice
    ids = re.findall(r'\sid="([^"]+)"', text)
    assert len(ids) == len(set(ids)) and any(i.startswith("placement-") for i in ids)


def test_svg_image_is_deterministic_xml(hostile_plan):
    data = render(hostile_plan, "svg")
    assert data == render(hostile_plan, "svg")
    assert ET.fromstring(data).tag.endswith("svg")


def _pixels(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def _count(image, colour: str, tolerance: int = 6) -> int:
    import numpy as np

    rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)])
    pixels = np.asarray(image).astype(int)
    return int((np.abs(pixels - rgb) <= tolerance).all(axis=-1).sum())


def test_png_pixels(hostile_plan):
    data = render(hostile_plan, "png")
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = _pixels(data)
    assert image.size == pixel_size(combined(hostile_plan))
    corner = image.getpixel((2, 2))
    assert corner == (255, 255, 255)
    for key in ("forward", "backward", "recompute", "idle", "capacity"):
        assert _count(image, COLOURS[key]) > 50, key
    plain = Plan.from_dict(build_plan(tp=2, pp=2, global_batch=16, cluster="tiny"))
    swatch = _count(_pixels(render(plain, "png")), COLOURS["recompute"])  # the legend only
    assert 0 < swatch < 600 and _count(image, COLOURS["recompute"]) > 2 * swatch


def test_memory_bars_scale_with_the_plan():
    """The stacked bar of a stage over capacity reaches above the capacity line."""
    doc = build_plan(tp=1, pp=2, global_batch=16, cluster="tiny")
    over = copy.deepcopy(doc)
    capacity = over["cluster"]["gpu_memory_gib"]
    over["stages"][0]["memory_gib"]["activations"] += 2 * capacity
    over["stages"][0]["memory_gib"]["total"] += 2 * capacity
    from planner.plan_figures import MEMORY

    def top_row(plan_doc) -> int:
        image = _pixels(render(Plan.from_dict(plan_doc), "png"))
        colour = dict(MEMORY)["other"]
        rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
        import numpy as np

        rows = (np.asarray(image) == np.array(rgb)).all(axis=-1).sum(axis=1)
        return int(np.argmax(rows > 40)) if (rows > 40).any() else image.size[1]

    assert top_row(over) < top_row(doc)


def _with_band(doc: dict) -> dict:
    """The plan as `shardplan plan` writes it: with the calibration's error bands."""
    from planner.calibration.session import prediction_intervals
    from planner.calibration.store import shipped

    doc = copy.deepcopy(doc)
    doc["predicted"].update(prediction_intervals(Plan.from_dict(doc).evaluate(), shipped()))
    assert doc["predicted"]["peak_memory_gib_interval"]
    return doc


def test_memory_band_in_figure_and_table():
    from planner.plan_figures import memory_band

    doc = _with_band(build_plan(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64,
                                tp=2, pp=2))
    low, high = doc["predicted"]["peak_memory_gib_interval"]
    peak = doc["predicted"]["peak_memory_gib"]
    band = memory_band(doc)
    # the band of the peak stage is the plan's interval; the others the same relative error
    totals = [s["memory_gib"]["total"] for s in doc["stages"]]
    top = totals.index(max(totals))
    assert band[top] == pytest.approx((low, high), rel=1e-4)
    for (lo, hi), total in zip(band, totals):
        assert lo < total < hi and lo / total == pytest.approx(low / peak)
    # PNG: the band's error bars are drawn (a legend swatch only without a band)
    with_band = _count(_pixels(render(Plan.from_dict(doc), "png")), COLOURS["band"])
    plain = dict(doc, predicted={k: v for k, v in doc["predicted"].items()
                                 if k != "peak_memory_gib_interval"})
    without = _count(_pixels(render(Plan.from_dict(plain), "png")), COLOURS["band"])
    assert without == 0 and with_band > 100
    # HTML: the memory table lists each stage's band and whether its high end fits
    text = page(Plan.from_dict(doc))
    table = re.search(r'<div id="memory-table">(.*?)</div>', text, re.S).group(1)
    root = ET.fromstring(f"<root>{table}</root>")
    rows = [[td.text for td in tr] for tr in root.iter("tr")]
    assert rows[0][-3:] == ["80% band low", "high", "fits at high"]
    for row, (lo, hi) in zip(rows[1:], band):
        assert float(row[-3]) == pytest.approx(lo, abs=0.006)
        assert float(row[-2]) == pytest.approx(hi, abs=0.006)
        assert row[-1] == ("yes" if hi <= doc["cluster"]["gpu_memory_gib"] else "no")
    assert f"band {low:.1f}-{high:.1f}" in text
    # a stage whose high end passes the capacity says so
    tight = copy.deepcopy(doc)
    tight["cluster"]["gpu_memory_gib"] = (totals[top] + band[top][1]) / 2
    assert "<td>no</td>" in re.search(r'<div id="memory-table">(.*?)</div>',
                                      page(Plan.from_dict(tight)), re.S).group(1)
    # no band recorded: no band columns
    assert "band low" not in page(Plan.from_dict(plain))


# -- commands --------------------------------------------------------------------------------

def test_report_command(tmp_path, capsys):
    path = write(build_plan(pp=2, global_batch=16), tmp_path / "plan.json")
    code, out, err = run_cli(["report", path, "-o", tmp_path / "plan.html"], capsys)
    assert code == 0 and "html report written" in err
    assert (tmp_path / "plan.html").read_text().startswith("<!DOCTYPE html>")
    code, out, err = run_cli(["report", path, "-o", tmp_path / "plan.html"], capsys)
    assert code == 2 and "exists" in err
    code, out, err = run_cli(["report", path, "-o", tmp_path / "p.png"], capsys)
    assert code == 0 and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    code, out, err = run_cli(["report", path, "--format", "svg"], capsys)
    assert code == 0 and "<svg" in out
    code, out, err = run_cli(["report", path, "--format", "png"], capsys)
    assert code == 2 and "-o" in err
    code, out, err = run_cli(["report", tmp_path / "missing.json"], capsys)
    assert code == 2 and "Traceback" not in err


def test_diff_command(tmp_path, capsys):
    a = write(build_plan(tp=2, pp=2, global_batch=16), tmp_path / "a.json")
    b = write(build_plan(tp=1, pp=2, global_batch=16, stage_blocks=[1, 3],
                         block_recompute=["full", "none", "none", "none"]), tmp_path / "b.json")
    code, out, err = run_cli(["diff", a, a, "--json", "--exit-code"], capsys)
    assert code == 0 and json.loads(out)["identical"]
    code, out, err = run_cli(["diff", a, b, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and not doc["identical"]
    assert doc["degrees"]["tp"] == {"a": 2, "b": 1, "delta": -1}
    moved = {m["name"]: m for m in doc["layers"]["changed"]}
    assert moved["block.0"]["recompute"] == {"a": "none", "b": "full"}
    assert moved["block.1"]["stage"] == {"a": 0, "b": 1, "delta": 1}
    stage0 = doc["stages"][0]
    assert stage0["memory_gib"]["total"]["delta"] == pytest.approx(
        stage0["memory_gib"]["total"]["b"] - stage0["memory_gib"]["total"]["a"], abs=1e-5)
    code, out, err = run_cli(["diff", a, b, "--exit-code"], capsys)
    assert code == 1 and "Layer moves" in err and "block.1" in err


def _drawn(pp):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    doc = build_plan(tp=2, pp=pp, global_batch=16, cluster="tiny")
    fig = combined(Plan.from_dict(doc))
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return doc, fig, canvas.get_renderer()


@pytest.mark.parametrize("pp", [1, 2])
def test_png_names_its_plan(pp):
    """The image read on its own (report --format png|svg) names the plan: the mesh, the global
    batch and the predicted step (the title was model and cluster only)."""
    doc, fig, _ = _drawn(pp)
    title = fig._suptitle.get_text()
    assert f"dp {doc['parallelism']['dp']} x tp 2 x pp {pp}" in title
    assert "global batch 16" in title and f"{doc['predicted']['step_time_s']:.3f} s" in title


@pytest.mark.parametrize("pp", [1, 2])
def test_timeline_legend_clears_its_axis_labels(pp):
    """The timeline's legend sits below its x label; it was placed at a fraction of the axes'
    height, which on a one- or two-rank timeline put it on the "seconds into the step" label."""
    _, fig, renderer = _drawn(pp)
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(renderer)
    for label in [ax.xaxis.label, *ax.get_xticklabels()]:
        box = label.get_window_extent(renderer)
        assert not legend.overlaps(box), (label.get_text(), legend, box)


@pytest.mark.parametrize("name, fmt", [("plan.svg", "png"), ("plan.html", "svg"),
                                       ("plan.png", "html"), ("plan.htm", "png")])
def test_format_that_contradicts_the_output_suffix_is_refused(tmp_path, capsys, name, fmt):
    """--format png with -o plan.svg wrote PNG bytes into plan.svg, exit 0; now exit 2 and
    nothing written. A suffix that names no format (or agrees) keeps --format."""
    path = write(build_plan(tp=2, pp=2, global_batch=16, cluster="tiny"), tmp_path / "p.json")
    code, _, err = run_cli(["report", path, "-o", tmp_path / name, "--format", fmt], capsys)
    assert code == 2 and f"--format {fmt}" in err
    assert not (tmp_path / name).exists()
    code, _, _ = run_cli(["report", path, "-o", tmp_path / "plan.image", "--format", fmt],
                         capsys)
    assert code == 0 and (tmp_path / "plan.image").stat().st_size > 0
