"""The stages of a reproduction, in order, and the parts of it (NLU, NLG, all) with their report files."""

from __future__ import annotations

from skillnet.experiments.nlg import (
    stage_bart_pt,
    stage_nlg_adapt,
    stage_nlg_main,
    stage_nlg_tasks,
    stage_nlg_temp,
    stage_nlg_tune,
)
from skillnet.experiments.nlu import (
    stage_dense_ctrl_pt,
    stage_dense_pt,
    stage_nlu_ablate,
    stage_nlu_adapt,
    stage_nlu_alpha,
    stage_nlu_loss_scale,
    stage_nlu_main,
    stage_nlu_tasks,
    stage_nlu_tune,
    stage_sparse_pt,
)
from skillnet.experiments.runner import TASK_STAGES, Stage, stage_corpus, stage_shards, stage_vocab

STAGES: list[Stage] = [
    Stage("nlu_tasks", "NLU task data", stage_nlu_tasks),
    Stage("nlg_tasks", "NLG task data", stage_nlg_tasks),
    Stage("corpus", "raw text from the installed packages, less what shares text with any task's dev/test",
          stage_corpus),
    Stage("vocab", "the vocab entries the corpus and the tasks' training files use", stage_vocab),
    Stage("shards", "WordPiece -> memory-mapped shards", stage_shards),
    Stage("dense_pt", "dense MLM pre-training (BERT)", stage_dense_pt),
    Stage("sparse_pt", "sparse MLM+NSP pre-training, one run per seed, 2 ranks, DeepSpeed", stage_sparse_pt),
    Stage("dense_ctrl_pt", "its dense control: the same MLM+NSP steps without skills, one run per seed",
          stage_dense_ctrl_pt),
    Stage("nlu_tune", "each Table 3 row's lr chosen on dev (one seed, reduced budget)", stage_nlu_tune),
    Stage("nlu_loss_scale", "NER loss scale in joint training, decided on dev (dense joint, SkillNet, task-specific)",
          stage_nlu_loss_scale),
    Stage("nlu_main", "NLU methods compared (Table 3)", stage_nlu_main),
    # adaptation right after the table whose dev-selected models it continues: one part runs both
    # (experiments/parts.py), so those models need not be committed
    Stage("nlu_adapt", "new NLU task (Table 5)", stage_nlu_adapt),
    Stage("nlu_ablate", "skill ablation (Table 6)", stage_nlu_ablate),
    Stage("nlu_alpha", "task sampling alpha (Figure 3)", stage_nlu_alpha),
    Stage("bart_pt", "BART denoising pre-training, 2 ranks, DeepSpeed", stage_bart_pt),
    Stage("nlg_tune", "each NLG Table 3 row's lr chosen on dev (one seed, reduced budget)", stage_nlg_tune),
    Stage("nlg_main", "NLG methods compared (NLG Table 3)", stage_nlg_main),
    Stage("nlg_adapt", "new NLG task (NLG Table 4)", stage_nlg_adapt),
    Stage("nlg_temp", "sampling temperature (NLG §3.4)", stage_nlg_temp),
]


# Every part builds both halves' task data before the corpus, which is decontaminated against all of it: the
# corpus, and so every pre-trained model, is the same whichever part runs first.
_DATA = [*TASK_STAGES, "corpus"]
_NLU = [*_DATA, "vocab", "shards", "dense_pt", "sparse_pt", "dense_ctrl_pt", "nlu_tune",
        "nlu_loss_scale", "nlu_main", "nlu_ablate", "nlu_alpha", "nlu_adapt"]
_NLG = [*_DATA, "vocab", "shards", "bart_pt", "nlg_tune", "nlg_main", "nlg_temp", "nlg_adapt"]
PARTS: dict[str, tuple[str, tuple[str, ...], list[str]]] = {  # part -> (report file, report parts, stages)
    "all": ("report.md", ("nlu", "nlg"), [s.name for s in STAGES]),
    "nlu": ("comparison.md", ("nlu",), _NLU),
    "nlg": ("nlg.md", ("nlg",), _NLG),
}

