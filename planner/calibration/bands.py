"""Error bands: an interval with a stated nominal coverage around every prediction.

The band of a prediction comes from the residuals of the calibration fit in the prediction's
regime (planner/calibration/regimes.py): the log-ratio ``log(measured / predicted)`` of the
calibration runs of the same runtime, GPU generation and parallelism regime has mean ``mu`` and
spread ``sigma``; the interval is ``predicted * exp(mu -/+ z * sigma)`` with ``z`` the normal
quantile of the nominal coverage (80 %: z = 1.2816). Small groups borrow strength from the
wider ones: a label's sigma is shrunk toward the pooled sigma with a prior weight of
``PRIOR_RUNS`` runs (sigma^2 = (n s^2 + k S^2) / (n + k)). A centre is counted by sources
(publications), not runs: the median of the sources' median residuals, shrunk toward the pooled
one (itself a median of source medians) with a prior weight of ``PRIOR_SOURCES`` sources
(mu = (J m + k M) / (J + k), J sources): a source's runs share a setup, so their errors are
correlated, and the runs of a new user resemble a new source, not one more run of the source
with the most runs (partial pooling: Gelman & Hill, Data Analysis Using Regression and
Multilevel/Hierarchical Models, 2007, §12.2). The most specific label with at
least ``MIN_RUNS`` runs is used (the full regime, then the parallelism regime, the GPU
generation, the runtime). Outside the calibration data's coverage (a regime with no run,
more than twice the GPUs or the parameters of any calibration run of the regime, a block
recomputation policy no calibration run of the regime used) the spread is multiplied by
``EXTRAPOLATION_WIDENING`` and the band says why ("extrapolating: ...").
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

NOMINAL_COVERAGE = 0.80
PRIOR_RUNS = 4
# the prior weight of the pooled centre, in sources, when a label's centre is shrunk toward
# it: one source's worth (a unit-information prior, Kass & Wasserman, JASA 90:928, 1995)
PRIOR_SOURCES = 1
EXTRAPOLATION_WIDENING = 2.0
MIN_SIGMA = 0.02  # measurement noise floor: repeated published runs differ by ~2 %
MIN_RUNS = 3
MAD_TO_SIGMA = 1.4826


def z_of(coverage: float) -> float:
    return statistics.NormalDist().inv_cdf(0.5 + coverage / 2)


@dataclass(frozen=True)
class Spread:
    """Residual statistics of one label: log-ratio mean and standard deviation, run count, and
    the largest GPU count / parameter count the label's calibration runs reached."""

    n: int
    mu: float
    sigma: float
    max_gpus: int = 0
    max_params: float = 0.0
    max_mfu: float = 0.0  # the highest MFU measured among the label's runs (0: unknown)
    # the block recomputation policies the label's runs used (planner.strategy.Recompute
    # values; empty: not recorded, no check)
    recompute: tuple[str, ...] = ()
    # the number of sources (publications) among the runs; when known (> 0), ``mu`` is the
    # median of the sources' median residuals, not of the runs'
    sources: int = 0

    def to_plain(self, exact: bool = False) -> dict:
        """Rounded for a profile file; ``exact``: as held (a plan's record of its profile)."""
        if exact:
            out = {"n": self.n, "mu": self.mu, "sigma": self.sigma, "max_gpus": self.max_gpus,
                   "max_params": self.max_params, "max_mfu": self.max_mfu}
        else:
            out = {"n": self.n, "mu": round(self.mu, 5), "sigma": round(self.sigma, 5),
                   "max_gpus": self.max_gpus, "max_params": float(f"{self.max_params:.4g}"),
                   "max_mfu": round(self.max_mfu, 4)}
        if self.recompute:
            out["recompute"] = list(self.recompute)
        if self.sources:
            out["sources"] = self.sources
        return out

    @staticmethod
    def from_plain(data: Mapping) -> "Spread":
        return Spread(int(data["n"]), float(data["mu"]), float(data["sigma"]),
                      int(data.get("max_gpus", 0)), float(data.get("max_params", 0.0)),
                      float(data.get("max_mfu", 0.0)),
                      tuple(str(x) for x in data.get("recompute") or ()),
                      int(data.get("sources", 0)))


@dataclass(frozen=True)
class BandTable:
    """Per quantity ("step_time", "memory"): the pooled spread and one spread per label
    ("runtime:megatron", "generation:hopper", "parallelism:fsdp")."""

    pooled: Mapping[str, Spread]
    labels: Mapping[str, Mapping[str, Spread]] = field(default_factory=dict)

    def to_plain(self, exact: bool = False) -> dict:
        return {q: {"pooled": self.pooled[q].to_plain(exact),
                    "labels": {k: v.to_plain(exact)
                               for k, v in sorted(self.labels.get(q, {}).items())}}
                for q in sorted(self.pooled)}

    @staticmethod
    def from_plain(data: Mapping) -> "BandTable":
        pooled = {q: Spread.from_plain(v["pooled"]) for q, v in data.items()}
        labels = {q: {k: Spread.from_plain(s) for k, s in v.get("labels", {}).items()}
                  for q, v in data.items()}
        return BandTable(pooled, labels)


def spread_of(log_ratios: Sequence[float], gpus: Sequence[int] = (),
              params: Sequence[float] = (), mfus: Sequence[float] = (),
              recompute: Iterable[Iterable[str]] = (), sources: Sequence[str] = ()) -> Spread:
    n = len(log_ratios)
    if n == 0:
        return Spread(0, 0.0, 0.0)
    # robust location and scale (median, 1.4826 x median absolute deviation: the standard
    # deviation for normal residuals), so that one run the model cannot represent does not
    # widen every band of its regime (Huber, Robust Statistics, 1981, §5.1)
    mu = statistics.median(log_ratios)
    sigma = MAD_TO_SIGMA * statistics.median(abs(x - mu) for x in log_ratios) if n > 1 else 0.0
    count = 0
    if sources and all(sources):
        # the centre counted by sources, the unit a new user's runs resemble (a source's runs
        # share a setup: their errors are correlated), not by runs: the median of the sources'
        # medians, so that one source with many runs does not set the centre alone
        by_source: dict[str, list[float]] = {}
        for x, key in zip(log_ratios, sources):
            by_source.setdefault(key, []).append(x)
        mu = statistics.median(statistics.median(v) for v in by_source.values())
        count = len(by_source)
    return Spread(n, mu, sigma, max(gpus, default=0), max(params, default=0.0),
                  max(mfus, default=0.0), tuple(sorted({k for ks in recompute for k in ks})),
                  count)


def build_table(samples: Iterable[tuple]) -> BandTable:
    """``samples``: (quantity, log(measured/predicted), labels, GPUs, parameters[, measured
    MFU[, the run's block recomputation policies[, its source]]])."""
    by_q: dict[str, list] = {}
    for quantity, ratio, labels, gpus, params, *rest in samples:
        by_q.setdefault(quantity, []).append((ratio, labels, gpus, params,
                                              rest[0] if rest else 0.0,
                                              tuple(rest[1]) if len(rest) > 1 else (),
                                              rest[2] if len(rest) > 2 else ""))
    pooled, per_label = {}, {}
    for q, items in by_q.items():
        pooled[q] = spread_of([x[0] for x in items], [x[2] for x in items],
                              [x[3] for x in items], [x[4] for x in items],
                              [x[5] for x in items], [x[6] for x in items])
        groups: dict[str, list] = {}
        for item in items:
            for label in item[1]:
                groups.setdefault(label, []).append(item)
        per_label[q] = {k: spread_of([x[0] for x in v], [x[2] for x in v], [x[3] for x in v],
                                     [x[4] for x in v], [x[5] for x in v], [x[6] for x in v])
                        for k, v in groups.items()}
    return BandTable(pooled, per_label)


def widened(table: BandTable, between: Mapping[str, float]) -> BandTable:
    """``table`` with every spread of quantity q combined with ``between[q]``, the spread of
    the errors between calibration sources (``sigma^2 = s^2 + tau^2``): the in-sample residuals
    of a regime describe runs like the fitted ones; a run from another setup (another cluster,
    software version or measuring convention) also carries its source's own offset, which the
    leave-one-source-out estimate measures (bench/holdout.py)."""
    def wide(s: Spread, tau: float) -> Spread:
        return replace(s, sigma=math.sqrt(s.sigma ** 2 + tau ** 2))

    pooled = {q: wide(s, between.get(q, 0.0)) for q, s in table.pooled.items()}
    labels = {q: {k: wide(s, between.get(q, 0.0)) for k, s in v.items()}
              for q, v in table.labels.items()}
    return BandTable(pooled, labels)


def mfu_reason(table: BandTable, mfu: float, generation: str,
               regime: str = "", runtime: str = "") -> str | None:
    """An extrapolation note when a predicted MFU exceeds every MFU measured on that GPU
    generation in the calibration data; short of that, every MFU measured in the prediction's
    regime (runtime / generation / parallelism), or with its runtime on any GPU where the
    regime has no run: a ZeRO-3 plan at an MFU no ZeRO-3 run reached is no safer for being
    below the best Megatron run of its GPUs."""
    labels = table.labels.get("step_time", {})
    s = labels.get(f"generation:{generation}")
    if s is not None and s.max_mfu and mfu > s.max_mfu:
        return (f"predicted MFU {mfu:.1%} is above the highest measured on {generation} GPUs "
                f"in the calibration data ({s.max_mfu:.1%})")
    own = labels.get(f"regime:{regime}") if regime else None
    if own is not None and own.max_mfu:
        if mfu > own.max_mfu:
            return (f"predicted MFU {mfu:.1%} is above the highest measured in its regime "
                    f"{regime} in the calibration data ({own.max_mfu:.1%})")
        return None
    anywhere = labels.get(f"runtime:{runtime}") if runtime else None
    if anywhere is not None and anywhere.max_mfu and mfu > anywhere.max_mfu:
        return (f"predicted MFU {mfu:.1%} is above the highest measured with {runtime} on any "
                f"GPU in the calibration data ({anywhere.max_mfu:.1%})")
    return None


def chosen_label(table: BandTable, quantity: str, labels: Sequence[str]
                 ) -> tuple[str, Spread] | None:
    """The most specific of ``labels`` with at least ``MIN_RUNS`` calibration runs (None:
    none has, the band falls back to the pooled spread)."""
    for label in labels:
        s = table.labels.get(quantity, {}).get(label)
        if s is not None and s.n >= MIN_RUNS:
            return label, s
    return None


def centre(table: BandTable, quantity: str, labels: Sequence[str]) -> float:
    """The log-ratio centre ``mu`` of a band: the chosen label's median residual shrunk toward
    the pooled one (the pooled one where no label has enough runs). With the runs' sources
    known (``Spread.sources``) both are medians of the sources' medians and the weight is the
    label's number of sources against ``PRIOR_SOURCES``: a label of one source lends only half
    of that source's offset to another runtime's runs; without, runs against ``PRIOR_RUNS``."""
    pooled = table.pooled[quantity]
    chosen = chosen_label(table, quantity, labels)
    if chosen is None:
        return pooled.mu
    s = chosen[1]
    if s.sources:
        return (s.sources * s.mu + PRIOR_SOURCES * pooled.mu) / (s.sources + PRIOR_SOURCES)
    return (s.n * s.mu + PRIOR_RUNS * pooled.mu) / (s.n + PRIOR_RUNS)


@dataclass(frozen=True)
class Band:
    low: float
    high: float
    coverage: float
    extrapolating: tuple[str, ...]

    @property
    def interval(self) -> list[float]:
        return [self.low, self.high]


def band(table: BandTable, quantity: str, predicted: float, labels: Sequence[str],
         gpus: int, params: float, coverage: float = NOMINAL_COVERAGE,
         recompute: Iterable[str] = ()) -> Band:
    """The interval around ``predicted``; ``labels`` from the most specific (the full regime
    key) to the least (one label): the first with at least ``MIN_RUNS`` calibration runs sets
    the spread, shrunk toward the pooled one. ``recompute``: the prediction's block
    recomputation policies (planner.calibration.regimes.recompute_kinds)."""
    pooled = table.pooled.get(quantity)
    if pooled is None or pooled.n == 0 or not math.isfinite(predicted):
        return Band(predicted, predicted, coverage, ("no calibration data",))
    z = z_of(coverage)
    pooled_sigma = max(pooled.sigma, MIN_SIGMA)
    reasons: list[str] = []
    chosen = chosen_label(table, quantity, labels)
    widen = 1.0
    if chosen is None:
        mu, sigma = pooled.mu, pooled_sigma
        widen = EXTRAPOLATION_WIDENING
        last = labels[-1] if labels else "this regime"
        reasons.append(f"no calibration runs with {last.split(':', 1)[-1]}")
    else:
        label, s = chosen
        if labels and label != labels[0] and labels[0].startswith("regime:"):
            few = table.labels.get(quantity, {}).get(labels[0])
            reasons.append(f"{few.n if few else 0} calibration runs of regime "
                           f"{labels[0].split(':', 1)[1]}: band from all {label.split(':', 1)[1]}"
                           f" runs")
        mu = centre(table, quantity, labels)
        sigma = math.sqrt((s.n * s.sigma ** 2 + PRIOR_RUNS * pooled_sigma ** 2)
                          / (s.n + PRIOR_RUNS))
        name = label.split(":", 1)[-1]
        if s.max_gpus and gpus > 2 * s.max_gpus:
            widen = EXTRAPOLATION_WIDENING
            reasons.append(f"no calibration run with {name} beyond {s.max_gpus} GPUs")
        if s.max_params and params > 2 * s.max_params:
            widen = EXTRAPOLATION_WIDENING
            reasons.append(f"no calibration run with {name} on a model beyond "
                           f"{s.max_params / 1e9:.0f}B parameters")
        unseen = sorted(set(recompute) - set(s.recompute)) if s.recompute else []
        if unseen:
            widen = EXTRAPOLATION_WIDENING
            reasons.append(f"no calibration run of {name} with {' or '.join(unseen)} "
                           f"recomputation of a block (its runs: {', '.join(s.recompute)})")
    sigma = max(sigma, MIN_SIGMA) * widen
    lo_log, hi_log = mu - z * sigma, mu + z * sigma
    return Band(predicted * math.exp(min(lo_log, 0.0)), predicted * math.exp(max(hi_log, 0.0)),
                coverage, tuple(reasons))


def quantile_factor(table: BandTable, quantity: str, labels: Sequence[str], gpus: int,
                    params: float, confidence: float, recompute: Iterable[str] = ()) -> float:
    """The ``confidence`` quantile of a prediction's band over the prediction (a factor: the
    band scales with the prediction): 1 at 0.5 (the prediction itself), the high end of the
    central ``2 q - 1`` band above it, the low end of the ``1 - 2 q`` band below it. The one
    definition of a gate's quantile: ``check --memory-confidence``
    (planner.calibration.verdict.memory_verdict) and the search's memory gate
    (planner.solve.gate) both read it."""
    if confidence > 0.5:
        return band(table, quantity, 1.0, labels, gpus, params, 2 * confidence - 1,
                    recompute).high
    if confidence < 0.5:
        return band(table, quantity, 1.0, labels, gpus, params, 1 - 2 * confidence,
                    recompute).low
    return 1.0
