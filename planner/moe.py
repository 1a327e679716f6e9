"""Mixture-of-experts settings of a training run and its runtime: how tokens are routed
(imbalance, capacity) and how the runtime moves them (dispatcher, overlap).

Consumed by :class:`planner.config.RuntimeOptions` (its ``moe`` field) and the MoE cost formulas
(:mod:`planner.cost.moe`). Plain validated data.

* ``imbalance``: tokens the busiest expert-parallel rank receives over the mean (max / mean
  load). 1.0 is perfectly balanced routing, which is what force-balanced benchmark runs measure
  (Megatron-Bridge: "we force-balance the token distribution among experts"; NeMo AutoModel's
  fake balanced gate); trained routers with an auxiliary or bias-based balancing loss stay near
  it (DeepSeek-V3 report §2.1.2), and a measured value can be given.
* ``capacity_factor``: 0 means dropless (every routed token is computed); c > 0 caps each expert
  at c times its balanced share (Megatron ``--moe-expert-capacity-factor``; tokens beyond it
  are dropped, GShard / Switch Transformer capacity).
* ``dispatcher``: ``alltoall`` (one flat all-to-all over the EP group: Megatron-Core's
  ``alltoall`` token dispatcher, torchtitan's ``all_to_all_single``) or ``deepep``
  (hierarchical: each token crosses the network once per remote NVLink domain holding one of
  its experts and is forwarded over NVLink there; DeepEP, Megatron ``--moe-token-dispatcher-type
  flex``, DeepSeek-V3 report §3.2.2).
* ``a2a_overlap``: fraction of the dispatch / combine time hidden behind independent compute
  (0: none; Megatron ``--overlap-moe-expert-parallel-comm`` and DualPipe hide most of it).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import invalid

DISPATCHERS = ("alltoall", "deepep")
# Fraction of the all-to-all a runtime hides by default behind independent compute (shared
# experts, the other micro-batch of Megatron's 1F1B EP overlap, the attention of DualPipe):
# fitted by bench/moe_fit.py on the measured runs (grid 0 / 0.5: 0.5, the lower mean error);
# --moe-a2a-overlap sets it per run.
DEFAULT_A2A_OVERLAP = 0.5


@dataclass(frozen=True)
class MoeOptions:
    imbalance: float = 1.0
    capacity_factor: float = 0.0  # 0: dropless
    dispatcher: str = "alltoall"
    a2a_overlap: float = DEFAULT_A2A_OVERLAP

    def validate(self) -> None:
        for name in ("imbalance", "capacity_factor", "a2a_overlap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                raise invalid(f"MoE option {name} must be a number, got {value!r}")
        if not 1.0 <= self.imbalance <= 64.0:
            raise invalid(f"--moe-imbalance must be between 1 (balanced) and 64, got "
                          f"{self.imbalance!r}", "it is the busiest rank's load over the mean")
        if self.capacity_factor != 0 and not 0.0 < self.capacity_factor <= 64.0:
            raise invalid(f"--moe-capacity-factor must be 0 (dropless) or in (0, 64], got "
                          f"{self.capacity_factor!r}")
        if not 0.0 <= self.a2a_overlap <= 1.0:
            raise invalid(f"--moe-a2a-overlap must be a fraction in [0, 1], got "
                          f"{self.a2a_overlap!r}")
        if self.dispatcher not in DISPATCHERS:
            raise invalid(f"--moe-dispatcher must be one of {', '.join(DISPATCHERS)}, got "
                          f"{self.dispatcher!r}")

    @property
    def dropless(self) -> bool:
        return self.capacity_factor == 0

    @property
    def load_factor(self) -> float:
        """Tokens the busiest expert rank computes over the balanced share: the imbalance,
        capped at the capacity when tokens are dropped."""
        if self.dropless:
            return float(self.imbalance)
        return float(min(self.imbalance, self.capacity_factor))
