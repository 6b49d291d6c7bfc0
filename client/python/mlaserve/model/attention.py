"""The model's two attention back ends: local (PyTorch, the reference) and mlaserve (one
Decode call per layer and step for the whole batch: each sequence's KV row appended and its
query decoded in the same call). Both take and give what DeepSeekModel.step hands a layer."""

import time

import numpy as np
import torch

from mlaserve.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from mlaserve.client import head_query


def _bf16(tensor):
    """As the wire carries it: rounded to bf16 (on the tensor's device)."""
    rounded = bf16_bits_to_float(float_to_bf16_bits(tensor.detach().cpu().numpy()))
    return torch.from_numpy(rounded).to(tensor.device)


def _wire(tensor):
    """bf16 bit patterns of a tensor, for the wire."""
    return float_to_bf16_bits(tensor.detach().cpu().numpy())


class LocalAttention:
    """MLA decode attention in PyTorch, float32 over bf16-rounded queries and rows (what the
    server receives): scores q_nope W_UK c_kv + q_pe k_pe, softmax at the model's scale, the
    output W_UV (p c_kv), per head. Keeps every sequence's rows per layer."""

    def __init__(self, model):
        self.model = model
        self.rows = {}  # (layer, slot) -> [tokens, dl + dr]

    def start(self, sequences):
        self.slots = list(range(sequences))
        self.rows.clear()

    def attend(self, layer, q_nope, q_pe, rows, positions):
        c = self.model.config
        w = self.model.kv_b_proj(layer)
        w_uk, w_uv = w[:, :c.qk_nope_head_dim, :], w[:, c.qk_nope_head_dim:, :]
        q_nope, q_pe, rows = _bf16(q_nope), _bf16(q_pe), _bf16(rows)
        outs = []
        for b in range(rows.shape[0]):
            held = self.rows.get((layer, b))
            position = int(positions[b])
            held = rows[b:b + 1] if held is None else torch.cat((held[:position], rows[b:b + 1]))
            self.rows[(layer, b)] = held
            c_kv, k_pe = held[:, :c.kv_lora_rank], held[:, c.kv_lora_rank:]
            q_latent = torch.einsum("hn,hnl->hl", q_nope[b], w_uk)
            scores = (q_latent @ c_kv.T + q_pe[b] @ k_pe.T) * c.softmax_scale
            o_latent = torch.softmax(scores, dim=-1) @ c_kv
            outs.append(torch.einsum("hvl,hl->hv", w_uv, o_latent))
        return torch.stack(outs)

    def release(self):
        self.rows.clear()


class MlaServeAttention:
    """The same attention on an mlaserve server (its --weights are this model's): per layer and
    step one Decode call carrying every sequence's head-space query with the step's KV row
    appended first; answers in head space [heads, v_head_dim]."""

    def __init__(self, model, client, run_id="model"):
        self.model = model
        self.client = client
        self.run_id = run_id
        self.ids = []
        self.call_seconds = 0.0  # wall time inside Decode calls, since the last start

    def start(self, sequences):
        self.release()
        self.call_seconds = 0.0
        self.ids = [f"{self.run_id}/s{b}" for b in range(sequences)]
        for sequence_id in self.ids:
            self.client.create_sequence(sequence_id)

    def attend(self, layer, q_nope, q_pe, rows, positions):
        c = self.model.config
        q_nope, q_pe, rows = _wire(q_nope), _wire(q_pe), _wire(rows)
        positions = [int(p) for p in positions]
        queries = [head_query(sequence_id, layer, q_nope[b:b + 1], q_pe[b:b + 1],
                              append_rows=rows[b:b + 1], append_position=positions[b])
                   for b, sequence_id in enumerate(self.ids)]
        began = time.perf_counter()
        results = self.client.decode(queries, output_dtype="fp32",
                                     softmax_scale=c.softmax_scale)
        self.call_seconds += time.perf_counter() - began
        out = torch.from_numpy(np.stack([r.out[0] for r in results]).astype(np.float32))
        return out.to(self.model.device)

    def release(self):
        for sequence_id in self.ids:
            self.client.release_sequence(sequence_id)
        self.ids = []


class NoAttention:
    """Zeros for every layer's attention: the rest of the model's time alone (projections,
    FFN, LM head), for timing; its tokens mean nothing."""

    def __init__(self, model):
        self.model = model

    def start(self, sequences):
        pass

    def attend(self, layer, q_nope, q_pe, rows, positions):
        c = self.model.config
        return torch.zeros(q_nope.shape[0], c.num_attention_heads, c.v_head_dim,
                           device=q_nope.device)

    def release(self):
        pass
