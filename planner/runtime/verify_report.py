"""What ``shardplan verify`` reports: per-rank held bytes against the cost model's prediction,
the loss curves of the distributed and reference runs, and the verdict.

Consumes the per-rank result dicts of a run and the cost model's evaluation of the plan under
the torch-fp32 state layout; produces :class:`VerifyReport`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence


from planner.config import ParallelConfig, RuntimeOptions
from planner.plan_types import Plan


STATE_CATEGORIES = ("params", "grads", "optimizer")


@dataclass(frozen=True)
class StateCheck:
    """One model-state category on one rank: predicted vs held bytes."""

    category: str
    predicted: float
    held: int
    verdict: str  # "exact", "group-sum exact" or "mismatch"
    note: str = ""

    @property
    def difference(self) -> float:
        return self.held - self.predicted

    @property
    def ok(self) -> bool:
        return self.verdict != "mismatch"


@dataclass(frozen=True)
class RankReport:
    rank: int
    coords: dict
    stage: int
    layers: list
    states: tuple[StateCheck, ...]
    optimizer_step_counters: int
    activations_predicted: float  # the stage's activation memory (stored + working)
    activations_predicted_stored: float  # micro-batches in flight x stored bytes (no working)
    activations_measured: int
    setup_s: float
    step_s: list
    grad_layout_differences: list = field(default_factory=list)
    slowdown: float = 1.0  # an injected straggler (verify --slow): its compute x this factor
    injected_delay_s: list = field(default_factory=list)  # per step

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.states)


@dataclass
class VerifyReport:
    plan: str
    parallelism: dict
    world_size: int
    steps: int
    seed: int
    lr: float
    loss_rtol: float
    reference_losses: list[float]
    distributed_losses: list[float]
    ranks: list[RankReport]
    implementation: dict[str, str]
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    error_traceback: str | None = None
    seconds: dict = field(default_factory=dict)
    slow_ranks: dict = field(default_factory=dict)  # rank -> factor (verify --slow)
    reshard: list = field(default_factory=list)  # per rank: predicted vs moved bytes (layouts)
    a2a: list = field(default_factory=list)  # per rank: predicted vs moved expert all-to-all bytes
    expert_states: list = field(default_factory=list)  # per rank: routed experts' held bytes
    expert_grads: dict = field(default_factory=dict)  # first-step expert gradients vs reference

    @property
    def loss_rel_diffs(self) -> list[float]:
        return [abs(d - r) / max(abs(r), 1e-12)
                for r, d in zip(self.reference_losses, self.distributed_losses)]

    @property
    def max_loss_rel_diff(self) -> float | None:
        diffs = self.loss_rel_diffs
        return max(diffs) if diffs else None

    @property
    def losses_ok(self) -> bool:
        return (self.error is None and len(self.distributed_losses) == self.steps
                and len(self.reference_losses) == self.steps
                and all(math.isfinite(x) for x in self.distributed_losses)
                and all(d <= self.loss_rtol for d in self.loss_rel_diffs))

    @property
    def states_ok(self) -> bool:
        return self.error is None and bool(self.ranks) and all(r.ok for r in self.ranks)

    @property
    def reshard_ok(self) -> bool:
        return self.error is None and all(row["ok"] for row in self.reshard)

    @property
    def a2a_ok(self) -> bool:
        return self.error is None and all(row["ok"] for row in self.a2a)

    @property
    def expert_states_ok(self) -> bool:
        return self.error is None and all(row["ok"] for row in self.expert_states)

    @property
    def expert_grads_ok(self) -> bool:
        return self.error is None and self.expert_grads.get("ok", True)

    @property
    def ok(self) -> bool:
        return (self.losses_ok and self.states_ok and self.reshard_ok and self.a2a_ok
                and self.expert_states_ok and self.expert_grads_ok)

    def to_dict(self) -> dict:
        ranks = []
        for r in self.ranks:
            row = asdict(r)
            row["states"] = {s.category: {"predicted_bytes": s.predicted, "held_bytes": s.held,
                                          "difference_bytes": s.difference,
                                          "verdict": s.verdict, "note": s.note}
                             for s in r.states}
            row["ok"] = r.ok
            ranks.append(row)
        return {"plan": self.plan, "parallelism": self.parallelism,
                "world_size": self.world_size, "steps": self.steps, "seed": self.seed,
                "lr": self.lr,
                "loss": {"reference": self.reference_losses,
                         "distributed": self.distributed_losses,
                         "rel_diff": self.loss_rel_diffs,
                         "max_rel_diff": self.max_loss_rel_diff, "rtol": self.loss_rtol,
                         "ok": self.losses_ok},
                "states_ok": self.states_ok, "ok": self.ok, "ranks": ranks,
                "implementation": self.implementation, "notes": self.notes,
                "error": self.error, "error_traceback": self.error_traceback,
                "seconds": self.seconds,
                "slow_ranks": {str(k): v for k, v in sorted(self.slow_ranks.items())},
                "reshard": self.reshard, "reshard_ok": self.reshard_ok,
                "a2a": self.a2a, "a2a_ok": self.a2a_ok, "expert_states": self.expert_states,
                "expert_states_ok": self.expert_states_ok, "expert_grads": self.expert_grads,
                "expert_grads_ok": self.expert_grads_ok}


def _sharded_categories(zero: int) -> dict[str, str]:
    """Categories whose per-rank split is the runtime's (not the plan's even split), and why."""
    zro = ("ZeroRedundancyOptimizer assigns whole parameters to dp ranks (greedy by size), "
           "not an even split of every tensor")
    if zero == 1:
        return {"optimizer": zro}
    if zero == 2:
        return {"grads": zro, "optimizer": zro}
    if zero == 3:
        fsdp = ("FSDP2 shards dim 0 with torch.chunk: when dim 0 is not divisible by dp the "
                "last ranks hold fewer rows (padding is not counted)")
        return {c: fsdp for c in STATE_CATEGORIES}
    return {}


def state_checks(config: ParallelConfig, stage_memory: Sequence[Any], results: list[dict]
                 ) -> dict[int, tuple[StateCheck, ...]]:
    """Compare each rank's held bytes with its stage's predicted bytes (see VerifyReport)."""
    shard_degree = config.dp * config.cp
    explained = _sharded_categories(config.zero_stage) if shard_degree > 1 else {}
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        key = (r["coords"]["pp"], r["coords"]["tp"])
        groups.setdefault(key, []).append(r)
    out: dict[int, tuple[StateCheck, ...]] = {}
    for r in results:
        memory = stage_memory[r["stage"]]
        checks = []
        for category in STATE_CATEGORIES:
            predicted = float(getattr(memory, category))
            held = int(r["held"][category])
            if abs(held - predicted) < 0.5:
                checks.append(StateCheck(category, predicted, held, "exact"))
                continue
            if category in explained:
                group = groups[(r["coords"]["pp"], r["coords"]["tp"])]
                total = sum(int(g["held"][category]) for g in group)
                if abs(total - predicted * len(group)) < 0.5:
                    checks.append(StateCheck(
                        category, predicted, held, "group-sum exact",
                        f"{explained[category]}; the {len(group)} ranks of the shard group hold "
                        f"{total:,} B = {len(group)} x predicted"))
                    continue
            checks.append(StateCheck(category, predicted, held, "mismatch",
                                     f"held {held:,} B, predicted {predicted:,.1f} B"))
        out[r["rank"]] = tuple(checks)
    return out


def predicted_stored_activations(plan: Plan, options: RuntimeOptions) -> list[float]:
    """Per stage: micro-batches in flight x the bytes its layers store for backward (the
    cost model's activations without the transient working set of the layer in backward),
    which is what the saved-tensor measurement sees."""
    from planner.cost.memory import in_flight_micro_batches
    from planner.cost.terms import layer_terms

    c, model, placement = plan.config, plan.model, plan.placement
    contexts = plan.stage_contexts(options)
    out = []
    for stage in range(c.pp):
        per_micro_batch = sum(layer_terms(contexts[stage], model.layers[i], placement.options[i])
                              .act_stored_bytes for i in placement.layers_of_stage(stage))
        out.append(in_flight_micro_batches(stage, c.pp, c.num_micro_batches, c.virtual_stages)
                   * per_micro_batch)
    return out


def reshard_checks(changes: list[dict], results: list[dict], micro_batches: int,
                   act_bytes: int, measured_bytes: int = 4) -> list[dict]:
    """Per rank: the bytes its layout-change collectives received in each step (measured from
    the shards they moved, fp32) against the cost model's (:func:`reshard_prediction`'s
    per-micro-batch bytes x micro-batches, scaled from the model's 16-bit activations to
    fp32). Exact or a mismatch."""
    if not changes:
        return []
    out = []
    for r in results:
        per_mb = sum(ch["received_bytes"] for ch in changes if ch["stage"] == r["stage"])
        predicted = per_mb * micro_batches * measured_bytes / act_bytes
        moved = [int(f + b) for f, b in r["reshard_bytes"]]
        out.append({"rank": r["rank"], "predicted_bytes_per_step": predicted,
                    "moved_bytes_per_step": moved,
                    "ok": all(abs(x - predicted) < 0.5 for x in moved)})
    return out


def a2a_checks(per_micro_batch: list[float], results: list[dict], micro_batches: int,
               etp_per_micro_batch: Sequence[float] = ()) -> list[dict]:
    """Per rank: the bytes its MoE blocks' token exchange received from its peers in each step
    (forward + backward, fp32, counted from the sizes each collective moved): the dispatch and
    combine all-to-alls over the EP group and, with expert tensor parallelism, the gather and
    scatter over the ETP group, against the cost model's
    (:func:`planner.runtime.support.a2a_prediction` of its stage x micro-batches; the ETP part
    :func:`planner.runtime.support.etp_prediction`). Exact or a mismatch."""
    if not per_micro_batch:
        return []
    out = []
    for r in results:
        predicted = per_micro_batch[r["stage"]] * micro_batches
        etp = r.get("etp_bytes") or [[0, 0] for _ in r["a2a_bytes"]]
        moved = [int(f + b + ef + eb) for (f, b), (ef, eb) in zip(r["a2a_bytes"], etp)]
        row = {"rank": r["rank"], "stage": r["stage"],
               "predicted_bytes_per_step": predicted,
               "moved_bytes_per_step": moved,
               "forward_bytes_per_step": [int(f) for f, _ in r["a2a_bytes"]],
               "backward_bytes_per_step": [int(b) for _, b in r["a2a_bytes"]],
               "ok": all(abs(x - predicted) < 0.5 for x in moved)}
        if etp_per_micro_batch:
            row.update({
                "etp_predicted_bytes_per_step": etp_per_micro_batch[r["stage"]] * micro_batches,
                "etp_forward_bytes_per_step": [int(f) for f, _ in etp],
                "etp_backward_bytes_per_step": [int(b) for _, b in etp]})
        out.append(row)
    return out


def expert_grad_check(reference_sq: float, results: list[dict], config: ParallelConfig,
                      rtol: float) -> dict:
    """The routed experts' gradients after the first step's synchronisation, summed over ranks
    as the sum of their squares, against the single-process run's (relative difference within
    ``rtol``). Each element is on one rank of its expert (EP splits experts, ETP their width,
    ZeRO-2 their reduced gradients to one owner of the edp group, ZeRO-3 their rows over edp)
    except under ZeRO 0 / 1, where the edp ranks hold the reduced
    gradient alike, so their sum counts it edp times. Adam normalises a gradient's scale away:
    this catches a gradient averaged over the wrong group, which the losses move by ~1e-7
    only. Empty when the experts follow the dense parameters (tp 1, ep 1)."""
    held = [r.get("expert_grad_sq") for r in results]
    if not held or any(x is None for x in held):
        return {}
    copies = config.mesh.expert_dp if config.zero_stage < 2 else 1
    distributed = sum(held) / copies
    diff = abs(distributed - reference_sq) / max(abs(reference_sq), 1e-30)
    return {"reference_sum_sq": reference_sq, "distributed_sum_sq": distributed,
            "copies": copies, "rel_diff": diff, "rtol": rtol, "ok": diff <= rtol}


def expert_state_checks(predicted: list[dict[str, float]], results: list[dict], mesh
                        ) -> list[dict]:
    """Per rank: the routed experts' parameter, gradient and Adam bytes it holds against the
    cost model's (:func:`planner.runtime.support.expert_state_prediction` of its stage). Verdict
    per category as :func:`state_checks`: *exact*, or under ZeRO *group-sum exact* when
    ZeroRedundancyOptimizer's whole-tensor split leaves single ranks off the even split and the
    rank's expert data-parallel group (``mesh.group("edp", rank)``, :class:`planner.mesh.Mesh`)
    holds exactly its size x predicted; else a mismatch."""
    if not predicted:
        return []
    by_rank = {r["rank"]: r for r in results}
    out = []
    for r in results:
        row = {"rank": r["rank"], "stage": r["stage"]}
        ok = True
        for category in STATE_CATEGORIES:
            want, held = predicted[r["stage"]][category], int(r["held_experts"][category])
            verdict = "exact"
            if abs(held - want) >= 0.5:
                group = mesh.group("edp", r["rank"])
                total = sum(int(by_rank[g]["held_experts"][category]) for g in group)
                verdict = "group-sum exact" if len(group) > 1 and \
                    abs(total - want * len(group)) < 0.5 else "mismatch"
            row[category] = {"predicted_bytes": want, "held_bytes": held, "verdict": verdict}
            ok = ok and verdict != "mismatch"
        row["ok"] = ok
        out.append(row)
    return out
