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

from .card import FINETUNE_META, read_json, task_generation, write_json
from .flatten import plain_bart, plain_bert
from .hf_folder import finish_folder, source_id

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

# Decodes as TokenCRFHead.viterbi: ties go to the lowest tag id, as torch's max.
VITERBI_LINES = '''import json, torch
crf = json.load(open(f"{folder}/crf.json"))
start, trans, end = (torch.tensor(crf[k]) for k in ("start_transitions", "transitions", "end_transitions"))
def viterbi(em):  # em: [words, labels], the logits at each word's first piece
    score, back = start + em[0], []
    for e in em[1:]:
        score, arg = (score[:, None] + trans + e[None, :]).max(0)
        back.append(arg)
    tags = [int((score + end).argmax())]
    for arg in reversed(back):
        tags.append(int(arg[tags[-1]]))
    return [crf["labels"][t] for t in tags[::-1]]'''


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


def _usage(f: dict[str, Any]) -> list[str]:
    """The lines that serve the folder (the card's; docs/hf.md shows the same)."""
    p = 'folder = "path/to/this/folder"'
    cls = f["class"]
    if cls == "BartForConditionalGeneration":
        return [p, "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer",
                "tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForSeq2SeqLM.from_pretrained(folder)",
                f'ids = model.generate(**tok({f.get("prefix", "")!r} + "输入文本", return_tensors="pt", truncation=True))[0]',
                'print("".join(t.removeprefix("##") for t in tok.convert_ids_to_tokens(ids, skip_special_tokens=True)))']
    head = f.get("head")
    if head in ("classification", "regression"):
        text = ('{"text": "我需要多少人寿保险？", "text_pair": "这取决于您的收入和家庭的需要。"}' if f.get("kind") == "pair"
                else '"这家酒店的服务很好"')  # a task of sentence pairs reads both
        return [p, "from transformers import pipeline",
                'clf = pipeline("text-classification", model=folder, truncation=True)', f"print(clf({text}))"]
    if head == "matching":
        return [p, "from transformers import AutoModelForSequenceClassification, AutoTokenizer",
                "tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForSequenceClassification.from_pretrained(folder)",
                'question, candidates = "年金什么时候领", ["年金一般在退休后按月领取", "医保可以报销部分医疗费用"]',
                "scores = model(**tok([question] * len(candidates), candidates, return_tensors=\"pt\", padding=True, "
                "truncation=True)).logits[:, 0]",
                "best = int(scores.argmax())  # rank the candidates by score, highest first"]
    if head == "span":
        return [p, "from transformers import AutoModelForQuestionAnswering, AutoTokenizer",
                "tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForQuestionAnswering.from_pretrained(folder)",
                'o = model(**tok("中国的首都是哪里？", "北京是中国的首都。", return_tensors="pt"))',
                "# answer: the best (start <= end) over the context tokens only (token_type_ids == 1)"]
    if head == "token_crf":
        return [p, "from transformers import AutoModelForTokenClassification, AutoTokenizer",
                "tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForTokenClassification.from_pretrained(folder)",
                *VITERBI_LINES.splitlines(),
                'words = list("李四在深圳工作")',
                'enc = tok(words, is_split_into_words=True, return_tensors="pt", truncation=True)',
                "wid = enc.word_ids()",
                "first = [i for i, w in enumerate(wid) if w is not None and (i == 0 or wid[i - 1] != w)]",
                "print(viterbi(model(**enc).logits[0, first].detach()))"]
    if head == "mlm":
        return [p, "from transformers import pipeline", 'fill = pipeline("fill-mask", model=folder)',
                'print(fill("今天天气很[MASK]。")[0]["token_str"])']
    return [p, "from transformers import pipeline", 'fe = pipeline("feature-extraction", model=folder)',
            'h = fe("这家酒店的服务很好")[0]  # one vector per token']


def _onnx_scores(ox: dict[str, Any]) -> str:
    """The card's line of test scores: each arm that was scored, and the int8 drop."""
    names = {"sparse": "sparse", "plain": "plain", "fp32": "ONNX fp32", "int8": "int8"}
    arms = ", ".join(f"{n} {ox['scores'][k]:.4f}" for k, n in names.items() if k in ox["scores"])
    return f"Test {ox['metric']}: {arms} (int8 drop {ox['int8_score_drop']:.4f})."


def _bart_onnx_card(f: dict[str, Any], ox: dict[str, Any]) -> list[str]:
    """The card's ONNX section of a BART task: what the graphs are, what was measured, how to serve them."""
    def beams(n: int) -> str:
        return "greedy search" if n == 1 else f"beam search ({n} beams)"

    eq = "; ".join(f"{k}: " + ", ".join(f"{beams(n)} {e}/{ox['inputs']}" for n, e in zip(ox["decoders"], v["generate_equal"]))
                   for k, v in ((k, ox[k]) for k in ("fp32", "int8")))
    lines = ["## ONNX", "",
             "`ort/encoder.onnx` and `ort/decoder.onnx` (fp32; torch.onnx's dynamo exporter), `ort/*_int8.onnx` (ONNX "
             "Runtime's dynamic int8), and `ort/seq2seq.py`, greedy and beam search over them with numpy and "
             "onnxruntime only (transformers' decoding rules for this generation config). The decoder graph takes "
             "all tokens so far (no past key values). The graphs keep each layer's own FFN width "
             f"({f['ffn_widths']}): no layer computes zero padding.", "",
             f"Largest teacher-forced logit difference from the sparse model on {f['measured_on']}: "
             f"{ox['fp32']['max_abs_diff']:.2e} (fp32), {ox['int8']['max_abs_diff']:.2e} (int8). Generated tokens equal "
             f"to the sparse model's, per input: {eq}."]
    if isinstance(ox.get("scores"), dict):
        lines.append(_onnx_scores(ox))
    lines += ["", "```python", 'import sys; sys.path.insert(0, f"{folder}/ort")', "from seq2seq import OrtSeq2Seq",
              "from transformers import AutoTokenizer  # or any tokenizer that reads tokenizer.json",
              'model = OrtSeq2Seq(f"{folder}/ort")  # int8=True: the quantised graphs',
              f'ids = model.generate(**AutoTokenizer.from_pretrained(folder)({f.get("prefix", "")!r} + "输入文本", '
              'return_tensors="np"))[0]', "```"]
    return lines


def render_plain_card(f: dict[str, Any]) -> str:
    eq = f["equality"]
    skills = ", ".join(f"`{s['name']}` ({s['weight']:.4g})" for s in f["skills"])
    lines = ["---", "library_name: transformers", "tags:", "- skillnet", "---", "",
             f"# SkillNet task `{f['task']}` as a stock `{f['class']}`", "",
             f"Task `{f['task']}` of the SkillNet export `{f['source']}`, written as a stock transformers model: it "
             "loads without `trust_remote_code` and without SkillNet installed.", "",
             "## How it was flattened", "",
             f"In every skill layer the task runs the skills {skills} (name, weight). Their weighted mean is one "
             "FFN: the skills' first linear layers concatenated (rows), their second linear layers concatenated "
             "(columns), each block scaled by its weight. Each layer's own FFN width, bottom to top"
             + (" (encoder, then decoder)" if f["class"].startswith("Bart") else "") + f": {f['ffn_widths']}; "
             "narrower layers are zero-padded to the config's one width (exact: zero rows give act(0) = 0, zero "
             "columns add nothing).", "", "## Measured equality", ""]
    rec = f.get("records") or {}
    if rec.get("fallback"):  # the reason may name folders of the exporting machine: plain_export.json keeps it
        lines += [f"**Not measured on task data**: on {rec['equality']} fixed sentences; the export found no records "
                  "of the task (plain_export.json's `records` says why). Export again with `--test FILE` to measure "
                  "on them.", ""]
    elif rec:
        lines += [f"Records: {rec['note']}.", ""]
    if f["class"].startswith("Bart"):
        lines.append(f"On {eq['inputs']} inputs ({f['measured_on']}), beam search gave the same tokens as the sparse "
                     f"model for {eq['beam_equal']} of {eq['inputs']}; the largest teacher-forced logit difference "
                     f"was {eq['max_abs_diff']:.2e} (fp32). Generation time, plain / sparse: "
                     f"{eq['plain_over_sparse_time']:.2f}x (the zero-padded layers compute their full width).")
    else:
        lines.append(f"On {f['measured_on']} ({eq['compared']} compared rows or positions), the largest difference "
                     f"between this model's outputs and the sparse model's was {eq['max_abs_diff']:.2e} (fp32); "
                     f"every argmax {'was the same' if eq['argmax_equal'] else 'was NOT the same'}.")
    if f.get("head") == "matching":
        lines += ["", "Matching: score each (question, candidate) pair as one row; `logits[:, 0]` is the score. "
                  "Rank a question's candidates by it (highest first), as the sparse model's softmax over the group."]
    if f.get("head") == "span":
        lines += ["", "Span: the sparse model masks the question, so take the best (start <= end) span over the "
                  "context tokens only (`token_type_ids == 1`)."]
    crf = f.get("crf")
    if f.get("head") == "token_crf":
        lines += ["", "## CRF decoding", "",
                  "The logits are the CRF's emissions. `crf.json` holds the transitions (with the IOB2 constraints "
                  "added), and the `viterbi` lines below decode as the sparse model's `predict` does."]
        if crf:
            lines += ["", f"On {crf['sentences']} sentences of {f['measured_on']}: per-token argmax equals the "
                      f"Viterbi path for {100 * crf['sentence_agreement']:.1f}% of sentences "
                      f"({100 * crf['token_agreement']:.1f}% of tokens); entity F1 {crf['viterbi_f1']:.2f} with "
                      f"Viterbi, {crf['argmax_f1']:.2f} with argmax."]
            if crf["argmax_loses_over_1_point"]:
                lines.append(f"**Argmax decoding loses {crf['viterbi_f1'] - crf['argmax_f1']:.2f} F1 points: "
                             "decode with Viterbi.**")
        else:
            lines += ["", "The agreement of argmax with Viterbi was not measured: the source has no test data."]
        lines += ["", "The transitions (`crf.json`; row = from, column = to; moves IOB2 forbids carry -10000 on top):",
                  "", "```json", json.dumps(f["crf_transitions"], ensure_ascii=False), "```"]
    ox = f.get("onnx")
    if ox and f["class"].startswith("Bart"):
        lines += ["", *_bart_onnx_card(f, ox)]
    elif ox:
        lines += ["", "## ONNX", "",
                  f"`model.onnx` (fp32) and `model_int8.onnx` (dynamic int8): largest difference from the sparse "
                  f"model {ox['fp32']['max_abs_diff']:.2e} (fp32) and {ox['int8']['max_abs_diff']:.2e} (int8) on "
                  f"{f['measured_on']}."]
        if isinstance(ox.get("scores"), dict):
            lines.append(_onnx_scores(ox))
        run = ('question, candidates = "年金什么时候领", ["年金一般在退休后按月领取", "医保可以报销部分医疗费用"]\n'
               'scores = session.run(None, dict(tok([question] * len(candidates), candidates, return_tensors="np", '
               'padding=True, truncation=True)))[0][:, 0]' if f.get("head") == "matching" else
               'logits = session.run(None, dict(tok("这家酒店的服务很好", return_tensors="np", truncation=True)))[0]')
        lines += ["", "```python", "import onnxruntime as ort",
                  'session = ort.InferenceSession(f"{folder}/model_int8.onnx")', *run.splitlines(), "```"]
    lines += ["", "## Use", ""]
    L, cut = f.get("task_max_seq_len"), f.get("model_max_length")
    if L and cut is not None and f.get("head") not in ("span", "mlm", None) and f.get("class") != "BertModel":
        lines += [f"The task was trained and is predicted on inputs cut at {L} tokens; the tokenizer's "
                  f"`model_max_length` is {cut}" + (f" ({L} for the source, the rest for the task's prefix)"
                                                    if cut != L else "")
                  + ", so `truncation=True` cuts as the sparse model's `predict` does"
                  + {"token_crf": " (words past the cut get no tag from these lines; `predict` tags them O)",
                     "matching": " (a pair: longest first)", "classification": " (a pair: longest first)"}.get(
                      str(f.get("head")), "") + ".", ""]
    elif f.get("head") == "span" and L:
        lines += [f"The sparse model's `predict` reads a long context in windows of {L} tokens and keeps the best "
                  "answer of any window; the lines below read one window of up to the model's positions.", ""]
    lines += ["```python", *_usage(f), "```", ""]
    return "\n".join(lines)
