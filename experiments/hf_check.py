"""Do a reproduction's exports work in plain transformers? Each check loads an export in a subprocess that
cannot import this project (its import path and import hooks removed, which the subprocess asserts) and
compares what a `pipeline(...)` or Auto class returns with the project's own prediction on the same inputs:

- the sparsely pre-trained BERT: fill-mask (top token at every masked position of corpus sentences) and
  feature-extraction (hidden states) without `task=`;
- the first seed's SkillNet-NLU export: text-classification on the sentiment test texts, and, re-exported
  with `export --task ner`, token-classification entities on the NER test sentences;
- the first seed's SkillNet-NLG export: text2text-generation on its default task's test sources;
- the same exports' tasks written with ``export --plain`` (stock transformers classes, no remote code): the
  stock text-classification pipeline on sentiment and domain, and the card's generation lines on the NLG
  default task.

    python -m skillnet.experiments.hf_check runs/reproduce-quick [--python /path/to/plain/venv/bin/python]

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
folder, inputs = sys.argv[1], json.load(open(sys.argv[2], encoding="utf-8"))
res = {}
"""


def run_plain(python: str, folder: Path, inputs: Any, body: str) -> Any:
    """Run `body` in a fresh interpreter that cannot import the project; returns its `res`."""
    hide = str(Path(__file__).resolve().parents[1])
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "in.json").write_text(json.dumps(inputs, ensure_ascii=False), encoding="utf-8")
        script = Path(tmp) / "plain.py"
        script.write_text(f"HIDE = {hide!r}\n{_PRELUDE}{body}\njson.dump(res, sys.stdout, ensure_ascii=False)\n",
                          encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": "", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        # The interpreter runs in tmp: a relative folder would read as a hub repo id there.
        r = subprocess.run([python, str(script), str(Path(folder).resolve()), str(Path(tmp) / "in.json")], cwd=tmp,
                           capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"plain transformers on {folder}: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout)


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


def check_plain(run: Path, python: str, n: int) -> dict[str, Any]:
    """The first seed's tasks exported with ``export --plain`` (stock classes, no remote code): the stock
    text-classification pipeline on the classification tasks, and the card's generation lines on the NLG
    task, against the project's own predictions from the sparse export."""
    from skillnet.finetune.predict import Predictor
    from skillnet.pretrain.export import main as export_main

    nlu = run / "compare" / "nlu_main" / "skillnet" / "seed0" / "export"
    nlg = run / "compare" / "nlg_main" / "skillnet" / "seed0" / "export"
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in ("sentiment", "domain"):
            if not (run / "tasks" / task / "test.jsonl").is_file():
                continue
            here = Path(tmp) / task
            if export_main(["--plain", "--checkpoint", str(nlu), "--out", str(here), "--task", task]) != 0:
                raise RuntimeError(f"export --plain --task {task} failed for {nlu}")
            texts = [r["text"] for r in _jsonl(run / "tasks" / task / "test.jsonl", 4 * n) if len(r["text"]) <= 60][:n]
            want = Predictor(nlu).predict(task, [{"text": t} for t in texts])
            got = run_plain(python, here, texts, r"""
clf = pipeline("text-classification", model=folder, truncation=True)  # stock class: no trust_remote_code
res["out"] = [r["label"] for r in clf(inputs)]
""")["out"]
            out[f"plain {task} (text-classification)"] = {
                "task": task, "inputs": len(want), "agree": sum(a == b for a, b in zip(got, want)),
                "distinct_outputs": len(set(got))}
        task = json.loads((nlg / "config.json").read_text(encoding="utf-8"))["default_task"]
        here = Path(tmp) / task
        if export_main(["--plain", "--checkpoint", str(nlg), "--out", str(here), "--task", task]) != 0:
            raise RuntimeError(f"export --plain --task {task} failed for {nlg}")
        prefix = json.loads((here / "plain_export.json").read_text(encoding="utf-8")).get("prefix", "")
        srcs = [r["source"] for r in _jsonl(run / "tasks" / task / "test.jsonl", n)]
        want = Predictor(nlg).predict(task, [{"source": s} for s in srcs])
        got = run_plain(python, here, [prefix + s for s in srcs], r"""
from transformers import AutoModelForSeq2SeqLM
tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
res["out"] = []
for s in inputs:
    ids = model.generate(**tok(s, return_tensors="pt"))[0]
    res["out"].append("".join(t.removeprefix("##") for t in tok.convert_ids_to_tokens(ids, skip_special_tokens=True)))
""")["out"]
        # The card's lines join word pieces without the space the project puts between two Latin words.
        same = sum("".join(a.split()) == "".join(b.split()) for a, b in zip(got, want))
        out[f"plain {task} (generate)"] = {"task": task, "inputs": len(srcs), "agree": same,
                                          "distinct_outputs": len(set(got))}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a reproduction's output folder (e.g. runs/reproduce-quick)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter of the plain side, e.g. a venv with only torch, transformers and "
                        "safetensors (default: this one, with the project hidden)")
    p.add_argument("--n", type=int, default=20, help="inputs per check (default: 20)")
    args = p.parse_args(argv)
    results: dict[str, Any] = {}
    for check in (check_pretrained, check_nlu, check_nlg, check_plain):
        results.update(check(args.run, args.python, args.n))
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
