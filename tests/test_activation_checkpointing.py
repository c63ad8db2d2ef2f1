"""Activation checkpointing: HF's ``activation_checkpointing_enable()`` on SkillNet-BERT and
SkillNet-BART gives the loss and gradients of the run without it (fp32), for mixed-task batches (per-row
skill groups), every router and dropout on; and it keeps fewer activations for the backward pass."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from skillnet.finetune.config import FinetuneConfig
from skillnet.model import SkillNetBertConfig, SkillNetBertModel
from skillnet.model.bart import SkillNetBartConfig, SkillNetBartForConditionalGeneration
from skillnet.pretrain import run as pretrain_run
from skillnet.training.activation_checkpointing import (
    ActivationCheckpointing,
    resolve_activation_checkpointing,
)
from skillnet.training.config import DsConfigError

from tests.fixtures.pretrain.helpers import task_losses

REPO = Path(__file__).resolve().parents[1]

Step = Callable[[bool, int], tuple[torch.Tensor, dict[str, torch.Tensor], torch.nn.Module]]

# Rows of different tasks: the batch splits into skill groups ({s2,s7} for mlm and ner, {s1,s3,s7}, {s1,s4,s7}).
BERT_TASKS = ["mlm", "nsp", "sentiment", "mlm", "ner", "nsp"]
BART_TASKS = ["text_summarization", "dialogue_generation", "story_generation", "text_summarization"]


def _grads(m: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def _training(m: torch.nn.Module, ckpt: bool) -> torch.nn.Module:
    m.train()
    if ckpt:
        m.activation_checkpointing_enable()
    return m


def bert_step(ckpt: bool, dropout_seed: int = 5, **kw) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.nn.Module]:
    torch.manual_seed(0)
    cfg = SkillNetBertConfig.preset("tiny", vocab_size=500, hidden_dropout_prob=0.1,
                                    attention_probs_dropout_prob=0.1, **kw)
    m = _training(SkillNetBertModel(cfg), ckpt)
    ids = torch.randint(1, 200, (len(BERT_TASKS), 11), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, 7:] = 0
    torch.manual_seed(dropout_seed)
    out = m(ids, mask, task=BERT_TASKS)
    loss = out.last_hidden_state.pow(2).mean() + out.pooler_output.sum()
    if out.aux_loss is not None:
        loss = loss + out.aux_loss
    loss.backward()
    return loss.detach(), _grads(m), m


def bart_step(ckpt: bool, dropout_seed: int = 5, **kw) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.nn.Module]:
    torch.manual_seed(0)
    cfg = SkillNetBartConfig.preset("tiny", vocab_size=500, dropout=0.1, attention_dropout=0.1,
                                    activation_dropout=0.1, **kw)
    m = _training(SkillNetBartForConditionalGeneration(cfg), ckpt)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 200, (len(BART_TASKS), 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    labels = torch.randint(5, 200, (len(BART_TASKS), 7), generator=g)
    labels[2, 5:] = -100
    torch.manual_seed(dropout_seed)
    out = m(input_ids=ids, attention_mask=mask, labels=labels, task=BART_TASKS)
    out.loss.backward()
    return out.loss.detach(), _grads(m), m


CASES = [
    pytest.param(bert_step, {}, id="bert-task-map"),
    pytest.param(bert_step, {"ffn_impl": "loop"}, id="bert-loop"),
    pytest.param(bert_step, {"skill_layernorm": "per_skill"}, id="bert-per-skill-ln"),
    pytest.param(bert_step, {"router": "learned"}, id="bert-learned-map"),
    pytest.param(bert_step, {"router": "topk"}, id="bert-topk"),
    pytest.param(bart_step, {}, id="bart-task-map"),
    pytest.param(bart_step, {"router": "topk"}, id="bart-topk"),
]


@pytest.mark.parametrize(("step", "kw"), CASES)
def test_checkpointing_gives_the_loss_and_gradients_of_the_plain_run(step: Step, kw: dict) -> None:
    loss0, g0, m0 = step(False, **kw)
    loss1, g1, m1 = step(True, **kw)
    assert not m0.is_activation_checkpointing and m1.is_activation_checkpointing
    assert set(g0) == set(g1)  # the same skills took part (inactive ones have no gradient in both)
    torch.testing.assert_close(loss1, loss0, rtol=1e-6, atol=0)
    for name in g0:
        scale = float(g0[name].abs().max())
        err = float((g1[name] - g0[name]).abs().max())
        assert err <= 1e-6 * scale, f"{name}: max |diff| {err:.3g} > 1e-6 x max |grad| {scale:.3g}"
    # Dropout is on and draws from the global generator: another seed gives another loss, so the equality
    # above holds because the recomputation replays the same masks (torch's checkpoint restores the RNG).
    assert not torch.equal(step(False, dropout_seed=6, **kw)[0], loss0)


def test_mixed_batches_run_several_skill_groups_under_checkpointing() -> None:
    # The equality above is about per-row routing only if the batch really splits into groups.
    torch.manual_seed(0)
    m = SkillNetBertModel(SkillNetBertConfig.preset("tiny", vocab_size=500))
    routing = m.router.route(m, BERT_TASKS, None, device="cpu")
    assert [len(g.rows) for g in routing.groups] == [3, 2, 1]


def _saved_bytes(fn: Callable[[], torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd keeps for the backward pass of ``fn()``. Non-reentrant
    checkpointing saves each checkpointed layer's inputs through these hooks too (and keeps nothing else of
    the layer), so the count is what stays alive between forward and backward."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn().backward()
    return sum(seen.values())


@pytest.mark.parametrize("arch", ["bert", "bart"])
def test_checkpointing_keeps_fewer_activations(arch: str) -> None:
    # Small vocab: the logits (outside the layers, never checkpointed) would otherwise dominate the count.
    def run(ckpt: bool) -> int:
        torch.manual_seed(0)
        if arch == "bert":
            m = SkillNetBertModel(SkillNetBertConfig.preset("tiny", num_hidden_layers=4, vocab_size=500)).train()
            ids = torch.randint(1, 500, (4, 64))
            fn = lambda: m(ids, torch.ones_like(ids), task=["mlm", "nsp", "mlm", "ner"]).last_hidden_state.sum()  # noqa: E731
        else:
            m = SkillNetBartForConditionalGeneration(
                SkillNetBartConfig.preset("tiny", encoder_layers=4, decoder_layers=4, vocab_size=500)).train()
            ids, labels = torch.randint(5, 500, (4, 64)), torch.randint(5, 500, (4, 64))
            fn = lambda: m(input_ids=ids, labels=labels, task=BART_TASKS).loss  # noqa: E731
        _training(m, ckpt)
        return _saved_bytes(fn)

    plain, ckpt = run(False), run(True)
    # Per layer the plain run keeps ~10 [B, T, D]-sized tensors, the attention probabilities and the k*f-wide
    # FFN activations; a checkpointed layer keeps its input only.
    assert ckpt < 0.35 * plain, (ckpt, plain)


# ------------------------------------------------------------------------------------------- the runs' switch
def test_the_deepspeed_section_turns_it_on_and_only_its_applicable_options_are_taken(tmp_path: Path) -> None:
    assert resolve_activation_checkpointing(None, {"zero_optimization": {"stage": 2}}) == ActivationCheckpointing()
    assert resolve_activation_checkpointing(True, None).source == "flag"
    on = resolve_activation_checkpointing(None, {"activation_checkpointing": {"cpu_checkpointing": True}}, "x.json")
    assert (on.enabled, on.offload, on.source) == (True, True, "ds_config")
    with pytest.raises(DsConfigError, match=r"x\.json: activation_checkpointing\.partition_activations"):
        resolve_activation_checkpointing(True, {"activation_checkpointing": {"partition_activations": True}}, "x.json")


def _pretrain(out: Path, *extra: str) -> list[dict[str, float]]:
    argv = ["--synthetic", "32", "--synthetic_vocab", "1024", "--max_seq_len", "16", "--micro_batch_size", "4",
            "--max_steps", "2", "--log_every", "1", "--output_dir", str(out), "--no_progress", "--no_tensorboard",
            *extra]
    assert pretrain_run.main(argv) == 0
    return [task_losses(r) for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())]


def test_pretraining_flag_prints_records_and_trains_as_without_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                  ) -> None:
    assert "--gradient-checkpointing" in pretrain_run.build_parser().format_help()
    plain = _pretrain(tmp_path / "plain")
    assert "memory     activation checkpointing off [default]" in capsys.readouterr().out
    ckpt = _pretrain(tmp_path / "ckpt", "--gradient-checkpointing")
    stdout = capsys.readouterr().out
    assert "memory     activation checkpointing on: every layer recomputed in the backward pass [flag]" in stdout
    assert json.loads((tmp_path / "ckpt" / "run_args.json").read_text())["gradient_checkpointing"] is True
    assert json.loads((tmp_path / "plain" / "run_args.json").read_text())["gradient_checkpointing"] is False
    assert ckpt == plain  # the tiny preset has dropout 0.1: the replay draws the same masks


def test_pretraining_takes_it_from_the_deepspeed_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = json.loads((REPO / "ds_configs" / "cpu_fp32.json").read_text())
    ds["activation_checkpointing"] = {"cpu_checkpointing": False}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    argv = ["--synthetic", "32", "--synthetic_vocab", "1024", "--ds_config", str(tmp_path / "ds.json"), "--dry_run",
            "--output_dir", str(tmp_path / "out")]
    assert pretrain_run.main(argv) == 0
    assert "activation checkpointing on: every layer recomputed in the backward pass [ds_config]" in capsys.readouterr().out
    ds["activation_checkpointing"] = {"contiguous_memory_optimization": True}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    assert pretrain_run.main(argv) == 2
    assert "contiguous_memory_optimization configure DeepSpeed's own checkpoint function" in capsys.readouterr().err


def test_finetuning_flag_reaches_the_model_the_saved_config_and_the_plan(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from skillnet.finetune import cli
    from skillnet.finetune import run as finetune_run

    from tests.test_finetune_e2e import tiny_config

    assert "--gradient-checkpointing" in cli.build_parser().format_help()
    (tmp_path / "c.json").write_text(json.dumps(tiny_config(tmp_path / "run")))
    a = cli.build_parser().parse_args(["--config", str(tmp_path / "c.json"), "--gradient-checkpointing"])
    cfg = cli.apply_overrides(FinetuneConfig.load(str(tmp_path / "c.json")), a)
    assert cfg.train.gradient_checkpointing and FinetuneConfig.from_dict(json.loads(cfg.to_json())).train.gradient_checkpointing
    losses = {}
    for on in (False, True):
        c = copy.deepcopy(cfg)
        c.train.gradient_checkpointing = on
        c.output_dir = str(tmp_path / f"run{int(on)}")
        st = finetune_run.setup(c, tensorboard=False, progress=False)
        assert st.model.is_activation_checkpointing is on
        saved = json.loads((st.out / "finetune_config.json").read_text())
        assert saved["train"]["gradient_checkpointing"] is on
        losses[on] = [float(st.trainer.train_step().loss) for _ in range(2)]
    assert "activation checkpointing on: every layer recomputed in the backward pass [config]" in capsys.readouterr().err
    assert losses[True] == losses[False]

