"""The search's memory gate: a plan must fit at a chosen quantile of its peak-memory band.

Consumes ``--memory-confidence Q`` and the calibration profile's error bands
(:mod:`planner.calibration.bands`); produces, per outer configuration, the factor the band's
Q-quantile puts on the predicted peak, read from
:func:`planner.calibration.bands.quantile_factor`, the function ``check --memory-confidence``
gates with, so that a plan searched at Q passes ``check --memory-confidence Q``. A plan fits
the gate when ``peak x factor <= the memory limit`` (the GPU less ``--memory-headroom``), i.e.
when its peak is at most ``limit / factor``: the configuration's effective capacity, which the
bounds, the CP-SAT model and the uniform starts all use.

The factor depends on the configuration's regime (runtime, GPU generation, parallelism regime:
fixed by tp, pp, cp and the ZeRO stage) and, through the band's extrapolation widening, on the
block recomputation policies a placement uses (a policy no calibration run of the regime used
doubles the spread). So a configuration whose options mix policies the regime's runs used with
ones they did not has two gates: :meth:`MemoryGate.variants` splits it into the placements with
only seen policies (the smaller factor) and all placements (the larger one). Every placement
fits its true gate in one of the two exactly when it fits it at all: a placement with only seen
policies is in the first at its own factor; one with an unseen policy has the larger factor,
the second's. The best of the two is the best under the gate (the oracle test checks it).

Q = 0.5 is the prediction itself (factor 1): the search as without a gate.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from planner.calibration.bands import BandTable, quantile_factor
from planner.calibration.regimes import band_labels, regime_of
from planner.config import ParallelConfig
from planner.errors import invalid

DEFAULT_CONFIDENCE = 0.5  # the band's median: the prediction (check's default gate too)


@dataclass(frozen=True)
class MemoryGate:
    """Gate memory at the ``confidence`` quantile of the peak-memory band of ``bands``."""

    confidence: float
    bands: BandTable | None
    runtime: str  # the runtime profile (a regime label)
    gpu_name: str
    gpus: int
    params: float

    def __post_init__(self):
        if not 0 < self.confidence < 1:
            raise invalid(f"--memory-confidence must be in (0, 1), got {self.confidence!r}")

    @property
    def active(self) -> bool:
        return self.confidence != DEFAULT_CONFIDENCE and self.bands is not None \
            and "memory" in self.bands.pooled

    def factor(self, config: ParallelConfig, kinds: Iterable[str]) -> float:
        """The band's quantile over the prediction for a plan of ``config`` whose blocks use
        the recomputation policies ``kinds`` (planner.calibration.regimes.recompute_kinds)."""
        if not self.active:
            return 1.0
        labels = band_labels(regime_of(self.runtime, self.gpu_name, config.tp, config.pp,
                                       config.cp, config.zero_stage))
        return quantile_factor(self.bands, "memory", labels, self.gpus, self.params,
                               self.confidence, tuple(sorted(set(kinds))))

    def peak_limit_bytes(self, ev, limit_bytes: float) -> float:
        """The peak the evaluated plan ``ev`` may reach under the gate: ``limit_bytes`` over
        its factor (its configuration, the recomputation policies its blocks use, and its own
        GPU count: a re-plan on fewer GPUs reads the band for them, as ``check`` does). The
        one test the search, the re-plans and the fallbacks share."""
        from planner.calibration.regimes import recompute_kinds

        if not self.active:
            return limit_bytes
        gate = self if ev.cluster.num_gpus == self.gpus else replace(self,
                                                                      gpus=ev.cluster.num_gpus)
        factor = gate.factor(ev.config, recompute_kinds(ev.model, ev.placement))
        return limit_bytes if factor == 1.0 else limit_bytes / factor

    def variants(self, config: ParallelConfig, values: Iterable[str]
                 ) -> list[tuple[frozenset | None, float]]:
        """(the recomputation policies a part of ``config``'s placements keeps, or None for
        all; that part's factor), for the policies ``values`` its blocks may take: one part
        when every policy gives the same factor, else the placements with only the policies of
        the least factor, then all placements at the factor of all (see the module doc)."""
        values = sorted(set(values))
        whole = self.factor(config, values)
        if not self.active or len(values) < 2:
            return [(None, whole)]
        each = {v: self.factor(config, (v,)) for v in values}
        least = min(each.values())
        seen = frozenset(v for v in values if each[v] == least)
        if len(seen) == len(values):
            return [(None, whole)]
        return [(seen, self.factor(config, seen)), (None, whole)]


def memory_gate(confidence: float, calibration, model, cluster, runtime: str) -> MemoryGate:
    """The gate for a search of ``model`` on ``cluster``: ``calibration`` is the profile
    whose bands ``check`` reads for the plan (the one given with --calibration, else the
    shipped one)."""
    from planner.calibration.store import shipped

    cal = calibration if calibration is not None else shipped()
    return MemoryGate(confidence, None if cal is None else cal.bands, runtime,
                      cluster.gpu.name, cluster.num_gpus, model.params)


def plan_gate(plan) -> MemoryGate | None:
    """The gate a one-pool plan was searched under (its ``solver.memory_confidence``, with the
    bands of the profile it records, else the shipped one: the profile ``check`` reads);
    None for a plan searched at the prediction or across pools."""
    confidence = (plan.document.get("solver") or {}).get("memory_confidence",
                                                         DEFAULT_CONFIDENCE)
    if plan.across_pools or confidence == DEFAULT_CONFIDENCE:
        return None
    gate = memory_gate(confidence, plan.recorded_calibration(), plan.model, plan.cluster,
                       plan.runtime.profile)
    return gate if gate.active else None
