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


def task_score(model: nn.Module, pred: Any, task: str, recs: list[dict[str, Any]], metric: str | None = None) -> float:
    """The task's own metric (`metric`, else the task config's) on `recs` (those with labels), predicted by `model`."""
    td = pred.tasks[task]
    metric = metric or td.cfg.metric or td.codec.metric
    return float(td.score_records(recs, td.predict_records(model, recs, 32))[metric])


# ---- SkillNet-BART: encoder and decoder graphs, generation in export/onnx_seq2seq.py --------------------
ORT_DIR = "ort"  # the BART graphs' subfolder of a plain export (beside the stock transformers files)


class _BartEncoder(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class _BartDecoder(nn.Module):
    """All decoder positions' logits for the tokens so far (no cache: one graph for every step)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids: torch.Tensor, encoder_hidden_states: torch.Tensor,
                encoder_attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(attention_mask=encoder_attention_mask, encoder_outputs=(encoder_hidden_states,),
                          decoder_input_ids=decoder_input_ids, use_cache=False).logits


@torch.no_grad()
def trim_padding(model: nn.Module, widths: list[int]) -> nn.Module:
    """A copy of a plain BART whose layers have their own FFN widths again (`widths`: encoder layers, then
    decoder layers, as plain_export.json's ``ffn_widths``). The zero-padded units contribute exactly 0, so
    dropping them changes no output; a stock config cannot say this (one width per stack), a module or an
    ONNX graph can, and then a layer without skills costs its own width instead of the skill layers'."""
    import copy

    out = copy.deepcopy(model)
    layers = [*out.model.encoder.layers, *out.model.decoder.layers]
    if len(layers) != len(widths):
        raise ValueError(f"{len(widths)} widths for {len(layers)} layers")
    for layer, w in zip(layers, widths):
        if w == layer.fc1.out_features:
            continue
        if layer.fc2.weight[:, w:].abs().max() != 0:
            raise ValueError(f"units past width {w} are not zero: this is not a zero-padded layer")
        fc1, fc2 = nn.Linear(layer.fc1.in_features, w), nn.Linear(w, layer.fc2.out_features)
        fc1.weight.copy_(layer.fc1.weight[:w]), fc1.bias.copy_(layer.fc1.bias[:w])
        fc2.weight.copy_(layer.fc2.weight[:, :w]), fc2.bias.copy_(layer.fc2.bias)
        layer.fc1, layer.fc2 = fc1, fc2
    return out.eval()


def export_bart_onnx(model: nn.Module, widths: list[int], folder: Path) -> dict[str, Path]:
    """Write ``encoder.onnx`` / ``decoder.onnx``, their dynamic int8 twins ``*_int8.onnx`` and the numpy
    generation module ``seq2seq.py`` into ``folder`` (created). The graphs are traced from the trimmed model
    (`trim_padding`), so no layer computes padding."""
    import shutil

    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder.mkdir(parents=True, exist_ok=True)
    trimmed = trim_padding(model, widths)
    # Distinct example sizes, so the exporter cannot take two dynamic dimensions for one.
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (2, 7), generator=g)
    am = torch.ones_like(ids)
    am[1, 5:] = 0
    dec = torch.randint(5, model.config.vocab_size, (2, 3), generator=g)
    with torch.no_grad():
        hidden = _BartEncoder(trimmed)(ids, am)
    batch, src, tgt = torch.export.Dim("batch"), torch.export.Dim("src"), torch.export.Dim("tgt")
    paths = {"encoder": folder / "encoder.onnx", "decoder": folder / "decoder.onnx"}
    torch.onnx.export(_BartEncoder(trimmed), args=(), kwargs={"input_ids": ids, "attention_mask": am},
                      f=str(paths["encoder"]), dynamo=True, verbose=False,
                      dynamic_shapes={"input_ids": {0: batch, 1: src}, "attention_mask": {0: batch, 1: src}},
                      output_names=["last_hidden_state"])
    torch.onnx.export(_BartDecoder(trimmed), args=(),
                      kwargs={"decoder_input_ids": dec, "encoder_hidden_states": hidden, "encoder_attention_mask": am},
                      f=str(paths["decoder"]), dynamo=True, verbose=False,
                      dynamic_shapes={"decoder_input_ids": {0: batch, 1: tgt},
                                      "encoder_hidden_states": {0: batch, 1: src},
                                      "encoder_attention_mask": {0: batch, 1: src}},
                      output_names=["logits"])
    for k in ("encoder", "decoder"):
        paths[f"{k}_int8"] = folder / f"{k}_int8.onnx"
        quantize_dynamic(str(paths[k]), str(paths[f"{k}_int8"]), weight_type=QuantType.QInt8)
    shutil.copyfile(Path(__file__).with_name("onnx_seq2seq.py"), folder / "seq2seq.py")
    return paths


class OrtAsGenerator(nn.Module):
    """`OrtSeq2Seq` behind the interface the generation codec predicts with (``model.generate(**batch, task=,
    num_beams=, max_new_tokens=, suppress_tokens=)`` returning a tensor), so the task's own ``predict`` and
    metric score the ONNX graphs."""

    def __init__(self, runner: Any) -> None:
        super().__init__()
        self.runner = runner
        self._device = nn.Parameter(torch.zeros(()))  # the codecs read the device from the parameters

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, task: str | None = None,
                 **settings: Any) -> torch.Tensor:
        mask = None if attention_mask is None else attention_mask.cpu().numpy()
        return torch.from_numpy(self.runner.generate(input_ids.cpu().numpy(), mask, **settings))
