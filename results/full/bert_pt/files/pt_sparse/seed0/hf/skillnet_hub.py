"""What an export folder needs so that plain `transformers` users can load it without this package.

* **Modeling code** (`write_remote_code`): the model's source files are copied next to the weights and
  ``config.json`` gets an ``auto_map``, so ``AutoConfig`` / ``AutoModel`` / ``AutoModelForPreTraining`` (or
  ``AutoModelForSeq2SeqLM``) load the folder with ``trust_remote_code=True`` in an environment that has
  transformers but not SkillNet. Files are renamed ``skillnet_<module>.py`` so that none can be mistaken for
  the folder's ``config.json`` or shadow a module of the loading environment; their relative imports are
  rewritten to match.
* **Task classes** (`served_classes`): ``auto_map`` also names the model/hf_tasks.py classes the saved model
  can serve (fill-mask for the pre-trained model; sequence / token classification and QA by the task heads
  of a fine-tuned one), and ``custom_pipelines`` names the pipelines that take ``task=``: SkillNet-BART's
  text2text, and SkillNet-BERT's subclasses of transformers' fill-mask, feature-extraction, text- and
  token-classification pipelines (under those names).
* **Tokenizer** (`save_tokenizer`): the WordPiece vocab as a `BertTokenizerFast`, so
  ``AutoTokenizer.from_pretrained(folder)`` works offline, and ``config.tokenizer_class`` names it; its
  ``model_max_length`` is the model's positions, so ``truncation=True`` fits the model.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path
from typing import Any

from .skillnet_spec import skillnet_family

_MODEL_DIR = Path(__file__).resolve().parent
_REL_IMPORT = re.compile(r"^(\s*from\s+)\.(\w+)(\s+import\b)", re.M)

def _auto_classes(model_type: str) -> list[tuple[str, str, str]]:
    """(Auto class, module, class) the family of `model_type` exposes (model/spec.py)."""
    spec = skillnet_family(model_type)
    if spec is None:
        raise ValueError(f"model_type {model_type!r} is not a registered SkillNet model family")
    return spec.served_auto_classes()


def _remote_name(module: str) -> str:
    return f"skillnet_{module}"


def _relative_imports(module: str) -> set[str]:
    tree = ast.parse((_MODEL_DIR / f"{module}.py").read_text(encoding="utf-8"))
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module}


def _closure(modules: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(_relative_imports(m) - seen)
    return seen


# Task classes (model/hf_tasks.py) by what the saved model holds: the pre-trained model's MLM head, or a
# multi-task model's heads by type.
_PRETRAINED_TASK_CLASSES = [("AutoModelForMaskedLM", "hf_tasks", "SkillNetBertForMaskedLM")]
_HEAD_TASK_CLASSES = {
    "classification": ("AutoModelForSequenceClassification", "hf_tasks", "SkillNetBertForSequenceClassification"),
    "regression": ("AutoModelForSequenceClassification", "hf_tasks", "SkillNetBertForSequenceClassification"),
    "token_crf": ("AutoModelForTokenClassification", "hf_tasks", "SkillNetBertForTokenClassification"),
    "span": ("AutoModelForQuestionAnswering", "hf_tasks", "SkillNetBertForQuestionAnswering"),
}
# Pipelines transformers does not have (any more) for a model type: task -> implementation.
CUSTOM_PIPELINES: dict[str, dict[str, dict[str, Any]]] = {
    "skillnet-bart": {"text2text-generation": {"impl": "skillnet_hf_tasks.SkillNetText2TextPipeline",
                                               "pt": ["AutoModelForSeq2SeqLM"]}},
}
# transformers' own pipelines, registered under their own names by a SkillNet-BERT export that serves their
# auto class, so that task= / task_name= pick the model task (model/hf_tasks.py): auto class -> (name, class).
_TASK_PIPELINES = {
    "AutoModel": ("feature-extraction", "SkillNetFeatureExtractionPipeline"),
    "AutoModelForMaskedLM": ("fill-mask", "SkillNetFillMaskPipeline"),
    "AutoModelForSequenceClassification": ("text-classification", "SkillNetTextClassificationPipeline"),
    "AutoModelForTokenClassification": ("token-classification", "SkillNetTokenClassificationPipeline"),
}


def custom_pipelines(model_type: str, config: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """The ``custom_pipelines`` of an export's config.json: task -> {"impl", "pt"}."""
    out = dict(CUSTOM_PIPELINES.get(model_type, {}))
    if model_type == "skillnet-bert":
        for auto, _, _ in served_classes(model_type, config):
            if auto in _TASK_PIPELINES:
                name, cls = _TASK_PIPELINES[auto]
                out[name] = {"impl": f"{_remote_name('hf_tasks')}.{cls}", "pt": [auto]}
    return out


def served_classes(model_type: str, config: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    """(auto class, module, class) an export of `config` (its config.json) can serve."""
    classes = _auto_classes(model_type)
    if model_type != "skillnet-bert" or config is None:
        return classes
    arch = (config.get("architectures") or [""])[0]
    if arch == "SkillNetBertForPreTraining":
        classes += _PRETRAINED_TASK_CLASSES
    elif arch == "SkillNetBertForMultiTask":
        for head in (config.get("task_heads") or {}).values():
            c = _HEAD_TASK_CLASSES.get(head.get("type"))
            if c is not None and c not in classes:
                classes.append(c)
    return classes


def auto_map(model_type: str, config: dict[str, Any] | None = None) -> dict[str, str]:
    return {auto: f"{_remote_name(mod)}.{cls}" for auto, mod, cls in served_classes(model_type, config)}


def write_remote_code(folder: str | os.PathLike, model_type: str) -> list[str]:
    """Copy the modeling sources of `model_type` into `folder` and add ``auto_map`` to its config.json."""
    folder = Path(folder)
    written = []
    if not (_MODEL_DIR / "config.py").is_file():
        # Running from remote code already (a model loaded with trust_remote_code, saved again): our own
        # renamed files are the sources.
        for f in sorted(_MODEL_DIR.glob("skillnet_*.py")):
            if f.resolve() != (folder / f.name).resolve():
                (folder / f.name).write_text(f.read_text(encoding="utf-8"), encoding="utf-8")
            written.append(f.name)
    else:
        # hf_tasks: the task classes and the custom pipelines, whether or not this export lists them
        modules = {mod for _, mod, _ in _auto_classes(model_type)}
        outside = sorted(m for m in modules if not (_MODEL_DIR / f"{m}.py").is_file())
        if outside:
            raise ValueError(f"{model_type}: modules {outside} are not in {_MODEL_DIR}: remote code copies this "
                             "package's files only")
        for m in sorted(_closure(modules | {"hf_tasks"})):
            src = (_MODEL_DIR / f"{m}.py").read_text(encoding="utf-8")
            src = _REL_IMPORT.sub(lambda g: f"{g.group(1)}.{_remote_name(g.group(2))}{g.group(3)}", src)
            (folder / f"{_remote_name(m)}.py").write_text(src, encoding="utf-8")
            written.append(f"{_remote_name(m)}.py")
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["auto_map"] = auto_map(model_type, cfg)
    pipes = custom_pipelines(model_type, cfg)
    if pipes:
        cfg["custom_pipelines"] = pipes
    else:
        cfg.pop("custom_pipelines", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return written


def has_tokenizer(folder: str | os.PathLike) -> bool:
    return (Path(folder) / "tokenizer_config.json").is_file() or (Path(folder) / "vocab.txt").is_file()


def save_tokenizer(folder: str | os.PathLike, vocab_file: str | os.PathLike | None = None,
                   lowercase: bool = True, source: str | os.PathLike | None = None) -> None:
    """Save a HF tokenizer into `folder` (tokenizer.json, tokenizer_config.json, plus the plain vocab.txt the
    pipeline reads) and name its class in config.json, so ``AutoTokenizer.from_pretrained(folder)`` works
    offline. From a WordPiece `vocab_file`, or carried over from the folder `source` (a dense checkpoint or
    an earlier export)."""
    import shutil

    from transformers import AutoTokenizer, BertTokenizer

    folder = Path(folder)
    cfg_path = folder / "config.json"
    model_cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    # BART has no segments: without this, generate(**tok(text)) fails on token_type_ids.
    extra = {"model_input_names": ["input_ids", "attention_mask"]} if "bart" in str(model_cfg.get("model_type")) else {}
    if source is not None and (Path(source) / "tokenizer_config.json").is_file():
        tok = AutoTokenizer.from_pretrained(str(source), **extra)
    else:
        if vocab_file is None:
            if source is None or not (Path(source) / "vocab.txt").is_file():
                raise FileNotFoundError(f"no tokenizer to save: {source} has neither tokenizer_config.json "
                                        "nor vocab.txt, and no vocab file was given")
            vocab_file = Path(source) / "vocab.txt"
        tok = BertTokenizer(vocab=str(vocab_file), do_lower_case=lowercase, tokenize_chinese_chars=True, **extra)
    if model_cfg.get("max_position_embeddings"):  # truncation=True (and every pipeline) then fits the model
        tok.model_max_length = int(model_cfg["max_position_embeddings"])
    tok.save_pretrained(str(folder))
    for src_dir, name in ((Path(vocab_file).parent if vocab_file else None, Path(vocab_file).name if vocab_file
                           else None), (Path(source) if source else None, "vocab.txt")):
        if src_dir is not None and name and (src_dir / name).is_file() and not (folder / "vocab.txt").is_file():
            shutil.copyfile(src_dir / name, folder / "vocab.txt")
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        cfg["tokenizer_class"] = type(tok).__name__
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
