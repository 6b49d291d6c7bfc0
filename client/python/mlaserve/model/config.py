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

    @staticmethod
    def tiny(layers=2, vocab_size=512, hidden_size=256, intermediate_size=512, q_lora_rank=192):
        """Few layers and narrow residual widths, DeepSeek-V3's attention widths (128 heads,
        latent 512, RoPE 64, head 128: what the server serves)."""
        return ModelConfig(vocab_size=vocab_size, hidden_size=hidden_size,
                           intermediate_size=intermediate_size, num_hidden_layers=layers,
                           q_lora_rank=q_lora_rank)

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
