"""Span serving equals ``predict`` (issue 57): a user's own span file (own column names, contexts longer than the
task's ``max_seq_len`` and some longer than the model's 512 positions) is fine-tuned, then answered by
``predict``, by the HF export, by the plain folder and by its ONNX graph, each used as its card says, and every
answer is the same. model/span_qa.py's windows and span choice are also checked by hand."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

# the tests on `run`: a fine-tuning run, predict, an HF and a plain export with ONNX graphs (~80 s)
slow = pytest.mark.slow

SENTS = ["北京是中国的首都，位于华北平原。", "上海位于长江入海口，是经济中心。", "张三在清华大学读书，专业是物理。",
         "李四在深圳的人民日报工作。", "今天天气很好，我们去公园散步。", "这家酒店的服务很好，价格也便宜。",
         "保险合同在签字后第二天生效。", "年金一般在退休后按月领取。"]


def _records(n: int, seed: int) -> list[dict]:
    """Own columns (passage, query, golds); every third context over 32 tokens, every fifth over 512."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        reps = 45 if i % 5 == 0 else 4 if i % 3 == 0 else 1
        ctx = "".join(SENTS[int(j)] for j in rng.integers(0, len(SENTS), reps))
        k = int(rng.integers(0, len(ctx) - 4))
        out.append({"id": f"q{seed}-{i}", "passage": ctx, "query": f"第{i}个问题是什么？",
                    "golds": [{"text": ctx[k:k + 3], "start": k}]})
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    from skillnet.finetune import run as run_cli
    from skillnet.finetune.config import FinetuneConfig

    tmp = tmp_path_factory.mktemp("span_serving")
    files = {}
    for split, n, seed in (("train", 24, 0), ("dev", 8, 1), ("test", 20, 2)):
        files[split] = tmp / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in _records(n, seed)),
                                encoding="utf-8")
    d = {"tasks": [{"name": "mrc", "type": "span", "skills": ["s2", "s3", "s5", "s7"], "max_seq_len": 32,
                    "columns": {"context": "passage", "question": "query", "answers": "golds"},
                    "head": {"max_answer_len": 8}, "doc_stride": 6, **{k: str(v) for k, v in files.items()}}],
         "train": {"max_steps": 4, "batch_size": 4, "eval_batch_size": 8, "lr": 1e-3, "eval_every": 4,
                   "log_every": 4, "seed": 0, "warmup_ratio": 0.0},
         "output_dir": str(tmp / "run")}
    run_cli.run(FinetuneConfig.from_dict(d), tensorboard=False, progress=False)
    from skillnet.finetune.predict import main as predict_main

    pred_file = tmp / "pred.jsonl"
    assert predict_main(["--model", str(tmp / "run" / "export"), "--input", str(files["test"]),
                         "--output", str(pred_file)]) == 0
    preds = [json.loads(x)["prediction"] for x in pred_file.read_text(encoding="utf-8").splitlines()]
    from skillnet.pretrain.export import main as export_main

    assert export_main(["--plain", "--onnx", "--checkpoint", str(tmp / "run" / "export"), "--task", "mrc",
                        "--out", str(tmp / "plain")]) == 0
    recs = [json.loads(x) for x in files["test"].read_text(encoding="utf-8").splitlines()]
    return {"hf": tmp / "run" / "export", "plain": tmp / "plain", "recs": recs, "preds": preds}


def _blocks(card: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card, re.S)


def _answers(code: str, folder: Path, recs: list[dict]) -> list[str]:
    """The card's lines as written (the folder's path filled in, its example question left out), then `qa` on
    every record."""
    code = code.replace('"path/to/this/folder"', repr(str(folder))).replace("path/to/this/folder", str(folder))
    lines = [x for x in code.splitlines() if not x.startswith("print(")]
    ns: dict = {"folder": str(folder)}
    exec("\n".join(lines), ns)
    return ns["qa"]([r["query"] for r in recs], [r["passage"] for r in recs])


@slow
def test_the_records_are_long(run) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(run["plain"]))
    n = [len(tok(r["passage"], add_special_tokens=False, verbose=False)["input_ids"]) for r in run["recs"]]
    assert sum(x > 32 for x in n) >= 8 and sum(x > 512 for x in n) >= 3
    # predict's answers come from later windows too (one window of 32 tokens holds ~20 characters of context)
    assert sum(bool(p) for p in run["preds"]) >= len(n) // 2
    assert any(p and r["passage"].find(p) > 40 for p, r in zip(run["preds"], run["recs"]))


@slow
def test_plain_folder_and_its_onnx_graph_answer_as_predict(run) -> None:
    card = (run["plain"] / "README.md").read_text(encoding="utf-8")
    onnx_code = re.search(r"## ONNX.*?```python\n(.*?)```", card, re.S).group(1)
    use_code = re.search(r"## Use.*?```python\n(.*?)```", card, re.S).group(1)
    assert _answers(use_code, run["plain"], run["recs"]) == run["preds"]
    assert _answers(onnx_code, run["plain"], run["recs"]) == run["preds"]
    facts = json.loads((run["plain"] / "plain_export.json").read_text(encoding="utf-8"))
    assert facts["span"] == {"max_seq_len": 32, "max_question_len": 10, "doc_stride": 6, "max_answer_len": 8}
    assert "`doc_stride`" in card and "at most 8 tokens" in card


@slow
def test_hf_export_answers_as_predict(run) -> None:
    card = (run["hf"] / "README.md").read_text(encoding="utf-8")
    code = _blocks(card.split("## Use", 1)[1])[0]
    assert "trust_remote_code=True" in code
    assert _answers(code, run["hf"], run["recs"]) == run["preds"]
    meta = json.loads((run["hf"] / "finetune_tasks.json").read_text(encoding="utf-8"))["tasks"]["mrc"]
    assert meta["span"]["doc_stride"] == 6 and meta["span"]["max_answer_len"] == 8
    # the card's scores are export/'s own: the test F1 of predict's answers with these weights
    from skillnet.finetune.metrics import cmrc2018_em_f1

    r = json.loads((run["hf"].parent / "results.json").read_text(encoding="utf-8"))["tasks"]["mrc"]
    own = r["final"]["test"] if r["checkpoint"] != "final" else r["test"]
    f1 = cmrc2018_em_f1([[a["text"] for a in x["golds"]] for x in run["recs"]], run["preds"])["f1"]
    assert abs(own["f1"] - f1) < 1e-9
    assert f"| {f1:.4f} | final (step 4) |" in card


def test_windows_cover_the_context_with_the_stride() -> None:
    from skillnet.model.span_qa import question_budget, windows

    # 32-token rows, a 5-piece question: 24-piece windows; default stride 12, the last one reaching the end
    assert windows(5, 50, 32, None) == [(0, 24), (12, 36), (24, 48), (36, 50)]
    assert windows(5, 50, 32, 20) == [(0, 24), (20, 44), (40, 50)]
    assert windows(5, 50, 32, 99) == [(0, 24), (24, 48), (48, 50)]  # a stride is at most the window: no gap
    assert windows(5, 10, 32, None) == [(0, 10)]
    assert question_budget(32, None) == 10 and question_budget(32, 4) == 4


def test_best_span_by_hand() -> None:
    from skillnet.model.span_qa import best_span

    s = np.array([0.0, 3.0, 1.0, 2.0], np.float32)
    e = np.array([5.0, 0.0, 4.0, 1.0], np.float32)
    # start 1 (3.0) with end 2 (4.0) is the best pair with start <= end; with a cap of 1 token it is (0, 0)
    _, a, b = best_span(s, e, 8)
    assert (a, b) == (1, 2)
    _, a, b = best_span(s, e, 1)
    assert (a, b) == (0, 0)
    score, _, _ = best_span(s, e, 8)
    ls = s - np.log(np.exp(s).sum())
    le = e - np.log(np.exp(e).sum())
    assert abs(score - (ls[1] + le[2])) < 1e-5


def test_span_settings_are_checked() -> None:
    from skillnet.finetune.task_config import TaskConfig

    with pytest.raises(ValueError, match="doc_stride must be an integer >= 1"):
        TaskConfig(name="m", type="span", skills=["s7"], train="x.jsonl", doc_stride=0)
    with pytest.raises(ValueError, match="max_question_len=40 leaves no context"):
        TaskConfig(name="m", type="span", skills=["s7"], train="x.jsonl", max_seq_len=32, max_question_len=40)


def test_export_and_best_cards_show_their_own_weights(tmp_path) -> None:
    """export/ holds the last step (300), best/ the mean-dev checkpoint (step 100): each card shows its own
    weights' scores and step (both showed best's, labelled for both), and a task given by a spec names it."""
    from skillnet.export.card import CARD_FACTS, refresh_model_cards

    facts = {"model_type": "skillnet-bert", "architecture": "SkillNetBertForMultiTask", "default_task": "mrc",
             "tasks": {"mrc": {"skills": ["s2", "s7"], "type": "span"}}, "params": {"total": 1000},
             "training": {"stage": "fine-tuning", "method": "skillnet", "max_steps": 300, "seed": 0,
                          "data": {"mrc": {"spec": "task.json"}}}}
    for d in ("export", "best"):
        (tmp_path / d).mkdir()
        (tmp_path / d / CARD_FACTS).write_text(json.dumps(facts))
    r = {"type": "span", "metric": "f1", "checkpoint": "best (mean dev)", "best_step": 100,
         "dev": {"f1": 7.5}, "test": {"f1": 5.15}, "final": {"dev": {"f1": 6.25}, "test": {"f1": 6.84}}}
    (tmp_path / "results.json").write_text(json.dumps({"steps": 300, "tasks": {"mrc": r}}))
    refresh_model_cards(tmp_path)
    export_card = (tmp_path / "export" / "README.md").read_text(encoding="utf-8")
    best_card = (tmp_path / "best" / "README.md").read_text(encoding="utf-8")
    assert "| `mrc` | f1 | 6.2500 | 6.8400 | final (step 300) |" in export_card and "5.15" not in export_card
    assert "`best/` (step 100)" in export_card and "300 steps" in export_card
    assert "| `mrc` | f1 | 7.5000 | 5.1500 | best (mean dev) (step 100) |" in best_card and "6.84" not in best_card
    assert "100 steps" in best_card
    assert "- `mrc`: spec `task.json`" in export_card


def _doc_block(doc: str, after: str) -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / doc).read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text[text.index(after):], re.S).group(1)


@slow
def test_the_docs_lines_answer_as_predict(run) -> None:
    """docs/hf.md's and docs/deploy.md's span lines, as written (their folder names replaced by the test's)."""
    want = run["preds"]
    qs, cs = [r["query"] for r in run["recs"]], [r["passage"] for r in run["recs"]]
    code = _doc_block("hf.md", "### Span extraction beyond one window").replace("deploy/mrc", str(run["plain"]))
    torch_part, onnx_part = code.split("import onnxruntime as ort")
    for part in (torch_part, torch_part + "import onnxruntime as ort" + onnx_part):
        ns: dict = {}
        exec(part, ns)
        assert ns["qa"](qs, cs) == want
    ns = {}
    exec(_doc_block("deploy.md", "A span task's folder").replace("deploy/mrc", str(run["plain"])), ns)
    assert ns["qa"](qs, cs) == want
    ns = {"p": str(run["hf"])}
    exec("from transformers import AutoModelForQuestionAnswering\n"
         + "\n".join(x.strip() for x in _doc_block("hf.md", "**Span extraction (MRC)**").splitlines()), ns)
    assert ns["qa"](qs, cs) == want


def test_nested_squad_json_is_refused_with_the_converters_command(tmp_path) -> None:
    """The official CMRC 2018 / SQuAD layout given as a span task's file: one line that says to convert it (it
    failed on record 1 with "missing field 'context'"), and the converter keeps the dataset's ids."""
    from skillnet.data_prep.tasks import convert_squad
    from skillnet.data_prep.tasks.loading import load_task_file  # fine-tuning's and predict's reader
    from skillnet.data_prep.tasks.schema import TaskDataError

    nested = {"version": "v1.0", "data": [{"paragraphs": [{"id": "T_0", "context": "北京是中国的首都。", "qas": [
        {"id": "test-0", "question": "中国的首都是哪里？", "answers": [{"text": "北京", "answer_start": 0}]}]}]}]}
    f = tmp_path / "cmrc2018_train.json"
    f.write_text(json.dumps(nested, ensure_ascii=False, indent=2), encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"cmrc2018_train\.json:1: SQuAD / CMRC 2018 JSON .*convert cmrc2018 "
                                            r"--input train=cmrc2018_train\.json --out DIR"):
        load_task_file(f, "span")
    conv = convert_squad({"test": f})
    assert [r["id"] for r in conv.splits["test"]] == ["test-0"]  # not "test-test-0"


def test_convert_cmrc2018_says_windows_not_cut(tmp_path, capsys) -> None:
    """A span conversion does not warn that long contexts "would be cut": it says how many examples span several
    windows and how many answers lie in none (here: an answer of 40 characters, longer than any 32-token window)."""
    from skillnet.data_prep.tasks.__main__ import main

    long_ctx = "北京是中国的首都，位于华北平原。" * 6
    qas = [{"id": "a1", "question": "首都？", "answers": [{"text": "北京", "answer_start": 0}]},
           {"id": "a2", "question": "哪里？", "answers": [{"text": long_ctx[:40], "answer_start": 0}]}]
    nested = {"data": [{"paragraphs": [{"context": long_ctx, "qas": qas},
                                       {"context": "上海位于长江入海口。", "qas": [
                                           {"id": "a3", "question": "上海？", "answers": [{"text": "上海", "answer_start": 0}]}]}]}]}
    f = tmp_path / "train.json"
    f.write_text(json.dumps(nested, ensure_ascii=False), encoding="utf-8")
    assert main(["convert", "cmrc2018", "--input", f"train={f}", "--out", str(tmp_path / "out"), "--ratios", "1,0,0",
                 "--max-seq-len", "32"]) == 0
    err = capsys.readouterr().err
    assert "would be cut" not in err
    assert ("warning: cmrc2018: span contexts are read in windows of max_seq_len 32 tokens, not cut: "
            "train 2 of 3 in several windows, 1 answers in none") in err
    ids = [json.loads(x)["id"] for x in (tmp_path / "out" / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sorted(ids) == ["a1", "a2", "a3"]


def test_the_plan_counts_windows_and_lost_answers(tmp_path) -> None:
    """The start-up plan's span line: examples in several windows, answers in no window (by hand: a 48-piece
    context in 32-token rows spans 3 windows; a 40-piece answer fits none), and the doc_stride / question cut
    change the windows as documented."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune.config import FinetuneConfig
    from skillnet.finetune.tasks import TaskData

    ctx = "北京是中国的首都，位于华北平原。" * 3
    rows = [{"context": ctx, "question": "首都？", "answers": [{"text": "北京", "start": 0}]},
            {"context": ctx, "question": "哪里？", "answers": [{"text": ctx[:40], "start": 0}]},
            {"context": "上海位于长江入海口。", "question": "上海？", "answers": [{"text": "上海", "start": 0}]}]
    f = tmp_path / "train.jsonl"
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    cfg = FinetuneConfig.from_dict({"tasks": [{"name": "mrc", "type": "span", "skills": ["s7"], "train": str(f),
                                               "max_seq_len": 32, "doc_stride": 8}]})
    d = TaskData(cfg.tasks[0], cfg, load_tokenizer(None))
    d.features("train")
    assert d.codec.plan_lines(d) == [
        "  mrc/train: contexts read in windows of 32 tokens (question <= 10, stride 8): 2 of 3 examples span "
        "several windows; 1 answers lie whole in no window (skipped in training)"]
    assert d.skipped_windows == 1
    # 48 context pieces, a 3-piece question: windows of 26 pieces, 8 apart -> starts 0, 8, 16, 24
    assert len(d.encode_records([{"context": ctx, "question": "首都？", "answers": []}])) == 4


def test_predict_suggests_the_task_whose_columns_read_the_file(tmp_path) -> None:
    """A file in another task's format, given without "task" fields to a model whose default task reads other
    columns, is refused with the task that reads it."""
    from types import SimpleNamespace

    from skillnet.data_prep.tasks.schema import TaskDataError, check_record, map_columns
    from skillnet.finetune.predict import predict_file

    def task(name: str, columns: dict) -> SimpleNamespace:
        return SimpleNamespace(name=name, cfg=SimpleNamespace(columns=columns), codec=SimpleNamespace(kinds=("single",)))

    tasks = {"senti": task("senti", {"text": "review"}), "topic": task("topic", {"text": "headline"})}

    def check(obj: dict, t: str) -> dict:
        return check_record(map_columns(obj, tasks[t].cfg.columns), "single", label_list=None, require_labels=False)

    pred = SimpleNamespace(tasks=tasks, default_task=("senti", "the default task"), check=check)
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"headline": "股市大涨"}, ensure_ascii=False) + "\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"in\.jsonl:1: .*it reads as a record of task 'topic': pass --task topic"):
        predict_file(pred, str(f), str(tmp_path / "out.jsonl"), progress=False)
