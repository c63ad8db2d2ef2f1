"""``export --plain``: one task of a SkillNet export as a stock transformers folder (export/flatten.py).

    python -m skillnet.pretrain.export --plain --checkpoint runs/ft/export --task sentiment --out deploy/sentiment

The folder loads with ``transformers`` alone, without ``trust_remote_code`` and without this project:
``BertForSequenceClassification`` (classification, sentence pairs, regression; matching with one score per
candidate), ``BertForTokenClassification`` (NER: the CRF's emissions; crf.json and the card hold the
transitions and the Viterbi lines that decode as ``predict`` does), ``BertForQuestionAnswering`` (span),
``BertForMaskedLM`` (a pre-trained model's tasks), ``BertModel`` (``--features``: any task) or
``BartForConditionalGeneration`` (SkillNet-BART, with the task's generation config). ``--onnx`` adds ONNX
graphs (export/onnx_graphs.py): ``model.onnx`` / ``model_int8.onnx`` for a BERT task; ``ort/`` for a BART task
(encoder and decoder, fp32 and int8, and ``seq2seq.py``, which decodes them with numpy and onnxruntime).

The export measures what it claims: it runs the sparse and the plain model on the task's records (``--test
FILE``, else the fine-tuning run's test split, else its dev split, each read as fine-tuning read it: paths
relative to the run's config file, the task's kind, labels and ``columns``) and writes the largest logit
difference, whether every argmax (every beam output for BART) is the same, and for a CRF how often argmax
decoding equals the constrained Viterbi path with both entity F1s, into the model card and plain_export.json.
The equality check stops at a fixed number of records (`_PROBE_RECORDS`, `_BEAM_RECORDS` for BART), and
plain_export.json's ``records`` says how many of the file's were measured, and why. Without task records (a
pre-training export, or an export whose run is gone) it measures on five fixed sentences, and warns why.

A fine-tuned export's tasks (their codecs, test files and metrics) are fine-tuning's: the caller passes a
`TaskLoader` (the command passes ``skillnet.finetune.predict.task_source``), so this package imports nothing
from finetune/.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from skillnet.model.span_qa import settings_from_meta
from skillnet.model.span_qa import write_settings as write_span_module

from .card import FINETUNE_META, read_json, task_generation, write_json
from .flatten import plain_bart, plain_bert
from .hf_folder import finish_folder, source_id
from .plain_card import VITERBI_LINES, _usage, render_plain_card  # noqa: F401  (the card's lines, imported from here)

# Reads a fine-tuned export's tasks: (the SkillNet model, a predictor with ``tasks[name]`` as fine-tuning's
# TaskData: codec, encode_records, predict_records, score_records, label_list, cfg; and
# ``task_records(task, test)``: (records, what they were read from or None, where they came from or why there
# are none), read as fine-tuning read the task's splits), or None when `folder` holds no fine-tuned tasks.
TaskLoader = Callable[[Path], tuple[Any, Any] | None]

# Fixed inputs when the source carries no task data (a pre-training export): Chinese text as the models read.
_PROBE_TEXTS = ["今天天气很好，我们去公园散步。", "这家酒店的服务很好", "北京是中国的首都，位于华北平原。",
                "保险合同什么时候生效？", "李四在深圳的人民日报工作"]
# Records the equality is measured on (all of them for the CRF agreement and the ONNX scores, which are scores).
_PROBE_RECORDS = 64
# BART: inputs both models beam-search (all of them for the ONNX graphs' check): generation is the slow part.
_BEAM_RECORDS = 16
_BATCH = 16

def load_source(folder: Path, task_loader: TaskLoader | None = None) -> tuple[Any, Any]:
    """(the SkillNet model, the predictor `task_loader` gives for a fine-tuned export with task metadata, else
    None)."""
    import skillnet.model as sm

    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    from skillnet.model.spec import skillnet_family

    if skillnet_family(cfg.get("model_type")) is None:
        raise ValueError(f"{folder}: model_type {cfg.get('model_type')!r} is not a SkillNet export: it is plain already")
    if (folder / FINETUNE_META).is_file():
        loaded = task_loader(folder) if task_loader is not None else None
        if loaded is None:
            raise ValueError(f"{folder} is a fine-tuned export ({FINETUNE_META}): its tasks need a task loader "
                             "(python -m skillnet.pretrain.export passes fine-tuning's)")
        return loaded
    arch = (cfg.get("architectures") or [""])[0]
    model_cls = getattr(sm, arch, None)
    if model_cls is None:
        raise ValueError(f"{folder}: unknown architecture {arch!r}")
    return model_cls.from_pretrained(str(folder)).eval(), None


def _records(pred: Any, task: str, test: str | None) -> tuple[list[dict[str, Any]], str | None, str]:
    """(the records to measure on, what they were read from or None, where they came from or why there are
    none): `pred.task_records` (`TaskLoader`) for a fine-tuned task."""
    if pred is None:
        return [], None, ("the source is not a fine-tuned export (no finetune_tasks.json): it has no task data, "
                          + ("and no task format to read --test in" if test else "no test split"))
    if task not in pred.tasks:
        return [], None, f"task {task!r} has no task data in the export (finetune_tasks.json)"
    return pred.task_records(task, test)


def _records_note(recs: list[dict[str, Any]], name: str | None, why: str, bart: bool, crf: bool, onnx: bool
                  ) -> dict[str, Any]:
    """plain_export.json's ``records``: the file, how many of its records each check used, and a sentence that
    says so (and why fewer, or why none)."""
    if not recs:
        return {"file": None, "in_file": 0, "equality": len(_PROBE_TEXTS), "fallback": True,
                "note": f"the equality is measured on {len(_PROBE_TEXTS)} fixed sentences, not on task data: {why}; "
                        "pass --test FILE (records of the task, in its own format) to measure on them"}
    n, cap = len(recs), (_BEAM_RECORDS if bart else _PROBE_RECORDS)
    k = min(n, cap)
    shown = Path(name).name if name and Path(name).exists() else str(name)  # a file by its name, not the path
    if k == n:
        note = f"all {n} records of {shown} ({why})"
    else:
        rest = [x for x, on in (("the ONNX checks" if bart else "the ONNX scores", onnx),
                                ("the CRF agreement", crf and not bart)) if on]
        note = (f"the equality check compares the first {k} of the {n} records of {shown} ({why}): its cap is "
                f"{cap} records" + (", each beam-searched by both models" if bart else "")
                + (f"; {' and '.join(rest)} use all {n}" if rest else ""))
    return {"file": shown, "from": why, "in_file": n, "equality": k, "fallback": False, "note": note}


def _compare(ref: torch.Tensor, got: torch.Tensor, mask: torch.Tensor | None) -> dict[str, Any]:
    """Largest difference and argmax agreement over the last dim, at `mask`'s positions."""
    if mask is not None:
        ref, got = ref[mask.bool()], got[mask.bool()]
    return {"max_abs_diff": float((ref.float() - got.float()).abs().max()) if ref.numel() else 0.0,
            "argmax_equal": bool((ref.argmax(-1) == got.argmax(-1)).all()) if ref.dim() else True,
            "compared": int(ref.shape[0]) if ref.dim() else 1}


def _bert_outputs(sparse: Any, plain: Any, task: str, head: str | None, batch: dict[str, torch.Tensor]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(sparse logits, plain logits, positions to compare) of one batch, in the sparse head's layout."""
    ids, am = batch["input_ids"], batch["attention_mask"]
    tt = batch.get("token_type_ids")
    flat = {"input_ids": ids.flatten(0, -2), "attention_mask": am.flatten(0, -2),
            **({"token_type_ids": tt.flatten(0, -2)} if tt is not None else {})}
    out = plain(**flat)
    if head is None:
        ref = sparse.bert(ids, am, tt, task=task).last_hidden_state if hasattr(sparse, "bert") else \
            sparse(ids, am, tt, task=task).last_hidden_state
        return ref, out.last_hidden_state, am
    if head == "mlm":
        return sparse(ids, am, tt, task=task).logits, out.logits, am
    ref = sparse(task=task, **batch).logits
    if head == "span":  # the sparse head leaves out the question: so does the comparison (and the card's use)
        off = ~batch.get("context_mask", am).bool()[:, None, :]
        got = torch.stack([out.start_logits, out.end_logits], 1).masked_fill(off, -1e9)
        return ref.transpose(1, 2).masked_fill(off, -1e9), got, None
    if head == "matching":  # one score per (question, candidate) row; the sparse head scores each group
        got = out.logits.view(ref.shape)
        cm = batch.get("candidate_mask")
        return ref.masked_fill(~cm.bool(), 0) if cm is not None else ref, \
            got.masked_fill(~cm.bool(), 0) if cm is not None else got, None
    if head == "regression":
        return ref[:, None], out.logits, None
    return ref, out.logits, am if head == "token_crf" else None


def _batches(pred: Any, task: str, recs: list[dict[str, Any]]) -> list[tuple[list[Any], dict[str, torch.Tensor]]]:
    """(rows, collated batch) of `recs` as the task's codec encodes them for prediction."""
    td = pred.tasks[task]
    if hasattr(td.codec, "group_tensors"):  # matching: a group of (question, candidate) rows per record
        groups = [[(r["question"], c) for c in r["candidates"]] for r in recs]
        return [([], td.codec.group_tensors(td, groups[i:i + _BATCH])) for i in range(0, len(groups), _BATCH)]
    feats = td.encode_records(recs)
    return [(feats[i:i + _BATCH], td.codec.collate(td, feats[i:i + _BATCH], with_labels=False))
            for i in range(0, len(feats), _BATCH)]


@torch.no_grad()
def measure_bert(sparse: Any, plain: Any, task: str, head: str | None, pred: Any, recs: list[dict[str, Any]],
                 tok: Any) -> dict[str, Any]:
    """Sparse vs plain on `recs` (encoded as the project does), else on the fixed sentences."""
    if pred is not None and recs:
        batches = [b for _, b in _batches(pred, task, recs[:_PROBE_RECORDS])]
    elif head == "matching":  # one group: the first sentence as the question, the others its candidates
        enc = tok([_PROBE_TEXTS[0]] * (len(_PROBE_TEXTS) - 1), _PROBE_TEXTS[1:], return_tensors="pt", padding=True,
                  truncation=True)
        batches = [{k: v[None] for k, v in enc.items()}]
    else:
        enc = tok(_PROBE_TEXTS, return_tensors="pt", padding=True, truncation=True)
        batches = [dict(enc)]
    worst = {"max_abs_diff": 0.0, "argmax_equal": True, "compared": 0}
    for b in batches:
        r = _compare(*_bert_outputs(sparse, plain, task, head, b))
        worst = {"max_abs_diff": max(worst["max_abs_diff"], r["max_abs_diff"]),
                 "argmax_equal": worst["argmax_equal"] and r["argmax_equal"],
                 "compared": worst["compared"] + r["compared"]}
    return worst


@torch.no_grad()
def measure_crf(sparse: Any, plain: Any, task: str, pred: Any, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """On every record with gold tags: how often per-token argmax of the plain model's logits equals the
    constrained Viterbi path that ``predict`` returns, and the entity F1 of each decode (the task's own
    scorer)."""
    td = pred.tasks[task]
    labels = td.label_list
    recs = [r for r in recs if r.get("labels") is not None]
    gold, vit, arg = [], [], []
    for feats, batch in _batches(pred, task, recs):
        wm = batch["word_mask"].bool()
        em = plain(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   token_type_ids=batch["token_type_ids"]).logits
        for f, v, e, m in zip(feats, sparse.predict(task, **batch), em, wm):
            pad = ["O"] * (f.extra["n_total"] - int(m.sum()))
            vit.append([labels[i] for i in v] + pad)
            arg.append([labels[i] for i in e[m].argmax(-1).tolist()] + pad)
    gold = [r["labels"] for r in recs]
    if not recs:
        return {}
    f_vit, f_arg = td.score_records(recs, vit)["f1"], td.score_records(recs, arg)["f1"]
    tokens = sum(len(g) for g in gold)
    return {"sentences": len(recs), "sentence_agreement": sum(a == v for a, v in zip(arg, vit)) / len(recs),
            "token_agreement": sum(x == y for a, v in zip(arg, vit) for x, y in zip(a, v)) / max(tokens, 1),
            "viterbi_f1": f_vit, "argmax_f1": f_arg, "argmax_loses_over_1_point": f_vit - f_arg > 1.0}


@torch.no_grad()
def measure_bart(sparse: Any, plain: Any, task: str, sources: list[str], tok: Any) -> dict[str, Any]:
    """Beam outputs of both on `sources` (same generation config), token for token; teacher-forced logit
    difference on the sparse model's outputs; generation time of each (one pass, interleaved per input)."""
    gen = plain.generation_config
    same, worst, t_sparse, t_plain = 0, 0.0, 0.0, 0.0
    for s in sources:
        enc = tok(s, return_tensors="pt", truncation=True)
        enc = {k: v for k, v in enc.items() if k != "token_type_ids"}
        t0 = time.perf_counter()
        a = sparse.generate(**enc, task=task, generation_config=gen)
        t1 = time.perf_counter()
        b = plain.generate(**enc, generation_config=gen)
        t2 = time.perf_counter()
        t_sparse, t_plain = t_sparse + t1 - t0, t_plain + t2 - t1
        same += a.tolist() == b.tolist()
        la = sparse(**enc, decoder_input_ids=a, task=task).logits
        lb = plain(**enc, decoder_input_ids=a).logits
        worst = max(worst, float((la - lb).abs().max()))
    return {"inputs": len(sources), "beam_equal": same, "max_abs_diff": worst,
            "generate_seconds": {"sparse": t_sparse, "plain": t_plain},
            "plain_over_sparse_time": t_plain / t_sparse if t_sparse else None}


def measure_onnx(sparse: Any, flat: Any, task: str, pred: Any, recs: list[dict[str, Any]], tok: Any, folder: Path
                 ) -> dict[str, Any]:
    """model.onnx and model_int8.onnx in `folder` (export/onnx_graphs.py): each one's largest difference from the
    sparse model, and with labelled test records the task's metric of sparse, plain, ONNX fp32 and int8."""
    from .onnx_graphs import OrtModel, StockAsTask, export_onnx, task_score

    runners = {k: OrtModel(p) for k, p in export_onnx(flat.model, folder, tok).items()}
    res: dict[str, Any] = {k: measure_bert(sparse, r, task, flat.head, pred, recs, tok) for k, r in runners.items()}
    if pred is None or not recs or flat.head in (None, "mlm"):
        return res
    td = pred.tasks[task]
    try:
        scores = {"sparse": task_score(sparse, pred, task, recs),
                  **{k: task_score(StockAsTask(m, sparse, task), pred, task, recs)
                     for k, m in (("plain", flat.model), *runners.items())}}
    except (KeyError, TypeError) as e:  # records without gold labels: nothing to score
        res["scores"] = f"not scored: {e!r}"
        return res
    res.update(metric=td.cfg.metric or td.codec.metric, scores=scores, int8_score_drop=scores["sparse"] - scores["int8"])
    return res


# Beam width of the beam-search equality check when the task's own config decodes greedily (the tiny
# reproduction's tasks do): both decoders are then checked on the test inputs.
_CHECK_BEAMS = 4


@torch.no_grad()
def measure_bart_onnx(sparse: Any, flat: Any, task: str, pred: Any, recs: list[dict[str, Any]], prefix: str, tok: Any,
                      folder: Path, metric: str | None = None) -> dict[str, Any]:
    """``ort/``: the task's BART as ONNX encoder and decoder graphs, fp32 and int8 (export/onnx_graphs.py),
    decoded by ``ort/seq2seq.py``. For each: the largest teacher-forced logit difference from the sparse
    model (on the sparse model's own outputs), whether generation gives the sparse model's tokens on every
    test input (with the task's generation config, and with beam search of `_CHECK_BEAMS` beams when that
    config is greedy), and with labelled test records the task's metric of sparse, plain, ONNX fp32 and int8."""
    from .onnx_graphs import ORT_DIR, OrtAsGenerator, export_bart_onnx
    from .onnx_seq2seq import OrtSeq2Seq

    gen = flat.model.generation_config.to_dict()
    export_bart_onnx(flat.model, flat.widths, folder / ORT_DIR)
    runners = {k: OrtSeq2Seq(folder / ORT_DIR, int8=k == "int8", generation_config=gen) for k in ("fp32", "int8")}
    sources = [prefix + r["source"] for r in recs] or [prefix + t for t in _PROBE_TEXTS]
    settings = [{}] if (gen.get("num_beams") or 1) > 1 else [{}, {"num_beams": _CHECK_BEAMS}]
    res: dict[str, Any] = {"inputs": len(sources), "decoders": [s.get("num_beams", gen.get("num_beams") or 1)
                                                                  for s in settings]}
    # the sparse model's tokens and teacher-forced logits once, then each graph against them
    want, ref, encs = [], [], []
    for s in sources:
        enc = tok(s, return_tensors="pt", truncation=True)
        encs.append((enc["input_ids"], enc["attention_mask"]))
        want.append([sparse.generate(input_ids=encs[-1][0], attention_mask=encs[-1][1], task=task,
                                     generation_config=flat.model.generation_config, **st) for st in settings])
        ref.append(sparse(input_ids=encs[-1][0], attention_mask=encs[-1][1], decoder_input_ids=want[-1][0],
                          task=task).logits)
    for k, r in runners.items():
        worst, equal = 0.0, [0] * len(settings)
        for (ids, am), ws, lg in zip(encs, want, ref):
            for j, st in enumerate(settings):
                equal[j] += ws[j].tolist() == r.generate(ids.numpy(), am.numpy(), **st).tolist()
            got = r.logits(ws[0].numpy(), r.encode(ids.numpy(), am.numpy()), am.numpy())
            worst = max(worst, float((lg - torch.from_numpy(got)).abs().max()))
        res[k] = {"max_abs_diff": worst, "generate_equal": equal}
    if pred is None or not any(r.get("target") is not None for r in recs):
        return res
    from .onnx_graphs import task_score

    labelled = [r for r in recs if r.get("target") is not None]
    td = pred.tasks[task]
    metric = metric or td.cfg.metric or td.codec.metric
    scores = {"sparse": task_score(sparse, pred, task, labelled, metric),
              **{k: task_score(OrtAsGenerator(r), pred, task, labelled, metric) for k, r in runners.items()}}
    res.update(metric=metric, scores=scores, int8_score_drop=scores["sparse"] - scores["int8"])
    return res


def export_plain(source: str | Path, out: str | Path, task: str, features: bool = False, test: str | None = None,
                 overwrite: bool = False, onnx: bool = False, task_loader: TaskLoader | None = None) -> Path:
    """Write `task` of the SkillNet export `source` as a stock transformers folder `out` (module docstring);
    `task_loader` reads a fine-tuned export's tasks (`load_source`)."""
    from skillnet.common.outputs import OutputError, claim_output
    from skillnet.model.hub import has_tokenizer, save_tokenizer
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a refusal or an error is then the one line on stderr
    folder, out = Path(source), Path(out)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"--plain reads a SkillNet export folder (config.json), and {folder} is none: export "
                                f"the checkpoint first (export --checkpoint RUN --out RUN/hf), then --plain from it")
    if folder.resolve() == out.resolve() or folder.resolve().is_relative_to(out.resolve()):
        raise OutputError(f"--out {out}: is (or holds) the export being read ({folder}); give another folder")
    sparse, pred = load_source(folder, task_loader)
    recs, recs_file, why = _records(pred, task, test)  # before anything is written: a bad record writes nothing
    bart = sparse.config.model_type == "skillnet-bart"
    flat = plain_bart(sparse, task) if bart else plain_bert(sparse, task, features)
    claim_output(out, option="--out", command="export", overwrite=overwrite,
                 identity={"source": source_id(folder), "task": task, "plain": True, "features": features})
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    flat.model.save_pretrained(str(tmp))
    if has_tokenizer(folder):
        save_tokenizer(tmp, source=folder)
    meta = ((read_json(folder / FINETUNE_META) or {}).get("tasks") or {}).get(task) or {}
    tok = AutoTokenizer.from_pretrained(str(tmp))
    cut = _task_cut(meta, tok, int(flat.model.config.max_position_embeddings), features)
    if cut is not None and has_tokenizer(folder):
        tok.model_max_length = cut
        tok.save_pretrained(str(tmp))
    kind = meta.get("kind")
    records = _records_note(recs, recs_file, why, bart, flat.head == "token_crf", onnx)
    # loud when the claim falls back to fixed sentences: the card of a fine-tuned task says "test set" otherwise
    print(f"warning: {records['note']}" if records["fallback"] else f"[export] records: {records['note']}",
          file=sys.stderr)
    facts: dict[str, Any] = {
        "source": folder.name, "task": task, "class": type(flat.model).__name__, "head": flat.head,
        "skills": [{"name": sparse.config.skill_names[i], "weight": w} for i, w in flat.mixture],
        "ffn_widths": flat.widths, "measured_on": records["file"] or "fixed sentences", "records": records,
        "model_max_length": int(tok.model_max_length), "task_max_seq_len": meta.get("max_seq_len"),
        "kind": kind,
    }
    if bart:
        prefix = meta.get("prefix", "")
        if meta.get("type") == "generation":
            g = flat.model.generation_config
            for k, v in task_generation({"num_beams": g.num_beams}, meta, tmp).items():
                setattr(g, k, v)
            if g.num_beams == 1:
                # The source's config may carry early_stopping (a beam-search flag) from a beam task; greedy
                # decoding ignores it, but transformers refuses to save a greedy config that sets it.
                g.early_stopping = False
            g.save_pretrained(str(tmp))
        sources = [prefix + r["source"] for r in recs[:_BEAM_RECORDS]] or [prefix + t for t in _PROBE_TEXTS]
        facts["prefix"] = prefix
        facts["equality"] = measure_bart(sparse, flat.model, task, sources, tok)
        if onnx:
            # the task's metric as its fine-tuning run chose it (the Predictor's config may hold the type's default)
            facts["onnx"] = measure_bart_onnx(sparse, flat, task, pred, recs, prefix, tok, tmp, meta.get("metric"))
    else:
        facts["equality"] = measure_bert(sparse, flat.model, task, flat.head, pred, recs, tok)
        if flat.head == "token_crf":
            tr = {k: v.float().tolist() for k, v in sparse.heads[task]._transitions().items()}
            write_json(tmp / "crf.json", {"labels": [str(x) for x in sparse.config.task_heads[task]["labels"]], **tr})
            facts["crf"] = measure_crf(sparse, flat.model, task, pred, recs) if recs else {}
            facts["crf_transitions"] = read_json(tmp / "crf.json")
        if meta.get("type"):
            facts["task_type"] = meta["type"]
        if flat.head == "span":
            facts["span"] = settings_from_meta(meta, sparse.config.task_heads[task])
            write_span_module(tmp, {task: facts["span"]})
    if onnx and not bart:
        facts["onnx"] = measure_onnx(sparse, flat, task, pred, recs, tok, tmp)
    write_json(tmp / "plain_export.json", facts)
    (tmp / "README.md").write_text(render_plain_card(facts), encoding="utf-8")
    finish_folder(tmp, out)
    return out


def _task_cut(meta: dict[str, Any], tok: Any, positions: int, features: bool) -> int | None:
    """The tokenizer's ``model_max_length`` for a task folder: where the project cuts the task's inputs, so that
    ``truncation=True`` gives the model what ``predict`` gives it (a classification text or a matching pair cut
    longest-first to max_seq_len, NER's pieces past it, a BART source after its prefix); None keeps the model's
    positions (features, MLM, and span, whose ``predict`` reads a long context in windows of max_seq_len)."""
    L = meta.get("max_seq_len")
    if features or not L or meta.get("type") in (None, "span"):
        return None
    extra = 0
    if meta.get("type") == "generation" and meta.get("prefix"):
        # the project cuts the source to max_seq_len and puts the prefix on top (finetune/task_types/generation.py)
        extra = len(tok(meta["prefix"], add_special_tokens=False)["input_ids"])
    return min(int(L) + extra, positions)
