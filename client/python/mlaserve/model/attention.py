"""The model's attention back ends: local (PyTorch, the reference) and mlaserve (one Decode
call per layer and step for the whole batch: each sequence's KV row appended and its query
decoded in the same call). Each takes what DeepSeekModel.attention_inputs gives a layer and
answers [batch, heads, v_head_dim]; submit() starts a layer's attention and returns a
handle whose result() gives it, so a decode loop can run other micro-batches meanwhile."""

import time

import numpy as np
import torch

from mlaserve.model.deepseek import bf16_values


def _wire(tensor):
    """bf16 bit patterns of a tensor (uint16, on the host), for the wire: rounded on the
    tensor's device, so only half the bytes cross to the host."""
    bits = tensor.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy()
    return bits.view(np.uint16)


class _Ready:
    """A result already computed (the local back ends answer at once)."""

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class LocalAttention:
    """MLA decode attention in PyTorch, batched, float32 over bf16-rounded queries and rows
    (what the server receives): scores q_nope W_UK c_kv + q_pe k_pe, softmax at the model's
    scale, the output W_UV (p c_kv), per head. Every sequence's rows per layer are held in
    one [batch, capacity, latent + rope] tensor on the model's device."""

    def __init__(self, model):
        self.model = model
        self.cache = []     # per layer: [batch, capacity, latent + rope]
        self.lengths = []   # per sequence: rows held

    def start(self, sequences, prefix=None):
        """`prefix` [layers, tokens, latent + rope]: rows every sequence starts with."""
        c = self.model.config
        held = 0 if prefix is None else prefix.shape[1]
        self.cache = [torch.zeros(sequences, max(64, 2 * held), c.kv_row_width,
                                  device=self.model.device)
                      for _ in range(c.num_hidden_layers)]
        if prefix is not None:
            for layer, rows in enumerate(prefix):
                self.cache[layer][:, :held] = bf16_values(rows.to(self.model.device))
        self.lengths = [held] * sequences

    def submit(self, layer, q_nope, q_pe, rows, positions):
        return _Ready(self.attend(layer, q_nope, q_pe, rows, positions))

    def attend(self, layer, q_nope, q_pe, rows, positions):
        """`positions` (host ints): where each sequence's row goes; what lay at or beyond it
        is dropped, as the server's append does."""
        c = self.model.config
        end = max(positions) + 1
        cache = self._room(layer, end)
        batch = range(len(positions))
        cache[list(batch), list(positions)] = bf16_values(rows)
        for b in batch:
            self.lengths[b] = positions[b] + 1
        w = self.model.kv_b_proj(layer)
        w_uk, w_uv = w[:, :c.qk_nope_head_dim, :], w[:, c.qk_nope_head_dim:, :]
        c_kv, k_pe = cache[:, :end, :c.kv_lora_rank], cache[:, :end, c.kv_lora_rank:]
        q_latent = torch.einsum("bhn,hnl->bhl", bf16_values(q_nope), w_uk)
        scores = (q_latent @ c_kv.transpose(1, 2) +
                  bf16_values(q_pe) @ k_pe.transpose(1, 2)) * c.softmax_scale
        unseen = (torch.arange(end, device=cache.device)[None, :] >
                  torch.as_tensor(positions, device=cache.device)[:, None])
        scores = scores.masked_fill(unseen[:, None, :], float("-inf"))
        o_latent = torch.softmax(scores, dim=-1) @ c_kv
        return torch.einsum("bhl,hvl->bhv", o_latent, w_uv)

    def held_rows(self, sequence):
        """[layers, tokens, latent + rope]: what one sequence holds."""
        return torch.stack([cache[sequence, :self.lengths[sequence]] for cache in self.cache])

    def _room(self, layer, rows):
        cache = self.cache[layer]
        if cache.shape[1] < rows:
            grown = cache.new_zeros(cache.shape[0], max(rows, 2 * cache.shape[1]),
                                    cache.shape[2])
            grown[:, :cache.shape[1]] = cache
            self.cache[layer] = cache = grown
        return cache

    def release(self):
        self.cache, self.lengths = [], []


class MlaServeAttention:
    """The same attention on an mlaserve server (its --weights are this model's): per layer and
    step one Decode call carrying every sequence's head-space query with the step's KV row
    appended first; answers in head space [heads, v_head_dim]. submit() sends the call and
    returns at once (Client.decode_async)."""

    def __init__(self, model, client, run_id="model"):
        self.model = model
        self.client = client
        self.run_id = run_id
        self.ids = []
        self.prefix_id = ""
        self.reset_counters()

    def reset_counters(self):
        self.calls = 0
        self.call_seconds = 0.0    # from each call's sending to its answer's use
        self.wait_seconds = 0.0    # blocked on answers: the calls' part nothing else hid
        self.server_seconds = 0.0  # the server's queue, preparation and device time
        self.client_seconds = 0.0  # this thread's work on calls beside the wait: building and
        #                            sending the request once its tensors are on the host,
        #                            and the answers' conversion after it

    def start(self, sequences, prefix=None):
        """`prefix` [layers, tokens, latent + rope]: a shared prompt's rows, registered once as
        a prefix that every sequence is created on (TyphoonMLA's groups form on it)."""
        self.release()
        self.reset_counters()
        if prefix is not None:
            self.prefix_id = f"{self.run_id}/prefix"
            self.client.register_prefix(self.prefix_id, _wire(prefix))
        self.ids = [f"{self.run_id}/s{b}" for b in range(sequences)]
        for sequence_id in self.ids:
            self.client.create_sequence(sequence_id, prefix_id=self.prefix_id)

    def submit(self, layer, q_nope, q_pe, rows, positions):
        q_nope, q_pe, rows = _wire(q_nope), _wire(q_pe), _wire(rows)  # waits for them
        began = time.perf_counter()
        pending = self.client.decode_batch_async(
            self.ids, layer, q_nope=q_nope[:, None], q_pe=q_pe[:, None],
            append_rows=rows[:, None], append_positions=positions, output_dtype="fp32",
            softmax_scale=self.model.config.softmax_scale)
        self.client_seconds += time.perf_counter() - began
        return _PendingLayer(self, pending, began)

    def attend(self, layer, q_nope, q_pe, rows, positions):
        return self.submit(layer, q_nope, q_pe, rows, positions).result()

    def release(self):
        for sequence_id in self.ids:
            self.client.release_sequence(sequence_id)
        self.ids = []
        if self.prefix_id:
            self.client.release_prefix(self.prefix_id)
            self.prefix_id = ""


class _PendingLayer:
    def __init__(self, backend, pending, sent):
        self.backend, self.pending, self.sent = backend, pending, sent

    def result(self):
        waited = time.perf_counter()
        answer = self.pending.result()
        done = time.perf_counter()
        b = self.backend
        b.calls += 1
        b.wait_seconds += done - waited
        b.call_seconds += done - self.sent
        plan = answer.plans[0]
        b.server_seconds += 1e-6 * (plan.queue_us + plan.prepare_us + plan.device_host_us)
        out = torch.from_numpy(answer.out[:, 0]).to(b.model.device)
        b.client_seconds += time.perf_counter() - done
        return out


class NoAttention:
    """Zeros for every layer's attention: the rest of the model's time alone (projections,
    FFN, LM head), for timing; its tokens mean nothing."""

    def __init__(self, model):
        self.model = model

    def start(self, sequences, prefix=None):
        pass

    def submit(self, layer, q_nope, q_pe, rows, positions):
        return _Ready(self.attend(layer, q_nope, q_pe, rows, positions))

    def attend(self, layer, q_nope, q_pe, rows, positions):
        c = self.model.config
        return torch.zeros(q_nope.shape[0], c.num_attention_heads, c.v_head_dim,
                           device=q_nope.device)

    def release(self):
        pass
