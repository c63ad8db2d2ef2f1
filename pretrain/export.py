"""Export a pre-training checkpoint as a consolidated HF-format SkillNet-BERT folder.

    python -m skillnet.pretrain.export --checkpoint runs/pt --out runs/pt/hf            # newest checkpoint
    python -m skillnet.pretrain.export --checkpoint runs/pt/checkpoints/step_00001000 --out hf_1000

Reads plain (single-process) and DeepSpeed ZeRO-1/2/3 checkpoints (ZeRO partitions are merged to fp32
on the CPU, no GPUs or process group needed), then, for multi-task use (Appendix B), initialises every
skill that no pre-training objective trained (s4, s5, s6 by default) from the generic skill s7.
Writes model.safetensors + config.json (skills, task -> skills map) that
``SkillNetBertForMultiTask.from_pretrained`` and ``finetune/`` load, the shards' vocab.txt when known,
and export_info.json (source checkpoint, step, which skills were copied from which).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

__all__ = ["export", "locate_checkpoint", "load_checkpoint_state", "init_unused_skills", "main"]

PRETRAIN_OBJECTIVES = ("mlm", "nsp")


def _save_tokenizer(folder: Path, shards: str | None, vocab_size: int) -> None:
    """The tokenizer the shards were built with (their vocab.txt and normalisation), else the default
    bert-base-chinese vocab when the model's vocab size is its size (synthetic-data runs)."""
    from skillnet.data_prep.tokenizer import TokenizerError, default_vocab_path
    from skillnet.model.hub import save_tokenizer

    lowercase = True
    vocab = Path(shards) / "vocab.txt" if shards else None
    if shards and (Path(shards) / "manifest.json").is_file():
        tk = json.loads((Path(shards) / "manifest.json").read_text(encoding="utf-8")).get("tokenizer", {})
        lowercase = bool(tk.get("settings", {}).get("lowercase", True))
    if vocab is None or not vocab.is_file():
        try:
            vocab = default_vocab_path()
        except TokenizerError:
            return
        if sum(1 for _ in vocab.read_text(encoding="utf-8").split("\n") if _) != vocab_size:
            return  # a synthetic vocab: no real tokenizer belongs to this model
    save_tokenizer(folder, vocab, lowercase=lowercase)


def locate_checkpoint(path: str | Path, tag: str | None = None) -> tuple[Path, str]:
    """(checkpoints root, tag) from a run dir, a checkpoints dir or a step_* dir."""
    p = Path(path)
    if (p / "checkpoints" / "latest").is_file():
        p = p / "checkpoints"
    if p.name.startswith("step_") and p.is_dir():
        return p.parent, tag or p.name
    latest = p / "latest"
    if not latest.is_file() and tag is None:
        raise FileNotFoundError(f"{path}: no checkpoints/latest, latest or step_* directory found")
    t = tag or latest.read_text().strip()
    if not (p / t).is_dir():
        raise FileNotFoundError(f"{p / t}: checkpoint tag not found")
    return p, t


def load_checkpoint_state(root: Path, tag: str) -> dict[str, torch.Tensor]:
    """fp32 model state dict of a plain or DeepSpeed checkpoint."""
    d = root / tag
    if (d / "plain.pt").is_file():
        return torch.load(d / "plain.pt", map_location="cpu", weights_only=False)["model"]
    if list(d.glob("*zero_pp_rank_*optim_states.pt")) or list(d.glob("zero_pp_rank_*")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(root), tag=tag)
    states = sorted(d.glob("mp_rank_*_model_states.pt"))
    if states:  # DeepSpeed without ZeRO: the module is saved whole
        return torch.load(states[0], map_location="cpu", weights_only=False)["module"]
    raise FileNotFoundError(f"{d}: neither plain.pt nor DeepSpeed model states found")


def init_unused_skills(
    model: torch.nn.Module, objectives: tuple[str, ...] = PRETRAIN_OBJECTIVES
) -> dict[str, str]:
    """Copy the generic skill into every skill no pre-training objective activated; returns {dst: src}."""
    from skillnet.model import skill_parameters

    cfg = model.config
    generic = cfg.generic_skill
    if generic is None:
        return {}
    used = {s for o in objectives if o in cfg.tasks for s in cfg.task_skill_names(o)}
    params = skill_parameters(model)
    copied = {}
    with torch.no_grad():
        for name in cfg.skill_names:
            if name in used or name == generic:
                continue
            for dst, src in zip(params[name], params[generic]):
                dst.copy_(src)
            copied[name] = generic
    return copied


def export(checkpoint: str | Path, out: str | Path, tag: str | None = None, init_unused: bool = True) -> Path:
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining

    root, tag = locate_checkpoint(checkpoint, tag)
    cfg_file = root / tag / "model_config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file} missing: was this checkpoint written by training.Trainer?")
    config = SkillNetBertConfig.from_json_file(str(cfg_file))
    model = SkillNetBertForPreTraining(config)
    state = load_checkpoint_state(root, tag)
    result = model.load_state_dict(state, strict=False)
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{root / tag}: state does not fit the model: missing {missing[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
    model.tie_weights()
    copied = init_unused_skills(model) if init_unused else {}
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    step = None
    run_dir = root.parent
    tfile = root / tag / "trainer_rank0.pt"
    if tfile.is_file():
        step = int(torch.load(tfile, map_location="cpu", weights_only=False)["step"])
    args_file = run_dir / "run_args.json"
    shards = json.loads(args_file.read_text()).get("shards") if args_file.is_file() else None
    _save_tokenizer(tmp, shards, config.vocab_size)
    info = {
        "source": str((root / tag).resolve()),
        "step": step,
        "skills_initialised_from": copied,
        "pretrain_objectives": {
            o: config.task_skill_names(o) for o in PRETRAIN_OBJECTIVES if o in config.tasks
        },
    }
    (tmp / "export_info.json").write_text(json.dumps(info, indent=2))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m skillnet.pretrain.export",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--checkpoint", required=True, help="run dir (uses checkpoints/latest), checkpoints dir or step_* dir"
    )
    p.add_argument("--tag", help="checkpoint tag (step_XXXXXXXX); default: latest")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument(
        "--no_init_unused",
        action="store_true",
        help="keep the untrained skills as they are instead of copying the generic skill into them",
    )
    args = p.parse_args(argv)
    try:
        out = export(args.checkpoint, args.out, args.tag, init_unused=not args.no_init_unused)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"event": "exported", "out": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
