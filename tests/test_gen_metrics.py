"""Generation metrics: hand-computed cases, and cross-checks against nltk, sacrebleu's own tokenisers,
rouge-chinese and the official ChERRANT scorer's output on its sample files."""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from skillnet.finetune.edit_metrics import char_edits, correction_prf
from skillnet.finetune.gen_metrics import (
    GEN_METRICS,
    bleu,
    gen_tokens,
    rouge_l,
    score_generation,
)

FIX = Path(__file__).parent / "fixtures" / "gen"


def read_m2(path: Path) -> tuple[list[str], list[list[str]], list[dict[int, Counter]]]:
    """Sources, reference sentences (T lines; "没有错误" = unchanged) and edits per annotator of an M2 file."""
    srcs, refs, edits = [], [], []
    for block in path.read_text(encoding="utf-8").strip().split("\n\n"):
        lines = block.split("\n")
        src = lines[0][2:].replace(" ", "")
        targets: dict[int, str] = {}
        coders: dict[int, Counter] = {}
        for line in lines[1:]:
            m = re.match(r"^T(\d+)(?:-A\d+)? (.*)$", line)
            if m:
                t = m.group(2).replace(" ", "")
                targets.setdefault(int(m.group(1)), src if t == "没有错误" else t)
            elif line.startswith("A "):
                span, cat, cor, *_, coder = line[2:].split("|||")
                c = coders.setdefault(int(coder), Counter())
                if cat not in ("noop", "NA"):
                    start, end = map(int, span.split())
                    c[(start, end, "" if cor == "-NONE-" else cor.replace(" ", ""))] += 1
        srcs.append(src)
        refs.append([targets[k] for k in sorted(targets)])
        edits.append(coders)
    return srcs, refs, edits


@pytest.fixture(scope="module")
def demo() -> tuple[list[str], list[str], list[list[str]]]:
    srcs, refs, _ = read_m2(FIX / "cherrant_demo.ref.m2.char")
    hyps = (FIX / "cherrant_demo.hyp").read_text(encoding="utf-8").split("\n")
    assert len(srcs) == len(hyps) == 20
    return srcs, hyps, refs


def perturbed_corpus(refs: list[str], seed: int = 0) -> list[str]:
    """Hypotheses made from the references by deleting, swapping and inserting characters."""
    rng = random.Random(seed)
    out = []
    for r in refs:
        t = list(r)
        for _ in range(rng.randint(0, 6)):
            k, op = rng.randrange(len(t)), rng.random()
            if op < 0.4 and len(t) > 3:
                del t[k]
            elif op < 0.7 and k + 1 < len(t):
                t[k], t[k + 1] = t[k + 1], t[k]
            else:
                t.insert(k, rng.choice("的了是在我不，。"))
        out.append("".join(t))
    return out


# ----------------------------------------------------------------------------- tokenisation


def test_gen_tokens_mixed() -> None:
    assert gen_tokens("我用GPU训练了3个BERT-base模型，ok!") == [
        "我", "用", "GPU", "训", "练", "了", "3", "个", "BERT", "-", "base", "模", "型", "，", "ok", "!"]
    assert gen_tokens("我 爱  北京") == gen_tokens("我爱北京") == ["我", "爱", "北", "京"]
    assert gen_tokens("ABC 1.5", lowercase=True) == ["abc", "1", ".", "5"]


# ----------------------------------------------------------------------------- BLEU, hand-computed


def test_bleu_brevity_penalty_only() -> None:
    # every n-gram of the hypothesis matches; 4 characters against 7: BP = exp(1 - 7/4)
    want = 100 * math.exp(1 - 7 / 4)
    assert bleu(["我爱北京"], ["我爱北京天安门"], 2) == pytest.approx(want, rel=1e-9)
    assert bleu(["我爱北京"], ["我爱北京天安门"], 4) == pytest.approx(want, rel=1e-9)


def test_bleu_partial_matches() -> None:
    # 猫在垫子上 vs 猫坐在垫子上: p1..p4 = 5/5, 3/4, 2/3, 1/2; BP = exp(1 - 6/5)
    bp = math.exp(1 - 6 / 5)
    assert bleu(["猫在垫子上"], ["猫坐在垫子上"], 4) == pytest.approx(100 * bp * (3 / 4 * 2 / 3 * 1 / 2) ** 0.25, rel=1e-9)
    assert bleu(["猫在垫子上"], ["猫坐在垫子上"], 2) == pytest.approx(100 * bp * (3 / 4) ** 0.5, rel=1e-9)


def test_bleu_exp_smoothing_of_zero_counts() -> None:
    # 甲乙丙丁 vs 甲乙丁丙: p1 = 4/4, p2 = 1/3, no 3-gram (of 2) nor 4-gram (of 1) matches: the k-th zero
    # precision becomes 1 / (2^k * total) (NIST / nltk method3), so p3 = 1/4, p4 = 1/4.
    assert bleu(["甲乙丙丁"], ["甲乙丁丙"], 4) == pytest.approx(100 * (1 / 3 * 1 / 4 * 1 / 4) ** 0.25, rel=1e-9)


def test_bleu_is_corpus_level() -> None:
    # counts are summed over sentences: p = 9/9, 6/7, 4/5, 2/3; lengths 9 vs 13
    got = bleu(["我爱北京", "猫在垫子上"], ["我爱北京天安门", "猫坐在垫子上"], 4)
    assert got == pytest.approx(100 * math.exp(1 - 13 / 9) * (6 / 7 * 4 / 5 * 2 / 3) ** 0.25, rel=1e-9)


def test_bleu_multi_reference_and_edge_cases() -> None:
    assert bleu(["我爱北京"], [["我爱上海", "我爱北京"]], 4) == pytest.approx(100.0)
    assert bleu(["我爱北京", "你好"], [["我爱上海", "我爱北京"], ["你好"]], 2) == pytest.approx(100.0)
    # no hypothesis has a 4-gram: BLEU-4 is 0 (sacrebleu; nltk differs, see test_bleu_matches_nltk_method3)
    assert bleu(["我"], ["我们"], 4) == 0.0
    assert bleu([], [], 4) == 0.0
    with pytest.raises(ValueError, match="differ in length"):
        bleu(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="unknown lang"):
        bleu(["a"], ["a"], lang="fr")


def test_bleu_english_word_level() -> None:
    # 13a splits the final period: 6 of 6 unigrams ... 3 of 3 4-grams match, 6 tokens against 7
    assert bleu(["the cat sat on the mat"], ["the cat sat on the mat ."], 4, lang="en") == pytest.approx(
        100 * math.exp(1 - 7 / 6), rel=1e-9)


# ----------------------------------------------------------------------------- ROUGE-L, hand-computed


def test_rouge_l_hand_computed() -> None:
    assert rouge_l(["我爱北京"], ["我在北京"]) == pytest.approx(75.0)  # LCS 我北京: P = R = 3/4
    # LCS 2 (我爱 or 北京): P = 2/4, R = 2/7, F1 = 4/11; the corpus score is the mean of sentence F1s
    assert rouge_l(["北京我爱"], ["我爱北京天安门"]) == pytest.approx(400 / 11)
    assert rouge_l(["我爱北京", "北京我爱"], ["我在北京", "我爱北京天安门"]) == pytest.approx((75 + 400 / 11) / 2)
    assert rouge_l([""], ["我"]) == 0.0
    assert rouge_l(["我爱北京"], [["我在上海", "我在北京"]]) == pytest.approx(75.0)  # best reference
    # English: rouge-score's tokeniser lower-cases; P = 3/3, R = 3/4
    assert rouge_l(["The cat sat"], ["the cat sat down"], lang="en") == pytest.approx(100 * 6 / 7)


# ----------------------------------------------------------------------------- cross-checks


def _nltk_bleu(hyps: list[str], refs: list[str], n: int) -> float:
    from nltk.translate.bleu_score import SmoothingFunction, corpus_bleu

    return 100 * corpus_bleu([[gen_tokens(r)] for r in refs], [gen_tokens(h) for h in hyps], weights=(1 / n,) * n,
                             smoothing_function=SmoothingFunction().method3)


def test_bleu_matches_nltk_method3(demo) -> None:
    """nltk corpus_bleu + method3 on the same tokens (what the public SkillNet-NLG code runs on characters)."""
    _, hyps, refs = demo
    first = [r[0] for r in refs]
    noisy = perturbed_corpus(first)
    for h, r in ((hyps, first), (noisy, first)):
        assert all(len(gen_tokens(x)) >= 4 for x in h)
        for n in (2, 4):
            assert bleu(h, r, n) == pytest.approx(_nltk_bleu(h, r, n), rel=1e-9, abs=1e-9)


def test_bleu_nltk_difference_on_short_hypotheses(demo) -> None:
    """nltk counts max(1, #n-grams) per hypothesis, so a hypothesis shorter than n adds 1 to the corpus
    total of n-grams; sacrebleu adds 0. Adding those ones to sacrebleu's totals reproduces nltk exactly."""
    from sacrebleu.metrics import BLEU

    _, hyps, refs = demo
    first = [r[0] for r in refs]
    short = [h[:k] for h, k in zip(perturbed_corpus(first, seed=1), [1, 2, 3] * 7)]
    assert bleu(short, first, 4) != pytest.approx(_nltk_bleu(short, first, 4), rel=1e-6)
    stats = BLEU(tokenize="none", max_ngram_order=4).corpus_score([" ".join(gen_tokens(h)) for h in short],
                                                                 [[" ".join(gen_tokens(r)) for r in first]])
    totals = [t + sum(len(gen_tokens(h)) < k for h in short) for k, t in enumerate(stats.totals, 1)]
    redone = BLEU.compute_bleu(list(stats.counts), totals, stats.sys_len, stats.ref_len, smooth_method="exp",
                               max_ngram_order=4)
    assert redone.score == pytest.approx(_nltk_bleu(short, first, 4), rel=1e-9)


def test_bleu_matches_sacrebleu_tokenisers(demo) -> None:
    """Our tokens agree with sacrebleu's `char` on text without ASCII runs and with its `zh` tokeniser on
    Chinese with Latin words; they differ where `zh` applies 13a inside Latin text (GPT-4, 3.5)."""
    from sacrebleu.metrics import BLEU

    _, hyps, refs = demo
    first = [r[0] for r in refs]
    noisy = perturbed_corpus(first)
    no_ascii = [(h, r) for h, r in zip(noisy, first) if not re.search("[A-Za-z0-9]", h + r)]
    assert len(no_ascii) >= 15
    h, r = map(list, zip(*no_ascii))
    for n in (2, 4):
        assert bleu(h, r, n) == pytest.approx(BLEU(tokenize="char", max_ngram_order=n).corpus_score(h, [r]).score)
        assert bleu(hyps, first, n) == pytest.approx(BLEU(tokenize="zh", max_ngram_order=n).corpus_score(hyps, [first]).score)
    mixed_h = ["我们用BERT模型做了实验", "这个GPU很快", "他说hello world然后走了"]
    mixed_r = ["我们用BERT模型做实验", "这块GPU非常快", "他说hello然后离开了"]
    want = BLEU(tokenize="zh").corpus_score(mixed_h, [mixed_r]).score
    assert bleu(mixed_h, mixed_r) == pytest.approx(want)
    assert bleu(["我用GPT-4算了3.5元"], ["我用GPT-4算了3.5元钱"]) != pytest.approx(
        BLEU(tokenize="zh").corpus_score(["我用GPT-4算了3.5元"], [["我用GPT-4算了3.5元钱"]]).score)


def test_rouge_l_matches_rouge_chinese(demo) -> None:
    """rouge-chinese on space-separated tokens: the same LCS F1, up to its 1e-8 in the denominator."""
    from rouge_chinese import Rouge

    _, hyps, refs = demo
    first = [r[0] for r in refs]
    for h in (hyps, perturbed_corpus(first)):
        theirs = Rouge(metrics=["rouge-l"]).get_scores([" ".join(gen_tokens(x)) for x in h],
                                                       [" ".join(gen_tokens(x)) for x in first], avg=True)
        assert rouge_l(h, first) == pytest.approx(100 * theirs["rouge-l"]["f"], abs=1e-4)


# ----------------------------------------------------------------------------- correction F0.5


def test_char_edits_hand_computed() -> None:
    """Edits derived by hand from ChERRANT's rules (the official extractor gives the same for each)."""
    assert char_edits("我朋唷打算", "我朋友打算") == Counter({(2, 3, "友"): 1})
    assert char_edits("我去北京", "我要去北京") == Counter({(1, 1, "要"): 1})
    # a character that matches always takes the cell, so of 我我 the first one is the deleted one
    assert char_edits("我我们去", "我们去") == Counter({(0, 1, ""): 1})
    # a swapped pair is one transposition edit; a block moved past a match is merged into one edit (D M I)
    assert char_edits("泰国人死爱的味道", "泰国人爱死的味道") == Counter({(3, 5, "爱死"): 1})
    assert char_edits("旅游去陌生的地方", "去陌生的地方旅游") == Counter({(0, 8, "去陌生的地方旅游"): 1})
    # a transposition (cost 1) is its own edit, not merged with the substitution next to it
    assert char_edits("我爱他们", "爱我她们") == Counter({(0, 2, "爱我"): 1, (2, 3, "她"): 1})
    assert char_edits("一二三", "") == Counter({(0, 3, ""): 1})
    assert char_edits("我 爱 北京", "我爱北京") == Counter()  # whitespace is removed first


def test_char_edits_are_a_fresh_counter_at_every_call() -> None:
    """The edits are cached (a split's reference edits are the same at every evaluation): a caller that
    changes what it got must not change what the next caller gets."""
    first = char_edits("我朋唷打算", "我朋友打算")
    first[(0, 1, "x")] += 5
    del first[(2, 3, "友")]
    assert char_edits("我朋唷打算", "我朋友打算") == Counter({(2, 3, "友"): 1})
    assert char_edits(" 我朋唷打算", "我朋友 打算") == Counter({(2, 3, "友"): 1})  # the same key once spaces go


def test_correction_prf_hand_computed() -> None:
    src = "我朋唷打算去法国"
    ref = "我朋友打算去法国"
    # right fix (TP), no fix (FN), right fix + a wrong one (TP + FP)
    hyps = ["我朋友打算去法国", src, "我朋友打算到法国"]
    got = correction_prf([src] * 3, hyps, [ref] * 3)
    assert (got["tp"], got["fp"], got["fn"]) == (2, 1, 1)
    assert got["precision"] == pytest.approx(200 / 3) and got["recall"] == pytest.approx(200 / 3)
    assert got["f"] == pytest.approx(200 / 3)
    one = correction_prf([src], [hyps[2]], [ref])  # P = 1/2, R = 1: F0.5 = 1.25 * .5 / (.25 * .5 + 1)
    assert one["f"] == pytest.approx(100 * 1.25 * 0.5 / 1.125)
    # ChERRANT's conventions: no proposed edit -> precision 1; nothing to fix and nothing fixed -> F 1
    none = correction_prf([src], [src], [ref])
    assert (none["precision"], none["recall"], none["f"]) == (100.0, 0.0, 0.0)
    assert correction_prf([ref], [ref], [ref])["f"] == 100.0
    # several references: the one that fits the hypothesis best is used
    multi = correction_prf([src], ["我朋友打算到法国"], [["我朋友打算去法国", "我朋友打算到法国"]])
    assert (multi["tp"], multi["fp"], multi["fn"]) == (2, 0, 0)


def test_char_edits_match_official_cherrant_edits() -> None:
    """Per sentence, the edits equal those the official ChERRANT extractor wrote into its M2 files
    (the reference file shipped with ChERRANT, the hypothesis file made as fixtures/gen/README.md says)."""
    srcs, refs, ref_edits = read_m2(FIX / "cherrant_demo.ref.m2.char")
    hyp_srcs, hyps, hyp_edits = read_m2(FIX / "cherrant_demo.hyp.m2.char")
    assert hyp_srcs == srcs
    n_edits = 0
    for i, src in enumerate(srcs):
        assert char_edits(src, hyps[i][0]) == hyp_edits[i].get(0, Counter()), i
        for k, ref in enumerate(refs[i]):
            assert char_edits(src, ref) == ref_edits[i].get(k, Counter()), (i, k)
            n_edits += sum(ref_edits[i].get(k, Counter()).values())
    assert n_edits > 40


def test_correction_prf_matches_official_cherrant_score(demo) -> None:
    """compare_m2_for_evaluation.py on these files: TP 8, FP 20, FN 35, P 0.2857, R 0.186, F0.5 0.2581."""
    srcs, hyps, refs = demo
    got = correction_prf(srcs, hyps, refs)
    assert (got["tp"], got["fp"], got["fn"]) == (8, 20, 35)
    assert round(got["precision"] / 100, 4) == 0.2857
    assert round(got["recall"] / 100, 4) == 0.186
    assert round(got["f"] / 100, 4) == 0.2581


# ----------------------------------------------------------------------------- entry point


def test_score_generation(demo) -> None:
    srcs, hyps, refs = demo
    got = score_generation(list(GEN_METRICS), srcs, hyps, refs)
    assert list(got) == list(GEN_METRICS)
    assert got["bleu_4"] == pytest.approx(bleu(hyps, refs, 4))
    assert got["rouge_l"] == pytest.approx(rouge_l(hyps, refs))
    assert got["f0.5"] == pytest.approx(correction_prf(srcs, hyps, refs)["f"])
    assert score_generation(["bleu_2"], None, ["我爱北京"], ["我爱北京"]) == {"bleu_2": pytest.approx(100.0)}
    with pytest.raises(ValueError, match="unknown generation metric"):
        score_generation(["bleu"], None, ["a"], ["a"])
    with pytest.raises(ValueError, match="need the source sentences"):
        score_generation(["f0.5"], None, ["a"], ["a"])
    with pytest.raises(ValueError, match="differ in length"):
        score_generation(["f0.5"], ["a", "b"], ["a"], ["a"])


def test_score_generation_lowercase_compares_every_metric_case_insensitively():
    from skillnet.finetune.gen_metrics import score_generation

    names = ["rouge_l", "bleu_2", "f0.5"]
    src, hyp, ref = ["我用Medicare保险"], ["我用medicare保验"], ["我用Medicare保验"]
    low = score_generation(names, [s.lower() for s in src], hyp, [r.lower() for r in ref])
    assert score_generation(names, src, hyp, ref, lowercase=True) == low
    # without it, the lower-cased hypothesis loses the word and counts a spurious edit
    raw = score_generation(names, src, hyp, ref)
    assert raw["rouge_l"] < low["rouge_l"] and raw["f0.5"] < low["f0.5"]


def test_distinct_share_and_repetition_rate_by_hand() -> None:
    from skillnet.finetune.gen_metrics import distinct_share, repetition_rate, score_generation

    assert distinct_share(["医疗保险？"] * 4) == 25.0
    assert distinct_share(["甲", "乙", "甲", "丙"]) == 75.0
    # "我们们们们们": 4-grams 我们们们, 们们们们, 们们们们, 们们们们 -> 2 of 4 repeat an earlier one
    assert repetition_rate(["我们们们们们们"]) == 50.0
    assert repetition_rate(["今天天气很好"]) == 0.0
    assert repetition_rate(["短"]) == 0.0  # no 4-gram
    out = score_generation(["distinct", "repetition"], None, ["a b", "a b"], ["x", "y"])
    assert out == {"distinct": 50.0, "repetition": 0.0}


def test_edit_distance_equals_nltk_per_pair() -> None:
    """The bit-vector edit distance against nltk's dynamic programme, pair by pair: empty sides, unrelated
    strings, near copies, and lengths past one machine word (the masks are Python ints of any width)."""
    import nltk
    from skillnet.finetune.gen_metrics import _levenshtein

    rng = random.Random(1)
    pairs = [("", ""), ("", "abc"), ("abc", ""), ("a", "a"), ("ab", "ba"), ("kitten", "sitting")]
    for _ in range(300):
        a = "".join(rng.choice("abcdeф我们") for _ in range(rng.randint(0, 150)))
        b = ("".join(rng.choice("abcdeф我们") for _ in range(rng.randint(0, 150))) if rng.random() < 0.5
             else "".join(c for c in a if rng.random() < 0.9) + a[: rng.randint(0, 5)])
        pairs.append((a, b))
    for a, b in pairs:
        assert _levenshtein(a, b) == nltk.edit_distance(a, b), (a, b)
        assert _levenshtein(list(b), list(a)) == nltk.edit_distance(a, b)


def test_char_accuracy_is_one_minus_the_character_error_rate_as_nltk_counts_it() -> None:
    import nltk
    from skillnet.finetune.gen_metrics import char_accuracy, score_generation

    # By hand: one wrong character of six, or one dropped, costs one sixth; a Latin run is one token.
    assert char_accuracy(["我今天很高心"], ["我今天很高兴"]) == pytest.approx(100 * 5 / 6)
    assert char_accuracy(["我今天很高"], ["我今天很高兴"]) == pytest.approx(100 * 5 / 6)
    assert char_accuracy(["买了abc"], ["买了abd"]) == pytest.approx(100 * 2 / 3)
    assert char_accuracy(["完全不同的一句很长的话"], ["短"]) == 0.0  # clipped at 0
    assert char_accuracy(["甲乙", "丙"], [["丁乙", "甲乙"], "丙"]) == 100.0  # the closest reference
    # Against nltk's edit distance, over outputs that drop, add and swap characters of their reference.
    rng = random.Random(0)
    alphabet = "我们的是不了人在有他这中大来上国个到说，。"
    hyps, refs = [], []
    for _ in range(200):
        ref = [rng.choice(alphabet) for _ in range(rng.randint(1, 30))]
        hyp = list(ref)
        for _ in range(rng.randint(0, 4)):
            i = rng.randrange(len(hyp) + 1)
            op = rng.choice("dis")
            if op == "d" and i < len(hyp):
                del hyp[i]
            elif op == "i":
                hyp.insert(i, rng.choice(alphabet))
            elif i < len(hyp):
                hyp[i] = rng.choice(alphabet)
        hyps.append("".join(hyp))
        refs.append("".join(ref))
    errors = sum(nltk.edit_distance(h, r) for h, r in zip(hyps, refs))
    want = 100 * (1 - errors / sum(map(len, refs)))
    assert 50 < want < 100 and char_accuracy(hyps, refs) == pytest.approx(want)
    assert score_generation(["char_accuracy"], None, hyps, refs) == {"char_accuracy": pytest.approx(want)}


def _op_table_by_sorting(src: str, tgt: str) -> list[list[tuple[str, ...]]]:
    """The operation table with its transposition test written plainly (sorted windows at every step): the
    reference that the incremental character counts of ``_op_table`` must reproduce cell for cell."""
    from skillnet.finetune.edit_metrics import _SUB_COST, _UNIT, _is_punct

    def sub_cost(a: str, b: str) -> int:  # per pair, as ChERRANT charges it
        return _SUB_COST[_is_punct(a) + _is_punct(b)]

    n, m = len(src), len(tgt)
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    ops: list[list[tuple[str, ...]]] = [[()] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        cost[i][0], ops[i][0] = i * _UNIT, ("D",)
    for j in range(1, m + 1):
        cost[0][j], ops[0][j] = j * _UNIT, ("I",)
    for i in range(n):
        for j in range(m):
            if src[i] == tgt[j]:
                cost[i + 1][j + 1], ops[i + 1][j + 1] = cost[i][j], ("M",)
                continue
            trans, k = float("inf"), 1
            while i - k >= 0 and j - k >= 0 and cost[i - k + 1][j - k + 1] != cost[i - k][j - k]:
                if sorted(src[i - k:i + 1]) == sorted(tgt[j - k:j + 1]):
                    trans = cost[i - k][j - k] + k * _UNIT
                    break
                k += 1
            cands = ((f"T{k + 1}", trans), ("S", cost[i][j] + sub_cost(src[i], tgt[j])),
                     ("I", cost[i + 1][j] + _UNIT), ("D", cost[i][j + 1] + _UNIT))
            best = min(c for _, c in cands)
            cost[i + 1][j + 1] = int(best)
            ops[i + 1][j + 1] = tuple(name for name, c in cands if c == best)
    return ops


def test_op_table_equals_the_sorted_window_transposition_test() -> None:
    from skillnet.finetune.edit_metrics import _op_table

    rng = random.Random(0)
    pairs = [("泰国人死爱的味道", "泰国人爱死的味道"), ("旅游去陌生的地方", "去陌生的地方旅游"), ("我爱他们", "爱我她们")]
    for _ in range(300):  # small alphabets: many ties, repeats and transpositions
        alphabet = "我你他的了是在有" if rng.random() < 0.5 else "ab"
        a = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 14)))
        b = list(a)
        for _ in range(rng.randint(0, 4)):
            if b and rng.random() < 0.5:
                x, y = rng.randrange(len(b)), rng.randrange(len(b))
                b[x], b[y] = b[y], b[x]
            else:
                b.insert(rng.randint(0, len(b)), rng.choice(alphabet))
        pairs.append((a, "".join(b)))
    pairs.append(("的" * 40 + "我们", "了的" * 30))  # an untrained model's repetition
    for a, b in pairs:
        assert _op_table(a, b) == _op_table_by_sorting(a, b), (a, b)
