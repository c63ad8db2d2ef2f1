"""Realised budgets (issue 55, item 3): every row of a comparison trains every task for the same number of
updates, per seed, as drawn, not only in expectation. Joint rows draw stratified (finetune/samplers.py), and a
task-specific model trains exactly the count the joint rows draw (the same function)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from scipy.stats import hypergeom
from skillnet.finetune import compare
from skillnet.finetune import run as run_cli
from skillnet.finetune.config import FinetuneConfig
from skillnet.finetune.samplers import SamplerConfig, build_sampler

from tests.test_finetune_e2e import tiny_config

SEEDS = (0, 1, 2)
# The full profile's mixes: five NLU tasks of ~4,000 training rows (span's windows make it differ) at
# proportional alpha 1 over 4,800 steps; four NLG tasks at temperature 4 over 1,600 steps, with a cap K that
# bites on the largest task.
MIXES = {
    "nlu": ({"kind": "proportional", "alpha": 1.0}, 4800,
            {"sentiment": 4000, "ner": 4000, "domain": 4000, "qa_match": 3950, "span": 4417}),
    "nlg": ({"kind": "temperature", "temperature": 4.0, "size_cap": 3000}, 1600,
            {"csc": 2339, "poetry_title": 3000, "insuranceqa_answer": 9000, "insuranceqa_question": 800}),
}


def _cfg(tmp_path, sampler: dict, steps: int, seed: int, **train) -> FinetuneConfig:
    d = tiny_config(tmp_path, sampler=sampler)
    d["train"].update(max_steps=steps, seed=seed, **train)
    return FinetuneConfig.from_dict(d)


def _sampler(cfg: FinetuneConfig, sizes: dict[str, int], global_batch: int, accum: int):
    """The sampler a joint run builds (finetune/run.py setup): epoch length from the data, the run's horizon."""
    spe = max(1, sum(-(-n // global_batch) for n in sizes.values()))
    kw = {"grad_accum": accum} if accum != 1 else {}
    return build_sampler(cfg.sampler, sizes, seed=cfg.train.seed, steps_per_epoch=spe,
                         max_steps=cfg.train.max_steps, **kw)


def _joint_updates(cfg: FinetuneConfig, sizes: dict[str, int], global_batch: int, accum: int) -> dict[str, float]:
    """Updates per task a joint run realises: every micro-step of the run draws its task, as
    MultiTaskBatchSource does; a task's micro-batches over the accumulation are its updates."""
    s = _sampler(cfg, sizes, global_batch, accum)
    drawn = Counter(s.task_at(n) for n in range(cfg.train.max_steps * accum))
    return {t: drawn[t] / accum for t in sizes}


def _task_specific_updates(cfg: FinetuneConfig, sizes: dict[str, int], global_batch: int,
                           accum: int) -> dict[str, float]:
    kw = {"grad_accum": accum} if accum != 1 else {}
    return {t: float(n) for t, n in run_cli.task_specific_budget(cfg, sizes, global_batch, **kw).items()}


@pytest.mark.parametrize("accum", [1, 2])
@pytest.mark.parametrize("mix", ["nlu", "nlg"])
def test_realised_updates_are_equal_in_every_row_for_three_seeds(tmp_path, mix, accum):
    """Joint rows (one sampler for every joint method) and task-specific models train each task equally often,
    on every seed, and the seeds agree with each other (the counts are the stratified shares)."""
    sampler, steps, sizes = MIXES[mix]
    counts = {}
    for seed in SEEDS:
        cfg = _cfg(tmp_path, sampler, steps, seed)
        joint = _joint_updates(cfg, sizes, global_batch=8, accum=accum)
        ts = _task_specific_updates(cfg, sizes, global_batch=8, accum=accum)
        assert joint == ts, (seed, joint, ts)
        assert sum(joint.values()) == steps
        counts[seed] = joint
    assert counts[0] == counts[1] == counts[2]


def test_annealed_sampling_is_stratified_per_epoch(tmp_path):
    """PALs' annealed mix changes by epoch: each epoch's stretch gets its own exact shares, and the
    task-specific models train the total (the same function)."""
    sizes = {"a": 900, "b": 300, "c": 60}
    for seed in SEEDS:
        cfg = _cfg(tmp_path, {"kind": "annealed"}, 1000, seed)
        s = _sampler(cfg, sizes, global_batch=8, accum=1)
        assert s.num_epochs > 2
        for u0, u1, probs in s.segments(1000):
            from skillnet.finetune.samplers import largest_remainder

            drawn = Counter(s.task_at(n) for n in range(u0, u1))
            assert [drawn[t] for t in sizes] == largest_remainder(u1 - u0, probs)
        assert _joint_updates(cfg, sizes, 8, 1) == _task_specific_updates(cfg, sizes, 8, 1)


def test_largest_remainder_by_hand():
    from skillnet.finetune.samplers import largest_remainder

    # 7 x (0.5, 0.3, 0.2) = 3.5, 2.1, 1.4: floors 3, 2, 1; the one left goes to the largest remainder (.5)
    assert largest_remainder(7, [0.5, 0.3, 0.2]) == [4, 2, 1]
    # a tie goes to the earlier task; 4,800 x 1/5 splits evenly
    assert largest_remainder(10, [0.55, 0.45]) == [6, 4]
    assert largest_remainder(4800, [0.2] * 5) == [960] * 5


def test_stratified_marginal_matches_the_target_shares_and_is_mixed_through_the_run(tmp_path):
    """Over the whole run each task gets its share to within one update; inside the run the order is a random
    permutation, so the first tenth holds each task as a draw without replacement would (hypergeometric,
    scipy), not a block of one task."""
    sizes = MIXES["nlg"][2]
    cfg = _cfg(tmp_path, MIXES["nlg"][0], 20_000, seed=7)
    s = _sampler(cfg, sizes, 8, 1)
    target = s.probabilities(0)
    total = Counter(s.task_at(n) for n in range(20_000))
    for t, p in zip(sizes, target):
        assert abs(total[t] - 20_000 * p) < 1.0
    head = Counter(s.task_at(n) for n in range(2_000))
    for t in sizes:
        lo, hi = hypergeom.ppf([0.0005, 0.9995], 20_000, total[t], 2_000)
        assert lo <= head[t] <= hi, (t, head[t], lo, hi)


def test_task_at_is_pure_and_a_resume_continues_the_same_schedule(tmp_path):
    """Ranks agree without talking (two samplers, asked in different orders), a resume is "start at step s"
    (the state holds the cursor, not the schedule), and a resume under another horizon is refused: its
    schedule would be another one."""
    sizes = MIXES["nlu"][2]
    cfg = _cfg(tmp_path, MIXES["nlu"][0], 4800, seed=3)
    rank0, rank1 = _sampler(cfg, sizes, 8, 1), _sampler(cfg, sizes, 8, 1)
    forward = [rank0.task_at(n) for n in range(4800)]
    assert [rank1.task_at(n) for n in reversed(range(4800))][::-1] == forward
    first = _sampler(cfg, sizes, 8, 1)
    head = [next(first) for _ in range(1234)]
    state = json.loads(json.dumps(first.state_dict()))
    assert len(json.dumps(state)) < 1000  # the cursor and the parameters, not 4,800 draws
    resumed = _sampler(cfg, sizes, 8, 1)
    resumed.load_state_dict(state)
    assert head + [next(resumed) for _ in range(4800 - 1234)] == forward
    longer = _sampler(_cfg(tmp_path, MIXES["nlu"][0], 6000, seed=3), sizes, 8, 1)
    with pytest.raises(ValueError, match="stratified schedule covers 4800 updates"):
        longer.load_state_dict(state)


def test_iid_draws_stay_an_option_and_round_trip(tmp_path):
    """The old i.i.d. draw is kept (sampling studies may want it): its counts vary around the share, and the
    choice round-trips through the config's JSON."""
    sizes = MIXES["nlu"][2]
    cfg = _cfg(tmp_path, {**MIXES["nlu"][0], "draw": "iid"}, 4800, seed=0)
    assert FinetuneConfig.from_dict(json.loads(cfg.to_json())).sampler.draw == "iid"
    assert SamplerConfig().draw == "stratified"
    joint = _joint_updates(cfg, sizes, 8, 1)
    assert joint != _task_specific_updates(cfg, sizes, 8, 1)  # why compare refuses iid beside task-specific
    with pytest.raises(ValueError, match="unknown sampler draw 'shuffled'"):
        SamplerConfig(draw="shuffled")


def test_a_compare_realises_equal_updates_in_every_row_and_seed(tmp_path):
    """The whole path: joint and task-specific rows of one compare, three seeds, a proportional mix over tasks
    of different sizes; each run's logged counts (results.json) agree row by row, seed by seed."""
    d = tiny_config(tmp_path / "unused", sampler={"kind": "proportional", "alpha": 1.0})
    d["train"].update(max_steps=7, eval_every=7, log_every=7)
    d["tasks"][0]["max_train_examples"] = 8  # sentiment smaller, the others as packaged: unequal shares
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "cmp"
    assert compare.main(["--config", str(cfg), "--methods", "skillnet", "task_specific", "--seeds", *map(str, SEEDS),
                         "--no-plots", "--output-dir", str(out), "--in-process", "--threads", "1"]) == 0
    agg = json.loads((out / "comparison.json").read_text())
    per_seed = {m: r["updates_per_seed"] for m, r in agg["methods"].items()}
    assert per_seed["skillnet"] == per_seed["task_specific"]
    assert len({json.dumps(u, sort_keys=True) for u in per_seed["skillnet"]}) == 1  # the seeds agree too
    assert sum(per_seed["skillnet"][0].values()) == 7 and len(set(per_seed["skillnet"][0].values())) > 1
    assert agg["budget_gaps"] == {} and agg["budgets"]["equal"]
