"""The reproduction in parts (experiments/parts.py): every stage in one part, every part of the full profile within
2.5 hours on the estimate, what each part needs, the per-seed parts' comparisons, `--list-parts`."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from skillnet.experiments import parts as P
from skillnet.experiments.profiles import PROFILES
from skillnet.experiments.runner import Runner, compare
from skillnet.experiments.stages import STAGES

REPO = Path(__file__).resolve().parents[1]


def test_every_stage_is_in_exactly_one_group_in_stage_order():
    assert P.check_groups() == []
    order = [s.name for s in STAGES]
    flat = [s for g in P.GROUPS for s in g.stages]
    assert flat == order  # a part never reads a stage of a later part


def test_every_part_of_the_full_profile_fits_the_limit_and_nlu_main_is_split_by_seed():
    full = PROFILES["full"]
    est = P.stage_estimates(full)
    parts = P.parts_of(full, est=est)
    over = {x.name: P.estimated_seconds(x, full, est) / 3600 for x in parts
            if P.estimated_seconds(x, full, est) > P.PART_LIMIT_S}
    assert not over, over
    assert est["nlu_main"] > P.PART_LIMIT_S  # the estimate that forces the split
    assert [x.name for x in parts if x.group == "nlu_main"] == [f"nlu_main.seed{k}" for k in full.seeds]
    # under the limit, but above what leaves a sitting room for set-up and the estimate's error
    assert P.SPLIT_ABOVE_S < est["nlg_main"] + est["nlg_adapt"] < P.PART_LIMIT_S
    assert [x.name for x in parts if x.group == "nlg_main"] == [f"nlg_main.seed{k}" for k in full.seeds]
    # the seed parts share the stage's estimate
    seeds = [P.estimated_seconds(x, full, est) for x in parts if x.group == "nlu_main"]
    assert sum(seeds) == pytest.approx(est["nlu_main"] + est["nlu_adapt"])
    assert sum(P.estimated_seconds(x, full, est) for x in parts) == pytest.approx(sum(est.values()))


def test_what_each_part_needs_follows_the_stage_graph():
    full = PROFILES["full"]
    parts = P.parts_of(full)
    needs = {x.name: [n.name for n in P.needs(parts, x)] for x in parts}
    assert needs["data"] == []
    assert all("data" in v for k, v in needs.items() if k != "data")  # the vocab over every task, whichever first
    data = P.find(parts, "data")
    assert {"nlu_tasks", "nlg_tasks", "vocab"} <= set(data.stages)
    # adaptation runs in the part whose dev-selected models it continues: nothing reads them from another part
    assert P.find(parts, "nlu_main.seed1").stages == ("nlu_main", "nlu_adapt")
    assert needs["nlu_side"] == ["data", "bert_pt", "nlu_tune", "nlu_loss_scale"]
    assert needs["nlu_main.seed1"] == ["data", "bert_pt", "nlu_tune", "nlu_loss_scale"]
    assert needs["nlu_loss_scale"] == ["data", "bert_pt", "nlu_tune"]  # each row at its chosen lr
    assert needs["nlg_side"] == ["data", "bart_pt", "nlg_tune"]
    assert "bert_pt" not in needs["nlg_main.seed0"]


def test_a_seed_part_runs_its_seeds_runs_only_and_leaves_no_one_seed_table(tmp_path, monkeypatch):
    r = Runner(tmp_path, PROFILES["quick"])
    seen = []

    def fake_run(cmd, check_file=None):
        seen.append(cmd)
        (tmp_path / "cmp").mkdir(exist_ok=True)
        (tmp_path / "cmp" / "comparison.json").write_text("{}")  # compare's table over the seeds it ran
        (tmp_path / "cmp" / "curves.png").write_bytes(b"png")  # and its pictures

    monkeypatch.setattr(r, "run", fake_run)
    r.only_seeds = [1]
    compare(r, tmp_path / "c.json", tmp_path / "cmp", ["skillnet", "base=dense_joint"], [0, 1], tmp_path)
    cmd = seen[-1]
    assert cmd[cmd.index("--seeds") + 1:cmd.index("--output-dir")] == ["1"]
    assert not (tmp_path / "cmp" / "comparison.json").exists()  # the stage's done-check reads it
    assert not (tmp_path / "cmp" / "curves.png").exists()  # a report would show one seed's curves as the table's
    # once the seed's runs are there, a rerun of the part runs nothing
    for lab in ("skillnet", "base"):
        (tmp_path / "cmp" / lab / "seed1").mkdir(parents=True)
        (tmp_path / "cmp" / lab / "seed1" / "results.json").write_text("{}")
    n = len(seen)
    compare(r, tmp_path / "c.json", tmp_path / "cmp", ["skillnet", "base=dense_joint"], [0, 1], tmp_path)
    assert len(seen) == n and r.commands  # recorded, not run
    r.only_seeds = None  # the aggregation: every seed, one compare
    compare(r, tmp_path / "c.json", tmp_path / "cmp", ["skillnet", "base=dense_joint"], [0, 1], tmp_path)
    assert seen[-1][seen[-1].index("--seeds") + 1:seen[-1].index("--output-dir")] == ["0", "1"]


def test_status_done_missing_and_stale():
    quick = PROFILES["quick"]
    parts = P.parts_of(quick)
    data, bert = parts[0], parts[1]
    rec = {"data": {"protocol_version": P.PROTOCOL_VERSION, "profile_hash": "h", "outputs": {"vocab": "v1"}},
           "bert_pt": {"protocol_version": P.PROTOCOL_VERSION, "profile_hash": "h", "inputs": {"vocab": "v1"}}}
    assert P.status_of(data, rec, quick, "h") == "done"
    assert P.status_of(bert, rec, quick, "h") == "done"
    assert P.status_of(parts[2], rec, quick, "h") == "missing"
    assert P.status_of(bert, rec, quick, "other") == "stale (another profile)"
    rec["data"]["outputs"]["vocab"] = "v2"  # the data part was rerun with another vocab
    assert P.status_of(bert, rec, quick, "h") == "stale (input vocab changed)"
    rec["data"]["protocol_version"] = P.PROTOCOL_VERSION - 1
    assert P.status_of(data, rec, quick, "h").startswith("stale (protocol")


def test_list_parts_prints_every_part_with_time_status_and_needs(tmp_path):
    from skillnet.experiments.provenance import profile_hash

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "provenance.json").write_text(json.dumps(
        {"protocol_version": P.PROTOCOL_VERSION, "profile_hash": profile_hash(PROFILES["full"]), "wall_s": 90.0}))
    r = subprocess.run([sys.executable, "-m", "skillnet.experiments", "--profile", "full", "--list-parts",
                        "--results", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln for ln in r.stdout.splitlines()[1:] if ln and not ln.startswith("(")}
    assert set(lines) == {x.name for x in P.parts_of(PROFILES["full"])}
    assert "0.03 h measured" in lines["data"] and " done " in lines["data"]
    assert "estimated" in lines["nlu_main.seed0"] and "missing" in lines["nlu_main.seed0"]
    for ln in lines.values():  # every part at 2.5 h or less
        assert float(ln.split()[1]) <= 2.5, ln


def test_an_unknown_part_is_one_line_naming_the_parts(tmp_path):
    r = subprocess.run([sys.executable, "-m", "skillnet.experiments", "--quick", "--part", "nope", "--out",
                        str(tmp_path / "o"), "--results", str(tmp_path / "R")], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "no part named 'nope'" in r.stderr and "bert_pt" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_part_says_what_it_needs_from_earlier_parts(tmp_path):
    r = subprocess.run([sys.executable, "-m", "skillnet.experiments", "--quick", "--part", "nlu_loss_scale", "--out",
                        str(tmp_path / "o"), "--results", str(tmp_path / "R")], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2, r.stdout
    assert "part nlu_loss_scale needs part(s) bert_pt, nlu_tune committed" in r.stderr
    assert "--part bert_pt" in r.stderr
