"""A DeepSeek-V3-architecture model in PyTorch whose attention runs locally or on mlaserve
(docs/model.md): MLA with the query and KV low-rank projections, decoupled RoPE with YaRN's
scaling, RMSNorm, a dense SwiGLU FFN, embeddings and an LM head, at any size (the attention
widths are DeepSeek-V3's, as the server's), with seeded weights or a checkpoint's.

    import mlaserve.model as m
    config = m.ModelConfig.tiny(layers=2)
    model = m.DeepSeekModel(config, seed=0)
    model.save_weights("weights.safetensors")      # the server's --weights
    local = m.generate(model, m.LocalAttention(model), prompts, steps=32)
    served = m.generate(model, m.MlaServeAttention(model, mlaserve.Client(target)), prompts,
                        steps=32)
"""

from mlaserve.model.attention import LocalAttention, MlaServeAttention, NoAttention
from mlaserve.model.config import ModelConfig
from mlaserve.model.deepseek import DeepSeekModel
from mlaserve.model.generate import (compare_teacher_forced, generate, generate_micro_batched,
                                     prefix_rows)

__all__ = ["DeepSeekModel", "LocalAttention", "MlaServeAttention", "ModelConfig", "NoAttention",
           "compare_teacher_forced", "generate", "generate_micro_batched", "prefix_rows"]
