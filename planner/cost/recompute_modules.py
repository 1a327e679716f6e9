"""Module-level selective recomputation: which parts of a block a SELECTIVE layer recomputes
in backward instead of storing, the bytes that saves and the forward work it repeats.

Megatron-Core's ``--recompute-granularity selective --recompute-modules M ...`` (default
``core_attn``; ``TransformerConfig.recompute_modules``): each named module's forward runs again
in backward from its stored input, so its outputs are not kept. The planner's
:attr:`planner.strategy.Recompute.SELECTIVE` applies the runtime's module set
(:attr:`planner.config.RuntimeOptions.recompute_modules`); the default ``("core_attn",)`` is the
attention core alone, what SELECTIVE always meant.

Modules (what is not stored, per token on one GPU; what is recomputed):

* ``core_attn``: the attention core's internals (softmax and dropout of eager attention, the
  log-sum-exp of flash attention; :func:`planner.cost.memory.block_activation_bytes_per_token`
  returns them as its second value); the core's forward.
* ``mla_up_proj``: multi-head latent attention's up-projected queries, keys and values (the
  attention core's inputs, ``heads x (2 x qk_head_dim + v_head_dim) / tp``); the query and
  key-value up-projection GEMMs from the stored latents.
* ``moe_act``: the routed experts' activation output (the second grouped GEMM's input, width
  ``F / etp`` per routed token copy); the element-wise activation.
* ``layernorm``: the two norm outputs (the QKV and FC1 GEMM inputs, ``2h``, split by sequence
  parallelism); the element-wise norms.
* ``mlp``: a dense layer's MLP intermediates (FC1 and activation outputs); the dense MLP's GEMMs.
* ``shared_experts``: the shared experts' intermediates; their GEMMs.

GEMM inputs kept in FP8 (``fp8_inputs``, Transformer Engine) store one byte per element where
this module would have saved two.
"""
from __future__ import annotations

from planner.ir import Layer

ACT_BYTES = 2
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "moe_act", "layernorm", "mlp",
                     "shared_experts")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)


def validate_modules(modules) -> tuple[str, ...]:
    """The module names, checked and in canonical order (raises ValueError with the reason)."""
    if isinstance(modules, str) or not all(isinstance(m, str) for m in modules):
        raise ValueError(f"recompute modules must be a list of names, got {modules!r}")
    unknown = sorted(set(modules) - set(RECOMPUTE_MODULES))
    if unknown:
        raise ValueError(f"unknown recompute module(s) {', '.join(unknown)}; known: "
                         f"{', '.join(RECOMPUTE_MODULES)}")
    if not modules:
        raise ValueError("recompute modules: give at least one module (core_attn is "
                         "Megatron's default)")
    return tuple(m for m in RECOMPUTE_MODULES if m in modules)


def saved_bytes_per_token(layer: Layer, tp: int, sp: bool, modules: tuple[str, ...],
                          core_bytes: float, etp: int = 0, expert_load: float = 1.0,
                          fp8_inputs: bool = False) -> float:
    """Bytes per token a SELECTIVE layer does not store under ``modules``; ``core_bytes`` is
    the attention core's internal share (:func:`block_activation_bytes_per_token`)."""
    saved = core_bytes if "core_attn" in modules else 0.0
    h = layer.hidden
    gemm_input = 1 if fp8_inputs else ACT_BYTES
    att, mlp = layer.attention, layer.mlp
    if "mla_up_proj" in modules and att is not None and att.is_mla:
        heads = att.num_heads / tp
        saved += ACT_BYTES * heads * (2 * att.head_dim + att.v_head_dim)
    if "layernorm" in modules and layer.num_norms:
        saved += 2 * gemm_input * h / (tp if sp else 1)
    if mlp is not None and mlp.is_moe:
        if "moe_act" in modules:
            etp = etp or tp
            copies = mlp.top_k * etp / tp * expert_load
            saved += copies * gemm_input * mlp.ffn_hidden / etp
        if "shared_experts" in modules and mlp.shared_ffn_hidden:
            saved += ACT_BYTES * (3 if mlp.gated else 2) * mlp.shared_ffn_hidden / tp
    elif mlp is not None and "mlp" in modules:
        saved += ACT_BYTES * (3 if mlp.gated else 2) * mlp.ffn_hidden / tp
    return saved


def recomputed_gemm_names(layer: Layer, modules: tuple[str, ...]) -> frozenset[str]:
    """Which forward GEMM groups of the layer ``modules`` repeat: ``mla_up`` (the MLA query and
    key-value up-projections), ``mlp`` (a dense MLP), ``shared`` (shared experts)."""
    names = set()
    att, mlp = layer.attention, layer.mlp
    if "mla_up_proj" in modules and att is not None and att.is_mla:
        names.add("mla_up")
    if mlp is not None and not mlp.is_moe and "mlp" in modules:
        names.add("mlp")
    if mlp is not None and mlp.is_moe and mlp.shared_ffn_hidden and "shared_experts" in modules:
        names.add("shared")
    return frozenset(names)


# what each module recomputes, for the note on a module the model has nothing of
_WHAT = {"core_attn": "attention", "mla_up_proj": "multi-head latent attention",
         "moe_act": "routed experts", "layernorm": "norms", "mlp": "dense MLP",
         "shared_experts": "shared experts"}


def modules_present(layer: Layer) -> set[str]:
    """The modules ``layer`` has something of (what :func:`saved_bytes_per_token` reads)."""
    att, mlp = layer.attention, layer.mlp
    present = set()
    if att is not None:
        present.add("core_attn")
        if att.is_mla:
            present.add("mla_up_proj")
    if layer.num_norms:
        present.add("layernorm")
    if mlp is not None and mlp.is_moe:
        present.add("moe_act")
        if mlp.shared_ffn_hidden:
            present.add("shared_experts")
    elif mlp is not None:
        present.add("mlp")
    return present


def module_notes(model, modules: tuple[str, ...], recompute: str | None = None) -> list[str]:
    """What a ``--recompute-modules`` choice leaves unused: modules the model's blocks have
    nothing of (``mla_up_proj`` without MLA, ``moe_act`` on a dense model: they save and
    recompute nothing), and, for one evaluated ``recompute`` policy other than selective,
    the whole choice (only a SELECTIVE layer reads it; Megatron's --recompute-modules goes
    with --recompute-granularity selective)."""
    notes = []
    if recompute is not None and recompute != "selective" and \
            tuple(modules) != DEFAULT_RECOMPUTE_MODULES:
        notes.append(f"--recompute-modules {','.join(modules)} is what a selective layer "
                     f"recomputes, and this configuration recomputes {recompute}: it changes "
                     f"nothing (add --recompute selective)")
    present = set().union(*(modules_present(layer) for layer in model.blocks()))
    missing = [m for m in modules if m not in present]
    if missing:
        notes.append(f"--recompute-modules: {model.name} has no "
                     + ", ".join(f"{_WHAT[m]} ({m})" for m in missing)
                     + ": nothing of it is stored or recomputed")
    return notes
