"""SkillNet-BERT: a BERT encoder whose FFNs are banks of skills (SkillNet-NLU §3.1).

Parameter names follow HF ``BertModel`` (``embeddings.*``, ``encoder.layer.{i}.attention.*``,
``encoder.layer.{i}.output.LayerNorm``, ``pooler.dense``) so dense checkpoints load; a skill layer holds
``encoder.layer.{i}.skill_ffn.skills.{k}.{intermediate,output}.dense`` in place of the dense FFN, and a
layer without skills (see ``config.skill_layers``) keeps HF's ``intermediate.dense`` / ``output.dense``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from .skillnet_attention import AttentionMask, attend
from .skillnet_config import SkillNetBertConfig
from .skillnet_extras import LayerHook, TaskExtras, combine_hooks
from .skillnet_learned_map import LearnedSkillMap
from .skillnet_packed import PackedLayout
from .skillnet_registry import Router, build_extras, build_router
from .skillnet_routing import SkillRoutingMixin
from .skillnet_skill_ffn import Skill, SkillFFN, SkillRouting


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

    def forward(self, input_ids_BT: torch.Tensor, token_type_ids_BT: torch.Tensor | None,
                position_ids_BT: torch.Tensor | None = None) -> torch.Tensor:
        """``position_ids_BT``: each token's position in its own sample (packed rows restart at 0 per sample);
        None: 0..T-1 in every row."""
        T = input_ids_BT.shape[1]
        # A packed row may be longer than the positions: each sample's own restart at 0, and a sample is at most
        # its task's (or the shards') max_seq_len, which the configs check against the positions.
        if position_ids_BT is None and self.position_embeddings.num_embeddings < T:
            raise ValueError(
                f"sequence length {T} exceeds max_position_embeddings={self.position_embeddings.num_embeddings}"
            )
        if token_type_ids_BT is None:
            token_type_ids_BT = torch.zeros_like(input_ids_BT)
        x = self.word_embeddings(input_ids_BT) + self.token_type_embeddings(token_type_ids_BT)
        if position_ids_BT is None:
            x = x + self.position_embeddings(torch.arange(T, device=input_ids_BT.device))[None]
        else:
            x = x + self.position_embeddings(position_ids_BT)
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

    def forward(self, x_BTD: torch.Tensor, mask: AttentionMask | None) -> torch.Tensor:
        B, T, D = x_BTD.shape
        H = self.num_heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, H, D // H).transpose(1, 2)

        q, k, v = heads(self.query(x_BTD)), heads(self.key(x_BTD)), heads(self.value(x_BTD))
        o_BHTd = attend(q, k, v, mask, self.dropout_p if self.training else 0.0)
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

    def forward(self, x_BTD: torch.Tensor, mask: AttentionMask | None) -> torch.Tensor:
        h = self.output.dropout(self.output.dense(self.self(x_BTD, mask)))
        return self.output.LayerNorm(h + x_BTD)


class Layer(GradientCheckpointingLayer):
    """Attention, then either a skill FFN bank (skill layer) or HF's dense FFN (shared layer).

    A `GradientCheckpointingLayer`: under ``activation_checkpointing_enable()`` (HF's convention) each layer
    keeps only its inputs and recomputes the rest in the backward pass. The routing and the task extras'
    hook are arguments of the call, so the replay routes every row to the same skills."""

    def __init__(self, config: SkillNetBertConfig, has_skills: bool, router: Router) -> None:
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
            self.skill_ffn = SkillFFN(
                d, f, config.num_skills, config.hidden_act, config.ffn_impl, per_skill_ln, eps, p,
                router.layer_gate(d),
            )
        else:
            self.act = ACT2FN[config.hidden_act]
            self.intermediate = nn.Module()
            self.intermediate.dense = nn.Linear(d, f)
        if not per_skill_ln:
            self.output = _DenseLN(f, d, eps, p, dense=not has_skills)

    def compile_targets(self) -> list[nn.Module]:
        """What `--compile` compiles (training/compile.py): the attention, which takes no
        routing, so that no skill set or objective recompiles it."""
        return [self.attention]

    def forward(
        self, x_BTD: torch.Tensor, mask: AttentionMask | None, routing: SkillRouting,
        extra: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
    ) -> torch.Tensor:
        a_BTD = self.attention(x_BTD, mask)
        if not self.has_skills:
            h = self.output.dense(self.act(self.intermediate.dense(a_BTD)))
        elif self.skill_ffn.per_skill_layernorm:
            return self.skill_ffn(a_BTD, routing, residual_BTD=a_BTD)
        else:
            h = self.skill_ffn(a_BTD, routing)
        h = self.output.dropout(h) + a_BTD
        if extra is not None:  # task extras: inside the FFN residual, before the LayerNorm (as the public Bert-n-PAL code)
            e_BTD = extra(x_BTD)
            if e_BTD is not None:
                h = h + e_BTD
        return self.output.LayerNorm(h)


class Encoder(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        skill_layers = set(config.skill_layer_ids())
        router = build_router(config)
        self.layer = nn.ModuleList(
            Layer(config, i in skill_layers, router) for i in range(config.num_hidden_layers))


class Pooler(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, h_BTD: torch.Tensor, cls_positions: torch.Tensor | None = None) -> torch.Tensor:
        """Each sample's first token: the row's, or at ``cls_positions`` (flat [B*T] indices) in packed rows."""
        first = h_BTD[:, 0] if cls_positions is None else h_BTD.flatten(0, 1).index_select(0, cls_positions)
        return torch.tanh(self.dense(first))


@dataclass
class EncoderOutput(ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    # Auxiliary losses of the router (e.g. a token gate's load balance): raw values by name, and their
    # weighted sum, which the task models add to the task loss.
    aux_losses: dict[str, torch.Tensor] | None = None
    aux_loss: torch.Tensor | None = None


class SkillNetBertPreTrainedModel(SkillRoutingMixin, PreTrainedModel):
    config_class = SkillNetBertConfig
    config: SkillNetBertConfig
    base_model_prefix = "bert"
    supports_gradient_checkpointing = True
    # Weights a load leaves out on purpose, which transformers would list as UNEXPECTED: the buffer old HF
    # checkpoints carry (positions are computed on the fly), the pre-training heads (cls.*: MLM, NSP) of a
    # pre-training export that fine-tuning starts from or a backbone (feature-extraction) serves, and the task
    # heads (heads.*) of a fine-tuning export served as a backbone. A head the class needs and does not find is
    # still reported (MISSING).
    _keys_to_ignore_on_load_unexpected = [r"position_ids", r"^cls\.", r"^heads\."]

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


class SkillNetBertModel(SkillNetBertPreTrainedModel):
    def __init__(self, config: SkillNetBertConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.encoder = Encoder(config)
        self.pooler = Pooler(config) if add_pooling_layer else None
        # The router's own modules (a learned task-skill map), then the task extras the config asks for,
        # each under the attribute name its parameters are saved with.
        self.router.attach(self)
        for name, module in build_extras(config).items():
            self.add_module(name, module)
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
        packed: PackedLayout | None = None,
        **unused: object,
    ) -> EncoderOutput:
        """Padded rows (one sample each) or packed rows (training/packing.py), whose layout is ``packed`` or
        rides in the batch's keys (`PackedLayout.take`): each sample attends only to itself, its positions
        restart at 0, the pooled outputs are the samples' first tokens in the samples' order ([N, D]), and a
        token gate fills its capacity in the samples' token order."""
        if packed is None:
            packed = PackedLayout.take(unused)
        if task is not None and not isinstance(task, str) and len(task) != input_ids.shape[0]:
            raise ValueError(f"{len(task)} tasks given for a batch of {input_ids.shape[0]} rows")
        if task is None and skill_ids is None:
            task = self.config.default_task  # an export's default task; None keeps the error below
        router = self.router
        if routing is None:
            keep = attention_mask.bool() if attention_mask is not None and router.routes_tokens else None
            routing = router.route(self, task, skill_ids, token_mask_BT=keep, device=input_ids.device)
            if packed is not None and packed.token_order is not None and routing.token_mask is not None:
                routing = dataclasses.replace(routing, token_order=packed.token_order)
        routing.aux.clear()  # a routing passed in again: only this forward's losses count
        x = self.embeddings(input_ids, token_type_ids, None if packed is None else packed.position_ids)
        mask = AttentionMask.build(attention_mask, None if packed is None else packed.segment_ids, x.dtype)
        hook = self._extras_hook(task, mask, input_ids.device)
        hidden = [x] if output_hidden_states else None
        for i, layer in enumerate(self.encoder.layer):
            extra = None
            if hook is not None:
                def extra(h: torch.Tensor, i: int = i) -> torch.Tensor | None:
                    return hook(i, h)
            x = layer(x, mask, routing, extra)
            if hidden is not None:
                hidden.append(x)
        pooled = self.pooler(x, None if packed is None else packed.cls_positions) if self.pooler is not None else None
        aux = router.aux_losses(self, [routing])
        weighted = router.weighted(aux)
        return EncoderOutput(
            last_hidden_state=x, pooler_output=pooled, hidden_states=tuple(hidden) if hidden else None,
            aux_losses=aux or None, aux_loss=weighted,
        )

    def task_extras(self) -> list[TaskExtras]:
        return [m for m in self.children() if isinstance(m, TaskExtras)]

    def _extras_hook(self, task: str | Sequence[str] | None, mask: AttentionMask,
                     device: torch.device) -> LayerHook | None:
        extras = self.task_extras()
        if not extras:  # packed rows' block mask is built only for task extras that read it
            return None
        hooks = [h for m in extras if (h := m.layer_hook(task, mask.additive, device)) is not None]
        return combine_hooks(hooks)

    # ---- skill views -----------------------------------------------------------------------------
    def skill_modules(self, name: str) -> list[Skill]:
        """The `Skill` module of skill `name` in every skill layer (bottom to top)."""
        k = self.config.skill_index(name)
        return [layer.skill_ffn.skills[k] for layer in self.encoder.layer if layer.has_skills]
