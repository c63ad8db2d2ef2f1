"""Detection-level scores of a corrector (issue 49, item 4): edit spans found whatever is written there
(`detection_prf`), SIGHAN-2015's sentence-level detection and correction (`sentence_prf`), and the csc task
reporting them beside F0.5."""

from __future__ import annotations

import importlib.util
import json
import random
from collections import Counter
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from skillnet.finetune.csc_metrics import sentence_prf
from skillnet.finetune.edit_metrics import _corpus_counts, char_edits, correction_prf, detection_prf
from skillnet.finetune.gen_metrics import DETECTION_METRICS, GEN_METRICS, score_generation

SRC = "我朋唷打算去法国"  # 唷 (position 2) should be 友
REF = "我朋友打算去法国"


def test_detection_counts_the_right_span_whatever_is_written_there() -> None:
    hyps = ["我朋有打算去法国",  # right place, wrong character: a detection TP, a correction FP + FN
            "我朋友打算去法国",  # right place, right character: TP at both levels
            "我朋唷打算到法国",  # the wrong place: FP + FN at both levels
            SRC]  # no edit: FN
    det = detection_prf([SRC] * 4, hyps, [REF] * 4)
    cor = correction_prf([SRC] * 4, hyps, [REF] * 4)
    assert (det["tp"], det["fp"], det["fn"]) == (2, 1, 2)
    assert (cor["tp"], cor["fp"], cor["fn"]) == (1, 2, 3)
    p, r = 2 / 3, 2 / 4
    assert det["precision"] == pytest.approx(100 * p) and det["recall"] == pytest.approx(100 * r)
    assert det["f"] == pytest.approx(100 * 1.25 * p * r / (0.25 * p + r))
    # the row that motivated it: every edit at a gold span, none with the gold character -> F0.5 0, detection 100
    wrong_char = detection_prf([SRC], ["我朋有打算去法国"], [REF])
    assert correction_prf([SRC], ["我朋有打算去法国"], [REF])["f"] == 0.0 and wrong_char["f"] == 100.0
    # a merged span must be the same span: fixing one of two adjacent wrong characters detects neither
    two = detection_prf(["我朋唷大算"], ["我朋友大算"], ["我朋友打算"])
    assert (two["tp"], two["fp"], two["fn"]) == (0, 1, 1)


def test_one_hypothesis_edit_earns_at_most_one_detection_tp() -> None:
    # ab -> aaa has two cheapest alignments whose edits of span (1, 2) differ (b->a, b->aa): the span is in the
    # reference twice, and the one hypothesis edit there must not earn both
    det, cor = detection_prf(["ab"], ["aa"], ["aaa"]), correction_prf(["ab"], ["aa"], ["aaa"])
    assert (det["tp"], det["fp"], det["fn"]) == (1, 0, 2) == (cor["tp"], cor["fp"], cor["fn"])
    # in general: never more TPs than hypothesis edits, never fewer than correction finds, and the reference's
    # edits are all counted (tp + fn) whatever the hypothesis
    rng = random.Random(0)
    for _ in range(150):
        src, hyp, ref = ("".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(3))
        det, cor = detection_prf([src], [hyp], [ref]), correction_prf([src], [hyp], [ref])
        n_hyp = sum(char_edits(src, hyp).values())
        assert cor["tp"] <= det["tp"] <= n_hyp and det["tp"] + det["fp"] == n_hyp, (src, hyp, ref)
        assert det["tp"] + det["fn"] == sum(char_edits(src, ref).values()), (src, hyp, ref)


def test_reference_choice_uses_the_reported_empty_rule() -> None:
    # nothing counted so far: a sentence whose candidates are (0, 0, 0) and (1, 1, 0). ChERRANT's rule (empty = 1)
    # scores the first F 1; SIGHAN's (empty = 0, which sentence_prf reports) scores it 0 and the second 2/3
    assert _corpus_counts([[(0, 0, 0), (1, 1, 0)]], 1.0) == (0, 0, 0)
    assert _corpus_counts([[(0, 0, 0), (1, 1, 0)]], 1.0, empty=0.0) == (1, 1, 0)


def test_detection_chooses_each_sentences_reference_as_correction_does() -> None:
    # against the first reference the output's span is wrong, against the second it is right
    got = detection_prf([SRC], ["我朋唷打算到法国"], [[REF, "我朋唷打算往法国"]])
    assert (got["tp"], got["fp"], got["fn"]) == (1, 0, 0)
    # the choice maximises the corpus F so far: sentence 2 takes the reference whose span the output edits
    got = detection_prf([SRC, SRC], [REF, "我朋唷打算到法国"], [REF, [REF, "我朋唷打算往法国"]])
    assert (got["tp"], got["fp"], got["fn"]) == (2, 0, 0)


def test_sentence_level_by_hand_from_the_sighan15_definition() -> None:
    """A sentence is a detection TP when the positions its output changes are exactly the gold ones, a correction
    TP when the characters written there are too; P = TP / sentences changed, R = TP / sentences with errors."""
    items = [  # (source, gold, output)
        ("今天天气很好", "今天天气很好", "今天天汽很好"),  # no error, changed: FP at both levels
        ("我朋唷大算去", "我朋友打算去", "我朋有打算去"),  # both positions found, one character wrong: det TP only
        ("他门去北京", "他们去北京", "他们去北京"),  # corrected: TP at both levels
        ("我爱北京", "我爱北京", "我爱北京"),  # no error, unchanged: TN
        ("我再家里", "我在家里", "我再家里"),  # error, unchanged: FN
        ("我再家理", "我在家里", "我在家理"),  # error, one of two positions found: changed, not a TP
    ]
    srcs, golds, outs = zip(*items)
    got = sentence_prf(srcs, outs, golds)
    # changed: 1, 2, 3, 6 (4 sentences); with errors: 2, 3, 5, 6 (4); detection TP: 2, 3; correction TP: 3
    assert got["det_p"] == pytest.approx(50.0) and got["det_r"] == pytest.approx(50.0)
    assert got["det_f1"] == pytest.approx(50.0)
    assert got["cor_p"] == pytest.approx(25.0) and got["cor_r"] == pytest.approx(25.0)
    assert got["cor_f1"] == pytest.approx(25.0)
    # the tool's conventions: nothing changed -> P = 0 (not ChERRANT's 1), and F1 0
    none = sentence_prf(srcs, srcs, golds)
    assert (none["det_p"], none["det_r"], none["det_f1"]) == (0.0, 0.0, 0.0)
    # an output of another length: its ChERRANT edits stand in; deleting the wrong character names its position
    short = sentence_prf(["我朋唷打算"], ["我朋打算"], ["我朋友打算"])
    assert (short["det_f1"], short["cor_f1"]) == (100.0, 0.0)


def _pycorrector_eval() -> ModuleType:
    """pycorrector's macbert/evaluate_util.py, loaded alone (importing the package needs pypinyin, kenlm, ...)."""
    from skillnet.data_prep.tasks.packaged import package_dir

    path = package_dir("pycorrector", "pycorrector==1.1.4") / "macbert" / "evaluate_util.py"
    spec = importlib.util.spec_from_file_location("_pycorrector_evaluate_util", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sentence_level_equals_pycorrectors_faspell_metric_on_sighan_pairs() -> None:
    """pycorrector's compute_corrector_prf_faspell (strict: all positions found and no other), on real SIGHAN-2015
    pairs with outputs that are right, unchanged, half fixed, wrong elsewhere or wrong at the right places."""
    from skillnet.data_prep.tasks.generation import read_sighan
    from skillnet.data_prep.tasks.packaged import package_dir

    pyc = _pycorrector_eval()
    pairs = [(s, t) for _, s, t in read_sighan(package_dir("pycorrector", "pycorrector==1.1.4") / "data"
                                                / "sighan2015_test.tsv", Counter()) if len(s) == len(t)][:120]
    rng = random.Random(0)
    triples = []
    for src, tgt in pairs:
        k = rng.randrange(5)
        out = list(tgt if k == 0 else src)
        if k == 2:  # each gold position fixed with probability 1/2
            out = [t if rng.random() < 0.5 else s for s, t in zip(src, tgt)]
        if k == 3:  # a wrong character somewhere
            i = rng.randrange(len(src))
            out[i] = "的" if out[i] != "的" else "地"
        if k == 4:  # every gold position found, a wrong character written there
            out = [s if s == t else next(c for c in "的地得" if c not in (s, t)) for s, t in zip(src, tgt)]
        triples.append((src, tgt, "".join(out)))
    want = pyc.compute_corrector_prf_faspell(triples, strict=True)
    got = sentence_prf([t[0] for t in triples], [t[2] for t in triples], [t[1] for t in triples])
    assert 0 < want["det_sent_f1"] < 1 and want["cor_sent_f1"] < want["det_sent_f1"]
    for level in ("det", "cor"):
        for name in ("p", "r", "f1"):
            assert got[f"{level}_{name}"] == pytest.approx(100 * want[f"{level}_sent_{name}"]), (level, name)


def test_score_generation_reports_detection_and_needs_the_sources() -> None:
    assert set(DETECTION_METRICS) <= set(GEN_METRICS)
    got = score_generation(list(DETECTION_METRICS), [SRC], ["我朋有打算去法国"], [REF])
    assert got == {"det_f0.5": 100.0, "det_p": 100.0, "det_r": 100.0, "sent_det_f1": 100.0, "sent_cor_f1": 0.0}
    with pytest.raises(ValueError, match="need the source sentences"):
        score_generation(["sent_det_f1"], None, ["a"], ["a"])


def test_a_task_selected_on_f05_reports_detection_and_others_do_not() -> None:
    from skillnet.finetune.task_types.generation import GenerationCodec

    recs = [{"source": SRC, "target": REF}]

    def td(metric: str) -> SimpleNamespace:
        return SimpleNamespace(cfg=SimpleNamespace(metric=metric, lang="zh"))

    csc = GenerationCodec().score(td("f0.5"), recs, ["我朋有打算去法国"])  # type: ignore[arg-type]
    assert csc["f0.5"] == 0.0 and csc["det_f0.5"] == 100.0 and csc["sent_det_f1"] == 100.0
    assert not set(DETECTION_METRICS) & set(GenerationCodec().score(td("bleu_2"), recs, [REF]))  # type: ignore[arg-type]


def _write_csc_runs(run_dir: Path) -> dict:
    """Two rows of an NLG comparison on csc, seeds 0 and 1: `skillnet` at F0.5 0 that finds the wrong characters,
    `dense_joint` at F0.5 0 that finds none; samples.json as a generation run keeps it."""
    for row, det in (("skillnet", (20.0, 30.0)), ("dense_joint", (0.0, 0.0))):
        for seed in (0, 1):
            d = run_dir / row / f"seed{seed}"
            d.mkdir(parents=True)
            test = {"f0.5": 0.0, "det_f0.5": det[seed], "det_p": det[seed], "det_r": 10.0, "sent_det_f1": 5.0,
                    "sent_cor_f1": 0.0}
            (d / "results.json").write_text(json.dumps({"tasks": {"csc": {"metric": "f0.5", "test": test}}}),
                                            encoding="utf-8")
            out = "我朋有打算去法国" if row == "skillnet" else "我们打算去法国"
            (d / "samples.json").write_text(json.dumps({"csc": [
                {"source": "今天天气很好", "reference": "今天天气很好", "output": "今天天气很好"},
                {"source": SRC, "reference": REF, "output": out}]}, ensure_ascii=False), encoding="utf-8")
    return {"tasks": ["csc"], "methods": {r: {"tasks": {"csc": {"metric": "f0.5", "mean": 0.0}}}
                                          for r in ("skillnet", "dense_joint")}}


def test_report_shows_detection_beside_f05_and_the_inputs_with_an_error(tmp_path: Path) -> None:
    from skillnet.experiments.report_nlg import correction_samples, detection_table, samples
    from skillnet.experiments.targets import nlg_rows
    from skillnet.finetune.document import Document

    run_dir = tmp_path / "nlg_main"
    nlg = _write_csc_runs(run_dir)
    doc, findings = Document(), []
    detection_table(doc, nlg, run_dir, findings)
    correction_samples(doc, nlg, samples(doc, run_dir))
    text = doc.markdown(lambda p: str(p))
    assert "| skillnet | 0.0 | 25.0 | 25.0 / 10.0 | 5.0 | 0.0 |" in text
    assert "find the wrong characters before it learns which character to write" in text
    assert findings == ["csc: F0.5 is 0 in 2 of 2 rows; of these, detection F0.5 is above 0 in 1 (`skillnet` 25.0): "
                        "they find wrong characters but write the wrong ones (see the detection table and the samples)."]
    # the input with an error is shown with its edits, not only the first (error-free) kept input
    assert f"| reference | {REF} (3 唷→友) |" in text and "| skillnet | 我朋有打算去法国 (3 唷→有) |" in text
    assert "| dense_joint | 我们打算去法国 (2 朋唷→们) |" in text
    rows = {r[0]: r for r in nlg_rows(nlg, run_dir)}
    assert rows["csc: F0.5 > 0 (`skillnet`)"][1:] == [
        "0.0", "**missed**", "detection F0.5 25.0, sentence-level detection F1 5.0: it finds wrong characters but "
        "writes the wrong ones"]


def test_the_finding_and_the_samples_call_the_same_rows_f05_zero(tmp_path: Path) -> None:
    """One definition of "F0.5 is 0" (the comparison's): a stale seed folder the comparison does not count (seed 2
    of `skillnet`, F0.5 12) changes neither which rows the finding counts nor which the samples show."""
    from skillnet.experiments.report_nlg import correction_samples, detection_table, f05_zero_rows, samples
    from skillnet.finetune.document import Document

    run_dir = tmp_path / "nlg_main"
    nlg = _write_csc_runs(run_dir)
    stale = run_dir / "skillnet" / "seed2"
    stale.mkdir()
    test = {"f0.5": 12.0, "det_f0.5": 30.0, "det_p": 30.0, "det_r": 30.0, "sent_det_f1": 5.0, "sent_cor_f1": 5.0}
    (stale / "results.json").write_text(json.dumps({"tasks": {"csc": {"metric": "f0.5", "test": test}}}),
                                        encoding="utf-8")
    assert f05_zero_rows(nlg, "csc") == ["skillnet", "dense_joint"]
    doc, findings = Document(), []
    detection_table(doc, nlg, run_dir, findings)
    correction_samples(doc, nlg, samples(doc, run_dir))
    text = doc.markdown(lambda p: str(p))
    assert len(findings) == 1 and findings[0].startswith("csc: F0.5 is 0 in 2 of 2 rows"), findings
    assert "| skillnet | 我朋有打算去法国 (3 唷→有) |" in text and "| dense_joint | 我们打算去法国 (2 朋唷→们) |" in text
    # a row above 0 in the comparison is neither
    nlg["methods"]["skillnet"]["tasks"]["csc"]["mean"] = 0.5
    assert f05_zero_rows(nlg, "csc") == ["dense_joint"]
    doc, findings = Document(), []
    detection_table(doc, nlg, run_dir, findings)
    correction_samples(doc, nlg, samples(doc, run_dir))
    assert findings[0].startswith("csc: F0.5 is 0 in 1 of 2 rows") and "(3 唷→有)" not in doc.markdown(str)
