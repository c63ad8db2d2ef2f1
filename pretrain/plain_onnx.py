"""``export --plain --onnx``: a plain BERT task model as ONNX, fp32 and dynamically quantised int8, run by ONNX Runtime.

The exporter is torch.onnx's dynamo exporter (``torch.onnx.export(..., dynamo=True)``, which needs ``onnxscript``),
with the batch and sequence dimensions dynamic; ``onnxruntime.quantization.quantize_dynamic`` gives the int8 model
(weights int8, activations quantised per call). Both are measured against the sparse model: the largest logit
difference on the task's test records, and the task's own test score of each (``predict`` and the task's metric,
with the ONNX model's outputs in place of the sparse model's), so ``int8_score_drop`` is in the metric's units.
The pinned versions are the ``deploy`` extra of pyproject.toml.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

# Output names of each stock class's ONNX graph (what its forward returns first).
OUTPUTS = {"BertForSequenceClassification": ["logits"], "BertForTokenClassification": ["logits"],
           "BertForMaskedLM": ["logits"], "BertForQuestionAnswering": ["start_logits", "end_logits"],
           "BertModel": ["last_hidden_state", "pooler_output"]}


def export_onnx(model: nn.Module, folder: Path, tok: Any) -> dict[str, Path]:
    """Write ``model.onnx`` (fp32) and ``model_int8.onnx`` into `folder`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    enc = dict(tok(["这家酒店的服务很好", "北京是中国的首都"], return_tensors="pt", padding=True))
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    fp32, int8 = folder / "model.onnx", folder / "model_int8.onnx"
    torch.onnx.export(model, args=(), kwargs=enc, f=str(fp32), dynamo=True, verbose=False,
                      dynamic_shapes={k: {0: batch, 1: seq} for k in enc},
                      output_names=OUTPUTS[type(model).__name__])
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    return {"fp32": fp32, "int8": int8}


class OrtModel:
    """An ONNX Runtime session called like the stock torch model: keyword tensors in, outputs by name."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def __call__(self, **inputs: torch.Tensor) -> SimpleNamespace:
        feed = {k: inputs[k].cpu().numpy() for k in self.inputs}
        return SimpleNamespace(**{k: torch.from_numpy(v) for k, v in zip(self.outputs, self.session.run(None, feed))})


class StockAsTask(nn.Module):
    """A stock model (torch, or an `OrtModel`) behind the interface the task codecs predict with (the sparse
    multi-task model's ``forward(task=, **batch)`` / ``predict``): its outputs in the sparse head's layout, the
    sparse head's decoding. So the task's own ``predict`` and metric score it."""

    def __init__(self, stock: Any, sparse: nn.Module, task: str) -> None:
        super().__init__()
        self.stock, self.sparse_heads, self.task = stock, sparse.heads, task
        self.kind = sparse.config.task_heads[task]["type"]
        self._device = nn.Parameter(torch.zeros(()))  # the codecs read the device from the parameters

    @property
    def heads(self) -> nn.ModuleDict:
        return self.sparse_heads

    def forward(self, task: str, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, **batch: Any) -> SimpleNamespace:
        shape = input_ids.shape
        flat = {"input_ids": input_ids.reshape(-1, shape[-1]),
                "attention_mask": (attention_mask if attention_mask is not None else torch.ones_like(input_ids)
                                   ).reshape(-1, shape[-1]),
                "token_type_ids": (token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids)
                                   ).reshape(-1, shape[-1])}
        with torch.no_grad():
            out = self.stock(**flat)
        if self.kind == "span":
            logits = torch.stack([out.start_logits, out.end_logits], -1)
            ctx = batch.get("context_mask")
            if ctx is not None:
                logits = logits.masked_fill(~ctx.bool()[..., None], torch.finfo(logits.dtype).min)
        elif self.kind == "matching":
            logits = out.logits.view(shape[:-1])
            cm = batch.get("candidate_mask")
            if cm is not None:
                logits = logits.masked_fill(~cm.bool(), torch.finfo(logits.dtype).min)
        elif self.kind == "regression":
            logits = out.logits[:, 0]
        else:
            logits = out.logits
        return SimpleNamespace(logits=logits)

    def predict(self, task: str, **batch: Any) -> list[Any]:
        out = self.forward(task=task, **batch)
        if batch["input_ids"].dim() == 3:
            batch["group_shape"] = batch["input_ids"].shape[:2]
        return self.sparse_heads[task].predict(out, batch)


def task_score(model: nn.Module, pred: Any, task: str, recs: list[dict[str, Any]]) -> float:
    """The task's own metric on `recs` (those with labels), predicted by `model`."""
    td = pred.tasks[task]
    metric = td.cfg.metric or td.codec.metric
    return float(td.score_records(recs, td.predict_records(model, recs, 32))[metric])
