"""A task prefix never cuts the source: ``max_seq_len`` bounds the source, the prefix comes on top."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.finetune.config import ConfigError, FinetuneConfig
from skillnet.finetune.task_types import codec_for


def _td(max_len: int, prefix: str) -> SimpleNamespace:
    return SimpleNamespace(tok=load_tokenizer(), max_len=max_len,
                           cfg=SimpleNamespace(source_prefix=prefix, max_target_len=16))


def test_the_prefix_does_not_eat_the_source_budget() -> None:
    td = _td(10, "csc: ")
    src = "今天天气很好我们"  # 8 characters = max_seq_len - 2
    feats, truncated = codec_for("generation").encode(td, [{"source": src, "target": src}], "train")
    ids = feats[0].input_ids
    tok = td.tok
    assert tok.decode(ids[-9:-1]).replace(" ", "") == src  # the whole source, just before [SEP]
    assert truncated == 0
    # A source longer than the budget is cut, and counted.
    feats, truncated = codec_for("generation").encode(td, [{"source": src + "啊", "target": src}], "train")
    assert truncated == 1 and tok.decode(feats[0].input_ids[-9:-1]).replace(" ", "") == src


def test_config_refuses_a_prefix_that_overflows_the_positions(tmp_path) -> None:
    spec = {"model": {"arch": "bart", "preset": "tiny"},
            "tasks": [{"name": "csc", "type": "generation", "max_seq_len": 126, "prefix": "correct: ", "skills": ["non_open_end"],
                       "train": str(tmp_path / "train.jsonl")}],
            "train": {"max_steps": 1}, "output_dir": str(tmp_path / "out")}
    (tmp_path / "train.jsonl").write_text('{"source": "a", "target": "a"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match="prefix"):
        FinetuneConfig.from_dict(spec, base_dir=str(tmp_path)).check_model()
