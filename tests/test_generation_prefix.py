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


@pytest.mark.parametrize("beams", [1, 3])
def test_decoding_never_emits_unk(beams: int) -> None:
    """[UNK] stands for every character outside the vocab (on classical poems, more often than any single
    character): a small model's most likely token, and never a character of the reference. Decoding
    suppresses it, greedy and beam alike."""
    import torch
    from skillnet.model import SkillNetBartConfig, SkillNetBartForConditionalGeneration

    tok = load_tokenizer()
    torch.manual_seed(0)
    cfg = SkillNetBartConfig.preset("tiny")
    model = SkillNetBartForConditionalGeneration(cfg).eval()
    model.final_logits_bias[0, tok.unk_id] = 50.0  # [UNK] is by far the most likely token everywhere
    task = next(iter(cfg.tasks))
    td = SimpleNamespace(tok=tok, name=task, cfg=SimpleNamespace(num_beams=beams, max_target_len=8),
                         decode_text=lambda ids: ids)
    src = torch.tensor([[tok.cls_id, 791, 1921, tok.sep_id]])
    batch = {"input_ids": src, "attention_mask": torch.ones_like(src)}
    with torch.no_grad():
        out = codec_for("generation").decode(td, model, [], batch)
        plain = model.generate(**batch, task=task, num_beams=beams, max_new_tokens=8)
    assert tok.unk_id in plain[0].tolist()  # the bias works: without suppression [UNK] comes out
    assert len(out[0]) > 2 and tok.unk_id not in out[0]
