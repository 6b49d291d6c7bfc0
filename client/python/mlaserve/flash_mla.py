"""FlashMLA's Python API, served by mlaserve: switch a framework by changing an import.

    # from flash_mla import get_mla_metadata, flash_mla_with_kvcache
    from mlaserve.flash_mla import get_mla_metadata, flash_mla_with_kvcache

The arguments, shapes and return values are FlashMLA's dense decode (the API vLLM and SGLang
call): q [b, s_q, h_q, 576], a paged k_cache [num_blocks, page_block_size, h_kv, 576] read
through block_table [b, max_blocks] and cache_seqlens [b]; it returns out [b, s_q, h_q, 512]
in q's dtype and lse [b, h_q, s_q] float32 (natural log; +inf for a row that saw no key).
torch tensors or numpy arrays are accepted (numpy: a uint16 array is bf16 bit patterns);
torch is imported only when given torch tensors.

How it runs: each call ships the cache rows that the batch reads to the server, as one
temporary sequence per batch row (create, append, decode in latent space, release). That
is a migration and testing path, not a fast one: a framework that keeps its KV cache in
mlaserve uses mlaserve.Client with sequences that persist across steps.

Semantics kept from FlashMLA, traps included:
* softmax_scale=None means 1/sqrt(576), FlashMLA's default, which is WRONG for DeepSeek-V3
  and Kimi K2 (their scale is 1/sqrt(192) times a YaRN factor; the server's model carries
  it, see Client.server_info().model.softmax_scale). Pass the model's scale, as vLLM and
  SGLang do. Whatever the scale, the server applies it in fp32 as it does its own (the
  request carries it), so q is rounded to bf16 once, as FlashMLA reads it.
* causal=True is the bottom-right aligned mask; with s_q == 1 it changes nothing.
* cache_seqlens[i] == 0 gives out 0 and lse +inf for that row (the engine's -inf
  converted).
* get_mla_metadata() takes today's FlashMLA form (no arguments: a FlashMLASchedMeta the
  first call fills) and the 2025 form (cache_seqlens and head counts).
* A batch is sent in as many Decode calls as the server's max batch and message limit need.
* head_dim_v must be 512; any h_q that h_kv divides (a tensor-parallel rank's 16 or 32
  heads, say; at most 1024 per KV head): latent queries need no weights, so the server's
  head count does not matter. Query heads [k g, (k + 1) g), g = h_q / h_kv, read KV head k,
  as in FlashMLA. FP8 caches, sparse indices and attention sinks are refused.
* The KV cache arrives in bf16 (fp16 or fp32 caches are rounded to bf16); the server holds
  it in bf16 or, with configure(kv_dtype="fp8"), in SnapMLA's FP8 form. is_fp8_kvcache
  means FlashMLA's own 656-byte FP8 cache, which is not served.

The server is the one named by MLASERVE_TARGET (default 127.0.0.1:50051) unless
configure() names another; queries use layer 0 of the served model unless configured.
"""

import math
import os
import threading
import uuid

import numpy as np

from mlaserve.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from mlaserve.client import Client, latent_query

HEAD_DIM_QK = 576
HEAD_DIM_V = 512

_lock = threading.Lock()
_settings = {"client": None, "layer": 0, "kv_dtype": None}


def configure(target=None, client=None, layer=0, kv_dtype=None, **tls):
    """Chooses the server (an address or a Client), the layer the queries run on, and how the
    server holds the cache rows each call ships: "bf16", "fp8" (SnapMLA's per-token FP8, the
    caller's bf16 cache quantised on the server) or None (the server's default). `tls`:
    Client's tls_ca, tls_cert, tls_key, tls_server_name for a server that speaks TLS, and
    token, the tenant's bearer token for a server with tenants."""
    with _lock:
        _settings["client"] = client if client is not None else (
            Client(target, **tls) if target is not None else None)
        _settings["layer"] = layer
        _settings["kv_dtype"] = kv_dtype


def _client():
    with _lock:
        if _settings["client"] is None:
            _settings["client"] = Client(os.environ.get("MLASERVE_TARGET", "127.0.0.1:50051"))
        return _settings["client"], _settings["layer"]


# --- torch / numpy ---------------------------------------------------------------------

def _is_torch(x):
    return type(x).__module__.split(".")[0] == "torch"


def _as_numpy(x):
    """A torch tensor or numpy array as numpy; torch bfloat16 becomes uint16 bit patterns."""
    if _is_torch(x):
        import torch
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.int16).numpy().view(np.uint16)
        return x.numpy()
    return np.asarray(x)


def _as_float(x):
    """float32 values of a numpy array (uint16 is bf16 bits)."""
    return bf16_bits_to_float(x) if x.dtype == np.uint16 else x.astype(np.float32)


def _like(values, reference):
    """float32 `values` in the dtype and array library of `reference` (FlashMLA returns out
    in q's dtype)."""
    if _is_torch(reference):
        import torch
        if reference.dtype == torch.bfloat16:
            bits = float_to_bf16_bits(values).view(np.int16)
            return torch.from_numpy(bits).view(torch.bfloat16).to(reference.device)
        return torch.from_numpy(values).to(dtype=reference.dtype, device=reference.device)
    reference = np.asarray(reference)
    if reference.dtype == np.uint16:
        return float_to_bf16_bits(values)
    return values.astype(reference.dtype)


def _same_library(values, reference):
    """numpy `values` as a torch tensor on `reference`'s device if that is a torch tensor."""
    if _is_torch(reference):
        import torch
        return torch.from_numpy(values).to(reference.device)
    return values


def _calls(work, query_bytes, max_batch, max_message_bytes):
    """Splits work items (batch row, first token, tokens, sequence) into Decode calls of at
    most max_batch queries whose q payload stays within half the server's message limit (the
    other half covers the answer's out and lse, fp32, and the framing): a large FlashMLA batch
    (b = 128, s_q = 2, h_q = 128) would otherwise exceed it and be refused whole."""
    budget = max(1, max_message_bytes // 2) if max_message_bytes > 0 else None
    calls, current, current_bytes = [], [], 0
    for item in work:
        size = item[2] * query_bytes
        full = len(current) >= max_batch or (
            budget is not None and current and current_bytes + size > budget)
        if full:
            calls.append(current)
            current, current_bytes = [], 0
        current.append(item)
        current_bytes += size
    if current:
        calls.append(current)
    return calls


# --- FlashMLA's API --------------------------------------------------------------------

class FlashMLASchedMeta:
    """What today's FlashMLA (2026) returns from get_mla_metadata(): an empty schedule that the
    first flash_mla_with_kvcache call fills and later calls may reuse only with the same
    shapes, which FlashMLA asserts and this checks (b, s_q, h_q, page size, causal)."""

    def __init__(self):
        self.shape = None

    def check(self, shape):
        if self.shape is None:
            self.shape = shape
        elif self.shape != shape:
            raise ValueError(f"this FlashMLASchedMeta was made for (b, s_q, h_q, page size, "
                             f"causal) = {self.shape}, not {shape}: call get_mla_metadata() "
                             f"again for a batch of another shape")


def get_mla_metadata(cache_seqlens=None, num_heads_per_head_k=None, num_heads_k=None,
                     num_heads_q=None, is_fp8_kvcache=False, topk=None, **_ignored):
    """FlashMLA's scheduling metadata, in either of its APIs.

    Today's (2026): get_mla_metadata() with no arguments (or any: they are ignored) returns
    (FlashMLASchedMeta(), None).

    The 2025 API, get_mla_metadata(cache_seqlens, num_heads_per_head_k, num_heads_k), returns
    (tile_scheduler_metadata int32 [1, 8], num_splits int32 [b + 1]). The server schedules
    its own batches, so there are no tiles to plan; the metadata keeps FlashMLA's types and
    records the batch size and head counts, which flash_mla_with_kvcache checks, as FlashMLA
    asserts its metadata matches the call. num_splits is one split per sequence (cumulative,
    as FlashMLA's).
    """
    if cache_seqlens is None or num_heads_per_head_k is None or num_heads_k is None:
        return FlashMLASchedMeta(), None
    if is_fp8_kvcache or topk is not None:
        raise NotImplementedError("mlaserve serves bf16 dense decode: no FP8 cache, no sparse topk")
    seqlens = _as_numpy(cache_seqlens)
    batch = int(seqlens.shape[0])
    metadata = np.zeros((1, 8), dtype=np.int32)
    metadata[0, :3] = (batch, num_heads_per_head_k, num_heads_k)
    num_splits = np.arange(batch + 1, dtype=np.int32)
    return (_same_library(metadata, cache_seqlens), _same_library(num_splits, cache_seqlens))


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                           tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                           causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    """FlashMLA's dense decode: returns (out [b, s_q, h_q, 512] in q's dtype,
    lse [b, h_q, s_q] float32)."""
    if is_fp8_kvcache or indices is not None or attn_sink is not None or (
            extra_k_cache is not None or extra_indices_in_kvcache is not None
            or topk_length is not None or extra_topk_length is not None):
        raise NotImplementedError(
            "mlaserve serves bf16 dense decode: FP8 caches, sparse indices, attention sinks "
            "and extra caches are not supported")
    if head_dim_v != HEAD_DIM_V:
        raise ValueError(f"head_dim_v must be {HEAD_DIM_V}, got {head_dim_v}")
    q_np = _as_numpy(q)
    cache = _as_numpy(k_cache)
    table = _as_numpy(block_table).astype(np.int64)
    seqlens = _as_numpy(cache_seqlens).astype(np.int64)
    if q_np.ndim != 4 or q_np.shape[3] != HEAD_DIM_QK:
        raise ValueError(f"q must be [b, s_q, h_q, {HEAD_DIM_QK}], got {list(q_np.shape)}")
    batch, s_q, h_q, _ = q_np.shape
    if cache.ndim != 4 or cache.shape[2] < 1 or cache.shape[3] != HEAD_DIM_QK:
        raise ValueError(f"k_cache must be [num_blocks, page_block_size, h_kv, {HEAD_DIM_QK}], "
                         f"got {list(cache.shape)}")
    h_kv = cache.shape[2]
    if h_q % h_kv != 0:
        raise ValueError(f"h_q = {h_q} is not a multiple of h_kv = {h_kv}")
    group = h_q // h_kv
    if table.ndim != 2 or table.shape[0] != batch or seqlens.shape != (batch,):
        raise ValueError("block_table must be [b, max_blocks] and cache_seqlens [b]")
    if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        tile_scheduler_metadata.check((batch, s_q, h_q, cache.shape[1], bool(causal)))
    else:
        metadata = _as_numpy(tile_scheduler_metadata)
        if metadata.shape != (1, 8) or int(metadata[0, 0]) != batch or (
                int(metadata[0, 1]) * int(metadata[0, 2]) != s_q * h_q):
            raise ValueError("tile_scheduler_metadata does not describe this batch "
                             "(call get_mla_metadata with this batch's seqlens and heads)")

    client, layer = _client()
    info = client.server_info()
    scale = 1.0 / math.sqrt(HEAD_DIM_QK) if softmax_scale is None else float(softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be positive and finite, got {softmax_scale}")
    q_wire = q_np if q_np.dtype == np.uint16 else _as_float(q_np)

    out = np.zeros((batch, s_q, h_q, HEAD_DIM_V), dtype=np.float32)
    lse = np.full((batch, s_q, h_q), np.inf, dtype=np.float32)
    page = cache.shape[1]
    tag = uuid.uuid4().hex
    created = []
    # Queries: (batch row, first token, tokens, sequence, KV head). Each KV head's rows are a
    # sequence of their own. Without the causal mask every token sees the whole cache: one
    # query per token, each on its own fork of the row's sequence (the server takes a
    # sequence layer once per call; forks copy no rows).
    work = []
    try:
        for b in range(batch):
            length = int(seqlens[b])
            if length == 0:
                continue  # nothing to attend to: out 0, lse +inf
            pages = table[b, :(length + page - 1) // page]
            for k in range(h_kv):
                rows = cache[pages, :, k, :].reshape(-1, HEAD_DIM_QK)[:length]
                if rows.dtype != np.uint16:
                    rows = float_to_bf16_bits(_as_float(rows))
                sequence_id = f"flash_mla/{tag}/{b}/{k}"
                client.create_sequence(sequence_id, kv_dtype=_settings["kv_dtype"])
                created.append(sequence_id)
                client.append_kv(sequence_id, layer, 0, rows)
                if causal or s_q == 1:
                    work.append((b, 0, s_q, sequence_id, k))
                    continue
                work.append((b, 0, 1, sequence_id, k))
                for s in range(1, s_q):
                    fork_id = f"{sequence_id}/token{s}"
                    client.fork_sequence(sequence_id, fork_id)
                    created.append(fork_id)
                    work.append((b, s, 1, fork_id, k))
        query_bytes = group * HEAD_DIM_QK * q_wire.dtype.itemsize
        for chunk in _calls(work, query_bytes, max(1, info.limits.max_batch),
                            int(info.limits.max_message_bytes)):
            results = client.decode(
                [latent_query(sequence_id, layer, q_wire[b, s:s + n, k * group:(k + 1) * group])
                 for b, s, n, sequence_id, k in chunk], output_dtype="fp32", softmax_scale=scale)
            for (b, s, n, _, k), result in zip(chunk, results):
                out[b, s:s + n, k * group:(k + 1) * group] = result.out
                lse[b, s:s + n, k * group:(k + 1) * group] = result.lse
    finally:
        for sequence_id in created:
            client.release_sequence(sequence_id)
    lse[np.isneginf(lse)] = np.inf  # FlashMLA's convention for a row that saw no key
    return _like(out, q), _same_library(np.ascontiguousarray(lse.transpose(0, 2, 1)),
                                        cache_seqlens)
