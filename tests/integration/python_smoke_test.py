#!/usr/bin/python3
"""Python smoke test: the mlaserve-server binary as a user starts it, the Python client's
example, the FlashMLA-compatible entry point against a numpy reference, the batch form of
Decode (batch_cases.py), the metrics endpoint, and a graceful stop on SIGTERM.

    /usr/bin/python3 tests/integration/python_smoke_test.py --server build/bin/mlaserve-server \
        --example client/python/examples/decode_example.py   (PYTHONPATH=build/python)
"""

import argparse
import importlib.util
import math
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc
import numpy as np

import mlaserve
from mlaserve import flash_mla

import batch_cases  # beside this script
import flash_mla_cases  # beside this script
from harness import close

SERVING = b"\x08\x01"  # grpc.health.v1.HealthCheckResponse{status: SERVING}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_serving(target, timeout):
    channel = grpc.insecure_channel(target)
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda x: x, response_deserializer=lambda x: x)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check(b"", timeout=1.0) == SERVING:
                return True
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    return False


def list_services_by_reflection(target):
    """grpc.reflection.v1alpha list_services, encoded by hand (Debian ships no reflection
    client): ServerReflectionRequest{list_services: ""} is field 7, empty."""
    channel = grpc.insecure_channel(target)
    info = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=lambda x: x, response_deserializer=lambda x: x)
    return b"".join(info(iter([b"\x3a\x00"]), timeout=5))


def flash_mla_reference(q, blocks, block_table, seqlens, scale, causal):
    """FlashMLA's test reference (tests/ref.py) in float64: out [b, s_q, h, 512] and
    lse [b, h, s_q], +inf and 0 for a query that sees no key."""
    b, s_q, h, _ = q.shape
    page = blocks.shape[1]
    out = np.zeros((b, s_q, h, 512))
    lse = np.full((b, h, s_q), np.inf)
    for i in range(b):
        length = int(seqlens[i])
        kv = blocks[block_table[i, :(length + page - 1) // page], :, 0, :].reshape(-1, 576)[:length]
        kv = kv.astype(np.float64)
        for s in range(s_q):
            visible = min(length, length - s_q + s + 1) if causal else length
            if visible <= 0:
                continue
            scores = q[i, s].astype(np.float64) @ kv[:visible].T * scale
            peak = scores.max(axis=1, keepdims=True)
            weights = np.exp(scores - peak)
            total = weights.sum(axis=1, keepdims=True)
            out[i, s] = (weights / total) @ kv[:visible, :512]
            lse[i, :, s] = (peak + np.log(total))[:, 0]
    return out, lse


def check_flash_mla(target, heads, model_scale, rng, failures):
    flash_mla.configure(target=target)
    b, s_q, page, blocks_total = 3, 2, 64, 12
    seqlens = np.array([0, 70, 130], dtype=np.int32)
    q_bits = mlaserve.float_to_bf16_bits(rng.standard_normal((b, s_q, heads, 576)) * 0.5)
    cache = rng.standard_normal((blocks_total, page, 1, 576)).astype(np.float32)
    block_table = rng.permutation(blocks_total)[:b * 3].reshape(b, 3).astype(np.int32)
    # Slots past a sequence's end hold NaN (FlashMLA's own test trick): reading one fails.
    for i in range(b):
        for j in range(3):
            first = j * page
            valid = max(0, min(page, int(seqlens[i]) - first))
            cache[block_table[i, j], valid:] = np.nan
    cache_bits = mlaserve.float_to_bf16_bits(cache)
    q = mlaserve.bf16_bits_to_float(q_bits)
    blocks = mlaserve.bf16_bits_to_float(cache_bits)

    metadata, num_splits = flash_mla.get_mla_metadata(seqlens, s_q * heads, 1)
    if metadata.shape != (1, 8) or metadata.dtype != np.int32 or list(num_splits) != [0, 1, 2, 3]:
        failures.append(f"get_mla_metadata returned {metadata}, {num_splits}")

    # The model's scale, as vLLM passes it, and FlashMLA's default, which the request carries
    # to the server like any other scale (applied in fp32; q rounded to bf16 once).
    # Tolerances: the outputs are bf16 (relative Frobenius error ~2e-3 from that rounding
    # alone); the LSEs are fp32 sums, and must also pass FlashMLA's own test tolerance.
    cases = [("causal, model scale", model_scale, True, 5e-3, 1e-5),
             ("non-causal, default 1/sqrt(576)", None, False, 5e-3, 1e-5)]
    for name, scale, causal, out_tol, lse_tol in cases:
        out, lse = flash_mla.flash_mla_with_kvcache(
            q_bits, cache_bits, block_table, seqlens, 512, metadata, num_splits,
            softmax_scale=scale, causal=causal)
        expected_scale = 1 / math.sqrt(576) if scale is None else scale
        ref_out, ref_lse = flash_mla_reference(q, blocks, block_table, seqlens, expected_scale, causal)
        if out.dtype != np.uint16 or out.shape != (b, s_q, heads, 512):
            failures.append(f"{name}: out is {out.dtype} {out.shape}")
            continue
        if lse.dtype != np.float32 or lse.shape != (b, heads, s_q):
            failures.append(f"{name}: lse is {lse.dtype} {lse.shape}")
            continue
        out_f = mlaserve.bf16_bits_to_float(out).astype(np.float64)
        if not np.array_equal(np.isinf(lse), np.isinf(ref_lse)) or not np.all(lse[0] == np.inf):
            failures.append(f"{name}: empty rows must have lse +inf")
        if np.any(out_f[0] != 0):
            failures.append(f"{name}: an empty sequence must give out 0")
        finite = np.isfinite(ref_lse)
        out_error = np.linalg.norm(out_f - ref_out) / np.linalg.norm(ref_out)
        lse_error = np.max(np.abs(lse[finite] - ref_lse[finite]) / np.maximum(1, np.abs(ref_lse[finite])))
        print(f"flash_mla {name}: out rel err {out_error:.2e}, lse rel err {lse_error:.2e}")
        if not out_error < out_tol or not lse_error < lse_tol:
            failures.append(f"{name}: out error {out_error:.2e}, lse error {lse_error:.2e}")
        lse_problem = close(lse, ref_lse, flash_mla_cases.LSE_TOLERANCE)
        if lse_problem:
            failures.append(f"{name}: LSE outside FlashMLA's tolerance: {lse_problem}")
        if scale is None and abs(expected_scale - model_scale) < 1e-6:
            failures.append("the default scale must differ from the model's (the trap)")

    # Today's FlashMLA API: get_mla_metadata() without arguments gives an empty schedule the
    # first call fills; the same answers as the 2025 API, and a batch of another shape refused.
    sched, splits = flash_mla.get_mla_metadata()
    if splits is not None or not isinstance(sched, flash_mla.FlashMLASchedMeta):
        failures.append(f"get_mla_metadata() returned {sched}, {splits}")
    old = flash_mla.flash_mla_with_kvcache(q_bits, cache_bits, block_table, seqlens, 512,
                                           metadata, num_splits, softmax_scale=model_scale,
                                           causal=True)
    new = flash_mla.flash_mla_with_kvcache(q_bits, cache_bits, block_table, seqlens, 512, sched,
                                           softmax_scale=model_scale, causal=True)
    if not (np.array_equal(old[0], new[0]) and np.array_equal(old[1], new[1])):
        failures.append("the 2026 metadata API answers differently from the 2025 one")
    try:
        flash_mla.flash_mla_with_kvcache(q_bits[:2], cache_bits, block_table[:2], seqlens[:2], 512,
                                         sched, softmax_scale=model_scale, causal=True)
        failures.append("a FlashMLASchedMeta was reused for a batch of another shape")
    except ValueError as e:
        if "FlashMLASchedMeta" not in str(e):
            failures.append(f"reuse for another shape: unclear error {e}")


def check_flash_mla_calls_fit_messages(failures):
    """A batch is split into Decode calls by the server's max batch and by bytes: half the
    message limit for the q payload, at least one query per call."""
    work = [(b, 0, 1, f"s{b}") for b in range(10)]
    cases = [((100, 4, 500), [2, 2, 2, 2, 2]),        # 250 bytes of q per call
             ((100, 4, 1 << 20), [4, 4, 2]),          # the max batch decides
             ((1000, 4, 500), [1] * 10),              # a query over the budget goes alone
             ((100, 4, 0), [4, 4, 2])]                # no limit known
    for (query_bytes, max_batch, limit), sizes in cases:
        calls = flash_mla._calls(work, query_bytes, max_batch, limit)
        if [len(c) for c in calls] != sizes or [w for c in calls for w in c] != work:
            failures.append(f"_calls({query_bytes}, {max_batch}, {limit}): "
                            f"{[len(c) for c in calls]}, want {sizes}")


def check_fp8(target, heads, model_scale, rng, failures):
    """The FP8 cache from Python: e4m3 rounding against a brute-force nearest code, rows
    quantised here equal to rows quantised by the server, and FlashMLA's entry point with the
    server holding its cache in FP8, within SnapMLA's bounds of the reference."""
    from mlaserve import fp8
    from mlaserve.v1 import tensor_pb2
    values = np.concatenate([rng.standard_normal(5000) * 10.0 ** rng.uniform(-4, 3, 5000),
                             [0.0, -0.0, 448.0, 500.0, -1e9, 2.0 ** -10, 3 * 2.0 ** -10]])
    codes = fp8.float_to_e4m3(values.astype(np.float32))
    table = fp8.e4m3_to_float(np.arange(256, dtype=np.uint8))
    for x, code in zip(values.astype(np.float32), codes):
        same_sign = np.array([(c & 0x80) == (0x80 if np.signbit(x) else 0) and np.isfinite(table[c])
                              for c in range(256)])
        distance = np.where(same_sign, np.abs(table.astype(np.float64) - min(abs(x), 448) *
                                              (-1 if np.signbit(x) else 1)), np.inf)
        best = np.flatnonzero(distance == distance.min())
        best = best[best % 2 == 0] if len(best) > 1 else best
        if code != best[0]:
            failures.append(f"e4m3({x}) = {code:#x}, nearest even is {best[0]:#x}")
            break

    client = mlaserve.Client(target)
    info = client.server_info()
    width = info.model.dl + info.model.dr
    rows = mlaserve.float_to_bf16_bits(rng.standard_normal((37, width)) * 0.1)
    client.create_sequence("py-fp8/server", kv_dtype="fp8")
    client.create_sequence("py-fp8/client", kv_dtype="fp8")
    client.append_kv("py-fp8/server", 0, 0, rows)
    client.append_kv_fp8("py-fp8/client", 0, 0, rows)
    if client.get_sequence("py-fp8/client").kv_dtype != tensor_pb2.KV_DTYPE_FP8:
        failures.append("an FP8 sequence does not say so")
    q = mlaserve.float_to_bf16_bits(rng.standard_normal((1, heads, width)) * 0.1)
    a, b = client.decode([mlaserve.latent_query("py-fp8/server", 0, q),
                          mlaserve.latent_query("py-fp8/client", 0, q)], output_dtype="fp32")
    if not np.array_equal(a.out, b.out) or not np.array_equal(a.lse, b.lse):
        failures.append("rows quantised in Python differ from rows quantised by the server")
    # A retry resends what it sent: the same rows are harmless, other rows are refused
    # ALREADY_EXISTS naming the token, and the answers stay those of the stored rows.
    client.append_kv("py-fp8/server", 0, 30, rows[30:])
    other = rows[30:].copy()
    other[2, 0] ^= 0x8000  # token 32's first value, sign flipped
    try:
        client.append_kv("py-fp8/server", 0, 30, other)
        failures.append("a retry with other rows was taken")
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.ALREADY_EXISTS or "token 32" not in error.details():
            failures.append(f"a retry with other rows: {error.code()} {error.details()}")
    again = client.decode([mlaserve.latent_query("py-fp8/server", 0, q)], output_dtype="fp32")[0]
    if not np.array_equal(a.out, again.out) or not np.array_equal(a.lse, again.lse):
        failures.append("a refused retry changed the stored rows")
    for sequence_id in ("py-fp8/server", "py-fp8/client"):
        client.release_sequence(sequence_id)

    flash_mla.configure(target=target, kv_dtype="fp8")
    try:
        batch, s_q, page, blocks_total = 2, 1, 64, 6
        seqlens = np.array([70, 130], dtype=np.int32)
        q_bits = mlaserve.float_to_bf16_bits(rng.standard_normal((batch, s_q, heads, 576)) * 0.1)
        cache_bits = mlaserve.float_to_bf16_bits(rng.standard_normal((blocks_total, page, 1, 576)) * 0.1)
        block_table = rng.permutation(blocks_total)[:batch * 3].reshape(batch, 3).astype(np.int32)
        metadata, num_splits = flash_mla.get_mla_metadata(seqlens, s_q * heads, 1)
        out, lse = flash_mla.flash_mla_with_kvcache(q_bits, cache_bits, block_table, seqlens, 512,
                                                    metadata, num_splits,
                                                    softmax_scale=model_scale, causal=True)
        ref_out, ref_lse = flash_mla_reference(mlaserve.bf16_bits_to_float(q_bits),
                                               mlaserve.bf16_bits_to_float(cache_bits),
                                               block_table, seqlens, model_scale, True)
        out_f = mlaserve.bf16_bits_to_float(out).astype(np.float64)
        rel_l2 = np.linalg.norm(out_f - ref_out) / np.linalg.norm(ref_out)
        lse_error = np.max(np.abs(lse - ref_lse))
        print(f"flash_mla on the FP8 cache: out rel_l2 {rel_l2:.2e}, lse max err {lse_error:.2e}")
        if not rel_l2 <= 5e-2 or not lse_error <= 2e-2:
            failures.append(f"flash_mla on the FP8 cache: rel_l2 {rel_l2:.2e}, lse {lse_error:.2e}")
    finally:
        flash_mla.configure(target=target)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--example", required=True)
    parser.add_argument("--devices", default="1",
                        help="the server's --devices (cuda:0 runs the drop-in on a GPU)")
    args = parser.parse_args()
    port, metrics_port = free_port(), free_port()
    target = f"127.0.0.1:{port}"
    failures = []
    with tempfile.TemporaryFile(mode="w+") as log:
        server = subprocess.Popen(
            [args.server, f"--listen={target}", f"--metrics-listen=127.0.0.1:{metrics_port}",
             "--layers=2", "--kv-budget=256MiB", f"--devices={args.devices}", "--page-size=64"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            if not wait_serving(target, timeout=120):
                failures.append("the server never became SERVING")
            else:
                spec = importlib.util.spec_from_file_location("decode_example", args.example)
                example = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(example)
                if example.main(["--target", target]) != 0:
                    failures.append("decode_example.py reported a mismatch")
                services = list_services_by_reflection(target)
                for service in (b"mlaserve.v1.MlaServe", b"grpc.health.v1.Health"):
                    if service not in services:
                        failures.append(f"reflection does not list {service.decode()}")
                info = mlaserve.Client(target).server_info()
                check_flash_mla(target, info.model.heads, info.model.softmax_scale,
                                np.random.default_rng(), failures)
                check_fp8(target, info.model.heads, info.model.softmax_scale,
                          np.random.default_rng(), failures)
                check_flash_mla_calls_fit_messages(failures)
                batch_cases.check_decode_batch(target, np.random.default_rng(), failures)
                batch_cases.check_batch_invariant(target, np.random.default_rng(), failures)
                # Fresh data every run; the seed is printed to replay a failure.
                flash_mla_cases.check_flash_mla_cases(
                    target, int(np.random.default_rng().integers(1 << 31)), failures)
                metrics = urllib.request.urlopen(
                    f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
                for name in ("mlaserve_requests_total", "mlaserve_kv_pages", "mlaserve_batch_queries"):
                    if name not in metrics:
                        failures.append(f"/metrics lacks {name}")
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                code = server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                code = "killed after 60 s"
        log.seek(0)
        output = log.read()
    if code != 0:
        failures.append(f"the server exited with {code} after SIGTERM")
    for event in ("starting:", "listening:", "ready:", "draining:", "stopped:"):
        if event not in output:
            failures.append(f"the server's log lacks its '{event}' line")
    if failures:
        print("server log:\n" + output)
        for failure in failures:
            print("FAILED:", failure)
        return 1
    print("python smoke test: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
