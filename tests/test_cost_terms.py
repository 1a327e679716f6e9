"""One set of cost terms: the CP-SAT model and evaluate() are built from the same records.

1. Over random small instances, the ILP objective of the placement CP-SAT returns equals
   ``evaluate()`` of that placement within 1e-6 (relative), and the placement fits.
2. Mutation: dropping any single term from the ILP (``solve_stages(drop_terms={name})``) breaks
   that agreement on at least one of a fixed set of instances (the ILP's objective differs from
   evaluate's, or it returns a placement evaluate says does not fit). A term the ILP could do
   without would be a term the ILP does not really use.
3. The bounds are bounds: no placement the solver finds beats them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusters import load_cluster
from models.native import build_native
from planner.config import ParallelConfig, RuntimeOptions
from planner.moe import MoeOptions
from planner.cost.context import make_context
from planner.cost.model import evaluate
from planner.cost.pipeline import SCHEDULES
from planner.errors import PlannerError
from planner.cost.terms import SOLVER_CONFIG_TERMS, SOLVER_LAYER_TERMS, LayerTerms
from planner.hardware import GIB, Cluster, HostMemory
from planner.ir import ModelGraph
from planner.solve.bounds import memory_lower_bound, time_lower_bound
from planner.solve.costs import stage_problem
from planner.solve.inner import solve_stages
from planner.solve.search import uniform_placement
from planner.solve.space import enumerate_configs
from planner.strategy import BLOCK_OPTIONS, PER_LAYER_LAYOUTS, block_options

REL = 1e-6
TINY = load_cluster("tiny")  # 2 nodes x 4 GPUs, NVLink inside a node, Ethernet across
PROPERTY = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def native(blocks: int, hidden: int = 128, heads: int = 4, seq_len: int = 128, **extra) -> ModelGraph:
    spec = {"name": f"n{blocks}-h{hidden}", "num_layers": blocks, "hidden_size": hidden,
            "num_heads": heads, "ffn_hidden_size": 4 * hidden, "vocab_size": 512,
            "seq_len": seq_len}
    spec.update(extra)
    return build_native(spec)


def with_memory(cluster: Cluster, memory_gib: float) -> Cluster:
    return replace(cluster, gpu=replace(cluster.gpu, memory_gib=memory_gib))


def solve_and_evaluate(model, cluster, config, runtime, drop=frozenset(), options=BLOCK_OPTIONS):
    """(ILP objective s, evaluate() of the ILP's placement) for one configuration, or None."""
    ctx = make_context(model, cluster, config, runtime)
    problem = stage_problem(ctx, options)
    hint = uniform_placement(model, cluster, config, runtime)
    result = solve_stages(problem, hint=hint.placement if hint else None, drop_terms=drop,
                          deterministic_time=2.0)
    if result.placement is None:
        return None
    return result, evaluate(model, cluster, config, result.placement, runtime)


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


# -- 1. the ILP objective is evaluate() ------------------------------------------------------

def schedules_of(model, cluster, config) -> list[ParallelConfig]:
    """``config`` under every pipeline schedule that validates with its chunks per rank."""
    out = []
    for name in SCHEDULES:
        candidate = replace(config, pipeline_schedule=name)
        try:
            candidate.validate(model, cluster)
        except PlannerError:
            continue
        out.append(candidate)
    return out


@st.composite
def instances(draw):
    blocks = draw(st.integers(2, 6))
    moe = draw(st.booleans())
    extra = {"tied_embeddings": draw(st.booleans())}
    if moe:
        extra["moe"] = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 256}
    model = native(blocks, hidden=draw(st.sampled_from([64, 128, 256])),
                   seq_len=draw(st.sampled_from([64, 128])), **extra)
    nodes = draw(st.sampled_from([1, 2]))
    cluster = replace(TINY, num_nodes=nodes)
    runtime = RuntimeOptions(overlap_grad_reduce=draw(st.booleans()),
                             overlap_param_gather=draw(st.booleans()),
                             runtime=draw(st.sampled_from(["megatron", "deepspeed-bf16"])),
                             attention_kernel=draw(st.sampled_from(["flash", "eager"])),
                             dropout=draw(st.booleans()))
    configs = list(enumerate_configs(model, cluster, 8 * nodes, model.default_seq_len, "bf16"))
    config = draw(st.sampled_from(configs))
    if config.pp > 1:  # a pipeline schedule the configuration can run (planner.cost.pipeline)
        config = draw(st.sampled_from(schedules_of(model, cluster, config)))
    # memory between "almost nothing fits" and "everything fits": the constraint binds often
    memory = draw(st.floats(0.05, 2.0))
    return model, with_memory(cluster, memory), config, runtime


@PROPERTY
@given(instances())
def test_ilp_objective_equals_evaluate(inst):
    model, cluster, config, runtime = inst
    out = solve_and_evaluate(model, cluster, config, runtime)
    if out is None:
        return  # nothing fits this configuration: the ILP proves it (checked in the oracle tests)
    result, ev = out
    assert ev.fits, (config, result.placement)
    assert relative(result.objective_s, ev.step_time_s) <= REL, (config, result.placement)


# -- 2. every term matters -------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    model: ModelGraph
    config: ParallelConfig
    cluster: Cluster = TINY
    runtime: RuntimeOptions = RuntimeOptions(overlap_grad_reduce=False,
                                             overlap_param_gather=False)
    options: tuple = BLOCK_OPTIONS


DENSE = native(4, tied_embeddings=True)
MOE = native(4, moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 256})
SHORT = native(4, hidden=256, seq_len=32)
SHORT_MOE = native(4, hidden=256, seq_len=32,
                   moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 1024})
DENSE_FIRST_MOE = native(4, moe={"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 256,
                                 "shared_ffn_hidden_size": 256, "first_dense_layers": 1})
CASES = [
    # pipeline, tensor parallel with SP, tied embeddings, ZeRO-1 over an inter-node group
    Case("pp2-tp2-zero1", DENSE, ParallelConfig(tp=2, pp=2, dp=2, global_batch=16, seq_len=128,
                                                sp=True, zero_stage=1, micro_batch=1)),
    # eager attention with dropout: the masks' memory and the attention dropout's traffic on
    # the scores (planner.cost.compute.EAGER_DROPOUT_BYTES), in every pass and recomputation
    Case("eager-dropout-tp2", DENSE, ParallelConfig(tp=2, pp=2, dp=2, global_batch=16,
                                                    seq_len=128, sp=True, zero_stage=1,
                                                    micro_batch=2),
         runtime=RuntimeOptions(attention_kernel="eager", dropout=True)),
    Case("pp2-v2-zero0", DENSE, ParallelConfig(tp=1, pp=2, dp=4, global_batch=16, seq_len=128,
                                               zero_stage=0, micro_batch=2, virtual_stages=2)),
    # zero-bubble schedules: ZB-H1's W credit; DualPipeV's V placement (head on rank 0), its
    # in-flight count and its extra backward (planner/cost/pipeline.py)
    Case("pp2-zb-h1", DENSE, ParallelConfig(tp=1, pp=2, dp=4, global_batch=16, seq_len=128,
                                            micro_batch=1, pipeline_schedule="zb-h1")),
    Case("pp2-dualpipev", DENSE, ParallelConfig(tp=1, pp=2, dp=4, global_batch=16, seq_len=128,
                                                micro_batch=1, virtual_stages=2,
                                                pipeline_schedule="dualpipev")),
    # 6 blocks in 2 x 2 chunks of 2, 2, 1, 1 (+ the head): the operation order's excess over
    # the closed form on unequal chunks (planner.cost.pipeline_sim.uneven_chunk_excess)
    Case("pp2-v2-uneven", native(6), ParallelConfig(tp=1, pp=2, dp=4, global_batch=16,
                                                    seq_len=128, micro_batch=2,
                                                    virtual_stages=2)),
    # ZeRO-2/3 over 8 ranks on two nodes, short sequences: the per-micro-batch traffic is
    # exposed (it exceeds the compute it overlaps with)
    Case("zero2-exposed", SHORT, ParallelConfig(tp=1, pp=1, dp=8, global_batch=16, seq_len=32,
                                                zero_stage=2, micro_batch=1)),
    Case("zero3-exposed", SHORT_MOE, ParallelConfig(tp=1, pp=1, dp=8, ep=2, global_batch=16,
                                                    seq_len=32, zero_stage=3, micro_batch=1)),
    Case("zero2-moe-exposed", SHORT_MOE, ParallelConfig(tp=1, pp=1, dp=8, ep=2, global_batch=16,
                                                        seq_len=32, zero_stage=2, micro_batch=1)),
    # ZeRO-3 without the MoE host floor (a full-iteration CUDA graph): the experts' ZeRO-3
    # traffic then has only the compute to hide behind, not the device's wait on the host
    # (planner.cost.moe.host_wait_split_s)
    Case("zero3-moe-graphed", SHORT_MOE, ParallelConfig(tp=1, pp=1, dp=8, ep=2, global_batch=16,
                                                        seq_len=32, zero_stage=3, micro_batch=1),
         runtime=RuntimeOptions(overlap_grad_reduce=False, overlap_param_gather=False,
                                moe=MoeOptions(cuda_graph="full_iteration"))),
    # ZeRO++ hpZ: the backward's and most forwards' gathers inside the node (4 of 8 ranks)
    Case("zero3-hpz-exposed", SHORT, ParallelConfig(tp=1, pp=1, dp=8, global_batch=16,
                                                    seq_len=32, zero_stage=3, micro_batch=1,
                                                    hpz=4)),
    Case("zero3-pp2", DENSE, ParallelConfig(tp=1, pp=2, dp=4, global_batch=16, seq_len=128,
                                            zero_stage=3, micro_batch=1)),
    # routed experts: ep 2 inside dp 4, so the experts' states shard over 2 ranks
    Case("moe-zero1", MOE, ParallelConfig(tp=1, pp=2, dp=4, ep=2, global_batch=16, seq_len=128,
                                          zero_stage=1, micro_batch=1)),
    Case("moe-zero0", MOE, ParallelConfig(tp=1, pp=2, dp=4, ep=2, global_batch=16, seq_len=128,
                                          zero_stage=0, micro_batch=1)),
    Case("moe-zero3", MOE, ParallelConfig(tp=1, pp=2, dp=4, ep=2, global_batch=16, seq_len=128,
                                          zero_stage=3, micro_batch=1)),
    # one GEMM per local expert (Transformer Engine's GroupedLinear): 2 local experts each
    # grouped GEMM (planner.cost.moe.EXPERT_GEMM_S), in every pass the solver prices
    Case("moe-per-expert-gemms", MOE, ParallelConfig(tp=1, pp=2, dp=4, ep=2, global_batch=16,
                                                     seq_len=128, zero_stage=1, micro_batch=1),
         runtime=RuntimeOptions(expert_gemm_per_expert=True)),
    # calibrated runtime behaviour: NCCL slowing overlapped compute, a fixed per-micro-batch
    # overhead (planner/calibration), per-phase FSDP exposure with gradient-reduce overlap
    Case("zero3-slowdown", DENSE, ParallelConfig(tp=1, pp=2, dp=4, global_batch=16, seq_len=128,
                                                 zero_stage=3, micro_batch=1),
         runtime=RuntimeOptions(comm_slowdown=0.3, micro_batch_overhead_s=2e-4)),
    Case("zero1-slowdown", DENSE, ParallelConfig(tp=2, pp=2, dp=2, global_batch=16, seq_len=128,
                                                 sp=True, zero_stage=1, micro_batch=1),
         runtime=RuntimeOptions(comm_slowdown=0.3, tp_comm_overlap=0.5)),
    # optimizer offload (planner/cost/offload.py) with less room on the host than any layer's
    # states need: when GPU memory binds, the ILP must not offload (the host binds)
    Case("offload-host-binds", DENSE, ParallelConfig(tp=1, pp=1, dp=8, global_batch=128,
                                                     seq_len=128, zero_stage=0, micro_batch=2),
         cluster=replace(TINY, cpu_memory=HostMemory(memory_gib=3e5 / GIB, link_gbytes_per_s=25,
                                               memory_bandwidth_gbytes_per_s=50, cpu_cores=8,
                                               core_gflops=50)),
         options=block_options(offload=(False, True))),
    # activation offload (planner/cost/offload.py) over two stages (host bytes x the most
    # micro-batches in flight) on a slow host link, so the copies are partly exposed
    Case("act-offload-pp2", DENSE, ParallelConfig(tp=1, pp=2, dp=4, global_batch=16,
                                                  seq_len=128, zero_stage=1, micro_batch=1),
         cluster=replace(TINY, cpu_memory=HostMemory(memory_gib=1.0, link_gbytes_per_s=6,
                                               memory_bandwidth_gbytes_per_s=50, cpu_cores=8,
                                               core_gflops=50)),
         options=block_options(act_offload=(False, True))),
    # per-layer layouts in a MoE model: the dense block and the MoE blocks (attention and
    # shared expert on their own tensor degree, routed experts on the expert mesh) each pick
    # one, resharded between them (SP: an all-to-all); the embedding and head too
    Case("moe-layouts-pp2", DENSE_FIRST_MOE,
         ParallelConfig(tp=2, pp=2, dp=2, ep=2, global_batch=16, seq_len=128, zero_stage=1,
                        micro_batch=2, sp=True),  # tight memory: MoE blocks at tp*2
         options=block_options(layouts=PER_LAYER_LAYOUTS)),
]


def variants(case: Case):
    """The case with ample memory, and with the capacity just below what its unconstrained
    optimum needs (so memory binds and recomputation is worth choosing)."""
    ample = with_memory(case.cluster, 64.0)
    yield ample
    out = solve_and_evaluate(case.model, ample, case.config, case.runtime, options=case.options)
    assert out is not None
    peak = out[1].peak_memory_bytes
    yield with_memory(case.cluster, (peak - max(peak * 1e-4, 4096)) / GIB)


@pytest.fixture(scope="module")
def prepared():
    return [(case, cluster) for case in CASES for cluster in variants(case)]


def test_every_case_agrees_without_mutation(prepared):
    for case, cluster in prepared:
        out = solve_and_evaluate(case.model, cluster, case.config, case.runtime,
                                 options=case.options)
        assert out is not None, case.name
        result, ev = out
        assert ev.fits and relative(result.objective_s, ev.step_time_s) <= REL, case.name


def test_term_lists_cover_the_records():
    reported = {"dense_params", "expert_params", "hw_flops"}
    assert set(SOLVER_LAYER_TERMS) | reported == {f for f in LayerTerms.__dataclass_fields__}


@pytest.mark.parametrize("term", SOLVER_LAYER_TERMS + SOLVER_CONFIG_TERMS)
def test_dropping_a_term_breaks_the_agreement(prepared, term):
    seen = []
    for case, cluster in prepared:
        out = solve_and_evaluate(case.model, cluster, case.config, case.runtime,
                                 frozenset({term}), case.options)
        if out is None:
            continue
        result, ev = out
        if not ev.fits or relative(result.objective_s, ev.step_time_s) > REL:
            return  # detected
        seen.append(case.name)
    pytest.fail(f"dropping {term!r} from the ILP changed nothing on {seen}")


# -- 3. bounds ---------------------------------------------------------------------------------

@PROPERTY
@given(instances())
def test_bounds_hold(inst):
    model, cluster, config, runtime = inst
    problem = stage_problem(make_context(model, cluster, config, runtime))
    out = solve_and_evaluate(model, cluster, config, runtime)
    if out is None:
        return
    _, ev = out
    assert time_lower_bound(problem) <= ev.step_time_s * (1 + 1e-12)
    assert memory_lower_bound(problem) <= ev.peak_memory_bytes * (1 + 1e-12)
