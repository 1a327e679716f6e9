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
* ``cuda_graph``: what the runtime captures in CUDA graphs, which the host then replays with
  one launch instead of issuing every kernel (Megatron-Core ``--cuda-graph-impl`` /
  ``--cuda-graph-scope``). ``none``: nothing of the expert computation (also the partial TE
  scopes ``attn``, ``moe_router``, ``moe_preprocess``, which leave the permutation, dispatch,
  grouped GEMMs and combine to the host); ``moe``: each MoE layer's expert part (scope ``moe``;
  it needs static shapes, i.e. a capacity factor with padded inputs); ``full_iteration``: the
  whole forward-backward step (``--cuda-graph-impl local --cuda-graph-scope full_iteration``;
  dropless routing then runs sync-free: dispatch and grouped-GEMM buffers pre-sized at
  ``--moe-expert-rank-capacity-factor`` times the balanced share, Megatron-Core's paged stash).
"""
from __future__ import annotations

from dataclasses import dataclass

from planner.errors import invalid

DISPATCHERS = ("alltoall", "deepep")
CUDA_GRAPHS = ("none", "moe", "full_iteration")
# Expert-rank buffer capacity of sync-free dropless execution under a full-iteration CUDA graph:
# dispatch and grouped-GEMM buffers are sized at this multiple of the balanced share (the value
# Megatron-Bridge's full-iteration MoE perf recipes set: ``moe_expert_rank_capacity_factor =
# 1.5``, recipes for Qwen3 and DeepSeek-V3 MXFP8 on GB200 / GB300 / B300).
SYNC_FREE_RANK_CAPACITY = 1.5
# Fraction of the all-to-all a runtime hides by default behind independent compute (shared
# experts, the other micro-batch of Megatron's 1F1B EP overlap, the attention of DualPipe):
# fitted by bench/moe_fit.py on the measured runs (grid 0 / 0.5: 0.5 until session 11; 0 in
# session 11 once node-limited routing and DeepEP's SM reservation are costed: mean + median
# 16.3 % vs 17.4 % at the old point, 0 being the physical bound: nothing hidden without an
# overlap schedule); --moe-a2a-overlap sets it per run.
DEFAULT_A2A_OVERLAP = 0.0
# Fraction hidden by Megatron-Core's EP communication overlap (``--overlap-moe-expert-parallel-
# comm``, Megatron-Bridge ``moe_a2a_overlap = True``): the 1F1B schedule runs one micro-batch's
# dispatch and combine while another's forward or backward computes (the DualPipe idea,
# DeepSeek-V3 report §3.2.1), which hides nearly all of it where compute covers it. Fitted by
# bench/moe_fit.py on the runs whose recipes enable it (bench/moe_accuracy.py
# ``A2A_OVERLAP_RECIPES``; grid 0.8 / 0.9 / 1: 0.9; 1 in session 6, 0.9 in session 7, which
# costs the device work the dropless read-back waits for, planner.cost.moe.host_floor_s; 1 again
# once session 8 costs the GB300 DeepSeek-V3 recipe's FP8 attention; 0.8 in session 10, with
# the FP8 head and router in 16 bits, the recipes' DeepSeek-V3 pipeline layouts and one GEMM
# per local expert, planner.cost.moe.EXPERT_GEMM_S: mean + median 20.1 % vs 20.9 % at 1; 0.9
# again in session 10 once each synchronised forward pass is its own host / device cycle,
# planner.cost.moe.host_floor_s: 16.8 % vs 16.9 % at 0.8; 1 in session 11 with the default
# overlap at 0, node-limited routing and DeepEP's SM reservation: 16.3 % vs 17.4 % at the old
# point, the physical bound: all of it hidden; 0.9 again in session 11's second re-fit, with
# the host floor kept under its measured bound and AutoModel's runs read as their recipes run
# them: mean + median 16.4 %, against 16.3 % at 1.0 with a floor above that bound);
# ``--moe-a2a-overlap`` takes it for such a runtime.
EP_COMM_OVERLAP = 0.9


@dataclass(frozen=True)
class MoeOptions:
    imbalance: float = 1.0
    capacity_factor: float = 0.0  # 0: dropless
    dispatcher: str = "alltoall"
    a2a_overlap: float = DEFAULT_A2A_OVERLAP
    cuda_graph: str = "none"

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
        if self.cuda_graph not in CUDA_GRAPHS:
            raise invalid(f"--cuda-graph must be one of {', '.join(CUDA_GRAPHS)}, got "
                          f"{self.cuda_graph!r}")
        if self.cuda_graph == "moe" and self.dropless:
            raise invalid("--cuda-graph moe captures the MoE layer, which needs static shapes: "
                          "give a --moe-capacity-factor (padded to capacity)",
                          "or use --cuda-graph full_iteration (sync-free dropless)")

    @property
    def dropless(self) -> bool:
        return self.capacity_factor == 0

    @property
    def host_synchronised(self) -> bool:
        """Whether each MoE layer pass waits for the host to read the token counts back
        (dropless routing without a full-iteration graph's sync-free buffers)."""
        return self.dropless and self.cuda_graph != "full_iteration"

    @property
    def host_captured(self) -> bool:
        """Whether a CUDA graph replays the MoE layer's kernels (no per-kernel host issue)."""
        return self.cuda_graph != "none"

    @property
    def buffer_factor(self) -> float:
        """Dispatch buffers over the balanced share: the load factor, or the sync-free rank
        capacity where a full-iteration graph pre-sizes them."""
        if self.dropless and self.cuda_graph == "full_iteration":
            return max(self.load_factor, SYNC_FREE_RANK_CAPACITY)
        return self.load_factor

    @property
    def load_factor(self) -> float:
        """Tokens the busiest expert rank computes over the balanced share: the imbalance,
        capped at the capacity when tokens are dropped."""
        if self.dropless:
            return float(self.imbalance)
        return float(min(self.imbalance, self.capacity_factor))
