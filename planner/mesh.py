"""The device mesh: degrees, rank order and group strides. The ONE place the rank layout is written.

Consumed by the cost model (which link each group spans: :func:`planner.cost.context.mesh_links`),
the torch runtime (``init_device_mesh`` dims and group ranks) and the exporters (the world-size
arithmetic). Produces nothing but arithmetic on ranks.

Layout (Megatron-LM order, TP innermost): dimensions ``pp, dp, cp, tp`` from outermost to
innermost, so the global rank is ``((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank``.
TP groups are contiguous ranks (inside an NVLink domain when tp <= GPUs per node), CP groups have
stride tp, DP groups stride tp x cp, PP neighbours stride tp x cp x dp. ZeRO shards dense states
over the dp x cp ranks (stride tp); with hybrid sharding (HSDP, ``dp_shard`` < dp) over the
``dp_shard x cp`` ranks of consecutive dp indices (a contiguous block of dp_shard x cp x tp
ranks, stride tp), replicated over the ``dp / dp_shard`` such blocks (the replicate group,
stride dp_shard x cp x tp): torchtitan's ``dp_replicate x dp_shard`` mesh, PyTorch FSDP's
HYBRID_SHARD, Megatron's distributed-optimizer instances (DeepSpeed's MiCS is removed in 0.19).

Expert layers fold the same ``tp x cp x dp`` ranks of a pipeline stage into their own mesh
``etp x ep x edp`` (Megatron-Core MoE parallel folding, expert rank order ``tp-ep-dp-pp``;
torchtitan's expert mesh): expert tensor parallelism innermost (ETP groups: ``etp`` contiguous
ranks), then expert parallelism (EP groups: ``ep`` ranks at stride ``etp``), then expert data
parallelism (EDP groups: stride ``etp x ep``), which shards the routed experts' ZeRO states. So
``edp = tp x cp x dp / (etp x ep)``; EP spans TP and CP ranks whenever ``etp x ep`` exceeds what
dp alone provides. ``etp = tp`` (Megatron's default) gives EP groups of ``ep`` consecutive
members of the dp x cp ranks at stride tp.
"""
from __future__ import annotations

from dataclasses import dataclass

DIMS = ("pp", "dp", "cp", "tp")  # outermost to innermost


@dataclass(frozen=True)
class Mesh:
    pp: int = 1
    dp: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1  # expert parallel degree (adds no ranks: folded into tp x cp x dp)
    etp: int = 0  # expert tensor parallel degree; 0 = tp (Megatron-Core's default)
    dp_shard: int = 0  # dp ranks of one ZeRO / FSDP shard group; 0 = all of dp (no HSDP)

    @property
    def num_gpus(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def shape(self) -> tuple[int, ...]:
        """Degrees in :data:`DIMS` order (the shape of ``torch.distributed.init_device_mesh``)."""
        return tuple(getattr(self, d) for d in DIMS)

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours of a ``dim`` group. ``shard`` (the dense ZeRO group,
        dp x cp) has stride tp; the expert mesh: ``etp`` 1, ``ep`` etp, ``edp`` (= ``expert_shard``)
        etp x ep."""
        if dim == "shard":
            return self.tp
        if dim == "replicate":
            return self.tp * self.cp * self.shard_group
        if dim == "etp":
            return 1
        if dim == "ep":
            return self.expert_tp
        if dim in ("edp", "expert_shard"):
            return self.expert_tp * self.ep
        inner = DIMS[DIMS.index(dim) + 1:]
        out = 1
        for d in inner:
            out *= getattr(self, d)
        return out

    # -- group sizes the cost model reads --------------------------------------------------
    @property
    def shard_group(self) -> int:
        """dp ranks of one shard group (``dp_shard``, all of dp when 0)."""
        return self.dp_shard or self.dp

    @property
    def replicas(self) -> int:
        """Shard groups holding the same states (HSDP's replicate degree; 1 without HSDP)."""
        return self.dp // self.shard_group

    @property
    def shard_degree(self) -> int:
        """Ranks sharing the ZeRO states of dense parameters (Megatron shards over dp x cp;
        with HSDP over dp_shard x cp)."""
        return self.shard_group * self.cp

    @property
    def stage_size(self) -> int:
        """Ranks of one pipeline stage: tp x cp x dp, which the expert mesh folds anew."""
        return self.tp * self.cp * self.dp

    @property
    def expert_tp(self) -> int:
        """Expert tensor parallel degree (``etp``; tp when not given)."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Expert data parallel degree: tp x cp x dp / (etp x ep) (at least 1)."""
        return max(self.stage_size // (self.expert_tp * self.ep), 1)

    @property
    def expert_shard_degree(self) -> int:
        """Ranks sharing the ZeRO states of one routed expert: the expert data parallel group."""
        return self.expert_dp

    def expert_layout_error(self) -> str | None:
        """Why the expert mesh does not fold into the stage's ranks, or None."""
        if self.stage_size % (self.expert_tp * self.ep):
            return (f"etp x ep = {self.expert_tp} x {self.ep} = {self.expert_tp * self.ep} does "
                    f"not divide the tp x cp x dp = {self.stage_size} GPUs of a pipeline stage "
                    "(the expert mesh etp x ep x edp folds the same GPUs)")
        return None

    # -- ranks -------------------------------------------------------------------------------
    def rank(self, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        coords = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
        return sum(coords[d] * self.stride(d) for d in DIMS)

    def coords(self, rank: int) -> dict[str, int]:
        out = {}
        for d in DIMS:
            out[d] = rank // self.stride(d) % getattr(self, d)
        return out

    def expert_coords(self, rank: int) -> dict[str, int]:
        """``rank``'s place in the expert mesh of its stage: pp, edp, ep, etp indices."""
        stage, flat = divmod(rank, self.stage_size)
        etp, ep = self.expert_tp, self.ep
        return {"pp": stage, "edp": flat // (etp * ep), "ep": flat // etp % ep, "etp": flat % etp}

    def group(self, dim: str, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group along ``dim`` (pp, dp, cp, tp; or the expert mesh's
        etp, ep, edp), in order."""
        if dim in ("etp", "ep", "edp"):
            e = self.expert_coords(rank)
            size = {"etp": self.expert_tp, "ep": self.ep, "edp": self.expert_dp}[dim]
            stride = self.stride(dim)
            first = rank - e[dim] * stride
            return tuple(first + k * stride for k in range(size))
        c = self.coords(rank)
        return tuple(self.rank(**{**c, dim: k}) for k in range(getattr(self, dim)))

    def describe(self) -> str:
        """'64 GPUs = dp 8 x tp 4 x pp 2 x cp 1' (plus the expert mesh when experts are split)."""
        experts = (f", experts etp {self.expert_tp} x ep {self.ep} x edp {self.expert_dp}"
                   if self.ep > 1 or self.expert_tp != self.tp else "")
        hsdp = (f" (HSDP: shard {self.shard_group} x replicate {self.replicas})"
                if self.replicas > 1 else "")
        return (f"{self.num_gpus} GPUs = dp {self.dp}{hsdp} x tp {self.tp} x pp {self.pp} x cp "
                f"{self.cp}" + experts)
