"""Greedy and beam search over an exported BART's ONNX encoder and decoder, with ONNX Runtime and numpy only.

``export --plain --onnx`` copies this file into a SkillNet-BART task's folder (``ort/seq2seq.py``) beside
``encoder.onnx`` / ``decoder.onnx`` (and their ``_int8`` twins), so a server needs neither torch, transformers
nor SkillNet to run the task::

    import sys; sys.path.insert(0, f"{folder}/ort")
    from seq2seq import OrtSeq2Seq
    model = OrtSeq2Seq(f"{folder}/ort")                  # int8=True for the quantised graphs
    ids = model.generate(input_ids, attention_mask)      # numpy int64 [batch, source tokens]

The decoder graph has no past key values: each step re-reads the tokens so far (the graph stays one plain
function, and its first step needs no empty cache, which the exporter cannot express). That costs
O(steps^2) decoder work, which the deployment bench measures against the sparse model.

Decoding follows transformers' ``generate`` (5.24) for the settings a plain export's generation config
carries, so that its output can be compared token for token: greedy search (``num_beams == 1``) argmaxes
the processed logits and pads finished rows; beam search keeps the 2·num_beams best continuations of the
summed log-probabilities, moves those that end in EOS among the first num_beams to the finished
hypotheses (score / generated length ** length_penalty), and stops by the same early-stopping rule. The
logits processors are the ones such a config turns on, in transformers' order: ``min_length``,
``forced_bos_token_id``, ``forced_eos_token_id``, ``suppress_tokens``. Anything else (sampling,
n-gram blocking, repetition penalties, several returned sequences) is refused rather than silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

# Settings that change decoding and that this module does not implement: (name, the value that is a no-op).
_UNSUPPORTED = {"do_sample": False, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
                "repetition_penalty": 1.0, "bad_words_ids": None, "num_return_sequences": 1,
                "begin_suppress_tokens": None, "min_new_tokens": None, "sequence_bias": None,
                "exponential_decay_length_penalty": None, "diversity_penalty": 0.0, "num_beam_groups": 1}
# The large finite penalty transformers' beam search adds for "not this one", in float32 as there: penalised
# scores then round alike, so ties among them break the same way.
_NEG = np.float32(-1.0e9)


def _or(v: Any, default: Any) -> Any:
    """transformers' default for a setting a generation config leaves None."""
    return default if v is None else v


def _ids(v: Any) -> list[int]:
    return [] if v is None else [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


class OrtSeq2Seq:
    """The encoder and decoder sessions of one exported BART and its generation config."""

    def __init__(self, folder: str | Path, int8: bool = False, threads: int | None = None,
                 generation_config: dict[str, Any] | None = None) -> None:
        import onnxruntime as ort

        folder = Path(folder)
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        suffix = "_int8" if int8 else ""
        self.encoder = ort.InferenceSession(str(folder / f"encoder{suffix}.onnx"), opts,
                                            providers=["CPUExecutionProvider"])
        self.decoder = ort.InferenceSession(str(folder / f"decoder{suffix}.onnx"), opts,
                                            providers=["CPUExecutionProvider"])
        if generation_config is None:  # the export's own (one folder up), else the one saved beside the graphs
            path = next(p for p in (folder.parent / "generation_config.json", folder / "generation_config.json")
                        if p.is_file())
            generation_config = json.loads(path.read_text(encoding="utf-8"))
        self.gen = dict(generation_config)

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.encoder.run(None, {"input_ids": input_ids.astype(np.int64),
                                       "attention_mask": attention_mask.astype(np.int64)})[0]

    def logits(self, decoder_input_ids: np.ndarray, hidden: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """[rows, decoder tokens, vocab]: the decoder over all of `decoder_input_ids` (no cache)."""
        return self.decoder.run(None, {"decoder_input_ids": decoder_input_ids.astype(np.int64),
                                       "encoder_hidden_states": hidden,
                                       "encoder_attention_mask": attention_mask.astype(np.int64)})[0]

    # ---- settings --------------------------------------------------------------------------------------
    def _settings(self, overrides: dict[str, Any]) -> dict[str, Any]:
        g = {**self.gen, **{k: v for k, v in overrides.items() if v is not None}}
        for k, neutral in _UNSUPPORTED.items():
            if g.get(k) not in (None, neutral, [], {}):
                raise NotImplementedError(f"OrtSeq2Seq does not implement {k}={g[k]!r}")
        eos = _ids(g.get("eos_token_id"))
        start = g.get("decoder_start_token_id")
        if start is None:
            start = g.get("bos_token_id")
        # transformers: max_new_tokens counts after the decoder's one start token, else max_length (20)
        max_length = 1 + int(g["max_new_tokens"]) if g.get("max_new_tokens") is not None else int(g.get("max_length") or 20)
        return {"eos": eos, "start": int(start), "pad": g.get("pad_token_id"), "max_length": max_length,
                "num_beams": int(g.get("num_beams") or 1), "min_length": int(g.get("min_length") or 0),
                "forced_bos": g.get("forced_bos_token_id"), "forced_eos": _ids(g.get("forced_eos_token_id")),
                "suppress": _ids(g.get("suppress_tokens")), "length_penalty": float(_or(g.get("length_penalty"), 1.0)),
                "early_stopping": _or(g.get("early_stopping"), False)}

    @staticmethod
    def _process(scores: np.ndarray, cur_len: int, s: dict[str, Any]) -> np.ndarray:
        """The logits processors, in transformers' order, at a decoder length of `cur_len`."""
        if s["min_length"] > 0 and cur_len < s["min_length"] and s["eos"]:
            scores[:, s["eos"]] = -np.inf
        if s["forced_bos"] is not None and cur_len == 1:
            scores[:] = -np.inf
            scores[:, int(s["forced_bos"])] = 0.0
        if s["forced_eos"] and cur_len == s["max_length"] - 1:
            scores[:] = -np.inf
            scores[:, s["forced_eos"]] = 0.0
        if s["suppress"]:
            scores[:, s["suppress"]] = -np.inf
        return scores

    # ---- decoding --------------------------------------------------------------------------------------
    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None,
                 token_type_ids: np.ndarray | None = None, **overrides: Any) -> np.ndarray:
        """Token ids [batch, length], the decoder start token first, as transformers' ``generate`` returns.
        `overrides`: generation settings for this call; `token_type_ids` (a BERT tokenizer's) is ignored."""
        input_ids = np.asarray(input_ids, dtype=np.int64)
        mask = np.ones_like(input_ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        s = self._settings(overrides)
        hidden = self.encode(input_ids, mask)
        if s["num_beams"] == 1:
            return self._greedy(hidden, mask, s)
        return self._beam(hidden, mask, s)

    def _greedy(self, hidden: np.ndarray, mask: np.ndarray, s: dict[str, Any]) -> np.ndarray:
        b = hidden.shape[0]
        seqs = np.full((b, 1), s["start"], dtype=np.int64)
        alive = np.ones(b, dtype=bool)
        pad = s["pad"] if s["pad"] is not None else (s["eos"][0] if s["eos"] else 0)
        while seqs.shape[1] < s["max_length"]:
            scores = self._process(self.logits(seqs, hidden, mask)[:, -1].astype(np.float32), seqs.shape[1], s)
            nxt = np.where(alive, scores.argmax(-1), pad)
            seqs = np.concatenate([seqs, nxt[:, None]], 1)
            alive &= ~np.isin(nxt, s["eos"])
            if not alive.any():
                break
        return seqs

    def _beam(self, hidden: np.ndarray, mask: np.ndarray, s: dict[str, Any]) -> np.ndarray:
        nb, L, lp, early = s["num_beams"], s["max_length"], s["length_penalty"], s["early_stopping"]
        b = hidden.shape[0]
        keep = max(2, 1 + len(s["eos"])) * nb  # candidates per step: enough that nb survive the EOS ones
        hidden, mask = np.repeat(hidden, nb, 0), np.repeat(mask, nb, 0)
        # transformers fills unused positions with pad_token_id, or with EOS when pad is unset or 0
        fill = s["pad"] if s["pad"] else (s["eos"][0] if s["eos"] else -1)
        running = np.full((b, nb, L), fill, dtype=np.int64)
        running[:, :, 0] = s["start"]
        run_scores = np.zeros((b, nb), dtype=np.float32)
        run_scores[:, 1:] = _NEG  # all beams start equal: only the first may spread
        done = running.copy()
        done_scores = np.full((b, nb), _NEG, dtype=np.float32)
        done_gen = np.zeros((b, nb), dtype=np.int64)  # generated tokens of each finished hypothesis
        finished = np.zeros((b, nb), dtype=bool)
        improvable = np.ones(b, dtype=bool)
        rows = np.arange(b)[:, None]
        cur = 1
        while True:
            logits = self.logits(running[:, :, :cur].reshape(b * nb, cur), hidden, mask)[:, -1].astype(np.float32)
            logp = logits - logits.max(-1, keepdims=True)
            logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
            logp = self._process(logp, cur, s).reshape(b, nb, -1) + run_scores[:, :, None]
            v = logp.shape[-1]
            flat = logp.reshape(b, nb * v)
            top = np.argsort(-flat, axis=1, kind="stable")[:, :keep]
            top_scores = np.take_along_axis(flat, top, 1)
            beam, tok = top // v, top % v
            cand = running[rows, beam].copy()  # [b, keep, L]
            cand[:, :, cur] = tok
            hits = np.isin(tok, s["eos"]) | (cur + 1 >= L)
            # the next running beams: the best candidates that did not stop
            alive = top_scores + hits.astype(np.float32) * _NEG
            nxt = np.argsort(-alive, axis=1, kind="stable")[:, :nb]
            running = cand[rows, nxt]
            run_scores = np.take_along_axis(alive, nxt, 1)
            # finished hypotheses: those among the first nb candidates that stopped, length-normalised
            just = hits & (np.arange(keep) < nb)[None, :]
            norm = top_scores / np.float32(float(cur) ** lp)
            norm = norm + (finished.all(1, keepdims=True) & (early is True)).astype(np.float32) * _NEG
            norm = norm + (~improvable)[:, None].astype(np.float32) * _NEG
            norm = norm + (~just).astype(np.float32) * _NEG
            m_seq = np.concatenate([done, cand], 1)
            m_scores = np.concatenate([done_scores, norm], 1)
            m_gen = np.concatenate([done_gen, np.full((b, keep), cur, dtype=np.int64)], 1)
            m_fin = np.concatenate([finished, just], 1)
            pick = np.argsort(-m_scores, axis=1, kind="stable")[:, :nb]
            done, done_scores = m_seq[rows, pick], np.take_along_axis(m_scores, pick, 1)
            done_gen, finished = np.take_along_axis(m_gen, pick, 1), np.take_along_axis(m_fin, pick, 1)
            cur += 1
            # can a running beam still beat the worst finished one? (no length penalty heuristics beyond
            # transformers' default: the current length, or max_length for early_stopping="never" with lp > 0)
            best_len = (L - 1) if (early == "never" and lp > 0.0) else (cur - 1)
            best_running = run_scores[:, 0] / np.float32(float(best_len) ** lp)
            worst = np.where(finished, done_scores.min(1, keepdims=True), _NEG)
            improvable &= (best_running[:, None] > worst).any(1)
            if not (improvable.any() and not (finished.all() and early is True) and not hits.all()):
                break
        out_len = 1 + int(done_gen[:, 0].max())
        return done[:, 0, :out_len]
