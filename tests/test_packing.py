"""Packed rows (training/packing.py, model/attention.py): several samples per row, each attending only to
itself, give every sample exactly what it gets alone in its own padded row.

Equality is checked in fp32 with dropout off, to 1e-5 relative / 5e-6 absolute (the packed and padded
batches sum the same numbers in another order: attention runs on rows of another width, as in
tests/test_packing_seq2seq.py): the loss, NSP logits per pair, MLM logits at each masked
position of each sample, and every parameter's gradient, for MLM and NSP under every router (the MoE gate
with a binding capacity, where the token order decides what is dropped), for rows of several tasks with
projected attention layers, and (tests below) for ZeRO-1/2/3 on 2 ranks and the exact resume.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from skillnet.model import SkillNetBertConfig, SkillNetBertForMultiTask, SkillNetBertForPreTraining
from skillnet.model.attention import COMPILED_PACK_ROW_FACTOR, PACK_ROW_FACTOR, AttentionMask
from skillnet.model.routers import router_class
from skillnet.pretrain.dataset import PretrainingDataset
from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
from skillnet.training.packing import (
    fewest_rows,
    pack_pairs,
    pack_rows,
    pack_where_it_pays,
    plan_rows,
    real_token_share,
)

from tests.fixtures.pretrain.helpers import REPO, subprocess_env
from tests.fixtures.warm import launch_fixture

RTOL, ATOL = 1e-5, 5e-6
ROUTERS = {
    "task": {},
    "dense": {},
    "learned": {},
    # capacity 0.5: experts drop tokens, so the packed batch must fill them in the samples' order
    "topk": {"moe_capacity_factor": 0.5},
}


def _config(router: str, **kw: object) -> SkillNetBertConfig:
    """A tiny config of `router`, derived from the SkillNet one as the methods are (Router.derive)."""
    base = SkillNetBertConfig.preset("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **kw)
    if router == "task":
        return base
    changes = router_class(router).derive(base, **ROUTERS[router]).changes
    return SkillNetBertConfig.preset("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     **{**kw, **changes})


@pytest.fixture(scope="module")
def data(default_shards: Path) -> PretrainingDataset:
    return PretrainingDataset(default_shards, max_seq_len=64, verify="size")


def _indices(ds: PretrainingDataset, n: int = 24) -> list[int]:
    return np.random.default_rng(3).choice(len(ds), n, replace=False).tolist()


# ---- the layout ----------------------------------------------------------------------------------------
def test_plan_rows_fits_every_sample_once_keeps_groups_apart_and_is_deterministic() -> None:
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 65, 200)
    groups = rng.choice(["a", "b", "c"], 200).tolist()
    rows = plan_rows(lens, 64, groups)
    assert sorted(i for r in rows for i in r) == list(range(200))
    assert all(sum(lens[i] for i in r) <= 64 for r in rows)
    assert all(len({groups[i] for i in r}) == 1 for r in rows)
    assert all(r == sorted(r) for r in rows)  # a row keeps its samples in batch order
    assert rows == plan_rows(lens, 64, groups)
    # the bound the bench and the padding command print is a true lower bound: no packing beats it
    g = np.array(groups)
    assert len(rows) >= sum(fewest_rows(lens[g == k], 64) for k in "abc")
    # first-fit decreasing is within 11/9 OPT + 1 rows; the bound here is the volume bound per group
    bound = sum(int(np.ceil(lens[np.array(groups) == g].sum() / 64)) for g in "abc")
    assert len(rows) <= 11 / 9 * bound + 3
    with pytest.raises(ValueError, match=r"\[1, 64\]"):
        plan_rows([65], 64)


@pytest.mark.parametrize("objective", ["mlm", "nsp"])
def test_packed_rows_hold_the_same_samples(data: PretrainingDataset, objective: str) -> None:
    padded = data.batch(_indices(data), 0, objective)
    packed, rows = pack_rows(padded, data.pad_id)
    B, T = padded["input_ids"].shape
    assert len(rows) < B and packed["input_ids"].shape == (len(rows), T)
    lens = padded["attention_mask"].sum(1)
    order = packed["token_order"]
    starts = torch.cumsum(lens, 0) - lens
    for b in range(B):
        at = order[starts[b] : starts[b] + lens[b]]  # where sample b's tokens went, in position order
        assert at[0] == packed["cls_positions"][b]
        for key in ("input_ids", "token_type_ids", "labels"):
            if key in padded:
                assert torch.equal(packed[key].flatten()[at], padded[key][b, : lens[b]]), key
        assert torch.equal(packed["position_ids"].flatten()[at], torch.arange(int(lens[b])))
        assert len(set(packed["segment_ids"].flatten()[at].tolist())) == 1
    assert packed["input_ids"].flatten()[packed["cls_positions"]].eq(data.cls_id).all()
    if objective == "nsp":
        assert torch.equal(packed["next_sentence_label"], padded["next_sentence_label"])
    # padding: no segment, pad id, no label, no attention
    pad = packed["segment_ids"] == 0
    assert packed["attention_mask"][pad].eq(0).all() and packed["input_ids"][pad].eq(data.pad_id).all()
    assert int(packed["attention_mask"].sum()) == int(lens.sum())
    assert real_token_share(packed) > real_token_share(padded)


def test_rows_are_packed_only_where_it_saves_slots() -> None:
    def batch(lengths: list[int], width: int) -> dict[str, torch.Tensor]:
        mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
        return {"input_ids": mask * 7, "attention_mask": mask}

    full = batch([30, 20, 17], 32)  # no two fit in a row of 32
    assert pack_where_it_pays(full, 0) is full
    short = batch([10, 12, 9], 32)
    assert pack_where_it_pays(short, 0)["input_ids"].shape == (1, 32)
    # padded to the longest (12): 3 x 12 = 36 slots beat one row of 36 tokens trimmed to 40 (a multiple of 8)
    narrow = batch([12, 12, 12], 12)
    assert pack_where_it_pays(narrow, 0, row_len=64) is narrow
    # a plan's rows are trimmed to its fullest row: 31 tokens in one row of 32, not of the 64 allowed
    assert pack_where_it_pays(batch([10, 12, 9], 12), 0, row_len=64)["input_ids"].shape == (1, 32)
    assert pack_where_it_pays(batch([10, 12, 9, 8, 11, 12], 12), 0, row_len=64)["input_ids"].shape == (1, 64)


def test_pack_rows_refuses_rows_that_are_not_padded_prefixes() -> None:
    batch = {"input_ids": torch.ones(2, 4, dtype=torch.long), "attention_mask": torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]])}
    with pytest.raises(ValueError, match="attention_mask must be real tokens then padding"):
        pack_rows(batch, 0)
    labels = torch.tensor([[5, -100, 5, -100], [5, 5, -100, -100]])  # a decoder side's padding is -100
    with pytest.raises(ValueError, match="labels must be real tokens then padding"):
        pack_pairs({"input_ids": batch["input_ids"], "attention_mask": torch.ones(2, 4, dtype=torch.long),
                    "labels": labels}, 0, 1)


def test_block_diagonal_mask_and_varlen_layout() -> None:
    seg = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
    m = AttentionMask.build(None, seg, torch.float32)
    allowed = m.additive[:, 0]
    assert allowed[0, 0].tolist() == [True, True, False, False, False, False]
    assert allowed[0, 3].tolist() == [False, False, True, True, True, False]
    assert allowed[0, 5].tolist() == [False, False, False, False, False, True]  # padding sees itself only
    idx, cu, longest = m.varlen_layout()
    assert idx.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9] and cu.tolist() == [0, 2, 5, 9] and longest == 4


# ---- the model: packed == padded, per sample -------------------------------------------------------------
def _pretraining_model(vocab: int, router: str) -> SkillNetBertForPreTraining:
    torch.manual_seed(0)
    return SkillNetBertForPreTraining(_config(router, vocab_size=vocab)).train()


def _run(model: torch.nn.Module, objective: str, batch: dict[str, torch.Tensor]):
    model.zero_grad()
    out = model(task=objective, **dict(batch))
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _sample_token_positions(padded: dict[str, torch.Tensor]) -> torch.Tensor:
    """Flat [B*T] positions of the real tokens of a padded batch, sample by sample (token_order's twin)."""
    mask = padded["attention_mask"].bool().flatten()
    return torch.nonzero(mask).flatten()


@pytest.mark.parametrize("router", sorted(ROUTERS))
@pytest.mark.parametrize("objective", ["mlm", "nsp"])
def test_packed_equals_padded_per_sample(data: PretrainingDataset, router: str, objective: str) -> None:
    model = _pretraining_model(data.vocab_size, router)
    padded = data.batch(_indices(data), 0, objective)
    packed, _ = pack_rows(padded, data.pad_id)
    out_p, grads_p = _run(model, objective, padded)
    out_k, grads_k = _run(model, objective, packed)
    assert out_k.loss.item() == pytest.approx(out_p.loss.item(), rel=RTOL, abs=ATOL)
    assert grads_k.keys() == grads_p.keys()
    for name in grads_p:
        torch.testing.assert_close(grads_k[name], grads_p[name], rtol=RTOL, atol=ATOL, msg=name)
    if objective == "nsp":  # one logit pair per sample, in sample order, from each pair's own [CLS]
        torch.testing.assert_close(out_k.logits, out_p.logits, rtol=RTOL, atol=ATOL)
        return
    # MLM logits come at the masked positions in each layout's flat order: map packed ones back per sample.
    model.eval()
    with torch.no_grad():
        full_p = model(task="mlm", **{k: v for k, v in padded.items() if k != "labels"}).logits.flatten(0, 1)
        full_k = model(task="mlm", **{k: v for k, v in packed.items() if k not in ("labels", "mlm_positions")}
                       ).logits.flatten(0, 1)
    src = _sample_token_positions(padded)
    masked = padded["labels"].flatten()[src] != -100
    torch.testing.assert_close(full_k[packed["token_order"][masked]], full_p[src[masked]], rtol=RTOL, atol=ATOL)


def test_a_token_gate_drops_the_same_tokens_only_in_the_samples_order(data: PretrainingDataset) -> None:
    """The check above can fail: without the samples' token order a binding capacity drops other tokens."""
    model = _pretraining_model(data.vocab_size, "topk")
    padded = data.batch(_indices(data, 32), 0, "mlm")
    packed, _ = pack_rows(padded, data.pad_id)
    layout_order = {k: v for k, v in packed.items() if k != "token_order"}
    with torch.no_grad():
        want = model(task="mlm", **padded).loss.item()
        assert model(task="mlm", **packed).loss.item() == pytest.approx(want, rel=RTOL)
        assert model(task="mlm", **layout_order).loss.item() != pytest.approx(want, rel=RTOL)


HEADS = {"a": {"type": "classification", "num_labels": 2}, "b": {"type": "classification", "num_labels": 3}}


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_rows_of_several_tasks_with_projected_attention(data: PretrainingDataset, router: str) -> None:
    """A batch whose rows belong to different tasks (skill sets and PALs per row): packing keeps each row to
    one task, and every sample's hidden states and pooled output equal its own padded row's."""
    torch.manual_seed(0)
    cfg = _config(router, vocab_size=data.vocab_size, task_heads=HEADS, pals_dim=16, pals_heads=4,
                  tasks={"a": ["s1", "s4", "s7"], "b": ["s2", "s3", "s7"]})
    bert = SkillNetBertForMultiTask(cfg).train().bert
    padded = data.batch(_indices(data), 0, "nsp")
    padded.pop("next_sentence_label")
    tasks = ["a" if i % 3 else "b" for i in range(len(padded["input_ids"]))]
    packed, rows = pack_rows(padded, data.pad_id, groups=tasks)
    row_tasks = [tasks[r[0]] for r in rows]
    enc_p = bert(**padded, task=tasks)
    enc_k = bert(**packed, task=row_tasks)
    src = _sample_token_positions(padded)
    torch.testing.assert_close(enc_k.last_hidden_state.flatten(0, 1)[packed["token_order"]],
                               enc_p.last_hidden_state.flatten(0, 1)[src], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(enc_k.pooler_output, enc_p.pooler_output, rtol=RTOL, atol=ATOL)
    grads = []
    for enc in (enc_p, enc_k):
        bert.zero_grad()
        (enc.pooler_output.square().mean() + (enc.aux_loss if enc.aux_loss is not None else 0)).backward()
        grads.append({n: p.grad.clone() for n, p in bert.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=RTOL, atol=ATOL, msg=name)


# ---- the source: same samples, same state -------------------------------------------------------------
def test_packing_changes_rows_not_samples_or_the_resumable_state(data: PretrainingDataset) -> None:
    seen: dict[bool, list] = {True: [], False: []}
    sources = {}
    for packing in (False, True):
        src = PretrainBatchSource(data, ObjectiveSampler(seed=1), 16, 2, 0, 1, seed=4, packing=packing)
        src.on_batch = lambda *pos, packing=packing: seen[packing].append(pos)
        batches = [next(src) for _ in range(6)]
        sources[packing] = (src, batches)
    assert seen[True] == seen[False]
    assert sources[True][0].state_dict() == sources[False][0].state_dict()
    assert sum(b.num_slots() for b in sources[True][1]) < sum(b.num_slots() for b in sources[False][1])
    for (a, b) in zip(sources[False][1], sources[True][1]):
        assert a.task == b.task and a.num_tokens() == b.num_tokens()
        assert b.num_slots() <= a.num_slots()
        mask = b.tensors["labels"] != -100 if "labels" in b.tensors else None
        if mask is not None:  # the same predicted tokens, found on the host in the packed layout
            assert torch.equal(b.tensors["mlm_positions"], mask.flatten().nonzero().flatten())


def test_attention_over_the_real_tokens_on_cuda() -> None:
    """The variable-length flash kernel equals the masked path (sm80+, bf16)."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA: not run on this machine")
    from skillnet.model.attention import attend, varlen_available

    seg = torch.tensor([[1] * 100 + [2] * 300 + [0] * 112, [1] * 512], device="cuda")
    q, k, v = (torch.randn(2, 4, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = AttentionMask.build(None, seg, torch.bfloat16)
    if not varlen_available(q, 0.0):
        pytest.skip("no variable-length kernel on this card (pre-sm80): the masked path runs")
    fast = attend(q, k, v, mask, 0.0)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.additive)
    real = (seg > 0)[:, None, :, None].expand_as(ref)
    torch.testing.assert_close(fast[real], ref[real], rtol=2e-2, atol=2e-2)


# ---- ZeRO-1/2/3 on 2 ranks ------------------------------------------------------------------------------
ZERO = {"zero1": 1, "zero2": 2, "zero3": 3}


@pytest.fixture(scope="module")
def zero_reports(tmp_path_factory: pytest.TempPathFactory, default_shards: Path) -> dict[str, list[dict]]:
    tmp = tmp_path_factory.mktemp("packing_zero")
    base = json.loads((REPO / "ds_configs" / "cpu_fp32.json").read_text())
    configs = []
    for name, stage in ZERO.items():
        path = tmp / f"{name}.json"
        path.write_text(json.dumps({**base, "zero_optimization": {**base["zero_optimization"], "stage": stage}}))
        configs.append(str(path))
    out = tmp / "out"
    fixture = "tests/fixtures/optim/zero_stages.py"
    launch_fixture(fixture, ["--shards", str(default_shards), str(out), "plain"], nprocs=0, timeout=300)
    launch_fixture(fixture, ["--shards", str(default_shards), "--packing", str(out), *configs], timeout=900)
    res = {"plain": [json.loads((out / "plain_shards_rank0.json").read_text())]}
    for name in ZERO:
        res[name] = [json.loads((out / f"{name}_shards_packed_rank{r}.json").read_text()) for r in (0, 1)]
    return res


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZERO))
def test_packed_zero_runs_follow_the_unpacked_loss_path(zero_reports: dict[str, list[dict]], name: str) -> None:
    plain = zero_reports["plain"][0]
    for rep in zero_reports[name]:
        assert rep["zero_stage"] == ZERO[name]
        assert rep["objectives"] == plain["objectives"]
        assert rep["losses"] == pytest.approx(plain["losses"], rel=RTOL, abs=ATOL)
        assert rep["skills_moved"] == plain["skills_moved"]
        assert rep["next_loss_resumed"] == pytest.approx(rep["next_loss_straight"], rel=RTOL, abs=ATOL)
        assert rep["real_token_share"] > plain["real_token_share"]


# ---- the command ----------------------------------------------------------------------------------------
def test_a_sequence_longer_than_the_positions_is_refused_in_one_line(default_shards: Path, tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "pretrain/run.py", "--shards", str(default_shards), "--max-seq-len", "100000",
                        "--output-dir", str(tmp_path / "run"), "--no-progress"], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=subprocess_env())
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        "error: --max-seq-len 100000 exceeds the model's 512 positions (preset tiny; a --model-config JSON with "
        "max_position_embeddings gives more); use at most 512"]
    assert not (tmp_path / "run").exists()


# ---- fine-tuning: every task type that packs -----------------------------------------------------------
def _token_values(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return t[mask.bool()]  # the values at real tokens, sample by sample


def test_finetuning_rows_pack_every_type_that_pays_with_equal_loss_and_gradients() -> None:
    """TrainConfig.packing: a batch (padded to its longest example, as fine-tuning builds it) packed into rows
    of the task's max_seq_len has the loss, logits (at every real token for NER's emissions), Viterbi paths
    and gradients of its padded form; the source packs it exactly when that computes fewer slots; matching
    keeps one candidate per row; the data order and state are those of an unpacked source."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune.build import build_model
    from skillnet.finetune.config import FinetuneConfig
    from skillnet.finetune.samplers import SamplerConfig, build_sampler
    from skillnet.finetune.source import MultiTaskBatchSource
    from skillnet.finetune.tasks import TaskData

    from tests.test_finetune_e2e import tiny_config

    d = tiny_config(Path("unused"))
    # NER's loss per word: the tolerances are set for it (per sentence, every gradient is the same one times the
    # batch's words per sentence in both layouts, test_crf_loss_scale.py, and its fp32 rounding grows with it)
    next(t for t in d["tasks"] if t["type"] == "ner")["head"] = {"loss_reduction": "token_mean"}
    cfg = FinetuneConfig.from_dict(d)
    tok = load_tokenizer(None)
    data = {t.name: TaskData(t, cfg, tok) for t in cfg.tasks}
    sizes = {n: d.num_train_rows() for n, d in data.items()}

    def source(packing: bool) -> MultiTaskBatchSource:
        return MultiTaskBatchSource(data, build_sampler(SamplerConfig(kind="proportional"), sizes, seed=5), 6,
                                    seed=5, packing=packing)

    plain, packed = source(False), source(True)
    model, _ = build_model(cfg, data)
    model.eval()  # dropout off: the two layouts would draw different masks (gradients flow all the same)
    kinds = set()
    for _ in range(16):
        a, b = next(plain), next(packed)
        assert a.task == b.task and a.num_tokens() == b.num_tokens()
        td = data[a.task]
        if not td.codec.packs:
            assert b.tensors.keys() == a.tensors.keys() and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors)
            kinds.add("kept")
            continue
        kinds.add(a.task)
        tokens = td.codec.packs == "tokens"
        want = pack_where_it_pays(a.tensors, tok.pad_id, row_len=td.row_factor * td.max_len, unpack=tokens)
        assert b.tensors.keys() == want.keys() and all(torch.equal(want[k], b.tensors[k]) for k in want)
        # the rows the source chose, or where packing did not pay, rows of the task's max_seq_len
        forced = b.tensors if "segment_ids" in b.tensors else pack_rows(a.tensors, tok.pad_id, row_len=td.max_len,
                                                                        unpack=tokens)[0]
        assert forced["input_ids"].shape[0] < a.tensors["input_ids"].shape[0]  # rows of several examples
        if "segment_ids" in b.tensors:
            assert b.num_slots() < a.num_slots()
        out_a, g_a = _run(model, a.task, a.tensors)
        out_f, g_f = _run(model, a.task, forced)
        assert out_f.loss.item() == pytest.approx(out_a.loss.item(), rel=RTOL, abs=ATOL)
        if tokens:  # emissions per token, back in the padded layout; padding's are never read
            mask = a.tensors["attention_mask"]
            torch.testing.assert_close(_token_values(out_f.logits, mask), _token_values(out_a.logits, mask),
                                       rtol=RTOL, atol=ATOL)
            assert model.predict(a.task, **forced) == model.predict(a.task, **a.tensors)
        else:
            torch.testing.assert_close(out_f.logits, out_a.logits, rtol=RTOL, atol=ATOL)
        assert g_f.keys() == g_a.keys()
        for name in g_a:
            torch.testing.assert_close(g_f[name], g_a[name], rtol=RTOL, atol=ATOL, msg=name)
    assert {"kept", "sentiment", "ner"} <= kinds, kinds  # (the fixtures' near-equal lengths rarely pay)
    assert packed.state_dict() == plain.state_dict()


def test_the_start_log_says_per_task_whether_rows_pack_and_the_real_share() -> None:
    """Fine-tuning's start-up plan: one line per task saying whether its rows pack (and how), with the real-token
    share of its first batches padded and as fed; --no-packing and a type that never packs say so."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune.config import FinetuneConfig
    from skillnet.finetune.run import packing_lines
    from skillnet.finetune.samplers import SamplerConfig, build_sampler
    from skillnet.finetune.source import MultiTaskBatchSource
    from skillnet.finetune.tasks import TaskData

    from tests.test_finetune_e2e import tiny_config

    cfg = FinetuneConfig.from_dict(tiny_config(Path("unused")))
    tok = load_tokenizer(None)
    data = {t.name: TaskData(t, cfg, tok) for t in cfg.tasks}
    sampler = build_sampler(SamplerConfig(kind="proportional"), {n: d.num_train_rows() for n, d in data.items()},
                            seed=0)
    on = {line.split()[0]: line for line in packing_lines(MultiTaskBatchSource(data, sampler, 16, packing=True))}
    off = {line.split()[0]: line for line in packing_lines(MultiTaskBatchSource(data, sampler, 16, packing=False))}
    assert "rows pack (pooled output per example): real tokens" in on["sentiment"]
    assert "rows pack (every token, back in its example's row after the encoder)" in on["ner"]
    assert "one example per row (its type does not pack)" in on["qa_match"] and on["qa_match"] == off["qa_match"]
    assert "one example per row [--no-packing]" in off["sentiment"]
    report = MultiTaskBatchSource(data, sampler, 16, packing=True).packing_report()
    assert report["sentiment"]["fed"] >= report["sentiment"]["padded"] > 0.3  # measured, not a constant


def test_a_packed_row_may_be_longer_than_the_positions() -> None:
    """Positions restart at each sample, so rows of several samples may pass max_position_embeddings (fine-tuning
    packs rows up to PACK_ROW_FACTOR times a task's limit): the same outputs as the padded batch; a padded row that long is
    still refused."""
    torch.manual_seed(0)
    cfg = SkillNetBertConfig.preset("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                    max_position_embeddings=64, task_heads=HEADS,
                                    tasks={"a": ["s1", "s4", "s7"], "b": ["s2", "s3", "s7"]})
    model = SkillNetBertForMultiTask(cfg).eval()
    lens = torch.tensor([60, 50, 64, 40, 55])
    real = (torch.arange(64)[None, :] < lens[:, None]).long()
    padded = {"input_ids": (torch.randint(1000, 5000, (5, 64)) * real), "attention_mask": real,
              "token_type_ids": torch.zeros(5, 64, dtype=torch.long), "labels": torch.tensor([0, 1, 1, 0, 1])}
    packed, rows = pack_rows(padded, 0, row_len=192)
    assert packed["input_ids"].shape[1] == 192 and len(rows) < 5
    with torch.no_grad():
        torch.testing.assert_close(model(task="a", **packed).logits, model(task="a", **padded).logits,
                                   rtol=RTOL, atol=ATOL)
        with pytest.raises(ValueError, match="exceeds max_position_embeddings=64"):
            model(task="a", input_ids=torch.ones(1, 65, dtype=torch.long))


def test_evaluation_batches_pack_with_the_same_predictions() -> None:
    """Evaluation packs the batches of the types whose outputs are read per example (classification, NER;
    span windows too), where the run packs: every prediction equals the unpacked run's."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune.build import build_model
    from skillnet.finetune.config import FinetuneConfig
    from skillnet.finetune.tasks import TaskData

    from tests.test_finetune_e2e import tiny_config

    tok = load_tokenizer(None)
    runs = {}
    for packing in (False, True):
        d = tiny_config(Path("unused"))
        d["train"]["packing"] = packing
        cfg = FinetuneConfig.from_dict(d)
        runs[packing] = (cfg, {t.name: TaskData(t, cfg, tok) for t in cfg.tasks})
    torch.manual_seed(0)
    model, _ = build_model(*runs[False])
    model.eval()
    packed_batches = 0
    for name, td in runs[True][1].items():
        plain_td = runs[False][1][name]
        if td.codec.packs:
            feats = td.features("dev")
            assert "segment_ids" not in plain_td.codec.eval_batch(plain_td, feats[:16])

            def forced(batch: dict, td: TaskData = td) -> dict:  # the fixtures' near-equal lengths rarely pay
                nonlocal packed_batches
                packed_batches += 1
                return pack_rows(batch, tok.pad_id, row_len=td.max_len, unpack=td.codec.packs == "tokens")[0]

            td.pack = forced
        want = plain_td.codec.predict(plain_td, model, plain_td.records["dev"], "dev", 16, False)
        assert td.codec.predict(td, model, td.records["dev"], "dev", 16, False) == want, name
    assert packed_batches >= 2


def test_token_heads_read_each_sample_back_in_its_own_row() -> None:
    """NER's CRF (loss and Viterbi paths) and span extraction (loss, start/end logits, best spans) on packed
    rows equal the padded batch, per sample; without moving the encoder's output back (the packed layout
    handed to the head) they do not."""
    from skillnet.model.heads import sample_rows

    torch.manual_seed(0)
    heads = {"ner": {"type": "token_crf", "num_labels": 5, "labels": ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]},
             "span": {"type": "span", "num_labels": 2}}
    cfg = SkillNetBertConfig.preset("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                    task_heads=heads, tasks={"ner": ["s2", "s7"], "span": ["s1", "s7"]})
    model = SkillNetBertForMultiTask(cfg).train()
    rng = np.random.default_rng(1)
    lens = rng.integers(4, 30, 12)
    B, W = len(lens), int(lens.max())
    real = torch.from_numpy(np.arange(W)[None, :] < lens[:, None]).long()
    ids = torch.from_numpy(rng.integers(1000, 5000, (B, W))) * real
    base = {"input_ids": ids, "attention_mask": real, "token_type_ids": torch.zeros_like(ids)}
    words = real.clone()
    words[:, 0] = 0
    words[torch.arange(B), torch.from_numpy(lens - 1)] = 0  # [CLS] and [SEP] are not words
    ner = {**base, "word_mask": words,
           "labels": torch.where(words.bool(), torch.from_numpy(rng.choice([0, 1, 3], (B, W))), -100)}
    ctx = words.clone()
    start = torch.from_numpy(rng.integers(1, lens - 1))
    span = {**base, "context_mask": ctx, "start_positions": start,
            "end_positions": torch.minimum(start + 1, torch.from_numpy(lens - 2))}
    for task, padded in (("ner", ner), ("span", span)):
        packed, rows = pack_rows(padded, 0, row_len=64, unpack=True)
        assert len(rows) < B
        out_p, g_p = _run(model, task, padded)
        out_k, g_k = _run(model, task, packed)
        assert out_k.loss.item() == pytest.approx(out_p.loss.item(), rel=RTOL, abs=ATOL)
        logit_mask = real if task == "ner" else ctx
        torch.testing.assert_close(_token_values(out_k.logits, logit_mask), _token_values(out_p.logits, logit_mask),
                                   rtol=RTOL, atol=ATOL)
        for name in g_p:
            torch.testing.assert_close(g_k[name], g_p[name], rtol=RTOL, atol=ATOL, msg=name)
        with torch.no_grad():
            assert model.predict(task, **packed) == model.predict(task, **padded)
        # the check can fail: the CRF reading the packed rows' emissions as if each row were one sentence
        if task == "ner":
            layout_only = {k: v for k, v in packed.items() if k != "unpack_index"}
            with torch.no_grad():
                wrong = model(task=task, **layout_only)
            assert wrong.loss.item() != pytest.approx(out_p.loss.item(), rel=RTOL)
    assert sample_rows({"input_ids": ids}, None) == ({"input_ids": ids}, None)  # padded batches pass through


def test_the_padding_command_reports_the_shares_a_run_would_see(data: PretrainingDataset, default_shards: Path,
                                                                capsys: pytest.CaptureFixture) -> None:
    from skillnet.pretrain.padding import main, shares

    got = shares(data, "mlm", 48, 16)
    order = np.random.default_rng([0, 0]).permutation(len(data))[:48].tolist()
    real = rows = 0
    for at in range(0, 48, 16):
        b = data.batch(order[at : at + 16], 0, "mlm")
        real += int(b["attention_mask"].sum())
        rows += pack_rows(b, data.pad_id)[0]["input_ids"].shape[0]
    assert got["unpacked"] == pytest.approx(real / (48 * 64))
    assert got["packed"] == pytest.approx(real / (rows * 64))
    assert got["unpacked"] < got["packed"] <= got["bound"] <= 1.0
    assert main([str(default_shards), "--max-seq-len", "64", "--samples", "48", "--micro-batch-size", "16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["objective", "one", "per", "row", "packed", "bound"]
    assert lines[2].split()[0] == "mlm" and lines[2].split()[1] == f"{got['unpacked']:.1%}"
    assert main([str(default_shards / "nope")]) == 2


def test_compiled_layers_pack_shorter_rows() -> None:
    """--compile's layers attend through the block mask, whose cost grows with a row's square: fine-tuning
    packs their rows up to COMPILED_PACK_ROW_FACTOR times a task's limit, eager runs up to PACK_ROW_FACTOR."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune.config import FinetuneConfig
    from skillnet.finetune.tasks import TaskData

    from tests.test_finetune_e2e import tiny_config

    tok = load_tokenizer(None)
    for compile_, want in ((False, PACK_ROW_FACTOR), (True, COMPILED_PACK_ROW_FACTOR)):
        d = tiny_config(Path("unused"))
        d["train"] = {**d["train"], "compile": compile_}
        cfg = FinetuneConfig.from_dict(d)
        assert {TaskData(t, cfg, tok).row_factor for t in cfg.tasks} == {want}
    assert COMPILED_PACK_ROW_FACTOR < PACK_ROW_FACTOR
