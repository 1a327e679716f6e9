"""Regimes: the coarse classes of configuration the accuracy report and the error bands use.

A prediction is judged where the search lands (optimizer's curse: a search exploits every
optimistic error of its cost model), so errors are reported and bands are sized per regime,
never only in aggregate. Three independent labels:

* runtime profile (``megatron``, ``torchtitan``, ``deepspeed``, ``fsdp``; planner/profiles.py);
* GPU generation (ampere, hopper, blackwell, ...), from the GPU preset name;
* parallelism regime, from the degrees alone (first match wins):
  ``fsdp`` (ZeRO-3 / FSDP full or hybrid sharding), ``cp`` (context parallel),
  ``deep-pp`` (pp >= 8), ``pp`` (pp 2-7), ``tp`` (tp >= 4, no pp), ``dp`` (the rest: data
  parallel with at most tp 2).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.ir import LayerKind

PARALLELISM_REGIMES = ("fsdp", "cp", "deep-pp", "pp", "tp", "dp")
REGIME_TITLES = {
    "fsdp": "FSDP / ZeRO-3", "cp": "context parallel", "deep-pp": "deep PP (pp >= 8)",
    "pp": "PP (pp 2-7)", "tp": "TP-heavy (tp >= 4, no PP)", "dp": "DP (tp <= 2, no PP)",
}
GENERATIONS = (("gb200", "blackwell"), ("gb300", "blackwell"), ("b200", "blackwell"),
               ("b300", "blackwell"), ("h100", "hopper"), ("h200", "hopper"),
               ("h800", "hopper"), ("a100", "ampere"), ("a800", "ampere"), ("v100", "volta"),
               ("mi300", "cdna3"), ("mi325", "cdna3"))


def gpu_generation(gpu_name: str) -> str:
    """The architecture generation of a GPU preset name ("other" when unknown)."""
    name = gpu_name.lower()
    for key, generation in GENERATIONS:
        if key in name:
            return generation
    return "other"


def parallelism_regime(tp: int, pp: int, cp: int, zero_stage: int) -> str:
    if zero_stage >= 3:
        return "fsdp"
    if cp > 1:
        return "cp"
    if pp >= 8:
        return "deep-pp"
    if pp > 1:
        return "pp"
    if tp >= 4:
        return "tp"
    return "dp"


@dataclass(frozen=True)
class Regime:
    runtime: str
    generation: str
    parallelism: str

    @property
    def key(self) -> str:
        return f"{self.runtime}/{self.generation}/{self.parallelism}"


def regime_of(runtime: str, gpu_name: str, tp: int, pp: int, cp: int, zero_stage: int) -> Regime:
    return Regime(runtime, gpu_generation(gpu_name), parallelism_regime(tp, pp, cp, zero_stage))


def band_labels(regime: Regime) -> list[str]:
    """Labels for the error bands, most specific first (planner/calibration/bands.py)."""
    return [f"regime:{regime.key}", f"parallelism:{regime.parallelism}",
            f"generation:{regime.generation}", f"runtime:{regime.runtime}"]


def recompute_kinds(model, placement) -> tuple[str, ...]:
    """The recomputation policies a plan gives its blocks (planner.strategy.Recompute values,
    sorted): what the error bands check their calibration runs against."""
    return tuple(sorted({r.value for r, layer in zip(placement.recompute, model.layers)
                         if layer.kind is LayerKind.BLOCK}))
