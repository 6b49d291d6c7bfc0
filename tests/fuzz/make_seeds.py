#!/usr/bin/python3
"""Writes the fuzzers' seed corpus (tests/fuzz/corpus/<harness>/): one valid message of each
kind the harness takes, against the fuzz engine's fixture (tests/fuzz/fuzz_engine.h: 4
heads, dn 32, dl 64, dr 16, 2 layers, prefix "p", bf16 sequence "s" of 32 tokens, FP8
sequence "f" of 30). The fuzzers mutate these; the device profiles and the example flag file are further seeds that
scripts/fuzz.sh passes from where they live.

    PYTHONPATH=build/python /usr/bin/python3 tests/fuzz/make_seeds.py
"""

import json
import os
import struct

import numpy as np

import mlaserve
from mlaserve import fp8
from mlaserve.v1 import admin_pb2, data_plane_pb2, decode_pb2, kv_cache_pb2, tensor_pb2

HEADS, LAYERS, DN, DL, DR = 4, 2, 32, 64, 16
WIDTH = DL + DR
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(harness, name, data):
    os.makedirs(os.path.join(ROOT, harness), exist_ok=True)
    with open(os.path.join(ROOT, harness, name), "wb") as f:
        f.write(data)


def bf16(shape, rng):
    return mlaserve.float_to_bf16_bits(rng.standard_normal(shape) * 0.5)


def shm_region(request):
    """A registered region (common/shm_layout.h) of one slot whose call is `request`, a
    packed latent call, with its tensor moved into the region: what a client publishes."""
    size, data = 65536, 256 + 128
    region = bytearray(size)
    struct.pack_into("<8sIIQQQ", region, 0, b"MLASHM1\0", 1, 1, size, 256, data)
    latent = request.packed.latent
    q_at, out_at, lse_at, answer_at, call_at = 1024, 8192, 16384, 24576, 32768
    region[q_at:q_at + len(latent.data)] = latent.data
    call = data_plane_pb2.DataPlaneCall(request=request, timeout_us=5000000)
    call.request.packed.latent.data = b""
    call.request.packed.latent.region_offset = q_at
    rows = 2 * 1 * HEADS
    call.out_offset, call.out_bytes = out_at, rows * DL * 4
    call.lse_offset, call.lse_bytes = lse_at, rows * 4
    descriptor = call.SerializeToString()
    region[call_at:call_at + len(descriptor)] = descriptor
    # slot 0: state submitted, call_bytes, call_offset, answer_offset, answer_capacity
    struct.pack_into("<IIIIQQQ", region, 256, 1, 0, 0, len(descriptor), call_at, answer_at, 4096)
    return bytes(region)


def main():
    rng = np.random.default_rng(1)
    latent = mlaserve.latent_query("s", 1, bf16((1, HEADS, WIDTH), rng))
    head = mlaserve.head_query("f", 0, bf16((2, HEADS, DN), rng), bf16((2, HEADS, DR), rng))
    appending = mlaserve.latent_query("s", 0, bf16((1, HEADS, WIDTH), rng),
                                      append_rows=bf16((1, WIDTH), rng), append_position=32)
    fp32 = mlaserve.latent_query("f", 1, rng.standard_normal((1, HEADS, WIDTH)).astype(np.float32))
    for i, queries in enumerate(([latent], [head, fp32], [appending])):
        request = decode_pb2.DecodeRequest(queries=queries, output_dtype=tensor_pb2.DTYPE_FP32
                                           if i == 1 else tensor_pb2.DTYPE_BF16)
        write("decode_fuzzer", f"seed-{i}", request.SerializeToString())
        stream = decode_pb2.DecodeStreamRequest(request_id=i, request=request, timeout_us=5000000)
        write("decode_stream_fuzzer", f"seed-{i}", stream.SerializeToString())

    # FlashMLA-style calls (what mlaserve.flash_mla sends): a tensor-parallel rank's share of
    # the heads, in latent space (2 of the model's 4, s_q 2) and in head space (heads [2, 4)),
    # with the caller's softmax scale. Its own generator keeps the other seeds as they were.
    tp_rng = np.random.default_rng(2)
    tp_latent = mlaserve.latent_query("s", 0, bf16((2, 2, WIDTH), tp_rng))
    tp_head = mlaserve.head_query("s", 1, bf16((1, 2, DN), tp_rng), bf16((1, 2, DR), tp_rng))
    tp_head.head.first_head = 2
    request = decode_pb2.DecodeRequest(queries=[tp_latent, tp_head],
                                       softmax_scale=1 / np.sqrt(WIDTH))
    write("decode_fuzzer", "seed-3", request.SerializeToString())
    stream = decode_pb2.DecodeStreamRequest(request_id=3, request=request, timeout_us=5000000)
    write("decode_stream_fuzzer", "seed-3", stream.SerializeToString())

    # A query with zero rows in fp32: the input by which decode_stream_fuzzer once found a
    # null pointer handed to memcpy (tensor_codec.cc); kept so every run covers it.
    empty = mlaserve.latent_query("f", 0, np.zeros((0, HEADS, WIDTH), np.float32))
    request = decode_pb2.DecodeRequest(queries=[empty])
    write("decode_fuzzer", "seed-4", request.SerializeToString())
    stream = decode_pb2.DecodeStreamRequest(request_id=4, request=request, timeout_us=5000000)
    write("decode_stream_fuzzer", "seed-4", stream.SerializeToString())

    # The packed form: sequences "s" and "f" at layer 1 in latent space, and in head space
    # with each appending a row at its end. Its own generator keeps the other seeds as they were.
    packed_rng = np.random.default_rng(3)
    packed = decode_pb2.DecodeRequest()
    packed.packed.sequence_ids.extend(["s", "f"])
    packed.packed.layer = 1
    packed.packed.latent.CopyFrom(mlaserve.to_tensor(bf16((2, 1, HEADS, WIDTH), packed_rng)))
    packed.options.output_dtype = tensor_pb2.DTYPE_FP32
    write("decode_fuzzer", "seed-5", packed.SerializeToString())
    appending = decode_pb2.DecodeRequest()
    appending.packed.sequence_ids.extend(["s", "f"])
    appending.packed.head.q_nope.CopyFrom(mlaserve.to_tensor(bf16((2, 2, HEADS, DN), packed_rng)))
    appending.packed.head.q_pe.CopyFrom(mlaserve.to_tensor(bf16((2, 2, HEADS, DR), packed_rng)))
    appending.packed.append_rows.CopyFrom(mlaserve.to_tensor(bf16((2, 2, WIDTH), packed_rng)))
    appending.packed.append_positions.extend([32, 30])
    write("decode_fuzzer", "seed-6", appending.SerializeToString())
    stream = decode_pb2.DecodeStreamRequest(request_id=6, request=appending, timeout_us=5000000)
    write("decode_stream_fuzzer", "seed-6", stream.SerializeToString())
    write("shm_call_fuzzer", "seed-0", shm_region(packed))
    # A UCX call: the header's length, the header (the call id), the DataPlaneCall.
    ucx_call = data_plane_pb2.DataPlaneCall(request=packed, timeout_us=5000000, call_id=7)
    write("ucx_call_fuzzer", "seed-0",
          bytes([8]) + struct.pack("<Q", 7) + ucx_call.SerializeToString())

    prefix = kv_cache_pb2.RegisterPrefixRequest(
        prefix_id="q", parent_id="p",
        latent=mlaserve.to_tensor(bf16((LAYERS, 3, WIDTH), rng)))
    write("register_prefix_fuzzer", "seed-0", prefix.SerializeToString())
    root = kv_cache_pb2.RegisterPrefixRequest(
        prefix_id="r", latent=mlaserve.to_tensor(bf16((LAYERS, 2, WIDTH), rng)),
        kv_dtype=tensor_pb2.KV_DTYPE_FP8)
    write("register_prefix_fuzzer", "seed-1", root.SerializeToString())

    chunk = kv_cache_pb2.AppendKvChunk(sequence_id="s", layer=1, start_position=32,
                                       rows=mlaserve.to_tensor(bf16((2, WIDTH), rng)))
    write("append_kv_fuzzer", "seed-0", chunk.SerializeToString())
    records = fp8.quantize_rows(rng.standard_normal((2, WIDTH)).astype(np.float32), DL)
    fp8_chunk = kv_cache_pb2.AppendKvChunk(sequence_id="f", layer=0, start_position=30)
    fp8_chunk.fp8_rows.count = 2
    fp8_chunk.fp8_rows.data = bytes(records)
    write("append_kv_fuzzer", "seed-1", fp8_chunk.SerializeToString())

    # admin_fuzzer: a byte picking the RPC (0 ListPrefixes, 1 ListSequences, 2 GetStats), then
    # the request.
    admin = [b"\x00" + admin_pb2.ListPrefixesRequest(page_size=1).SerializeToString(),
             b"\x01" + admin_pb2.ListSequencesRequest(page_size=1,
                                                      prefix_id="p").SerializeToString(),
             b"\x01" + admin_pb2.ListSequencesRequest(page_token="f").SerializeToString(),
             b"\x02"]
    for i, seed in enumerate(admin):
        write("admin_fuzzer", f"seed-{i}", seed)

    header = json.dumps({"__metadata__": {"format": "pt"},
                         "x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                         "y": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}})
    header = header.encode() + b" " * (-len(header) % 8)
    body = struct.pack("<4f", 1, 2, 3, 4) + b"\x80\x3f" * 3
    write("safetensors_fuzzer", "seed-0", struct.pack("<Q", len(header)) + header + body)


if __name__ == "__main__":
    main()
