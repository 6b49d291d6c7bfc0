"""The model's shape: DeepSeek-V3's config.json fields, at any size."""

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 129280
    hidden_size: int = 7168
    intermediate_size: int = 18432
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # YaRN (rope_scaling): DeepSeek-V3's.
    rope_factor: float = 40.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0
    # Mixture of experts (DeepSeekMoE as V3 routes it): layers from first_k_dense_replace on
    # run n_routed_experts experts (num_experts_per_tok chosen per token by sigmoid scores
    # within the topk_group best of n_group groups) beside n_shared_experts always run; 0
    # routed experts: every layer dense.
    n_routed_experts: int = 256
    n_shared_experts: int = 1
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 2048
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    first_k_dense_replace: int = 3

    @staticmethod
    def tiny(layers=2, vocab_size=512, hidden_size=256, intermediate_size=512, q_lora_rank=192,
             experts=0):
        """Few layers and narrow residual widths, DeepSeek-V3's attention widths (128 heads,
        latent 512, RoPE 64, head 128: what the server serves). Dense FFNs, or with `experts`
        (a multiple of 8) MoE layers after the first: V3's routing (8 groups, the best 4,
        min(8, experts / 4) experts a token, one shared expert) at a quarter of the FFN's
        width per expert."""
        if experts % 8:
            raise ValueError(f"experts={experts}: a multiple of 8 (DeepSeek-V3's 8 groups)")
        return ModelConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                           intermediate_size=intermediate_size, num_hidden_layers=layers,
                           q_lora_rank=q_lora_rank, n_routed_experts=experts,
                           num_experts_per_tok=min(8, max(1, experts // 4)),
                           moe_intermediate_size=max(1, intermediate_size // 4),
                           first_k_dense_replace=1 if experts else layers)

    def is_moe_layer(self, layer):
        return self.n_routed_experts > 0 and layer >= self.first_k_dense_replace

    @property
    def qk_head_dim(self):
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_row_width(self):
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self):
        """1/sqrt(qk_head_dim), times YaRN's mscale squared (docs/engine.md)."""
        scale = self.qk_head_dim ** -0.5
        if self.rope_factor > 1:
            m = 0.1 * self.mscale_all_dim * math.log(self.rope_factor) + 1.0
            scale *= m * m
        return scale
