"""Rank-0 observability: TensorBoard scalars, one JSON line per logging step, a tqdm bar."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
from skillnet.common.files import atomic_write_text
from tqdm import tqdm

__all__ = ["MetricsLogger", "accuracy_metrics", "truncate_log"]


class MetricsLogger:
    """Writes only when ``enabled`` (rank 0). JSON lines go to stdout and ``<output_dir>/log.jsonl``.

    TensorBoard tags: ``train/<name>`` for every key of a training record (``train/mlm/loss``,
    ``train/lr``, ``train/grad_norm``, ``train/tokens_per_s``, ``train/mix/mlm`` (the realised task or
    objective mix since the start), ``train/skill_grad_norm/s7`` (averaged over the window's steps that
    used the skill), ``train/skill_drift/s7`` (||W - W0|| / ||W0||) ...) except the mixed ``loss``,
    ``eval/<name>`` for evaluator results, and the run's config as text.
    """

    def __init__(
        self,
        output_dir: str | Path,
        enabled: bool,
        total_steps: int,
        initial_step: int = 0,
        tensorboard: bool = True,
        progress: bool = True,
        drop_eval_at_initial: bool = False,
    ) -> None:
        self.enabled = enabled
        self.tb = None
        self.jsonl = None
        self.bar = None
        if not enabled:
            return
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        dropped = truncate_log(out / "log.jsonl", initial_step, drop_eval_at_step=drop_eval_at_initial)
        if dropped:
            self.message(
                f"[trainer] log.jsonl: dropped {dropped} line(s) past step {initial_step}, where this run "
                f"continues (they are logged again as the steps are replayed)"
            )
        self.jsonl = open(out / "log.jsonl", "a", buffering=1)  # noqa: SIM115 (lives as long as the logger)
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415

            # Same rule for TensorBoard: events after initial_step are purged.
            self.tb = SummaryWriter(log_dir=str(out / "tensorboard"), purge_step=initial_step + 1)
        if progress:
            self.bar = tqdm(
                total=total_steps,
                initial=initial_step,
                desc="train",
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=1.0,
            )

    def log(self, record: dict[str, Any], prefix: str = "train") -> None:
        if not self.enabled:
            return
        step = int(record["step"])
        # 6 significant digits, not decimals: a warmup learning rate of 3e-9 must not log as 0.0.
        clean = {
            k: (float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v)
            for k, v in record.items()
        }
        clean["split"] = prefix
        line = json.dumps(clean, sort_keys=False)
        if self.bar is not None:
            tqdm.write(line, file=sys.stdout)
        else:
            print(line, flush=True)
        assert self.jsonl is not None
        self.jsonl.write(line + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if k == "step" or not isinstance(v, (int, float)) or isinstance(v, bool):
                    continue
                self.tb.add_scalar(f"{prefix}/{k}", v, step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """A text panel in TensorBoard (e.g. the run's config), as a code block."""
        if self.tb is not None:
            self.tb.add_text(tag, "```\n" + text + "\n```", step)

    def advance(self, n: int = 1, postfix: dict[str, Any] | None = None) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            tqdm.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()
        if self.jsonl is not None:
            self.jsonl.close()
        self.bar = self.tb = self.jsonl = None


def truncate_log(path: Path, step: int, drop_eval_at_step: bool = False) -> int:
    """Keep only the lines of ``path`` logged at or before ``step``; returns how many were dropped.

    A run that resumes from the checkpoint of step S replays steps S+1... . Lines a killed run had
    logged past S (and a last line cut short by the kill) are dropped, atomically, so every reader of
    log.jsonl sees each step once, as in an uninterrupted run. A run from scratch (S = 0) starts an
    empty log. `drop_eval_at_step`: the evaluation at S came after its checkpoint (a run's last step is
    saved before its final evaluation), so the resumed run evaluates S again, and the earlier line goes too.
    """
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
            at = int(rec["step"])
            keep = at < step or (at == step and not (drop_eval_at_step and rec.get("split") == "eval"))
        except (ValueError, KeyError, TypeError):
            keep = False
        if keep:
            kept.append(line + "\n")
        else:
            dropped += 1
    if dropped:
        atomic_write_text(path, "".join(kept))
    return dropped


def accuracy_metrics(batch: Any, output: Any) -> dict[str, tuple[float, float]]:
    """Default per-micro-batch metrics as (numerator, denominator) sums, summed over ranks and steps.

    MLM-style: ``labels`` [B,T] with -100 = ignore against ``logits`` [B,T,V] -> ``acc``.
    Classification: ``labels`` [B] or ``next_sentence_label`` [B] against ``logits`` [B,C] -> ``acc``.
    Anything else (CRF, spans, regression) yields nothing; tasks can pass their own metrics_fn.
    """
    reported = getattr(output, "metrics", None)
    aux: dict[str, tuple[float, float]] = {}
    if isinstance(reported, dict):
        # Auxiliary losses (MoE balance, orthogonality) are averaged over micro-batches like the loss.
        aux = {k: (_detached(v), 1.0) for k, v in reported.items() if k.startswith("aux_")}
        # The model may report counts itself (SkillNet-BERT: {"mlm_correct": c, "mlm_count": n}).
        pairs = {k[: -len("_correct")]: k for k in reported if k.endswith("_correct")}
        out = {}
        for stem, kc in pairs.items():
            kn = stem + "_count"
            if kn in reported:
                out["acc"] = (_detached(reported[kc]), _detached(reported[kn]))
        if out:
            return {**out, **aux}
    return {**_accuracy_from_logits(batch, output), **aux}


def _accuracy_from_logits(batch: Any, output: Any) -> dict[str, tuple[float, float]]:
    logits = getattr(output, "logits", None)
    if logits is None or not hasattr(logits, "argmax"):
        return {}
    tensors = batch.tensors
    labels = tensors.get("labels", tensors.get("next_sentence_label"))
    if labels is None or labels.dtype.is_floating_point:
        return {}
    if logits.dim() == labels.dim() + 1 and logits.shape[:-1] == labels.shape:
        pred = logits.detach().argmax(-1)
        valid = labels.ne(-100)
        return {"acc": ((pred.eq(labels) & valid).sum(), valid.sum())}
    if logits.dim() == 2 and labels.dim() >= 2:
        # MLM logits gathered at predicted positions only: [M, V] against labels[labels != -100].
        target = labels[labels.ne(-100)]
        if target.numel() == logits.shape[0]:
            return {"acc": (logits.detach().argmax(-1).eq(target).sum(), float(target.numel()))}
    return {}


def _detached(v: Any) -> Any:
    """A reported value as the trainer sums it: a tensor stays on its device (read back at logging steps)."""
    return v.detach() if isinstance(v, torch.Tensor) else float(v)
