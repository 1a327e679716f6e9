"""Multi-token prediction (MTP) modules appended to a model graph: DeepSeek-V3 §2.2, Megatron-Core
``--mtp-num-layers`` (``MultiTokenPredictionBlock``).

Consumes a :class:`~planner.ir.ModelGraph` and a depth ``D``; produces the graph with, after its
head, ``D`` pairs of layers:

* ``mtp.<k>`` (:attr:`LayerKind.MTP`): RMSNorm of the previous depth's hidden state and of the
  next token's embedding (``hnorm``, ``enorm``), their concatenation projected 2h -> h
  (``eh_proj``), then one transformer block shaped like the model's last block (DeepSeek-V3: a
  MoE block). The embedding is shared with the main model; on a pipeline its last stage keeps a
  copy (Megatron-Core builds the embedding wherever an MTP module runs), counted as tied
  parameters: memory holds them, totals do not.
* ``mtp.<k>.head`` (:attr:`LayerKind.HEAD`): the module's final norm and the output head shared
  with the main model (no weights of its own beyond the norm) and the module's loss.

Every layer that is neither block nor embedding goes to the last pipeline stage
(:func:`planner.strategy.default_placement`), so the MTP modules run there, after the main
head, as Megatron's default pipeline layout places them ("mtp" + "loss" in the last stage).
DeepSeek-V3's published 685B counts its MTP module with its own copies of the embedding and
head (671B + 14B, deepseek-ai/DeepSeek-V3 README); :func:`with_mtp` shares them, as training
does.
"""
from __future__ import annotations

from dataclasses import replace

from planner.errors import invalid
from planner.ir import Layer, LayerKind, ModelGraph

MAX_MTP_LAYERS = 8


def with_mtp(graph: ModelGraph, depth: int) -> ModelGraph:
    """``graph`` with ``depth`` MTP modules after its head (``depth`` 0: unchanged)."""
    if isinstance(depth, bool) or not isinstance(depth, int) or not 0 <= depth <= MAX_MTP_LAYERS:
        raise invalid(f"--mtp-layers must be an integer from 0 to {MAX_MTP_LAYERS}, got "
                      f"{depth!r}")
    if depth == 0:
        return graph
    if graph.num_mtp:
        raise invalid(f"{graph.name} already has {graph.num_mtp} MTP layers")
    blocks = [layer for layer in graph.layers if layer.kind is LayerKind.BLOCK]
    heads = [layer for layer in graph.layers if layer.kind is LayerKind.HEAD]
    embeddings = [layer for layer in graph.layers if layer.kind is LayerKind.EMBEDDING]
    if not blocks or not heads or not embeddings or not heads[-1].vocab:
        raise invalid(f"{graph.name} is not a language model with an embedding, blocks and "
                      "an LM head: multi-token prediction needs all three")
    block, head = blocks[-1], heads[-1]
    h = graph.hidden
    extra = 2 * h * h + 2 * h  # eh_proj (no bias) + enorm and hnorm
    embedding_params = graph.vocab * h
    layers = list(graph.layers)
    for k in range(depth):
        layers.append(replace(
            block, name=f"mtp.{k}", kind=LayerKind.MTP, params=block.params + extra,
            active_params=block.active_params + extra, tied_params=embedding_params,
            tp_replicated_params=block.tp_replicated_params + 2 * h))
        layers.append(Layer(name=f"mtp.{k}.head", kind=LayerKind.HEAD, hidden=h, params=h,
                            active_params=h + head.params - _norm(head), tied_params=0,
                            tp_replicated_params=h, vocab=head.vocab))
    metadata = tuple((key, value) for key, value in graph.metadata if key != "mtp_layers")
    return replace(graph, layers=tuple(layers),
                   metadata=metadata + (("mtp_layers", str(depth)), ("mtp_applied", "1")))


def _norm(head: Layer) -> int:
    """The head's own norm parameters (its output projection is the rest)."""
    return head.params - head.vocab * head.hidden if head.params > head.vocab * head.hidden \
        else 0
