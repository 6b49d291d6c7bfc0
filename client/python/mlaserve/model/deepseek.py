"""DeepSeek-V3's layers in PyTorch (the names of its checkpoints' tensors): MLA with low-rank
query and KV projections and decoupled RoPE with YaRN's scaling, RMSNorm, a dense SwiGLU FFN.
The attention itself is a back end's (attention.py): the model hands it, per layer, each
sequence's query in head space (q_nope, q_pe with RoPE) and the step's KV row (the normalised
latent c_kv and k_pe with RoPE), and takes back [heads, v_head_dim] per sequence."""

import math

import torch

from mlaserve.bfloat16 import float_to_bf16_bits
from mlaserve.model import safetensors


def _yarn_mscale(factor, mscale):
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_correction_dim(rotations, dim, base, max_positions):
    return dim * math.log(max_positions / (rotations * 2 * math.pi)) / (2 * math.log(base))


class YarnRotary:
    """DeepSeek-V3's rotary embedding with YaRN's frequency interpolation, on its
    interleaved-then-halved channel order (modeling_deepseek.py's apply_rotary_pos_emb)."""

    def __init__(self, config):
        dim, base, factor = config.qk_rope_head_dim, config.rope_theta, config.rope_factor
        exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
        extra = 1.0 / base ** exponents
        inter = 1.0 / (factor * base ** exponents)
        low = max(math.floor(_yarn_correction_dim(config.beta_fast, dim, base,
                                                  config.original_max_position_embeddings)), 0)
        high = min(math.ceil(_yarn_correction_dim(config.beta_slow, dim, base,
                                                  config.original_max_position_embeddings)),
                   dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        keep = 1.0 - ramp
        self.inv_freq = inter * (1 - keep) + extra * keep
        self.mscale = _yarn_mscale(factor, config.mscale) / _yarn_mscale(factor,
                                                                        config.mscale_all_dim)

    def __call__(self, x, positions):
        """x [batch, ..., dim] rotated at positions [batch]."""
        freqs = torch.outer(positions.to(torch.float64), self.inv_freq.to(positions.device))
        emb = torch.cat((freqs, freqs), dim=-1)
        shape = [x.shape[0]] + [1] * (x.dim() - 2) + [x.shape[-1]]
        cos = (emb.cos() * self.mscale).to(x.dtype).view(shape)
        sin = (emb.sin() * self.mscale).to(x.dtype).view(shape)
        d = x.shape[-1]
        x = x.reshape(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(*x.shape[:-1], d)
        half = torch.cat((-x[..., d // 2:], x[..., :d // 2]), dim=-1)
        return x * cos + half * sin


def _rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class DeepSeekModel:
    """The model's weights and its decode step. Weights are bf16 values held in float32 (the
    server's kv_b_proj is exactly the model's); the arithmetic is float32."""

    def __init__(self, config, seed=0, weights=None, device="cpu"):
        """Seeded weights (scaled so that greedy decoding stays varied), or `weights` from a
        checkpoint's safetensors file (the tensors this model names); computed on `device`
        (a torch device: "cpu", "cuda:0")."""
        self.config = config
        self.device = torch.device(device)
        self.rotary = YarnRotary(config)
        w = self._seeded(seed) if weights is None else self._loaded(weights)
        self.w = {n: t.to(self.device) for n, t in w.items()}

    def _names(self):
        c, names = self.config, {}
        names["model.embed_tokens.weight"] = (c.vocab_size, c.hidden_size)
        names["model.norm.weight"] = (c.hidden_size,)
        names["lm_head.weight"] = (c.vocab_size, c.hidden_size)
        for i in range(c.num_hidden_layers):
            p = f"model.layers.{i}."
            names[p + "input_layernorm.weight"] = (c.hidden_size,)
            names[p + "post_attention_layernorm.weight"] = (c.hidden_size,)
            names[p + "self_attn.q_a_proj.weight"] = (c.q_lora_rank, c.hidden_size)
            names[p + "self_attn.q_a_layernorm.weight"] = (c.q_lora_rank,)
            names[p + "self_attn.q_b_proj.weight"] = (c.num_attention_heads * c.qk_head_dim,
                                                      c.q_lora_rank)
            names[p + "self_attn.kv_a_proj_with_mqa.weight"] = (c.kv_row_width, c.hidden_size)
            names[p + "self_attn.kv_a_layernorm.weight"] = (c.kv_lora_rank,)
            names[p + "self_attn.kv_b_proj.weight"] = (
                c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)
            names[p + "self_attn.o_proj.weight"] = (c.hidden_size,
                                                    c.num_attention_heads * c.v_head_dim)
            if not c.is_moe_layer(i):
                names.update(_mlp_names(p + "mlp.", c.hidden_size, c.intermediate_size))
                continue
            names[p + "mlp.gate.weight"] = (c.n_routed_experts, c.hidden_size)
            names[p + "mlp.gate.e_score_correction_bias"] = (c.n_routed_experts,)
            for e in range(c.n_routed_experts):
                names.update(_mlp_names(f"{p}mlp.experts.{e}.", c.hidden_size,
                                        c.moe_intermediate_size))
            names.update(_mlp_names(p + "mlp.shared_experts.", c.hidden_size,
                                    c.moe_intermediate_size * c.n_shared_experts))
        return names

    def _seeded(self, seed):
        generator = torch.Generator().manual_seed(seed)
        w = {}
        for name, shape in self._names().items():
            if name.endswith("norm.weight"):
                tensor = torch.ones(shape)
            elif name.endswith("e_score_correction_bias"):
                tensor = 0.1 * torch.randn(shape, generator=generator)
            elif name == "model.embed_tokens.weight":
                tensor = torch.randn(shape, generator=generator)
            else:
                # 1/sqrt(fan in) keeps every projection's output at its input's scale; the LM
                # head a little wider, so that logits separate tokens (greedy output varies).
                gain = 3.0 if name == "lm_head.weight" else 1.0
                tensor = torch.randn(shape, generator=generator) * gain / math.sqrt(shape[1])
            w[name] = bf16_values(tensor)
        return w

    def _loaded(self, path):
        tensors = safetensors.load(path)
        missing = [n for n in self._names() if n not in tensors]
        if missing:
            raise KeyError(f"{path}: no {missing[0]} (and {len(missing) - 1} more)")
        return {n: bf16_values(torch.from_numpy(tensors[n])) for n in self._names()}

    def save_weights(self, path, server_only=False):
        """Every tensor as BF16 in one safetensors file: the model's checkpoint and the
        server's --weights (it reads the kv_b_proj tensors; server_only: those alone)."""
        safetensors.save(path, {n: ("BF16", float_to_bf16_bits(t.cpu().numpy()))
                                for n, t in self.w.items()
                                if not server_only or n.endswith("kv_b_proj.weight")})

    def kv_b_proj(self, layer):
        """[heads, nope + v, latent]: W_UK rows first, then W_UV's, per head."""
        c = self.config
        return self.w[f"model.layers.{layer}.self_attn.kv_b_proj.weight"].view(
            c.num_attention_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)

    def step(self, tokens, positions, attention):
        """Logits [batch, vocab] for one token of each sequence at `positions`, the KV of
        every layer appended through `attention` (attend(layer, q_nope, q_pe, rows,
        positions) -> [batch, heads, v_head_dim])."""
        positions = [int(p) for p in positions]
        x, at = self.embed(tokens, positions)
        for i in range(self.config.num_hidden_layers):
            q_nope, q_pe, rows = self.attention_inputs(i, x, at)
            x = self.finish_layer(i, x, attention.attend(i, q_nope, q_pe, rows, positions))
        return self.logits(x)

    # A step's stages, which a micro-batched decode loop interleaves (generate_micro_batched).

    def embed(self, tokens, positions):
        """The residual stream [batch, hidden] of `tokens`, and `positions` as a tensor on the
        model's device (the attention back ends take them as host ints)."""
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.device)
        positions = torch.as_tensor(positions, dtype=torch.long, device=self.device)
        return self.w["model.embed_tokens.weight"][tokens], positions

    def attention_inputs(self, layer, x, positions):
        """What layer `layer`'s attention takes: q_nope [batch, heads, nope], q_pe [batch,
        heads, rope] (RoPE applied) and the step's KV row [batch, latent + rope]."""
        c, w, p = self.config, self.w, f"model.layers.{layer}."
        batch, heads = x.shape[0], c.num_attention_heads
        h = _rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
        q = _rms_norm(h @ w[p + "self_attn.q_a_proj.weight"].T,
                      w[p + "self_attn.q_a_layernorm.weight"], c.rms_norm_eps)
        q = (q @ w[p + "self_attn.q_b_proj.weight"].T).view(batch, heads, c.qk_head_dim)
        q_nope, q_pe = q[..., :c.qk_nope_head_dim], q[..., c.qk_nope_head_dim:]
        kv = h @ w[p + "self_attn.kv_a_proj_with_mqa.weight"].T
        c_kv = _rms_norm(kv[:, :c.kv_lora_rank], w[p + "self_attn.kv_a_layernorm.weight"],
                         c.rms_norm_eps)
        k_pe = self.rotary(kv[:, c.kv_lora_rank:], positions)
        return q_nope, self.rotary(q_pe, positions), torch.cat((c_kv, k_pe), dim=-1)

    def finish_layer(self, layer, x, attention_out):
        """The residual stream after layer `layer`: o_proj of the attention's output
        [batch, heads, v_head_dim], then the FFN."""
        c, w, p = self.config, self.w, f"model.layers.{layer}."
        x = x + attention_out.reshape(x.shape[0], -1) @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        return x + self.ffn(layer, h)

    def ffn(self, layer, h):
        """Layer `layer`'s FFN on the normed stream h [tokens, hidden]: a dense SwiGLU MLP,
        or (config.is_moe_layer) the shared experts plus each token's routed experts."""
        if not self.config.is_moe_layer(layer):
            return self._mlp(f"model.layers.{layer}.mlp.", h)
        return self._moe(layer, h)

    def _mlp(self, prefix, h):
        """A SwiGLU MLP: down(silu(gate h) * up h)."""
        w = self.w
        gate = torch.nn.functional.silu(h @ w[prefix + "gate_proj.weight"].T)
        return (gate * (h @ w[prefix + "up_proj.weight"].T)) @ w[prefix + "down_proj.weight"].T

    def route(self, layer, h):
        """DeepSeek-V3's router (modeling_deepseek.py's MoEGate, "noaux_tc"): sigmoid scores;
        for the choice each gets its correction bias, each group of experts is ranked by the
        sum of its two best, the topk_group best groups stay, and the num_experts_per_tok best
        experts in them are chosen; their weights are the unbiased scores, normalised to sum
        1 and times routed_scaling_factor. Returns (experts [tokens, k], weights [tokens, k])."""
        c, p = self.config, f"model.layers.{layer}.mlp.gate."
        tokens = h.shape[0]
        scores = torch.sigmoid(h @ self.w[p + "weight"].T)
        choice = scores + self.w[p + "e_score_correction_bias"]
        groups = choice.view(tokens, c.n_group, -1).topk(2, dim=-1).values.sum(dim=-1)
        kept = torch.zeros_like(groups).scatter_(1, groups.topk(c.topk_group, dim=-1).indices,
                                                 1.0)
        kept = kept.bool().repeat_interleave(c.n_routed_experts // c.n_group, dim=1)
        experts = choice.masked_fill(~kept, 0.0).topk(c.num_experts_per_tok, dim=-1).indices
        weights = scores.gather(1, experts)
        if c.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return experts, weights * c.routed_scaling_factor

    def _moe(self, layer, h):
        """The shared experts on every token plus each token's routed experts, weighted."""
        p = f"model.layers.{layer}.mlp."
        experts, weights = self.route(layer, h)
        out = self._mlp(p + "shared_experts.", h)
        for e in experts.unique().tolist():
            token, slot = (experts == e).nonzero(as_tuple=True)
            routed = self._mlp(f"{p}experts.{e}.", h[token]) * weights[token, slot, None]
            out = out.index_add(0, token, routed)
        return out

    def logits(self, x):
        """[batch, vocab] from the residual stream after the last layer."""
        x = _rms_norm(x, self.w["model.norm.weight"], self.config.rms_norm_eps)
        return x @ self.w["lm_head.weight"].T

def _mlp_names(prefix, hidden, intermediate):
    return {prefix + "gate_proj.weight": (intermediate, hidden),
            prefix + "up_proj.weight": (intermediate, hidden),
            prefix + "down_proj.weight": (hidden, intermediate)}


def bf16_values(tensor):
    """tensor's values rounded to bf16 (to nearest even, as float_to_bf16_bits), held in
    float32."""
    return tensor.detach().to(torch.float32).to(torch.bfloat16).to(torch.float32)
