"""The model card of an ``export --plain`` folder (export/plain.py): how the task was flattened, what was measured,
and the lines that serve it, rendered from plain_export.json's facts."""

from __future__ import annotations

import json
from typing import Any

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


# A span folder's answers come from span_qa.py beside the model: predict's windows, stride, question cut and cap.
SPAN_IMPORT = ['import sys; sys.path.insert(0, f"{folder}/qa")',
               "from span_qa import SpanQA  # predict's windows and answer rule, settings in span_qa.json"]


def _span_settings(sp: dict[str, Any]) -> str:
    """The card's sentence on a span task's settings (plain_export.json's ``span``)."""
    stride = (f"{sp['doc_stride']} pieces" if sp.get("doc_stride") else "half a window")
    return (f"Span settings (`qa/span_qa.json`): rows of {sp['max_seq_len']} tokens; the question keeps "
            f"{sp['max_question_len']} pieces (`max_question_len`); the context is read in windows of the rest, "
            f"each starting {stride} after the last (`doc_stride`); an answer is at most {sp['max_answer_len']} "
            "tokens (`max_answer_len`); the best span of any window is the answer. `qa/span_qa.py` does this with the "
            "model below or the ONNX graph, as the sparse model's `predict` does, so its answers and the scores "
            "above are the same on contexts of any length.")


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
        return [p, *SPAN_IMPORT, "from transformers import AutoModelForQuestionAnswering",
                "qa = SpanQA(folder, AutoModelForQuestionAnswering.from_pretrained(folder))",
                'print(qa("中国的首都是哪里？", "北京是中国的首都。"))  # lists of questions and contexts: a list of answers']
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
        lines += ["", "Span: the sparse model masks the question, so a span is taken over the context tokens only "
                  "(`token_type_ids == 1`), window by window: `qa/span_qa.py` (## Use) does it."]
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
        if f.get("head") == "span":
            lines += ["", "```python", *SPAN_IMPORT, "import onnxruntime as ort",
                      'qa = SpanQA(folder, ort.InferenceSession(f"{folder}/model.onnx"))  # model_int8.onnx: int8',
                      'print(qa("中国的首都是哪里？", "北京是中国的首都。"))', "```"]
        else:
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
    elif f.get("head") == "span" and f.get("span"):
        lines += [_span_settings(f["span"]), ""]
    lines += ["```python", *_usage(f), "```", ""]
    return "\n".join(lines)
