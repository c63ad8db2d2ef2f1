"""SkillNet-BART (SkillNet-NLG §2.2): HF BART whose FFNs in some encoder and decoder layers are banks of
skills, of which a task activates a few.

Everything but the FFN is transformers' BART (embeddings, attention, masks, cache, `GenerationMixin`), so
`generate` works unchanged: beam search, length limits, `num_return_sequences`. Parameter names follow
``BartForConditionalGeneration``. A skill layer holds
``model.{encoder,decoder}.layers.{i}.skill_ffn.skills.{k}.{intermediate,output}.dense`` in place of
``fc1``/``fc2`` (plus ``...output.LayerNorm`` in place of ``final_layer_norm`` with per-skill LayerNorm);
other layers keep HF's ``fc1``/``fc2``/``final_layer_norm``, so a dense BART state dict loads.

Skill choice is data: forward takes ``task=`` (a name, or one per row) or ``skill_ids=`` ([k], or [B, k]
with -1 pads). One `SkillRouting` per forward serves the encoder and the decoder. In `generate`, per-row
skills travel as a [B, k] ``skill_ids`` tensor, which HF expands with the inputs (beams, returned
sequences), so each beam keeps its row's skills for the whole generation.

The config's router (routers.py) builds each stack's routing. A router that routes tokens (a token gate in
every skill layer) gets each stack's own tokens, padding excluded (the encoder's attention mask; the
decoder's attention mask, or ``labels != -100`` when training without one). Auxiliary losses come back
through the two routings; the router reduces and weights them, and the weighted sum is added to the LM loss
(``aux_loss``, weighted; ``aux_losses``/``metrics``, raw). In `generate` a token gate routes the new token of
every beam at every decoding step, in evaluation mode: its evaluation capacity factor, by default here
None, drops no token, so cached decoding equals decoding without a cache.

Packed rows (training/packing.py `pack_pairs`): a forward given both sides' `PackedLayout` (model/packed.py)
and ``decoder_input_ids`` runs both stacks over rows that
hold several samples each, through the attention seam (model/attention.py): encoder self-attention inside
a sample, decoder self-attention causal inside a sample, cross-attention from the decoder's sample k to
the encoder's sample k, and learned positions that restart at each sample. Generation never packs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import BartConfig
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.models.bart.modeling_bart import (
    BartDecoder,
    BartDecoderLayer,
    BartEncoder,
    BartEncoderLayer,
    BartForConditionalGeneration,
    BartLearnedPositionalEmbedding,
    BartModel,
    BartPreTrainedModel,
    BartScaledWordEmbedding,
)
from transformers.utils import ModelOutput
from transformers.utils.deprecation import deprecate_kwarg

from .attention import AttentionMask
from .bart_packed import packed_attention, packed_model_forward
from .packed import PackedLayout
from .registry import build_router
from .routing import SkillRoutingMixin, _rows, start_routings
from .skill_ffn import Skill, SkillFFN, SkillRouting
from .skill_layout import SkillLayoutMixin, layer_ids_from_spec

# Table 1 of SkillNet-NLG, in its order.
NLG_SKILLS: list[dict[str, str]] = [
    {"name": "open_end", "description": "open-ended text generation"},
    {"name": "non_open_end", "description": "non-open-ended text generation"},
    {"name": "conversation", "description": "understand the conversational contexts"},
    {"name": "data_to_text", "description": "generate text from structured data"},
    {"name": "question", "description": "understand natural language questions"},
    {"name": "general", "description": "generic skill"},
]

# Table 2: the five multi-task tasks, then the three new tasks. `general` is added by `generic_skill`.
NLG_TASKS: dict[str, list[str]] = {
    "text_summarization": ["non_open_end"],
    "advertisement_generation": ["open_end", "data_to_text"],
    "question_answering": ["open_end", "question"],
    "dialogue_generation": ["open_end", "conversation", "question"],
    "grammatical_error_correction": ["non_open_end"],
    "topic_to_essay_generation": ["open_end", "data_to_text"],
    "paraphrase_generation": ["non_open_end"],
    "story_generation": ["open_end"],
}

# The bert-base-chinese WordPiece vocab, used as the public SkillNet-NLG code does: [PAD]=0, [CLS]=101 as
# bos, [SEP]=102 as eos and decoder start (labels are "[CLS] y [SEP]").
BERT_CHINESE_TOKENS: dict[str, int] = dict(
    vocab_size=21128, pad_token_id=0, bos_token_id=101, eos_token_id=102, decoder_start_token_id=102,
    forced_eos_token_id=102,
)


def _size(d: int, layers: int, heads: int, ffn: int, positions: int) -> dict[str, int]:
    return dict(
        d_model=d, encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads,
        decoder_attention_heads=heads, encoder_ffn_dim=ffn, decoder_ffn_dim=ffn,
        max_position_embeddings=positions,
    )


# "tiny" is for tests; "small" pre-trains and fine-tunes on a CPU in tens of minutes; "large" is the
# paper's BART-large (Appendix C.1), for parameter counts (Table 6) rather than CPU training.
BART_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {**BERT_CHINESE_TOKENS, **_size(32, 2, 4, 64, 128)},
    "small": {**BERT_CHINESE_TOKENS, **_size(256, 3, 4, 1024, 512)},
    "base": {**BERT_CHINESE_TOKENS, **_size(768, 6, 12, 3072, 1024)},  # BART-base's sizes
    "large": {**BERT_CHINESE_TOKENS, **_size(1024, 12, 16, 4096, 1024)},
}

# HF BART's LayerNorms use the torch default.
_LAYER_NORM_EPS = 1e-5


@strict
class SkillNetBartConfig(SkillLayoutMixin, BartConfig):
    r"""BART config plus the skill layout of SkillNet-NLG.

    The skill layout and the router (``skills``, ``tasks``, ``generic_skill``, ``skill_layers``,
    ``ffn_impl``, ``skill_layernorm``, ``router``, ``moe_*``) are `SkillLayoutMixin`'s fields, with the
    same meaning as for SkillNet-BERT; defaults here: Table 1's skills, Table 2's tasks,
    ``generic_skill="general"``, skills in layers 0, 2, 4, ... (``"every_other"``) of the encoder and of
    the decoder. ``router`` is ``"task"`` (SkillNet-NLG) or ``"topk"`` (a token gate in
    every skill layer of both stacks; padding, from the encoder and decoder attention masks or the labels,
    takes no part). BART also has:

    decoder_skill_layers: the decoder's spec when it differs (``None``: same as ``skill_layers``).
    moe_eval_capacity_factor: ``None`` by default here: no token is dropped in evaluation, where
        generation decodes one token per beam and step (a number restores BERT's behaviour).
    """

    model_type = "skillnet-bart"
    default_skills = NLG_SKILLS
    default_tasks = NLG_TASKS
    presets = BART_PRESETS
    init_std_field = "init_std"
    width_field = "d_model"

    generic_skill: str | None = "general"
    init_std: float | None = None  # None: width_init_std(d_model)
    skill_layers: str | list | None = "every_other"
    decoder_skill_layers: str | list | None = None
    # Generation decodes few tokens per step (one per beam), the beams of one input tend to pick the same
    # experts, and a capacity would drop some of them (fairseq's note on decoding), making a beam's output
    # depend on its siblings: with 6 experts, top-2 and BERT's 2.0, beam-4 decoding of a random tiny model
    # dropped tokens in most steps.
    moe_eval_capacity_factor: float | None = None

    def validate_skill_layers(self) -> None:
        self.encoder_skill_layer_ids()
        self.decoder_skill_layer_ids()  # both raise on a bad spec

    def encoder_skill_layer_ids(self) -> list[int]:
        return layer_ids_from_spec(self.skill_layers, self.encoder_layers, "skill_layers")

    def decoder_skill_layer_ids(self) -> list[int]:
        if self.decoder_skill_layers is None:
            return layer_ids_from_spec(self.skill_layers, self.decoder_layers, "skill_layers")
        return layer_ids_from_spec(self.decoder_skill_layers, self.decoder_layers, "decoder_skill_layers")


# ---- layers ------------------------------------------------------------------------------------------
class _FFNSublayer:
    """The FFN half of a BART layer: HF's dense ``fc1``/``fc2`` or a bank of skills (Eq. 2-3)."""

    def _setup_ffn(self, config: SkillNetBartConfig, ffn_dim: int, has_skills: bool) -> None:
        self.has_skills = has_skills
        if not has_skills:
            return
        # The dense FFN built by HF's __init__ is replaced by the bank.
        del self.fc1, self.fc2
        per_skill_ln = config.skill_layernorm == "per_skill"
        if per_skill_ln:
            del self.final_layer_norm
        self.skill_ffn = SkillFFN(
            config.d_model, ffn_dim, config.num_skills, config.activation_function, config.ffn_impl,
            per_skill_ln, _LAYER_NORM_EPS, config.dropout, build_router(config).layer_gate(config.d_model),
            activation_dropout=float(config.activation_dropout or 0.0),
        )

    def _ffn(self, h_BTD: torch.Tensor, routing: SkillRouting | None) -> torch.Tensor:
        """LN(h + dropout(FFN(h))), with FFN the dense one or the mean of the active skills."""
        if not self.has_skills:
            y = self.activation_fn(self.fc1(h_BTD))
            y = self.fc2(F.dropout(y, p=self.activation_dropout, training=self.training))
        elif routing is None:
            raise ValueError("a skill layer needs a routing: pass task= or skill_ids= to the model")
        elif self.skill_ffn.per_skill_layernorm:
            return self.skill_ffn(h_BTD, routing, residual_BTD=h_BTD)
        else:
            y = self.skill_ffn(h_BTD, routing)
        y = F.dropout(y, p=self.dropout, training=self.training)
        return self.final_layer_norm(h_BTD + y)


class SkillNetBartEncoderLayer(_FFNSublayer, BartEncoderLayer):
    def __init__(self, config: SkillNetBartConfig, layer_idx: int, has_skills: bool) -> None:
        super().__init__(config, layer_idx)
        self._setup_ffn(config, config.encoder_ffn_dim, has_skills)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        routing: SkillRouting | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        residual = hidden_states
        if isinstance(attention_mask, AttentionMask):  # packed rows
            hidden_states = packed_attention(self.self_attn, hidden_states, hidden_states, attention_mask)
        else:
            hidden_states, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.self_attn_layer_norm(residual + hidden_states)
        hidden_states = self._ffn(hidden_states, routing)
        if hidden_states.dtype == torch.float16 and not torch.isfinite(hidden_states).all():
            clamp_value = torch.finfo(hidden_states.dtype).max - 1000
            hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
        return hidden_states


class SkillNetBartDecoderLayer(_FFNSublayer, BartDecoderLayer):
    def __init__(self, config: SkillNetBartConfig, layer_idx: int, has_skills: bool) -> None:
        super().__init__(config, layer_idx)
        self._setup_ffn(config, config.decoder_ffn_dim, has_skills)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = True,
        routing: SkillRouting | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        residual = hidden_states
        packed = isinstance(attention_mask, AttentionMask)
        if packed:
            hidden_states = packed_attention(self.self_attn, hidden_states, hidden_states, attention_mask)
        else:
            hidden_states, _ = self.self_attn(
                hidden_states, cache=cache, attention_mask=attention_mask, **kwargs
            )
        hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.self_attn_layer_norm(residual + hidden_states)
        if encoder_hidden_states is not None:
            residual = hidden_states
            if packed:
                hidden_states = packed_attention(self.encoder_attn, hidden_states, encoder_hidden_states,
                                                  encoder_attention_mask)
            else:
                hidden_states, _ = self.encoder_attn(
                    hidden_states,
                    key_value_states=encoder_hidden_states,
                    attention_mask=encoder_attention_mask,
                    cache=cache,
                    **kwargs,
                )
            hidden_states = F.dropout(hidden_states, p=self.dropout, training=self.training)
            hidden_states = self.encoder_attn_layer_norm(residual + hidden_states)
        return self._ffn(hidden_states, routing)


# ---- encoder / decoder -------------------------------------------------------------------------------
def _embed_scale(config: SkillNetBartConfig) -> float:
    return config.d_model**0.5 if config.scale_embedding else 1.0


def _init_stack(stack: nn.Module, config: SkillNetBartConfig, layer_cls: type, skill_layer_ids: list[int],
                num_layers: int) -> None:
    """As BartEncoder/BartDecoder.__init__, minus building dense FFNs that skill layers would throw away."""
    BartPreTrainedModel.__init__(stack, config)
    stack.dropout = config.dropout
    stack.padding_idx = config.pad_token_id
    stack.embed_tokens = BartScaledWordEmbedding(
        config.vocab_size, config.d_model, stack.padding_idx, embed_scale=_embed_scale(config)
    )
    stack.embed_positions = BartLearnedPositionalEmbedding(config.max_position_embeddings, config.d_model)
    stack.layers = nn.ModuleList(layer_cls(config, i, i in skill_layer_ids) for i in range(num_layers))
    stack.layernorm_embedding = nn.LayerNorm(config.d_model)
    stack.gradient_checkpointing = False


class SkillNetBartEncoder(SkillRoutingMixin, BartEncoder):
    """HF's `BartEncoder` with skill layers. Its forward is HF's; the routing reaches layers as a kwarg."""

    def __init__(self, config: SkillNetBartConfig) -> None:
        _init_stack(self, config, SkillNetBartEncoderLayer, config.encoder_skill_layer_ids(), config.encoder_layers)
        self.layerdrop = config.encoder_layerdrop
        self.max_source_positions = config.max_position_embeddings
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        *,
        task: str | Sequence[str] | None = None,
        skill_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None,
        routing: SkillRouting | None = None,
        **kwargs: Any,
    ) -> BaseModelOutput:
        if routing is None:
            batch, device, seq_len = _rows(input_ids, inputs_embeds)
            routing = self.stack_routing(task, skill_ids, attention_mask, seq_len, device, batch)
        return super().forward(
            input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, routing=routing,
            **kwargs,
        )


class SkillNetBartDecoder(SkillRoutingMixin, BartDecoder):
    """HF's `BartDecoder` with skill layers; its forward (masks, cache) is HF's."""

    def __init__(self, config: SkillNetBartConfig) -> None:
        _init_stack(self, config, SkillNetBartDecoderLayer, config.decoder_skill_layer_ids(), config.decoder_layers)
        self.layerdrop = config.decoder_layerdrop
        self.max_target_positions = config.max_position_embeddings
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # as HF's own forward
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        *,
        task: str | Sequence[str] | None = None,
        skill_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None,
        routing: SkillRouting | None = None,
        **kwargs: Any,
    ) -> Any:
        if routing is None:
            batch, device, seq_len = _rows(input_ids, inputs_embeds)
            routing = self.stack_routing(task, skill_ids, attention_mask, seq_len, device, batch)
        return super().forward(
            input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask, cache=cache,
            inputs_embeds=inputs_embeds, use_cache=use_cache, routing=routing, **kwargs,
        )


# ---- models ------------------------------------------------------------------------------------------
class SkillNetBartPreTrainedModel(SkillRoutingMixin, BartPreTrainedModel):
    config_class = SkillNetBartConfig
    config: SkillNetBartConfig
    _no_split_modules = [r"SkillNetBartEncoderLayer", r"SkillNetBartDecoderLayer"]

    def skill_banks(self) -> list[SkillFFN]:
        """The skill FFN bank of every skill layer: encoder bottom to top, then decoder bottom to top."""
        base = self if isinstance(self, SkillNetBartModel) else self.model
        layers = [*base.encoder.layers, *base.decoder.layers]
        return [layer.skill_ffn for layer in layers if layer.has_skills]

    def skill_modules(self, name: str) -> list[Skill]:
        """The `Skill` module of skill `name` in every skill layer (encoder, then decoder)."""
        k = self.config.skill_index(name)
        return [bank.skills[k] for bank in self.skill_banks()]


@dataclass
class SkillNetSeq2SeqLMOutput(Seq2SeqLMOutput):
    """HF's seq2seq LM output plus the method's auxiliary losses (as SkillNet-BERT's encoder output):
    `aux_losses` raw by name, `aux_loss` their weighted sum (already in `loss`), and `metrics` the raw
    values, detached tensors, for the trainer's log (``aux_<name>``; only when `labels` are given)."""

    aux_losses: dict[str, torch.Tensor] | None = None
    aux_loss: torch.Tensor | None = None
    metrics: dict[str, float] | None = None


class SkillNetBartModel(SkillNetBartPreTrainedModel, BartModel):
    # The LM head's bias, in every export: the backbone (feature extraction) leaves it out on purpose.
    _keys_to_ignore_on_load_unexpected = [r"final_logits_bias"]

    def __init__(self, config: SkillNetBartConfig) -> None:
        # As BartModel.__init__ with the skill encoder and decoder (BartModel's would build dense ones).
        BartPreTrainedModel.__init__(self, config)
        self.shared = BartScaledWordEmbedding(
            config.vocab_size, config.d_model, config.pad_token_id, embed_scale=_embed_scale(config)
        )
        self.encoder = SkillNetBartEncoder(config)
        self.decoder = SkillNetBartDecoder(config)
        self.post_init()

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # as HF's own forward
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.LongTensor | None = None,
        encoder_outputs: Any = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        *,
        task: str | Sequence[str] | None = None,
        skill_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None,
        routing: SkillRouting | None = None,
        decoder_token_mask: torch.Tensor | None = None,
        routings_out: list[SkillRouting] | None = None,
        packed: PackedLayout | None = None,
        decoder_packed: PackedLayout | None = None,
        **kwargs: Any,
    ) -> Seq2SeqModelOutput:
        """HF `BartModel.forward` plus the skill choice (`task=` or `skill_ids=`), one routing for both
        stacks. A router that routes tokens gets each stack's own: padding from `attention_mask` in the
        encoder and from `decoder_token_mask` (else `decoder_attention_mask`) in the decoder. The routings
        used are appended to `routings_out`: what the layers returned through them (auxiliary losses) is
        there after the forward (a stack that did not run, such as a cached encoder, added nothing).

        Packed rows (module docstring): the encoder side's ``packed`` layout and the decoder side's
        ``decoder_packed``, or the batch's keys that carry them (`PackedLayout.take`), with ``decoder_input_ids``
        built per sample."""
        packed = PackedLayout.take(kwargs) if packed is None else packed
        decoder_packed = PackedLayout.take(kwargs, "decoder_") if decoder_packed is None else decoder_packed
        if packed is not None:
            return packed_model_forward(
                self, input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, packed, decoder_packed,
                task=task, skill_ids=skill_ids, routings_out=routings_out, cache=cache,
                encoder_outputs=encoder_outputs, use_cache=use_cache,
            )
        enc_routing = dec_routing = routing
        if routing is None:
            batch, device, dec_len = _rows(decoder_input_ids, decoder_inputs_embeds, input_ids, inputs_embeds)
            router = self.router
            if router.routes_tokens:
                enc_len = _rows(input_ids, inputs_embeds)[2]
                dec_mask = decoder_token_mask if decoder_token_mask is not None else decoder_attention_mask
                enc_routing = self.stack_routing(task, skill_ids, attention_mask, enc_len, device, batch)
                dec_routing = self.stack_routing(None, None, dec_mask, dec_len, device, batch)
            else:
                enc_routing = dec_routing = router.route(self, task, skill_ids, device=device, batch_size=batch)
        start_routings(routings_out, enc_routing, dec_routing)
        if encoder_outputs is None and enc_routing is not dec_routing:
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                routing=enc_routing, **kwargs,
            )
        return super().forward(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            cache=cache, inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache, routing=dec_routing, **kwargs,
        )


class SkillNetBartForConditionalGeneration(SkillNetBartPreTrainedModel, BartForConditionalGeneration):
    """Seq2seq LM: lm_head tied to the shared embeddings, `final_logits_bias` as HF. Beam search with 4
    beams by default (Appendix C.1); pass per-task limits (`max_new_tokens`, ...) to `generate`."""

    def __init__(self, config: SkillNetBartConfig) -> None:
        BartPreTrainedModel.__init__(self, config)
        self.model = SkillNetBartModel(config)
        self.final_logits_bias = nn.Buffer(torch.zeros((1, self.model.shared.num_embeddings)))
        self.lm_head = nn.Linear(config.d_model, self.model.shared.num_embeddings, bias=False)
        self.post_init()
        self.generation_config.num_beams = 4
        self.generation_config.early_stopping = True

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")  # as HF's own forward
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.LongTensor | None = None,
        encoder_outputs: Any = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        *,
        task: str | Sequence[str] | None = None,
        skill_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None,
        routing: SkillRouting | None = None,
        **kwargs: Any,
    ) -> SkillNetSeq2SeqLMOutput:
        """HF `BartForConditionalGeneration.forward` plus the skill choice (`task=` or `skill_ids=`), and the
        router's weighted auxiliary losses added to the LM loss."""
        router = self.router
        if router.routes_tokens and labels is not None and decoder_attention_mask is None and decoder_input_ids is None:
            # HF builds the decoder inputs from the labels: their padding (-100) is the decoder's padding.
            kwargs["decoder_token_mask"] = labels != -100
        routings: list[SkillRouting] = []
        out = super().forward(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            cache=cache, inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds, labels=labels, use_cache=use_cache, task=task,
            skill_ids=skill_ids, routing=routing, routings_out=routings, **kwargs,
        )
        if not isinstance(out, ModelOutput):  # return_dict=False
            return out
        aux = router.aux_losses(self.model, routings)
        weighted = router.weighted(aux)
        loss = out.loss if weighted is None or out.loss is None else out.loss + weighted
        metrics = None
        if aux and labels is not None:
            metrics = {f"aux_{k}": v.detach() for k, v in aux.items()}
        return SkillNetSeq2SeqLMOutput(
            **{**out, "loss": loss}, aux_losses=aux or None, aux_loss=weighted, metrics=metrics
        )

    def generate(
        self, *args: Any, task: str | Sequence[str] | None = None, skill_ids: Any = None, **kwargs: Any
    ) -> Any:
        """HF `generate` with the skills fixed per row for the whole generation.

        A task name or a flat skill-id list applies to every row. One task (or one id row) per input row
        becomes a [B, k] ``skill_ids`` tensor, which HF expands with the inputs for beams and returned
        sequences (a Python list would not be expanded).
        """
        if task is not None and skill_ids is not None:
            raise ValueError("pass exactly one of task= (a name or one name per row) or skill_ids=")
        if task is not None and not isinstance(task, str):
            task, skill_ids = None, self.skill_id_rows(task)
        elif skill_ids is not None:
            ids = skill_ids.tolist() if isinstance(skill_ids, torch.Tensor) else list(skill_ids)
            if ids and isinstance(ids[0], (list, tuple)):
                width = max(map(len, ids))
                skill_ids = torch.tensor([list(r) + [-1] * (width - len(r)) for r in ids], dtype=torch.long)
            else:
                skill_ids = ids  # one set for all rows: keep it out of HF's per-row expansion
        if task is not None:
            kwargs["task"] = task
        if skill_ids is not None:
            kwargs["skill_ids"] = skill_ids
        return super().generate(*args, **kwargs)
