"""FlashMLA's dense-decode test cases, run through mlaserve.flash_mla as a framework would
after changing its import: on torch tensors (Debian's CPU torch), bf16 q and cache, int32
seqlens and block table, both of FlashMLA's metadata APIs.

FlashMLA's tests (tests/test_flash_mla.py of 2025 and today's dense-decoding test) sweep batch
size, context length, h_q, h_kv, s_q, variable lengths, zero-length rows and the causal mask,
fill the cache with randn / 10 and the slots past each sequence with NaN, and compare with a
float reference under their own tolerances. Here the same sweeps, in our own code and scaled to
a 2-core machine (b = 4 instead of 128, contexts of hundreds of tokens instead of 4k-16k),
against an fp64 reference, with FlashMLA's tolerances:
  out: every element within abs 8e-4 or rel 2.01/128 of the reference, cosine diff < 5e-6;
  lse: every element within abs 1e-6 or rel 8.01/65536.
"""

import itertools
import math

import numpy as np
import torch

from harness import close
from mlaserve import flash_mla

OUT_TOLERANCE = (8e-4, 2.01 / 128, 5e-6)
LSE_TOLERANCE = (1e-6, 8.01 / 65536, None)
PAGE = 64


def reference(q, blocks, block_table, seqlens, scale, causal):
    """fp64 attention with FlashMLA's conventions: q [b, s_q, h_q, 576] over the paged cache
    [blocks, page, h_kv, 576] (query heads [k g, (k+1) g) read KV head k); out
    [b, s_q, h_q, 512] and lse [b, h_q, s_q], out 0 and lse +inf for a row without keys."""
    b, s_q, h_q, _ = q.shape
    page, h_kv = blocks.shape[1], blocks.shape[2]
    group = h_q // h_kv
    out = np.zeros((b, s_q, h_q, 512))
    lse = np.full((b, h_q, s_q), np.inf)
    for i in range(b):
        length = int(seqlens[i])
        rows = blocks[block_table[i, :(length + page - 1) // page]].reshape(-1, h_kv, 576)[:length]
        for k in range(h_kv):
            kv = rows[:, k, :].astype(np.float64)
            heads = slice(k * group, (k + 1) * group)
            for s in range(s_q):
                visible = min(length, length - s_q + s + 1) if causal else length
                if visible <= 0:
                    continue
                scores = q[i, s, heads].astype(np.float64) @ kv[:visible].T * scale
                peak = scores.max(axis=1, keepdims=True)
                weights = np.exp(scores - peak)
                total = weights.sum(axis=1, keepdims=True)
                out[i, s, heads] = (weights / total) @ kv[:visible, :512]
                lse[i, heads, s] = (peak + np.log(total))[:, 0]
    return out, lse


def run_case(generator, b, s_q, mean_sk, h_q, h_kv, causal, varlen, zero_row, scale, api):
    seqlens = torch.full((b,), mean_sk, dtype=torch.int32)
    if varlen:
        lengths = torch.normal(float(mean_sk), mean_sk / 2, (b,), generator=generator)
        seqlens = torch.clamp(lengths, min=s_q).to(torch.int32)
    if zero_row:
        seqlens[0] = 0
    max_blocks = max(1, int(math.ceil(int(seqlens.max()) / PAGE)))
    block_table = torch.randperm(b * max_blocks, generator=generator,
                                 dtype=torch.int32).view(b, max_blocks)
    cache = torch.randn(b * max_blocks, PAGE, h_kv, 576, generator=generator) / 10
    for i in range(b):
        for j in range(max_blocks):
            valid = max(0, min(PAGE, int(seqlens[i]) - j * PAGE))
            cache[block_table[i, j], valid:] = float("nan")  # read one and the answer is NaN
    q = torch.randn(b, s_q, h_q, 576, generator=generator).to(torch.bfloat16)
    cache = cache.to(torch.bfloat16)
    if api == "2025":
        metadata, num_splits = flash_mla.get_mla_metadata(seqlens, s_q * h_q // h_kv, h_kv)
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache, block_table, seqlens, 512,
                                                    metadata, num_splits, softmax_scale=scale,
                                                    causal=causal)
    else:
        sched, _ = flash_mla.get_mla_metadata()
        out, lse = flash_mla.flash_mla_with_kvcache(q, cache, block_table, seqlens, 512, sched,
                                                    softmax_scale=scale, causal=causal)
    if not (isinstance(out, torch.Tensor) and out.dtype == torch.bfloat16
            and isinstance(lse, torch.Tensor) and lse.dtype == torch.float32):
        return [f"answers are {type(out).__name__} {getattr(out, 'dtype', '')}, "
                f"{type(lse).__name__} {getattr(lse, 'dtype', '')}; want torch bf16 and float32"]
    if tuple(out.shape) != (b, s_q, h_q, 512) or tuple(lse.shape) != (b, h_q, s_q):
        return [f"shapes out {tuple(out.shape)}, lse {tuple(lse.shape)}"]
    ref_out, ref_lse = reference(q.float().numpy(), cache.float().numpy(),
                                 block_table.numpy(), seqlens.numpy(),
                                 1 / math.sqrt(576) if scale is None else scale, causal)
    problems = []
    out_problem = close(out.float().numpy(), ref_out, OUT_TOLERANCE)
    if out_problem:
        problems.append(f"out: {out_problem}")
    lse_problem = close(lse.numpy(), ref_lse, LSE_TOLERANCE)
    if lse_problem:
        problems.append(f"lse: {lse_problem}")
    return problems


def cases():
    """(name, keyword arguments) for both sweeps."""
    # 2025: b 128, s_k 4096-16384, h_q 16-128, h_kv 1, s_q 1-2, varlen, causal; default scale.
    for mean_sk, h_q, s_q, varlen in itertools.product((200, 520), (16, 32, 64, 128), (1, 2),
                                                       (False, True)):
        yield (f"2025 s_k={mean_sk} h_q={h_q} s_q={s_q} varlen={varlen}",
               dict(b=4, s_q=s_q, mean_sk=mean_sk, h_q=h_q, h_kv=1, causal=True, varlen=varlen,
                    zero_row=False, scale=None, api="2025"))
    # Today's: h_q 64-128, s_q 1-2, causal or not, zero-length rows, the caller's scale.
    for h_q, s_q, causal, zero_row in itertools.product((64, 128), (1, 2), (False, True),
                                                        (False, True)):
        yield (f"current h_q={h_q} s_q={s_q} causal={causal} zero_row={zero_row}",
               dict(b=3, s_q=s_q, mean_sk=300, h_q=h_q, h_kv=1, causal=causal, varlen=True,
                    zero_row=zero_row, scale=1 / math.sqrt(192), api="current"))
    # Several KV heads (grouped queries).
    for h_kv, s_q in ((2, 2), (4, 1)):
        yield (f"h_kv={h_kv} h_q=32 s_q={s_q}",
               dict(b=2, s_q=s_q, mean_sk=150, h_q=32, h_kv=h_kv, causal=True, varlen=True,
                    zero_row=False, scale=None, api="current"))


def check_flash_mla_cases(target, seed, failures):
    flash_mla.configure(target=target)
    generator = torch.Generator().manual_seed(seed)
    count = 0
    for name, kwargs in cases():
        for problem in run_case(generator, **kwargs):
            failures.append(f"FlashMLA case {name}: {problem}")
        count += 1
    print(f"FlashMLA's dense-decode cases on torch {torch.__version__}: {count} run "
          f"(seed {seed})")
