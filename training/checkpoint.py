"""Checkpoint layout, atomic writes, completeness markers, rotation, the run lock and `CheckpointManager`.

    <output_dir>/checkpoints/
        latest                      text file naming the newest complete tag (for people and tools)
        .run.lock                   held (flock) by every rank of the run that uses this directory
        step_00000100/
            trainer_rank{r}.pt      per-rank: step, batch-source state, RNG states (exact data position)
            plain.pt                (single process) model + optimizer + scheduler
            <DeepSpeed files>       (DeepSpeed) model / ZeRO optimizer partitions / scheduler
            complete                written last, after every rank finished writing

A checkpoint counts only once its `complete` marker exists: `--resume auto` takes the newest marked
one, so a save that was cut short (a kill, or ranks still writing when a requeued run starts) is never
loaded. A run also waits, before resuming, until no rank of an earlier run in the same directory is
alive (`hold_run_lock`), so a restart cannot read or rotate checkpoints while they are being written.

`CheckpointManager` writes and finds checkpoints in this layout for one rank; the trainer gives it what
to save (its own state, and the DeepSpeed engine or the plain model / optimizer / scheduler).
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from skillnet.common.files import atomic_torch_save, atomic_write_text, fsync_dir, fsync_tree
from skillnet.common.safe_load import UntrustedCheckpointError, check_file
from skillnet.common.safe_load import load as safe_load

from . import dist as D
from .reshard import (
    UNIVERSAL_DIR,
    ensure_universal,
    group_hyperparams,
    read_trainer_state,
    restore_group_hyperparams,
)

__all__ = [
    "COMPLETE_MARKER",
    "CheckpointError",
    "ResumeError",
    "checkpoint_problem",
    "check_trusted",
    "kind_problem",
    "CheckpointManager",
    "checkpoint_root",
    "tag_for_step",
    "rotate",
    "mark_complete",
    "unmark_complete",
    "is_complete",
    "complete_tags",
    "hold_run_lock",
    "rng_state",
    "set_rng_state",
    "reseed",
]


COMPLETE_MARKER = "complete"


class ResumeError(RuntimeError):
    """A checkpoint that is intact but that this run cannot continue as its options ask (message says why)."""


class CheckpointError(FileNotFoundError):
    """No checkpoint the run can resume from where one was asked for (the message names each and why)."""


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def tag_for_step(step: int) -> str:
    return f"step_{step:08d}"


def mark_complete(ckpt_dir: Path, step: int) -> None:
    """Written by rank 0 after every rank finished writing ``ckpt_dir``: from now on it may be resumed."""
    atomic_write_text(ckpt_dir / COMPLETE_MARKER, json.dumps({"step": step, "time": time.time()}) + "\n")


def unmark_complete(ckpt_dir: Path) -> None:
    """Before files of ``ckpt_dir`` are (re)written: an old marker must not vouch for a mix of two saves."""
    (ckpt_dir / COMPLETE_MARKER).unlink(missing_ok=True)


def is_complete(ckpt_dir: Path) -> bool:
    return (ckpt_dir / COMPLETE_MARKER).is_file()


def _torch_file_problem(f: Path) -> str | None:
    """Why ``f`` (a torch.save zip archive) cannot be loaded, cheaply: missing, or cut short (the zip's
    central directory sits at its end, so a truncated file has none)."""
    import zipfile  # noqa: PLC0415

    if not f.is_file():
        return f"{f.name} is missing"
    if not zipfile.is_zipfile(f):
        return f"{f.name} is damaged (cut short?)"
    return None


def checkpoint_problem(tdir: Path) -> str | None:
    """Why checkpoint ``tdir`` cannot be resumed (None: it looks intact). Checks the marker, every rank's
    trainer state, and the plain or DeepSpeed files every rank needs, without loading the weights."""
    if not tdir.is_dir():
        return "it does not exist"
    if not is_complete(tdir):
        return f"incomplete checkpoint (no '{COMPLETE_MARKER}' marker: its save was interrupted)"
    problem = _torch_file_problem(tdir / "trainer_rank0.pt")
    if problem:
        return problem
    try:
        world = int(read_trainer_state(tdir)["world_size"])
    except UntrustedCheckpointError:  # not damaged: refused, and no older checkpoint is silently taken instead
        raise
    except Exception as e:  # noqa: BLE001 - any unreadable state is a damaged checkpoint
        return f"trainer_rank0.pt cannot be read ({type(e).__name__})"
    for r in range(1, world):
        problem = _torch_file_problem(tdir / f"trainer_rank{r}.pt")
        if problem:
            return problem
    if (tdir / "plain.pt").exists():
        return _torch_file_problem(tdir / "plain.pt")
    model = [*tdir.glob("mp_rank_*_model_states.pt"), *tdir.glob("zero_pp_rank_0_mp_rank_*_model_states.pt")]
    if not model:
        return "neither plain.pt nor DeepSpeed's model states are there"
    zero3 = sorted(tdir.glob("zero_pp_rank_*_mp_rank_*_model_states.pt"))
    if zero3:  # ZeRO-3: each rank keeps its own model states
        model = zero3
        for r in range(world):
            if not any(f.name.startswith(f"zero_pp_rank_{r}_") for f in zero3):
                return f"rank {r}'s DeepSpeed model states are missing"
    optim = list(tdir.glob("*zero_pp_rank_*optim_states.pt"))
    if optim:  # ZeRO-1/2/3: one optimizer partition per rank
        for r in range(world):
            if not any(f.name.startswith(f"zero_pp_rank_{r}_") or f"_zero_pp_rank_{r}_" in f.name for f in optim):
                return f"rank {r}'s DeepSpeed optimizer partition is missing"
    for f in sorted({*model, *optim}):
        problem = _torch_file_problem(f)
        if problem:
            return problem
    return None


def check_trusted(tdir: Path) -> None:
    """Refuse checkpoint ``tdir`` (`UntrustedCheckpointError`, naming the file and the global) if any of its
    files needs a global outside common/safe_load.py's allowlist, unless ``--trust-checkpoint``. Every rank
    checks every file before any rank loads one, so all refuse together instead of some waiting in a collective
    for a rank that refused its own file."""
    for f in sorted(tdir.glob("*.pt")):
        check_file(f)


def kind_problem(tdir: Path, saved_world: int, world_size: int, deepspeed: bool) -> str | None:
    """Why a run of ``world_size`` ranks, under DeepSpeed or plain PyTorch, cannot continue checkpoint ``tdir``
    (written by ``saved_world`` ranks), or None: a plain run continues only a plain checkpoint, and a DeepSpeed
    run only a DeepSpeed one (on any number of ranks: training/reshard.py)."""
    plain = (tdir / "plain.pt").is_file()
    if plain != deepspeed:
        return None
    written = "a plain PyTorch run" if plain else f"{saved_world} DeepSpeed rank(s)"
    fix = ("resume it as it was written: one process without --ds-config" if plain else
           "resume it under DeepSpeed with the run's --ds-config, on any number of ranks (one rank: the same "
           "command with --ds-config and no launcher)")
    return (f"{tdir}: written by {written} and resumed by a {world_size}-rank "
            f"{'DeepSpeed' if deepspeed else 'plain PyTorch'} run; a checkpoint continues only in the kind of run that "
            f"wrote it, and changes its number of ranks only under DeepSpeed on both sides: {fix}")


def complete_tags(root: Path) -> list[str]:
    """Tags of the complete checkpoints under ``root``, oldest first."""
    return sorted(p.name for p in root.glob("step_*") if p.is_dir() and is_complete(p))


def rotate(root: Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` complete checkpoints; delete older ones and the leftovers of
    interrupted saves older than the newest complete one (a newer one may still be being written)."""
    if keep_last <= 0:
        return
    done = complete_tags(root)
    if not done:
        return
    keep = set(done[-keep_last:])
    for p in [*root.glob("step_*"), *(root / UNIVERSAL_DIR).glob("step_*")]:
        if p.is_dir() and p.name not in keep and p.name < done[-1]:
            shutil.rmtree(p, ignore_errors=True)


def hold_run_lock(root: Path, rank: int, barrier: Any) -> Any:
    """Wait until no rank of an earlier run in ``root`` is still training or saving, then hold the lock
    (returns the open file: closing it releases the lock).

    Every rank holds a shared flock on ``root/.run.lock`` while it trains. Rank 0 of a new run first takes
    it exclusively, which waits for the ranks of a run that was stopped but is still writing its
    checkpoint (e.g. the single-node `deepspeed` launcher returns on SIGTERM before its ranks are done,
    and a requeue starts the next run at once). The other ranks follow once rank 0 has it. The kernel
    drops the lock when a process dies, however it dies. Where flock is not available (some network
    file systems) this only warns.
    """
    root.mkdir(parents=True, exist_ok=True)
    f = open(root / ".run.lock", "a+")  # noqa: SIM115 (the caller closes it)
    if rank == 0:
        _lock(f, exclusive_first=True, root=root)
    barrier()  # every rank passes here exactly once, whatever the lock did
    if rank != 0:
        _lock(f, exclusive_first=False, root=root)
    return f


def _lock(f: Any, exclusive_first: bool, root: Path) -> None:
    try:
        import fcntl  # noqa: PLC0415

        if exclusive_first:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(
                    f"[trainer] {root}: ranks of an earlier run are still alive (writing their checkpoint?); "
                    f"waiting for them to exit",
                    file=sys.stderr,
                    flush=True,
                )
                fcntl.flock(f, fcntl.LOCK_EX)
        fcntl.flock(f, fcntl.LOCK_SH)
    except (ImportError, OSError) as e:
        if exclusive_first:
            print(f"[trainer] {root}/.run.lock: no file lock ({e}); runs are not serialised", file=sys.stderr)


class CheckpointManager:
    """Save, find and load this rank's part of the checkpoints under ``<output_dir>/checkpoints``.

    Every rank calls ``save`` and ``load`` at the same point (they synchronise with barriers). What goes
    in: ``state``, this rank's trainer state (a dict ``torch.save`` can write, holding ``world_size``), and
    either the DeepSpeed ``engine`` (it writes the model, the ZeRO optimizer partitions and the scheduler)
    or, for a plain single-process run, ``plain``: named objects with ``state_dict`` / ``load_state_dict``
    (model, optimizer, scheduler), written together as ``plain.pt``.
    """

    def __init__(self, output_dir: str | Path, rank: int, world_size: int, keep_last: int) -> None:
        self.root = checkpoint_root(output_dir)
        self.rank, self.world_size, self.keep_last = rank, world_size, keep_last

    def hold_run_lock(self) -> Any:
        """See ``hold_run_lock``; closing the returned file releases the lock."""
        return hold_run_lock(self.root, self.rank, D.barrier)

    def save(self, step: int, state: dict[str, Any], *, engine: Any = None, plain: dict[str, Any] | None = None,
             model_config: Any = None) -> str:
        """Write checkpoint ``step_<step>``; returns its directory. ``model_config``: an object with
        ``to_json_string`` (an HF config), written by rank 0 as ``model_config.json``."""
        root, main = self.root, self.rank == 0
        tag = tag_for_step(step)
        (root / tag).mkdir(parents=True, exist_ok=True)
        if main:  # files of this tag are about to be rewritten: not complete until marked again
            unmark_complete(root / tag)
            shutil.rmtree(root / UNIVERSAL_DIR / tag, ignore_errors=True)  # a copy of the old files
        D.barrier()
        atomic_torch_save(state, root / tag / f"trainer_rank{self.rank}.pt")
        if engine is not None:
            engine.save_checkpoint(str(root), tag=tag, client_state={"skillnet_step": step}, save_latest=False)
        else:
            assert plain is not None, "a plain run saves its model, optimizer and scheduler"
            atomic_torch_save({k: v.state_dict() for k, v in plain.items()}, root / tag / "plain.pt")
        if main and model_config is not None and hasattr(model_config, "to_json_string"):
            atomic_write_text(root / tag / "model_config.json", model_config.to_json_string())
        D.barrier()
        if main:  # every rank has finished writing: the marker goes last
            # Durable before anything points at it: every file's data and name, and the tag's name in root
            # (DeepSpeed writes its files with a plain open; a machine crash could keep `complete` without them).
            fsync_tree(root / tag)
            fsync_dir(root)
            mark_complete(root / tag, step)  # atomic, and its folder fsynced: only then may `latest` name it
            atomic_write_text(root / "latest", tag + "\n")
            rotate(root, self.keep_last)
        D.barrier()
        return str(root / tag)

    def locate(self, resume: str) -> Path | None:
        """The checkpoint directory ``--resume`` names. ``"auto"``: the newest complete checkpoint in this
        run's checkpoints directory, None when there is none; else a checkpoints directory (its newest
        complete one) or one ``step_*`` directory, and an error when it is neither or incomplete."""
        if resume == "auto":
            return self._trusted(self._newest_intact(self.root, resume, none_ok=True))
        p = Path(resume)
        if (p / "latest").is_file() or complete_tags(p):
            return self._trusted(self._newest_intact(p, resume, none_ok=False))
        if p.is_dir() and p.name.startswith("step_"):
            # One checkpoint asked for by name: it is that one or none (no silent substitute).
            problem = checkpoint_problem(p)
            if problem:
                raise CheckpointError(f"--resume {resume}: cannot resume from it: {problem}; resume from an "
                                      f"earlier one or use --resume auto")
            return self._trusted(p)
        raise CheckpointError(f"--resume {resume}: not a checkpoint directory (no 'latest', not step_*)")

    @staticmethod
    def _trusted(tdir: Path | None) -> Path | None:
        if tdir is not None:
            check_trusted(tdir)
        return tdir

    def _newest_intact(self, root: Path, resume: str, none_ok: bool) -> Path | None:
        """The newest complete checkpoint under ``root`` that is intact; each damaged newer one is named in a
        one-line warning. None (``none_ok``) when there is no complete one at all; an error when every
        complete one is damaged."""
        tags = complete_tags(root)
        skipped = []
        for tag in reversed(tags):
            problem = checkpoint_problem(root / tag)
            if problem is None:
                if skipped and self.rank == 0:
                    print(f"[trainer] warning: skipped damaged checkpoint(s) {'; '.join(skipped)}; resuming from "
                          f"{root / tag}", file=sys.stderr, flush=True)
                return root / tag
            skipped.append(f"{tag} ({problem})")
        if skipped:
            raise CheckpointError(f"--resume {resume}: no intact checkpoint in {root}: {'; '.join(skipped)}")
        if none_ok:
            return None
        raise CheckpointError(f"--resume {resume}: no complete checkpoint in it")

    def load(self, tdir: Path, *, engine: Any = None, plain: dict[str, Any] | None = None) -> dict[str, Any]:
        """Load checkpoint ``tdir`` into ``engine`` (or the ``plain`` objects); returns this rank's trainer
        state (with ``resharded_from``: the saved world size, when it differs from this run's).

        On the world size it was written with, every rank reads its own files. On another one (DeepSpeed
        only), the checkpoint goes through the universal format (training/reshard.py) and every rank gets
        rank 0's trainer state without its RNG streams; the engine must have been built with
        ``load_universal`` (``training.launch.prepare`` sets it).
        """
        rank0 = read_trainer_state(tdir)
        saved_world = int(rank0["world_size"])
        problem = kind_problem(tdir, saved_world, self.world_size, deepspeed=engine is not None)
        if problem is not None:
            raise ResumeError(problem)
        if saved_world == self.world_size:
            state = rank0 if self.rank == 0 else read_trainer_state(tdir, self.rank)
            if engine is not None:
                self._load_engine(engine, tdir.parent, tdir)
            else:
                assert plain is not None, "a plain run loads its model, optimizer and scheduler"
                saved = safe_load(tdir / "plain.pt")
                for k, v in plain.items():
                    v.load_state_dict(saved[k])
            return state
        state = rank0
        assert engine is not None  # a plain checkpoint (one process) and a plain run: the same world size
        stage = int(engine.zero_optimization_stage())
        if state.get("zero_stage") is None or int(state["zero_stage"]) != stage:
            raise ResumeError(
                f"{tdir}: written under ZeRO stage {state.get('zero_stage', 'unknown (an older checkpoint)')}, "
                f"resumed under stage {stage} on another number of ranks ({saved_world} -> {self.world_size}); "
                f"DeepSpeed's universal checkpoints cannot change the ZeRO stage: use the run's own ZeRO config"
            )
        if not engine._config.load_universal_checkpoint:
            raise ResumeError(
                f"{tdir}: the engine was built without checkpoint.load_universal; build the trainer's config "
                f"with training.launch.prepare, which sets it when the number of ranks changes"
            )
        udir = ensure_universal(tdir, self.rank)
        hyper = group_hyperparams(engine.optimizer.optimizer)
        self._load_engine(engine, udir.parent, tdir)
        if stage == 3:
            restore_group_hyperparams(engine.optimizer.optimizer, hyper, engine.lr_scheduler.get_last_lr())
        state.pop("rng", None)
        state["resharded_from"] = saved_world
        return state

    @staticmethod
    def _load_engine(engine: Any, load_dir: Path, tdir: Path) -> None:
        from .deepspeed_patches import safe_checkpoint_loads  # noqa: PLC0415

        with safe_checkpoint_loads():
            load_path, _ = engine.load_checkpoint(
                str(load_dir), tag=tdir.name, load_optimizer_states=True, load_lr_scheduler_states=True
            )
        if load_path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {tdir}")


def rng_state() -> dict[str, Any]:
    st: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def reseed(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (dropout) from one number."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
