"""Do a reproduction's exports work in plain transformers? Each check loads an export in a subprocess that
cannot import this project (its import path and import hooks removed, which the subprocess asserts) and
compares what a `pipeline(...)` or Auto class returns with the project's own prediction on the same inputs:

- the sparsely pre-trained BERT: fill-mask (top token at every masked position of corpus sentences) and
  feature-extraction (hidden states) without `task=`;
- the first seed's SkillNet-NLU export: text-classification on the sentiment test texts, and, re-exported
  with `export --task ner`, token-classification entities on the NER test sentences;
- the first seed's SkillNet-NLG export: text2text-generation on its default task's test sources;
- every task of the same two exports written with ``export --plain`` (stock transformers classes, no remote
  code), used as its model card says: the text-classification pipeline (classification), the candidates
  ranked by the single score (matching), the best start <= end over the context's tokens (span), the card's
  Viterbi lines over crf.json (NER: the tags, word for word) and the card's generation lines (every generation
  task); with ``--onnx`` the exports carry ONNX graphs and each task gets a second row, the same decoding over
  the fp32 graph in onnxruntime (model.onnx; ``ort/seq2seq.py`` for BART).

    python -m skillnet.experiments.hf_check runs/reproduce-quick [--python /path/to/plain/venv/bin/python] [--onnx]

Prints one line per check and a JSON object as the last line; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Drop every path and import hook that could find this project, prove it is gone, then run the body.
_PRELUDE = r"""
import importlib.util, json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "skillnet" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if p and not p.startswith(HIDE)]
assert importlib.util.find_spec("skillnet") is None, "the project is still importable"
import torch
from transformers import pipeline, AutoModel, AutoTokenizer
"""

# Each job's body runs in its own namespace (the prelude's names, `folder`, `inputs` and an empty `res`), one job
# after another in one interpreter: importing torch and transformers once, not once per task.
# The results go to a file (a body may print), after a last check that no module was loaded from the project.
_JOBS = r"""
_results = []
for _job in json.load(open(sys.argv[1], encoding="utf-8")):
    _ns = {**globals(), "folder": _job["folder"], "inputs": _job["inputs"], "res": {}}
    exec(compile(_job["body"], "<plain check>", "exec"), _ns)
    _results.append(_ns["res"])
_ours = sorted(m for m, mod in list(sys.modules.items()) if (getattr(mod, "__file__", None) or "").startswith(HIDE))
assert not _ours, f"modules of the project were loaded: {_ours}"
json.dump(_results, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
"""


def run_plain(python: str, folder: Path, inputs: Any, body: str) -> Any:
    """Run `body` in a fresh interpreter that cannot import the project; returns its `res`."""
    return run_plain_jobs(python, [(folder, inputs, body)])[0]


def run_plain_jobs(python: str, jobs: list[tuple[Path, Any, str]]) -> list[Any]:
    """Run each (folder, inputs, body) in turn in one fresh interpreter that cannot import the project; returns
    each body's `res`."""
    hide = str(Path(__file__).resolve().parents[1])
    todo = [{"folder": str(Path(folder).resolve()), "inputs": inputs, "body": body} for folder, inputs, body in jobs]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "jobs.json").write_text(json.dumps(todo, ensure_ascii=False), encoding="utf-8")
        script = Path(tmp) / "plain.py"
        script.write_text(f"HIDE = {hide!r}\n{_PRELUDE}{_JOBS}", encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        # The interpreter runs in tmp: a relative folder would read as a hub repo id there.
        out = Path(tmp) / "results.json"
        r = subprocess.run([python, str(script), str(Path(tmp) / "jobs.json"), str(out)], cwd=tmp,
                           capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=1800)
        if r.returncode != 0:
            where = ", ".join(sorted({j["folder"] for j in todo}))
            raise RuntimeError(f"plain transformers on {where}: {r.stderr.strip().splitlines()[-1:]}")
        return json.loads(out.read_text(encoding="utf-8"))


def _jsonl(path: Path, n: int) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return rows[:n]


def check_pretrained(run: Path, python: str, n: int) -> dict[str, Any]:
    import torch
    from skillnet.model import SkillNetBertForPreTraining
    from transformers import AutoTokenizer

    folder = run / "pt_sparse" / "hf"
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = SkillNetBertForPreTraining.from_pretrained(str(folder)).eval()
    # Sentences of the pre-training corpus (seen in training), one character masked in each.
    texts = [r["text"] for r in _jsonl(run / "tasks" / "sentiment" / "train.jsonl", n)]
    masked = [t[:4] + tok.mask_token + t[5:40] for t in texts if len(t) > 6]
    want_top, want_hidden = [], []
    with torch.no_grad():
        for t in masked:
            enc = tok(t, return_tensors="pt", truncation=True)
            pos = enc["input_ids"][0].tolist().index(tok.mask_token_id)
            want_top.append(int(model(**enc, task="mlm").logits[0, pos].argmax()))
            want_hidden.append(model.bert(**enc, task="mlm").last_hidden_state[0])
    got = run_plain(python, folder, masked, r"""
fill = pipeline("fill-mask", model=folder, trust_remote_code=True)
res["top"] = [fill(t, top_k=1)[0]["token"] for t in inputs]
fe = pipeline("feature-extraction", model=folder, trust_remote_code=True)
res["hidden"] = [fe(t)[0] for t in inputs]
""")
    hidden_ok = all(torch.allclose(torch.tensor(h), w, atol=1e-4, rtol=1e-4)
                    for h, w in zip(got["hidden"], want_hidden))
    return {"fill-mask": {"inputs": len(masked), "agree": sum(a == b for a, b in zip(got["top"], want_top)),
                          "distinct_top_tokens": len(set(got["top"]))},
            "feature-extraction": {"inputs": len(masked), "agree": len(masked) if hidden_ok else 0}}


def check_nlu(run: Path, python: str, n: int) -> dict[str, Any]:
    from skillnet.finetune.predict import Predictor
    from skillnet.pretrain.export import main as export_main

    folder = run / "compare" / "nlu_main" / "skillnet" / "seed0" / "export"
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task, pipe in (("sentiment", "text-classification"), ("ner", "token-classification")):
            here = Path(tmp) / task
            if export_main(["--checkpoint", str(folder), "--out", str(here), "--task", task]) != 0:
                raise RuntimeError(f"export --task {task} failed for {folder}")
            pred = Predictor(here)
            if task == "sentiment":
                # short texts: the project cuts at the task's max_seq_len, a pipeline at the model's positions
                texts = [r["text"] for r in _jsonl(run / "tasks" / task / "test.jsonl", 4 * n) if len(r["text"]) <= 60][:n]
                want = pred.predict(task, [{"text": t} for t in texts])
                got = run_plain(python, here, texts, r"""
clf = pipeline("text-classification", model=folder, trust_remote_code=True, truncation=True)
res["out"] = [r["label"] for r in clf(inputs)]
""")["out"]
            else:
                recs = [r for r in _jsonl(run / "tasks" / task / "test.jsonl", 4 * n) if len(r["tokens"]) <= 100][:n]
                want = [[[e["type"], e["start"], e["end"], e["text"]] for e in p["entities"]]
                        for p in pred.predict(task, [{"tokens": r["tokens"]} for r in recs])]
                got = run_plain(python, here, ["".join(r["tokens"]) for r in recs], r"""
ner = pipeline("token-classification", model=folder, trust_remote_code=True, aggregation_strategy="simple")
res["out"] = [[[e["entity_group"], e["start"], e["end"], e["word"].replace(" ", "")] for e in row]
              for row in ner(inputs)]
""")["out"]
            out[pipe] = {"task": task, "inputs": len(want), "agree": sum(a == b for a, b in zip(got, want)),
                         "distinct_outputs": len({json.dumps(g, ensure_ascii=False) for g in got})}
    return out


def check_nlg(run: Path, python: str, n: int) -> dict[str, Any]:
    from skillnet.finetune.predict import Predictor

    folder = run / "compare" / "nlg_main" / "skillnet" / "seed0" / "export"
    task = json.loads((folder / "config.json").read_text(encoding="utf-8"))["default_task"]
    srcs = [r["source"] for r in _jsonl(run / "tasks" / task / "test.jsonl", n)]
    want = Predictor(folder).predict(task, [{"source": s} for s in srcs])
    got = run_plain(python, folder, srcs, r"""
gen = pipeline("text2text-generation", model=folder, trust_remote_code=True)
res["out"] = [gen(s)[0]["generated_text"] for s in inputs]
""")["out"]
    return {"text2text-generation": {"task": task, "inputs": len(srcs), "agree": sum(a == b for a, b in zip(got, want)),
                                     "distinct_outputs": len(set(got))}}


# Loads the plain folder's stock model and, with `inputs["onnx"]`, its fp32 ONNX graph: `runs` maps each
# backend to a function of numpy encoder inputs that returns the graph's outputs (NAMES) as numpy arrays, so that
# the card's decoding below runs unchanged on both.
_RUNNERS = r"""
import numpy as np
import transformers
tok = AutoTokenizer.from_pretrained(folder)
model = getattr(transformers, CLASS).from_pretrained(folder).eval()
def _torch_run(enc):
    with torch.no_grad():
        o = model(**{k: torch.from_numpy(v) for k, v in enc.items()})
    return [o[k].numpy() for k in NAMES]
runs = {"plain": _torch_run}
if inputs["onnx"]:
    import onnxruntime as ort
    sess = ort.InferenceSession(f"{folder}/model.onnx", providers=["CPUExecutionProvider"])
    feeds = [i.name for i in sess.get_inputs()]
    runs["onnx"] = lambda enc: sess.run(NAMES, {k: enc[k] for k in feeds})
for name in runs:
    res[name] = []
"""

# Per head type: the stock class, its outputs, and the card's way to turn them into a prediction (export/plain.py's
# `_usage`), run over `inputs["recs"]`.
_BODIES = {
    # The card's pipeline for the stock model; its argmax over the graph's logits for ONNX (no pipeline takes one).
    "classification": ("BertForSequenceClassification", ["logits"], r"""
clf = pipeline("text-classification", model=folder, truncation=True)  # stock class: no trust_remote_code
# a task of sentence pairs: the card's {"text", "text_pair"} input
res["plain"] = [r["label"] for r in clf([{"text": r["text"], "text_pair": r["text_pair"]} if "text_pair" in r
                                         else r["text"] for r in inputs["recs"]])]
if "onnx" in runs:
    res["onnx"] = [model.config.id2label[int(runs["onnx"](dict(tok(r["text"], r.get("text_pair"), truncation=True,
                                                                    return_tensors="np")))[0][0].argmax())]
                   for r in inputs["recs"]]
"""),
    # Rank the candidates by the single score (the card's lines: the folder's tokenizer cuts at the task's length).
    "matching": ("BertForSequenceClassification", ["logits"], r"""
for r in inputs["recs"]:
    enc = dict(tok([r["question"]] * len(r["candidates"]), r["candidates"], padding=True, truncation=True,
                   return_tensors="np"))
    for name, run in runs.items():
        res[name].append(int(run(enc)[0][:, 0].argmax()))
"""),
    # The card: the best start <= end over the context's tokens; its characters through the offsets.
    "span": ("BertForQuestionAnswering", ["start_logits", "end_logits"], r"""
for r in inputs["recs"]:
    enc = tok(r["question"], r["context"], return_offsets_mapping=True, return_tensors="np")
    off = enc.pop("offset_mapping")[0]
    ctx = np.array([i for i, s in enumerate(enc.sequence_ids(0)) if s == 1])
    for name, run in runs.items():
        s, e = run(dict(enc))
        score = s[0][ctx][:, None] + e[0][ctx][None, :]
        score = np.where(np.triu(np.ones_like(score, dtype=bool)), score, -np.inf)
        a, b = divmod(int(score.argmax()), len(ctx))
        res[name].append(r["context"][off[ctx[a]][0]:off[ctx[b]][1]])
"""),
    # The card's Viterbi lines (plain_export.VITERBI_LINES, put before this by check_plain) over crf.json at each
    # word's first piece.
    "ner": ("BertForTokenClassification", ["logits"], r"""
for r in inputs["recs"]:
    enc = tok(r["tokens"], is_split_into_words=True, return_tensors="np", truncation=True)
    wid = enc.word_ids()
    first = [i for i, w in enumerate(wid) if w is not None and (i == 0 or wid[i - 1] != w)]
    for name, run in runs.items():
        res[name].append(viterbi(torch.from_numpy(run(dict(enc))[0][0, first])))
"""),
}

# The card's generation lines; with ONNX, ort/seq2seq.py (numpy + onnxruntime) on the same token ids.
_GENERATE = r"""
import numpy as np
from transformers import AutoModelForSeq2SeqLM
tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
def text(ids):
    return "".join(t.removeprefix("##") for t in tok.convert_ids_to_tokens(list(map(int, ids)), skip_special_tokens=True))
res["plain"] = [text(model.generate(**tok(s, return_tensors="pt"))[0]) for s in inputs["recs"]]
if inputs["onnx"]:
    sys.path.insert(0, f"{folder}/ort")
    sys.modules.pop("seq2seq", None)  # an earlier job's folder
    from seq2seq import OrtSeq2Seq
    gen = OrtSeq2Seq(f"{folder}/ort")
    res["onnx"] = []
    for s in inputs["recs"]:
        enc = tok(s, return_tensors="np")
        res["onnx"].append(text(gen.generate(enc["input_ids"], enc["attention_mask"])[0]))
"""


def _plain_records(task: str, meta: dict[str, Any], recs: list[dict[str, Any]], tok: Any, n: int
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The first `n` of `recs` whose comparison is exact, and what the row says about the rest: an input the
    project cuts at the task's max_seq_len (or splits into windows, for span) and a pipeline cuts at the model's
    positions is left out, as the other checks do with long texts."""
    L, kind = int(meta["max_seq_len"]), meta["type"]
    if kind == "classification" and meta.get("kind") == "pair":
        # Longest-first cutting of the pair to max_seq_len is the tokenizer's too (model_max_length, as matching).
        return recs[:n], {"note": f"pairs cut longest-first at the tokenizer's model_max_length ({L}, the task's)"}
    if kind == "classification":
        keep = [r for r in recs if len(tok(r["text"])["input_ids"]) <= L]
    elif kind == "span":
        keep = [r for r in recs if len(tok(r["question"], r["context"])["input_ids"]) <= L]
        # predict also caps an answer at the head's max_answer_len and answers "" when its best span is not in
        # the context; the card's rule does neither, so the two can differ there, and the row would show it.
        return keep[:n], {"note": "card's rule: best start <= end over the context tokens; predict's also caps "
                                  "the answer length"}
    elif kind == "matching":
        # Longest-first cutting of each pair to max_seq_len is the tokenizer's too (its model_max_length is the
        # task's length in a plain task folder); a candidate cap changes the ranking.
        cap = int(meta.get("head", {}).get("max_candidates", 0) or 0)
        keep = [r for r in recs if not cap or len(r["candidates"]) <= cap]
        return keep[:n], {"note": f"pairs cut longest-first at the tokenizer's model_max_length ({L}, the task's)"}
    elif kind == "ner":
        # A word with no word piece (a space, a control character) has no first piece for the card's lines to
        # read, while predict still tags it: such sentences cannot be compared tag for tag, so they are left out
        # and counted in the row.
        fits = [r for r in recs if len(tok(r["tokens"], is_split_into_words=True)["input_ids"]) <= L]
        keep = [r for r in fits if all(tok(w, add_special_tokens=False)["input_ids"] for w in r["tokens"])]
        return keep[:n], {"left_out_words_without_pieces": len(fits) - len(keep)}
    else:
        raise ValueError(f"{task}: no plain check for a task of type {kind!r}")
    return keep[:n], {}


# How each task type's row is named (the existing rows' names kept).
_HOW = {"classification": "text-classification", "matching": "rank", "span": "question-answering",
        "ner": "viterbi", "generation": "generate"}


def _rows(task: str, kind: str, got: dict[str, list[Any]], want: list[Any], extra: dict[str, Any],
          same: Any = None) -> dict[str, Any]:
    """One row per backend the plain side ran (`plain`: the stock torch model; `onnx`: model.onnx or ort/)."""
    eq = same or (lambda a, b: a == b)
    return {f"{backend} {task} ({_HOW[kind]})": {
        "task": task, "inputs": len(want), "agree": sum(eq(a, b) for a, b in zip(outs, want)),
        "distinct_outputs": len({json.dumps(o, ensure_ascii=False) for o in outs}), **extra}
        for backend, outs in got.items()}


def check_plain(run: Path, python: str, n: int, onnx: bool = False) -> dict[str, Any]:
    """Every task of the first seed's SkillNet-NLU and SkillNet-NLG exports (and the held-back NLU task, from the
    adaptation's existing-skills export, where the run has one) written with ``export --plain``
    (stock classes, no remote code), used as its model card says, against the project's own predictions from
    the sparse export; with `onnx`, exported with ``--onnx`` and the fp32 graphs run in onnxruntime too."""
    from skillnet.export.plain import VITERBI_LINES
    from skillnet.finetune.predict import Predictor
    from skillnet.pretrain.export import main as export_main
    from transformers import AutoTokenizer

    out: dict[str, Any] = {}
    # Every task's plain side runs in one interpreter after all exports: (job, how its result becomes rows).
    jobs: list[tuple[Path, Any, str]] = []
    finish: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        done: set[str] = set()
        # the held-back NLU task (sentence pairs) is in the adaptation's export (its existing-skills row)
        for comparison, row, optional in (("nlu_main", "skillnet", False), ("nlu_adapt", "a_existing", True),
                                          ("nlg_main", "skillnet", False)):
            src = run / "compare" / comparison / row / "seed0" / "export"
            if optional and not src.is_dir():
                print(f"skip plain {comparison}: no {src}", file=sys.stderr)
                continue
            tasks = json.loads((src / "finetune_tasks.json").read_text(encoding="utf-8"))["tasks"]
            pred = Predictor(src)
            for task, meta in tasks.items():
                if task in done:
                    continue
                done.add(task)
                test = run / "tasks" / task / "test.jsonl"
                if not test.is_file():
                    print(f"skip plain {task}: no {test}", file=sys.stderr)
                    continue
                here = Path(tmp) / task
                if export_main(["--plain", "--checkpoint", str(src), "--out", str(here), "--task", task,
                                *(["--onnx"] if onnx else [])]) != 0:
                    raise RuntimeError(f"export --plain --task {task} failed for {src}")
                tok = AutoTokenizer.from_pretrained(str(here))
                kind = meta["type"]
                if kind == "generation":
                    prefix = json.loads((here / "plain_export.json").read_text(encoding="utf-8")).get("prefix", "")
                    srcs = [r["source"] for r in _jsonl(test, 4 * n)
                            if len(tok(prefix + r["source"])["input_ids"]) <= int(meta["max_seq_len"])][:n]
                    want = pred.predict(task, [{"source": s} for s in srcs])
                    jobs.append((here, {"recs": [prefix + s for s in srcs], "onnx": onnx}, _GENERATE))
                    # The card's lines join word pieces without the space the project puts between two Latin
                    # words: outputs are compared without spaces.
                    finish.append((task, kind, want, {"note": "compared without spaces"},
                                   lambda a, b: "".join(a.split()) == "".join(b.split())))
                    continue
                recs, extra = _plain_records(task, meta, _jsonl(test, 8 * n), tok, n)
                preds = pred.predict(task, recs)
                want_of = {"classification": lambda p: p, "span": lambda p: p, "matching": lambda p: p["best"],
                           "ner": lambda p: p["tags"]}[kind]
                cls, names, body = _BODIES[kind]
                head = f"CLASS, NAMES = {cls!r}, {names!r}\n" + _RUNNERS
                jobs.append((here, {"recs": recs, "onnx": onnx},
                             head + (VITERBI_LINES + "\n" if kind == "ner" else "") + body))
                finish.append((task, kind, [want_of(p) for p in preds], extra, None))
        for got, (task, kind, want, extra, same) in zip(run_plain_jobs(python, jobs), finish):
            out.update(_rows(task, kind, got, want, extra, same))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a reproduction's output folder (e.g. runs/reproduce-quick)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter of the plain side, e.g. a venv with only torch, transformers and "
                        "safetensors (default: this one, with the project hidden)")
    p.add_argument("--n", type=int, default=20, help="inputs per check (default: 20)")
    p.add_argument("--onnx", action="store_true",
                   help="write the plain exports with --onnx and add a row per task for the fp32 graph in "
                        "onnxruntime (the plain interpreter needs onnxruntime)")
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    for check in (check_pretrained, check_nlu, check_nlg):
        results.update(check(args.run, args.python, args.n))
    results.update(check_plain(args.run, args.python, args.n, onnx=args.onnx))
    ok = True
    for name, r in results.items():
        good = r["agree"] == r["inputs"] and r["inputs"] > 0
        ok &= good
        extra = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("agree", "inputs"))
        print(f"{'ok  ' if good else 'FAIL'} {name}: {r['agree']}/{r['inputs']} equal to the project's own output"
              + (f" ({extra})" if extra else ""))
    print(json.dumps({"ok": ok, **results}, ensure_ascii=False))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
