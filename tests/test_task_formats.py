"""Task data in the formats of the HF ecosystem: JSON, CSV, TSV, Parquet, a local
`datasets.load_dataset` folder, a `save_to_disk` folder, and in-memory `Dataset` / `DatasetDict` objects.

Each loads to the records of the JSONL fixture, and each trains the tiny multi-task run of
`test_finetune_e2e.tiny_config` to exactly the scores of the same run on the JSONL files. Test files are
written into tmp_path (no binary fixtures in the repo)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import datasets
import pytest
from skillnet.data_prep.tasks import TaskDataError, load_task_file
from skillnet.data_prep.tasks.schema import infer_pair_kind
from skillnet.finetune import run as run_cli
from skillnet.finetune.cli import main as finetune_main
from skillnet.finetune.config import ConfigError, FinetuneConfig, TaskConfig

from tests.test_finetune_e2e import tiny_config

FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"
# task name in tiny_config -> (fixture prefix, record kind)
TASKS = {"sentiment": ("sent", "single"), "ner": ("ner", "tagging"), "qa_match": ("match", "choice")}
SPLITS = ("train", "dev", "test")
HF_SPLIT = {"train": "train", "dev": "validation", "test": "test"}


def _raw(prefix: str, split: str) -> list[dict]:
    text = (FIX / f"{prefix}_{split}.jsonl").read_text(encoding="utf-8")
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def _jsonl_records(prefix: str, split: str, kind: str) -> list[dict]:
    recs, _ = load_task_file(FIX / f"{prefix}_{split}.jsonl", kind, as_dataset=False)
    return recs


def _no_id(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "id"} for r in recs]


def _write(fmt: str, rows: list[dict], base: Path) -> str | datasets.Dataset:
    """`rows` in format `fmt` at `base` + the format's extension (or a Dataset object)."""
    ds = datasets.Dataset.from_list(rows)
    if fmt == "dataset":
        return ds
    ext = {"csv": ".csv", "tsv": ".tsv", "json": ".json", "json_lines": ".json", "parquet": ".parquet"}[fmt]
    p = base.with_suffix(ext)
    if fmt == "csv":
        ds.to_csv(str(p), index=False)
    elif fmt == "tsv":
        ds.to_csv(str(p), sep="\t", index=False)
    elif fmt == "json":  # one JSON document: a list of records
        p.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
    elif fmt == "json_lines":  # HF's to_json writes JSON lines, under a .json name
        ds.to_json(str(p), force_ascii=False)
    else:
        ds.to_parquet(str(p))
    return str(p)


LOAD_CASES = [(f, t) for f in ("json", "json_lines", "parquet", "dataset") for t in TASKS]
LOAD_CASES += [("csv", "sentiment"), ("tsv", "sentiment")]


@pytest.mark.parametrize("fmt,task", LOAD_CASES, ids=[f"{f}-{t}" for f, t in LOAD_CASES])
def test_format_loads_the_records_of_the_jsonl_fixture(tmp_path, fmt, task):
    prefix, kind = TASKS[task]
    for split in SPLITS:
        src = _write(fmt, _raw(prefix, split), tmp_path / f"{prefix}_{split}")
        got, rep = load_task_file(src, kind, as_dataset=False)
        want = _jsonl_records(prefix, split, kind)
        assert _no_id(got) == _no_id(want)
        assert rep.kept == rep.records_read == len(want)
        # no line numbers in a columnar file or an object: ids and messages count rows from 1
        assert got[0]["id"].endswith(":row 1")
    ds, _ = load_task_file(src, kind)  # as a datasets.Dataset too
    assert len(ds) == len(want)


def _task_sources(fmt: str, task: str, root: Path) -> dict:
    """Config entries that give `task`'s three splits in `fmt` (files, folders or objects)."""
    prefix, _ = TASKS[task]
    if fmt in ("csv", "tsv") and task != "sentiment":  # flat formats: only the text task (see below)
        return {s: str(FIX / f"{prefix}_{s}.jsonl") for s in SPLITS}
    if fmt == "folder":  # a load_dataset folder: HF split names, one file per split
        folder = root / f"{task}_folder"
        folder.mkdir()
        ext = "csv" if task == "sentiment" else "parquet"
        for s in SPLITS:
            _write(ext, _raw(prefix, s), folder / HF_SPLIT[s])
        return {"dataset": str(folder), "train": None, "dev": None, "test": None}
    if fmt == "dataset_dict":
        dd = datasets.DatasetDict({HF_SPLIT[s]: datasets.Dataset.from_list(_raw(prefix, s)) for s in SPLITS})
        return {"dataset": dd, "train": None, "dev": None, "test": None}
    return {s: _write(fmt, _raw(prefix, s), root / f"{prefix}_{s}") for s in SPLITS}


def _tiny(out: Path, **sources_of_task: dict) -> FinetuneConfig:
    d = tiny_config(out, train={"max_steps": 3, "batch_size": 4, "eval_batch_size": 8, "lr": 1e-3,
                                "eval_every": 0, "log_every": 3, "seed": 0, "warmup_ratio": 0.0})
    for t in d["tasks"]:
        t.update(sources_of_task.get(t["name"], {}))
    return FinetuneConfig.from_dict(d)


def _scores(results: dict) -> dict:
    return {n: (r["train_examples"], r["dev"], r["test"]) for n, r in results.items()}


@pytest.fixture(scope="module")
def jsonl_scores(tmp_path_factory):
    out = tmp_path_factory.mktemp("jsonl_run")
    return _scores(run_cli.run(_tiny(out), tensorboard=False, progress=False))


RUN_FORMATS = ["csv", "tsv", "json", "parquet", "folder", "dataset", "dataset_dict"]


@pytest.mark.parametrize("fmt", RUN_FORMATS)
@pytest.mark.slow  # measured 74 s for the 7 formats, 29 s the first (with the shared fixture)
def test_each_format_trains_the_tiny_tasks(tmp_path, fmt, jsonl_scores):
    """Same records, same seed: the run on `fmt` ends with the JSONL run's exact dev and test scores."""
    cfg = _tiny(tmp_path / "run", **{t: _task_sources(fmt, t, tmp_path) for t in TASKS})
    results = run_cli.run(cfg, tensorboard=False, progress=False)
    assert _scores(results) == jsonl_scores
    # the run's config record stays valid JSON; an in-memory dataset is described, not lost silently
    saved = json.loads((tmp_path / "run" / "finetune_config.json").read_text(encoding="utf-8"))
    if fmt == "dataset":
        assert saved["tasks"][0]["train"]["in_memory"] == "datasets.Dataset"
        assert saved["tasks"][0]["train"]["num_rows"] == len(_raw("sent", "train"))
    if fmt == "dataset_dict":
        assert saved["tasks"][0]["dataset"]["in_memory"] == "datasets.DatasetDict"


def test_in_memory_dataset_in_a_config_file_is_a_clear_error(tmp_path):
    ds = datasets.Dataset.from_list(_raw("sent", "train"))
    cfg = _tiny(tmp_path / "run", sentiment={"train": ds})
    back = json.loads(cfg.to_json())
    with pytest.raises(ConfigError, match=r"tasks\[0\]: train: .*in-memory datasets.Dataset.*to_parquet"):
        FinetuneConfig.from_dict(back)
    # to_dict keeps the object itself (apply_overrides and task_specific runs go through it)
    assert FinetuneConfig.from_dict(cfg.to_dict()).tasks[0].train is ds


def test_folder_and_dataset_dict_splits(tmp_path):
    """A folder given as one split must hold one split (or the one of that name); `dataset` maps HF split
    names (validation -> dev); a DatasetDict in a split's place is an error that says where it goes."""
    folder = tmp_path / "one"
    folder.mkdir()
    _write("parquet", _raw("sent", "dev"), folder / "whatever")
    recs, _ = load_task_file(str(folder), "single", as_dataset=False)
    assert _no_id(recs) == _no_id(_jsonl_records("sent", "dev", "single"))
    multi = tmp_path / "multi"
    multi.mkdir()
    for s in ("train", "dev"):
        _write("csv", _raw("sent", s), multi / HF_SPLIT[s])
    recs, _ = load_task_file(str(multi), "single", split="dev", as_dataset=False)
    assert _no_id(recs) == _no_id(_jsonl_records("sent", "dev", "single"))
    with pytest.raises(TaskDataError, match=r"multi:0: .*splits train, validation.*'dataset'"):
        load_task_file(str(multi), "single")
    with pytest.raises(TaskDataError, match=r"multi:0: no split 'test' .*splits train, validation"):
        load_task_file(str(multi), "single", split="test")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(_raw("sent", "train"))})
    with pytest.raises(ValueError, match=r"train: a datasets.DatasetDict holds several splits; give it as 'dataset'"):
        TaskConfig(name="a", type="classification", skills=["s1"], train=dd)
    with pytest.raises(ValueError, match=r"give either 'spec' or 'dataset'"):
        TaskConfig(name="a", type="classification", skills=["s1"], spec="x/task.json", dataset=dd)


def test_save_to_disk_folder(tmp_path):
    dd = datasets.DatasetDict({HF_SPLIT[s]: datasets.Dataset.from_list(_raw("match", s)) for s in SPLITS})
    dd.save_to_disk(str(tmp_path / "saved"))
    recs, _ = load_task_file(str(tmp_path / "saved"), "choice", split="dev", as_dataset=False)
    assert _no_id(recs) == _no_id(_jsonl_records("match", "dev", "choice"))
    dd["train"].save_to_disk(str(tmp_path / "saved_one"))
    recs, _ = load_task_file(str(tmp_path / "saved_one"), "choice", as_dataset=False)
    assert _no_id(recs) == _no_id(_jsonl_records("match", "train", "choice"))


# ------------------------------------------------------------------------------------ bad input
def test_bad_row_in_parquet_is_named_by_row(tmp_path, capsys):
    rows = _raw("sent", "train")
    rows[2] = {"text": "还行吧", "label": "neutral"}
    p = _write("parquet", rows, tmp_path / "train")
    with pytest.raises(TaskDataError) as ei:
        load_task_file(p, "single", ["neg", "pos"])
    assert str(ei.value) == (f"{p}:row 3: label 'neutral' is not in the label set ['neg', 'pos'] [single record]")
    assert ei.value.line == 3 and ei.value.unit == "row"
    recs, rep = load_task_file(p, "single", ["neg", "pos"], skip_bad=True, as_dataset=False)
    assert rep.skipped == {"label not in label set": 1} and len(recs) == len(rows) - 1
    assert rep.first_error["label not in label set"].startswith(f"{p}:row 3: ")
    # through the CLI: one error line, exit code 2; with --skip-bad the row is counted and skipped
    d = tiny_config(tmp_path / "run", train={"max_steps": 1, "batch_size": 4, "eval_every": 0})
    d["tasks"] = [dict(d["tasks"][0], train=p, labels=["neg", "pos"])]
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    assert finetune_main(["--config", str(cfg), "--no-progress", "--no-tensorboard"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"error: {p}:row 3: label 'neutral' is not in the label set ['neg', 'pos'] [single record]"
    assert "Traceback" not in err
    assert finetune_main(["--config", str(cfg), "--no-progress", "--no-tensorboard", "--skip-bad"]) == 0
    assert "skipped 1" in capsys.readouterr().err


def test_in_memory_dataset_bad_row_names_the_task_and_split(tmp_path):
    rows = _raw("sent", "train")
    rows[1] = {"text": "", "label": "pos"}
    d = tiny_config(tmp_path / "run")
    d["tasks"] = [dict(d["tasks"][0], train=datasets.Dataset.from_list(rows))]
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune.tasks import TaskData

    cfg = FinetuneConfig.from_dict(d)
    with pytest.raises(TaskDataError, match=r"^<sentiment/train: datasets.Dataset>:row 2: field 'text' is empty"):
        TaskData(cfg.tasks[0], cfg, load_tokenizer(None))


def test_csv_errors_name_the_file_line(tmp_path):
    """CSV rows map to lines (header = line 1), also when a quoted cell spans lines."""
    p = tmp_path / "train.csv"
    with open(p, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerows([["text", "label"], ["第一行\n第二行", "pos"], ["好", "pos"], ["差", "neutral"]])
    with pytest.raises(TaskDataError, match=r"train\.csv:5: label 'neutral' is not in the label set"):
        load_task_file(str(p), "single", ["neg", "pos"])
    # every value of a CSV is a string: a text that looks like a number or like NA stays text, an empty
    # cell is an empty text (an error naming the line), not a missing value
    p.write_text("text,label\n123,pos\nNA,neg\n,pos\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.csv:4: field 'text' is empty"):
        load_task_file(str(p), "single")
    recs, _ = load_task_file(str(p), "single", skip_bad=True, as_dataset=False)
    assert [r["text"] for r in recs] == ["123", "NA"]
    # a row with more fields than the header: the line, not a pandas traceback
    p.write_text("text,label\n好,pos\n差,neg,extra\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.csv:3: expected 2 fields \(as the header\), found 3"):
        load_task_file(str(p), "single")
    p.write_text("", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.csv:1: file is empty"):
        load_task_file(str(p), "single")
    p.write_text("text,label\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.csv:1: file is empty"):
        load_task_file(str(p), "single")


def test_csv_regression_labels_and_pair_inference(tmp_path):
    p = tmp_path / "sts.csv"
    p.write_text("text,text_pair,label\n我很好,我不错,4.5\n天气,吃饭,0\n", encoding="utf-8")
    recs, _ = load_task_file(str(p), "pair", regression=True, as_dataset=False)
    assert [r["label"] for r in recs] == [4.5, 0.0]
    assert infer_pair_kind(str(p)) == ("pair", f"{p}:2")
    p.write_text("text,text_pair,label\n我很好,我不错,high\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"sts\.csv:2: regression label must be a number, got string 'high'"):
        load_task_file(str(p), "pair", regression=True)
    parquet = _write("parquet", [{"text": "a", "text_pair": None, "label": "pos"},
                                 {"text": "b", "text_pair": "c", "label": "neg"}], tmp_path / "mixed")
    assert infer_pair_kind(parquet) == ("pair", f"{parquet}:row 2")


@pytest.mark.parametrize("kind", ["tagging", "span", "choice"])
def test_csv_cannot_hold_list_fields(tmp_path, kind):
    p = tmp_path / "ner.csv"
    p.write_text("tokens,labels\n\"['李', '明']\",\"['B-PER', 'I-PER']\"\n", encoding="utf-8")
    with pytest.raises(TaskDataError) as ei:
        load_task_file(str(p), kind)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:0: a CSV file holds text columns only; kind '{kind}' has list fields"), msg
    assert "use JSONL, JSON or Parquet" in msg and "\n" not in msg


def test_unknown_extension_is_one_error_listing_the_formats(tmp_path, capsys):
    p = tmp_path / "train.xlsx"
    p.write_bytes(b"PK\x03\x04 not really a spreadsheet")
    with pytest.raises(TaskDataError) as ei:
        load_task_file(str(p), "single")
    msg = str(ei.value)
    assert msg.startswith(f"{p}:0: unsupported file type '.xlsx'; supported: .jsonl, .json, .csv, .tsv, .parquet"), msg
    assert "folder" in msg and "datasets.Dataset" in msg and "\n" not in msg
    d = tiny_config(tmp_path / "run", train={"max_steps": 1, "batch_size": 4, "eval_every": 0})
    d["tasks"] = [dict(d["tasks"][0], train=str(p))]
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    assert finetune_main(["--config", str(cfg), "--no-progress", "--no-tensorboard"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: ") and "unsupported file type '.xlsx'" in err[-1]


def test_loading_script_gives_a_clear_error_on_datasets_4(tmp_path):
    script = tmp_path / "my_task.py"
    script.write_text("import datasets\n", encoding="utf-8")
    if int(datasets.__version__.split(".")[0]) < 4:
        pytest.skip("datasets < 4 still runs loading scripts")
    with pytest.raises(TaskDataError, match=rf"my_task\.py:0: .*datasets {datasets.__version__}.*no longer runs "
                                            r"loading scripts"):
        load_task_file(str(script), "single")


# ------------------------------------------------------------------------------------ column mapping
def test_column_mapping(tmp_path, capsys):
    rows = [{"sentence": r["text"], "polarity": r["label"], "text": "ignored"} for r in _raw("sent", "train")]
    p = _write("csv", rows, tmp_path / "renamed")
    recs, _ = load_task_file(p, "single", columns={"text": "sentence", "label": "polarity"}, as_dataset=False)
    assert _no_id(recs) == _no_id(_jsonl_records("sent", "train", "single"))
    # JSONL records are mapped the same way
    jl = tmp_path / "renamed.jsonl"
    jl.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    recs, _ = load_task_file(jl, "single", columns={"text": "sentence", "label": "polarity"}, as_dataset=False)
    assert _no_id(recs) == _no_id(_jsonl_records("sent", "train", "single"))
    # a mapped column the file lacks: named with the file's columns
    with pytest.raises(TaskDataError, match=r"renamed\.csv:2: missing field 'label' \(read from column 'stars' "
                                            r"by 'columns'; the file's columns: sentence, polarity, text\)"):
        load_task_file(p, "single", columns={"text": "sentence", "label": "stars"})
    # ... through the config (one mapping for all the task's splits), and it trains
    dev = _write("parquet", [{"sentence": r["text"], "polarity": r["label"]} for r in _raw("sent", "dev")],
                 tmp_path / "renamed_dev")
    cfg = _tiny(tmp_path / "run", sentiment={"train": p, "dev": dev, "test": None,
                                             "columns": {"text": "sentence", "label": "polarity"}})
    assert cfg.tasks[0].columns == {"text": "sentence", "label": "polarity"}
    results = run_cli.run(cfg, tensorboard=False, progress=False)
    assert results["sentiment"]["train_examples"] == len(rows)
    # a mapping to a field the task type does not have is a config error naming the key
    d = tiny_config(tmp_path / "run2")
    d["tasks"][0]["columns"] = {"txt": "sentence"}
    with pytest.raises(ConfigError, match=r"tasks\[0\]: columns: unknown field 'txt' for a classification task; "
                                          r"fields: id, label, text, text_pair"):
        FinetuneConfig.from_dict(d)
    cfg_file = tmp_path / "cfg.json"
    cfg_file.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    capsys.readouterr()
    assert finetune_main(["--config", str(cfg_file), "--no-progress", "--no-tensorboard"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {cfg_file}: tasks[0]: columns: unknown field 'txt'")
    d["tasks"][0]["columns"] = {"text": ["sentence"]}
    with pytest.raises(ConfigError, match=r"tasks\[0\]: columns: 'text' must map to a column name"):
        FinetuneConfig.from_dict(d)


def test_class_label_features_become_label_names(tmp_path):
    """HF datasets store classes as ClassLabel ints (and NER tags as a sequence of them): the loader reads
    the names, and the label list is the feature's, in its order, even for classes train lacks."""
    feats = datasets.Features({"sentence": datasets.Value("string"),
                               "polarity": datasets.ClassLabel(names=["pos", "neg", "neutral"])})
    ds = datasets.Dataset.from_dict({"sentence": ["好", "差", "好吧"], "polarity": [0, 1, 0]}, features=feats)
    recs, rep = load_task_file(ds, "single", columns={"text": "sentence", "label": "polarity"}, as_dataset=False)
    assert [r["label"] for r in recs] == ["pos", "neg", "pos"] and rep.label_list == ["pos", "neg", "neutral"]
    assert [r["label_id"] for r in recs] == [0, 1, 0]
    tags = datasets.ClassLabel(names=["O", "B-PER", "I-PER"])
    ner = datasets.Dataset.from_dict({"tokens": [["李", "明", "说"]], "ner_tags": [[1, 2, 0]]},
                                     features=datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                                                 "ner_tags": datasets.Sequence(tags)}))
    recs, rep = load_task_file(ner, "tagging", columns={"labels": "ner_tags"}, as_dataset=False)
    assert recs[0]["labels"] == ["B-PER", "I-PER", "O"] and rep.label_list == ["O", "B-PER", "I-PER"]


def test_squad_style_answers_are_accepted(tmp_path):
    """HF's SQuAD/CMRC layout (answers = {text: [...], answer_start: [...]}) reads as the schema's list."""
    ds = datasets.Dataset.from_list([{"context": "长城东起山海关。", "question": "长城东起哪里？",
                                      "answers": {"text": ["山海关"], "answer_start": [4]}}])
    recs, _ = load_task_file(ds, "span", as_dataset=False)
    assert recs[0]["answers"] == [{"text": "山海关", "start": 4}]
    bad = datasets.Dataset.from_list([{"context": "长城东起山海关。", "question": "长城东起哪里？",
                                       "answers": {"text": ["山海关"], "answer_start": [2]}}])
    with pytest.raises(TaskDataError, match=r"row 1: answers\[0\] '山海关' is not at character offset 2"):
        load_task_file(bad, "span")


def test_json_errors_name_the_line(tmp_path):
    """JSON lines under a .json name map rows to lines; a syntax error is found where it is, in both forms."""
    p = tmp_path / "train.json"
    p.write_text('{"text": "好", "label": "pos"}\n\n{"text": "差", "label": "neutral"}\n', encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.json:3: label 'neutral' is not in the label set"):
        load_task_file(str(p), "single", ["neg", "pos"])
    p.write_text('{"text": "好", "label": "pos"}\n{"text": "差", "label": \n', encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.json:2: invalid JSON: Expecting value at column 24"):
        load_task_file(str(p), "single")
    p.write_text('[\n {"text": "好", "label": "pos"},\n {"text": "差" "label": "neg"}\n]\n', encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.json:3: invalid JSON: Expecting ',' delimiter"):
        load_task_file(str(p), "single")
    p.write_text('[\n {"text": "好", "label": "pos"},\n {"text": "", "label": "neg"}\n]\n', encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.json:row 2: field 'text' is empty"):  # a document has rows
        load_task_file(str(p), "single")
    p.write_text('["好", "差"]', encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.json:1: expected a JSON array of objects"):
        load_task_file(str(p), "single")
    p.write_text(" \n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"train\.json:1: file is empty"):
        load_task_file(str(p), "single")


def test_invalid_utf8_and_tsv_quotes(tmp_path):
    p = tmp_path / "train.csv"
    p.write_bytes("text,label\n好,pos\n".encode() + "caf\xe9,pos\n".encode("latin-1"))
    with pytest.raises(TaskDataError, match=r"train\.csv:3: invalid UTF-8 at byte 3 of the line"):
        load_task_file(str(p), "single")
    # TSV: no quoting, so a quote character is text (CLUE/GLUE TSV files have unbalanced quotes)
    t = tmp_path / "train.tsv"
    t.write_text('text\tlabel\n他说"好\tpos\n"引号"\tneg\n', encoding="utf-8")
    recs, _ = load_task_file(str(t), "single", as_dataset=False)
    assert [r["text"] for r in recs] == ['他说"好', '"引号"']


def test_streaming_dataset_is_refused_clearly():
    ds = datasets.Dataset.from_list(_raw("sent", "train")).to_iterable_dataset()
    with pytest.raises(TaskDataError, match=r"<datasets.Dataset>:0: an IterableDataset \(streaming\) is not supported"):
        load_task_file(ds, "single")
