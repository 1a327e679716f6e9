"""The device mesh: degrees, rank order and group strides. The ONE place the rank layout is written.

Consumed by the cost model (which link each group spans: :func:`planner.cost.context.mesh_links`),
the torch runtime (``init_device_mesh`` dims and group ranks) and the exporters (the world-size
arithmetic). Produces nothing but arithmetic on ranks.

Layout (Megatron-LM order, TP innermost): dimensions ``pp, dp, cp, tp`` from outermost to
innermost, so the global rank is ``((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank``.
TP groups are contiguous ranks (inside an NVLink domain when tp <= GPUs per node), CP groups have
stride tp, DP groups stride tp x cp, PP neighbours stride tp x cp x dp. ZeRO shards dense states
over the dp x cp ranks (stride tp). Expert parallelism does not add ranks: EP groups are ``ep``
consecutive members of the dp x cp ranks (stride tp), and routed-expert states are sharded over
the ``dp x cp / ep`` ranks holding the same experts (Megatron-Core's expert data parallelism).
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
    ep: int = 1  # expert parallel degree, carved out of dp x cp (adds no ranks)

    @property
    def num_gpus(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def shape(self) -> tuple[int, ...]:
        """Degrees in :data:`DIMS` order (the shape of ``torch.distributed.init_device_mesh``)."""
        return tuple(getattr(self, d) for d in DIMS)

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours of a ``dim`` group (``ep`` and ``shard``: stride tp)."""
        if dim in ("ep", "shard", "expert_shard"):
            return self.tp
        inner = DIMS[DIMS.index(dim) + 1:]
        out = 1
        for d in inner:
            out *= getattr(self, d)
        return out

    # -- group sizes the cost model reads --------------------------------------------------
    @property
    def shard_degree(self) -> int:
        """Ranks sharing the ZeRO states of dense parameters (Megatron shards over dp x cp)."""
        return self.dp * self.cp

    @property
    def expert_shard_degree(self) -> int:
        """Ranks sharing the ZeRO states of one routed expert: dp x cp / ep (at least 1)."""
        return max(self.shard_degree // self.ep, 1)

    # -- ranks -------------------------------------------------------------------------------
    def rank(self, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        coords = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
        return sum(coords[d] * self.stride(d) for d in DIMS)

    def coords(self, rank: int) -> dict[str, int]:
        out = {}
        for d in DIMS:
            out[d] = rank // self.stride(d) % getattr(self, d)
        return out

    def group(self, dim: str, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group along ``dim`` (pp, dp, cp, tp, or ep), in order."""
        c = self.coords(rank)
        if dim == "ep":  # ep consecutive members of the flattened dp x cp index
            flat = c["dp"] * self.cp + c["cp"]
            first = flat - flat % self.ep
            return tuple(self.rank(c["pp"], f // self.cp, f % self.cp, c["tp"])
                         for f in range(first, first + self.ep))
        return tuple(self.rank(**{**c, dim: k}) for k in range(getattr(self, dim)))

    def describe(self) -> str:
        """'64 GPUs = dp 8 x tp 4 x pp 2 x cp 1' (plus ', ep E' when experts are split)."""
        return (f"{self.num_gpus} GPUs = dp {self.dp} x tp {self.tp} x pp {self.pp} x cp {self.cp}"
                + (f", ep {self.ep}" if self.ep > 1 else ""))
