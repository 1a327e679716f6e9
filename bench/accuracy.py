"""Cost-model accuracy on measured training runs, judged per regime (where the search lands).

Re-evaluates every usable entry of the calibration files in ``bench/data/``
(``published_runs.yaml``: 2022 Megatron-DeepSpeed on A100; ``modern_runs.yaml``: FSDP / FSDP2,
Megatron-Core and NeMo on H100 and A100; ``newer_gpu_runs.yaml``: NeMo / Megatron-Bridge on H100,
B200, GB200) with the library's shipped constants (``planner/calibration/defaults.yaml``) and
writes ``docs/accuracy.md``: per regime (runtime, GPU generation, parallelism regime) the median
and max |error|, the median **signed** error (bias: negative = the model is optimistic, i.e.
predicts a faster step than measured), the coverage of the 80 % error bands, fit verdicts, and
for every source that measured several configurations of one model on one GPU type, the share
of pairs the model orders as measured. How entries become inputs: planner/calibration/runs.py.

    python bench/accuracy.py              # writes docs/accuracy.md, prints the summary
    python bench/accuracy.py --baseline   # the library's raw preset values, no calibration
    python bench/accuracy.py --check      # exit 1 when a target is missed
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.calibration.bands import Band, BandTable, band  # noqa: E402
from planner.calibration.constants import Constants  # noqa: E402
from planner.calibration.predict import Prediction, predict  # noqa: E402
from planner.calibration.regimes import REGIME_TITLES, band_labels  # noqa: E402
from clusters.calibration_runs import load_runs  # noqa: E402
from planner.calibration.runs import CalibrationRun  # noqa: E402
from planner.calibration.store import shipped  # noqa: E402
from planner.config import RUNTIME_STATE_BYTES  # noqa: E402
from planner.safe_input import parse_yaml, read_text  # noqa: E402
from bench import landing, unknown_fields  # noqa: E402
from planner.cost.memory import zero_state_bytes  # noqa: E402

DATA = ROOT / "bench" / "data"
FILES = ("published_runs.yaml", "modern_runs.yaml", "newer_gpu_runs.yaml")
DOC = ROOT / "docs" / "accuracy.md"

# Targets (issue 10).
TIME_MEDIAN_TARGET = 0.07
BIAS_TARGET = 0.05
MEMORY_MEDIAN_TARGET = 0.07
COVERAGE_RANGE = (0.70, 0.90)
RANK_TIE = 0.03  # measured throughputs closer than this are a tie (measurement noise)
RANK_TARGET = 0.90

# What the same translation of the same entries gave on the cost model before issue 10
# (commit e3e93ec: pooled ZeRO-3 overlap, no NCCL slowdown, no per-runtime allocator or
# element-wise fusion, Megatron attention-core "selective" for torchtitan, no FP8 activation
# storage, no inferred partial recomputation). Measured once with this script at that commit.
BEFORE = """\
Measured with this script on the cost model before issue 10 (commit e3e93ec, preset constants):
step time median |error| 8.2 %, max 46.5 %, median signed -3.1 % over 158 runs; by regime:
FSDP / ZeRO-3 -9.3 % (median 9.3 %), DP -17.8 % (17.8 %), TP-heavy -4.2 % (17.1 %, max 46.5 %),
deep PP +0.8 %, PP +1.3 %, CP -2.4 %; by runtime: torchtitan -38.8 %, fsdp -9.6 %, megatron
-2.1 % (median 11.8 %), deepspeed -1.2 %; memory median 3.7 % (torchtitan +70 %); fit verdicts
83/94 (6 torchtitan and 3 MPT runs that ran predicted not to fit); rank agreement 285/409
(70 %, counting pairs of identical configurations)."""

# The same scripts at the end of the second session of issue 10 (commit 3b267eb), for the
# before -> after of the third (docs/accuracy.md, "Since session 3 began").
SESSION_BEFORE = {"time median": "3.2%", "time max": "29.2%", "time bias": "+0.9%",
                  "torchtitan bias": "-0.7%", "TP-heavy bias": "+1.5%", "memory median": "3.0%",
                  "fit verdicts": "92/94", "coverage time / memory": "76% / 75%",
                  "rank agreement": "342/388 (88%)",
                  "held out: time median": "6.7%", "held out: time max": "47.0%",
                  "held out: time bias": "-2.0%", "held out: rank agreement": "289/388 (74%)",
                  "held out: fit verdicts": "89/94",
                  "held out: band coverage, time / memory": "46% / -"}
SESSION_BEFORE_COMMIT = "3b267eb"

CAUSES = """\
* **Bands where the search lands (session 5; no calibration number moves).** The searched
  plans are placed in the calibration data ("Where the search lands"). Of the ways a pick
  leaves its regime's data, one no band said was recomputation: the BLOOM 176B search drops it
  on 47 of 70 blocks where every DeepSpeed run recomputed all of them. Each band label now
  records its runs' block recomputation policies (planner/calibration/bands.py), and a
  prediction with another policy gets a widened band and an ``extrapolating`` note naming the
  policy and the band (step time or peak memory); calibration runs are inside their own
  labels by construction, so every in-sample coverage above is unchanged.
* **Priors and ties (session 3; held out: median 6.7 -> 4.0 %, rank 74 -> 88 %).** A
  constant learned from one source fell back to an arbitrary start when that source was held
  out (DeepSpeed's per-block overhead to 0 without the BLOOM chronicles: the micro-batch effect
  lost; FSDP1's element-wise traffic to "fused" without llm-foundry). The fit now regularises
  every constant weakly toward a physical prior (planner/calibration/constants.py: eager PyTorch
  about twice the fused element-wise bytes, ~1 ms host time per eager block pass, TP overlap
  mid-range) and shrinks constants that are one physical quantity in several runtimes toward
  their common mean (planner/calibration/fit.py ``TIES``: the caching allocator's overhead, the
  eager runtimes' per-block host time and element-wise traffic, TP-comm overlap, FP8 GEMM
  efficiency): a per-runtime offset from a shared value, so a held-out runtime inherits the
  others' value. The folds also converge now (constants scaled by their plausible range,
  finite differences grouped by the runs a constant reaches): the previous folds stopped after
  5 iterations and scattered constants no held-out run informs (Megatron's TP overlap 0.05-0.54
  across folds that did not hold out a Megatron source).
* **Bands for new runs (session 3).** A source's runs share a setup, so the in-sample
  residuals of a regime understate the error on a source the fit never saw (the previous
  bands covered 46 % of held-out runs). The shipped step-time bands combine each regime's
  in-sample spread with the spread between sources, ``sigma^2 = s^2 + tau^2``, ``tau`` the
  robust spread of the held-out sources' median errors (bench/holdout.py,
  bench/calibrate_defaults.py). Measured without the source itself (each source's bands from
  the other sources' spread) they cover 71 % of held-out runs; in-sample 85 %. Memory bands
  stay in-sample: only two sources publish memory, too few for a spread, and the in-sample
  memory bands already cover 70 % of held-out runs.
* **BLOOM-prequel sweep** (DeepSpeed pipeline engine, 64 runs, 339 of the ranked pairs).
  (1) DeepSpeed splits every stage-boundary activation and gradient over the tensor group
  (deepspeed/runtime/pipe/engine.py: ``is_pipe_partitioned = is_grad_partitioned =
  is_model_parallel``): each rank sends 1/tp across nodes and the receiver all-gathers it over
  NVLink, Narayanan et al. 2021 §4.1. The model sent the whole tensor over Omni-Path, so pp12
  cost 8 % more than pp4 where the chronicle measured them equal (profile flag
  ``pipe_partitioned``, planner/cost/terms.py). (2) Measured throughput rises 16 % from
  micro-batch 1 to 4 at tp 8 but not at tp 2 or 4: a fixed cost per block and pass, the work
  of a block being what tp 8 x mbs 1 makes small. A host overhead per block per forward,
  backward and recomputed forward (``block_overhead_s.<runtime>``, fitted) reproduces it; a
  per-stage per-micro-batch overhead cannot (it penalises deep pipelines instead, and stays at
  0 in the fit: ``microbatch_overhead_s``).
* **Megatron-Bridge GB200 FSDP against tp2 pp4 vp5** (24 pairs, 0 ordered right): the FP8-CS
  recipes of these rows offload 40 blocks' activations to Grace memory
  (``cpu_offloading_num_layers=40``, Megatron-Bridge scripts/performance/configs/llama/
  llama3_workload_base_configs.py; now ``training.cpu_offloading_num_layers`` in the entries,
  listed under inferred_fields). Their recomputation had been inferred as the least that fits
  (52 of 80 blocks fully recomputed): 13-24 % too slow. Evaluated with the published setting
  (no recomputation; the copies overlap compute) and memory not judged: the model has no host
  offload.
* **torchtitan** (-14.9 %): the source states the Grand Teton GPUs' HBM2e "2.4 TB/sec" and a
  peak "between SXM and NVL" (hardware section, footnote 2): bench/clusters/
  grand-teton-h100-96g.yaml now carries 2.4 TB/s and the middle of the stated range
  (912.5 TFLOP/s BF16); torch.compile's residual element-wise traffic
  (``compiled_elementwise``) and torchao Float8's GEMM efficiency
  (``fp8_relative_efficiency.torchtitan``: amax and casts outside the GEMM) are constants of
  their own instead of "fully fused" and Transformer Engine's.
* **torchtitan FSDP + PP memory** (held out; no calibration run has it): FSDP2 under PP keeps
  the stage's weights gathered (``reshard_after_forward = not pp_enabled``) and accumulates
  unsharded fp32 gradients until the last micro-batch; one gather and one reduce-scatter per
  step (profile flag ``pp_keeps_unsharded``; dense models only: the one MoE run with FSDP
  under PP, AutoModel's DeepSeek-V3 pp4 on 80 GB, fits only resharded). Llama 3.1 405B tp8 pp8 dp8 on 512 H100
  (torchtitan benchmark Table 5): 22.9 -> 58.3 GiB predicted for 1F1B (82.5 measured), 25.1 ->
  60.4 GiB interleaved (72.7 measured).
* **BF16_Optimizer's reduction copy and DeepSpeed's layer partition (session 6).** The 20
  BLOOM runs of 2022-02-28 and the main run name DeepSpeed's ``partition_method
  'type:transformer|embedding'`` (tr11-176B-ml.slurm ``--pp-partition-method``): the embedding
  and the tied head count as one layer each, so the first stage holds one block fewer than
  Megatron's split, which the model had applied. These runs are now costed with DeepSpeed's
  own partition (``training.pp_partition``; planner/calibration/predict.py
  ``deepspeed_type_stages``: runtime/pipe/module.py ``_partition_layers``, utils.py
  ``partition_balanced``). That exposed what the extra block had hidden: their memory came out
  3-9 GiB low (about 1.7 bytes per parameter of the first stage) while the fp16 runs before
  that date fit. The cause is DeepSpeed's data-parallel reduction of BF16_Optimizer's
  gradients (ZeRO stage 0, as BLOOM ran it: pipe/engine.py ``_bf16_reduce_grads`` ->
  engine.py ``allreduce_no_retain`` -> ``allreduce_bucket``): every bucket is one whole flat
  fp32 gradient group, which ``flatten`` returns as a view, and ``allreduce_bucket`` casts it
  to the engine's ``communication_data_type``, bf16 for a bf16 run: a bf16 copy of the whole
  gradient (2 bytes per parameter), allocated after the pipeline flush as one block the cached
  activation blocks cannot hold, all-reduced in bf16 (2 bytes on the wire, not 4) and copied
  back. The ``deepspeed-bf16`` layout carries it (``StateBytes.reduce_copy_bytes``,
  planner/config.py). Re-fitted: memory median 3.0 -> 2.9 %, memory band coverage 72 -> 80 %,
  DeepSpeed's allocator overhead 0.31 -> 0.29, fit verdicts 92 -> 93 of 94 (the 184B mbs 1
  out-of-memory run is now predicted out of memory); step time 2.8 -> 3.0 % median, rank
  agreement unchanged at 342/388. (The fp32 copy a many-tensor bucket makes was tried first:
  4 bytes per parameter over-predicts these runs by 10-15 % and was not kept; it does not
  occur, since each of these buckets holds one tensor. Charging 4 bytes on the wire instead of
  2 would give a 2.8 % step-time median; the source says 2.) Held out (bench/holdout.py
  re-run): time median 4.0 -> 4.6 %, max 32.3 -> 31.0 %, rank 341/388 unchanged, memory median
  4.5 -> 3.9 %; the shipped bands' coverage of a source they were built without fell to 65 %
  step time (71 % before; nominal 80 %) and rose to 75 % memory (70 %).
* **`microbatch_overhead_s` and `nccl_compute_slowdown` at 0**: the first is physical for what
  it models (no per-stage cost is visible once the per-block overhead is in); the second is
  not identified by these data: every regime that overlaps NCCL with compute is explained as
  well by the overlap fraction (TP: the exposed share is ``(1 - o) + o s``, so s trades against
  o; ZeRO-3 and DP overlap leave little exposed). It stays at its lower bound; a
  microbenchmark of GEMM slowdown under concurrent NCCL would pin it.
* **Bands**: the spread of each regime is now robust (median and 1.4826 x MAD): a few runs the
  model cannot represent had widened every band of their regime (memory coverage 92 %).
* **Fit verdicts**: the verdict hinge of the fit has a 2 % margin, so runs that ran at the edge
  of HBM (MPT-7B at mbs 6 on 80 GB) are not left a fraction of a percent over capacity."""

MISSES = """\
* BLOOM-prequel out-of-memory run (1): the 206B l82 run is predicted at 64.1 GiB, as the
  203B l94 run with the same degrees that ran (62.4 GiB measured, 64.4 predicted). Their
  states, activations and DeepSpeed's buffers differ by under 1 GiB: BF16_Optimizer keeps one
  flat fp32 gradient buffer (no per-tensor buckets), its all-reduce runs after the pipeline
  flush when activations are freed, and the updated bf16 partitions are gathered in place.
  Nothing physical separates the pair in these terms; not special-cased. With the memory
  bands (what ``check`` reports) the three MPT runs that ran at 99-100 % of HBM are "fits only
  at the optimistic end"; the 206B verdict is wrong at every quantile. (The 184B
  dp16/tp4/pp6/mbs1 run, predicted within 1.3 GiB of capacity before session 6, is now
  predicted at 89.6 GiB, band 84.9-96.5: out of memory at every quantile, as measured.)
* Rank agreement (all pairs) stops short of 90 %: every misordered pair is in the BLOOM-prequel
  sweep, whose own repeats of one configuration differ by up to 6 %; 36 of the 46 trade pipeline
  depth against data parallelism. The measured gaps are small: pp 12 dp 4 ran 1.8-2.6 % slower
  than pp 6 dp 8 at equal micro-batch (0221 and 0225 tables), the model says 4.6-5.8 %. Looked
  at again term by term (session 5) for DeepSpeed's pipeline engine of February 2022:
  (1) the 250k-vocabulary head on the last stage (about one block's GEMM time, never recomputed:
  DeepSpeed's ``_is_checkpointable`` checkpoints only the transformer layers of GPTModelPipe) is
  not the cause: evaluated with the head's forward and backward at zero time (a one-off
  diagnostic, not a term) the sweep orders 349/388 pairs, 7 more. (2) DeepSpeed's stage sends
  and receives are separate blocking instructions (``SendActivation``, ``RecvGrad``, ...,
  ``p2p.send`` / ``recv``), so a middle stage pays four transfers per micro-batch and the end
  stages two, where the model charges every stage two: charging the middle stages the other
  two (a diagnostic too) orders 342-343; not shipped, as a per-stage boundary term would reach
  the solver, its bounds and the pool ILP for no measured gain. (3) The tied-embedding
  gradient all-reduce between the first and last stage (once per step), the fp32
  cross-entropy over the vocabulary shard and the 1F1B fill and drain are each costed once;
  DeepSpeed's own stage partition (``type:transformer``, the remainder on the last stage)
  changes nothing for these 72-block models (72 / pp is whole for every pp measured). Half
  the misordered pairs come from two runs (listed under "Misordered pairs"): dp8 tp8 pp6 mbs4
  at GBS 1568, published with its GBS 2048 twin's step time (113.0 vs 114.1 s for 23 % fewer
  samples, where the pp 12 twin scales: 92.8 vs 117.1 s), and dp24 tp8 pp2 mbs2, run at 76 of
  80 GB and predicted 6.8 % fast. Neither is special-cased. Above the source's noise the
  agreement is higher (summary).
* Step-time max (in-sample 27 %, held out 31 %, target 30 %: missed by 1.0 point, one
  run): the Megatron-Core weak-scaling 32B run (tp 8, dp 48 over 48 nodes, 4 sequences per
  data-parallel rank). The README gives no micro-batch size; the bench evaluates it at 1 and
  says so. There the model exposes 0.30 s of the fp32 gradient reduce-scatter and parameter
  all-gather (16 GB per GPU over one 50 GB/s NIC, one GPU per node in each data-parallel
  group), because Megatron's ``--overlap-grad-reduce`` overlaps it with the last micro-batch's
  backward only (0.14 s at micro-batch 1). Over the micro-batches it could have used (1, 2, 4:
  all fit without recomputation) the error spans -19 % .. +27 % in-sample and -15 % .. +32 %
  held out ("Runs without a published micro-batch size"). The headline keeps the assumption:
  picking the size that fits best would score the search against a guess. Over the runs that
  publish their micro-batch size the held-out max is 23 % (MPT-70B on 64 A100-40GB). The same
  0.3-0.5 s of exposed data-parallel traffic is why the weak-scaling table is predicted 5 % slow
  held out.
* Held out, torchtitan Llama 3.1 405B (tp8 pp8 FSDP 8, 512 H100, Float8, async TP; Table 5 of
  the torchtitan benchmark, not in the calibration files): memory 58.3 GiB predicted for 1F1B
  (82.5 measured), 60.4 for interleaved 1F1B (72.7); throughput 142 and 156 tokens/s/GPU
  predicted against 100 and 128 measured (30 % and 18 % optimistic). The only torchtitan
  calibration runs are 8B FSDP on one or sixteen nodes; both bands say "extrapolating".
* Held-out fit verdicts: 3 MPT runs that ran at 99-100 % of HBM are predicted just over when
  llm-foundry is held out (FSDP1's allocator overhead then comes from the other runtimes,
  0.16 -> about 0.23).
* The per-block host overhead of the eager runtimes (about 3 ms) is large for launches alone:
  host time is modelled as additive, where in reality it only shows when the GPU runs out of
  queued work; the bound keeps it physical."""


@dataclass
class Row:
    file: str
    run: CalibrationRun
    pred: Prediction
    time_band: Band | None = None
    memory_band: Band | None = None

    @property
    def id(self) -> str:
        return self.run.id

    @property
    def time_error(self) -> float | None:
        t = self.run.measured.step_time_s
        if t is None or self.run.measured.oom:
            return None
        return self.pred.step_time_s / t - 1

    @property
    def memory_error(self) -> float | None:
        m = self.run.measured.memory_gib
        return None if m is None else self.pred.memory_gib / m - 1

    @property
    def fit_ok(self) -> bool | None:
        if not self.pred.fit_judged:
            return None
        return self.pred.fits != self.run.measured.oom

    @property
    def time_covered(self) -> bool | None:
        t = self.run.measured.step_time_s
        if self.time_band is None or t is None or self.run.measured.oom:
            return None
        return self.time_band.low <= t <= self.time_band.high

    @property
    def memory_covered(self) -> bool | None:
        m = self.run.measured.memory_gib
        if self.memory_band is None or m is None:
            return None
        return self.memory_band.low <= m <= self.memory_band.high


def labels_of(run: CalibrationRun) -> list[str]:
    return band_labels(run.regime)


def read_entries(name: str) -> list[dict]:
    """The entries of calibration file ``name`` (bench/data), parsed by the library's YAML
    reader (libyaml's C parser where PyYAML has it: the pure-Python one takes seconds here)."""
    path = DATA / name
    return parse_yaml(read_text(path, "runs file"), str(path))["entries"]


def load_all() -> tuple[list[tuple[str, CalibrationRun]], list[tuple[str, str, str]]]:
    runs, skipped = [], []
    for name in FILES:
        got, skip = load_runs(read_entries(name))
        runs += [(name, r) for r in got]
        skipped += [(name, i, why) for i, why in skip]
    return runs, skipped


def evaluate_rows(runs: Iterable[tuple[str, CalibrationRun]], constants: Constants | None,
                  bands: BandTable | None) -> list[Row]:
    rows = []
    for name, run in runs:
        pred = predict(run, constants)
        row = Row(name, run, pred)
        if bands is not None:
            params = run.model.params
            row.time_band = band(bands, "step_time", pred.step_time_s, labels_of(run),
                                 run.cluster.num_gpus, params)
            row.memory_band = band(bands, "memory", pred.memory_gib, labels_of(run),
                                   run.cluster.num_gpus, params)
        rows.append(row)
    return rows


def run(baseline: bool = False, loaded=None) -> tuple[list[Row], list[tuple[str, str, str]]]:
    """Every usable run evaluated with the shipped constants and bands (``baseline``: the raw
    preset values); ``loaded``: what :func:`load_all` returned, to reuse one load."""
    profile = None if baseline else shipped()
    runs, skipped = loaded or load_all()
    constants = profile.constants if profile else None
    bands = profile.bands if profile else None
    return evaluate_rows(runs, constants, bands), skipped


# ----------------------------------------------------------------------------- statistics

def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def stats(rows: list[Row]) -> dict[str, Any]:
    t = [r.time_error for r in rows if r.time_error is not None]
    m = [r.memory_error for r in rows if r.memory_error is not None]
    fits = [r.fit_ok for r in rows if r.fit_ok is not None]
    tc = [r.time_covered for r in rows if r.time_covered is not None]
    mc = [r.memory_covered for r in rows if r.memory_covered is not None]
    return {
        "n": len(rows), "time_n": len(t),
        "time_median": _median([abs(x) for x in t]), "time_max": max(map(abs, t), default=None),
        "time_bias": _median(t),
        "memory_n": len(m), "memory_median": _median([abs(x) for x in m]),
        "memory_max": max(map(abs, m), default=None), "memory_bias": _median(m),
        "fit_n": len(fits), "fit_ok": sum(fits),
        "time_coverage": (sum(tc) / len(tc)) if tc else None, "time_coverage_n": len(tc),
        "memory_coverage": (sum(mc) / len(mc)) if mc else None, "memory_coverage_n": len(mc),
    }


def by_label(rows: list[Row], key: Callable[[Row], str]) -> dict[str, dict[str, Any]]:
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return {k: stats(v) for k, v in sorted(groups.items())}


def _config_key(row: Row) -> tuple:
    c = row.run.config
    return (c.tp, c.pp, c.dp, c.cp, c.micro_batch, c.virtual_stages, c.zero_stage, c.sp,
            row.run.recompute, c.global_batch, row.run.cluster.num_gpus, row.run.compiled)


def _throughput(row: Row, predicted: bool) -> float:
    """Tokens per second per GPU, measured or predicted."""
    t = row.pred.step_time_s if predicted else row.run.measured.step_time_s
    return row.run.tokens_per_step / t / row.run.cluster.num_gpus


def rank_groups(rows: list[Row]) -> dict[tuple, list[Row]]:
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.time_error is not None:
            groups.setdefault(r.run.rank_group, []).append(r)
    return groups


def source_noise(rows: list[Row]) -> dict[str, float]:
    """Per source: its own run-to-run noise, the largest relative throughput gap between two of
    its runs of the same configuration (repeats, other software versions), at least RANK_TIE."""
    noise: dict[str, float] = {}
    for members in rank_groups(rows).values():
        for a, b in itertools.combinations(members, 2):
            src = a.run.source
            noise.setdefault(src, RANK_TIE)
            if _config_key(a) == _config_key(b):
                gap = abs(_throughput(a, False) / _throughput(b, False) - 1)
                noise[src] = max(noise[src], gap)
    return noise


def _differs(a: Row, b: Row) -> str:
    ca, cb = a.run.config, b.run.config
    names = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "micro_batch": "mbs",
             "global_batch": "gbs", "zero_stage": "zero", "virtual_stages": "vp"}
    out = [short for f, short in names.items() if getattr(ca, f) != getattr(cb, f)]
    if a.pred.recompute != b.pred.recompute:
        out.append("recompute")
    if a.run.cluster.num_gpus != b.run.cluster.num_gpus:
        out.append("gpus")
    return "+".join(out) or "-"


def ranked_pairs(rows: list[Row]) -> list[dict[str, Any]]:
    """Every pair of different configurations one source measured on one GPU type (same
    model) whose measured throughputs differ by RANK_TIE or more: measured and predicted."""
    out = []
    for key, members in sorted(rank_groups(rows).items(), key=lambda kv: str(kv[0])):
        for a, b in itertools.combinations(members, 2):
            if _config_key(a) == _config_key(b):
                continue  # the same configuration (another software version): not a ranking
            ma, mb = _throughput(a, False), _throughput(b, False)
            if abs(ma / mb - 1) < RANK_TIE:
                continue
            pa, pb = _throughput(a, True), _throughput(b, True)
            out.append({"group": key, "a": a, "b": b, "gap": abs(ma / mb - 1),
                        "agree": (ma > mb) == (pa > pb), "differs": _differs(a, b)})
    return out


def rank_agreement(rows: list[Row], above_noise: bool = False) -> list[dict[str, Any]]:
    """Per source / GPU / model group: pairs of configurations ordered as measured. With
    ``above_noise`` only the pairs whose measured gap exceeds the source's own noise."""
    noise = source_noise(rows) if above_noise else {}
    counts: dict[tuple, list[int]] = {}
    members = rank_groups(rows)
    for p in ranked_pairs(rows):
        if above_noise and p["gap"] <= noise.get(p["a"].run.source, RANK_TIE):
            continue
        c = counts.setdefault(p["group"], [0, 0])
        c[0] += p["agree"]
        c[1] += 1
    out = []
    for key, (agree, total) in counts.items():
        source, gpu, dtype, shape = key
        out.append({"source": source, "gpu": gpu, "dtype": dtype,
                    "model": f"L{shape[0]} h{shape[1]} s{shape[5]}", "runs": len(members[key]),
                    "pairs": total, "agree": agree,
                    "noise": noise.get(source, RANK_TIE) if above_noise else RANK_TIE})
    return out


def misordered_by_cause(rows: list[Row]) -> list[tuple[str, str, int, int]]:
    """(source, what differs between the two configurations, misordered, pairs), most
    misordered first: where the ordering errors come from."""
    tally: dict[tuple[str, str], list[int]] = {}
    for p in ranked_pairs(rows):
        t = tally.setdefault((p["a"].run.source, p["differs"]), [0, 0])
        t[0] += not p["agree"]
        t[1] += 1
    return sorted(((s, d, bad, n) for (s, d), (bad, n) in tally.items() if bad),
                  key=lambda x: (-x[2], x[0], x[1]))


def misordered_by_run(rows: list[Row]) -> list[tuple[str, int, int]]:
    """(run, misordered pairs it is in, ranked pairs it is in), most misordered first."""
    tally: dict[str, list[int]] = {}
    for p in ranked_pairs(rows):
        for r in (p["a"], p["b"]):
            c = tally.setdefault(r.id, [0, 0])
            c[0] += not p["agree"]
            c[1] += 1
    return sorted(((k, bad, n) for k, (bad, n) in tally.items() if bad),
                  key=lambda x: (-x[1], x[0]))


def check_verdicts(rows: list[Row]) -> dict[tuple[bool, str], list[str]]:
    """``check``'s band-aware memory verdict (planner/check.py ``memory_verdict``: "fits",
    "fits only at the optimistic end", "does not fit") of every judged run, by (went out of
    memory, verdict): a run at the edge of HBM is flagged in both directions."""
    from planner.check import memory_verdict
    out: dict[tuple[bool, str], list[str]] = {}
    for r in rows:
        if r.fit_ok is None:
            continue
        verdict = memory_verdict(r.pred.evaluation, 0.5)
        if verdict is not None:
            out.setdefault((r.run.measured.oom, verdict[0]), []).append(r.id)
    return out


def _check_verdict_line(rows: list[Row]) -> str:
    v = check_verdicts(rows)
    if not v:
        return ""
    def tally(oom: bool) -> str:
        return ", ".join(f'{len(v[(oom, t)])} "{t}"' for t in
                         ("fits", "fits only at the optimistic end", "does not fit")
                         if v.get((oom, t)))
    n_oom = sum(len(ids) for (oom, _), ids in v.items() if oom)
    n_ran = sum(len(ids) for (oom, _), ids in v.items() if not oom)
    return (f"- with the memory bands (`check`'s verdict; not a target): of the {n_oom} runs "
            f"that went out of memory {tally(True)}; of the {n_ran} that ran {tally(False)}")


def targets_missed(rows: list[Row]) -> list[str]:
    s = stats(rows)
    missed = []
    if s["time_median"] is not None and s["time_median"] > TIME_MEDIAN_TARGET:
        missed.append(f"step-time median |error| {s['time_median']:.1%} > "
                      f"{TIME_MEDIAN_TARGET:.0%}")
    if s["memory_median"] is not None and s["memory_median"] > MEMORY_MEDIAN_TARGET:
        missed.append(f"memory median |error| {s['memory_median']:.1%} > "
                      f"{MEMORY_MEDIAN_TARGET:.0%}")
    for kind, key in (("runtime", lambda r: r.run.regime.runtime),
                      ("generation", lambda r: r.run.regime.generation),
                      ("parallelism", lambda r: r.run.regime.parallelism)):
        for label, st in by_label(rows, key).items():
            if st["time_bias"] is not None and abs(st["time_bias"]) > BIAS_TARGET:
                missed.append(f"{kind} {label}: step-time bias {st['time_bias']:+.1%}")
    ranks = rank_agreement(rows)
    pairs = sum(g["pairs"] for g in ranks)
    agree = sum(g["agree"] for g in ranks)
    if pairs and agree / pairs < RANK_TARGET:
        missed.append(f"rank agreement {agree}/{pairs} ({agree / pairs:.0%}) < "
                      f"{RANK_TARGET:.0%}")
    wrong = [r.id for r in rows if r.fit_ok is False]
    if wrong:
        missed.append(f"wrong fit verdicts: {', '.join(wrong)}")
    for q in ("time", "memory"):
        c = s[f"{q}_coverage"]
        if c is not None and not COVERAGE_RANGE[0] <= c <= COVERAGE_RANGE[1]:
            missed.append(f"{q} band coverage {c:.0%} outside {COVERAGE_RANGE[0]:.0%}-"
                          f"{COVERAGE_RANGE[1]:.0%}")
    return missed


def zero_rows(entries: list[dict]) -> list[tuple[str, float, float]]:
    rows = []
    for entry in entries:
        r = entry["results"]
        if "model_state_memory_gb" in r:
            nd = entry["training"]["dp"]
            for stage, key in enumerate(("baseline_dp", "zero1_pos", "zero2_pos_g",
                                         "zero3_pos_g_p")):
                got = zero_state_bytes(7.5e9, nd, stage, RUNTIME_STATE_BYTES["zero-paper"]).total
                rows.append((f"{entry['id']} stage {stage}", r["model_state_memory_gb"][key],
                             got / 1e9))
    return rows


# ----------------------------------------------------------------------------- rendering

def _pct(v: float | None, signed: bool = False) -> str:
    if v is None:
        return ""
    return f"{v:+.1%}" if signed else f"{v:.1%}"


def _pct0(v: float | None) -> str:
    return "-" if v is None else f"{v:.0%}"


def _cov(v: float | None, n: int) -> str:
    return "" if v is None else f"{v:.0%} ({n})"


def _holdout_now() -> dict[str, str]:
    """The held-out rows of the "Since session 3 began" table (bench/data/holdout.json)."""
    path = DATA / "holdout.json"
    if not path.exists():
        return {}
    h = json.loads(path.read_text())["summary"]
    wide = h.get("nested_coverage", {}).get("widened", {})
    return {"held out: time median": _pct(h["time_median"]),
            "held out: time max": _pct(h["time_max"]),
            "held out: time bias": _pct(h["time_bias"], True),
            "held out: rank agreement": f"{h['agree']}/{h['pairs']} "
                                        f"({h['agree'] / h['pairs']:.0%})" if h["pairs"] else "",
            "held out: fit verdicts": f"{h['verdicts'] - len(h['wrong_verdicts'])}/"
                                      f"{h['verdicts']}",
            "held out: band coverage, time / memory": f"{_pct0(wide.get('step_time'))} / "
                                                      f"{_pct0(wide.get('memory'))}"}


def held_out_rows(rows: list[Row], data: dict) -> list[Row]:
    """``rows`` with each step-time prediction replaced by its held-out one (the fold that
    left the run's source out, bench/data/holdout.json), for the rank agreement above noise."""
    from dataclasses import replace
    error = {r["id"]: r["time_error"] for f in data["folds"] for r in f.get("rows", [])}
    out = []
    for row in rows:
        e = error.get(row.id)
        if e is None or row.time_error is None:
            continue
        pred = replace(row.pred, step_time_s=row.run.measured.step_time_s * (1 + e))
        out.append(Row(row.file, row.run, pred))
    return out


HELD_OUT_MEDIAN_TARGET = 0.10
HELD_OUT_MAX_TARGET = 0.30


def held_out_targets_missed(rows: list[Row]) -> list[str]:
    """The targets on runs not in the files (issue 10), judged on the leave-one-source-out
    estimate (bench/data/holdout.json): median <= 10 %, max <= 30 %, rank agreement >= 90 %,
    no run that ran predicted not to fit."""
    path = DATA / "holdout.json"
    if not path.exists():
        return []
    h = json.loads(path.read_text())["summary"]
    missed = []
    if h["time_median"] > HELD_OUT_MEDIAN_TARGET:
        missed.append(f"held out: step-time median {h['time_median']:.1%} > "
                      f"{HELD_OUT_MEDIAN_TARGET:.0%}")
    if h["time_max"] > HELD_OUT_MAX_TARGET:
        missed.append(f"held out: step-time max {h['time_max']:.1%} > "
                      f"{HELD_OUT_MAX_TARGET:.0%}")
    if h["pairs"] and h["agree"] / h["pairs"] < RANK_TARGET:
        missed.append(f"held out: rank agreement {h['agree']}/{h['pairs']} "
                      f"({h['agree'] / h['pairs']:.0%}) < {RANK_TARGET:.0%}")
    oom = {r.id for r in rows if r.run.measured.oom}
    ran = [i for i in h["wrong_verdicts"] if i not in oom]
    if ran:
        missed.append(f"held out: runs that ran predicted not to fit: {', '.join(ran)}")
    return missed


def _held_out_max_published(rows: list[Row], data: dict) -> str:
    """The held-out max over the runs whose micro-batch size is published (an added line:
    the headline max above keeps the runs evaluated at an assumed micro-batch)."""
    assumed = {r.id for r in rows if unknown_fields.micro_batch_assumed(r.run)}
    errors = [(abs(r["time_error"]), r["id"]) for f in data["folds"] for r in f.get("rows", [])
              if r.get("time_error") is not None]
    known = [e for e in errors if e[1] not in assumed]
    if not known or len(known) == len(errors):
        return ""
    worst, which = max(known)
    return (f"- of which over the {len(known)} runs that publish their micro-batch size "
            f"(not a target; the {len(errors) - len(known)} others are evaluated at an assumed "
            f"micro-batch 1, see \"Runs without a published micro-batch size\"): max "
            f"{worst:.1%} ({which})")


def held_out_drift(rows: list[Row], data: dict) -> str:
    """How far today's model moved the held-out errors since bench/holdout.py ran: each
    fold's constants re-applied to today's cost model (no re-fit)."""
    runs = {r.id: r.run for r in rows}
    diffs = []
    for f in data["folds"]:
        constants = Constants(f["constants"])
        for rec in f.get("rows", []):
            run = runs.get(rec["id"])
            if rec.get("time_error") is None or run is None:
                continue
            now = predict(run, constants).step_time_s / run.measured.step_time_s - 1
            diffs.append((abs(now - rec["time_error"]), abs(now)))
    if not diffs:
        return ""
    return (f"- the fold constants re-applied to today's cost model (no re-fit: cost-term "
            f"changes since bench/holdout.py ran) move a held-out error by at most "
            f"{max(d for d, _ in diffs):.1%} (max |error| today {max(e for _, e in diffs):.1%})")


def holdout_section(rows: list[Row] | None = None) -> list[str]:
    """The leave-one-source-out estimate (bench/holdout.py writes bench/data/holdout.json)."""
    path = DATA / "holdout.json"
    if not path.exists():
        return ["", "## Held-out estimate", "", "Not measured: run `python bench/holdout.py`."]
    data = json.loads(path.read_text())
    h = data["summary"]
    noisy = rank_agreement(held_out_rows(rows, data), above_noise=True) if rows else []
    npairs, nagree = sum(g["pairs"] for g in noisy), sum(g["agree"] for g in noisy)
    lines = ["", "## Held-out estimate (leave one source out)", "",
             f"`python bench/holdout.py`: for each source, the constants are fitted on the "
             f"other sources only (same model, bounds and loss as the shipped fit, "
             f"at most {data['max_evaluations']} evaluations, regularised toward the same "
             f"priors) and the source's runs are predicted. This estimates the targets on runs "
             f"not in these files.", "",
             f"- step time over {h['time_n']} held-out runs: median |error| "
             f"**{h['time_median']:.1%}**, max {h['time_max']:.1%}, median signed "
             f"{h['time_bias']:+.1%} (targets: median <= 10%, max <= 30%)",
             _held_out_max_published(rows, data) if rows else "",
             held_out_drift(rows, data) if rows else "",
             f"- median over sources of the per-source median |error|: "
             f"{h['sources_median']:.1%}",
             f"- rank agreement inside each held-out source: {h['agree']}/{h['pairs']} "
             f"({h['agree'] / h['pairs']:.0%}; target >= 90%)"
             + (f"; above the source's own noise {nagree}/{npairs} ({nagree / npairs:.0%})"
                if npairs else "") if h["pairs"] else "",
             f"- fit verdicts: {h['verdicts'] - len(h['wrong_verdicts'])}/{h['verdicts']} "
             f"right" + (f" (wrong: {', '.join(h['wrong_verdicts'])})"
                         if h["wrong_verdicts"] else ""),
             f"- band coverage of held-out runs (80 % nominal): with the fold's in-sample "
             f"bands {h['time_coverage']:.0%} (step time); with the shipped construction (the "
             f"fold's in-sample bands widened by the between-source spread of the other "
             f"sources, measured without the held-out source) "
             f"{_pct0(h.get('nested_coverage', {}).get('widened', {}).get('step_time'))} "
             f"step time, "
             f"{_pct0(h.get('nested_coverage', {}).get('widened', {}).get('memory'))} memory "
             f"(bench/holdout.py's bands, which do not record recomputation: the shipped bands "
             f"also widen for a policy no run of the regime used, so these are lower bounds)"
             if h["time_coverage"] is not None else "",
             f"- memory over {h['memory_n']} held-out readings: median |error| "
             f"{_pct(h['memory_median'])}" if h.get("memory_n") else "",
             f"- between-source spread of the step time (log ratio, robust): "
             f"{h['between_source_sigma']['step_time']:.3f}; the shipped step-time bands "
             f"combine it with each regime's in-sample spread (memory: fewer than 3 sources "
             f"publish it, its bands stay in-sample)"
             if h.get("between_source_sigma", {}).get("step_time") else "",
             "",
             "| held-out source | runs | median abs | max abs | median signed | pairs ordered |",
             "|---|---:|---:|---:|---:|---:|"]
    for f in data["folds"]:
        st = f["stats"]
        pairs = sum(g["pairs"] for g in f["ranks"])
        agree = sum(g["agree"] for g in f["ranks"])
        lines.append(f"| {f['source'][:70]} | {st['time_n']} | {_pct(st['time_median'])} "
                     f"| {_pct(st['time_max'])} | {_pct(st['time_bias'], True)} "
                     f"| {f'{agree}/{pairs}' if pairs else ''} |")
    return lines


def _not_judged(row: Row) -> str:
    if row.pred.fit_judged:
        return ""
    return " (host offload: not judged)" if row.run.offloaded_layers else \
        " (recompute inferred)"


def _agree(group: dict[str, Any] | None) -> str:
    return f"{group['agree']}/{group['pairs']}" if group else "0/0"


def _table(title: str, groups: dict[str, dict[str, Any]], names: dict[str, str] | None = None,
           pairs: dict[str, tuple[int, int]] | None = None):
    lines = [f"### {title}", "",
             "| regime | runs | time: median abs | max abs | median signed | band cover "
             "| memory: median abs | median signed | fit verdicts | pairs ordered |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, s in groups.items():
        name = (names or {}).get(label, label)
        fits = f"{s['fit_ok']}/{s['fit_n']}" if s["fit_n"] else ""
        agree, n = (pairs or {}).get(label, (0, 0))
        lines.append(f"| {name} | {s['time_n']} | {_pct(s['time_median'])} "
                     f"| {_pct(s['time_max'])} | {_pct(s['time_bias'], True)} "
                     f"| {_cov(s['time_coverage'], s['time_coverage_n'])} "
                     f"| {_pct(s['memory_median'])} | {_pct(s['memory_bias'], True)} | {fits} "
                     f"| {f'{agree}/{n}' if n else ''} |")
    return lines + [""]


def _regime_keys() -> dict[str, Callable[[Row], str]]:
    return {"parallelism": lambda r: r.run.regime.parallelism,
            "runtime": lambda r: r.run.regime.runtime,
            "generation": lambda r: r.run.regime.generation, "file": lambda r: r.file,
            "regime": lambda r: r.run.regime.key}


def landing_section(rows: list[Row], landed: list[dict[str, Any]]) -> list[str]:
    """docs/accuracy.md's "Where the search lands" (bench/landing.py) from today's rows."""
    keys, pairs = _regime_keys(), ranked_pairs(rows)
    return landing.section(landed, by_label(rows, keys["regime"]),
                           landing.pairs_by_label(pairs, keys["regime"]),
                           by_label(rows, keys["parallelism"]),
                           landing.pairs_by_label(pairs, keys["parallelism"]))


def render(rows: list[Row], skipped, zero, baseline_rows: list[Row] | None = None,
           micro_batch_bands: list[dict[str, Any]] | None = None,
           landed: list[dict[str, Any]] | None = None) -> str:
    s = stats(rows)
    lines = [
        "# Cost-model accuracy where the planner searches",
        "",
        "Generated by `python bench/accuracy.py` from the three calibration files in "
        "`bench/data/`",
        "with the library's shipped constants (`planner/calibration/defaults.yaml`, fitted by",
        "`bench/calibrate_defaults.py` over all runs together; no entry is special-cased). "
        "Error =",
        "predicted / measured - 1: a **negative** step-time error means the model is "
        "**optimistic**",
        "(predicts a faster step than was measured) - the error a search exploits. Memory in "
        "GiB,",
        "in the reading of the source (nvidia-smi, or the allocator's max reserved for "
        "torchtitan).",
        "Bands: 80 % nominal intervals from the fit residuals of the run's regime, for step "
        "time combined with the spread between sources of the held-out estimate "
        "(planner/calibration/bands.py, bench/calibrate_defaults.py).",
        "",
        "## Summary",
        "",
        f"- step time: median |error| **{_pct(s['time_median'])}**, max {_pct(s['time_max'])}, "
        f"median signed {_pct(s['time_bias'], True)} over {s['time_n']} runs "
        f"(target: median <= {TIME_MEDIAN_TARGET:.0%}, every regime's bias within "
        f"+-{BIAS_TARGET:.0%})",
        f"- memory: median |error| **{_pct(s['memory_median'])}**, max "
        f"{_pct(s['memory_max'])} over {s['memory_n']} runs (target <= "
        f"{MEMORY_MEDIAN_TARGET:.0%})",
        f"- fit verdicts: {s['fit_ok']}/{s['fit_n']} right (runs whose recomputation is not "
        f"published are not judged: it is inferred from fitting)",
        _check_verdict_line(rows),
        f"- band coverage (80 % nominal): step time {_cov(s['time_coverage'], s['time_coverage_n'])}"
        f", memory {_cov(s['memory_coverage'], s['memory_coverage_n'])} (target 70-90 %)",
    ]
    ranks = rank_agreement(rows)
    pairs = sum(g["pairs"] for g in ranks)
    agree = sum(g["agree"] for g in ranks)
    noisy = rank_agreement(rows, above_noise=True)
    npairs = sum(g["pairs"] for g in noisy)
    nagree = sum(g["agree"] for g in noisy)
    if pairs:
        lines.append(f"- rank agreement: **{agree}/{pairs} pairs ({agree / pairs:.0%})** of "
                     f"configurations measured by one source on one GPU type ordered as measured "
                     f"(target >= {RANK_TARGET:.0%}; pairs closer than {RANK_TIE:.0%} are ties)")
    if npairs:
        lines.append(f"- of which the pairs whose measured gap exceeds the source's own "
                     f"run-to-run noise (the largest gap between two of its runs of one "
                     f"configuration): {nagree}/{npairs} ({nagree / npairs:.0%})")
    if landed:
        lines.append(f"- where the search lands (not a target; \"Where the search lands\"): "
                     f"the planner's search on {len(landed)} calibration runs' hardware picks "
                     f"plans in the regimes " + ", ".join(sorted({x['regime'].key for x in landed}))
                     + "; " + str(sum(not x["same_recompute"] for x in landed))
                     + " of them with a recomputation no calibration run of its regime used")
    missed = targets_missed(rows)
    held = held_out_targets_missed(rows)
    lines += ["", "Targets missed:" if missed or held else "All targets met.", ""]
    lines += [f"- {m}" for m in missed + held]
    lines += ["", f"## Since session 3 began (before: commit {SESSION_BEFORE_COMMIT}, the same "
              "scripts; sessions 4 and 5 changed the report, not the terms or the constants)", "",
              "| measure | before | after |", "|---|---:|---:|"]
    bias = {k: st["time_bias"] for k, st in by_label(rows, lambda r: r.run.regime.runtime).items()}
    tp = by_label(rows, lambda r: r.run.regime.parallelism).get("tp", {}).get("time_bias")
    now = {"time median": _pct(s["time_median"]), "time max": _pct(s["time_max"]),
           "time bias": _pct(s["time_bias"], True),
           "torchtitan bias": _pct(bias.get("torchtitan"), True),
           "TP-heavy bias": _pct(tp, True), "memory median": _pct(s["memory_median"]),
           "fit verdicts": f"{s['fit_ok']}/{s['fit_n']}",
           "coverage time / memory": f"{s['time_coverage']:.0%} / {s['memory_coverage']:.0%}",
           "rank agreement": f"{agree}/{pairs} ({agree / pairs:.0%})" if pairs else ""}
    now.update(_holdout_now())
    lines += [f"| {k} | {v} | {now.get(k, '')} |" for k, v in SESSION_BEFORE.items()]
    lines += ["", "What moved them (all in the cost terms or the runs' published settings; no "
              "entry is special-cased): see \"Causes fixed\" below.", ""]
    lines += ["## Causes fixed", "", CAUSES]
    lines += holdout_section(rows)
    lines += unknown_fields.section(micro_batch_bands or [], unknown_fields.assumption_counts(rows))
    lines += ["", "## Before this issue", "", BEFORE]
    if missed:
        lines += ["", "## Why the misses", "", MISSES]
    if baseline_rows is not None:
        b = stats(baseline_rows)
        bl_ranks = rank_agreement(baseline_rows)
        bp = sum(g["pairs"] for g in bl_ranks)
        ba = sum(g["agree"] for g in bl_ranks)
        lines += ["", "## Without calibration (today's model, preset constants: `--baseline`)", "",
                  f"- step time: median |error| {_pct(b['time_median'])}, max "
                  f"{_pct(b['time_max'])}, median signed {_pct(b['time_bias'], True)}; memory "
                  f"median {_pct(b['memory_median'])}; fit verdicts {b['fit_ok']}/{b['fit_n']}; "
                  f"rank agreement {ba}/{bp}", ""]
        lines += _table("Before: by parallelism regime",
                        by_label(baseline_rows, lambda r: r.run.regime.parallelism), REGIME_TITLES)
    if landed:
        lines += landing_section(rows, landed)
    lines += ["", "## Per regime", "",
              "Pairs ordered: the ranked pairs (\"Rank agreement per source\") with a member in "
              "the regime, ordered as measured (a pair across two regimes counts in both).", ""]
    keys, pairs = _regime_keys(), ranked_pairs(rows)
    for title, key, names in (("By parallelism regime", "parallelism", REGIME_TITLES),
                              ("By runtime", "runtime", None),
                              ("By GPU generation", "generation", None),
                              ("By calibration file", "file", None)):
        lines += _table(title, by_label(rows, keys[key]), names,
                        landing.pairs_by_label(pairs, keys[key]))
    above = {(g["source"], g["gpu"], g["dtype"], g["model"]): g for g in noisy}
    lines += ["## Rank agreement per source", "",
              "Noise: the source's largest throughput gap between two runs of one "
              "configuration (repeats or other software versions), at least "
              f"{RANK_TIE:.0%}.", "",
              "| source | GPU | dtype | model | runs | pairs | ordered as measured "
              "| noise | above noise |",
              "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for g in ranks:
        a = above.get((g["source"], g["gpu"], g["dtype"], g["model"]))
        noise = max((x["noise"] for x in noisy if x["source"] == g["source"]),
                    default=RANK_TIE)
        lines.append(f"| {g['source'][:70]} | {g['gpu']} | {g['dtype']} | {g['model']} "
                     f"| {g['runs']} | {g['pairs']} | {g['agree']}/{g['pairs']} "
                     f"| {noise:.1%} | {_agree(a)} |")
    lines += ["", "### Misordered pairs by what the two configurations differ in", "",
              "(`python bench/accuracy.py --pairs` lists every misordered pair.)", "",
              "| source | differs in | misordered | pairs |", "|---|---|---:|---:|"]
    lines += [f"| {src[:60]} | {d} | {bad} | {n} |" for src, d, bad, n in
              misordered_by_cause(rows)]
    worst = misordered_by_run(rows)
    lines += ["", "Runs in the most misordered pairs: " + ", ".join(
        f"{name} ({bad} of {n})" for name, bad, n in worst[:3]) + "."]
    lines += ["", "## Runs", "",
              "| entry | regime | config | time measured s | predicted s | error | band | "
              "memory measured GiB | predicted | error | measured | predicted |",
              "|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---|"]
    for r in rows:
        c = r.run.config
        cfg = (f"tp{c.tp} pp{c.pp} dp{c.dp} cp{c.cp} mbs{c.micro_batch} v{c.virtual_stages} "
               f"z{c.zero_stage} {r.pred.recompute} {c.dtype}")
        m = r.run.measured
        tb = (f"{r.time_band.low:.3g}-{r.time_band.high:.3g}" if r.time_band and
              r.time_error is not None else "")
        lines.append(
            f"| {r.id} | {r.run.regime.key} | {cfg} | {'' if m.step_time_s is None or m.oom else f'{m.step_time_s:.3g}'} "
            f"| {'' if m.oom else f'{r.pred.step_time_s:.3g}'} | {_pct(r.time_error, True)} | {tb} "
            f"| {'' if m.memory_gib is None else f'{m.memory_gib:.1f}'} "
            f"| {r.pred.memory_gib:.1f} | {_pct(r.memory_error, True)} "
            f"| {'OOM' if m.oom else 'ran'} | {'fits' if r.pred.fits else 'OOM'}"
            f"{_not_judged(r)} |")
    lines += ["", "## Model-state memory (ZeRO worked example)", "",
              "| case | published GB | predicted GB |", "|---|---:|---:|"]
    lines += [f"| {name} | {pub:g} | {got:.3f} |" for name, pub, got in zero]
    lines += ["", "## Entries not evaluated", ""]
    lines += [f"- {f}: {i}: {why}" for f, i, why in skipped]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--no-write", action="store_true", help="do not write docs/accuracy.md")
    parser.add_argument("--baseline", action="store_true",
                        help="the raw preset values (no calibration profile)")
    parser.add_argument("--pairs", action="store_true",
                        help="list every misordered pair (measured and predicted tokens/s/GPU)")
    args = parser.parse_args()
    loaded = load_all()
    rows, skipped = run(baseline=args.baseline, loaded=loaded)
    if args.pairs:
        for p in ranked_pairs(rows):
            if not p["agree"]:
                a, b = p["a"], p["b"]
                print(f"{a.run.source[:40]} | {p['differs']} | {a.id} vs {b.id}: measured "
                      f"{_throughput(a, False):.0f} vs {_throughput(b, False):.0f}, predicted "
                      f"{_throughput(a, True):.0f} vs {_throughput(b, True):.0f}")
    baseline_rows = None if args.baseline else run(baseline=True, loaded=loaded)[0]
    published = read_entries(FILES[0])
    if not args.no_write and not args.baseline:
        bands = unknown_fields.micro_batch_bands(rows, shipped().constants)
        landed = landing.land(rows, shipped())
        DOC.write_text(render(rows, skipped, zero_rows(published), baseline_rows, bands, landed))
    for title, key in (("parallelism", lambda r: r.run.regime.parallelism),
                       ("runtime", lambda r: r.run.regime.runtime),
                       ("generation", lambda r: r.run.regime.generation)):
        for label, st in by_label(rows, key).items():
            print(f"{title:11} {label:12} n={st['time_n']:3} median {_pct(st['time_median']):>6} "
                  f"max {_pct(st['time_max']):>6} bias {_pct(st['time_bias'], True):>7} "
                  f"mem {_pct(st['memory_median']):>6} (n={st['memory_n']}) "
                  f"cover {_cov(st['time_coverage'], st['time_coverage_n'])}")
    s = stats(rows)
    ranks = rank_agreement(rows)
    print(f"ALL: time median {_pct(s['time_median'])} max {_pct(s['time_max'])} bias "
          f"{_pct(s['time_bias'], True)} (n={s['time_n']}); memory median "
          f"{_pct(s['memory_median'])} (n={s['memory_n']}); fits {s['fit_ok']}/{s['fit_n']}; "
          f"rank {sum(g['agree'] for g in ranks)}/{sum(g['pairs'] for g in ranks)}; coverage "
          f"time {_cov(s['time_coverage'], s['time_coverage_n'])} memory "
          f"{_cov(s['memory_coverage'], s['memory_coverage_n'])}")
    missed = targets_missed(rows)
    for line in missed:
        print("MISSED:", line)
    return 1 if (args.check and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
