"""SkillNet-BERT: a BERT encoder whose FFNs are banks of skills (skillnet-nlu.md §3.1).

Parameter names follow HF ``BertModel`` (``embeddings.*``, ``encoder.layer.{i}.attention.*``,
``encoder.layer.{i}.output.LayerNorm``, ``pooler.dense``) so dense checkpoints load; a skill layer holds
``encoder.layer.{i}.skill_ffn.skills.{k}.{intermediate,output}.dense`` in place of the dense FFN, and a
layer without skills (see ``config.skill_layers``) keeps HF's ``intermediate.dense`` / ``output.dense``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

from .config import SkillNetBertConfig
from .hub import has_tokenizer, save_tokenizer, write_remote_code
from .pals import ProjectedAttentionLayers, task_rows
from .routers import LearnedSkillMap
from .skill_ffn import Skill, SkillFFN, SkillRouting


class Embeddings(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids_BT: torch.Tensor, token_type_ids_BT: torch.Tensor | None) -> torch.Tensor:
        T = input_ids_BT.shape[1]
        if self.position_embeddings.num_embeddings < T:
            raise ValueError(
                f"sequence length {T} exceeds max_position_embeddings={self.position_embeddings.num_embeddings}"
            )
        pos = torch.arange(T, device=input_ids_BT.device)
        if token_type_ids_BT is None:
            token_type_ids_BT = torch.zeros_like(input_ids_BT)
        x = self.word_embeddings(input_ids_BT) + self.token_type_embeddings(token_type_ids_BT)
        x = x + self.position_embeddings(pos)[None]
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        if config.hidden_size % config.num_attention_heads:
            raise ValueError(
                f"hidden_size={config.hidden_size} is not a multiple of num_attention_heads={config.num_attention_heads}"
            )
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x_BTD: torch.Tensor, mask_B11T: torch.Tensor | None) -> torch.Tensor:
        B, T, D = x_BTD.shape
        H = self.num_heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, H, D // H).transpose(1, 2)

        q, k, v = heads(self.query(x_BTD)), heads(self.key(x_BTD)), heads(self.value(x_BTD))
        o_BHTd = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask_B11T, dropout_p=self.dropout_p if self.training else 0.0
        )
        return o_BHTd.transpose(1, 2).reshape(B, T, D)


class _DenseLN(nn.Module):
    def __init__(self, d_in: int, d_out: int, eps: float, dropout: float, dense: bool = True) -> None:
        super().__init__()
        if dense:
            self.dense = nn.Linear(d_in, d_out)
        self.LayerNorm = nn.LayerNorm(d_out, eps=eps)
        self.dropout = nn.Dropout(dropout)


class Attention(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        self.self = SelfAttention(config)
        self.output = _DenseLN(
            config.hidden_size, config.hidden_size, config.layer_norm_eps, config.hidden_dropout_prob
        )

    def forward(self, x_BTD: torch.Tensor, mask_B11T: torch.Tensor | None) -> torch.Tensor:
        h = self.output.dropout(self.output.dense(self.self(x_BTD, mask_B11T)))
        return self.output.LayerNorm(h + x_BTD)


class Layer(nn.Module):
    """Attention, then either a skill FFN bank (skill layer) or HF's dense FFN (shared layer)."""

    def __init__(self, config: SkillNetBertConfig, has_skills: bool) -> None:
        super().__init__()
        self.has_skills = has_skills
        self.attention = Attention(config)
        d, f, eps, p = (
            config.hidden_size,
            config.intermediate_size,
            config.layer_norm_eps,
            config.hidden_dropout_prob,
        )
        per_skill_ln = has_skills and config.skill_layernorm == "per_skill"
        if has_skills:
            top_k = config.moe_top_k if config.router == "topk" else 0
            self.skill_ffn = SkillFFN(
                d, f, config.num_skills, config.hidden_act, config.ffn_impl, per_skill_ln, eps, p, top_k,
                *config.moe_capacity_factors(),
            )
        else:
            self.act = ACT2FN[config.hidden_act]
            self.intermediate = nn.Module()
            self.intermediate.dense = nn.Linear(d, f)
        if not per_skill_ln:
            self.output = _DenseLN(f, d, eps, p, dense=not has_skills)

    def forward(
        self, x_BTD: torch.Tensor, mask_B11T: torch.Tensor | None, routing: SkillRouting,
        pal: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        a_BTD = self.attention(x_BTD, mask_B11T)
        if not self.has_skills:
            h = self.output.dense(self.act(self.intermediate.dense(a_BTD)))
        elif self.skill_ffn.per_skill_layernorm:
            return self.skill_ffn(a_BTD, routing, residual_BTD=a_BTD)
        else:
            h = self.skill_ffn(a_BTD, routing)
        h = self.output.dropout(h) + a_BTD
        if pal is not None:  # PALs: inside the FFN residual, before the LayerNorm (Bert-n-PALs)
            p_BTD = pal(x_BTD)
            if p_BTD is not None:
                h = h + p_BTD
        return self.output.LayerNorm(h)


class Encoder(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        skill_layers = set(config.skill_layer_ids())
        self.layer = nn.ModuleList(Layer(config, i in skill_layers) for i in range(config.num_hidden_layers))


class Pooler(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, h_BTD: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(h_BTD[:, 0]))


@dataclass
class EncoderOutput(ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    # Auxiliary losses of the method (MoE load balance, learned-map orthogonality): raw values by name,
    # and their weighted sum, which the task models add to the task loss.
    aux_losses: dict[str, torch.Tensor] | None = None
    aux_loss: torch.Tensor | None = None


class SkillNetBertPreTrainedModel(PreTrainedModel):
    config_class = SkillNetBertConfig
    config: SkillNetBertConfig
    base_model_prefix = "bert"
    # Old HF checkpoints carry this buffer; we compute positions on the fly.
    _keys_to_ignore_on_load_unexpected = [r"position_ids"]

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, LearnedSkillMap):
            module.reset_parameters()

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """HF save, plus the modeling code and ``auto_map`` (plain transformers loads the folder with
        ``trust_remote_code=True``) and the tokenizer of the checkpoint this model came from, if it had one.
        A learned task-skill map is first written into ``config.tasks``, so the saved config names exactly
        the skills the map selects now (what counts, exports and metadata read)."""
        base = self.base_model
        if getattr(base, "skill_map", None) is not None:
            base.sync_learned_map()
        super().save_pretrained(save_directory, *args, **kwargs)
        if not kwargs.get("is_main_process", True):
            return
        write_remote_code(save_directory, self.config.model_type)
        src = getattr(self.config, "_name_or_path", "") or ""
        if src and Path(src).is_dir() and has_tokenizer(src) and not has_tokenizer(save_directory):
            save_tokenizer(save_directory, source=src)

    # ---- routing ---------------------------------------------------------------------------------
    def routing(
        self,
        task: str | Sequence[str] | None = None,
        skill_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None,
        device: torch.device | str = "cpu",
    ) -> SkillRouting:
        """Skill routing from a task name, one task per row, or explicit skill ids ([k] or [B, k], -1 pads)."""
        if (task is None) == (skill_ids is None):
            raise ValueError("pass exactly one of task= (a name or one name per row) or skill_ids=")
        if task is not None:
            if isinstance(task, str):
                return SkillRouting.uniform(self.config.skill_ids(task))
            return SkillRouting.per_row([self.config.skill_ids(t) for t in task], device)
        if isinstance(skill_ids, torch.Tensor):
            skill_ids = skill_ids.tolist()
        if len(skill_ids) and isinstance(skill_ids[0], (list, tuple)):
            rows = skill_ids
        else:
            rows = None
        ids = [i for r in (rows or [skill_ids]) for i in r if i >= 0]
        bad = [i for i in ids if i >= self.config.num_skills]
        if bad:
            raise ValueError(f"skill ids {bad} out of range: the model has {self.config.num_skills} skills")
        return SkillRouting.per_row(rows, device) if rows is not None else SkillRouting.uniform(skill_ids)


class SkillNetBertModel(SkillNetBertPreTrainedModel):
    def __init__(self, config: SkillNetBertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        # Method extras (shared/DESIGN.md): a learned task-skill map, projected attention layers per task.
        self.skill_map = None
        if config.router == "learned":
            gen = config.skill_index(config.generic_skill) if config.generic_skill is not None else None
            self.skill_map = LearnedSkillMap(
                list(config.task_heads) or list(config.tasks), config.num_skills, config.learned_embed_dim, gen,
                config.learned_threshold, config.learned_estimator, config.learned_sharpness)
        self.pals = None
        if config.pals_dim:
            self.pals = ProjectedAttentionLayers(
                list(config.task_heads), config.hidden_size, config.pals_dim, config.pals_heads,
                config.num_hidden_layers, config.attention_probs_dropout_prob)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        task: str | Sequence[str] | None = None,
        skill_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None,
        routing: SkillRouting | None = None,
        output_hidden_states: bool = False,
        **unused: object,
    ) -> EncoderOutput:
        if task is not None and not isinstance(task, str) and len(task) != input_ids.shape[0]:
            raise ValueError(f"{len(task)} tasks given for a batch of {input_ids.shape[0]} rows")
        if routing is None:
            if self.config.router == "topk":  # the gate decides per token; the task only picks the head
                keep = attention_mask.bool() if attention_mask is not None else None
                routing = SkillRouting.token_gate(self.config.num_skills, keep)
            elif self.skill_map is not None and skill_ids is None:
                if task is None:
                    raise ValueError("the learned skill map routes by task: pass task= (or explicit skill_ids=)")
                routing = self.skill_map.routing(task, input_ids.device)
            else:
                routing = self.routing(task, skill_ids, input_ids.device)
        x = self.embeddings(input_ids, token_type_ids)
        mask = None
        if attention_mask is not None:
            # Additive mask: 0 where attended, dtype-min where padded (as HF BERT).
            mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        rows = {}
        if self.pals is not None:
            rows = {t: (None if r is None else r.to(input_ids.device)) for t, r in task_rows(task).items()}
        hidden = [x] if output_hidden_states else None
        for i, layer in enumerate(self.encoder.layer):
            pal = None
            if rows:
                def pal(h: torch.Tensor, i: int = i) -> torch.Tensor | None:
                    return self.pals(i, h, mask, rows)
            x = layer(x, mask, routing, pal)
            if hidden is not None:
                hidden.append(x)
        pooled = self.pooler(x) if self.pooler is not None else None
        aux = self._aux_losses()
        weighted = None
        if aux:
            coef = {"moe_balance": self.config.moe_aux_loss_coef, "orth": self.config.orth_loss_coef}
            weighted = sum(coef[k] * v for k, v in aux.items())
        return EncoderOutput(
            last_hidden_state=x, pooler_output=pooled, hidden_states=tuple(hidden) if hidden else None,
            aux_losses=aux or None, aux_loss=weighted,
        )

    def _aux_losses(self) -> dict[str, torch.Tensor]:
        aux: dict[str, torch.Tensor] = {}
        # Per layer, then averaged: a loss over all layers' tokens concatenated would let one layer's
        # imbalance hide behind another's (transformers #28255).
        moe = [layer.skill_ffn.aux_loss for layer in self.encoder.layer
               if layer.has_skills and layer.skill_ffn.gate is not None and layer.skill_ffn.aux_loss is not None]
        if moe:
            aux["moe_balance"] = torch.stack(moe).mean()
        if self.skill_map is not None and self.training:
            aux["orth"] = self.skill_map.orthogonality_loss()
        return aux

    def learned_task_skills(self) -> dict[str, list[str]]:
        """The learned map's skill names per task (its hard threshold, generic skill included)."""
        if self.skill_map is None:
            raise ValueError("this model has no learned skill map (router is not 'learned')")
        names = self.config.skill_names
        return {t: [names[i] for i in ids] for t, ids in self.skill_map.task_skills().items()}

    def sync_learned_map(self) -> dict[str, list[str]]:
        """Write the learned map into ``config.tasks`` (what counts, exports and metadata read): the model
        routes with the map itself, so the config then says exactly which skills prediction runs."""
        learned = self.learned_task_skills()
        for t, skills in learned.items():
            self.config.tasks[t] = list(skills)
        return learned

    # ---- skill views -----------------------------------------------------------------------------
    def skill_modules(self, name: str) -> list[Skill]:
        """The `Skill` module of skill `name` in every skill layer (bottom to top)."""
        k = self.config.skill_index(name)
        return [layer.skill_ffn.skills[k] for layer in self.encoder.layer if layer.has_skills]
