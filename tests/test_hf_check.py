"""experiments.hf_check runs plain transformers in a temporary folder: a model folder given relative to
the caller's working directory must still be found there (it was read as a hub repo id). Its plain-export
check covers every task of a small run, with an ONNX row per task."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest
from skillnet.experiments.hf_check import run_plain

from tests import test_plain_deploy

# test_plain_deploy's tiny fine-tuning with one task of each BERT head type, as a fixture of this module too.
ft4 = test_plain_deploy.ft4


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
def test_a_relative_folder_reaches_the_plain_interpreter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    res = run_plain(sys.executable, Path("export"), {}, "import os\nres['found'] = os.path.isfile(os.path.join(folder, 'config.json'))")
    assert res == {"found": True}
    assert os.getcwd() == str(tmp_path)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory, ft4: Path, gen_run: Path) -> Path:
    """A reproduction's layout around the tiny runs: ft4 (sentiment, CRF NER, qa_match, span `mrc`) as the first
    seed's SkillNet-NLU export, gen_run (`fix`, beam search; `qa`, greedy) as SkillNet-NLG's, each task's
    fixture records as its test file."""
    from tests.test_hf_pipelines import FIX

    run = tmp_path_factory.mktemp("hf_check") / "run"
    for name, src in (("nlu_main", ft4), ("nlg_main", gen_run)):
        # The seed folder is the fine-tuning run, as in a reproduction: export --plain measures on its test file.
        (run / "compare" / name / "skillnet").mkdir(parents=True)
        (run / "compare" / name / "skillnet" / "seed0").symlink_to(src)
    for task, fixture in (("sentiment", "sent_test"), ("ner", "ner_test"), ("qa_match", "match_test"),
                          ("mrc", "mrc_dev"), ("fix", "gen_fix_dev"), ("qa", "gen_qa_dev")):
        (run / "tasks" / task).mkdir(parents=True)
        shutil.copy(FIX / f"{fixture}.jsonl", run / "tasks" / task / "test.jsonl")
    return run


@pytest.mark.slow  # a tiny fine-tuning, six plain exports and a plain interpreter per task
def test_check_plain_checks_every_task_and_its_onnx_graph(small_run: Path) -> None:
    """Every task of both exports gets a plain row (the card's decoding: pipeline, ranking, question answering,
    Viterbi, generate) and, with SKILLNET_HF_CHECK_ONNX=1, an ONNX row; each agrees with predict on every input."""
    from skillnet.experiments.hf_check import check_plain

    # The ONNX rows trace six graph sets (~2 min each on 2 cores): the test suite's budget keeps them to the
    # command (python -m skillnet.experiments.hf_check RUN --onnx); the graphs' own decoding is tested in
    # tests/test_plain_deploy.py (BERT) and tests/test_plain_onnx_bart.py (BART).
    onnx = os.environ.get("SKILLNET_HF_CHECK_ONNX") == "1" and importlib.util.find_spec("onnxruntime") is not None
    py = os.environ.get("SKILLNET_PLAIN_PYTHON") or sys.executable
    res = check_plain(small_run, py, 4, onnx=onnx)
    rows = {"sentiment (text-classification)", "ner (viterbi)", "qa_match (rank)", "mrc (question-answering)",
            "fix (generate)", "qa (generate)"}
    assert set(res) == {f"{b} {r}" for b in ("plain", *(["onnx"] if onnx else [])) for r in rows}
    for name, r in res.items():
        assert r["inputs"] >= 3 and r["agree"] == r["inputs"], (name, r)
        assert r["distinct_outputs"] >= 1
    assert res["plain ner (viterbi)"]["left_out_words_without_pieces"] == 0
