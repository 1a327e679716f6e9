"""Outer search space: the mesh shapes, micro-batch sizes, schedules and ZeRO stages to try.

Consumes a model, a cluster, the global batch / sequence length / dtype and the user's pins;
produces every valid :class:`~planner.config.ParallelConfig` in a fixed, sorted order.

Choices (each documented so users know what is searched):
* tp: divisors of the GPUs per node that divide the attention heads (TP stays inside the NVLink
  domain); wider TP only when pinned.
* cp: 1, and for sequences of 16k tokens or more, 2..8 (powers of two).
* pp: every divisor of the remaining GPUs up to the number of blocks; dp is what is left.
* ep, etp (MoE only): the expert mesh folds the tp x cp x dp GPUs of a stage into
  etp x ep x edp (planner.mesh.Mesh). etp is 1 or tp (both runtimes support these; other values
  only when pinned); ep every divisor of tp x cp x dp / etp that divides the experts; edp is
  what is left.
* micro-batch: divisors of global_batch / dp up to 16.
* virtual stages: 1, and v in 2..8 when pp > 1, the blocks split into pp x v equal chunks and the
  micro-batches are a multiple of pp (Megatron-LM's interleaving rules). Where the runtime
  runs unequal chunks (profile ``uneven_chunks``: Megatron's
  ``--pipeline-model-parallel-layout``, torchtitan's per-stage layer counts) also the v whose
  pp x v chunks do not divide the blocks: the first ``blocks mod (pp x v)`` chunks hold one
  block more (:func:`planner.strategy.interleaved_rank`; Llama 3 405B's 126 layers).
* a pinned pipeline layout (``pipeline_layout``, Megatron's syntax, planner/pipeline_layout.py):
  pp every divisor of its chunk count above 1, v the chunk count / pp; its blocks per chunk
  fix the placement (the runtime must run uneven chunks).
* ZeRO 0..3, sequence parallelism on and off when tp > 1.
* hybrid sharding (HSDP, ``dp_shard``), where the runtime profile runs it for that ZeRO stage:
  one node per shard group (tp x cp x dp_shard = the node's GPUs, at least 2 shard ranks,
  fewer than all of dp), replicated over dp / dp_shard groups. Other sizes, and any HSDP
  without a profile, only when pinned.
* ZeRO++ hpZ (``hpz``), where the profile runs it (DeepSpeed): off, and for ZeRO-3 over dp
  only (tp, cp, pp 1) on more than one node, a secondary partition over one node's GPUs.
  Other sizes only when pinned.

A runtime profile (planner/profiles.py) narrows all of this to what that runtime can run: its
ZeRO / FSDP stages, whether it has TP, PP, CP, EP and interleaving, whether SP is a choice or
implied by TP, and its recomputation policies (:meth:`Pins.block_options`). A pin the runtime
cannot honour is an error that says so.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterator, Mapping

from planner import offload_rules
from planner.config import ParallelConfig
from planner.errors import PlannerError, invalid
from planner.cost.pipeline import SCHEDULES, default_schedule
from planner.hardware import Cluster
from planner.ir import ModelGraph
from planner.strategy import (RECOMPUTE_POLICIES, LayerOption, Recompute, block_options,
                               block_options_for, per_layer_layouts)

MAX_MICRO_BATCH = 16
MAX_VIRTUAL_STAGES = 8
LONG_SEQUENCE = 16384

PIN_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "micro_batch", "virtual_stages",
            "recompute", "layouts", "offload", "dp_shard", "schedule", "hpz", "pipeline_layout")
LAYOUT_CHOICES = ("mesh", "per-layer")  # layouts=per-layer: the solver picks one per block class
# offload=optimizer: each layer may keep its optimizer states and master weights in host memory
# (needs the cluster's host: section; planner/cost/offload.py); offload=activations: each block
# may keep its saved activations there (a runtime that offers it: RuntimeProfile.
# activation_offload); offload=both: either or both per block
OFFLOAD_CHOICES = ("none", "optimizer", "activations", "both")


@dataclass(frozen=True)
class Pins:
    """Values the user fixed with ``--pin key=value``; None means searched."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    sp: bool | None = None
    zero: int | None = None
    micro_batch: int | None = None
    virtual_stages: int | None = None
    recompute: Recompute | None = None
    layouts: str | None = None  # "mesh" (the default) or "per-layer"
    offload: str | None = None  # "none" (the default), "optimizer", "activations" or "both"
    dp_shard: int | None = None  # HSDP shard group (dp ranks); = dp: plain ZeRO / FSDP
    # pipeline schedules to try (planner.cost.pipeline.SCHEDULES): "zbv", or "1f1b,zb-h1"
    schedule: tuple[str, ...] | None = None
    hpz: int | None = None  # ZeRO++ hpZ secondary partition ranks; 0: off
    # an explicit pipeline layout (Megatron-Core's --pipeline-model-parallel-layout,
    # planner/pipeline_layout.py), as written: its chunk count fixes pp x virtual_stages and
    # its blocks per chunk the placement; the search chooses pp among the divisors of the
    # chunk count, and everything else
    pipeline_layout: str | None = None

    @property
    def layout(self):
        """The pinned pipeline layout, parsed (None when not pinned)."""
        from planner.pipeline_layout import parse_layout

        return parse_layout(self.pipeline_layout) if self.pipeline_layout else None

    @staticmethod
    def parse(items: Mapping[str, str]) -> "Pins":
        values: dict = {}
        for key, raw in items.items():
            name = key.strip().replace("-", "_")
            if name == "zero_stage":
                name = "zero"
            if name not in PIN_KEYS:
                raise invalid(f"unknown pin {key!r}", f"valid pins: {', '.join(PIN_KEYS)}")
            text = str(raw).strip().lower()
            if name == "pipeline_layout":  # case matters: E, L (planner/pipeline_layout.py)
                from planner.pipeline_layout import parse_layout

                layout = parse_layout(str(raw).strip())
                if layout.num_chunks < 2:
                    raise invalid(f"pin pipeline_layout={raw!r} has one chunk: a layout splits "
                                  "the layers over pipeline ranks",
                                  "separate the pp x virtual stages chunks with |")
                values[name] = str(raw).strip()
            elif name == "sp":
                if text not in ("true", "false", "on", "off", "1", "0", "yes", "no"):
                    raise invalid(f"pin sp={raw!r}: expected on/off")
                values[name] = text in ("true", "on", "1", "yes")
            elif name == "layouts":
                if text not in LAYOUT_CHOICES:
                    raise invalid(f"pin layouts={raw!r}: expected {' or '.join(LAYOUT_CHOICES)}")
                values[name] = text
            elif name == "schedule":
                names = tuple(dict.fromkeys(x.strip() for x in text.split(",")))
                if not names or any(x not in SCHEDULES for x in names):
                    raise invalid(f"pin schedule={raw!r}: expected one or more (comma-"
                                  f"separated) of {', '.join(SCHEDULES)}")
                values[name] = names
            elif name == "offload":
                if text not in OFFLOAD_CHOICES:
                    raise invalid(f"pin offload={raw!r}: expected {' or '.join(OFFLOAD_CHOICES)}")
                values[name] = text
            elif name == "recompute":
                try:
                    values[name] = Recompute(text)
                except ValueError:
                    raise invalid(f"pin recompute={raw!r}: expected one of "
                                  f"{', '.join(r.value for r in Recompute)}") from None
            else:
                if not text.isdigit() or int(text) < (0 if name in ("zero", "hpz") else 1):
                    raise invalid(f"pin {key}={raw!r}: expected a positive integer")
                values[name] = int(text)
        if values.get("zero") is not None and values["zero"] > 3:
            raise invalid(f"pin zero={values['zero']}: ZeRO stages are 0, 1, 2, 3")
        return Pins(**values)

    def block_options(self, config: ParallelConfig | None = None,
                      runtime=None) -> tuple[LayerOption, ...]:
        """The per-block options these pins allow under ``config`` (every one
        :func:`planner.strategy.block_options_for` gives; with ``layouts=per-layer`` every
        layout :func:`planner.strategy.per_layer_layouts` gives) with the recomputation
        policies of the ``runtime`` profile (the default ones without a profile), unless
        recompute is pinned."""
        if runtime is None:
            allowed = RECOMPUTE_POLICIES
        else:  # every-nth is a mix of none and full blocks, which the solver places itself
            allowed = tuple(r for r in Recompute
                            if any(p.planner == r.value or (p.planner == "every-nth" and r in
                                                           (Recompute.NONE, Recompute.FULL))
                                   for p in runtime.recompute))
        if self.recompute is not None:
            if self.recompute not in allowed:
                raise invalid(f"pin recompute={self.recompute.value}: runtime "
                              f"{runtime.name} has no such policy",
                              f"its policies: {', '.join(p.name for p in runtime.recompute)}")
            allowed = (self.recompute,)
        offload = (False, True) if self.offload in ("optimizer", "both") else (False,)
        act = (False, True) if self.offload in ("activations", "both") else (False,)
        if self.layouts == "per-layer":
            options = block_options(allowed, per_layer_layouts(config), offload, act)
        elif len(offload) > 1 or len(act) > 1:
            layouts = dict.fromkeys(o.layout for o in block_options_for(config, allowed))
            options = block_options(allowed, layouts, offload, act)
        else:
            return block_options_for(config, allowed)
        # activation offload only as Megatron-Core runs it (planner/offload_rules.py)
        return offload_rules.searchable(options, config.pp if config is not None else None)

    def check_runtime(self, runtime) -> None:
        """Refuse pins the runtime profile cannot run (before any search)."""
        bad = []
        if self.zero is not None and not runtime.allows_zero(self.zero):
            bad.append(f"zero={self.zero} (it runs {', '.join(map(str, runtime.zero_stages))})")
        for name, flag in (("tp", runtime.tp), ("pp", runtime.pp), ("cp", runtime.cp),
                           ("ep", runtime.ep)):
            value = getattr(self, name)
            if value is not None and value > 1 and not flag:
                bad.append(f"{name}={value} (it has no {name.upper()})")
        if self.virtual_stages is not None and self.virtual_stages > 1 and \
                not runtime.allows_schedule("interleaved-1f1b"):
            bad.append(f"virtual_stages={self.virtual_stages} (no interleaved schedule)")
        if self.schedule is not None and \
                not any(runtime.allows_schedule(x) for x in self.schedule):
            bad.append(f"schedule={','.join(self.schedule)} (it offers "
                       f"{', '.join(runtime.schedules)})")
        if self.etp is not None and self.etp > 1 and not runtime.allows_etp(self.etp, self.tp or
                                                                             self.etp):
            bad.append(f"etp={self.etp} (its expert tensor parallelism: "
                       f"{runtime.expert_tp.replace('-', ' ')})")
        if self.sp is not None and runtime.sp == "none" and self.sp:
            bad.append("sp=on (it has no sequence parallelism)")
        if self.dp_shard is not None and (self.dp is None or self.dp_shard < self.dp) and \
                not (runtime.hsdp and (self.zero is None or self.zero in runtime.hsdp_stages)):
            bad.append(f"dp_shard={self.dp_shard} (its hybrid sharding: "
                       + (f"{runtime.hsdp_name}, with ZeRO "
                          f"{', '.join(map(str, runtime.hsdp_stages))}" if runtime.hsdp
                          else "none") + ")")
        if self.hpz and not (runtime.hpz and self.zero in (None, 3)):
            bad.append(f"hpz={self.hpz} (" + (f"its {runtime.hpz_name} needs ZeRO-3"
                                              if runtime.hpz else "it has no ZeRO++ hpZ") + ")")
        if self.offload in ("activations", "both") and not runtime.activation_offload:
            bad.append(f"offload={self.offload} (it has no activation offload)")
        elif self.offload == "activations":  # nothing else to offload: refuse a pin that bars it
            bad += [f"offload=activations with {why}" for why in offload_rules.pinned_refusals(
                self.pp, self.recompute.value if self.recompute is not None else None)]
        if self.pipeline_layout and not runtime.uneven_chunks:
            bad.append(f"pipeline_layout={self.pipeline_layout} (its pipeline stages are not "
                       f"set layer by layer: profile uneven_chunks is off)")
        if bad:
            raise invalid(f"runtime {runtime.name} cannot run the pinned "
                          f"{'; '.join(bad)}", "drop the pin, or choose another --runtime")

    def as_dict(self) -> dict:
        return {f.name: (v.value if isinstance(v, Recompute) else
                         ",".join(v) if isinstance(v, tuple) else v)
                for f in fields(self) if (v := getattr(self, f.name)) is not None}


def _schedules(pins: Pins, runtime, pp: int, v: int, m: int) -> list[str]:
    """The pipeline schedules to try with ``v`` chunks per rank ("" = the default 1F1B or
    interleaved 1F1B first): those the runtime profile runs with v chunks (without a profile
    the default only), or the pinned one."""
    if pp == 1:  # no pipeline: 1F1B's degenerate case, kept when the pins allow 1F1B
        return [""] if pins.schedule is None or "1f1b" in pins.schedule else []
    names = [default_schedule(v)] + ([] if runtime is None else
                                     [s for s in SCHEDULES if s != default_schedule(v)])
    out = []
    for name in names:
        spec = SCHEDULES[name]
        if pins.schedule is not None and name not in pins.schedule:
            continue
        if v < spec.min_chunks or (spec.max_chunks and v > spec.max_chunks) or \
                m < spec.min_micro_batches_per_rank * pp:
            continue
        if runtime is not None and not runtime.allows_schedule_with(name, v):
            continue
        out.append(name)
    if pins.schedule is None:
        out = [name for name in out if not any(_dominates(other, name) for other in out)]
    return ["" if name == default_schedule(v) else name for name in out]


def _dominates(a: str, b: str) -> bool:
    """Schedule ``a`` is never slower than ``b`` on the same placement and holds no more
    activations (planner/cost/pipeline.py), so the search need not solve ``b`` (a pin still
    can): ZB-V over DualPipeV (same V, p instead of p + 1/2 micro-batches in flight, every
    bubble piece no larger: DualPipeV's F&B overlap is not modelled). ZB-H1 is never slower
    than interleaved 1F1B with the same chunks but holds p micro-batches on every rank where
    1F1B holds p - r, so both are solved."""
    return (a, b) == ("zbv", "dualpipev")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _choices(pinned, default: list) -> list:
    return [pinned] if pinned is not None else default


def _shard_groups(pins: Pins, runtime, zero: int, tp: int, cp: int, dp: int,
                  gpus_per_node: int) -> list[int]:
    """The ``dp_shard`` values to try (0 = shard over all of dp, first)."""
    if pins.dp_shard is not None:
        return [0 if pins.dp_shard == dp else pins.dp_shard]
    out = [0]
    if runtime is None:
        return out
    # one node per shard group (PyTorch's HYBRID_SHARD default; torchtitan's HSDP recipes):
    # the states shard over the node's fast links and replicate over the slow ones. Other
    # group sizes only when pinned (each would be one more CP-SAT solve per configuration).
    if gpus_per_node % (tp * cp):
        return out
    d = gpus_per_node // (tp * cp)
    if d < dp and dp % d == 0 and d * cp >= 2 and \
            runtime.allows_hsdp(zero, gpus_per_node, gpus_per_node):
        out.append(d)
    return out


def _hpz_groups(pins: Pins, runtime, zero: int, tp: int, cp: int, pp: int, dp: int,
                shard: int, gpus_per_node: int) -> list[int]:
    """The ``hpz`` values to try (0 = no secondary partition, first): one node's GPUs where
    the runtime keeps hpZ's secondary partition and it is not the whole of dp."""
    if pins.hpz is not None:
        return [pins.hpz]
    if runtime is None or shard or tp * cp * pp > 1 or gpus_per_node < 2 or \
            dp <= gpus_per_node or dp % gpus_per_node or \
            not runtime.allows_hpz(zero, gpus_per_node, gpus_per_node):
        return [0]
    return [0, gpus_per_node]


def _expert_meshes(pins: Pins, tp: int, cp: int, dp: int, experts: int,
                   expert_ffn: int, runtime=None) -> list[tuple[int, int]]:
    """(ep, etp) choices of a stage of tp x cp x dp GPUs; etp 0 means "= tp" (dense models: the
    one choice (1, 0)). ``runtime`` (a RuntimeProfile) keeps the etp it runs."""
    if experts <= 1:
        return [(1, 0)] if pins.ep in (None, 1) else []
    stage = tp * cp * dp
    etps = [pins.etp] if pins.etp is not None else sorted({1, tp})
    if runtime is not None:
        etps = [e for e in etps if runtime.allows_etp(e, tp)]
    out = []
    for etp in etps:
        if stage % etp or expert_ffn % etp:
            continue
        eps = [e for e in _divisors(stage // etp) if experts % e == 0]
        for ep in _choices(pins.ep, eps):
            if (stage // etp) % ep == 0:
                out.append((ep, 0 if etp == tp else etp))
    return out


def default_choices(tps: list[int], seq_len: int, pins: Pins,
                    runtime=None) -> tuple[list[int], list[int], list[int]]:
    """The tensor, context and ZeRO degrees a search tries when none is pinned: the given
    tensor degrees, context parallelism 2, 4 or 8 only for long sequences it splits into
    2 x cp chunks (load-balanced causal attention), ZeRO 0-3; ``runtime`` (a RuntimeProfile)
    keeps only what that runtime can run (and refuses pins it cannot)."""
    cps = [1] + ([c for c in (2, 4, 8) if seq_len % (2 * c) == 0]
                 if seq_len >= LONG_SEQUENCE else [])
    zeros = [0, 1, 2, 3]
    if runtime is None:
        return tps, cps, zeros
    pins.check_runtime(runtime)
    return (tps if runtime.tp else [1], cps if runtime.cp else [1],
            [z for z in zeros if z in runtime.search_zero_stages])


def enumerate_configs(model: ModelGraph, cluster: Cluster, global_batch: int, seq_len: int,
                      dtype: str, pins: Pins = Pins(), runtime=None) -> Iterator[ParallelConfig]:
    """Every valid configuration in a fixed order; ``runtime`` (a RuntimeProfile) keeps only
    what that runtime can run."""
    n = cluster.num_gpus
    blocks = model.num_blocks
    heads = min((b.attention.num_heads for b in model.blocks() if b.attention), default=1)
    experts = max((b.mlp.num_experts for b in model.blocks() if b.mlp), default=1)
    expert_ffn = min((b.mlp.ffn_hidden for b in model.blocks() if b.mlp and b.mlp.is_moe),
                     default=1)
    tp_default, cp_default, zero_default = default_choices(
        [t for t in _divisors(cluster.gpus_per_node) if heads % t == 0 and n % t == 0],
        seq_len, pins, runtime)
    layout = pins.layout
    if layout is not None:  # the layout's own rules against this model, said once
        layout.check(blocks, model.num_mtp, model.name)
    for tp in _choices(pins.tp, tp_default):
        for cp in _choices(pins.cp, cp_default):
            if n % (tp * cp):
                continue
            pps = [p for p in _divisors(n // (tp * cp)) if p <= blocks]
            if layout is not None:  # pp x v = the layout's chunks, pp > 1
                pps = [p for p in _divisors(n // (tp * cp))
                       if p > 1 and layout.num_chunks % p == 0]
            if runtime is not None and not runtime.pp:
                pps = [1]
            for pp in _choices(pins.pp, pps):
                if n % (tp * cp * pp):
                    continue
                dp = n // (tp * cp * pp)
                if pins.dp is not None and pins.dp != dp:
                    continue
                if global_batch % dp:
                    continue
                meshes = _expert_meshes(pins, tp, cp, dp, experts, expert_ffn, runtime)
                if runtime is not None and not runtime.ep:
                    meshes = [(ep, etp) for ep, etp in meshes if ep == 1]
                for ep, etp in meshes:
                    for mbs in _choices(pins.micro_batch, [b for b in _divisors(global_batch // dp)
                                                           if b <= MAX_MICRO_BATCH]):
                        m = global_batch // (dp * mbs) if global_batch % (dp * mbs) == 0 else 0
                        if not m:
                            continue
                        vs = [1]
                        if pp > 1 and m % pp == 0 and (
                                runtime is None or runtime.allows_schedule("interleaved-1f1b")):
                            uneven = runtime is not None and runtime.uneven_chunks
                            vs += [v for v in range(2, MAX_VIRTUAL_STAGES + 1)
                                   if blocks % (pp * v) == 0 or
                                   (uneven and pp * v <= blocks)]
                        if layout is not None:
                            vs = [layout.num_chunks // pp]
                        for v, schedule in ((v, s) for v in _choices(pins.virtual_stages, vs)
                                            for s in _schedules(pins, runtime, pp, v, m)):
                            sps = [True, False] if tp > 1 else [False]
                            if runtime is not None and tp > 1 and runtime.sp != "optional":
                                sps = [runtime.sp == "with-tp"]
                            for zero in _choices(pins.zero, zero_default):
                                if runtime is not None and \
                                        not runtime.allows_zero_with(zero, pp):
                                    continue  # e.g. DeepSpeed's pipeline engine: ZeRO <= 1
                                shards = _shard_groups(pins, runtime, zero, tp, cp, dp,
                                                       cluster.gpus_per_node)
                                for sp, shard, hpz in (
                                        (a, b, h) for a in _choices(pins.sp, sps)
                                        for b in shards
                                        for h in _hpz_groups(pins, runtime, zero, tp, cp, pp,
                                                             dp, b, cluster.gpus_per_node)):
                                    config = ParallelConfig(
                                        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, sp=sp,
                                        zero_stage=zero, micro_batch=mbs,
                                        global_batch=global_batch, seq_len=seq_len,
                                        virtual_stages=v, dtype=dtype, dp_shard=shard,
                                        pipeline_schedule=schedule, hpz=hpz,
                                        pipeline_layout=pins.pipeline_layout or "")
                                    try:
                                        config.validate(model, cluster)
                                    except PlannerError:
                                        continue
                                    yield config


def why_no_config(model: ModelGraph, cluster: Cluster, global_batch: int, seq_len: int,
                  dtype: str, pins: Pins = Pins(), runtime=None) -> list[str]:
    """Why :func:`enumerate_configs` yields nothing, one line per cause: each pin that leaves no
    configuration on its own (with the arithmetic where it is a degree), else the pins together,
    else the global batch."""
    n, blocks = cluster.num_gpus, model.num_blocks
    heads = min((b.attention.num_heads for b in model.blocks() if b.attention), default=1)
    reasons = []
    pinned = {f.name: getattr(pins, f.name) for f in fields(pins)
              if getattr(pins, f.name) is not None}
    for name, value in pinned.items():
        alone = Pins(**{name: value})
        if next(enumerate_configs(model, cluster, global_batch, seq_len, dtype, alone, runtime),
                None) is not None:
            continue
        shown = alone.as_dict()[name]
        why = ""
        if name in ("tp", "pp", "cp", "dp") and n % value:
            why = f"{value} {'exceeds' if value > n else 'does not divide'} the {n} GPUs"
        elif name == "tp" and heads % value:
            why = f"{value} does not divide the model's {heads} attention heads"
        elif name == "pp" and value > blocks:
            why = f"more stages than the model's {blocks} blocks"
        elif name == "dp" and global_batch % value:
            why = f"the global batch {global_batch} does not split over {value} ranks"
        elif name == "micro_batch" and not any(global_batch % (d * value) == 0
                                               for d in _divisors(n)):
            why = (f"no data-parallel degree d of the {n} GPUs has d x {value} dividing the "
                   f"global batch {global_batch}")
        reasons.append(f"pin {name}={shown} leaves no valid configuration"
                       + (f": {why}" if why else ""))
    if not reasons and pinned:
        reasons.append("the pins " + ", ".join(f"{k}={v}" for k, v in pins.as_dict().items())
                       + " leave no valid configuration together, though each alone does")
    if not reasons and not any(global_batch % (n // d) == 0 for d in _divisors(n)):
        reasons.append(f"the global batch {global_batch} splits over no data-parallel degree "
                       f"the {n} GPUs allow")
    return reasons
