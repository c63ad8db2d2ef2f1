"""SkillNet-BART: config, equivalence with a dense HF BART, HF `generate`, skills fixed per task during
generation, sparse updates, save/load and surgery. Random tiny models, CPU fp32, no downloads."""

from __future__ import annotations

import itertools
import json
import math
import random

import pytest
import torch
from skillnet.model import (
    BART_PRESETS,
    NLG_TASKS,
    SkillNetBartConfig,
    SkillNetBartForConditionalGeneration,
    SkillNetBartModel,
    activated_parameters,
    add_skill,
    count_parameters,
    export_skill,
    freeze_skills,
    import_skill,
    skill_parameters,
    skillnet_bart_from_dense,
    trainable_activated_parameters,
)
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSeq2SeqLM,
    BartConfig,
    BartForConditionalGeneration,
)

PAD, BOS, EOS = 0, 101, 102
VOCAB = 128
TASK_A, TASK_B = "text_summarization", "dialogue_generation"  # non_open_end+general / 4 skills


def _dense_config(**kw) -> BartConfig:
    base = dict(
        vocab_size=VOCAB, d_model=32, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=48, max_position_embeddings=64,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=EOS,
        forced_eos_token_id=EOS, dropout=0.1, scale_embedding=True,
        init_std=0.3,  # large enough that random models generate varied, input-dependent text
    )
    return BartConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def dense() -> BartForConditionalGeneration:
    torch.manual_seed(0)
    m = BartForConditionalGeneration(_dense_config()).eval()
    with torch.no_grad():
        # Not HF's init values (bias 0, LayerNorm identity), so a bias or LayerNorm lost on the way shows.
        m.final_logits_bias.normal_(0, 0.5)
        for mod in m.modules():
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.normal_(1.0, 0.2)
                mod.bias.normal_(0.0, 0.2)
    return m


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three inputs of lengths 9, 6 and 4, right-padded as a tokenizer does, and decoder inputs."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 100, (3, 9), generator=g)
    mask = torch.ones_like(x)
    for row, n in ((1, 6), (2, 4)):
        x[row, n:], mask[row, n:] = PAD, 0
    y = torch.cat([torch.full((3, 1), EOS), torch.randint(1, 100, (3, 6), generator=g)], 1)
    return x, mask, y


def _random_skillnet(**kw) -> SkillNetBartForConditionalGeneration:
    """A SkillNet-BART whose skills all differ (random init), so the skill choice changes the output."""
    torch.manual_seed(2)
    cfg = SkillNetBartConfig(**{**_dense_config().to_dict(), "skill_layers": "all", **kw})
    return SkillNetBartForConditionalGeneration(cfg).eval()


def _strip(seq: torch.Tensor) -> list[int]:
    ids = seq.tolist()
    while ids and ids[-1] == PAD:
        ids.pop()
    return ids


# ---- config ------------------------------------------------------------------------------------------
def test_config_defaults_follow_nlg_tables_1_and_2():
    c = SkillNetBartConfig.preset("tiny")
    assert c.model_type == "skillnet-bart"
    assert c.skill_names == [
        "open_end", "non_open_end", "conversation", "data_to_text", "question", "general"
    ]
    assert c.generic_skill == "general"
    assert c.task_skill_names("dialogue_generation") == ["open_end", "conversation", "question", "general"]
    assert c.skill_ids("text_summarization") == [1, 5]
    assert c.skill_ids("advertisement_generation") == [0, 3, 5]
    assert len(c.tasks) == 8 and set(c.tasks) == set(NLG_TASKS)
    # bert-base-chinese vocab and special tokens, as the public SkillNet-NLG code.
    for name in ("tiny", "small"):
        p = SkillNetBartConfig.preset(name)
        assert (p.vocab_size, p.pad_token_id, p.bos_token_id, p.eos_token_id) == (21128, 0, 101, 102)
        assert p.decoder_start_token_id == 102 and p.forced_eos_token_id == 102
    assert SkillNetBartConfig.preset("small").d_model == 256
    # Skills in layers 0, 2, 4, ... of both stacks (the public code's i % 2 == 0).
    c6 = SkillNetBartConfig.preset("tiny", encoder_layers=6, decoder_layers=5)
    assert c6.encoder_skill_layer_ids() == [0, 2, 4] and c6.decoder_skill_layer_ids() == [0, 2, 4]


def test_config_round_trips_through_json(tmp_path):
    c = SkillNetBartConfig.preset(
        "tiny", skill_layers=[1], decoder_skill_layers="all", skill_layernorm="per_skill", ffn_impl="loop"
    )
    c.add_skill("poetry", "classical poems")
    c.set_task("poem_generation", ["open_end", "poetry"])
    c.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "skillnet-bart"
    assert saved["tasks"]["poem_generation"] == ["open_end", "poetry"]
    d = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(d, SkillNetBartConfig)
    for key in ("skills", "tasks", "generic_skill", "skill_layers", "decoder_skill_layers", "skill_layernorm",
                "ffn_impl", "d_model", "vocab_size", "decoder_start_token_id"):
        assert getattr(d, key) == getattr(c, key), key
    assert d.encoder_skill_layer_ids() == [1] and d.decoder_skill_layer_ids() == [0, 1]
    assert d.skill_ids("poem_generation") == [0, 5, 6]
    # Built from a dense BART's dict (which says model_type="bart"), it is still a SkillNet-BART config.
    assert SkillNetBartConfig(**_dense_config().to_dict()).model_type == "skillnet-bart"


def test_config_errors_name_the_key_and_the_valid_values():
    with pytest.raises(KeyError, match="unknown skill 'humour' in task 'jokes'; valid skills: open_end"):
        SkillNetBartConfig.preset("tiny", tasks={"jokes": ["humour"]})
    with pytest.raises(KeyError, match="generic_skill"):
        SkillNetBartConfig.preset("tiny", generic_skill="s7")
    with pytest.raises(ValueError, match="skill_layers='every_third'"):
        SkillNetBartConfig.preset("tiny", skill_layers="every_third")
    with pytest.raises(ValueError, match=r"skill_layers=\[0, 7\].*0\.\.1"):
        SkillNetBartConfig.preset("tiny", skill_layers=[0, 7])
    with pytest.raises(ValueError, match="decoder_skill_layers='top:3'"):
        SkillNetBartConfig.preset("tiny", decoder_skill_layers="top:3")
    with pytest.raises(ValueError, match="skill_layernorm"):
        SkillNetBartConfig.preset("tiny", skill_layernorm="pre")
    with pytest.raises(KeyError, match="valid presets: tiny, small, base, large"):
        SkillNetBartConfig.preset("huge")
    c = SkillNetBartConfig.preset("tiny")
    with pytest.raises(KeyError, match="valid tasks: text_summarization"):
        c.skill_ids("summarisation")
    with pytest.raises(ValueError, match="already exists"):
        c.add_skill("general")


@pytest.mark.parametrize(
    "spec,decoder_spec,enc,dec",
    [
        ("every_other", None, [0, 2], [0, 2]),
        ("all", None, [0, 1, 2], [0, 1, 2]),
        ([1], None, [1], [1]),
        ("top:1", [0, 1], [2], [0, 1]),
    ],
)
def test_skill_layer_specs_build_the_right_layers(spec, decoder_spec, enc, dec):
    cfg = SkillNetBartConfig(
        **_dense_config().to_dict(), skill_layers=spec, decoder_skill_layers=decoder_spec
    )
    m = SkillNetBartModel(cfg)
    for layers, expected in ((m.encoder.layers, enc), (m.decoder.layers, dec)):
        assert [layer.has_skills for layer in layers] == [i in expected for i in range(3)]
        for i, layer in enumerate(layers):
            # Dense layers keep HF's names; skill layers have the bank instead.
            assert hasattr(layer, "fc1") == (i not in expected) == (not hasattr(layer, "skill_ffn"))


# ---- equivalence with the dense model -----------------------------------------------------------------
@pytest.mark.parametrize(
    "skill_layernorm,skill_layers,ffn_impl",
    [
        ("shared", "every_other", "fused"),
        ("shared", "all", "loop"),
        ("shared", [1, 2], "fused"),
        ("per_skill", "all", "fused"),
        ("per_skill", "every_other", "loop"),
    ],
)
@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
def test_any_skill_set_reproduces_dense_logits(dense, batch, skill_layernorm, skill_layers, ffn_impl):
    x, mask, y = batch
    sk = skillnet_bart_from_dense(
        dense, skill_layernorm=skill_layernorm, skill_layers=skill_layers, ffn_impl=ffn_impl
    ).eval()
    assert isinstance(sk, SkillNetBartForConditionalGeneration) and sk.config.num_skills == 6
    assert any(layer.has_skills for layer in sk.model.decoder.layers)
    with torch.no_grad():
        ref = dense(input_ids=x, attention_mask=mask, decoder_input_ids=y)
        sets = [list(c) for k in (1, 2, 3, 4, 6) for c in itertools.combinations(range(6), k)]
        for ids in random.Random(0).sample(sets, 8):
            out = sk(input_ids=x, attention_mask=mask, decoder_input_ids=y, skill_ids=ids)
            assert (out.logits - ref.logits).abs().max().item() < 1e-4, ids
            diff = out.encoder_last_hidden_state - ref.encoder_last_hidden_state
            assert diff.abs().max().item() < 1e-4
        # A mixed-task batch: by name per row, and as a -1 padded [B, k] id matrix.
        tasks = [TASK_B, TASK_A, "story_generation"]
        out = sk(input_ids=x, attention_mask=mask, decoder_input_ids=y, task=tasks)
        assert (out.logits - ref.logits).abs().max().item() < 1e-4
        rows = torch.tensor([[0, 5, -1, -1], [1, 2, 3, 4], [5, -1, -1, -1]])
        out = sk(input_ids=x, attention_mask=mask, decoder_input_ids=y, skill_ids=rows)
        assert (out.logits - ref.logits).abs().max().item() < 1e-4


def test_labels_give_the_dense_loss(dense, batch):
    x, mask, y = batch
    labels = y[:, 1:].clone()
    labels[2, 3:] = -100
    sk = skillnet_bart_from_dense(dense).eval()
    with torch.no_grad():
        ref = dense(input_ids=x, attention_mask=mask, labels=labels).loss
        out = sk(input_ids=x, attention_mask=mask, labels=labels, task=TASK_B).loss
    assert abs(out.item() - ref.item()) < 1e-5


# ---- generate ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("skill_layernorm", ["shared", "per_skill"])
@pytest.mark.slow  # measured 25 and 12 s
def test_beam_search_equals_dense_token_for_token(dense, batch, skill_layernorm):
    x, mask, _ = batch
    sk = skillnet_bart_from_dense(dense, skill_layers="all", skill_layernorm=skill_layernorm).eval()
    # no_repeat_ngram_size=1 keeps a random model from repeating one token: the beams must really search.
    kw = dict(attention_mask=mask, max_new_tokens=12, no_repeat_ngram_size=1)
    ref = dense.generate(x, num_beams=4, early_stopping=True, **kw)  # SkillNet's defaults (Appendix C.1)
    assert ref.shape[1] == 13 and len({tuple(r) for r in ref.tolist()}) == 3
    rows = sk.skill_id_rows([TASK_A, TASK_B, TASK_A])
    for how in (dict(task=TASK_B), dict(task=[TASK_A, TASK_B, TASK_A]), dict(skill_ids=rows)):
        # 4 beams by default (Appendix C.1): no num_beams given here.
        out = sk.generate(x, **kw, **how)
        assert torch.equal(out, ref), how
    # A per-task length limit is an ordinary generate kwarg.
    kw["max_new_tokens"] = 3
    short = sk.generate(x, task=TASK_A, **kw)
    assert short.shape[1] == 4 and torch.equal(short, dense.generate(x, num_beams=4, early_stopping=True, **kw))


def _record_routings(model: SkillNetBartForConditionalGeneration) -> tuple[list, list]:
    """Routing seen by every skill layer at every call (encoder once, decoder once per step)."""
    enc, dec = [], []
    for stack, log in ((model.model.encoder, enc), (model.model.decoder, dec)):
        for layer in stack.layers:
            if layer.has_skills:
                layer.register_forward_pre_hook(
                    lambda mod, args, kwargs, log=log: log.append((args[0].shape[0], kwargs["routing"])),
                    with_kwargs=True,
                )
    return enc, dec


def _row_skills(batch_size: int, routing) -> list[tuple[int, ...]]:
    if routing.single:
        return [routing.groups[0].skill_ids] * batch_size
    out: list = [None] * batch_size
    for g in routing.groups:
        for r in g.rows.tolist():
            out[r] = g.skill_ids
    return out


@pytest.mark.slow  # measured 17 s
def test_skills_stay_fixed_per_row_through_beam_search(batch):
    x, mask, _ = batch
    sk = _random_skillnet()
    enc, dec = _record_routings(sk)
    tasks = [TASK_A, TASK_B, TASK_A]
    mixed = sk.generate(x, attention_mask=mask, max_new_tokens=8, task=tasks)
    want = [tuple(sk.config.skill_ids(t)) for t in tasks]
    assert enc and all(_row_skills(n, r) == want for n, r in enc)
    # HF expanded the [B, k] skill_ids with the inputs: beam j of row i has row i's skills, every step.
    assert len(dec) >= 8 * 3 and all(n == 12 for n, _ in dec)
    assert all(_row_skills(n, r) == [want[i // 4] for i in range(12)] for n, r in dec)
    # Each row is generated as if the whole batch had its task.
    alone = {t: sk.generate(x, attention_mask=mask, max_new_tokens=8, task=t) for t in set(tasks)}
    for i, t in enumerate(tasks):
        assert _strip(mixed[i]) == _strip(alone[t][i])
    assert any(_strip(alone[TASK_A][i]) != _strip(alone[TASK_B][i]) for i in range(3))


@pytest.mark.slow  # measured 24 s
def test_task_name_equals_its_skill_ids_and_other_skills_are_unused(batch):
    x, mask, _ = batch
    sk = _random_skillnet()
    kw = dict(attention_mask=mask, max_new_tokens=10, output_scores=True, return_dict_in_generate=True)
    by_name = sk.generate(x, task=TASK_A, **kw)
    ids = sk.config.skill_ids(TASK_A)
    for form in (ids, torch.tensor(ids), torch.tensor([ids] * 3)):
        assert torch.equal(sk.generate(x, skill_ids=form, **kw).sequences, by_name.sequences)
    # Skills TASK_A does not use take no part: scrambling them changes nothing, scrambling a used one does.
    unused = [s for s in sk.config.skill_names if s not in sk.config.task_skill_names(TASK_A)]
    with torch.no_grad():
        for name in unused:
            for p in skill_parameters(sk)[name]:
                p.normal_(0, 1.0)
    again = sk.generate(x, task=TASK_A, **kw)
    assert torch.equal(again.sequences, by_name.sequences)
    assert all(torch.equal(a, b) for a, b in zip(again.scores, by_name.scores))
    with torch.no_grad():
        for p in skill_parameters(sk)["non_open_end"]:
            p.normal_(0, 1.0)
    changed = sk.generate(x, task=TASK_A, **kw)
    assert not all(torch.equal(a, b) for a, b in zip(changed.scores, by_name.scores))


def test_skill_choice_errors_are_clear(batch):
    x, mask, y = batch
    sk = _random_skillnet()
    with pytest.raises(ValueError, match="exactly one of task="):
        sk(input_ids=x, decoder_input_ids=y)
    with pytest.raises(ValueError, match="2 rows, but the batch has 3"):
        sk(input_ids=x, decoder_input_ids=y, task=[TASK_A, TASK_B])
    with pytest.raises(ValueError, match=r"skill ids \[9\] out of range"):
        sk(input_ids=x, decoder_input_ids=y, skill_ids=[0, 9])
    with pytest.raises(KeyError, match="unknown task 'poetry'"):
        sk.generate(x, attention_mask=mask, max_new_tokens=2, task="poetry")
    with pytest.raises(ValueError, match="exactly one of task="):
        sk.generate(x, attention_mask=mask, max_new_tokens=2, task=[TASK_A] * 3, skill_ids=[0])


# ---- training ----------------------------------------------------------------------------------------
def test_sparse_update_leaves_unused_skills_untouched(batch):
    x, mask, y = batch
    sk = _random_skillnet(skill_layers="every_other", dropout=0.0)
    sk.train()
    before = {n: [p.detach().clone() for p in ps] for n, ps in skill_parameters(sk).items()}
    opt = torch.optim.AdamW(sk.parameters(), lr=1e-2, weight_decay=0.1)
    sk(input_ids=x, attention_mask=mask, labels=y[:, 1:].clone(), task=TASK_A).loss.backward()
    used = set(sk.config.task_skill_names(TASK_A))
    params = skill_parameters(sk)
    for name, ps in params.items():
        assert all((p.grad is not None) == (name in used) for p in ps), name
    opt.step()
    for name, ps in params.items():
        same = all(torch.equal(p, b) for p, b in zip(ps, before[name]))
        assert same == (name not in used), name


# ---- save / load -------------------------------------------------------------------------------------
def test_save_load_round_trip_and_auto_classes(tmp_path, batch):
    x, mask, y = batch
    sk = _random_skillnet(skill_layernorm="per_skill", skill_layers=[0, 2])
    sk.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "model.safetensors").exists()
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "m").eval()
    assert isinstance(loaded, SkillNetBartForConditionalGeneration)
    assert loaded.lm_head.weight is loaded.model.shared.weight
    assert loaded.generation_config.num_beams == 4
    a, b = sk.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with torch.no_grad():
        la = sk(input_ids=x, attention_mask=mask, decoder_input_ids=y, task=TASK_B).logits
        lb = loaded(input_ids=x, attention_mask=mask, decoder_input_ids=y, task=TASK_B).logits
    assert torch.equal(la, lb)
    assert isinstance(AutoModel.from_pretrained(tmp_path / "m"), SkillNetBartModel)


def test_from_dense_checkpoint_folder_and_partial_init(tmp_path, dense, batch):
    x, mask, y = batch
    dense.save_pretrained(tmp_path / "dense")
    sk = skillnet_bart_from_dense(tmp_path / "dense", init_skills=["non_open_end", "general"]).eval()
    assert sk.config.d_model == 32 and sk.config.decoder_ffn_dim == 48
    assert torch.equal(sk.final_logits_bias, dense.final_logits_bias)
    w = dense.model.decoder.layers[2].fc1.weight
    assert torch.equal(sk.model.decoder.layers[2].skill_ffn.skills[5].intermediate.dense.weight, w)
    assert not torch.equal(sk.model.decoder.layers[2].skill_ffn.skills[0].intermediate.dense.weight, w)
    with torch.no_grad():
        out = sk(input_ids=x, attention_mask=mask, decoder_input_ids=y, task=TASK_A).logits
        ref = dense(input_ids=x, attention_mask=mask, decoder_input_ids=y).logits
    assert (out - ref).abs().max().item() < 1e-4
    base = skillnet_bart_from_dense(dense.model, model_class=SkillNetBartModel)
    assert isinstance(base, SkillNetBartModel)
    with pytest.raises(ValueError, match="pass config="):
        skillnet_bart_from_dense(dense.state_dict())


# ---- surgery and counts ------------------------------------------------------------------------------
def test_parameter_counts_reproduce_nlg_table_6():
    """BART-large with the bert-base-chinese vocab, built on the meta device (no memory)."""
    with torch.device("meta"):
        dense = BartForConditionalGeneration(BartConfig(**BART_PRESETS["large"]))
        cfg = SkillNetBartConfig.preset("large", skill_layernorm="per_skill")
        sk = SkillNetBartForConditionalGeneration(cfg)
    assert round(sum(p.numel() for p in dense.parameters()) / 1e6, 2) == 376.46
    assert round(count_parameters(sk)["total"] / 1e6, 2) == 880.20
    table6 = {
        "text_summarization": 477.20, "advertisement_generation": 577.95, "question_answering": 577.95,
        "dialogue_generation": 678.70, "grammatical_error_correction": 477.20,
        "topic_to_essay_generation": 577.95, "paraphrase_generation": 477.20, "story_generation": 477.20,
    }
    for task, millions in table6.items():
        assert round(activated_parameters(sk, task) / 1e6, 2) == millions, task


def test_counts_by_hand_on_a_tiny_model():
    sk = _random_skillnet(skill_layers="every_other")
    c = sk.config
    d = c.d_model
    per_skill = 2 * (2 * d * c.encoder_ffn_dim + c.encoder_ffn_dim + d)  # encoder layers 0 and 2
    per_skill += 2 * (2 * d * c.decoder_ffn_dim + c.decoder_ffn_dim + d)
    counts = count_parameters(sk)
    assert counts["skills"] == {s: per_skill for s in c.skill_names}
    assert counts["heads"] == {}  # lm_head is the tied shared embedding
    assert counts["total"] == counts["shared"] + 6 * per_skill
    assert activated_parameters(sk, TASK_B) == counts["shared"] + 4 * per_skill


def test_add_freeze_export_import_skill_on_bart(tmp_path, batch):
    x, mask, y = batch
    sk = _random_skillnet(skill_layers="every_other")
    k = add_skill(sk, "poetry", description="classical poems", tasks=["story_generation"])
    assert k == 6 and sk.config.task_skill_names("story_generation") == ["open_end", "poetry", "general"]
    for g, p in zip(sk.model.skill_modules("general"), sk.model.skill_modules("poetry")):
        for a, b in zip(g.parameters(), p.parameters()):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    r = add_skill(sk, "random", init_from=None)
    first = sk.model.skill_modules("random")[0].intermediate.dense.weight
    old = sk.model.encoder.layers[0].skill_ffn.skills[:r]
    assert not any(torch.equal(first, s.intermediate.dense.weight) for s in old)
    freeze_skills(sk, [s for s in sk.config.skill_names if s != "poetry"])
    per_skill = count_parameters(sk)["skills"]["poetry"]
    total = activated_parameters(sk, "story_generation")
    assert trainable_activated_parameters(sk, "story_generation") == total - 2 * per_skill
    sk(input_ids=x, attention_mask=mask, labels=y[:, 1:].clone(), task="story_generation").loss.backward()
    assert all(p.grad is not None for p in skill_parameters(sk)["poetry"])
    assert all(p.grad is None for p in skill_parameters(sk)["open_end"])  # frozen

    out = export_skill(sk, "poetry", tmp_path / "poetry")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["skill_layers"] == ["encoder.0", "encoder.2", "decoder.0", "decoder.2"]
    other = _random_skillnet(skill_layers="every_other")
    import_skill(other, out)
    assert other.config.task_skill_names("story_generation")[-2:] == ["poetry", "general"]
    for a, b in zip(skill_parameters(sk)["poetry"], skill_parameters(other)["poetry"]):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="skill_layers"):
        import_skill(_random_skillnet(skill_layers="all"), out)


# ---- plain transformers ------------------------------------------------------------------------------
_REMOTE_LOADER = r"""
import importlib.util, sys
sys.meta_path[:] = [f for f in sys.meta_path if "skillnet" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if not p.startswith(REPO)]
assert importlib.util.find_spec("skillnet") is None and importlib.util.find_spec("model") is None
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
folder, ids_file, out_file = sys.argv[1:4]
x, mask, y = torch.load(ids_file)
m = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
tasks = ["text_summarization", "dialogue_generation", "text_summarization"]
with torch.no_grad():
    res = {"class": type(m).__name__,
           "logits": m(input_ids=x, attention_mask=mask, decoder_input_ids=y, task=tasks).logits,
           "gen": m.generate(x, attention_mask=mask, max_new_tokens=6, no_repeat_ngram_size=1, task=tasks),
           "tok": AutoTokenizer.from_pretrained(folder)("北京")["input_ids"],
           "modules": sorted({k for k in sys.modules if k.split(".")[0] in ("skillnet", "model")})}
torch.save(res, out_file)
"""


@pytest.mark.slow  # measured 16 s
def test_export_loads_in_plain_transformers_with_its_tokenizer(tmp_path, batch):
    """Surgery from a dense BART folder that has a tokenizer -> save -> a process without SkillNet loads it
    with trust_remote_code (AutoModelForSeq2SeqLM), reproduces logits and generation, and has the tokenizer."""
    import subprocess
    import sys
    from pathlib import Path

    from skillnet.data_prep.tokenizer import default_vocab_path
    from skillnet.model.hub import save_tokenizer

    from tests.fixtures.pretrain.helpers import subprocess_env

    x, mask, y = batch
    torch.manual_seed(3)
    dense = BartForConditionalGeneration(_dense_config())
    dense.save_pretrained(tmp_path / "dense")
    save_tokenizer(tmp_path / "dense", default_vocab_path())
    sk = skillnet_bart_from_dense(tmp_path / "dense").eval()
    sk.save_pretrained(tmp_path / "sk")
    cfg = json.loads((tmp_path / "sk" / "config.json").read_text())
    assert cfg["auto_map"]["AutoModelForSeq2SeqLM"] == "skillnet_bart.SkillNetBartForConditionalGeneration"
    torch.save((x, mask, y), tmp_path / "ids.pt")
    repo = str(Path(__file__).resolve().parents[1])
    (tmp_path / "load.py").write_text(f"REPO = {repo!r}\n" + _REMOTE_LOADER)
    r = subprocess.run(
        [sys.executable, str(tmp_path / "load.py"), str(tmp_path / "sk"), str(tmp_path / "ids.pt"),
         str(tmp_path / "o.pt")],
        cwd=tmp_path, capture_output=True, text=True, env={**subprocess_env(), "PYTHONPATH": ""}, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = torch.load(tmp_path / "o.pt")
    assert got["class"] == "SkillNetBartForConditionalGeneration" and got["modules"] == []
    tasks = [TASK_A, TASK_B, TASK_A]
    with torch.no_grad():
        torch.testing.assert_close(
            got["logits"], sk(input_ids=x, attention_mask=mask, decoder_input_ids=y, task=tasks).logits
        )
    ref = sk.generate(x, attention_mask=mask, max_new_tokens=6, no_repeat_ngram_size=1, task=tasks)
    assert torch.equal(got["gen"], ref)
    assert got["tok"] == [101, 1266, 776, 102]


# ---- activation dropout --------------------------------------------------------------------------------
def test_skill_layers_apply_barts_activation_dropout(batch):
    """BART's dropout between fc1 and fc2 runs in skill layers too: off in eval (the dense logits), on in
    training. Every layer is a skill layer and every other dropout is 0, so it is the only randomness."""
    x, mask, y = batch
    torch.manual_seed(4)
    dense = BartForConditionalGeneration(
        _dense_config(activation_dropout=0.4, dropout=0.0, attention_dropout=0.0)).eval()
    outs = {}
    for p in (0.4, 0.0):
        sk = skillnet_bart_from_dense(dense, skill_layers="all", activation_dropout=p).eval()
        assert all(b.activation_dropout == p for b in sk.skill_banks())
        with torch.no_grad():
            ref = dense(input_ids=x, attention_mask=mask, decoder_input_ids=y).logits
            ev = sk(input_ids=x, attention_mask=mask, decoder_input_ids=y, task=TASK_B).logits
            assert (ev - ref).abs().max().item() < 1e-4
            sk.train()
            outs[p] = [sk(input_ids=x, attention_mask=mask, decoder_input_ids=y, task=TASK_B).logits
                       for _ in range(2)]
        outs[p].append(ev)
    on, off = outs[0.4], outs[0.0]
    assert torch.equal(off[0], off[1]) and (off[0] - off[2]).abs().max().item() < 1e-5  # p = 0: no randomness
    assert not torch.equal(on[0], on[1]) and not torch.allclose(on[0], on[2], atol=1e-3)


# ---- dense joint (one skill) ---------------------------------------------------------------------------
def test_one_shared_skill_is_the_dense_bart(dense, batch):
    """The dense-joint baseline needs nothing new: one skill that every task uses, no generic skill."""
    x, mask, y = batch
    tasks = {t: ["shared"] for t in NLG_TASKS}
    sk = skillnet_bart_from_dense(
        dense, skills=[{"name": "shared"}], tasks=tasks, generic_skill=None, skill_layers="all"
    ).eval()
    assert sk.config.skill_names == ["shared"] and sk.config.task_skill_names(TASK_B) == ["shared"]
    with torch.no_grad():
        ref = dense(input_ids=x, attention_mask=mask, decoder_input_ids=y).logits
        out = sk(input_ids=x, attention_mask=mask, decoder_input_ids=y, task=[TASK_A, TASK_B, TASK_A]).logits
    assert (out - ref).abs().max().item() < 1e-4
    kw = dict(attention_mask=mask, max_new_tokens=8, no_repeat_ngram_size=1)
    assert torch.equal(sk.generate(x, task=TASK_B, **kw), dense.generate(x, num_beams=4, early_stopping=True, **kw))
    assert count_parameters(sk)["total"] == sum(p.numel() for p in dense.parameters())


# ---- MoE baseline (router "topk") ----------------------------------------------------------------------
def _moe(**kw) -> SkillNetBartForConditionalGeneration:
    torch.manual_seed(5)
    cfg = SkillNetBartConfig(**{**_dense_config(dropout=0.0).to_dict(), "router": "topk", **kw})
    return SkillNetBartForConditionalGeneration(cfg)


def _record_gates(model: SkillNetBartForConditionalGeneration) -> list[dict]:
    """Per call of every gated bank: stack, its input, the routing's token mask and the gate statistics."""
    log: list[dict] = []
    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(model.model, stack).layers):
            if not layer.has_skills:
                continue

            last: dict = {}

            def gate_hook(mod, args, out, last=last):
                last["g"] = out

            def hook(mod, args, out, stack=stack, i=i, last=last):
                g = last["g"]
                log.append({"stack": stack, "layer": i, "x": args[0].detach(), "mask": args[1].token_mask,
                            "stats": {"capacity": g.capacity, "dropped": g.dropped}, "aux": args[1].aux[-1],
                            "bank": mod})

            layer.skill_ffn.gate.register_forward_hook(gate_hook)
            layer.skill_ffn.register_forward_hook(hook)
    return log


def test_moe_bart_gates_every_skill_layer_and_adds_the_balancing_loss(batch):
    x, mask, y = batch
    m = _moe(moe_aux_loss_coef=0.5, moe_capacity_factor=100.0).train()
    assert [len(b.skills) for b in m.skill_banks()] == [6] * 4  # layers 0 and 2 of both stacks
    assert all(b.gate is not None and b.gate.top_k == 2 for b in m.skill_banks())
    labels = y[:, 1:].clone()
    labels[2, 3:] = -100
    log = _record_gates(m)
    out = m(input_ids=x, attention_mask=mask, labels=labels, task=TASK_A)
    # padding takes no part: the encoder's from its attention mask, the decoder's from the labels
    enc = [r for r in log if r["stack"] == "encoder"]
    dec = [r for r in log if r["stack"] == "decoder"]
    assert len(enc) == len(dec) == 2
    assert all(torch.equal(r["mask"], mask.bool()) for r in enc)
    assert all(torch.equal(r["mask"], labels != -100) for r in dec)
    per_layer = torch.stack([r["aux"] for r in log])
    torch.testing.assert_close(out.aux_losses["moe_balance"], per_layer.mean())
    assert out.metrics == {"aux_moe_balance": pytest.approx(float(per_layer.detach().mean()))}
    ce = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, ce + 0.5 * per_layer.mean())
    torch.testing.assert_close(out.aux_loss, 0.5 * per_layer.mean())
    out.loss.backward()
    for b in m.skill_banks():  # the gate of every layer learns (through the combine weights and the loss)
        assert b.gate.weight.grad is not None and b.gate.weight.grad.abs().sum() > 0
    # a step moves the gates
    before = [b.gate.weight.detach().clone() for b in m.skill_banks()]
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    assert all(not torch.equal(b.gate.weight, w) for b, w in zip(m.skill_banks(), before))


def test_moe_bart_padding_changes_nothing(batch):
    """Padded encoder tokens and padded decoder tokens (given by decoder_attention_mask) take no part in
    routing, capacity or the balancing loss: changing their ids changes neither the loss nor its parts."""
    x, mask, y = batch
    m = _moe(moe_capacity_factor=0.5).train()  # a capacity that drops: padding must not take any of it
    y_in, labels = y[:, :-1], y[:, 1:].clone()
    dec_mask = torch.ones_like(y_in)
    dec_mask[1, 4:] = 0
    labels[1, 4:] = -100
    kw = dict(attention_mask=mask, decoder_attention_mask=dec_mask, labels=labels, task=TASK_B)
    log = _record_gates(m)
    a = m(input_ids=x, decoder_input_ids=y_in, **kw)
    assert sum(r["stats"]["dropped"] for r in log) > 0
    x2, y2 = x.clone(), y_in.clone()
    x2[mask == 0] = 77
    y2[dec_mask == 0] = 66
    b = m(input_ids=x2, decoder_input_ids=y2, **kw)
    torch.testing.assert_close(a.loss, b.loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(a.aux_losses["moe_balance"], b.aux_losses["moe_balance"], atol=1e-6, rtol=0)
    # control: the same change at real tokens does move them
    x3 = x.clone()
    x3[0, 0] = 77
    assert not torch.allclose(m(input_ids=x3, decoder_input_ids=y_in, **kw).loss, a.loss)


def test_moe_bart_unused_experts_get_no_gradient(batch):
    """Few tokens, 6 experts, top-2: some experts go unchosen in a layer and must get an exactly zero (or
    no) gradient; the chosen ones learn."""
    x, mask, y = batch
    m = _moe(moe_capacity_factor=100.0).train()
    log = _record_gates(m)
    out = m(input_ids=x[:1, :2], labels=y[:1, 1:3], task=TASK_A)
    out.loss.backward()
    from skillnet.model.routers import top_k_gating

    unused = 0
    for r in log:
        bank = r["bank"]
        keep = None if r["mask"] is None else r["mask"].reshape(-1)
        g = top_k_gating(bank.gate.logits(r["x"].reshape(-1, r["x"].shape[-1])), 2, 100.0, keep)
        chosen = g.dispatch_NE.any(0)
        for e, skill in enumerate(bank.skills):
            grads = [p.grad for p in skill.parameters()]
            if chosen[e]:
                assert all(gr is not None for gr in grads) and any(gr.abs().sum() > 0 for gr in grads)
            else:
                unused += 1
                assert all(gr is None or not gr.any() for gr in grads), (r["stack"], r["layer"], e)
    assert unused >= 4  # 2 tokens x top-2 leave at least 2 of 6 experts idle in each of the 4 layers


@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
def test_moe_bart_generates_with_beam_search_routing_every_step(batch):
    """`generate` with the token gate: the decoder gates the one new token per beam at every step (a KV
    cache), in eval mode, and the default evaluation capacity (None) drops no token, so cached decoding
    equals decoding without a cache. With BERT's 2.0 the same decoding drops tokens."""
    x, mask, _ = batch
    m = _moe(skill_layers="all").eval()
    log = _record_gates(m)
    kw = dict(attention_mask=mask, max_new_tokens=8, no_repeat_ngram_size=1, num_beams=4)
    out = m.generate(x, task=[TASK_A, TASK_B, TASK_A], **kw)
    assert out.shape[0] == 3 and out.shape[1] > 2
    enc = [r for r in log if r["stack"] == "encoder"]
    dec = [r for r in log if r["stack"] == "decoder"]
    assert len(enc) == 3 and all(torch.equal(r["mask"], mask.bool()) for r in enc)  # once, padding excluded
    steps = len(dec) // 3
    assert steps >= out.shape[1] - 2 and all(r["x"].shape[:2] == (12, 1) for r in dec)  # 3 rows x 4 beams
    assert all(r["stats"]["dropped"] == 0 for r in log)
    assert all(r["stats"]["capacity"] == 12 for r in dec) and enc[0]["stats"]["capacity"] == int(mask.sum())
    no_cache = m.generate(x, use_cache=False, **kw)
    assert torch.equal(no_cache, out)
    # generation reports no loss, and nothing stale from the encoder in the aux of a decoding step
    enc_out = m.model.encoder(input_ids=x, attention_mask=mask).last_hidden_state
    log.clear()
    step = m(encoder_outputs=(enc_out,), attention_mask=mask, decoder_input_ids=out[:, :1])
    assert step.loss is None and step.metrics is None and step.aux_losses["moe_balance"].ndim == 0
    assert log and all(r["stack"] == "decoder" for r in log)  # the encoder did not run in that call

    capped = _moe(skill_layers="all", moe_eval_capacity_factor=2.0).eval()
    log2 = _record_gates(capped)
    capped.generate(x, **kw)
    assert sum(r["stats"]["dropped"] for r in log2 if r["stack"] == "decoder") > 0


def test_moe_bart_eval_capacity_is_its_own(batch):
    x, mask, y = batch
    m = _moe(moe_capacity_factor=0.5, moe_eval_capacity_factor=1.5)
    log = _record_gates(m)
    m.train()
    m(input_ids=x, attention_mask=mask, decoder_input_ids=y)
    m.eval()
    with torch.no_grad():
        m(input_ids=x, attention_mask=mask, decoder_input_ids=y)
    n_enc, n_dec = int(mask.sum()), y.numel()
    caps = [(r["stack"], r["stats"]["capacity"]) for r in log]
    want = [("encoder", math.ceil(0.5 * 2 * n_enc / 6))] * 2 + [("decoder", math.ceil(0.5 * 2 * n_dec / 6))] * 2
    want += [("encoder", math.ceil(1.5 * 2 * n_enc / 6))] * 2 + [("decoder", math.ceil(1.5 * 2 * n_dec / 6))] * 2
    assert caps == want


@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
def test_moe_bart_saves_loads_and_checks_task_names(tmp_path, batch):
    x, mask, y = batch
    m = _moe().eval()
    m.save_pretrained(tmp_path / "moe")
    back = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "moe").eval()
    assert back.config.router == "topk" and back.config.moe_eval_capacity_factor is None
    with torch.no_grad():
        a = m(input_ids=x, attention_mask=mask, decoder_input_ids=y).logits
        b = back(input_ids=x, attention_mask=mask, decoder_input_ids=y).logits
    assert torch.equal(a, b)
    with pytest.raises(KeyError, match="unknown task 'poetry'"):
        m(input_ids=x, attention_mask=mask, decoder_input_ids=y, task="poetry")


@pytest.mark.parametrize("make", [_random_skillnet, lambda: _moe()], ids=["task_map", "moe"])
def test_forward_and_generate_warn_about_no_deprecated_argument(batch, make):
    """model/bart.py calls transformers' BART with its current argument names: transformers 5.24 renamed
    `past_key_values` to `cache` and warns on every call that still passes the old name (removed in 5.40)."""
    import warnings

    x, mask, y = batch
    m = make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.train()(input_ids=x, attention_mask=mask, labels=y[:, 1:].contiguous(), task=TASK_A).loss.backward()
        m.eval().generate(x, attention_mask=mask, max_new_tokens=4, task=[TASK_A, TASK_B, TASK_A])
    deprecated = [f"{w.category.__name__}: {w.message}" for w in caught
                  if issubclass(w.category, (FutureWarning, DeprecationWarning))]
    assert not deprecated, deprecated


def test_the_old_cache_argument_name_still_reaches_the_cache(batch):
    """A caller still passing `past_key_values` gets transformers' FutureWarning and the same step as with
    `cache`, never a cache silently dropped."""
    import copy

    x, mask, y = batch
    m = _random_skillnet()
    kw = dict(input_ids=x, attention_mask=mask, task=TASK_A, use_cache=True)
    with torch.no_grad():
        cache = m(decoder_input_ids=y[:, :3], **kw).cache
        new = m(decoder_input_ids=y[:, 3:4], cache=copy.deepcopy(cache), **kw).logits
        with pytest.warns(FutureWarning, match="past_key_values"):
            old = m(decoder_input_ids=y[:, 3:4], past_key_values=copy.deepcopy(cache), **kw).logits
        uncached = m(decoder_input_ids=y[:, 3:4], **kw).logits
    torch.testing.assert_close(old, new)
    assert not torch.allclose(new, uncached)  # the cache was used: the step sees the 3 earlier tokens
