"""The last step of every export: its default task, the labels and prompts pipelines read, and a model card.

`finish_export(model, folder, ...)` runs after ``save_pretrained`` (and the tokenizer) of a pre-training
export (export/hf_folder.py) or a fine-tuning one (finetune/run.py ``save_model_dir``):

* ``config.default_task``: what a call without ``task=`` runs (pre-trained SkillNet-BERT: ``mlm``; a
  fine-tuned model: ``export --task``, the task of a ``best_per_task/<task>`` folder, else the first task);
* ``config.id2label`` / ``label2id``: the default task's labels (classification, NER);
* SkillNet-BART: ``config.task_prefixes`` (each task's source prefix) and the default task's beams and
  length in generation_config.json, so the text2text pipeline and ``generate`` match the project's decode;
* ``model_card.json`` (the facts: tasks and skills, parameter counts, training) and ``README.md`` rendered
  from it and from the run's results.json. `refresh_model_cards(run_dir)` renders the cards again once
  results.json exists (the fine-tuning run writes its scores after its exports).

Nothing written holds an absolute path: files of the run are named relative to the run directory.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from skillnet.model.span_qa import settings_from_meta, write_settings
from skillnet.model.spec import skillnet_family

CARD_FACTS = "model_card.json"
FINETUNE_META = "finetune_tasks.json"
_PAPERS = {
    "skillnet-bert": ("SkillNet-BERT", "SkillNet-NLU, a sparsely activated BERT whose FFNs are banks of skills "
                      "(Zhang, Tang et al., *SkillNet-NLU: A Sparsely Activated Model for General-Purpose Natural "
                      "Language Understanding*, Tencent AI Lab, 2022)"),
    "skillnet-bart": ("SkillNet-BART", "SkillNet-NLG, a sparsely activated BART whose FFNs are banks of skills "
                      "(Liao, Tang et al., *SkillNet-NLG: General-Purpose Natural Language Generation with a "
                      "Sparsely Activated Approach*, Tencent AI Lab, 2022)"),
    "bert": ("BERT (dense)", "a dense BERT pre-trained by this project's pipeline (the starting point of "
             "SkillNet-BERT's skill surgery)"),
    "bart": ("BART (dense)", "a dense BART pre-trained by this project's pipeline (the starting point of "
             "SkillNet-BART)"),
}


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def run_dir_of(final: Path) -> Path | None:
    """The fine-tuning run an export folder belongs to (the folder holding finetune_config.json)."""
    for d in (final.parent, final.parent.parent):
        if (d / "finetune_config.json").is_file():
            return d
    return None


def _unk_id(folder: Path) -> int | None:
    """The unknown token's id as the export's own tokenizer reads it (the one the pipelines decode with),
    or None when the folder has no tokenizer."""
    from skillnet.model.hub import has_tokenizer
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder)).unk_token_id if has_tokenizer(folder) else None


def pick_default_task(config: dict[str, Any], final: Path, requested: str | None,
                      meta: dict[str, Any], own: Sequence[str] = ()) -> str | None:
    """`requested` (``export --task``); else the task of a ``best_per_task/<task>`` folder; else the run's own
    tasks (`own`: those it fine-tuned, not those an adapted model inherited), the config's default if it is one
    of them; else the config's default if the export serves it; else the first fine-tuned task; else
    (pre-trained) ``mlm``."""
    tasks = config.get("tasks") or {}
    if requested is not None:
        if requested not in tasks:
            raise KeyError(f"--task {requested!r} is not a task of the model; valid tasks: {', '.join(tasks)}")
        return requested
    served = list(meta) or list(config.get("task_heads") or {})
    if final.parent.name == "best_per_task" and final.name in served:
        return final.name
    own = [t for t in own if t in tasks]
    if own:
        return config["default_task"] if config.get("default_task") in own else own[0]
    if config.get("default_task") in (served or tasks):
        return config["default_task"]
    if served:
        return served[0]
    return "mlm" if "mlm" in tasks else None


def task_generation(gen: dict[str, Any], task_meta: dict[str, Any], folder: Path) -> dict[str, Any]:
    """`gen` (a generation_config.json) with a generation task's beams and length, as the project decodes."""
    gen["num_beams"] = int(task_meta.get("num_beams", gen.get("num_beams", 1)))
    gen["max_new_tokens"] = int(task_meta["max_target_len"])
    unk = _unk_id(folder)
    if unk is not None:  # as the project's own decoding: [UNK] is never a right character
        gen["suppress_tokens"] = [unk]
    return gen


def _params(model: torch.nn.Module, tasks: list[str]) -> dict[str, Any]:
    from skillnet.model.counts import activated_parameters, count_parameters

    total = sum(p.numel() for p in model.parameters())
    out: dict[str, Any] = {"total": total, "activated": {}}
    if tasks:
        out["total"] = count_parameters(model)["total"]
        out["activated"] = {t: activated_parameters(model, t) for t in tasks}
    return out


def finish_export(model: torch.nn.Module, folder: str | os.PathLike, *, final: str | os.PathLike | None = None,
                  default_task: str | None = None, training: dict[str, Any] | None = None,
                  run_dir: str | os.PathLike | None = None, own_tasks: Sequence[str] = ()) -> str | None:
    """Complete an export written to `folder` (to be renamed `final`); returns its default task. `run_dir`:
    the fine-tuning run it came from (default: found above `final`); `own_tasks`: the tasks that run trained."""
    folder = Path(folder)
    final = Path(final) if final is not None else folder
    cfg_path = folder / "config.json"
    cfg = read_json(cfg_path)
    model_type = cfg.get("model_type")
    skillnet = skillnet_family(model_type) is not None
    meta = (read_json(folder / FINETUNE_META) or {}).get("tasks", {})
    task = None
    if skillnet:
        task = pick_default_task(cfg, final, default_task, meta, own_tasks)
        cfg["default_task"] = task
        model.config.default_task = task
        labels = ((cfg.get("task_heads") or {}).get(task) or {}).get("labels") or (meta.get(task) or {}).get("labels")
        if labels and (meta.get(task) or {}).get("type") != "regression":
            cfg["id2label"] = {str(i): str(x) for i, x in enumerate(labels)}
            cfg["label2id"] = {str(x): i for i, x in enumerate(labels)}
        else:  # no labels of an earlier default task may stay behind
            cfg.pop("id2label", None)
            cfg.pop("label2id", None)
        # where fine-tuning and predict cut each task's input: the pipelines cut there too (model/hf_tasks.py)
        cfg["task_max_seq_len"] = {n: int(m["max_seq_len"]) for n, m in meta.items() if m.get("max_seq_len")}
        if model_type == "skillnet-bart":
            cfg["task_prefixes"] = {n: m.get("prefix", "") for n, m in meta.items() if m.get("type") == "generation"}
            gen_path = folder / "generation_config.json"
            gen = read_json(gen_path) or {}
            if task in meta and meta[task].get("type") == "generation":
                write_json(gen_path, task_generation(gen, meta[task], folder))
        write_json(cfg_path, cfg)
        spans = {n: settings_from_meta(m, (cfg.get("task_heads") or {}).get(n) or {})
                 for n, m in meta.items() if m.get("type") == "span"}
        if spans:  # predict's windows and answer rule, for AutoModelForQuestionAnswering (docs/hf.md)
            write_settings(folder, spans)
    run_dir = Path(run_dir) if run_dir is not None else run_dir_of(final)
    if training is None and run_dir is not None:
        training = _finetune_training(run_dir)
    tasks = list(meta) if meta else ([t for t in ("mlm", "nsp") if t in cfg.get("tasks", {})] if skillnet else [])
    facts = {
        "model_type": model_type,
        "architecture": (cfg.get("architectures") or [type(model).__name__])[0],
        "default_task": task,
        "tasks": {t: _task_facts(cfg, meta, t) for t in tasks} if skillnet else {},
        "all_tasks": {t: _skills(cfg, t) for t in cfg.get("tasks", {})} if skillnet else {},
        "skills": cfg.get("skills") or [],
        "generic_skill": cfg.get("generic_skill"),
        "params": _params(model, tasks if skillnet else []),
        "training": training or {},
        "sizes": {k: cfg.get(k) for k in ("hidden_size", "num_hidden_layers", "d_model", "encoder_layers",
                                          "decoder_layers", "max_position_embeddings", "vocab_size") if k in cfg},
    }
    write_json(folder / CARD_FACTS, facts)
    res = (read_json(run_dir / "results.json") or {}) if run_dir is not None else {}
    scores = None
    if res.get("tasks") and run_dir is not None and final.resolve().is_relative_to(run_dir.resolve()):
        scores = own_scores(final.resolve().relative_to(run_dir.resolve()).as_posix(), res["tasks"], res.get("steps"))[0]
    (folder / "README.md").write_text(render_card(facts, scores), encoding="utf-8")
    return task


def _skills(cfg: dict[str, Any], task: str) -> list[str]:
    skills = list(cfg["tasks"][task])
    g = cfg.get("generic_skill")
    return skills + [g] if g and g not in skills else skills


def _task_facts(cfg: dict[str, Any], meta: dict[str, Any], task: str) -> dict[str, Any]:
    m = meta.get(task) or {}
    head = (cfg.get("task_heads") or {}).get(task) or {}
    return {"skills": _skills(cfg, task), "type": m.get("type") or head.get("type") or "pre-training objective",
            "labels": m.get("labels") or head.get("labels"), "metric": m.get("metric"), "prefix": m.get("prefix"),
            **({"span": settings_from_meta(m, head)} if m.get("type") == "span" else {})}


def _finetune_training(run_dir: Path) -> dict[str, Any]:
    cfg = read_json(run_dir / "finetune_config.json") or {}
    tasks = {}
    for t in cfg.get("tasks", []):
        # a task given by a data_prep task.json ('spec') or a dataset folder names that instead of split files
        files = {k: Path(str(t[k])).name for k in ("train", "dev", "test", "spec", "dataset")
                 if isinstance(t.get(k), str) and t.get(k)}
        tasks[t.get("name")] = files
    res = read_json(run_dir / "results.json") or {}
    train = cfg.get("train", {})
    return {"stage": "fine-tuning", "method": cfg.get("method"), "data": tasks,
            "max_steps": train.get("max_steps"), "steps": res.get("steps"), "seed": train.get("seed")}


def refresh_model_cards(run_dir: str | os.PathLike) -> None:
    """Render the cards of a fine-tuning run's exports again, now with the scores of results.json."""
    run_dir = Path(run_dir)
    res = read_json(run_dir / "results.json") or {}
    for facts_file in [*run_dir.glob(f"*/{CARD_FACTS}"), *run_dir.glob(f"best_per_task/*/{CARD_FACTS}")]:
        facts = read_json(facts_file)
        held = facts_file.parent.relative_to(run_dir).as_posix()
        scores, step = own_scores(held, res.get("tasks") or {}, res.get("steps"))
        facts.setdefault("training", {})["steps"] = step
        facts["weights"] = held
        write_json(facts_file, facts)
        (facts_file.parent / "README.md").write_text(render_card(facts, scores), encoding="utf-8")


def own_scores(held: str, tasks: dict[str, Any], final_step: int | None) -> tuple[dict[str, Any], int | None]:
    """The scores of the weights in the run's folder `held` (``export``: the final step; ``best``: the mean-dev
    checkpoint; ``best_per_task/T``: T's), and their step, from results.json's `tasks` (whose dev and test are
    the selected checkpoint's, ``final`` the last step's). A task whose score at these weights was not measured
    shows none."""
    out: dict[str, Any] = {}
    step: int | None = final_step
    for t, r in tasks.items():
        if held == "export":
            if r.get("checkpoint") == "final":
                out[t] = {**r, "best_step": final_step}
            else:
                out[t] = {**r, **(r.get("final") or {"dev": None, "test": None}), "checkpoint": "final",
                          "best_step": final_step, "selected": {"checkpoint": r.get("checkpoint"),
                                                                "step": r.get("best_step")}}
        elif r.get("checkpoint") == "best (mean dev)" and held == "best" or r.get("checkpoint") == held:
            out[t], step = dict(r), r.get("best_step")
        else:
            out[t] = {**r, "dev": None, "test": None, "checkpoint": f"not measured on {held}/", "best_step": None}
    return out, step


def _fmt(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n:,}"


def render_card(facts: dict[str, Any], scores: dict[str, Any] | None = None) -> str:
    mt = facts.get("model_type")
    name, paper = _PAPERS.get(mt, (mt, ""))
    default = facts.get("default_task")
    tasks = facts.get("tasks") or {}
    skill_desc = {s["name"]: s.get("description", "") for s in facts.get("skills") or [] if isinstance(s, dict)}
    lines = ["---", "library_name: transformers", "tags:", "- skillnet", f"- {mt}", "---", "",
             f"# {name}", "", f"**What it is:** {paper}. Architecture `{facts.get('architecture')}`; "
             + ", ".join(f"{k}={v}" for k, v in (facts.get("sizes") or {}).items()) + ".", ""]
    if skillnet_family(mt) is not None:
        lines += ["Every task activates a few *skills* (FFN experts) in the skill layers; the rest of the network "
                  "is shared. Load with `trust_remote_code=True` (the modeling code is in the `skillnet_*.py` "
                  "files of this folder: read them before trusting them).", ""]
        lines += [f"**Default task:** `{default}` (a call without `task=` runs it; `task=` picks any task below).",
                  "", "## Tasks and their skills", "", "| task | type | skills | labels |", "|---|---|---|---|"]
        for t, f in sorted(tasks.items(), key=lambda kv: kv[0] != default):
            labels = ", ".join(map(str, f.get("labels") or [])) or "-"
            mark = " (default)" if t == default else ""
            lines.append(f"| `{t}`{mark} | {f.get('type')} | {', '.join(f['skills'])} | {labels} |")
        others = {t: sk for t, sk in (facts.get("all_tasks") or {}).items() if t not in tasks}
        if others:
            lines += ["", "The config also maps these tasks to skills (no head yet; fine-tuning adds one): "
                      + "; ".join(f"`{t}` {', '.join(sk)}" for t, sk in others.items()) + "."]
        lines += ["", "Skills: " + "; ".join(f"`{k}` {v}" for k, v in skill_desc.items()) + ".", ""]
    p = facts.get("params") or {}
    lines += ["## Parameters", "", f"Total: {_fmt(p.get('total'))} ({p.get('total'):,})."]
    if p.get("activated"):
        lines += ["", "| task | activated parameters |", "|---|---|"]
        lines += [f"| `{t}` | {_fmt(n)} ({n:,}) |" for t, n in p["activated"].items()]
    tr = facts.get("training") or {}
    lines += ["", "## Training", ""]
    if tr.get("stage") == "fine-tuning":
        lines.append(f"Multi-task fine-tuning (method `{tr.get('method')}`), {tr.get('steps') or tr.get('max_steps')} "
                     f"steps, seed {tr.get('seed')}. Task data:")
        lines += [f"- `{t}`: " + ", ".join(f"{k} `{v}`" for k, v in files.items()) for t, files in tr["data"].items()]
    elif tr:
        lines.append(f"Pre-training, step {tr.get('step')}; objectives {tr.get('objectives')}; data "
                     f"`{tr.get('data')}`.")
    if scores:
        lines += ["", "## Scores of these weights", "",
                  "| task | metric | dev | test | checkpoint |", "|---|---|---|---|---|"]
        for t, r in scores.items():
            m = r.get("metric")
            dev, test = (r.get("dev") or {}).get(m), (r.get("test") or {}).get(m)
            step = f" (step {r['best_step']})" if r.get("best_step") is not None else ""
            lines.append(f"| `{t}` | {m} | {_num(dev)} | {_num(test)} | {r.get('checkpoint')}{step} |")
        chosen = {(r["selected"]["checkpoint"], r["selected"]["step"]) for r in scores.values() if r.get("selected")}
        if chosen:  # export/ holds the last step: say where the dev-selected weights are
            where = ", ".join(f"`{'best' if c == 'best (mean dev)' else c}/` (step {s})"
                              for c, s in sorted(chosen, key=str))
            lines += ["", f"These are the run's last weights. The checkpoint selected on dev is {where}: its card "
                      "has its scores, and `predict --model` on that folder uses it."]
    lines += ["", "## Use", ""]
    spans = {t: f["span"] for t, f in tasks.items() if f.get("span")}
    if spans:
        lines += ["Span tasks read a long context in windows, as `predict` does: `qa/span_qa.py` (numpy and the "
                  "tokenizer only) with the settings in `qa/span_qa.json`: "
                  + "; ".join(f"`{t}` rows of {s['max_seq_len']} tokens, question cut at {s['max_question_len']} "
                              f"pieces, stride {s['doc_stride'] or 'half a window'}, answers of at most "
                              f"{s['max_answer_len']} tokens" for t, s in spans.items())
                  + " (docs/finetune.md, \"Span settings\"). Give it the model, and `task=` for one of several.", ""]
    lines += ["```python", *usage_lines(facts), "```", ""]
    return "\n".join(lines)


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.4f}" if isinstance(x, float) else str(x)


def usage_lines(facts: dict[str, Any]) -> list[str]:
    """The lines that load this export and use it for its default task."""
    mt, default = facts.get("model_type"), facts.get("default_task")
    kind = (facts.get("tasks") or {}).get(default, {}).get("type")
    p = '"path/to/this/folder"'
    if kind == "span":
        return ['import sys; sys.path.insert(0, "path/to/this/folder/qa")',
                "from span_qa import SpanQA  # predict's windows and answer rule (qa/span_qa.json)",
                "from transformers import AutoModelForQuestionAnswering",
                f"qa = SpanQA({p}, AutoModelForQuestionAnswering.from_pretrained({p}, trust_remote_code=True))",
                'print(qa("中国的首都是哪里？", "北京是中国的首都。"))']
    if mt == "skillnet-bart":
        return ["from transformers import pipeline",
                f'gen = pipeline("text2text-generation", model={p}, trust_remote_code=True)',
                'print(gen("输入文本")[0]["generated_text"])']
    task = {"classification": "text-classification", "regression": "text-classification",
            "ner": "token-classification", "pair": "text-classification"}.get(kind)
    if mt == "skillnet-bert" and default in ("mlm", None) or kind == "pre-training objective":
        return ["from transformers import pipeline",
                f'fill = pipeline("fill-mask", model={p}, trust_remote_code=True)',
                'print(fill("今天天气很[MASK]。")[0]["token_str"])']
    if task is not None:
        extra = ', aggregation_strategy="simple"' if task == "token-classification" else ""
        return ["from transformers import pipeline",
                f'nlp = pipeline("{task}", model={p}, trust_remote_code=True{extra})',
                'print(nlp("这家酒店的服务很好"))']
    return ["from transformers import AutoModel, AutoTokenizer",
            f"tok, model = AutoTokenizer.from_pretrained({p}), AutoModel.from_pretrained({p}, trust_remote_code=True)",
            f'h = model(**tok("这家酒店的服务很好", return_tensors="pt"), task="{default}").last_hidden_state']


_ABS = re.compile(r"(?<![\w.])/(?:tmp|root|home|work|mnt|data|Users|var|opt)/[^\s\"']+")


def absolute_paths(folder: str | os.PathLike) -> dict[str, list[str]]:
    """Absolute paths found in the text files of an export (an export must hold none: it moves)."""
    found = {}
    for f in Path(folder).iterdir():
        if f.is_file() and f.suffix in (".json", ".md", ".txt", ".py"):
            hits = _ABS.findall(f.read_text(encoding="utf-8", errors="replace"))
            if hits:
                found[f.name] = hits[:3]
    return found
