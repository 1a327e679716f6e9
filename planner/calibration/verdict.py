"""``check``'s memory verdict from the calibration's error bands: "fits", "fits only at the
optimistic end" or "does not fit", and the peak at a confidence quantile (the gate that
``check --memory-confidence``, ``plan --memory-confidence`` and the stored fallbacks share).

Consumes an :class:`~planner.cost.model.Evaluation` and a calibration profile (or the shipped
one); produces plain numbers. Its own module so that ``planner.check`` and
``planner.hetero.fallbacks`` both use it without importing each other.
"""
from __future__ import annotations

from planner.hardware import GIB


def memory_verdict(ev, confidence: float, calibration=None
                   ) -> tuple[str, tuple[float, float], float] | None:
    """(verdict, 80 % memory interval in GiB, peak at the ``confidence`` quantile) from the
    calibration's error bands (planner/calibration/bands.py; ``calibration``: a profile, a
    profile file, or None for the shipped one); None without bands."""
    from planner.calibration.bands import NOMINAL_COVERAGE, band, quantile_factor
    from planner.calibration.regimes import band_labels, recompute_kinds, regime_of
    from planner.calibration.store import CalibrationProfile, load, shipped

    cal = calibration if isinstance(calibration, CalibrationProfile) else \
        load(calibration) if calibration is not None else shipped()
    if cal is None or cal.bands is None:
        return None
    c = ev.config
    labels = band_labels(regime_of(ev.options.profile, ev.cluster.gpu.name, c.tp, c.pp, c.cp,
                                   c.zero_stage))
    peak = ev.peak_memory_bytes / GIB
    args = (cal.bands, "memory", peak, labels, ev.cluster.num_gpus, ev.model.params)
    # the band the plan records (planner.calibration.session.prediction_intervals): widened
    # where no calibration run used the plan's block recomputation
    kinds = recompute_kinds(ev.model, ev.placement)
    nominal = band(*args, NOMINAL_COVERAGE, kinds)
    # the band scales with the prediction: peak x factor is the band's quantile to the bit
    gate = peak * quantile_factor(cal.bands, "memory", labels, ev.cluster.num_gpus,
                                  ev.model.params, confidence, kinds)
    capacity = ev.cluster.memory_bytes_per_gpu / GIB
    if peak > capacity:
        text = "does not fit"
    elif nominal.high > capacity:
        text = "fits only at the optimistic end"
    else:
        text = "fits"
    return text, (nominal.low, nominal.high), gate
