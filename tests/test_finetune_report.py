"""`python -m skillnet.finetune.report`: pictures and one self-contained HTML page from a run directory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.finetune import report
from skillnet.finetune import run as run_cli
from skillnet.finetune.config import FinetuneConfig

from tests.test_finetune_e2e import tiny_config


def _run(out: Path, method: str = "skillnet") -> Path:
    d = tiny_config(out, method=method)
    d["train"].update(max_steps=6, eval_every=2, log_every=2)
    run_cli.run(FinetuneConfig.from_dict(d), tensorboard=False, progress=False)
    return out


def test_report_of_a_finetuning_run_draws_every_picture(tmp_path, capsys):
    run = _run(tmp_path / "ft")
    assert report.main([str(run)]) == 0
    out = run / "report"
    for name in ("dev_curves.png", "task_mix.png", "skill_map.png", "parameters.png"):
        assert (out / name).stat().st_size > 5000, name
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "src=\"http" not in page  # self-contained
    results = json.loads((run / "results.json").read_text())
    for name, r in results["tasks"].items():
        assert f"<td>{name}</td>" in page
        assert f"<td>{r['dev'][r['metric']]:.1f}</td>" in page


@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
def test_report_of_a_learned_map_run_and_of_a_pretraining_log(tmp_path):
    run = _run(tmp_path / "learn", method="learnable")
    assert (run / "skill_map.json").is_file()  # the learned map is what the report draws, not Table 2
    report.build(run)
    assert (run / "report" / "skill_map.png").stat().st_size > 5000
    pt = tmp_path / "pt"
    pt.mkdir()
    lines = [{"step": s, "mlm/loss": 10 - s / 10, "mlm/acc": s / 100, "nsp/loss": 0.7, "mix/mlm": 0.5,
              "mix/nsp": 0.5, "split": "train"} for s in range(10, 110, 10)]
    (pt / "log.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n{\"cut by a kill\n")
    page = report.build(pt)
    assert (pt / "report" / "pretrain.png").stat().st_size > 5000 and "Last logged step: 100" in page.read_text()


def test_report_of_an_empty_directory_is_one_error_line(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")


def test_finetune_writes_hparams_with_the_final_scores_and_the_config(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tb"
    d = tiny_config(out)
    d["train"].update(max_steps=4, eval_every=2, log_every=2)
    run_cli.run(FinetuneConfig.from_dict(d), tensorboard=True, progress=False)
    results = json.loads((out / "results.json").read_text())
    files = list((out / "tensorboard" / "hparams").rglob("events.out.tfevents.*"))
    assert len(files) == 1, files
    ev = EventAccumulator(str(files[0]))
    ev.Reload()
    for name, r in results["tasks"].items():
        got = ev.Scalars(f"hparam/dev/{name}")[-1].value
        assert got == pytest.approx(r["dev"][r["metric"]], abs=1e-4)
    mains = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert len(mains) == 1
    main = EventAccumulator(str(mains[0]))
    main.Reload()
    assert "config/text_summary" in main.Tags()["tensors"]


def test_pretrain_picture_has_no_empty_mix_panel_for_one_objective(tmp_path):
    """A dense MLM or BART denoising run has no objective mix: two panels, not a blank third one."""
    import matplotlib.image as mpimg
    from skillnet.finetune.report import pretrain_curves

    one = [{"step": s, "denoise/loss": 5.0 / s, "denoise/acc": 0.01 * s, "split": "train"} for s in (1, 2, 3)]
    two = [{**r, "nsp/loss": 0.7, "mix/denoise": 0.5, "mix/nsp": 0.5} for r in one]
    assert pretrain_curves(one, tmp_path / "one.png") and pretrain_curves(two, tmp_path / "two.png")
    w_one, w_two = mpimg.imread(tmp_path / "one.png").shape[1], mpimg.imread(tmp_path / "two.png").shape[1]
    assert w_one < w_two * 0.8
