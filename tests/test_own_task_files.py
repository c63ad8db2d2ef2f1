"""A user's own task files after fine-tuning (issue 50, items 1, 2 and 9): split paths relative to the config
file and records in the task's own format (its `columns`) are read by the plain export and by `predict` as
fine-tuning read them, wherever the command runs from.

* ``export --plain`` measures on the run's test split (not on fixed sentences), says how many of its records
  it measured and why fewer, and warns when it falls back to fixed sentences;
* ``--test FILE`` reads a file of the task's own format; a bad record names the file, the line and `columns`;
* ``predict`` on a one-task model labels a record without a ``task`` field, in the task's own format;
* the same for a generation (BART) task whose `columns` map ``source``/``target``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.finetune import predict as predict_cli
from skillnet.finetune import run as run_cli
from skillnet.finetune.config import FinetuneConfig
from skillnet.pretrain.export import main as export_main

FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"


def _own_format(src: str, mapping: dict[str, str]) -> list[dict]:
    """The fixture's records with each schema field renamed to the user's column (`mapping`: field -> column)."""
    rows = [json.loads(x) for x in (FIX / src).read_text(encoding="utf-8").splitlines() if x.strip()]
    return [{mapping.get(k, k): v for k, v in r.items()} for r in rows]


def _write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _one_task_run(tmp: Path, task: dict, files: dict[str, list[dict]], **top) -> Path:
    """A one-task fine-tuning run (1 step) from the config file ``tmp/proj/config.json``, whose split paths
    are relative to that file (docs/finetune.md); returns the run's folder."""
    proj = tmp / "proj"
    for split, rows in files.items():
        _write(proj / "clue" / f"{split}.json", rows)
        task[split] = f"clue/{split}.json"
    d = {"tasks": [task], "model": {"preset": "tiny"},
         "train": {"max_steps": 1, "batch_size": 4, "eval_batch_size": 8, "eval_every": 0, "log_every": 1,
                   "lr": 1e-3, "seed": 0, "warmup_ratio": 0.0},
         "output_dir": str(tmp / "runs" / "ft"), **top}
    (proj / "config.json").write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    run_cli.run(FinetuneConfig.load(proj / "config.json"), tensorboard=False, progress=False)
    return tmp / "runs" / "ft"


SENT_COLUMNS = {"text": "sentence", "label": "label_desc"}


@pytest.fixture(scope="module")
def senti(tmp_path_factory) -> Path:
    """A classification task read through `columns` (CLUE-style ``sentence``/``label_desc``)."""
    files = {s: _own_format(f"sent_{s}.jsonl", SENT_COLUMNS) for s in ("train", "dev")}
    files["test"] = _own_format("sent_train.jsonl", SENT_COLUMNS)[:10]  # 10 records: more than the 4 of dev
    return _one_task_run(tmp_path_factory.mktemp("senti"), {"name": "senti", "type": "classification",
                                                            "skills": ["s1", "s4", "s7"], "columns": SENT_COLUMNS,
                                                            "max_seq_len": 32}, files)


def test_plain_export_measures_on_the_config_relative_test_split(senti, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # another folder than the config's, as a user runs it
    assert export_main(["--plain", "--checkpoint", str(senti / "export"), "--task", "senti", "--out", "P"]) == 0
    facts = json.loads((tmp_path / "P" / "plain_export.json").read_text(encoding="utf-8"))
    assert facts["measured_on"] == "test.json"
    assert facts["records"]["in_file"] == 10 and facts["equality"]["compared"] == 10
    assert "warning" not in capsys.readouterr().err
    card = (tmp_path / "P" / "README.md").read_text(encoding="utf-8")
    assert "10 records of test.json" in card
    # the run's config record, read again from here, finds the same data (it records its base_dir)
    again = FinetuneConfig.load(senti / "finetune_config.json")
    assert Path(again.resolve(again.tasks[0].test)) == senti.parent.parent / "proj" / "clue" / "test.json"


def test_plain_export_reads_the_tasks_own_format_from_test(senti, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(senti.parent.parent / "proj")
    assert export_main(["--plain", "--checkpoint", str(senti / "export"), "--task", "senti", "--out",
                        str(tmp_path / "P"), "--test", "clue/dev.json"]) == 0
    facts = json.loads((tmp_path / "P" / "plain_export.json").read_text(encoding="utf-8"))
    assert facts["measured_on"] == "dev.json" and facts["equality"]["compared"] == 4
    bad = tmp_path / "bad.json"
    _write(bad, [{"sentence": "很好", "label_desc": "pos"}, {"text": "很差"}])  # line 2: schema name, not the column
    capsys.readouterr()
    assert export_main(["--plain", "--checkpoint", str(senti / "export"), "--task", "senti", "--out",
                        str(tmp_path / "Q"), "--test", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{bad}:2: missing field 'text'" in err and "'columns'" in err
    assert not (tmp_path / "Q").exists()


def test_plain_export_says_why_it_measures_fewer_records(senti, tmp_path, monkeypatch, capsys):
    """A file longer than the check's cap: the export measures its first records and says so, on stderr and in
    plain_export.json; with no task data it warns that fixed sentences were used, and why."""
    from skillnet.export import plain

    monkeypatch.setattr(plain, "_PROBE_RECORDS", 6)
    assert export_main(["--plain", "--checkpoint", str(senti / "export"), "--task", "senti", "--out",
                        str(tmp_path / "P")]) == 0
    facts = json.loads((tmp_path / "P" / "plain_export.json").read_text(encoding="utf-8"))
    assert facts["equality"]["compared"] == 6 and facts["records"]["in_file"] == 10
    assert "first 6 of the 10 records" in facts["records"]["note"] and "cap" in facts["records"]["note"]
    assert "first 6 of the 10 records" in capsys.readouterr().err
    moved = tmp_path / "moved"  # the export without its run: nothing to measure on
    import shutil

    shutil.copytree(senti / "export", moved)
    assert export_main(["--plain", "--checkpoint", str(moved), "--task", "senti", "--out", str(tmp_path / "F")]) == 0
    err = capsys.readouterr().err
    facts = json.loads((tmp_path / "F" / "plain_export.json").read_text(encoding="utf-8"))
    assert facts["measured_on"] == "fixed sentences" and "warning:" in err and "fixed sentences" in err
    assert "finetune_config.json" in err and "--test" in err and facts["records"]["note"] in err
    assert "**Not measured on task data**" in (tmp_path / "F" / "README.md").read_text(encoding="utf-8")


def test_predict_one_task_without_task_field_in_its_own_format(senti, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, [{"sentence": "很好"}, {"sentence": "服务差", "label_desc": "neg"}])
    assert predict_cli.main(["--model", str(senti / "export"), "--input", str(inp), "--output", str(out),
                             "--no-progress"]) == 0
    got = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert [g["task"] for g in got] == ["senti", "senti"] and got[0]["sentence"] == "很好"
    assert all(g["prediction"] in ("neg", "pos") for g in got)
    assert "task 'senti'" in capsys.readouterr().err  # says which task the records without one got
    _write(inp, [{"sentence": "很好"}, {"content": "很差"}])
    assert predict_cli.main(["--model", str(senti / "export"), "--input", str(inp), "--output", str(out),
                             "--no-progress", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert f"{inp}:2: missing field 'text'" in err and "'columns'" in err


GEN_COLUMNS = {"source": "content", "target": "title"}


@pytest.fixture(scope="module")
def lcsts(tmp_path_factory) -> Path:
    """A generation task (SkillNet-BART) read through `columns` (LCSTS-style ``content``/``title``)."""
    files = {"train": _own_format("gen_qa_train.jsonl", GEN_COLUMNS),
             "dev": _own_format("gen_qa_dev.jsonl", GEN_COLUMNS)}
    return _one_task_run(tmp_path_factory.mktemp("lcsts"), {"name": "summ", "type": "generation",
                                                            "skills": ["open_end", "general"], "columns": GEN_COLUMNS,
                                                            "max_seq_len": 32, "max_target_len": 16,
                                                            "num_beams": 2}, files)


def test_generation_predict_and_export_test_read_columns(lcsts, tmp_path, capsys):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, _own_format("gen_qa_dev.jsonl", GEN_COLUMNS))
    assert predict_cli.main(["--model", str(lcsts / "export"), "--input", str(inp), "--output", str(out),
                             "--no-progress"]) == 0
    got = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert len(got) == 3 and all(isinstance(g["prediction"], str) and g["task"] == "summ" for g in got)
    assert export_main(["--plain", "--checkpoint", str(lcsts / "export"), "--task", "summ", "--out",
                        str(tmp_path / "P"), "--test", str(inp)]) == 0
    facts = json.loads((tmp_path / "P" / "plain_export.json").read_text(encoding="utf-8"))
    assert facts["measured_on"] == "in.jsonl" and facts["equality"]["inputs"] == 3
    assert facts["records"]["in_file"] == 3 and "warning" not in capsys.readouterr().err


def test_a_generation_export_says_why_it_beam_searches_fewer_records():
    """The trial's case: 50 records given, beam equality on 16 of them; the note says it is the cap, and that
    the ONNX checks use all 50."""
    from skillnet.export.plain import _BEAM_RECORDS, _records_note

    recs = [{"source": str(i)} for i in range(50)]
    r = _records_note(recs, "lcsts_test.jsonl", "--test", bart=True, crf=False, onnx=True)
    assert r["in_file"] == 50 and r["equality"] == _BEAM_RECORDS == 16 and not r["fallback"]
    assert "first 16 of the 50 records of lcsts_test.jsonl" in r["note"] and "beam-searched by both models" in r["note"]
    assert "the ONNX checks use all 50" in r["note"]
