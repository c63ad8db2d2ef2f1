"""csc scored as SIGHAN-2015 does, and decoded without forced edits (issue 55, item 7).

- SIGHAN-2015's false-positive rate and sentence-level detection / correction accuracy (`sentence_rates`),
  checked on a hand-computed case, against pycorrector's own evaluation code and against scikit-learn's
  confusion matrix, and reported by the csc task beside the span-level detection F0.5.
- Decoding: a source character outside the vocab is [UNK] to the model; a corrector that keeps it must be
  able to copy it. Main suppressed [UNK] in every search, which forced an edit at that character.
"""

from __future__ import annotations

import importlib.util
import logging
import random
from collections import Counter
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.finetune.csc_metrics import sentence_prf, sentence_rates
from skillnet.finetune.gen_metrics import SENTENCE_METRICS, score_generation
from skillnet.finetune.task_types.generation import GenerationCodec, copied_text

# (source, gold, output)
ITEMS = [
    ("今天天气很好", "今天天气很好", "今天天汽很好"),  # no error, changed: a false positive
    ("我朋唷大算去", "我朋友打算去", "我朋有打算去"),  # both positions found, one character wrong: detection only
    ("他门去北京", "他们去北京", "他们去北京"),  # corrected: right at both levels
    ("我爱北京", "我爱北京", "我爱北京"),  # no error, unchanged: right at both levels (a true negative)
    ("我再家里", "我在家里", "我再家里"),  # error, unchanged: wrong at both
    ("我再家理", "我在家里", "我在家理"),  # error, one of two positions found: wrong at both
]


def test_false_positive_rate_and_sentence_accuracy_by_hand() -> None:
    srcs, golds, outs = zip(*ITEMS)
    got = sentence_rates(srcs, outs, golds)
    # error-free: sentences 1 and 4, of which 1 is changed; detection right: 2, 3, 4; correction right: 3, 4
    assert got == pytest.approx({"fpr": 50.0, "det_acc": 50.0, "cor_acc": 100 * 2 / 6})
    # a copier changes nothing: no false positive, and right exactly on the error-free sentences
    assert sentence_rates(srcs, srcs, golds) == pytest.approx({"fpr": 0.0, "det_acc": 100 * 2 / 6,
                                                                "cor_acc": 100 * 2 / 6})
    assert sentence_rates(srcs, golds, golds) == {"fpr": 0.0, "det_acc": 100.0, "cor_acc": 100.0}
    assert sentence_rates(["他门"], ["他们"], ["他们"])["fpr"] == 0.0  # no error-free sentence: rate 0
    # several references: right against either; error-free only when every reference keeps the source
    multi = sentence_rates(["他门", "他们"], ["他们", "她们"], [["他们", "他门"], ["他们", "她们"]])
    assert multi == {"fpr": 0.0, "det_acc": 100.0, "cor_acc": 100.0}
    assert sentence_rates(["他们"], ["她们"], [["他们", "他们"]])["fpr"] == 100.0
    with pytest.raises(ValueError, match="differ in length"):
        sentence_rates(["a"], [], [])


def _pycorrector_eval() -> ModuleType:
    """pycorrector's macbert/evaluate_util.py, loaded alone (importing the package needs pypinyin, kenlm, ...)."""
    from skillnet.data_prep.tasks.packaged import package_dir

    path = package_dir("pycorrector", "pycorrector==1.1.4") / "macbert" / "evaluate_util.py"
    spec = importlib.util.spec_from_file_location("_pycorrector_evaluate_util_csc", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sighan_triples() -> list[tuple[str, str, str]]:
    """Real SIGHAN-2015 test pairs (error-free ones included) with outputs that are right, unchanged, half
    fixed, wrong elsewhere or wrong at the right places: (source, gold, output)."""
    from skillnet.data_prep.tasks.generation import read_sighan
    from skillnet.data_prep.tasks.packaged import package_dir

    pairs = [(s, t) for _, s, t in read_sighan(package_dir("pycorrector", "pycorrector==1.1.4") / "data"
                                                / "sighan2015_test.tsv", Counter()) if len(s) == len(t)][:300]
    rng = random.Random(1)
    out = []
    for src, tgt in pairs:
        k = rng.randrange(5)
        hyp = list(tgt if k == 0 else src)
        if k == 2:
            hyp = [t if rng.random() < 0.5 else s for s, t in zip(src, tgt)]
        if k == 3:
            i = rng.randrange(len(src))
            hyp[i] = "的" if hyp[i] != "的" else "地"
        if k == 4:
            hyp = [s if s == t else next(c for c in "的地得" if c not in (s, t)) for s, t in zip(src, tgt)]
        out.append((src, tgt, "".join(hyp)))
    return out


def test_sentence_accuracy_equals_pycorrectors_and_the_rate_sklearns() -> None:
    """Detection and correction accuracy against pycorrector's compute_corrector_prf_faspell (strict) and its
    compute_sentence_level_prf (whose accuracy is the correction accuracy); the false-positive rate against
    scikit-learn's confusion matrix of "has an error" against "was changed"."""
    from sklearn.metrics import confusion_matrix

    triples = _sighan_triples()
    srcs, golds, outs = zip(*triples)
    clean = sum(s == g for s, g in zip(srcs, golds))
    assert 0 < clean < len(triples)  # both kinds of sentence are there
    pyc = _pycorrector_eval()
    faspell = pyc.compute_corrector_prf_faspell(triples, strict=True)
    acc, *_ = pyc.compute_sentence_level_prf(triples, logging.getLogger("pycorrector-eval"))
    got = sentence_rates(srcs, outs, golds)
    assert 0 < got["cor_acc"] < got["det_acc"] < 100
    assert got["det_acc"] == pytest.approx(100 * faspell["det_sent_acc"])
    assert got["cor_acc"] == pytest.approx(100 * faspell["cor_sent_acc"]) == pytest.approx(100 * acc)
    tn, fp, _, _ = confusion_matrix([s != g for s, g in zip(srcs, golds)], [s != o for s, o in zip(srcs, outs)],
                                    labels=[False, True]).ravel()
    assert fp > 0 and got["fpr"] == pytest.approx(100 * fp / (fp + tn))
    # the F1s moved with them and still equal the tool's
    prf = sentence_prf(srcs, outs, golds)
    assert prf["det_f1"] == pytest.approx(100 * faspell["det_sent_f1"])


def _td(metric: str = "f0.5", beams: int = 1) -> SimpleNamespace:
    from skillnet.finetune.tasks import TaskData

    td = SimpleNamespace(tok=load_tokenizer(), name="csc", max_len=64,
                         cfg=SimpleNamespace(metric=metric, lang="zh", source_prefix="", max_target_len=64,
                                             num_beams=beams))
    td.decode_text = lambda ids: TaskData.decode_text(td, ids)  # type: ignore[arg-type]
    return td


def test_the_csc_task_reports_the_rate_and_the_accuracies() -> None:
    srcs, golds, outs = zip(*ITEMS)
    recs = [{"source": s, "target": g} for s, g in zip(srcs, golds)]
    got = GenerationCodec().score(_td(), recs, list(outs))  # type: ignore[arg-type]
    assert {k: got[k] for k in SENTENCE_METRICS} == pytest.approx(
        {"sent_fpr": 50.0, "sent_det_acc": 50.0, "sent_cor_acc": 100 * 2 / 6})
    assert not set(SENTENCE_METRICS) & set(GenerationCodec().score(_td("rouge_l"), recs, list(outs)))  # type: ignore[arg-type]
    assert score_generation(["sent_fpr"], srcs, outs, golds) == {"sent_fpr": 50.0}
    with pytest.raises(ValueError, match="sent_cor_acc need the source sentences"):
        score_generation(["sent_cor_acc"], None, outs, golds)


class _Copier(torch.nn.Module):
    """A perfect corrector of an error-free text: it writes its source back. Where a token is suppressed it
    writes its next best, 的, as a model forced off its best token does. Records each call's suppression."""

    def __init__(self, tok: Any) -> None:
        super().__init__()
        self.tok, self.calls = tok, []
        self.w = torch.nn.Parameter(torch.zeros(()))

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, task: str, num_beams: int,
                 max_new_tokens: int, suppress_tokens: list[int] | None = None) -> torch.Tensor:
        banned = set(suppress_tokens or [])
        self.calls.append((len(input_ids), sorted(banned)))
        fill = self.tok.encode_batch(["的"])[0][0]
        rows = [[self.tok.sep_id] + [fill if i in banned else i for i, m in zip(ids.tolist(), mask.tolist()) if m]
                for ids, mask in zip(input_ids, attention_mask)]
        width = max(map(len, rows))
        return torch.tensor([r + [self.tok.pad_id] * (width - len(r)) for r in rows])


def _decode(td: SimpleNamespace, model: Any, sources: list[str]) -> list[str]:
    codec = GenerationCodec()
    feats, _ = codec.encode(td, [{"source": s} for s in sources], "test")  # type: ignore[arg-type]
    return codec.decode(td, model, feats, codec.collate(td, feats, with_labels=False))  # type: ignore[arg-type]


def test_a_copier_keeps_a_character_outside_the_vocab_and_no_edit_is_counted() -> None:
    """錓 and 撘 are outside bert-base-chinese's vocab (the model reads [UNK]). A model that copies its source
    must give it back unchanged: on main the search suppressed [UNK], the copier wrote 的 there, and the
    error-free sentence counted as a false positive (an edit at 撘 nobody asked for)."""
    td = _td()
    clean, wrong, plain = "你可以从台北撘3点30分的火车到宜兰去。", "身体建錓。", "我爱北京。"
    assert td.tok.unk_id in td.tok.encode_batch([clean])[0] and td.tok.unk_id not in td.tok.encode_batch([plain])[0]
    model = _Copier(td.tok)
    outs = _decode(td, model, [clean, wrong, plain])
    assert outs == [clean.lower(), wrong, plain]
    # the row without [UNK] is searched with [UNK] suppressed, the two with it without
    assert sorted(model.calls) == [(1, [td.tok.unk_id]), (2, [])]
    recs = [{"source": clean, "target": clean}, {"source": wrong, "target": "身体健康。"},
            {"source": plain, "target": plain}]
    got = GenerationCodec().score(td, recs, outs)  # type: ignore[arg-type]
    assert got["sent_fpr"] == 0.0 and got["det_p"] == 100.0 and got["det_r"] == 0.0  # no edit: nothing found
    assert got["sent_cor_acc"] == pytest.approx(100 * 2 / 3)


def test_an_output_unk_is_read_as_the_source_text_it_is_aligned_to() -> None:
    td = _td()
    tok, unk = td.tok, td.tok.unk_id
    ids = {c: tok.encode_batch([c])[0][0] for c in "我你他"}
    src = [tok.cls_id, ids["我"], unk, ids["你"], unk, tok.sep_id]
    texts = {2: "錓", 4: "abc"}  # by position in the model's input
    # 你 -> 他 around the two copied [UNK]s; a third [UNK], aligned to none of the source's, names nothing
    out = [tok.sep_id, tok.cls_id, ids["我"], unk, ids["他"], unk, unk, tok.sep_id]
    assert copied_text(td, src, out, texts) == "我錓他abc"  # type: ignore[arg-type]
    assert copied_text(td, src, [ids["我"], unk, ids["你"]], texts) == "我錓你"  # type: ignore[arg-type]
    # a Latin word outside the vocab keeps a space after a Latin word, as the decoder writes one
    x = tok.encode_batch(["x"])[0][0]
    assert copied_text(td, [x, unk], [x, unk], {1: "abc"}) == "x abc"  # type: ignore[arg-type]
    # an [UNK] of the source without a text (a prefix's) is dropped, never printed as "[UNK]"
    assert copied_text(td, src, out, {}) == "我他"  # type: ignore[arg-type]


def test_the_encoded_source_keeps_the_text_of_its_own_unks_only() -> None:
    """A prefix's [UNK] (a prefix the vocab lacks characters of) is nothing to copy: such a row is searched
    with [UNK] suppressed, as a row whose source reads none; a source [UNK] cut off by max_seq_len is gone."""
    td = _td()
    td.cfg.source_prefix = "錓："
    feats, _ = GenerationCodec().encode(td, [{"source": "我爱北京。"}, {"source": "身体建錓。"}], "test")  # type: ignore[arg-type]
    assert [f.extra["unk_text"] for f in feats] == [{}, {6: "錓"}]  # [CLS] 錓 ： 身 体 建 錓
    assert feats[1].input_ids[6] == td.tok.unk_id
    model = _Copier(td.tok)
    codec = GenerationCodec()
    outs = codec.decode(td, model, feats, codec.collate(td, feats, with_labels=False))  # type: ignore[arg-type]
    assert sorted(model.calls) == [(1, []), (1, [td.tok.unk_id])]
    assert outs[1].endswith("身体建錓。") and "[UNK]" not in outs[0]
    td.max_len = 5  # the source keeps 3 pieces: 身 体 建
    feats, _ = GenerationCodec().encode(td, [{"source": "身体建錓。"}], "test")  # type: ignore[arg-type]
    assert feats[0].extra["unk_text"] == {}


@pytest.mark.parametrize("beams", [1, 3])
def test_a_real_model_that_prefers_unk_copies_the_source_character(beams: int) -> None:
    """A tiny SkillNet-BART biased to [UNK] everywhere: its [UNK] aligned to the source's is read as 錓, the
    others name nothing; the text never holds "[UNK]", and a row without [UNK] in the same batch writes none."""
    from skillnet.model import SkillNetBartConfig, SkillNetBartForConditionalGeneration

    torch.manual_seed(0)
    cfg = SkillNetBartConfig.preset("tiny")
    model = SkillNetBartForConditionalGeneration(cfg).eval()
    model.final_logits_bias[0, load_tokenizer().unk_id] = 50.0
    td = _td(beams=beams)
    td.name = next(iter(cfg.tasks))
    td.cfg.max_target_len = 8
    with torch.no_grad():
        with_unk, without = _decode(td, model, ["身体建錓。", "我爱北京。"])
    assert "錓" in with_unk and set(with_unk) <= {"錓"} and "[UNK]" not in with_unk
    assert without and "[UNK]" not in without


def test_the_report_shows_the_rate_and_accuracies_beside_span_level_detection(tmp_path) -> None:
    """The NLG report's detection table names the edit-level detection span-level and adds SIGHAN's
    false-positive rate and sentence accuracy per row, and the copy-the-source row they are read against."""
    import json

    from skillnet.experiments.report_nlg import detection_table
    from skillnet.finetune.document import Document

    run_dir = tmp_path / "nlg_main"
    test = {"f0.5": 10.0, "det_f0.5": 30.0, "det_p": 30.0, "det_r": 20.0, "sent_det_f1": 8.0, "sent_cor_f1": 4.0,
            "sent_fpr": 12.0, "sent_det_acc": 50.0, "sent_cor_acc": 48.0}
    copy = {"f0.5": 0.0, "det_f0.5": 0.0, "det_p": 100.0, "det_r": 0.0, "sent_det_f1": 0.0, "sent_cor_f1": 0.0,
            "sent_fpr": 0.0, "sent_det_acc": 46.7, "sent_cor_acc": 46.7}
    for seed, shift in ((0, 0.0), (1, 2.0)):
        d = run_dir / "skillnet" / f"seed{seed}"
        d.mkdir(parents=True)
        res = {"metric": "f0.5", "test": {k: v + shift for k, v in test.items()}, "trivial_test": copy}
        (d / "results.json").write_text(json.dumps({"tasks": {"csc": res}}), encoding="utf-8")
    cmp = {"tasks": ["csc"], "methods": {"skillnet": {"tasks": {"csc": {"metric": "f0.5", "mean": 11.0}}}}}
    doc, findings = Document(), []
    detection_table(doc, cmp, run_dir, findings)
    text = doc.markdown(lambda p: str(p))
    assert "| row | F0.5 | span detection F0.5 | span detection P / R | sentence detection F1 | sentence " \
           "correction F1 | false-positive rate | sentence detection / correction accuracy |" in text
    assert "| skillnet | 11.0 | 31.0 | 31.0 / 21.0 | 9.0 | 5.0 | 13.0 | 51.0 / 49.0 |" in text
    assert "| copy the source | 0.0 | 0.0 | 100.0 / 0.0 | 0.0 | 0.0 | 0.0 | 46.7 / 46.7 |" in text
    assert "ChERRANT-style span matching, not SIGHAN's" in text and findings == []
