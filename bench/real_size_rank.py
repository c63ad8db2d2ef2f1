"""One rank of bench/real_size.py: a real-size training run under the DeepSpeed launcher, with a memory probe.

    deepspeed --num_gpus 2 bench/real_size_rank.py OUT bert pretrain/run.py ARGS...   # sparse MLM+NSP (run.py)
    deepspeed --num_gpus 2 bench/real_size_rank.py OUT bart --preset base --seq-len 128 --task T \\
        --ds-config J --steps 3 --output-dir D [--gradient-checkpointing]          # SkillNet-BART, one task

``bert`` runs ``pretrain/run.py``'s own ``main`` with ARGS unchanged. ``bart`` runs SkillNet-BART through the
same ``Trainer`` that generation fine-tuning uses (pre-training's ``--arch bart`` is dense BART, so a sparse
BART is only ever trained there), on synthetic full-length rows of one task, so source and target are both
``--seq-len`` tokens, the shape the memory model assumes.

The probe wraps ``Trainer`` from outside (no line of the trainer changes) and writes ``OUT/rank<r>.json``:

- ``baseline``: resident bytes after the imports, the process group and a warm-up autograd pass, before the
  model exists (what `experiments/memory.py` does not model);
- ``init``: resident and peak bytes once the engine exists, and the engine's tensors by owner (below);
- per optimizer step: wall time, the tasks its forward passes ran, the skills whose weights changed, and the
  resident high-water mark. The mark is reset after the engine is built (``/proc/self/clear_refs``), so the
  step peak is not the model construction's; the final checkpoint write is outside it too;
- ``engine``: the bytes of every tensor the ZeRO optimizer holds, by attribute name, each storage counted once
  (module parameters first, then the base optimizer's state, then the rest), read after the last step, and
  ``engine_before_step`` the same before the first optimizer step (when the gradient partitions exist).

Skill weights are compared by hash: the rank's copy of each skill parameter (its ZeRO-3 partition, else the
full tensor). In fp32 the module weights are the fp32 master weights (DeepSpeed copies them back each step).
"""

from __future__ import annotations

import gc
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _status(key: str) -> int:
    """A byte count from /proc/self/status (VmRSS, VmHWM, RssShmem)."""
    from skillnet.experiments.memory import proc_bytes

    return proc_bytes(key)


def _reset_peak() -> None:
    # "5" resets this process's VmHWM to its current RSS (Linux >= 4.0)
    Path("/proc/self/clear_refs").write_text("5")


def _tensors(obj: Any, depth: int = 0) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x, depth + 1)


def engine_bytes(trainer: Any) -> dict[str, int]:
    """Bytes of the tensors the engine holds, by owner; a storage shared by several owners counts once, under
    the first (module parameters, then the optimizer's state, then the ZeRO optimizer's attributes)."""
    seen: set[int] = set()

    def take(ts: Any) -> int:
        n = 0
        for t in ts:
            st = t.untyped_storage()
            if st.nbytes() and st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                n += st.nbytes()
        return n

    out = {"module_params": take(getattr(p, "ds_tensor", p.data) for p in trainer.module.parameters())}
    out["optimizer_state"] = take(t for s in trainer.base_optimizer.state.values() for t in _tensors(s))
    zopt = trainer.engine.optimizer
    for name, val in sorted(vars(zopt).items()):
        if name != "optimizer":
            b = take(_tensors(val))
            if b:
                out[name.split("__")[-1]] = b  # name-mangled private attributes of the ZeRO-3 optimizer
    masters = [t for g in trainer.base_optimizer.param_groups for t in g["params"]]
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        masters += list(getattr(zopt, attr, []) or [])
    out["master_grads"] = take(t.grad for t in masters if t.grad is not None)
    return {k: v for k, v in out.items() if v}


def skill_hashes(model: Any) -> dict[str, str]:
    """Skill name -> hash of this rank's copy of its weights."""
    from skillnet.model import skill_parameters

    out = {}
    for name, ps in skill_parameters(model).items():
        h = hashlib.blake2b(digest_size=16)
        for p in ps:
            t = getattr(p, "ds_tensor", p.data).detach()
            h.update(t.contiguous().view(-1).numpy().data)  # a view of the tensor's memory: no copy
        out[name] = h.hexdigest()
    return out


class Probe:
    def __init__(self, out: Path, baseline: int) -> None:
        self.out, self.rec = out, {"baseline": baseline, "steps": []}
        self.tasks: list[str] = []
        self.hashes: dict[str, str] = {}

    def install(self) -> None:
        from skillnet.training import Trainer

        probe, init, step = self, Trainer.__init__, Trainer.train_step

        def wrapped_init(trainer: Any, model: Any, *a: Any, **k: Any) -> None:
            init(trainer, model, *a, **k)
            probe.after_init(trainer, model)

        def wrapped_step(trainer: Any, *a: Any, **k: Any) -> Any:
            probe.tasks.clear()
            t0 = time.perf_counter()
            res = step(trainer, *a, **k)
            probe.after_step(trainer, time.perf_counter() - t0)
            return res

        Trainer.__init__, Trainer.train_step = wrapped_init, wrapped_step  # type: ignore[method-assign]

        # The gradient partitions exist between the backward pass and the optimizer step (ZeRO-2 frees them
        # after it): the engine's bytes are read there too.
        from deepspeed.runtime.engine import DeepSpeedEngine

        engine_step = DeepSpeedEngine.step

        def wrapped_engine_step(engine: Any, *a: Any, **k: Any) -> Any:
            if getattr(probe, "trainer", None) is not None and "engine_before_step" not in probe.rec:
                probe.rec["engine_before_step"] = engine_bytes(probe.trainer)
            return engine_step(engine, *a, **k)

        DeepSpeedEngine.step = wrapped_engine_step  # type: ignore[method-assign]

    def after_init(self, trainer: Any, model: Any) -> None:
        from skillnet.model.registry import build_router

        gc.collect()
        router = build_router(model.config)
        self.used = lambda task: sorted(model.config.skill_names[i] for i in router.activated(task)[0])

        def record_task(_m: Any, _a: Any, kw: dict[str, Any]) -> None:
            task = kw.get("task")
            if isinstance(task, str):
                self.tasks.append(task)

        model.register_forward_pre_hook(record_task, with_kwargs=True)
        self.rec["init"] = {"rss": _status("VmRSS"), "peak": _status("VmHWM"), "engine": engine_bytes(trainer),
                            "zero_stage": trainer.zero_stage,
                            "params": sum(int(getattr(p, "ds_numel", p.numel())) for p in model.parameters())}
        self.hashes = skill_hashes(model)
        self.model, self.trainer = model, trainer
        _reset_peak()

    def after_step(self, trainer: Any, seconds: float) -> None:
        peak, rss = _status("VmHWM"), _status("VmRSS")
        h = skill_hashes(self.model)
        tasks = sorted(set(self.tasks))
        self.rec["steps"].append({
            "seconds": seconds, "peak": peak, "rss": rss, "shmem": _status("RssShmem"), "tasks": tasks,
            "used": sorted({s for t in tasks for s in self.used(t)}),
            "moved": sorted(s for s in h if h[s] != self.hashes[s]),
        })
        self.hashes = h
        self.rec["engine"] = engine_bytes(trainer)

    def write(self, rank: int) -> None:
        self.rec["peak_whole_run"] = _status("VmHWM")  # since the reset: includes the final checkpoint write
        (self.out / f"rank{rank}.json").write_text(json.dumps(self.rec, indent=1))


class FullLengthRows:
    """One generation task forever: source and target of exactly ``seq_len`` tokens, different per rank."""

    def __init__(self, task: str, rank: int, micro_batch: int, seq_len: int, vocab: int) -> None:
        self.task, self.rank, self.b, self.t, self.vocab, self.i = task, rank, micro_batch, seq_len, vocab, 0

    def __iter__(self) -> FullLengthRows:
        return self

    def __next__(self) -> Any:
        import torch
        from skillnet.training.batch import Batch

        g = torch.Generator().manual_seed(1000 * self.rank + self.i)
        self.i += 1
        x = torch.randint(5, self.vocab, (self.b, self.t), generator=g)
        y = torch.randint(5, self.vocab, (self.b, self.t), generator=g)
        return Batch(self.task, {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": y})

    def state_dict(self) -> dict[str, Any]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.i = int(state["i"])


def run_bart(argv: list[str]) -> None:
    import argparse

    import torch
    from skillnet.model.bart import SkillNetBartConfig, SkillNetBartForConditionalGeneration
    from skillnet.training import TrainConfig, Trainer, prepare
    from skillnet.training import dist as D
    from skillnet.training.activation_checkpointing import (
        ActivationCheckpointing,
        enable_activation_checkpointing,
    )

    p = argparse.ArgumentParser()
    for flag in ("--preset", "--task", "--ds-config", "--output-dir"):
        p.add_argument(flag, required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--gradient-checkpointing", action="store_true")
    a = p.parse_args(argv)
    cfg, _ = prepare(TrainConfig(output_dir=a.output_dir, max_steps=a.steps, lr=1e-4, ds_config=a.ds_config,
                                 log_every=1, tensorboard=False, progress=False))
    torch.manual_seed(0)
    model = SkillNetBartForConditionalGeneration(SkillNetBartConfig.preset(a.preset))
    if a.gradient_checkpointing:
        enable_activation_checkpointing(model, ActivationCheckpointing(enabled=True, source="flag"))
    model.train()
    rows = FullLengthRows(a.task, D.rank(), cfg.micro_batch_size, a.seq_len, model.config.vocab_size)
    trainer = Trainer(model, rows, cfg)
    for _ in range(a.steps):
        trainer.train_step()


def main() -> int:
    argv = [x for x in sys.argv[1:] if not x.startswith("--local_rank")]
    out, mode, rest = Path(argv[0]), argv[1], argv[2:]
    import deepspeed  # noqa: F401  (its import is part of the baseline)
    import torch
    import transformers  # noqa: F401
    from skillnet.training import dist as D

    rank, _ = D.init_distributed()
    w = torch.randn(64, 64, requires_grad=True)  # thread pools and the autograd engine start before the baseline
    (w @ w).sum().backward()
    del w
    if mode == "bert":
        import skillnet.pretrain.run as pretrain_run
    gc.collect()
    probe = Probe(out, _status("VmRSS"))
    probe.install()
    if mode == "bert":
        if rest and rest[0].endswith("run.py"):
            rest = rest[1:]
        rc = pretrain_run.main(rest)
    else:
        run_bart(rest)
        rc = 0
    out.mkdir(parents=True, exist_ok=True)
    probe.write(rank)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
