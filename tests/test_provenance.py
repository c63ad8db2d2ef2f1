"""Committed parts (experiments/provenance.py, part_run.py): fingerprints, relative paths, a part resumed at another
path from committed results, the refusal of a mismatched input, the report rebuilt from committed results alone,
and a user's scores beside the committed ones. The integration tests run the quick profile's data part (~1 min)."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from skillnet.experiments import part_run
from skillnet.experiments import provenance as pv
from skillnet.experiments.nlg import NLG_FORMATS
from skillnet.experiments.nlu import NLU_NEW_TASK, NLU_TASKS
from skillnet.experiments.parts import PROTOCOL_VERSION, parts_of
from skillnet.experiments.profiles import PROFILES

REPO = Path(__file__).resolve().parents[1]


def reproduce(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "skillnet.experiments", "--quick", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_fingerprint_by_hand(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "b.safetensors").write_bytes(b"\x01\x02")
    (tmp_path / "m" / "a.safetensors").write_bytes(b"xy")
    h = hashlib.sha256()
    for name, data in (("m/a.safetensors", b"xy"), ("m/b.safetensors", b"\x01\x02")):
        h.update(name.encode() + b"\0" + data)
    assert pv.fingerprint(tmp_path, "m/*.safetensors") == h.hexdigest()
    (tmp_path / "m" / "a.safetensors").write_bytes(b"xz")
    assert pv.fingerprint(tmp_path, "m/*.safetensors") != h.hexdigest()
    assert pv.fingerprint(tmp_path, "absent/*") is None


def test_collect_keeps_relative_paths_and_restore_works_at_another_path(tmp_path):
    out = tmp_path / "run"
    (out / "tune").mkdir(parents=True)
    (out / "tune" / "nlu.json").write_text(json.dumps({"comparison": str(out / "compare" / "nlu_tune"),
                                                      "cmd": f"{sys.executable} {REPO}/pretrain/run.py"}))
    cmp = out / "compare" / "nlu_tune"
    (cmp / "skillnet_lr0.001" / "seed0").mkdir(parents=True)
    (cmp / "skillnet_lr0.001" / "seed0" / "results.json").write_text("{}")
    (cmp / "skillnet_lr0.001" / "seed0" / "checkpoint.pt").write_bytes(b"0" * 10)  # never committed
    (cmp / ".skillnet_output.json").write_text(json.dumps(
        {"command": "finetune.compare", "identity": {"config": str(out / "configs" / "nlu_tune.json")}}))
    files = pv.collect(out, tmp_path / "R" / "nlu_tune", ["nlu_tune"])
    names = {f["path"] for f in files}
    assert names == {"tune/nlu.json", "compare/nlu_tune/skillnet_lr0.001/seed0/results.json",
                     "compare/nlu_tune/.skillnet_output.json"}
    for f in (tmp_path / "R").rglob("*"):
        if f.is_file():
            text = f.read_text()
            assert str(tmp_path) not in text and str(REPO) not in text and sys.executable not in text, f
    assert json.loads((tmp_path / "R/nlu_tune/files/tune/nlu.json").read_text())["comparison"] == "compare/nlu_tune"
    other = tmp_path / "elsewhere"
    assert pv.restore(tmp_path / "R" / "nlu_tune", other) == 3
    marker = json.loads((other / "compare/nlu_tune/.skillnet_output.json").read_text())
    assert marker["identity"]["config"] == str(other / "configs" / "nlu_tune.json")  # what compare will check


def test_no_text_of_a_task_licensed_against_redistribution_is_committed(tmp_path):
    from skillnet.data_prep.tasks.packaged import IQA_LICENSE

    out = tmp_path / "run"
    for task, lic in (("insuranceqa_answer", IQA_LICENSE), ("poetry_title", "chinese-poetry (MIT)")):
        (out / "tasks" / task).mkdir(parents=True)
        (out / "tasks" / task / "task.json").write_text(json.dumps({"name": task, "license": lic}))
    run = out / "compare" / "nlg_main" / "skillnet" / "seed0"
    run.mkdir(parents=True)
    sample = {"source": "s", "reference": "r", "output": "o"}
    (run / "samples.json").write_text(json.dumps({"insuranceqa_answer": [sample], "poetry_title": [sample]}))
    pv.collect(out, tmp_path / "R" / "nlg_main", ["nlg_main"])
    kept = json.loads((tmp_path / "R/nlg_main/files/compare/nlg_main/skillnet/seed0/samples.json").read_text())
    assert kept == {"poetry_title": [sample]}


def test_a_mismatched_input_is_refused_naming_it(tmp_path):
    quick = PROFILES["quick"]
    parts = parts_of(quick)
    bert = parts[1]
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text("[PAD]\n")
    rec = {"data": {"outputs": {"vocab": "0" * 64}}}
    with pytest.raises(part_run.PartError, match=r"input vocab \(vocab/vocab.txt\) differs from what part data"):
        part_run.check_inputs(bert, quick, tmp_path, rec)
    rec["data"]["outputs"]["vocab"] = pv.fingerprint(tmp_path, "vocab/vocab.txt")
    part_run.check_inputs(bert, quick, tmp_path, rec)  # equal: goes on


def test_your_scores_beside_the_committed_ones(tmp_path):
    def cmp(v):
        return {"methods": {"skillnet": {"tasks": {"ner": {"mean": v, "std": 1.0}}, "average": {"mean": v, "std": 0.5}}}}

    (tmp_path / "run/compare/nlu_main").mkdir(parents=True)
    (tmp_path / "run/compare/nlu_main/comparison.json").write_text(json.dumps(cmp(80.0)))
    ref = tmp_path / "R/nlu_main.seed2/files/compare/nlu_main"
    ref.mkdir(parents=True)
    (ref / "comparison.json").write_text(json.dumps(cmp(78.5)))
    lines = part_run.beside_committed(tmp_path / "run", tmp_path / "R")
    assert len(lines) == 2
    ner = next(x for x in lines if " ner " in x)
    assert "yours  80.00 ±  1.00" in ner and "committed  78.50 ±  1.00" in ner and "+1.50" in ner


@pytest.fixture(scope="module")
def committed_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    r = reproduce("--part", "data", "--out", str(root / "a"), "--results", str(root / "R"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return root


def test_the_data_part_commits_provenance_and_a_vocab_over_every_task(committed_data):
    rec = json.loads((committed_data / "R/data/provenance.json").read_text())
    assert rec["protocol_version"] == PROTOCOL_VERSION and rec["profile"] == "quick"
    assert set(rec["stage_seconds"]) == {"nlu_tasks", "nlg_tasks", "corpus", "vocab", "shards"}
    for key in ("commit", "started", "finished", "wall_s", "seeds", "profile_hash"):
        assert rec[key] not in (None, "")
    assert {"cpu", "cores", "torch_threads", "torch", "transformers", "deepspeed"} <= set(rec["machine"])
    assert set(rec["outputs"]) == {"tasks", "corpus", "vocab", "shards"}
    assert rec["bytes"] == sum(f["bytes"] for f in rec["files"]) < 5e6
    # the vocab was built over the training files of every task of both halves
    vocab_cmd = json.loads((committed_data / "R/data/files/stages/vocab.json").read_text())["commands"][0]
    for task in [*NLU_TASKS, NLU_NEW_TASK[0], *NLG_FORMATS]:
        assert f"tasks/{task}/train.jsonl" in vocab_cmd, task
    assert str(committed_data) not in (committed_data / "R/data/files/stages/vocab.json").read_text()


def test_the_data_part_commits_no_task_text(committed_data):
    # Task texts are rebuilt and fingerprinted on each machine; some are licensed for no redistribution (GPL-3.0
    # insuranceqa-data). The report reads the test split's label counts from task.json instead.
    files = committed_data / "R/data/files"
    assert not [f for f in files.rglob("*.jsonl") if f.is_relative_to(files / "tasks")]
    spec = json.loads((files / "tasks/answer_select/task.json").read_text())
    gold = [json.loads(x)["label"] for x in (committed_data / "a/tasks/answer_select/test.jsonl").read_text().splitlines()]
    assert spec["label_counts"]["test"] == {lab: gold.count(lab) for lab in sorted(set(gold))}


def test_a_part_resumes_at_another_path_from_committed_results_with_equal_results(committed_data, tmp_path):
    R = tmp_path / "R"
    shutil.copytree(committed_data / "R", R)  # the committed results, checked out on another machine
    before = json.loads((R / "data/provenance.json").read_text())
    b = tmp_path / "b"
    r = reproduce("--part", "data", "--out", str(b), "--results", str(R))
    assert r.returncode == 0, r.stderr[-2000:]
    after = json.loads((R / "data/provenance.json").read_text())
    assert after["outputs"] == before["outputs"]  # tasks, corpus, vocab, shards: the same bytes
    # not the stage records (times) nor the shards' manifests (their plan's fingerprint hashes the input's path)
    same = [f["path"] for f in before["files"] if not f["path"].startswith("stages/")
            and not f["path"].endswith("manifest.json")]
    for rel in same:
        assert (R / "data/files" / rel).read_bytes() == (committed_data / "R/data/files" / rel).read_bytes(), rel
    # interrupted at its last stage: the rerun keeps the finished stages and redoes the shards only
    shutil.rmtree(b / "shards")
    (b / "stages" / "shards.json").unlink()
    r = reproduce("--part", "data", "--out", str(b), "--results", str(R))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "vocab: the vocab entries the corpus and the tasks' training files use: done before" in r.stdout
    assert "shards: WordPiece -> memory-mapped shards: finished" in r.stdout
    assert json.loads((R / "data/provenance.json").read_text())["outputs"] == before["outputs"]
    # the committed record says the input was another vocab: the next part refuses, naming it
    rec = json.loads((R / "data/provenance.json").read_text())
    rec["outputs"]["vocab"] = "f" * 64
    (R / "data/provenance.json").write_text(json.dumps(rec))
    (R / "bert_pt").mkdir()
    r = reproduce("--part", "bert_pt", "--out", str(b), "--results", str(R))
    assert r.returncode == 2
    assert "refuses to go on: input vocab (vocab/vocab.txt) differs from what part data recorded" in r.stderr
    assert "Traceback" not in r.stderr and not (b / "pt_dense").exists()


def test_the_report_rebuilds_from_committed_results_alone(committed_data, tmp_path):
    R = tmp_path / "R"
    shutil.copytree(committed_data / "R", R)
    shutil.rmtree(committed_data / "a")  # no reproduction folder anywhere
    docs = tmp_path / "docs"
    r = reproduce("--report", str(R), "--docs", str(docs))
    assert r.returncode == 0, r.stderr[-2000:]
    for name in ("report.md", "comparison.md", "nlg.md"):
        text = (docs / name).read_text()
        assert "## Parts of this reproduction" in text and "| data |" in text, name
        assert "runs/" not in text.split("## The exact commands")[0]
    rec = json.loads((R / "data/provenance.json").read_text())
    assert rec["commit"] in (docs / "report.md").read_text()
    # a part of another protocol version: refused, or marked when allowed
    rec["protocol_version"] = PROTOCOL_VERSION - 1
    (R / "data/provenance.json").write_text(json.dumps(rec))
    r = reproduce("--report", str(R), "--docs", str(docs))
    assert r.returncode == 2 and "part(s) data were made under another protocol version" in r.stderr
    r = reproduce("--report", str(R), "--docs", str(docs), "--allow-mixed-protocols")
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"protocol {PROTOCOL_VERSION - 1}, not {PROTOCOL_VERSION}" in (docs / "report.md").read_text()
