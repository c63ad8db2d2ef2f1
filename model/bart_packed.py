"""SkillNet-BART over packed rows (training/packing.py `pack_pairs`): several samples per row on both sides,
sample k of a row being segment k of the encoder and of the decoder.

The stacks run HF's layers (their projections, LayerNorms and skill FFNs) under the packed masks of the
attention seam (model/attention.py): encoder self-attention inside a sample, decoder self-attention causal
inside a sample, cross-attention from the decoder's sample k to the encoder's sample k; learned positions
restart at each sample. Generation never packs: it runs HF's forwards (model/bart.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import Seq2SeqModelOutput

from .attention import AttentionMask, attend
from .packed import PackedLayout
from .routing import start_routings
from .skill_ffn import SkillRouting

__all__ = ["packed_attention", "packed_model_forward", "packed_stack"]


def packed_attention(attn: nn.Module, h_BTD: torch.Tensor, kv_BSD: torch.Tensor, mask: AttentionMask
                      ) -> torch.Tensor:
    """HF ``BartAttention`` (its projections, its 1/sqrt(d) scaling, which is SDPA's) over packed rows,
    through the attention seam: no cache, the mask a packed one."""
    B, T, _ = h_BTD.shape
    S = kv_BSD.shape[1]
    H, d = attn.num_heads, attn.head_dim
    q = attn.q_proj(h_BTD).view(B, T, H, d).transpose(1, 2)
    k = attn.k_proj(kv_BSD).view(B, S, H, d).transpose(1, 2)
    v = attn.v_proj(kv_BSD).view(B, S, H, d).transpose(1, 2)
    o = attend(q, k, v, mask, attn.dropout if attn.training else 0.0)
    return attn.out_proj(o.transpose(1, 2).reshape(B, T, H * d))


def packed_stack(stack: nn.Module, input_ids_BT: torch.Tensor, position_ids_BT: torch.Tensor,
                  mask: AttentionMask, routing: SkillRouting, **layer_kwargs: Any) -> torch.Tensor:
    """HF's encoder or decoder forward over packed rows: positions restart at each sample (the learned
    table read at ``position + offset``, as HF reads its ``arange``), every layer under the packed masks."""
    pos = stack.embed_positions
    x = stack.embed_tokens(input_ids_BT) + nn.Embedding.forward(pos, position_ids_BT + pos.offset)
    x = F.dropout(stack.layernorm_embedding(x), p=stack.dropout, training=stack.training)
    for layer in stack.layers:
        if stack.training and stack.layerdrop > 0.0 and torch.rand([]) < stack.layerdrop:
            continue  # LayerDrop, as HF
        x = layer(x, mask, routing=routing, **layer_kwargs)
    return x


def packed_model_forward(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, decoder_input_ids: torch.Tensor | None,
    decoder_attention_mask: torch.Tensor | None, enc: PackedLayout, dec: PackedLayout | None, *,
    task: str | Sequence[str] | None, skill_ids: Any, routings_out: list[SkillRouting] | None, cache: Any,
    encoder_outputs: Any, use_cache: bool | None,
) -> Seq2SeqModelOutput:
    """`SkillNetBartModel.forward` over packed rows (module docstring): both sides' layouts, no cache."""
    missing = [n for n, v in [("decoder_input_ids", decoder_input_ids), ("the decoder's layout", dec)] if v is None]
    if dec is None or decoder_input_ids is None or cache is not None or encoder_outputs is not None or use_cache:
        raise ValueError(f"packed rows need both sides' layout (missing: {', '.join(missing) or 'none'}) and no "
                         "cache or encoder outputs: pack with training.packing.pack_pairs, generate unpacked")
    enc_mask, dec_mask, cross_mask = AttentionMask.packed_pair(enc.segment_ids, dec.segment_ids)
    batch, device = input_ids.shape[0], input_ids.device
    router = model.router
    if router.routes_tokens:
        # Experts fill their capacity in the samples' order, as for the padded batch.
        dec_keep = decoder_attention_mask if decoder_attention_mask is not None else dec.segment_ids > 0
        enc_routing = dataclasses.replace(
            model.stack_routing(task, skill_ids, attention_mask, input_ids.shape[1], device, batch),
            token_order=enc.token_order)
        dec_routing = dataclasses.replace(
            model.stack_routing(None, None, dec_keep, decoder_input_ids.shape[1], device, batch),
            token_order=dec.token_order)
    else:
        enc_routing = dec_routing = router.route(model, task, skill_ids, device=device, batch_size=batch)
    start_routings(routings_out, enc_routing, dec_routing)
    h = packed_stack(model.encoder, input_ids, enc.position_ids, enc_mask, enc_routing)
    d = packed_stack(model.decoder, decoder_input_ids, dec.position_ids, dec_mask, dec_routing,
                      encoder_hidden_states=h, encoder_attention_mask=cross_mask, cache=None, use_cache=False)
    return Seq2SeqModelOutput(last_hidden_state=d, encoder_last_hidden_state=h)
