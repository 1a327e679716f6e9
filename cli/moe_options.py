"""Mixture-of-experts command-line options (evaluate, plan): routing and token dispatch.

One decorator adds them; :func:`moe_options_from` turns the parsed values into
:class:`planner.moe.MoeOptions` (validated; bad values exit 2 with the reason).
"""
from __future__ import annotations

import click

from cli.params import FiniteFloat
from planner.moe import CUDA_GRAPHS, DEFAULT_A2A_OVERLAP, DISPATCHERS, MoeOptions

_OPTIONS = (
    click.option("--moe-imbalance", type=FiniteFloat(1.0, 64.0), default=1.0, show_default=True,
                 help="MoE routing imbalance: the busiest expert rank's tokens over the mean "
                      "(1 = balanced, as force-balanced benchmarks run)."),
    click.option("--moe-capacity-factor", type=FiniteFloat(0.0, 64.0), default=0.0,
                 show_default=True,
                 help="Expert capacity factor (tokens beyond it are dropped); 0 = dropless."),
    click.option("--moe-dispatcher", type=click.Choice(DISPATCHERS), default="alltoall",
                 show_default=True,
                 help="Token dispatch: one flat all-to-all, or deepep (hierarchical: each "
                      "token crosses the network once per remote NVLink domain)."),
    click.option("--moe-a2a-overlap", type=FiniteFloat(0.0, 1.0), default=DEFAULT_A2A_OVERLAP,
                 show_default=True,
                 help="Fraction of the dispatch/combine time hidden behind compute (the "
                      "default is fitted on measured MoE runs)."),
    click.option("--cuda-graph", type=click.Choice(CUDA_GRAPHS), default="none",
                 show_default=True,
                 help="What the runtime captures in CUDA graphs: none (or only attention / "
                      "router), moe (each MoE layer; needs a capacity factor) or "
                      "full_iteration (the whole step, sync-free dropless MoE). Captured "
                      "layers do not wait on the host to issue their kernels."),
    click.option("--recompute-modules", default="core_attn", show_default=True,
                 metavar="M[,M...]",
                 help="What a selective layer recomputes (Megatron --recompute-modules): "
                      "core_attn, mla_up_proj, moe_act, layernorm, mlp, shared_experts."),
    click.option("--cross-entropy", type=click.Choice(("fp32", "bf16", "fused")),
                 default="fp32", show_default=True,
                 help="The loss over the vocabulary: fp32 (logits upcast), bf16 (no upcast) or "
                      "fused (the gradient written into the 16-bit logits; Megatron "
                      "--cross-entropy-loss-fusion)."),
    click.option("--fp8-attention", is_flag=True, default=False,
                 help="With --dtype fp8, run the attention core in FP8 too (Transformer "
                      "Engine's FP8 attention; Megatron --fp8-dot-product-attention)."),
    click.option("--mtp-layers", type=click.IntRange(0, 8), default=0, show_default=True,
                 help="Multi-token prediction modules on the last pipeline stage (DeepSeek-V3; "
                      "Megatron --mtp-num-layers): each one more block and loss head."),
)


def moe_option(func):
    for option in reversed(_OPTIONS):
        func = option(func)
    return func


def with_mtp_from(kwargs: dict, graph):
    """Pop ``--mtp-layers`` and append that many MTP modules to ``graph`` (models/mtp.py)."""
    from models.mtp import with_mtp
    return with_mtp(graph, kwargs.pop("mtp_layers"))


def recompute_modules_from(kwargs: dict) -> tuple[str, ...]:
    """Pop ``--recompute-modules`` (comma- or space-separated names), checked."""
    from planner.cost.recompute_modules import validate_modules
    from planner.errors import invalid

    names = [n for n in kwargs.pop("recompute_modules").replace(",", " ").split() if n]
    try:
        return validate_modules(names)
    except ValueError as error:
        raise invalid(f"--recompute-modules: {error}") from None


def cross_entropy_from(kwargs: dict) -> str:
    """Pop ``--cross-entropy``."""
    return kwargs.pop("cross_entropy")


def fp8_attention_from(kwargs: dict) -> bool:
    """Pop ``--fp8-attention``."""
    return bool(kwargs.pop("fp8_attention"))


def moe_options_from(kwargs: dict) -> MoeOptions:
    """Pop the MoE options from a command's keyword arguments."""
    options = MoeOptions(imbalance=kwargs.pop("moe_imbalance"),
                         capacity_factor=kwargs.pop("moe_capacity_factor"),
                         dispatcher=kwargs.pop("moe_dispatcher"),
                         a2a_overlap=kwargs.pop("moe_a2a_overlap"),
                         cuda_graph=kwargs.pop("cuda_graph"))
    options.validate()
    return options
