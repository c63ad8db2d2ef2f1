"""The stages of a reproduction, in order, and the parts of it (NLU, NLG, all) with their report files."""

from __future__ import annotations

from skillnet.experiments.nlg import (
    stage_bart_pt,
    stage_nlg_adapt,
    stage_nlg_main,
    stage_nlg_tasks,
    stage_nlg_temp,
)
from skillnet.experiments.nlu import (
    stage_dense_pt,
    stage_nlu_ablate,
    stage_nlu_adapt,
    stage_nlu_alpha,
    stage_nlu_loss_scale,
    stage_nlu_main,
    stage_nlu_tasks,
    stage_sparse_pt,
)
from skillnet.experiments.runner import Stage, stage_corpus, stage_shards, stage_vocab

STAGES: list[Stage] = [
    Stage("corpus", "raw text from the installed packages", stage_corpus),
    Stage("nlu_tasks", "NLU task data", stage_nlu_tasks),
    Stage("nlg_tasks", "NLG task data", stage_nlg_tasks),
    Stage("vocab", "the vocab entries the corpus and the tasks' training files use", stage_vocab),
    Stage("shards", "WordPiece -> memory-mapped shards", stage_shards),
    Stage("dense_pt", "dense MLM pre-training (BERT)", stage_dense_pt),
    Stage("sparse_pt", "sparse MLM+NSP pre-training, 2 ranks, DeepSpeed", stage_sparse_pt),
    Stage("nlu_loss_scale", "NER loss scale in joint training (dense joint, SkillNet)", stage_nlu_loss_scale),
    Stage("nlu_main", "NLU methods compared (Table 3)", stage_nlu_main),
    Stage("nlu_ablate", "skill ablation (Table 6)", stage_nlu_ablate),
    Stage("nlu_alpha", "task sampling alpha (Figure 3)", stage_nlu_alpha),
    Stage("nlu_adapt", "new NLU task (Table 5)", stage_nlu_adapt),
    Stage("bart_pt", "BART denoising pre-training, 2 ranks, DeepSpeed", stage_bart_pt),
    Stage("nlg_main", "NLG methods compared (NLG Table 3)", stage_nlg_main),
    Stage("nlg_temp", "sampling temperature (NLG §3.4)", stage_nlg_temp),
    Stage("nlg_adapt", "new NLG task (NLG Table 4)", stage_nlg_adapt),
]


_NLU = ["corpus", "nlu_tasks", "vocab", "shards", "dense_pt", "sparse_pt", "nlu_loss_scale", "nlu_main", "nlu_ablate",
        "nlu_alpha", "nlu_adapt"]
_NLG = ["corpus", "nlg_tasks", "vocab", "shards", "bart_pt", "nlg_main", "nlg_temp", "nlg_adapt"]
PARTS: dict[str, tuple[str, tuple[str, ...], list[str]]] = {  # part -> (report file, report parts, stages)
    "all": ("report.md", ("nlu", "nlg"), [s.name for s in STAGES]),
    "nlu": ("comparison.md", ("nlu",), _NLU),
    "nlg": ("nlg.md", ("nlg",), _NLG),
}

