"""torch.export importers: a Hugging Face config, a user's ``nn.Module``, a saved ``.pt2``.

Consumes: an HF ``config.json`` mapping (the model is built with ``from_config`` under
``torch.device("meta")``: no weights, nothing downloaded, no remote code), or an
``nn.Module`` with example inputs, or a ``.pt2`` file written by ``torch.export.save``.
Produces: an :class:`~models.graph.ir.OpGraph` (``*_graph`` functions) or the planner's
:class:`planner.ir.ModelGraph` through :func:`models.graph.group.group_layers`.

Needs torch and, for HF configs, transformers (the ``graph`` extra). Any error of tracing
becomes a :class:`PlannerError` (UNSUPPORTED) that names the model and the first line of the
cause, never a traceback.
"""
from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Mapping

from planner.errors import ErrorKind, PlannerError, invalid
from planner.ir import ModelGraph

from .fx import lower_exported_program
from .group import group_layers
from .ir import OpGraph
from .replicate import reduce_blocks, replicate, restore

DEFAULT_EXPORT_SEQ = 128  # tokens per sequence of the traced example (per-token FLOPs do not
# depend on it except through attention, which the cost model scales with the real length)
DEFAULT_SEQ_CAP = 4096  # default training length: min(max positions, this), as for configs


def require(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise PlannerError(ErrorKind.UNSUPPORTED,
                           f"the graph importer needs the '{module}' package, which is not "
                           f"installed ({exc})",
                           ('Install the extra: pip install "shardplan[graph]"',)) from None


def _failed(what: str, exc: BaseException) -> PlannerError:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return PlannerError(ErrorKind.UNSUPPORTED, f"could not trace {what}: {type(exc).__name__}: "
                        f"{first}", ("Plan it from its config.json (the default importer), or "
                                     "export it yourself and pass the .pt2 or .onnx file.",))


# -- Hugging Face configs ----------------------------------------------------------------------

def build_hf_model(config: Mapping[str, Any], *, where: str = "config") -> Any:
    """The transformers model ``config`` describes, on the meta device (no weights)."""
    torch = require("torch")
    transformers = require("transformers")
    data = dict(config)
    model_type = data.pop("model_type", None)
    if "torch_dtype" in data:  # transformers 5 spells it "dtype" (and warns about the old key)
        data.setdefault("dtype", data.pop("torch_dtype"))
    if not isinstance(model_type, str):
        raise invalid(f"{where}: the graph importer needs 'model_type' to build the model")
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as exc:
        raise PlannerError(ErrorKind.UNSUPPORTED, f"{where}: transformers does not know "
                           f"model_type {model_type[:40]!r} ({str(exc)[:200]})") from None
    archs = data.get("architectures") or []
    cls = getattr(transformers, archs[0], None) if archs and isinstance(archs[0], str) else None
    try:
        with torch.device("meta"):
            if cls is not None and hasattr(cls, "_from_config"):
                model = cls._from_config(hf_config)
            else:
                model = _auto_model(transformers, hf_config)
    except Exception as exc:  # noqa: BLE001 - any failure of a third-party constructor
        raise _failed(f"{where} ({model_type})", exc) from None
    # transformers >= 4.56 has "dtype" and warns on every read of the old "torch_dtype"
    # attribute (also where the config sets neither); older ones have only "torch_dtype"
    dtype = (hf_config.dtype if hasattr(hf_config, "dtype")
             else getattr(hf_config, "torch_dtype", None))
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        model = model.to(dtype)
    return model.eval()


def _auto_model(transformers: Any, hf_config: Any) -> Any:
    for auto in ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM",
                 "AutoModel"):
        try:
            return getattr(transformers, auto).from_config(hf_config)
        except ValueError:
            continue
    raise ValueError(f"no transformers model class for {type(hf_config).__name__}")


def hf_example_inputs(model: Any, seq_len: int) -> dict[str, Any]:
    """Keyword inputs for one sequence of ``seq_len`` tokens (or one image)."""
    torch = require("torch")
    params = inspect.signature(model.forward).parameters
    cfg = model.config
    kwargs: dict[str, Any] = {}
    if "input_ids" in params:
        kwargs["input_ids"] = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
        if "decoder_input_ids" in params and getattr(cfg, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = torch.zeros(1, seq_len, dtype=torch.long,
                                                      device="meta")
    elif "pixel_values" in params:
        size = getattr(cfg, "image_size", 224)
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        channels = getattr(cfg, "num_channels", 3)
        kwargs["pixel_values"] = torch.zeros(1, channels, h, w, device="meta",
                                             dtype=next(model.parameters()).dtype)
    else:
        raise PlannerError(ErrorKind.UNSUPPORTED, f"{type(model).__name__}: cannot make example "
                           f"inputs (its forward takes neither input_ids nor pixel_values)")
    if "use_cache" in params:
        kwargs["use_cache"] = False
    return kwargs


def export(model: Any, args: tuple = (), kwargs: Mapping[str, Any] | None = None,
           *, what: str = "the model") -> Any:
    torch = require("torch")
    import torch.fx.config as fx_config

    # Source stack traces per node are a third of the tracing time and are never read here.
    saved = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        with torch.no_grad():
            return torch.export.export(model, tuple(args), dict(kwargs or {}), strict=False)
    except PlannerError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch.export raises many kinds
        raise _failed(what, exc) from None
    finally:
        fx_config.do_not_emit_stack_traces = saved


def hf_config_graph(config: Mapping[str, Any], *, name: str = "model", where: str = "config",
                    seq_len: int = DEFAULT_EXPORT_SEQ, replicate_blocks: bool = True) -> OpGraph:
    """Build, export and lower the model of an HF config (text configs of VLMs included).

    With ``replicate_blocks`` (the default) only the first block of each kind of every block
    list is traced and the graph is replicated to the full depth (:mod:`.replicate`); without
    it, or when the trace does not have the shape replication needs, the whole model is."""
    model = build_hf_model(config, where=where)
    kwargs = hf_example_inputs(model, seq_len)
    # tokens of one training sequence (an encoder-decoder reads seq_len and predicts seq_len)
    tokens = seq_len if "input_ids" in kwargs else None
    graph = None
    if replicate_blocks:  # trace one block of each kind, copy it to the full depth
        lists = reduce_blocks(model)
        if lists:
            try:
                ep = export(model, (), kwargs, what=f"{where}")
            finally:
                restore(model, lists)
            graph = replicate(lower_exported_program(ep, name=name, source=where,
                                                     tokens=tokens), lists)
    if graph is None:
        ep = export(model, (), kwargs, what=f"{where}")
        graph = lower_exported_program(ep, name=name, source=where, tokens=tokens)
    graph.seq_len = seq_len
    graph.metadata.update(importer="torch.export", architecture=type(model).__name__)
    return graph


def _config_seq(config: Mapping[str, Any]) -> tuple[int | None, int | None]:
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, DEFAULT_SEQ_CAP), value
    return None, None


def import_hf_config_graph(config: Mapping[str, Any], *, name: str = "model",
                           source: str = "", where: str = "config",
                           seq_len: int = DEFAULT_EXPORT_SEQ) -> ModelGraph:
    """The ModelGraph of an HF config through the graph path (torch.export on meta)."""
    text = config.get("text_config")
    if isinstance(text, dict) and "model_type" in text and not config.get("architectures"):
        config = text
    graph = hf_config_graph(config, name=name, where=where, seq_len=seq_len)
    default, max_pos = _config_seq(config)
    metadata = [("architecture", graph.metadata.get("architecture", ""))]
    dtype = config.get("torch_dtype", config.get("dtype"))
    if isinstance(dtype, str):
        metadata.append(("dtype", dtype))
    model_type = config.get("model_type")
    grouped = group_layers(graph, name=name, family=model_type if isinstance(model_type, str)
                           else "graph", default_seq_len=default or 512, max_seq_len=max_pos,
                           source=source or where, metadata=tuple(metadata))
    # the routing's expert groups are no operator shape: the config says them (models/hf_moe.py)
    from models.hf_moe import with_expert_groups
    return with_expert_groups(grouped, config, where)


# -- user modules and saved programs -----------------------------------------------------------

def module_graph(model: Any, example_inputs: Any, *, name: str | None = None,
                 tokens: int | None = None) -> OpGraph:
    """Export and lower a user's ``nn.Module`` (``example_inputs``: a tuple of positional
    inputs, a single tensor, or a dict of keyword inputs)."""
    if isinstance(example_inputs, Mapping):
        args, kwargs = (), dict(example_inputs)
    elif isinstance(example_inputs, (tuple, list)):
        args, kwargs = tuple(example_inputs), {}
    else:
        args, kwargs = (example_inputs,), {}
    label = name or type(model).__name__
    ep = export(model, args, kwargs, what=label)
    graph = lower_exported_program(ep, name=label, source=f"module:{type(model).__name__}",
                                   tokens=tokens)
    graph.metadata.update(importer="torch.export")
    return graph


def import_module(model: Any, example_inputs: Any, *, name: str | None = None,
                  seq_len: int | None = None, tokens: int | None = None) -> ModelGraph:
    """The planner's ModelGraph of a user's ``nn.Module`` traced on ``example_inputs``."""
    graph = module_graph(model, example_inputs, name=name, tokens=tokens)
    graph.seq_len = seq_len or _example_seq(graph)
    return group_layers(graph, name=graph.name, family="module", default_seq_len=graph.seq_len,
                        source=graph.source)


def _example_seq(graph: OpGraph) -> int:
    for op in graph.ops():
        if op.kind == "input" and op.outputs and op.outputs[0].dtype.startswith("int") \
                and len(op.outputs[0].shape) >= 2:
            return op.outputs[0].shape[1]
    return 1


def pt2_graph(path: str | os.PathLike) -> OpGraph:
    torch = require("torch")
    path = Path(path)
    if not path.is_file():
        raise invalid(f"{path}: no such file")
    try:
        ep = torch.export.load(str(path))
    except Exception as exc:  # noqa: BLE001 - corrupt archives raise many kinds
        raise invalid(f"{path}: not a torch.export program ({type(exc).__name__}: "
                      f"{str(exc)[:200]})") from None
    graph = lower_exported_program(ep, name=path.stem, source=str(path))
    graph.metadata.update(importer="torch.export")
    return graph


def load_pt2(path: str | os.PathLike, *, seq_len: int | None = None) -> ModelGraph:
    graph = pt2_graph(path)
    graph.seq_len = seq_len or _example_seq(graph)
    return group_layers(graph, name=graph.name, family="pt2", default_seq_len=graph.seq_len,
                        source=graph.source)


__all__ = ["build_hf_model", "hf_config_graph", "import_hf_config_graph", "module_graph",
           "import_module", "pt2_graph", "load_pt2", "require"]
