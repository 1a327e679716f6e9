"""Held-out check of the shipped defaults on two more published dense pre-training runs that are
in no calibration file (bench/data/*.yaml; tests/test_out_of_file_dense.py enforces it):

* Llama 3 405B on 8,192 and 16,384 H100 (Llama Team, AI @ Meta, "The Llama 3 Herd of Models",
  arXiv:2407.21783, v1 of 2024-07-23), Table 4 and §3.3;
* MT-NLG 530B on 280, 350 and 420 DGX A100 (Smith et al. 2022, "Using DeepSpeed and Megatron to
  Train Megatron-Turing NLG 530B", arXiv:2201.11990), §2.4 (throughput) and §3.2 (model).

OPT-175B (Zhang et al. 2022) is not held out: it is ``opt175B-main-run`` in
bench/data/published_runs.yaml.

Nothing is fitted: each row is evaluated exactly as ``shardplan evaluate`` evaluates its command
line (:func:`cli_args`; the same library calls as cli/commands.py ``evaluate``), with the
shipped constants.

Llama 3 405B, per field:

* Table 4: GPUs, TP, CP, PP, DP, sequence length, batch size per DP (sequences), tokens per
  batch (16M), TFLOP/s per GPU, BF16 MFU. Table 3: 126 layers, model dimension 16,384, FFN
  53,248, 128 heads, 8 KV heads, SwiGLU, RoPE; the planner's preset llama-3.1-405b has that shape
  (vocabulary 128,256 as released; Table 3 rounds it to 128,000).
* Third row: Table 4 prints DP 4, which matches neither its GPU column (8 x 16 x 16 x 4 = 8,192,
  not 16,384) nor its tokens column (4 x 16 x 131,072 = 8.4M, not 16M); DP 8 matches both.
  Inferred: DP 8.
* §3.3.2: FSDP that "shards optimizer states and gradients, but for model shards we do not
  reshard after forward", FP32 gradient accumulation over the micro-batches and an FP32
  reduce-scatter: one weight gather and one gradient reduce-scatter a step, the weights whole
  from the forward to the end of the backward -> ``--zero 1`` under megatron (its distributed
  optimizer does exactly that), ``--zero 3`` under torchtitan (FSDP2 under PP keeping the
  weights gathered, the profile's pp_keeps_unsharded; ``--zero 2`` would reduce-scatter every
  micro-batch); "we could pre-train Llama 3 on sequences of 8K tokens
  without activation checkpointing" -> ``--recompute none`` (8K rows; the 128K row, whose
  ranks hold 131,072 / 16 = 8,192 tokens as the 8K rows' do, inferred the same); an
  interleaved schedule with V stages per rank, "we reduce one Transformer layer each from the
  first and the last stages ... the first model chunk on the first stage has only the
  embedding, and the last model chunk on the last stage has only output projection and loss":
  chunks of one layer, so 126 + 2 = 128 chunks = PP 16 x V 8, the layout ``E|(t|)*126L``
  (V 8 inferred from those two sentences). Micro-batch: not stated; inferred 1 (the
  per-DP batch of 16 or 32 sequences are the micro-batches).
* §3.3.1: H100 80GB HBM3 at 700 W, eight per server on NVLink, 400 Gb/s RoCE per GPU tuned "to
  provide equivalent performance" to the InfiniBand clusters: the dgx-h100 preset (8 x 400 Gb/s
  per node; the preset's full-bisection spine is the pod's "full bisection bandwidth" of 3,072
  GPUs; the 1:7 aggregation layer above the pods, modelled as scalable units of 384 nodes
  under a 7x oversubscribed spine, moves no row by 0.1 %: tests/test_out_of_file_dense.py).
* Measured step time: Table 4's TFLOP/s are model FLOPs (BF16 MFU = TFLOP/s / 989: 430 ->
  43 %, 400 -> 40.4 % printed 41 %, 380 -> 38 %), the paper's MFU being Chowdhery et al.'s
  (PaLM, App. B): 6 N + 12 L H Q T per token, N = 405e9 (§3.2; 6 N x 15.6T tokens = the stated
  3.8e25 FLOPs). step = tokens per batch x (6 N + 12 L H Q T) / (GPUs x TFLOP/s). The 12 L H Q T
  term counts the full s x s attention; the 128K row's measured time rests on it (47 % of its
  FLOPs, a causal 6 L H Q T would make the row 28 % shorter), and that row trained with a
  document mask (§3.2) whose saving no input here describes.

MT-NLG 530B, per field:

* §2.4: global batch 1920, 280 / 350 / 420 DGX A100 servers (A100 80GB, 8 x 200 Gb/s HDR:
  §2.3, Selene), iteration time 60.1 / 50.2 / 44.4 s (measured; no FLOP convention needed),
  126 / 121 / 113 TFLOP/s per GPU. §2.2 / §3.2: 8-way tensor slicing inside a node, 35-way
  pipeline across nodes (DP 8 / 10 / 12), 105 layers, hidden 20480, 128 heads, sequence
  2048; Megatron-LM GPT (GPT-2 BPE vocabulary 50,257, padded by Megatron-LM to 51,200 at TP 8).
* Inferred: full activation recomputation (the TFLOP/s column is Narayanan et al.'s Eq. 3,
  which counts a recomputed forward: it reproduces the column to 0.5 TFLOP/s,
  tests/test_out_of_file_dense.py); micro-batch 1; DeepSpeed's pipeline engine with its
  default partition (1F1B, not interleaved); ZeRO stage 1 (DeepSpeed's documentation of the
  run); fp16, eager attention, dropout 0.1 (Megatron-LM's default of 2021, as
  bench/out_of_file.py).

Run: ``python bench/out_of_file_dense.py`` (``--markdown`` prints the docs/accuracy.md section).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.out_of_file import RANK_TIE, breakdown  # noqa: E402
from clusters import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.calibration.session import runtime_setup  # noqa: E402
from planner.config import ParallelConfig  # noqa: E402
from planner.cost.model import Evaluation, evaluate  # noqa: E402
from planner.pipeline_layout import parse_layout  # noqa: E402
from planner.placement import runtime_placement  # noqa: E402
from planner.strategy import LayerOption, Recompute  # noqa: E402

LLAMA3_SOURCE = ("Llama Team, AI @ Meta 2024, The Llama 3 Herd of Models (arXiv:2407.21783), "
                 "Table 4 and §3.3")
MTNLG_SOURCE = ("Smith et al. 2022, Using DeepSpeed and Megatron to Train Megatron-Turing NLG "
                "530B (arXiv:2201.11990), §2.4")

# Llama 3 405B (Table 3; §3.2 for N)
LLAMA3_MODEL = "llama-3.1-405b"  # models/presets/index.yaml: the Table 3 shape
LLAMA3_PARAMS = 405e9  # §3.2 "405B trainable parameters"; 6 N x 15.6T = 3.8e25 FLOPs (§1)
LLAMA3_LAYERS, LLAMA3_HEADS, LLAMA3_HEAD_DIM = 126, 128, 128  # Table 3: 16,384 / 128 = 128
H100_BF16_PEAK_TFLOPS = 989.0  # H100 SXM dense BF16 (NVIDIA datasheet; Table 4's MFU base)
# §3.3.2: chunks of one layer, the first only the embedding, the last only the loss
LLAMA3_LAYOUT = "E|(t|)*126L"

# MT-NLG 530B (§3.2; Megatron-LM GPT conventions)
MTNLG_LAYERS, MTNLG_HIDDEN, MTNLG_HEADS = 105, 20480, 128
MTNLG_VOCAB = 51_200  # GPT-2 BPE 50,257 padded to a multiple of 128 x TP 8 (Megatron-LM)
MTNLG_SEQ = 2048
MTNLG_BATCH = 1920
MTNLG_TP, MTNLG_PP = 8, 35
# Megatron-LM's default dropout 0.1 (2021; not stated by the paper), as bench/out_of_file.py
MTNLG_DROPOUT = True


@dataclass(frozen=True)
class Llama3Row:
    """One row of Table 4."""
    gpus: int
    tp: int
    cp: int
    pp: int
    dp_printed: int  # Table 4's DP column as printed
    seq_len: int
    batch_per_dp: int  # sequences per DP rank per step
    tflops: float  # Table 4, model TFLOP/s per GPU
    mfu_pct: int  # Table 4, BF16 MFU

    @property
    def dp(self) -> int:
        """GPUs / (TP x CP x PP): the printed DP where it matches (module doc: row 3)."""
        return self.gpus // (self.tp * self.cp * self.pp)

    @property
    def name(self) -> str:
        return f"llama3-405b {self.gpus // 1024}K seq {self.seq_len // 1024}K"

    @property
    def global_batch(self) -> int:
        return self.dp * self.batch_per_dp

    @property
    def tokens(self) -> int:
        return self.global_batch * self.seq_len

    @property
    def flops_per_token(self) -> float:
        """PaLM App. B: 6 N + 12 L H Q T."""
        return (6 * LLAMA3_PARAMS
                + 12 * LLAMA3_LAYERS * LLAMA3_HEADS * LLAMA3_HEAD_DIM * self.seq_len)

    @property
    def measured_step_time_s(self) -> float:
        return self.tokens * self.flops_per_token / (self.gpus * self.tflops * 1e12)

    @property
    def achieved(self) -> float:
        """The source's throughput measure for the rank pairs: TFLOP/s per GPU."""
        return self.tflops


LLAMA3_ROWS = (
    Llama3Row(8192, 8, 1, 16, 64, 8192, 32, 430, 43),
    Llama3Row(16384, 8, 1, 16, 128, 8192, 16, 400, 41),
    Llama3Row(16384, 8, 16, 16, 4, 131072, 16, 380, 38),
)


@dataclass(frozen=True)
class MtnlgRow:
    """One of §2.4's three throughput measurements."""
    nodes: int
    step_time_s: float  # measured iteration time
    tflops: float  # reported, Eq. 3 (recomputation counted)

    @property
    def gpus(self) -> int:
        return 8 * self.nodes

    @property
    def dp(self) -> int:
        return self.gpus // (MTNLG_TP * MTNLG_PP)

    @property
    def name(self) -> str:
        return f"mt-nlg-530b {self.nodes} nodes"

    @property
    def measured_step_time_s(self) -> float:
        return self.step_time_s

    @property
    def achieved(self) -> float:
        return self.tflops


MTNLG_ROWS = (MtnlgRow(280, 60.1, 126), MtnlgRow(350, 50.2, 121), MtnlgRow(420, 44.4, 113))


def eq3_flops_mtnlg() -> float:
    """Narayanan et al. 2021 Eq. 3 for MT-NLG's step (recomputation counted)."""
    b, s, l, h, v = MTNLG_BATCH, MTNLG_SEQ, MTNLG_LAYERS, MTNLG_HIDDEN, MTNLG_VOCAB
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def mtnlg_model_file(folder: Path) -> Path:
    """MT-NLG as a native model file (Megatron-LM GPT, models/presets/gpt3-175b.yaml's
    conventions: learned positions, LayerNorm, biases, 4h GeLU MLP, tied embeddings)."""
    path = folder / "mt-nlg-530b.yaml"
    path.write_text(
        "shardplan_model: 1\n"
        f"name: mt-nlg-530b\nnum_layers: {MTNLG_LAYERS}\nhidden_size: {MTNLG_HIDDEN}\n"
        f"num_heads: {MTNLG_HEADS}\nffn_hidden_size: {4 * MTNLG_HIDDEN}\ngated_mlp: false\n"
        f"vocab_size: {MTNLG_VOCAB}\nseq_len: {MTNLG_SEQ}\nmax_seq_len: {MTNLG_SEQ}\n"
        "position_embedding: learned\nnorm: layernorm\nbias: true\ntied_embeddings: true\n")
    return path


@dataclass(frozen=True)
class Reading:
    """How a source's runs are read: the runtime flags of ``shardplan evaluate``."""
    label: str
    runtime: str
    attention: str
    zero: int


# the runtime profiles nearest each source's stack (Meta's: PyTorch FSDP under PP, read both
# as megatron and as torchtitan; MT-NLG's: Megatron-DeepSpeed)
# Llama 3's FSDP keeps the weights gathered from the forward to the end of the backward and
# accumulates FP32 gradients over the micro-batches (§3.3.2): one gather and one reduce-scatter
# per step. Megatron runs that as its distributed optimizer (--zero 1: whole weights, an FP32
# gradient buffer, sharded optimizer states); torchtitan as FSDP2 under PP with
# reshard_after_forward off (--zero 3, the profile's pp_keeps_unsharded). --zero 2 would
# reduce-scatter every micro-batch; the paper's gradients accumulated over the micro-batches,
# then reduce-scattered, read as one reduce-scatter a step.
LLAMA3_READINGS = (Reading("megatron", "megatron", "flash", 1),
                   Reading("torchtitan", "torchtitan", "flash", 3))
MTNLG_READINGS = (Reading("deepspeed", "deepspeed", "eager", 1),
                  Reading("megatron-eager", "megatron", "eager", 1))


@dataclass(frozen=True)
class Invocation:
    """Everything ``shardplan evaluate`` takes for one row under one reading."""
    model: str
    cluster: str
    nodes: int
    seq_len: int | None
    global_batch: int
    tp: int
    pp: int
    cp: int
    micro_batch: int
    zero: int
    recompute: str
    sp: bool
    dtype: str
    dropout: bool
    runtime: str
    attention: str
    layout: str = ""

    def args(self) -> list[str]:
        out = ["evaluate", "-m", self.model, "-c", self.cluster, "--nodes", str(self.nodes),
               "--global-batch", str(self.global_batch), "--tp", str(self.tp), "--pp",
               str(self.pp), "--cp", str(self.cp), "--micro-batch", str(self.micro_batch),
               "--zero", str(self.zero), "--recompute", self.recompute,
               "--sp" if self.sp else "--no-sp", "--dtype", self.dtype,
               "--attention", self.attention, "--runtime", self.runtime,
               "--dropout" if self.dropout else "--no-dropout", "--json"]
        if self.seq_len is not None:
            out[5:5] = ["--seq-len", str(self.seq_len)]
        if self.layout:
            out += ["--pipeline-layout", self.layout]
        return out


def llama3_invocation(r: Llama3Row, reading: Reading) -> Invocation:
    return Invocation(LLAMA3_MODEL, "dgx-h100", r.gpus // 8, r.seq_len, r.global_batch, r.tp,
                      r.pp, r.cp, 1, reading.zero, "none", True, "bf16", False, reading.runtime,
                      reading.attention, LLAMA3_LAYOUT)


def mtnlg_invocation(r: MtnlgRow, reading: Reading, model_path: Path) -> Invocation:
    return Invocation(str(model_path), "dgx-a100-80g", r.nodes, None, MTNLG_BATCH, MTNLG_TP,
                      MTNLG_PP, 1, 1, reading.zero, "full", False, "fp16", MTNLG_DROPOUT,
                      reading.runtime,
                      reading.attention)


def run_invocation(inv: Invocation) -> Evaluation:
    """What cli/commands.py ``evaluate`` computes for ``inv.args()`` (shipped constants)."""
    graph = load_model(inv.model, seq_len=inv.seq_len)
    hw = load_cluster(inv.cluster, nodes=inv.nodes)
    setup = runtime_setup(hw, inv.runtime, inv.dtype, inv.attention, None, dropout=inv.dropout)
    hw = setup.cluster
    dp = hw.num_gpus // (inv.tp * inv.pp * inv.cp)
    v = parse_layout(inv.layout).virtual_stages(inv.pp) if inv.layout else 1
    config = ParallelConfig(tp=inv.tp, pp=inv.pp, dp=dp, cp=inv.cp, ep=1, etp=0,
                            global_batch=inv.global_batch, seq_len=graph.default_seq_len,
                            sp=inv.sp, zero_stage=inv.zero, micro_batch=inv.micro_batch,
                            virtual_stages=v, dtype=inv.dtype, dp_shard=0,
                            pipeline_schedule="", hpz=0, pipeline_layout=inv.layout)
    config.validate(graph, hw)
    placement = runtime_placement(graph, config, setup.profile,
                                  LayerOption(Recompute(inv.recompute)), "")
    return evaluate(graph, hw, config, placement, options=setup.options)


def step_band_s(inv: Invocation, ev: Evaluation) -> tuple[float, float]:
    """The 80 % step-time band ``shardplan evaluate`` prints with ``ev`` (the shipped
    profile's bands: planner/calibration/session.py prediction_intervals)."""
    from planner.calibration.session import prediction_intervals
    hw = load_cluster(inv.cluster, nodes=inv.nodes)
    setup = runtime_setup(hw, inv.runtime, inv.dtype, inv.attention, None, dropout=inv.dropout)
    low, high = prediction_intervals(ev, setup.calibration)["step_time_s_interval"]
    return low, high


@dataclass
class Result:
    source: str
    row: Llama3Row | MtnlgRow
    reading: str
    invocation: Invocation
    ev: Evaluation

    @property
    def in_band(self) -> bool:
        low, high = step_band_s(self.invocation, self.ev)
        return low <= self.row.measured_step_time_s <= high

    @property
    def predicted_s(self) -> float:
        return self.ev.step_time_s

    @property
    def error(self) -> float:
        return self.predicted_s / self.row.measured_step_time_s - 1


def run_all() -> dict[str, dict[str, list[Result]]]:
    """{source: {reading: results}}."""
    out: dict[str, dict[str, list[Result]]] = {"llama3": {}, "mtnlg": {}}
    for reading in LLAMA3_READINGS:
        out["llama3"][reading.label] = [
            Result("llama3", r, reading.label, inv, run_invocation(inv))
            for r in LLAMA3_ROWS for inv in [llama3_invocation(r, reading)]]
    with tempfile.TemporaryDirectory() as tmp:
        path = mtnlg_model_file(Path(tmp))
        for reading in MTNLG_READINGS:
            out["mtnlg"][reading.label] = [
                Result("mtnlg", r, reading.label, inv, run_invocation(inv))
                for r in MTNLG_ROWS for inv in [mtnlg_invocation(r, reading, path)]]
    return out


def rank_pairs(results: list[Result]) -> tuple[int, int]:
    """Pairs of one source's rows whose measured per-GPU throughput differs by RANK_TIE or
    more, and how many of them the prediction orders as measured (per-GPU work per step is the
    rows' FLOPs over GPUs: throughput ~ FLOPs / (GPUs x step))."""
    agree = total = 0
    for a, b in itertools.combinations(results, 2):
        ma, mb = a.row.achieved, b.row.achieved
        if abs(ma / mb - 1) < RANK_TIE:
            continue
        total += 1
        # predicted throughput = measured throughput x measured / predicted step time
        pa = ma / (1 + a.error)
        pb = mb / (1 + b.error)
        agree += (ma > mb) == (pa > pb)
    return agree, total


def _stats(errs: list[float]) -> str:
    return (f"median |error| {statistics.median(abs(e) for e in errs):.1%}, max "
            f"{max(abs(e) for e in errs):.1%}, median signed {statistics.median(errs):+.1%}")


def summary_line(all_results: dict[str, dict[str, list[Result]]] | None = None) -> str:
    """One line for docs/accuracy.md's summary."""
    all_results = all_results or run_all()
    parts = []
    for source, readings in all_results.items():
        name = "Llama 3 405B" if source == "llama3" else "MT-NLG 530B"
        parts.append(f"{name} ({len(next(iter(readings.values())))} runs) " + ", ".join(
            f"{label} {statistics.median(abs(x.error) for x in rs):.1%} (max "
            f"{max(abs(x.error) for x in rs):.1%}, signed "
            f"{statistics.median(x.error for x in rs):+.1%}, ranks "
            f"{'/'.join(map(str, rank_pairs(rs)))})"
            for label, rs in readings.items()))
    return ("- out of file, newer dense runs (not a target; \"Out of file: Llama 3 405B and "
            "MT-NLG 530B\"): step-time median |error| by reading: " + "; ".join(parts))


def ran_not_fitting(all_results: dict[str, dict[str, list[Result]]] | None = None
                    ) -> list[str]:
    """The runs (all of which ran) that a reading predicts not to fit, each with the readings
    that say so: the out-of-file target is that no run that ran is predicted not to fit."""
    all_results = all_results or run_all()
    readings_of: dict[str, list[str]] = {}
    for readings in all_results.values():
        for label, results in readings.items():
            for x in results:
                if not x.ev.fits:
                    readings_of.setdefault(x.row.name, []).append(label)
    return [f"{name} ({', '.join(labels)})" for name, labels in readings_of.items()]


def section(all_results: dict[str, dict[str, list[Result]]] | None = None) -> list[str]:
    """docs/accuracy.md's section on these runs (rendered by bench/accuracy.py)."""
    all_results = all_results or run_all()
    lines = ["", "## Out of file: Llama 3 405B and MT-NLG 530B (held out, not fitted)", "",
             "Generated by `python bench/out_of_file_dense.py` (its docstring cites every "
             "input and marks the inferred ones). Sources: " + LLAMA3_SOURCE + "; "
             + MTNLG_SOURCE + ". In no calibration file (OPT-175B is, "
             "`opt175B-main-run`, so it is not here); nothing is re-fitted. Each row is the "
             "`shardplan evaluate` command line of the bench script with the shipped "
             "constants. Llama 3: `-c dgx-h100 --recompute none --pipeline-layout "
             f"'{LLAMA3_LAYOUT}'` (pp 16 x 8 chunks of one layer), micro-batch 1, `--zero 1` "
             "under megatron (its distributed optimizer) and `--zero 3` under torchtitan (FSDP "
             "keeping the weights gathered under PP): the paper's one gather and one FP32 "
             "reduce-scatter a step (§3.3.2); measured "
             "step time = tokens x PaLM's 6N + 12LHQT / (GPUs x TFLOP/s). MT-NLG: "
             "`-c dgx-a100-80g --tp 8 --pp 35 --recompute full --zero 1 --dtype fp16 "
             "--dropout`, micro-batch 1, the measured iteration times.", ""]
    for source, readings in all_results.items():
        for label, results in readings.items():
            agree, total = rank_pairs(results)
            inside = sum(x.in_band for x in results)
            lines.append(f"- {source} `--runtime {results[0].invocation.runtime} --attention "
                         f"{results[0].invocation.attention}`: {_stats([x.error for x in results])}"
                         f"; ordered as measured in {agree}/{total} pairs; measured inside the "
                         f"80 % band in {inside}/{len(results)}")
    lines += ["", "| run | GPUs | tp cp pp dp | measured s | reading | predicted s | error | "
              "fits (peak GiB) |", "|---|---:|---|---:|---|---:|---:|---|"]
    for readings in all_results.values():
        for label, results in readings.items():
            for x in results:
                r, inv = x.row, x.invocation
                lines.append(
                    f"| {r.name} | {r.gpus} | {inv.tp} {inv.cp} {inv.pp} {r.dp} | "
                    f"{r.measured_step_time_s:.2f} | {label} | {x.predicted_s:.2f} | "
                    f"{x.error:+.1%} | {'yes' if x.ev.fits else 'no'} "
                    f"({x.ev.peak_memory_bytes / 2**30:.1f}) |")
    lines += reading(all_results)
    return lines


def narayanan_530b_error() -> tuple[float, float]:
    """The error of bench/out_of_file.py's megatron-eager reading on Narayanan et al.'s 530B row
    (the same model as MT-NLG, Megatron-LM 2021 on 2,520 GPUs), and its TFLOP/s per GPU."""
    from bench import out_of_file as oof
    row = next(r for r in oof.ROWS if r.hidden == MTNLG_HIDDEN and r.layers == MTNLG_LAYERS)
    with tempfile.TemporaryDirectory() as tmp:
        ev = oof.evaluate_row(row, oof.model_file(row, Path(tmp)), "megatron", "eager")
    return ev.step_time_s / row.measured_step_time_s - 1, row.tflops_per_gpu


def peak_rank_memory(ev: Evaluation) -> dict[str, float]:
    """The memory of the rank with the most activations, as the cost model builds it: one
    block's stored activations per micro-batch, the micro-batches in flight on the rank, its
    blocks, activations, weights and gradients."""
    from planner.cost.context import make_context
    from planner.cost.terms import config_terms, layer_terms
    from planner.ir import LayerKind
    ctx = make_context(ev.model, ev.cluster, ev.config, ev.options)
    stage = max(ev.stages, key=lambda s: s.memory.activations)
    blocks = [i for i in stage.layers if ev.model.layers[i].kind is LayerKind.BLOCK]
    stored = layer_terms(ctx, ev.model.layers[blocks[0]], ev.placement.options[blocks[0]])
    m = stage.memory
    return {"rank": stage.index, "blocks": len(blocks),
            "layer_gib": stored.act_stored_bytes / 2**30,
            "in_flight": config_terms(ctx).in_flight[stage.index],
            "acts_gib": m.activations / 2**30, "params_gib": m.params / 2**30,
            "grads_gib": m.grads / 2**30}


def _peak_gib(x: Result) -> float:
    return x.ev.peak_memory_bytes / 2**30


def _order_8k(meg: list[Result], tt: list[Result], short: list[int]) -> str:
    """Whether each reading orders the two 8K rows (430 > 400 TFLOP/s) as measured."""
    a, b = short
    ok = [label for label, rs in (("megatron", meg), ("torchtitan", tt))
          if rank_pairs([rs[a], rs[b]]) == (1, 1)]
    what = ("Both readings order" if len(ok) == 2 else
            f"Only {ok[0]} orders" if ok else "Neither reading orders")
    return (f"{what} the 8K rows as measured ({LLAMA3_ROWS[a].tflops:g} > "
            f"{LLAMA3_ROWS[b].tflops:g} TFLOP/s: DP 128 halves the micro-batches, so the "
            "bubble's share doubles).")


def reading(all_results: dict[str, dict[str, list[Result]]]) -> list[str]:
    """The short reading under the table (numbers from the results)."""
    meg, tt = all_results["llama3"]["megatron"], all_results["llama3"]["torchtitan"]
    short = [i for i, r in enumerate(LLAMA3_ROWS) if r.seq_len == 8192]
    long = next(i for i, r in enumerate(LLAMA3_ROWS) if r.cp > 1)
    r3 = LLAMA3_ROWS[long]
    causal_s = r3.tokens * (6 * LLAMA3_PARAMS + 6 * LLAMA3_LAYERS * LLAMA3_HEADS
                            * LLAMA3_HEAD_DIM * r3.seq_len) / (r3.gpus * r3.tflops * 1e12)
    b_meg, b_tt = breakdown(meg[0].ev), breakdown(tt[0].ev)

    def work(b: dict[str, float]) -> float:
        return b["forward"] + b["backward"] + b["tp_comm"]

    peaks = [_peak_gib(x) for rs in (meg, tt) for x in rs]
    mem = peak_rank_memory(meg[0].ev)
    ds = all_results["mtnlg"]["deepspeed"]
    nar, nar_tflops = narayanan_530b_error()
    tf = [eq3_flops_mtnlg() / x.predicted_s / x.row.gpus / 1e12 for x in ds]
    return ["", "Reading. Llama 3 (Meta's own PyTorch stack, FSDP under PP): the torchtitan "
            "profile (PyTorch-native, FSDP2 keeping the weights gathered under PP) reads the 8K "
            "rows at " + " and ".join(f"{tt[i].error:+.1%}" for i in short) + "; the megatron "
            "profile at " + " and ".join(f"{meg[i].error:+.1%}" for i in short) + ", its fused "
            "kernels and overlapped tensor-parallel collectives: forward + backward + TP "
            f"communication of the slowest stage {work(b_meg):.2f} s a step against "
            f"torchtitan's {work(b_tt):.2f} s (8K GPUs), measured step "
            f"{meg[0].row.measured_step_time_s:.2f} s. " + _order_8k(meg, tt, short)
            + " The 128K row's measured "
            f"time rests on the FLOP count: {r3.measured_step_time_s:.2f} s with PaLM's "
            f"12LHQT, {causal_s:.2f} s with a causal 6LHQT; the predictions "
            f"({meg[long].predicted_s:.2f} s megatron, {tt[long].predicted_s:.2f} s torchtitan) "
            "lie between, and its document mask is not modelled. Memory, a miss: every reading "
            f"predicts {min(peaks):.0f}-{max(peaks):.0f} GiB on the 80 GB H100 (8K GPUs: "
            f"{mem['layer_gib']:.2f} GiB of activations per layer and micro-batch, "
            f"{mem['in_flight']:.1f} micro-batches in flight on rank {mem['rank']} under "
            f"interleaved 1F1B, {mem['blocks']} layers there: {mem['acts_gib']:.0f} GiB; "
            f"beside them {mem['params_gib']:.1f} "
            f"GiB of weights and {mem['grads_gib']:.1f} GiB of FP32 gradients) where the paper "
            "trained the 8K rows without checkpointing after freeing each stage's input and "
            "output tensors and with a schedule whose micro-batches in flight (N) it tunes "
            "(§3.3.2): the planner would refuse these runs. MT-NLG (Megatron-DeepSpeed): the "
            "deepspeed reading is "
            + ", ".join(f"{x.error:+.1%}" for x in ds) + f" (predicted {tf[0]:.0f}-{tf[-1]:.0f}"
            f" Eq. 3 TFLOP/s per GPU against {ds[0].row.tflops:g}-{ds[-1].row.tflops:g}) and "
            "orders the three node counts as measured; on the same model trained by "
            f"Megatron-LM (Narayanan et al.'s 530B row, {nar_tflops:g} TFLOP/s) the "
            f"megatron-eager reading is {nar:+.1%}: the DeepSpeed run's "
            f"{1 - ds[0].row.tflops / nar_tflops:.0%} lower throughput is predicted only in part "
            "(its micro-batch and recomputation are inferred; the 1F1B bubble, "
            f"{breakdown(ds[0].ev)['bubble']:.1f} s of {ds[0].predicted_s:.1f} s, is charged)."]


def text_report(all_results: dict[str, dict[str, list[Result]]]) -> str:
    lines = []
    for source, readings in all_results.items():
        lines.append(f"Held out: {LLAMA3_SOURCE if source == 'llama3' else MTNLG_SOURCE}")
        for label, results in readings.items():
            agree, total = rank_pairs(results)
            lines.append(f"== {source} reading {label}: {_stats([x.error for x in results])}, "
                         f"ranks {agree}/{total}")
            for x in results:
                parts = ", ".join(f"{k} {v:.2f}" for k, v in breakdown(x.ev).items())
                lines.append(f"{x.row.name:>28} measured {x.row.measured_step_time_s:7.2f} s "
                             f"predicted {x.predicted_s:7.2f} s {x.error:+7.1%} peak "
                             f"{x.ev.peak_memory_bytes / 2**30:6.1f} GiB fits {x.ev.fits}: {parts}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", action="store_true",
                    help="print the docs/accuracy.md section instead")
    args = ap.parse_args(argv)
    results = run_all()
    print("\n".join(section(results)) if args.markdown else text_report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
