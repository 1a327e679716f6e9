"""The prose of docs/accuracy.md that is not computed: what the model was before issue 10
and before this session, what was fixed and why (CAUSES), and why each missed target is
missed (MISSES). bench/accuracy.py renders it."""

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
* **Eager attention core: its GEMMs charged math plus score traffic, not the roofline's max
  (session 10, after the source-counted band centres; calibration: time median 2.9 -> 2.6 %,
  max 26.3 -> 26.5 %, bias +0.9 -> +0.8 %, memory 2.9 %, fit verdicts 93/94 and ranks
  342/388 unchanged, in-sample band coverage 89 -> 81 % step time, 83 % memory; held out:
  median 3.9 -> 3.5 %, max 29.3 % unchanged, bias +0.0 -> +0.6 %, ranks 341/388 unchanged,
  band coverage 77 -> 72 % step time (the between-source spread 0.046 -> 0.035: the sources
  sit closer to their centres, so the bands narrow), 80 % memory; out of file, the
  Megatron-LM 2021 eager reading: median 3.5 -> 1.5 %, max 7.9 -> 5.6 %, signed -1.0 ->
  +1.5 %, ranks 30 -> 32/33, gpt-1.7b -7.9 -> +1.7 %, gpt-3.6b -7.3 -> +0.0 %).** The eager
  core's batched GEMMs (QK^T writes the fp16 b x a x s x s scores, PV and the backward GEMMs
  stream them) already went through the GEMM roofline with their real shapes, score bytes
  included, and at head_dim 96 already read memory-bound (gpt-1.7b's QK^T: 2.16 ms of
  traffic, 2.15 ms of math): no bytes were missing. The max was wrong: FlashAttention-2's
  published PyTorch standard attention (Dao 2023, arXiv:2307.08691, Fig. 4 a-b: A100 80GB,
  fp16, no mask, no dropout, forward + backward, 16k tokens, hidden 2048) runs 36-46 TFLOP/s
  at head_dim 64 and 53-86 at 128 where the max read 58-66 and 103-124 (61-94 % fast); math
  plus traffic reads 43-48 and 69-83 (A100 preset; within +31 % at 512 tokens, median
  +7 %; tests/test_cost_formulas.py). Charged so for the eager core only
  (planner/cost/compute.py gemm_time_s ``overlap=False``: head_dim of math per score
  element; the other GEMMs keep the max that matmul_efficiency is fitted on) and re-fitted:
  matmul_efficiency.ampere 0.770 -> 0.781, attention_efficiency.ampere 0.698 -> 0.678,
  block_overhead_s.deepspeed 3.17 -> 3.02 ms, unfused_elementwise.fsdp 2.37 -> 2.49 (the rest
  within 2 %). The other out-of-file readings: `--runtime deepspeed` 13.0 -> 14.4 % (its
  fitted per-block time), the flash default 6.7 -> 7.5 % (these runs had no flash kernels).
* **Band centres counted by sources, not runs (session 10; held-out band coverage 69 -> 77 %
  step time, 80 -> 80 % memory; in-sample 89 -> 89 % step time (141 -> 140 of 158), 80 ->
  83 % memory; between-source spread 0.045 -> 0.046; held out: median 3.9 %, max 29.3 %, rank
  341/388, all unchanged: bands do not move predictions).** A band is centred on its label's
  median residual, and that median was counted over runs, so the source with the most runs set
  the centre for every runtime sharing the label: with the BLOOM chronicles held out, 40 of
  their 58 runs took the ``parallelism:deep-pp`` label, whose centre (+6.7 % after shrinkage)
  8 of its 13 runs, all Megatron-Bridge Llama 3 70B FP8, set, while BLOOM's held-out runs sit
  at -1.3 %. A new user's runs resemble a new source, not one more run of the source with the
  most runs (a source's runs share a setup: their errors are correlated), so
  planner/calibration/bands.py now counts a centre by sources (partial pooling, Gelman & Hill
  2007, §12.2): a label's centre is the median of its sources' median residuals, shrunk toward
  the pooled centre (also a median of source medians) by its number of sources ``J`` against a
  prior weight of one source (``PRIOR_SOURCES`` = 1, a unit-information prior: a label of one
  source lends another runtime half of that source's offset); the sources are the publications
  of bench/holdout.py ``family``, carried in each spread (``sources``) through the folds, the
  between-source spread (which is measured about these centres) and defaults.yaml. The spreads
  (sigma) are unchanged. BLOOM's held-out bands now sit at -0.1 .. +1.3 % and cover 48 of its
  58 runs (35 before); Megatron-Bridge 19 -> 18 of 30, the other sources unchanged. The prior
  weight was set before measuring; on the folds' stored (4-digit) constants the coverage is
  73.4-74.7 % for a weight of 0 to 2 sources (74.7 % at 1; 76.6 % on the refitted folds),
  69.6 % for 4 sources, 70.3 % for the pooled centre everywhere (infinite weight), against
  69.6 % counted by runs (69.0 % refitted): the gain is the counting by sources, and a heavy
  prior gives it back. No widening factor,
  no constant fitted to the coverage; no calibration constant moved.
* **Held-out estimate refreshed, between-source spread measured about the band centre
  (session 10; held out: median 4.2 -> 3.9 %, max 30.9 -> 29.3 %, rank 341/388 unchanged;
  held-out band coverage 71 -> 69 % step time, 75 -> 80 % memory; in-sample 85 -> 89 %).**
  bench/data/holdout.json and the shipped bands had been left from before the FP8 coverage
  commits (output head and MoE router in BF16 under FP8, 81f9620 .. 7e1a096), so no script
  reproduced them. Re-run (bench/holdout.py, then bench/calibrate_defaults.py, which
  reproduces the shipped constants and rebuilds the bands): the session-7 construction's
  coverage of a source the bands were built without fell to 65 % (between-source spread
  0.037 -> 0.034). Of the 10 runs it lost (net) the BLOOM chronicles lost 9 (41 -> 32 of
  58), Megatron-Bridge 2, llm-foundry 1 (long-sequence NeMo gained 2). Without the BLOOM
  chronicles no DeepSpeed run is left, so 40 of their 58 runs take the band of the
  ``parallelism:deep-pp`` label, whose in-sample centre is set by the Megatron-Bridge Llama 3
  70B FP8 runs (8 of its 13), predicted too slow, and slower still with the BF16 head: the
  label's median error +5.8 -> +8.8 %, the band centre (shrunk toward the pooled one) +6.7 %,
  where BLOOM's held-out runs sit at -1.3 %. The construction measured each held-out source's
  offset from zero error, where its band is centred at its label's median: ``tau`` must
  describe the residuals about the centre the band puts them at (``d = log(measured /
  held-out prediction) - mu``, planner/calibration/bands.py ``centre``, which ``band`` itself
  uses). Measured that way ``tau`` is 0.045 (offsets 0.031, scatter 0.053 about the source
  medians against 0.042 in-sample) and the bands cover 69 % of held-out runs (BLOOM 35/58,
  Megatron-Bridge 19/30, llm-foundry 14/23; on the previous folds the same construction
  gives 82 %): still under the 70 % target, reported as missed ("Why the misses"). No
  constant moved; no factor added.
* **BF16_Optimizer all-reduces the whole gradient (session 9; time median 3.0 -> 2.9 %, held
  out 4.6 -> 4.2 %, held-out max 31.0 -> 30.9 %; ranks unchanged).** The bf16 runs of the
  BLOOM chronicles (23 of the prequel sweep, the 176B main run) use DeepSpeed's
  BF16_Optimizer with its fp32 master partitioned over the data-parallel group, costed as
  ZeRO-1; the model charged ZeRO-1's reduce-scatter. DeepSpeed's own reduction is an
  all-reduce of each whole flat gradient group (pipe/engine.py ``_bf16_reduce_grads`` ->
  engine.py ``allreduce_bucket``: ``dist.all_reduce`` over the data-parallel group; at the
  2022-04 engine bf16 under pipeline parallelism runs only this way, ZeRO stage 1 raising
  NotImplementedError), after which each rank steps its partition and BF16_Optimizer.step
  all-gathers the bf16 weights (utils.py ``all_gather_dp_groups``): twice the reduction's
  volume (``StateBytes.reduce_all``, planner/cost/terms.py ``dp_collectives``). Re-fitted
  (bench/calibrate_defaults.py; constants move by under 1 %) and held out re-run
  (bench/holdout.py): in-sample step-time band coverage 89 -> 85 % (between-source spread
  0.038 -> 0.037), memory, fit verdicts and rank agreement (342/388; held out 341/388)
  unchanged. (This is why charging 4 bytes on the wire improved the fit in session 6: an
  all-reduce of 2-byte values moves what a reduce-scatter of 4-byte values does.)
* **The between-source spread counts the scatter too (session 7; held-out band coverage
  65 -> 71 %, in-sample 84 -> 89 %).** The shipped step-time bands combine each regime's
  in-sample spread with the spread ``tau`` a source the fit never saw adds (bench/holdout.py
  ``between_source_sigma``). Session 6 took ``tau`` from the held-out sources' median errors
  only (0.031): their offsets. A held-out source's runs also scatter more about their own
  median than fitted runs do (0.048 against 0.042 in-sample: without the source the constants
  move), so ``tau^2`` is now the offsets' spread squared plus that excess (0.038), all robust
  spreads measured without the source whose coverage is judged. No constant moved.
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
  (no recomputation; the copies overlap compute) and memory not judged: the model had no host
  offload. Session 7 (not shipped: measured with ``LayerOption.act_offload`` on the first 40
  blocks, planner/cost/offload.py): 215.6 GiB predicted against 185 GiB of HBM (activations
  155.2, allocator reserve 38.0, states 18.5), so judging them would add six wrong "does not
  fit" verdicts unless the caching allocator's reserve on these runs is below 7 GiB; the step
  time rises 7.69 -> 8.19 s (measured 7.52-8.11). They stay not judged until the allocator
  term is checked on Grace-Blackwell runs. Session 8: the reserve does not count the offloaded
  tensors (planner/cost/terms.py: an offloaded block's stored bytes leave the stage's
  activations; the reserve is 2.5 GiB + 0.223 x (on-GPU activations 155.2 + buffers 3.9) =
  38.0 GiB, 68.2 without the offload), so that is not the defect. Even with no allocator
  overhead at all these runs come to 180.1 GiB of 185 (4.9 GiB margin): the overhead would
  have to be under 3 % of the on-GPU activations (22.3 % calibrated). One over-count found:
  the two blocks' copies in transit of an offloaded block (2 x 3.6 GiB) are added to the
  peak of the blocks kept on the GPU, although with the first N blocks offloaded and pp 1
  the copies exist only while the offloaded blocks compute (in the forward before the kept
  blocks store, in the backward after they are freed); removing it gives about 207 GiB, still
  over. Not changed: the activations of the 40 kept blocks (3.6 GiB each at mbs 2, seq 8192,
  FP8 GEMM inputs) are the term to check, and no measured memory of these runs is published.
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
  step (profile flag ``pp_keeps_unsharded``; dense or MoE since session 11: NeMo AutoModel's
  DeepSeek-V3 pp4 runs on 80 GB keep them too and fit, docs/moe.md). Llama 3.1 405B tp8 pp8 dp8 on 512 H100
  (torchtitan benchmark Table 5): 22.9 -> 58.3 GiB predicted for 1F1B (82.5 measured), 25.1 ->
  60.4 GiB interleaved (72.7 measured).
* **BF16_Optimizer's reduction copy and DeepSpeed's layer partition (session 6).** The 20
  BLOOM runs of 2022-02-28 and the main run name DeepSpeed's ``partition_method
  'type:transformer|embedding'`` (tr11-176B-ml.slurm ``--pp-partition-method``): the embedding
  and the tied head count as one layer each, so the first stage holds one block fewer than
  Megatron's split, which the model had applied. These runs are now costed with DeepSpeed's
  own partition (``training.pp_partition``; planner/placement.py, since session 7 also the
  deepspeed profile's default placement under ``evaluate``: runtime/pipe/module.py
  ``_partition_layers``, utils.py ``partition_balanced``). That exposed what the extra
  block had hidden: their memory came out 3-9 GiB low (about 1.7 bytes per parameter of
  the first stage) while the fp16 runs before that date fit. The cause is DeepSpeed's
  data-parallel reduction of BF16_Optimizer's gradients (ZeRO stage 0, as BLOOM ran it:
  pipe/engine.py ``_bf16_reduce_grads`` ->
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
  Nothing physical separates the pair in these terms; not special-cased. Its margin is
  15.9 GiB (64.1 of 80 GiB: states 49.6, activations 9.1, buffers and reserve 5.4): a term
  would have to add 16 GiB to this run and not to the 203B run, and the chronicle's row says
  only "OOM" (no stage, no phase: a transient outside the training step, such as a
  checkpoint save, would explain it and is not in the model). Session 8 found no such term.
  With the memory
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
  DeepSpeed's own stage partition (``type:transformer``, the deepspeed profile's default)
  changes nothing for these 72-block models (72 / pp is whole for every pp measured). Half
  the misordered pairs come from two runs (listed under "Misordered pairs"): dp8 tp8 pp6 mbs4
  at GBS 1568, published with its GBS 2048 twin's step time (113.0 vs 114.1 s for 23 % fewer
  samples, where the pp 12 twin scales: 92.8 vs 117.1 s), and dp24 tp8 pp2 mbs2, run at 76 of
  80 GB and predicted 6.8 % fast. Neither is special-cased. Above the source's noise the
  agreement is higher (summary). Session 8, by (tp, pp) at the sweep's 384 GPUs (median
  error): tp 8: pp 2 -2.7 %, pp 4 +4.0 %, pp 6 +2.7 %, pp 8 +11.5 %, pp 12 +7.5 %; tp 4: pp 6
  -4.5 %, pp 12 +0.7 %, pp 24 +5.3 %; tp 2: pp 12 -3.6 %, pp 24 +1.3 %. The error grows with
  the pipeline depth, more steeply at higher tp: what scales so is a fixed cost per stage and
  micro-batch (micro-batches per step = GBS tp pp / (384 mbs)), which the model charges only
  as the boundary transfers (1.5 % of the step at tp 8 pp 12) and the last stage's head. The
  fit keeps ``microbatch_overhead_s`` at 0 (its prior and lower bound): more cost per
  micro-batch does not help. Diagnostics (predictions adjusted, no re-fit, not
  shipped): the once-per-step data-parallel sync x 2 orders 349/388, x 3 357/388, but the
  Omni-Path links (4 x 100 Gb/s per node at 0.9) are what the README publishes and no source
  was found for DeepSpeed's ZeRO-1 reduction (``average_tensor``'s per-owner ``dist.reduce``,
  then the all-gather) running at a half or a third of that; removing the last stage's head
  imbalance orders 345-349 (x 0.25 .. x 1). Splitting the sweep at the 2022-02-25 PCIe/NUMA
  fix (the chronicle: "do not compare today's numbers to yesterday's") leaves 217/245 (89 %)
  of the same-date pairs ordered: the misorders are not the cross-date pairs. Session 9
  checked whether every tensor rank sends the whole boundary activation (tp copies through
  the node's NICs at tp 8): it does not. DeepSpeed's ``PipelineEngine`` of 2022-02-18
  (deepspeed/runtime/pipe/engine.py, commit 2151c78) sets ``is_pipe_partitioned =
  is_grad_partitioned = is_model_parallel``: each rank sends its 1/tp ``PartitionedTensor``
  of the activation and of its gradient, and the receiver all-gathers it over the slice
  (tensor) group, as the deepspeed profile's ``pipe_partitioned`` charges; the causal mask is
  not sent (Megatron-DeepSpeed's pretrain_gpt.py ``model_provider`` keeps it in
  ``args.attn_mask``); the topology loads every
  concurrent boundary of a node on its NICs. Nothing to change there: charging the whole
  activation per rank instead (a diagnostic, no re-fit) orders 339/388 pairs and moves the
  step-time median 3.0 -> 3.9 %. The bf16 runs' data-parallel sync is now an all-reduce
  ("Causes fixed", session 9), which moves no pair: all 46 misordered pairs are fp16 runs
  (the 0221/0225 tables), whose ZeRO-1 optimizer (stage_1_and_2.py ``average_tensor``)
  reduces each bucket's slices to their owners, a reduce-scatter's volume.
  Session 10: the lock-step of DeepSpeed's engine is not the cause either. At commit 2151c78
  every ``SendActivation`` / ``RecvActivation`` / ``SendGrad`` / ``RecvGrad`` of
  ``TrainSchedule`` is a blocking ``dist.send`` / ``dist.recv`` on the compute stream (p2p.py),
  the receiver then syncs the host (``PartitionedTensor.from_meta``: ``meta.tolist()``), so a
  transfer holds both ranks and a middle stage pays four transfers per micro-batch in series,
  the end stages two. bench/deepspeed_lockstep.py runs that order on each run's own stage times
  (tests/test_deepspeed_lockstep.py: equal stages take ``(m + p - 1)(F + B + 4c) - (2p + 4)c``;
  with the slowest stage last, the closed form less ``2c``): the 37 fp16 runs with PP of the
  0221 and 0225 tables (every misordered pair's) move by under 0.03 %, since the vocabulary head
  (0.10 s per micro-batch at tp 8, mbs 4: 0.7 of a block) makes the last stage the slowest at
  every pp measured, and it exchanges with its predecessor only, two transfers, as the closed
  form charges; the bf16 runs of 2022-02-28 and the 176B main run move +0.6 .. +1.6 % (their
  ``type:transformer|embedding`` partition lightens the last stage: a middle one paces). Rank
  agreement 342/388 unchanged, step-time median 2.9 -> 3.1 % (no re-fit): not shipped. The sign
  rules out every such term: the misordered runs are predicted too slow where the pipeline is
  deep (tp 8, pp 12: +7 .. +13 %), and a blocking or per-stage per-micro-batch cost adds time in
  proportion to pp. The 0225 tp 8 mbs 4 rows ran at the model's middle stage instead: measured
  seconds per micro-batch (the step less the modelled data-parallel sync, over m + p - 1 slots)
  0.83 and 0.84 (pp 12), 1.22 (pp 8), 1.61 (pp 6; 2.04 for the GBS-1568 row published with its
  twin's time), 2.46 (pp 4), the model's middle stage 0.85, 1.26, 1.68, 2.51, its last 0.95,
  1.37, 1.78, 2.61: the head's 0.10 s (its logits GEMMs take at least 0.07 s at the A100's peak)
  does not show, where the tp 2 rows run at 0.97-1.02 of the model's last stage and the tp 4
  rows at 0.93-1.06. Letting the per-block host overhead hide behind the head's GEMMs (the one
  mechanism found that shortens that stage; host time is modelled additive) gives a step-time
  median of 2.7 % but orders 338/388 (no re-fit). No sourced term for the gap was found
  (bench/deepspeed_lockstep.py prints these numbers).
* Step-time max (in-sample 26 %, held out 29 % since session 10's refresh, target 30 %: met, by
  0.7 point; 31 % before, one run): the Megatron-Core weak-scaling 32B run (tp 8, dp 48 over 48
  nodes, 4 sequences per data-parallel rank). The README gives no micro-batch size; the bench
  evaluates it at 1 and says so. There the model exposes 0.30 s of the fp32 gradient
  reduce-scatter and parameter all-gather (16 GB per GPU over one 50 GB/s NIC, one GPU per node
  in each data-parallel group), because Megatron's ``--overlap-grad-reduce`` overlaps it with
  the last micro-batch's backward only (0.14 s at micro-batch 1). Over the micro-batches it
  could have used (1, 2, 4: all fit without recomputation) the error spans -20 % .. +26 %
  in-sample and -16 % .. +29 % held out ("Runs without a published micro-batch size"). The
  headline keeps the assumption: picking the size that fits best would score the search against
  a guess. Over the runs that publish their micro-batch size the held-out max is 23 % (MPT-70B
  on 64 A100-40GB). The same 0.3-0.5 s of exposed data-parallel traffic is why the weak-scaling
  table is predicted 3 % slow held out (median). Session 9 checked each fact this reads against
  Megatron-LM at the README's commit 937571cf: ``--bf16`` forces
  ``accumulate_allreduce_grads_in_fp32`` (training/arguments.py), so the DDP grad buffer and
  its reduce-scatter are fp32 (``grad_reduce_in_fp32``,
  core/distributed/distributed_data_parallel.py; ``--grad-reduce-in-bf16`` did not exist); the
  schedules disable grad sync for every micro-batch but the last
  (pipeline_parallel/schedules.py ``enable_grad_sync``); ``--overlap-param-gather`` launches
  the first bucket's all-gather in ``zero_grad`` and each next one from the forward pre-hook
  that waits on the previous (core/optimizer/distrib_optimizer.py), so it hides behind the
  first micro-batch's forward only. The model's terms are those; the table
  (images/model_table.png) gives the batch size, not the micro-batch size, so how near the max
  comes to 30 % rests on the assumed micro-batch 1.
* Held out, torchtitan Llama 3.1 405B (tp8 pp8 FSDP 8, 512 H100, Float8, async TP; Table 5 of
  the torchtitan benchmark, not in the calibration files): memory 58.3 GiB predicted for 1F1B
  (82.5 measured), 60.4 for interleaved 1F1B (72.7); throughput 142 and 156 tokens/s/GPU
  predicted against 100 and 128 measured (30 % and 18 % optimistic). The only torchtitan
  calibration runs are 8B FSDP on one or sixteen nodes; both bands say "extrapolating".
* Held-out fit verdicts: 3 MPT runs that ran at 99-100 % of HBM are predicted just over when
  llm-foundry is held out (FSDP1's allocator overhead then comes from the other runtimes,
  0.16 -> about 0.23). Session 8, with each fold's constants: 0.158 -> 0.253, so MPT-7B at
  mbs 6 on 8 H100 and on 8 A100-80GB go 78.3 -> 83.5 GiB of 80 (on-GPU activations 54.0 GiB)
  and MPT-13B at mbs 16 on 64 A100-40GB 39.8 -> 42.7 GiB of 40. FSDP1's overhead is informed
  only by these runs' "it ran" (llm-foundry publishes no memory), so without them nothing
  pins it; the fix would be a measured memory reading of an FSDP1 run, not a term.
* The per-block host overhead of the eager runtimes (about 3 ms) is large for launches alone:
  host time is modelled as additive, where in reality it only shows when the GPU runs out of
  queued work; the bound keeps it physical."""
