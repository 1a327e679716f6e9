"""Write an ONNX file of a model built on the meta device: the graph and every initializer's
shape and dtype, no weights.

Consumes a ``torch.nn.Module`` whose parameters live on the meta device and example inputs (meta
tensors); produces an ONNX file whose initializers are external-data references to a file that
is never written (``onnx.load(..., load_external_data=False)`` and shape inference read only
shapes, as :func:`models.graph.onnx_import.load_onnx` does). This is how the benchmark turns a
ResNet-152 or a ViT-H (their ``transformers`` configs) into ONNX graphs without materialising
hundreds of megabytes of weights; ``torch.onnx.export(..., dynamo=True)`` traces the module with
fake tensors and keeps the meta tensors as initializer values, which are swapped for
``onnx_ir.ExternalTensor`` references before serialising.
"""
from __future__ import annotations

import os
from typing import Any

ABSENT = "weights-not-written.bin"  # the external-data file the initializers point to


def export_onnx_meta(module: Any, example_inputs: tuple, path: str | os.PathLike) -> int:
    """Export ``module`` (meta device) to ``path`` with weightless initializers; returns the
    number of initializer bytes the file describes but does not hold."""
    import onnx
    import onnx_ir as ir
    import torch

    program = torch.onnx.export(module, example_inputs, dynamo=True, optimize=False,
                                verbose=False)
    offset = 0
    base = os.path.dirname(os.path.abspath(path))
    for name, value in program.model.graph.initializers.items():
        tensor = value.const_value
        size = tensor.nbytes
        value.const_value = ir.ExternalTensor(ABSENT, offset, size, tensor.dtype,
                                              shape=tensor.shape, name=name, base_dir=base)
        offset += size
    onnx.save(ir.serde.serialize_model(program.model), str(path))
    return offset


__all__ = ["export_onnx_meta"]
