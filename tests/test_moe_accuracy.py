"""The MoE accuracy bench: every calibration entry maps onto a preset of the right shape and its
published step time is read the documented way."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import moe_accuracy  # noqa: E402


@pytest.fixture(scope="module")
def result():
    return moe_accuracy.run()


def test_data_is_the_calibration_file():
    data = yaml.load(moe_accuracy.DATA.read_text(), Loader=moe_accuracy._LOADER)
    assert data["schema_version"] == 1 and len(data["entries"]) == 58
    assert moe_accuracy.entries() == tuple(data["entries"])


def test_every_entry_is_evaluated(result):
    rows, skipped = result
    assert len(rows) == 58 and not skipped  # GB300 has its preset (dgx-gb300-nvl72)
    # every row came through build_model, which raises on a shape mismatch with the preset:
    entry = copy.deepcopy(moe_accuracy.entries()[0])
    entry["model"]["layers"] += 1
    with pytest.raises(ValueError, match="preset deepseek-v3 has"):
        moe_accuracy.build_model(entry)


def test_published_times_follow_the_file(result):
    rows, _ = result
    by_id = {r.id: r for r in rows}
    measured = by_id["automodel-Qwen3-30B-A3B-H100-8gpu-bf16"]
    assert measured.time_source == "measured" and measured.time_published_s == 21.773
    derived = by_id["mbridge-26.04-Qwen3-30B-A3B-H100-16gpu-fp8"]
    assert derived.time_published_s == pytest.approx(1024 * 4096 / (8901 * 16))



def test_moe_runs_within_the_calibrated_errors(result):
    """Regression guard on the fitted MoE constants (docs/moe.md): median step-time error at
    most 8.5 % (target 10 %; 5.9 % measured), max at most 57 % (53.9 % measured, the 25.11
    Qwen3-30B-A3B run on 16 H100) over the evaluated runs, and all but the known misses of
    docs/moe.md predicted to fit (the two torchtitan Llama 4 Scout runs)."""
    rows, _ = result
    s = moe_accuracy.summary(rows)
    assert s["time_n"] >= 57 and s["rejected"] <= 1
    assert s["time_median"] <= 0.085
    assert s["time_max"] <= 0.57
    assert s["fit_ok"] >= s["fit_n"] - 2
    by_id = {r.id: r for r in rows}
    assert by_id["mbridge-26.08-DeepSeek-V3-GB200-256gpu-mxfp8"].fits_predicted  # mla_up_proj


def test_token_dropping_run_has_no_read_back(result):
    """The token-dropping Qwen3-30B-A3B run took half its dropless twins' time (0.52x): with a
    capacity factor the host issues no read-back of the token counts (planner.cost.moe). Session
    11's first re-fit put the floor at 2.5 ms a pass, above the 2.36 ms a pass this host-bound
    run took in all (ratio 0.65, +19.4 %); its second bounds the floor there (2.36 ms, with the
    read-back 2.0 ms): ratio 0.57, this run +13.5 %, its dropless twin +2.0 %. Within 20 %, and
    the read-back still charged (without it the ratio would be near 1)."""
    rows, _ = result
    by_id = {r.id: r for r in rows}
    drop = by_id["mbridge-25.09-Qwen3-30B-A3B-B200-8gpu-fp8"]
    twin = by_id["mbridge-25.11-Qwen3-30B-A3B-B200-8gpu-fp8-mx"]
    assert abs(drop.time_error) < 0.20 and abs(twin.time_error) < 0.15
    assert drop.time_predicted_s < 0.7 * twin.time_predicted_s


def test_full_iteration_cuda_graphs_follow_the_recipes():
    """Megatron-Bridge captured the whole iteration for the MXFP8 Qwen3 / DeepSeek-V3 recipes
    on GB200 / GB300 / B300 from the 26.06 container on (DeepSeek-V3 B300: later)."""
    entries = {e["id"]: e for e in moe_accuracy.entries()}
    graph = {i: moe_accuracy.cuda_graph_of(e) for i, e in entries.items()}
    assert graph["mbridge-26.06-Qwen3-30B-A3B-GB200-8gpu-mxfp8"] == "full_iteration"
    assert graph["mbridge-26.08-DeepSeek-V3-GB300-256gpu-mxfp8"] == "full_iteration"
    assert graph["mbridge-26.04.01-Qwen3-30B-A3B-GB200-8gpu-mxfp8"] == "none"
    assert graph["mbridge-26.06-DeepSeek-V3-B300-256gpu-mxfp8"] == "none"
    assert graph["mbridge-26.06-Qwen3-30B-A3B-H100-16gpu-fp8"] == "none"  # FP8-CS on H100
    assert all(g != "full_iteration" for i, g in graph.items()
               if not i.startswith("mbridge-26.0"))
    assert moe_accuracy.recompute_modules_of(
        entries["mbridge-26.08-DeepSeek-V3-GB200-256gpu-mxfp8"]) == ("mla_up_proj",)


def test_fp8_attention_follows_the_recipes(result):
    """Only the DeepSeek-V3 GB300 MXFP8 recipe runs FP8 attention
    (``fp8_dot_product_attention=True``); with it that run is within 12 % (+11.3 %; +20.7 %
    without)."""
    entries = {e["id"]: e for e in moe_accuracy.entries()}
    on = [i for i, e in entries.items() if moe_accuracy.fp8_attention_of(e)]
    assert on == ["mbridge-26.08-DeepSeek-V3-GB300-256gpu-mxfp8"]
    assert moe_accuracy.options_of(entries[on[0]]).fp8_attention
    row = {r.id: r for r in result[0]}[on[0]]
    assert abs(row.time_error) < 0.12


def test_deepseek_v3_runs_sit_on_the_recipe_layouts(result):
    """Megatron-Bridge's DeepSeek-V3 runs use the recipe's pipeline layout (16 chunks: 4 blocks
    each, the last 1 block + MTP + loss); on it, with one GEMM per local expert (32 at ep8),
    the 26.x B200 pp16 runs are within 10 %."""
    entries = {e["id"]: e for e in moe_accuracy.entries()}
    b200 = [i for i in entries if "DeepSeek-V3-B200" in i and entries[i]["training"]["pp"] == 16]
    assert len(b200) == 6
    entry = entries["mbridge-26.04-DeepSeek-V3-B200-256gpu-mxfp8"]
    model = moe_accuracy.build_model(entry)
    assert moe_accuracy.layout_of(entry, model, moe_accuracy.config_of(entry)) == \
        (4,) * 15 + (1,)
    by_id = {r.id: r for r in result[0]}
    for i in b200:
        if i.startswith("mbridge-26."):
            assert abs(by_id[i].time_error) < 0.10, i


def test_deepseek_v3_configs_carry_the_layout():
    """The schedule term sees the recipe's chunks (ParallelConfig.pipeline_layout), 'm' and
    all where the run has the MTP module, without it where it has none (25.11)."""
    entries = {e["id"]: e for e in moe_accuracy.entries()}
    with_mtp = entries["mbridge-26.04-DeepSeek-V3-B200-256gpu-mxfp8"]
    model = moe_accuracy.build_model(with_mtp)
    config = moe_accuracy.config_with_layout(with_mtp, model)
    assert model.num_mtp == 1 and config.pipeline_layout == "Et*4|(t*4|)*14tmL"
    config.validate(model, moe_accuracy.build_cluster(with_mtp))
    no_mtp = entries["mbridge-25.11-DeepSeek-V3-GB200-256gpu-bf16"]
    model = moe_accuracy.build_model(no_mtp)
    config = moe_accuracy.config_with_layout(no_mtp, model)
    assert model.num_mtp == 0 and "m" not in config.pipeline_layout
    config.validate(model, moe_accuracy.build_cluster(no_mtp))
    qwen = entries["automodel-Qwen3-30B-A3B-H100-8gpu-bf16"]
    assert moe_accuracy.config_with_layout(qwen, moe_accuracy.build_model(qwen)).pipeline_layout \
        == ""


def test_automodel_fake_gate_routes_consecutive_experts():
    """NeMo AutoModel's FakeBalancedGate gives token t the experts t k .. t k + k - 1 mod E:
    group-limited routing over E / k groups, one per token; a DeepSeek-V3 token then meets one
    node of EP64 (7/8 of it remote), not 3.15 (node-limited) or 4.59."""
    from planner.cost import moe
    entries = {e["id"]: e for e in moe_accuracy.entries()}
    fake = [i for i, e in entries.items()
            if "fake balanced gate" in (e["training"].get("moe_routing") or "")]
    assert fake and all(i.startswith("automodel-") for i in fake)
    mlp = next(b.mlp for b in moe_accuracy.build_model(
        entries["automodel-DeepSeek-V3-H100-256gpu-bf16"]).blocks() if b.mlp.is_moe)
    assert (mlp.expert_groups, mlp.groups_per_token) == (32, 1)
    assert moe.remote_domain_copies(8, 8, 32, 1) == pytest.approx(7 / 8)
    assert moe.distinct_ranks(64, 8, 32, 1) == pytest.approx(2 * (1 - 0.5 ** 8))
    mb = next(b.mlp for b in moe_accuracy.build_model(
        entries["mbridge-26.04-DeepSeek-V3-B200-256gpu-mxfp8"]).blocks() if b.mlp.is_moe)
    assert (mb.expert_groups, mb.groups_per_token) == (8, 4)  # the model's own routing


def test_ep_comm_overlap_follows_the_recipes(result):
    """Megatron-Bridge recipes with moe_a2a_overlap=True hide EP_COMM_OVERLAP of the
    all-to-all: Qwen3 H100 25.11-26.02.01, DeepSeek-V3 B200 ep32 from 26.04.01, the MXFP8
    full-iteration recipes on GB200 / GB300 from 26.06; the B200 ep32 run, all-to-all over
    InfiniBand, is then within 15 %."""
    entries = {e["id"]: e for e in moe_accuracy.entries()}
    on = {i for i, e in entries.items() if moe_accuracy.ep_comm_overlap_of(e)}
    assert {"mbridge-25.11-Qwen3-30B-A3B-H100-16gpu-fp8-cs",
            "mbridge-26.02.01-Qwen3-30B-A3B-H100-16gpu-fp8",
            "mbridge-26.04.01-DeepSeek-V3-B200-256gpu-mxfp8",
            "mbridge-26.06-DeepSeek-V3-GB200-256gpu-mxfp8",
            "mbridge-26.08-Qwen3-30B-A3B-GB300-8gpu-mxfp8"} <= on
    assert not on & {"mbridge-25.09-Qwen3-30B-A3B-H100-16gpu-fp8",
                     "mbridge-26.04-Qwen3-30B-A3B-H100-16gpu-fp8",
                     "mbridge-26.04-DeepSeek-V3-B200-256gpu-mxfp8",
                     "mbridge-26.04.01-DeepSeek-V3-GB200-256gpu-mxfp8",
                     "mbridge-26.06-DeepSeek-V3-B300-256gpu-mxfp8"}
    assert all(i.startswith("mbridge-") for i in on)
    b200 = entries["mbridge-26.04.01-DeepSeek-V3-B200-256gpu-mxfp8"]
    assert moe_accuracy.options_of(b200).moe.a2a_overlap == moe_accuracy.EP_COMM_OVERLAP
    rows, _ = result
    by_id = {r.id: r for r in rows}
    assert abs(by_id["mbridge-26.04.01-DeepSeek-V3-B200-256gpu-mxfp8"].time_error) < 0.15
    regimes = {name: n for name, n, _, _ in moe_accuracy.regime_bias(rows)}
    assert sum(regimes.values()) == moe_accuracy.summary(rows)["time_n"]


def test_automodel_fits_with_bf16_adam_states(result):
    """NeMo AutoModel trains a bf16 model with torch.optim.Adam (``torch-bf16``: 8 bytes per
    parameter, no fp32 master): its Qwen3-30B-A3B run on 8 H100 fits (it ran); with the
    16-byte mixed-precision layout the same states alone take 57 GiB and it does not."""
    from planner.config import RUNTIME_STATE_BYTES
    from planner.cost.memory import zero_state_bytes
    assert zero_state_bytes(8e9, 8, 3, RUNTIME_STATE_BYTES["torch-bf16"]).total == 8e9
    rows, _ = result
    row = {r.id: r for r in rows}["automodel-Qwen3-30B-A3B-H100-8gpu-bf16"]
    assert row.fits_predicted
    entry = next(e for e in moe_accuracy.entries() if e["id"] == row.id)
    assert moe_accuracy.state_layout_of(entry, None) == "torch-bf16"
    params = moe_accuracy.build_model(entry).params
    mixed = zero_state_bytes(params, 8, 3, RUNTIME_STATE_BYTES["zero-paper"]).total / 2**30
    bf16 = zero_state_bytes(params, 8, 3, RUNTIME_STATE_BYTES["torch-bf16"]).total / 2**30
    assert mixed > 56 and bf16 < 29


def test_twin_floor_is_the_spread_of_identical_inputs(result):
    """Runs with identical inputs get one prediction; the least max error over them is
    (b - a) / (a + b): on the file, the 26.02 / 26.02.01 Qwen3-30B-A3B runs on 16 H100."""
    rows, _ = result
    floor, twins = moe_accuracy.twin_floor(rows)
    assert sorted(twins) == ["mbridge-26.02-Qwen3-30B-A3B-H100-16gpu-fp8",
                             "mbridge-26.02.01-Qwen3-30B-A3B-H100-16gpu-fp8"]
    by_id = {r.id: r for r in rows}
    a, b = sorted(by_id[t].time_published_s for t in twins)
    assert floor == pytest.approx((b - a) / (a + b)) and 0.27 < floor < 0.29
    p = 2 * a * b / (a + b)  # the best common prediction misses both by the floor
    assert p / a - 1 == pytest.approx(floor) and 1 - p / b == pytest.approx(floor)
    assert max(abs(r.time_error) for r in rows if r.time_error is not None) >= floor


def test_automodel_te_backend_fuses_elementwise(result):
    """NeMo AutoModel's MoE benchmark configs run Transformer Engine's RMSNorm, fused RoPE and
    the experts' fused weighted SwiGLU: the element-wise traffic takes the fused factor
    (``compiled_elementwise``), not the torchtitan profile's eager one. Hand-computed: a
    Qwen3-30B-A3B block's forward differs between the two by exactly its element-wise bytes
    over HBM bandwidth times the difference of the factors; the run's step time comes within
    35 % of the measured 21.77 s (+52.6 % with the eager factor)."""
    from dataclasses import replace
    from planner.calibration.store import shipped
    from planner.cost.compute import Shard, elementwise_bytes, hbm_bytes_per_s, layer_compute
    rows, _ = result
    row = {r.id: r for r in rows}["automodel-Qwen3-30B-A3B-H100-8gpu-bf16"]
    entry = next(e for e in moe_accuracy.entries() if e["id"] == row.id)
    assert moe_accuracy.fused_elementwise_of(entry)
    constants = shipped().constants
    fused = moe_accuracy.options_of(entry)
    assert fused.elementwise_factor == constants.get("compiled_elementwise")
    eager = replace(fused, elementwise_factor=constants.get("unfused_elementwise.torchtitan"))
    assert eager.elementwise_factor > 2 * fused.elementwise_factor
    block = next(layer for layer in moe_accuracy.build_model(entry).layers
                 if layer.mlp is not None and layer.mlp.is_moe)
    gpu = moe_accuracy.build_cluster(entry).gpu
    shard = Shard(micro_batch=4, seq_len=4096, ep=8)
    delta = layer_compute(block, shard, gpu, eager).fwd_s \
        - layer_compute(block, shard, gpu, fused).fwd_s
    expected = elementwise_bytes(block, shard, fused) / hbm_bytes_per_s(gpu) \
        * (eager.elementwise_factor - fused.elementwise_factor)
    assert delta == pytest.approx(expected, rel=1e-9) and delta > 0
    assert row.time_error is not None and row.time_error <= 0.35


def test_nemo2_recipes_drop_tokens_and_follow_their_csv(result):
    """NeMo 2.x's MoE perf recipes (25.02 / 25.04 / 25.07 containers) train token-dropping,
    padded to capacity 1 (MegatronTokenDropCallback): no read-back. The perf scripts' csv rows
    set Mixtral 8x22B's etp to 1 on B200 and CUDA-graph every layer of Mixtral 8x7B (25.04) and
    Llama 4 Scout (25.07); from r2.3.0 the loss is Transformer Engine's fused kernel; the Mixtral
    recipes leave TP communication overlap off. Scout on 64 GB200 was +17.9 % with dropless
    eager inputs and an fp32 loss; it is within 5 % now."""
    entries = {e["id"]: e for e in moe_accuracy.entries()}
    nemo = {i: e for i, e in entries.items() if moe_accuracy.nemo_release_of(e)}
    assert sorted(nemo) == sorted(i for i in entries if i.startswith("nemo25"))
    for e in nemo.values():
        options = moe_accuracy.options_of(e)
        assert options.moe.capacity_factor == 1.0 and not options.moe.host_synchronised
    b200 = "nemo2502-Mixtral-8x22B-B200-256gpu-fp8-seq64k"
    gb200 = "nemo2504-Mixtral-8x22B-GB200-256gpu-fp8-seq64k"
    scout = "nemo2507-Llama4-Scout-GB200-64gpu-fp8"
    assert moe_accuracy.config_of(entries[b200]).mesh.expert_tp == 1
    assert moe_accuracy.config_of(entries[gb200]).mesh.expert_tp == 2  # no csv row: the default
    assert moe_accuracy.options_of(entries[b200]).tp_comm_overlap == 0.0
    graphs = {i: moe_accuracy.cuda_graph_of(e) for i, e in nemo.items()}
    assert {i for i, g in graphs.items() if g == "moe"} == {
        "nemo2504-Mixtral-8x7B-GB200-64gpu-fp8", scout}
    assert moe_accuracy.cross_entropy_of(entries[scout]) == "fused"
    assert moe_accuracy.cross_entropy_of(entries[b200]) == "fp32"  # r2.2.0 sets no TE loss
    assert moe_accuracy.regime_of(entries[scout]) == "llama-4-scout, layer graph"
    # other frameworks keep their rules
    assert moe_accuracy.nemo_recipe_of(entries["mbridge-26.08-DeepSeek-V3-GB300-256gpu-mxfp8"]) \
        is None
    row = {r.id: r for r in result[0]}[scout]
    assert row.fits_predicted and abs(row.time_error) < 0.05
    unknown = copy.deepcopy(entries[scout])
    unknown["cluster"]["system"] = "DGX-B200"
    with pytest.raises(LookupError, match="no NeMo recipe row"):
        moe_accuracy.nemo_recipe_of(unknown)


def test_automodel_deepseek_runs_read_as_their_recipe_runs(result):
    """NeMo AutoModel's DeepSeek-V3 recipe (NVIDIA-NeMo/Automodel @89e3a9fdd) recomputes every
    block (activation_checkpointing: true), keeps FSDP weights gathered under PP
    (reshard_after_forward=not pp_enabled) and runs its GA 4 as four schedule.step calls of 8
    micro-batches: the 1,024-GPU run read -21.9 % with 40 of 61 blocks recomputed, resharded
    weights and one schedule of 32; now -14 %, the 256-GPU run (GA 1) within 2 %."""
    entries = {e["id"]: e for e in moe_accuracy.entries()}
    big = entries["automodel-DeepSeek-V3-H100-1024gpu-bf16"]
    small = entries["automodel-DeepSeek-V3-H100-256gpu-bf16"]
    assert moe_accuracy.recompute_of(big) is moe_accuracy.Recompute.FULL
    assert moe_accuracy.config_of(big).schedule_calls == 4
    assert moe_accuracy.config_of(big).micro_batches_per_call == 8
    assert moe_accuracy.config_of(small).schedule_calls == 1
    # Megatron-Core runs one schedule a step; an unstated recomputation stays the bench's pick
    mbridge = entries["mbridge-25.09-DeepSeek-V3-H100-1024gpu-fp8"]
    assert moe_accuracy.config_of(mbridge).schedule_calls == 1
    assert moe_accuracy.recompute_of(mbridge) is None
    rows, _ = result
    by_id = {r.id: r for r in rows}
    assert -0.16 < by_id[big["id"]].time_error < -0.10
    assert abs(by_id[small["id"]].time_error) < 0.02
    assert by_id[big["id"]].fits_predicted and by_id[small["id"]].fits_predicted


def test_host_floor_grid_stays_under_the_host_bound_run():
    """bench/moe_fit.py's host-floor axis stops at the time a pass of the token-dropping
    Qwen3-30B-A3B run (no read-back) took in all: 14.51 s / (48 MoE layers x 64 micro-batches x
    2 passes) = 2.36 ms."""
    from bench import moe_fit

    bound = moe_fit.host_bound_s()
    assert bound == pytest.approx(14.51 / (48 * 64 * 2), abs=1e-5)
    assert max(moe_fit.HOSTS_S) <= bound
    from planner.cost import moe
    assert moe.HOST_PER_LAYER_PASS_S <= bound
