"""End-to-end fine-tuning on tiny fixtures: multi-task training, new skill s8 from s7 with frozen old
skills, ablation, sparse updates, resume of the batch source, prediction, and bad-input messages."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from skillnet.finetune import predict as predict_cli
from skillnet.finetune import run as run_cli
from skillnet.finetune.cli import main as finetune_main
from skillnet.finetune.config import FinetuneConfig

FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"


def _task(name, typ, prefix, skills, **kw):
    t = {"name": name, "type": typ, "skills": skills, "train": str(FIX / f"{prefix}_train.jsonl"),
         "dev": str(FIX / f"{prefix}_dev.jsonl"), "max_seq_len": 32}
    if (FIX / f"{prefix}_test.jsonl").exists():
        t["test"] = str(FIX / f"{prefix}_test.jsonl")
    t.update(kw)
    return t


def tiny_config(out: Path, **kw) -> dict:
    d = {
        "tasks": [
            _task("sentiment", "classification", "sent", ["s1", "s4", "s7"]),
            _task("ner", "ner", "ner", ["s2", "s7"]),
            _task("qa_match", "matching", "match", ["s1", "s3", "s5", "s7"], max_seq_len=40, num_negatives=2),
        ],
        "sampler": {"kind": "round_robin"},  # every task is trained within 3 steps
        "train": {"max_steps": 6, "batch_size": 4, "eval_batch_size": 8, "lr": 1e-3, "eval_every": 3,
                  "log_every": 3, "seed": 0, "warmup_ratio": 0.0},
        "output_dir": str(out),
    }
    d.update(kw)
    return d


def _save_init(path: Path) -> dict[str, torch.Tensor]:
    from skillnet.model.config import SkillNetBertConfig
    from skillnet.model.heads import SkillNetBertForMultiTask

    torch.manual_seed(123)
    m = SkillNetBertForMultiTask(SkillNetBertConfig.preset("tiny"))
    m.save_pretrained(str(path))
    return {k: v.clone() for k, v in m.state_dict().items()}


def _skill_key(k: str, skill_id: int) -> bool:
    return f".skill_ffn.skills.{skill_id}." in k


@pytest.mark.slow  # ~20-40 s on a shared 2-core CPU
def test_new_skill_from_s7_with_frozen_old_skills(tmp_path):
    init = _save_init(tmp_path / "init")
    out = tmp_path / "run"
    cfg = FinetuneConfig.from_dict(tiny_config(out, model={"init": str(tmp_path / "init")},
                                               new_skills=[{"name": "s8", "init_from": "s7"}],
                                               freeze_old_skills=True))
    results = run_cli.run(cfg, tensorboard=False, progress=False)
    assert set(results) == {"sentiment", "ner", "qa_match"}

    final = load_file(str(out / "export" / "model.safetensors"))
    # every pre-existing tensor (embeddings, attention, pooler, skills s1..s7) is bit-identical
    for k, v in init.items():
        assert torch.equal(final[k], v), f"frozen parameter {k} changed"
    # s8 (id 7) started as a copy of s7 (id 6) and moved
    s8 = [k for k in final if _skill_key(k, 7)]
    assert s8, "no s8 parameters in the export"
    moved = [k for k in s8 if not torch.equal(final[k], init[k.replace(".skills.7.", ".skills.6.")])]
    assert moved, "s8 did not move from its s7 initialisation"
    # heads were trained too
    assert any(k.startswith("heads.sentiment.") for k in final)

    params = json.loads((out / "params.json").read_text())
    s8_count = params["skills"]["s8"]
    assert params["skills"]["s8"] == params["skills"]["s7"]
    for p in params["tasks"].values():
        assert "s8" in p["skills"]
        assert p["trainable_activated"] < p["activated"]
    heads = params["total"] - params["shared"] - sum(params["skills"].values())
    assert params["trainable"] == s8_count + heads

    summary = json.loads((out / "results.json").read_text())
    assert set(summary["task_mix"]) == {"sentiment", "ner", "qa_match"}
    for r in summary["tasks"].values():
        assert "dev" in r and "test" in r and "trivial_dev" in r
    md = (out / "results.md").read_text()
    assert md.startswith("method: skillnet; scores: one checkpoint for all tasks") and "| task |" in md
    assert "qa_match" in md
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    evals = [r for r in log if r["split"] == "eval"]
    assert evals and "mix_target/ner" in evals[-1] and "mix_realised/ner" in evals[-1]
    assert (out / "best" / "finetune_tasks.json").is_file()  # one checkpoint for all tasks (mean dev)
    assert {r["checkpoint"] for r in summary["tasks"].values()} <= {"best (mean dev)", "final"}


def test_multitask_sparse_updates_and_ablation(tmp_path):
    """No frozen skills: tasks train their skills; s6 (no task) and s4 (dropped) never change."""
    init = _save_init(tmp_path / "init")
    out = tmp_path / "run"
    cfg = FinetuneConfig.from_dict(tiny_config(out, model={"init": str(tmp_path / "init")}, drop_skills=["s4"]))
    run_cli.run(cfg, tensorboard=False, progress=False)
    final = load_file(str(out / "export" / "model.safetensors"))
    for sid, name in ((3, "s4"), (5, "s6")):
        keys = [k for k in init if _skill_key(k, sid)]
        assert keys and all(torch.equal(final[k], init[k]) for k in keys), f"{name} changed"
    for sid in (0, 1, 2, 4, 6):  # s1 s2 s3 s5 s7 are used by some task
        keys = [k for k in init if _skill_key(k, sid)]
        assert any(not torch.equal(final[k], init[k]) for k in keys), f"skill id {sid} did not train"
    mc = json.loads((out / "export" / "config.json").read_text())
    assert mc["tasks"]["sentiment"] == ["s1", "s7"]


def test_prediction_on_a_mixed_file(tmp_path):
    out = tmp_path / "run"
    cfg = FinetuneConfig.from_dict(tiny_config(out, train={"max_steps": 3, "batch_size": 4, "eval_every": 0,
                                                           "lr": 1e-3, "log_every": 3}))
    run_cli.run(cfg, tensorboard=False, progress=False)
    inp = tmp_path / "in.jsonl"
    rows = [{"task": "ner", "tokens": list("张三在北京")}, {"task": "sentiment", "text": "很好"},
            {"task": "qa_match", "question": "车险怎么买", "candidates": ["寿险", "车险网站买", "年金"]},
            {"text": "差评"}]
    inp.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    outp = tmp_path / "out.jsonl"
    rc = predict_cli.main(["--model", str(out / "export"), "--input", str(inp), "--output", str(outp),
                           "--task", "sentiment", "--no-progress"])
    assert rc == 0
    got = [json.loads(x) for x in outp.read_text(encoding="utf-8").splitlines()]
    assert [g["task"] for g in got] == ["ner", "sentiment", "qa_match", "sentiment"]
    assert len(got[0]["prediction"]["tags"]) == 5
    assert got[1]["prediction"] in ("neg", "pos")
    assert 0 <= got[2]["prediction"]["best"] < 3 and len(got[2]["prediction"]["scores"]) == 3
    # an adapted model (new task on top of this export) still predicts the tasks it knew
    d2 = tiny_config(tmp_path / "adapt", model={"init": str(out / "export")},
                     train={"max_steps": 2, "batch_size": 4, "eval_every": 0, "lr": 1e-3, "log_every": 1})
    d2["tasks"] = [dict(d2["tasks"][0], name="sentiment2")]
    d2["new_skills"] = [{"name": "s8", "init_from": "s7", "tasks": ["sentiment2"]}]
    d2["freeze_old_skills"] = True
    run_cli.run(FinetuneConfig.from_dict(d2), tensorboard=False, progress=False)
    adapted = predict_cli.Predictor(tmp_path / "adapt" / "export")
    assert set(adapted.tasks) == {"sentiment", "ner", "qa_match", "sentiment2"}
    # the export's default task is the run's own task, and both files give it the skills it runs (s8 included)
    cfg = json.loads((tmp_path / "adapt" / "export" / "config.json").read_text())
    meta = json.loads((tmp_path / "adapt" / "export" / "finetune_tasks.json").read_text())["tasks"]
    assert cfg["default_task"] == "sentiment2"
    assert "s8" in cfg["tasks"]["sentiment2"] and meta["sentiment2"]["skills"] == cfg["tasks"]["sentiment2"]
    assert meta["sentiment"]["skills"] == cfg["tasks"]["sentiment"] and "s8" not in cfg["tasks"]["sentiment"]
    assert adapted.predict("ner", [{"tokens": list("张三")}])[0]["tags"][0] in adapted.tasks["ner"].label_list
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "ner", "tokens": ["a"]}\n{"task": "nli", "text": "x"}\n', encoding="utf-8")
    with pytest.raises(Exception, match=r"bad.jsonl:2: unknown task 'nli'"):
        predict_cli.predict_file(predict_cli.Predictor(out / "export"), str(bad), str(tmp_path / "o.jsonl"),
                                 progress=False)


def test_batch_source_resume_and_ranks():
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune.samplers import SamplerConfig, build_sampler
    from skillnet.finetune.source import MultiTaskBatchSource
    from skillnet.finetune.tasks import TaskData

    cfg = FinetuneConfig.from_dict(tiny_config(Path("unused")))
    tok = load_tokenizer(None)
    data = {t.name: TaskData(t, cfg, tok) for t in cfg.tasks}
    sizes = {n: d.num_train_rows() for n, d in data.items()}

    def source(rank=0, world=1):
        s = build_sampler(SamplerConfig(kind="proportional"), sizes, seed=5)
        return MultiTaskBatchSource(data, s, 2, rank=rank, world_size=world, seed=5)

    straight = source()
    seq = [next(straight) for _ in range(12)]
    a = source()
    for _ in range(7):
        next(a)
    b = source()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    for want in seq[7:]:
        got = next(b)
        assert got.task == want.task
        assert all(torch.equal(got.tensors[k], want.tensors[k]) for k in want.tensors)
    # two ranks: the same task each step, and together the rows of the one-process global batch
    def rows(t):
        return [[i for i in r.tolist() if i != tok.pad_id] for r in t]

    def source_g(rank, world, micro):
        s = build_sampler(SamplerConfig(kind="proportional"), sizes, seed=5)
        return MultiTaskBatchSource(data, s, micro, rank=rank, world_size=world, seed=5)

    r0, r1, whole = source_g(0, 2, 2), source_g(1, 2, 2), source_g(0, 1, 4)
    checked = 0
    for _ in range(10):
        x, y, w = next(r0), next(r1), next(whole)
        assert x.task == y.task == w.task
        if x.task != "qa_match":  # matching negatives are drawn per rank on purpose
            assert rows(x.tensors["input_ids"]) + rows(y.tensors["input_ids"]) == rows(w.tensors["input_ids"])
            checked += 1
    assert checked >= 3


BAD_CASES = [
    ("label not in label set", {"train": "bad_label.jsonl", "labels": ["neg", "pos"]}, "classification",
     r"bad_label.jsonl:4: label 'neutral' is not in the label set"),
    ("empty file", {"train": "empty.jsonl"}, "classification", r"empty.jsonl:1: file is empty"),
    ("span not in context", {"train": "bad_span.jsonl", "dev": "mrc_dev.jsonl"}, "span",
     r"bad_span.jsonl:3: answers\[0\] '上海' is not at character offset 0 of the context \(it does not occur"),
    ("pair missing field", {"train": "bad_pair.jsonl", "kind": "pair", "dev": None}, "classification",
     r"bad_pair.jsonl:3: missing field 'text_pair'"),
]


@pytest.mark.parametrize("case,over,typ,msg", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input_names_file_and_line(tmp_path, capsys, case, over, typ, msg):
    d = tiny_config(tmp_path / "run")
    t = copy.deepcopy(d["tasks"][0])
    t.update(type=typ, dev=str(FIX / "sent_dev.jsonl"), test=None)
    for k, v in over.items():
        t[k] = str(FIX / v) if k in ("train", "dev") and v else v
    if typ == "span":
        t["skills"] = ["s2", "s3", "s5", "s7"]
    d["tasks"] = [t]
    d["train"]["max_steps"] = 1
    d["train"]["eval_every"] = 0
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    rc = finetune_main(["--config", str(p), "--no-progress", "--no-tensorboard"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and "Traceback" not in err
    import re

    assert re.search(msg, err), err
    if case != "empty file":  # an empty file cannot be skipped: there is nothing to train on
        rc = finetune_main(["--config", str(p), "--no-progress", "--no-tensorboard", "--skip-bad"])
        err = capsys.readouterr().err
        assert rc == 0, err
        assert "skipped 1" in err


def test_early_stopping_stops_when_dev_does_not_improve(tmp_path):
    out = tmp_path / "run"
    d = tiny_config(out, train={"max_steps": 20, "batch_size": 4, "lr": 0.0, "eval_every": 1, "log_every": 1,
                                "early_stopping_patience": 2, "warmup_ratio": 0.0})
    d["tasks"] = d["tasks"][:1]
    results = run_cli.run(FinetuneConfig.from_dict(d), tensorboard=False, progress=False)
    summary = json.loads((out / "results.json").read_text())
    # lr 0: the first evaluation (step 1) is the best; after two more without improvement the trainer
    # stops right after that evaluation (Trainer.request_stop)
    assert summary["steps"] == 3
    assert results["sentiment"]["best_step"] == 1
