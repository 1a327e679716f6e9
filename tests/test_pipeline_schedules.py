"""Zero-bubble and V pipeline schedules (planner/cost/pipeline.py): ZB-H1 (ZB1P), ZB-V and
DualPipeV as a per-configuration bubble correction, their placements and in-flight memory,
through evaluate, the CP-SAT model, brute force, the search, the plan file and the exports."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clusters import load_cluster
from models import load_model
from models.native import build_native
from planner.config import ParallelConfig, RuntimeOptions
from planner.cost.memory import in_flight_micro_batches
from planner.cost.model import evaluate
from planner.cost.pipeline import SCHEDULES, bubble_pieces, pipeline_time_s
from planner.errors import PlannerError
from planner.export import export_plan
from planner.plan import dumps, make_plan
from planner.plan_io import validate_plan
from planner.plan_types import Plan
from planner.profiles import PROFILES
from planner.solve.bruteforce import brute_force
from planner.solve.headroom import NO_HEADROOM
from planner.solve.search import SearchOptions, search
from planner.solve.space import Pins, enumerate_configs
from planner.strategy import interleaved_rank
from conftest import run_cli

TINY = load_cluster("tiny")  # 2 nodes x 4 GPUs
TORCHTITAN = RuntimeOptions(runtime="zero-paper", profile="torchtitan")


def _equal_stage_bubble(name: str, p: int, f: float, b_in: float, w: float) -> float:
    """The bubble of ``p`` equal stages whose chunks take F, B (input) and W seconds."""
    spec = SCHEDULES[name]
    v = spec.min_chunks
    t = v * (f + b_in + w)  # a rank's work per micro-batch: v chunks
    m = 4 * p
    return pipeline_time_s([t] * p, m, v, bubble_pieces(spec, p), p * v * (b_in + w),
                           p * v * w) - m * t


@pytest.mark.parametrize("p", [2, 4, 8])
def test_published_bubbles_with_equal_f_b_w(p):
    # Sea AI Lab's comparison with T_F = T_B = T_W (Qi et al. 2024): bubble rate (p-1)/m for
    # 1F1B, (p-1)/(3m) for ZB1P; ZB-V keeps the first forward's wait (p-1) F on rank p-1
    # (the operation order, planner/cost/pipeline_sim.py: not the zero of the equal-time
    # headline); m micro-batches of 3 T each
    one = _equal_stage_bubble("1f1b", p, 1.0, 1.0, 1.0)
    assert one == pytest.approx((p - 1) * 3.0)
    assert _equal_stage_bubble("zb-h1", p, 1.0, 1.0, 1.0) == pytest.approx(one / 3)
    assert _equal_stage_bubble("zbv", p, 1.0, 1.0, 1.0) == pytest.approx(p - 1)
    # DeepSeek-V3 Table 2 / DualPipe README forms per chunk (B = full backward chunk) where
    # the orders agree with them: ZB1P (p-1)(F + B - 2W) while W <= min(F, I); DualPipeV
    # (PP/2 - 1)(F&B + B - 3W) over PP = 2p chunk stages, F&B = F + B, is one F above the
    # order's (p - 2) F + (p - 1)(2 I - W) where that piece is the largest (p F < (p-1) I),
    # below 2 (p-1) F + (p-1)(I - W) otherwise; ZB-V (p-1)(F + B - 3W) only where F = I
    # (elsewhere 2 (p-1)(I - W) or (2p-3) F + I - 2 (p-1) W is larger)
    f, b_in, w = 1.0, 1.3, 0.8
    b = b_in + w
    assert _equal_stage_bubble("zb-h1", p, f, b_in, w) == pytest.approx((p - 1) * (f + b - 2 * w))
    assert _equal_stage_bubble("dualpipev", p, f, b_in, w) == \
        pytest.approx(max(2 * (p - 1) * f + (p - 1) * (b_in - w),
                          (p - 2) * f + (p - 1) * (2 * b_in - w)))
    assert _equal_stage_bubble("dualpipev", p, 0.5, b_in, w) == \
        pytest.approx((2 * p / 2 - 1) * ((0.5 + b) + b - 3 * w) - 0.5)
    assert _equal_stage_bubble("interleaved-1f1b", p, f, b_in, w) == \
        pytest.approx((p - 1) * (f + b))
    f, b_in, w = 1.2, 1.2, 0.3
    assert _equal_stage_bubble("zbv", p, f, b_in, w) == \
        pytest.approx((p - 1) * (f + b_in + w - 3 * w))


def test_bubble_is_never_negative():
    # one heavy stage: the W credit cannot make the pipeline shorter than its busy time
    times = [10.0, 0.1]
    pieces = ((1.0, 0.0, -1.0),)  # a W credit larger than the fill
    assert pipeline_time_s(times, 8, 1, pieces, 8.0, 4.0) == 8 * 10.0


def test_v_placement_and_in_flight():
    assert [interleaved_rank(b, 8, 4, 2, "v") for b in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    # 9 blocks in 4 chunks of 3, 2, 2, 2 (the first ones one larger)
    assert [interleaved_rank(b, 9, 2, 2, "v") for b in range(9)] == [0, 0, 0, 1, 1, 1, 1, 0, 0]
    # ZB-V and ZB-H1 keep p micro-batches of the stage on every rank (a deferred W holds its
    # saved inputs), DualPipeV p + 1/2; 1F1B p - r
    assert [in_flight_micro_batches(i, 4, 16, 2, "zbv") for i in range(4)] == [4.0] * 4
    assert [in_flight_micro_batches(i, 4, 16, 2, "dualpipev") for i in range(4)] == [4.5] * 4
    assert [in_flight_micro_batches(i, 4, 16, 1, "zb-h1") for i in range(4)] == [4.0] * 4
    assert [in_flight_micro_batches(i, 4, 16, 1, "1f1b") for i in range(4)] == [4, 3, 2, 1]


def _config(**kw) -> ParallelConfig:
    base = dict(tp=1, pp=4, dp=2, global_batch=32, seq_len=1024)
    base.update(kw)
    return ParallelConfig(**base)


MODEL = build_native({"name": "n8", "num_layers": 8, "hidden_size": 512, "num_heads": 8,
                      "ffn_hidden_size": 2048, "vocab_size": 4096, "seq_len": 1024,
                      "tied_embeddings": True})
AMPLE = replace(TINY, gpu=replace(TINY.gpu, memory_gib=64))


def test_evaluate_orders_the_schedules_as_their_bubbles():
    def ev(**kw):
        return evaluate(MODEL, AMPLE, _config(**kw), options=TORCHTITAN)

    one, zb1 = ev(), ev(pipeline_schedule="zb-h1")
    inter, zbi = ev(virtual_stages=2), ev(virtual_stages=2, pipeline_schedule="zb-h1")
    zbv, dpv = ev(virtual_stages=2, pipeline_schedule="zbv"), \
        ev(virtual_stages=2, pipeline_schedule="dualpipev")
    assert zb1.breakdown.bubble_s < one.breakdown.bubble_s
    assert zbi.breakdown.bubble_s < inter.breakdown.bubble_s
    assert zbv.breakdown.bubble_s < zbi.breakdown.bubble_s
    # same placement and stage times: only the bubble moves; ZB-H1's later stages hold more
    # (p micro-batches on every rank), its first as 1F1B's
    assert [s.time_s for s in zb1.stages] == [s.time_s for s in one.stages]
    assert zb1.stages[0].memory.total == one.stages[0].memory.total
    assert zb1.stages[-1].memory.total > one.stages[-1].memory.total
    # the V puts the head (and the tied embedding) on rank 0: no embedding all-reduce
    assert zbv.placement.stage[-1] == 0 and zbv.breakdown.embedding_sync_s == 0.0
    assert one.breakdown.embedding_sync_s > 0.0
    # DualPipeV's F&B + B (no overlap modelled) pays one more backward chunk than ZB-V
    assert dpv.breakdown.bubble_s > zbv.breakdown.bubble_s
    assert dpv.peak_memory_bytes > zbv.peak_memory_bytes  # p + 1/2 micro-batches in flight


@pytest.mark.parametrize("kw,match", [
    (dict(pipeline_schedule="zbv"), "exactly 2 model chunks"),
    (dict(pipeline_schedule="dualpipev", virtual_stages=2, global_batch=8), "at least 2 x pp"),
    (dict(pipeline_schedule="gpipe"), "--schedule must be one of"),
    (dict(pipeline_schedule="zb-h1", pp=1, dp=8), "needs --pp > 1"),
])
def test_invalid_schedules_are_refused(kw, match):
    with pytest.raises(PlannerError, match=match):
        _config(**kw).validate(MODEL, TINY)


def test_the_space_has_the_schedules_its_runtime_runs():
    def schedules(runtime):
        prof = PROFILES[runtime] if runtime else None
        return {(c.virtual_stages, c.schedule) for c in enumerate_configs(
            MODEL, TINY, 32, 1024, "bf16", Pins(pp=4, tp=1, micro_batch=1), prof)}

    assert schedules(None) == {(1, "1f1b"), (2, "interleaved-1f1b")}
    assert schedules("megatron") == {(1, "1f1b"), (2, "interleaved-1f1b")}
    tt = schedules("torchtitan")
    # InterleavedZeroBubble needs >= 2 chunks in torchtitan; the V schedules exactly 2. ZB-V
    # dominates DualPipeV: not searched unpinned; ZB-H1 is faster than interleaved 1F1B but
    # holds more on later ranks: both searched
    assert tt == {(1, "1f1b"), (2, "interleaved-1f1b"), (2, "zb-h1"), (2, "zbv")}  # pp v <= 8
    pinned = Pins(pp=4, tp=1, micro_batch=1, schedule=("dualpipev", "interleaved-1f1b"))
    assert {(c.virtual_stages, c.schedule) for c in enumerate_configs(
        MODEL, TINY, 32, 1024, "bf16", pinned, PROFILES["torchtitan"])} == \
        {(2, "dualpipev"), (2, "interleaved-1f1b")}
    with pytest.raises(PlannerError, match="schedule=zbv"):
        list(enumerate_configs(MODEL, TINY, 32, 1024, "bf16", Pins.parse({"schedule": "zbv"}),
                               PROFILES["megatron"]))
    pinned = Pins.parse({"schedule": "1f1b,interleaved-1f1b", "tp": "1"})
    got = {(c.pp > 1, c.schedule) for c in enumerate_configs(MODEL, TINY, 32, 1024, "bf16",
                                                             pinned, PROFILES["torchtitan"])}
    # pp 1 stays (1F1B's degenerate case) with 1F1B allowed, and goes with zbv pinned
    assert got == {(False, "1f1b"), (True, "1f1b"), (True, "interleaved-1f1b")}
    assert all(c.pp > 1 for c in enumerate_configs(MODEL, TINY, 32, 1024, "bf16",
                                                   Pins(schedule=("zbv",)),
                                                   PROFILES["torchtitan"]))


def test_solver_agrees_with_brute_force_with_the_schedules_in_the_space():
    model = build_native({"name": "n4", "num_layers": 4, "hidden_size": 256, "num_heads": 4,
                          "ffn_hidden_size": 1024, "vocab_size": 1024, "seq_len": 256})
    pins = Pins(pp=2, micro_batch=1)
    seen = set()
    for memory in (TINY.gpu.memory_gib, 0.15):  # ample; then below the ample optimum's peak
        hw = replace(TINY, gpu=replace(TINY.gpu, memory_gib=memory))
        got = search(model, hw, 8, model.default_seq_len, "bf16", pins,
                     SearchOptions(runtime=TORCHTITAN, memory_headroom=NO_HEADROOM))
        want = brute_force(model, hw, 8, model.default_seq_len, "bf16", pins, TORCHTITAN,
                           headroom=NO_HEADROOM).best
        assert want is not None and got.best is not None
        assert got.best.step_time_s == pytest.approx(want.step_time_s, rel=1e-6)
        assert got.record.status == "OPTIMAL"
        seen.add(want.config.schedule)
    assert seen & {"zb-h1", "zbv", "dualpipev"}  # the new schedules do win here


@pytest.fixture(scope="module")
def zbv_plan() -> dict:
    ev = evaluate(MODEL, AMPLE, _config(virtual_stages=2, pipeline_schedule="zbv",
                                        zero_stage=3), options=TORCHTITAN)
    doc = make_plan(ev, model_spec="n8", cluster_spec="tiny", nodes=2)
    return validate_plan(json.loads(dumps(doc)))


def test_plan_file_records_and_reads_back_the_schedule(zbv_plan):
    assert zbv_plan["parallelism"]["schedule"] == "zbv"
    plan = Plan.from_dict(zbv_plan)
    assert plan.config.schedule == "zbv" and plan.config.virtual_stages == 2
    assert plan.to_dict()["parallelism"] == zbv_plan["parallelism"]
    assert plan.evaluate().step_time_s == pytest.approx(zbv_plan["predicted"]["step_time_s"],
                                                       rel=1e-5)  # the file rounds


def test_exports_name_the_schedule_and_the_v_parts(zbv_plan):
    plan = Plan.from_dict(zbv_plan)
    tt = export_plan(plan, "torchtitan")
    assert "--parallelism.pipeline_parallel_schedule ZBVZeroBubble" in tt.text
    # 2 pp = 8 model parts, part k of rank k then 2 pp - 1 - k: torchtitan's style "v"
    line = next(x for x in tt.text.splitlines() if "module_fqns_per_model_part" in x)
    parts = [part.split(",") for part in line.split()[1:]]
    assert len(parts) == 8 and parts[0][0] == "tok_embeddings" and parts[-1][-1] == "output"
    assert [len(p) for p in parts[1:-1]] == [1] * 6
    mg = export_plan(plan, "megatron")
    assert any("schedule zbv" in w for w in mg.warnings)


def test_check_runtime_knows_who_runs_the_schedule(zbv_plan, tmp_path, capsys):
    path = tmp_path / "plan.json"
    path.write_text(dumps(zbv_plan))
    code, _, _ = run_cli(["check", str(path), "--runtime", "torchtitan"], capsys)
    assert code == 0
    code, _, err = run_cli(["check", str(path), "--runtime", "megatron"], capsys)
    assert code == 1 and "zbv pipeline schedule" in " ".join(err.split())


def test_cli_schedule_on_evaluate_and_pin(capsys):
    args = ["evaluate", "-m", "llama-3.1-8b", "-c", "dgx-h100", "--nodes", "4",
            "--global-batch", "256", "--tp", "8", "--pp", "4", "--zero", "3",
            "--runtime", "torchtitan", "--json"]
    code, out, _ = run_cli(args + ["--virtual-stages", "2", "--schedule", "dualpipev"], capsys)
    assert code == 0 and json.loads(out)["parallelism"]["schedule"] == "dualpipev"
    code, out, _ = run_cli(args + ["--schedule", "zbv"], capsys)
    assert code == 2 and "exactly 2 model chunks" in json.loads(out)["error"]["message"]
    code, out, _ = run_cli(["plan", "-m", "tiny", "-c", "tiny", "--global-batch", "16",
                            "--runtime", "torchtitan", "--pin", "schedule=zbv", "--json"],
                           capsys)
    assert code == 0 and json.loads(out)["parallelism"]["schedule"] == "zbv"
    assert load_model("tiny").num_blocks == 4


def test_report_says_the_zero_bubble_timeline_is_not_drawn(zbv_plan):
    pytest.importorskip("matplotlib")
    from planner.plan_page import page

    html = page(Plan.from_dict(zbv_plan))
    assert "not drawn for the zbv schedule" in html


def test_the_v_head_keeps_one_micro_batch():
    from planner.cost.context import make_context
    from planner.cost.terms import config_terms, layer_terms
    from planner.strategy import NO_OPTION

    head = MODEL.layers[-1]
    one = make_context(MODEL, AMPLE, _config(), TORCHTITAN)
    v = make_context(MODEL, AMPLE, _config(virtual_stages=2, pipeline_schedule="zbv"),
                     TORCHTITAN)
    last = config_terms(one).in_flight[-1]  # 1F1B's last stage: 1
    held = config_terms(v).in_flight[0] * layer_terms(v, head, NO_OPTION).act_stored_bytes
    assert last == 1.0 and held == pytest.approx(layer_terms(one, head, NO_OPTION)
                                                 .act_stored_bytes)
