"""A DeepSeek-V3-architecture model generating through a real server (docs/model.md): the
tiny configuration (2 layers, DeepSeek-V3's attention widths, seeded weights written as the
server's --weights), 4 sequences x 24 steps, local attention (PyTorch) against mlaserve's
(one Decode call per layer and step, the step's KV row appended in it): on different
prompts, on prompts sharing all but their last token (the shared part registered once as a
prefix), in 2 and 3 micro-batches run as a ping-pong (calls in flight while another
micro-batch computes), and with MoE layers (DeepSeek-V3's router, checked token by token
against a plain loop). Teacher-forced logits within the stated tolerance at every step; the
argmax equal wherever the reference's top-2 margin exceeds 4x the tolerance; free-running
output identical up to the first near-tie at least; the output not degenerate. Also the
weights' round trip through safetensors, and Client.decode_async against decode.

    /usr/bin/python3 tests/integration/model_test.py --server build/bin/mlaserve-server
        (PYTHONPATH=build/python)
"""

import argparse
import math
import os
import shutil
import sys
import tempfile
import time

import grpc
import numpy as np
import torch

import mlaserve
import mlaserve.model as m
from harness import Server, free_port, report

TOLERANCE = 0.05  # on logits of standard deviation ~3: the wire's bf16 rounding (docs/model.md)
SEQUENCES, STEPS = 4, 24


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    args = parser.parse_args()
    began = time.time()
    failures = []
    scratch = tempfile.mkdtemp(prefix="mlaserve-model-test-")
    server = None

    def check(condition, message):
        if not condition:
            failures.append(message)

    try:
        config = m.ModelConfig.tiny(layers=2)
        model = m.DeepSeekModel(config, seed=1)
        weights = os.path.join(scratch, "weights.safetensors")
        model.save_weights(weights)
        again = m.DeepSeekModel(config, weights=weights)
        check(all(torch.equal(model.w[n], again.w[n]) for n in model.w),
              "the weights changed through safetensors")
        target = f"127.0.0.1:{free_port()}"
        server = Server(args.server, [f"--listen={target}", "--metrics_listen=",
                                      f"--layers={config.num_hidden_layers}", "--devices=1",
                                      f"--weights={weights}"])
        if not server.ready(60):
            raise RuntimeError("the server did not start: " + "".join(server.log[-20:]))
        client = mlaserve.Client(target)
        prompts = [[7 * b + 1, 3 * b + 2, b + 5, 11 * b + 3] for b in range(SEQUENCES)]
        shared = [[5, 9, 13, 2, 7, 3 * b + 1] for b in range(SEQUENCES)]
        for name, chosen, prefix in (("different prompts", prompts, False),
                                     ("a shared prompt", shared, True)):
            result = m.compare_teacher_forced(model, m.LocalAttention(model),
                                              m.MlaServeAttention(model, client), chosen, STEPS,
                                              TOLERANCE, shared_prefix=prefix)
            print(name, result)
            check_comparison(name, result, check)
        check_micro_batches(model, client, prompts, check)
        check_moe(model, client, prompts, check)
        check_decode_async(client, config, check)
        check(not list(client.list_sequences()), "the back ends left sequences on the server")
        check(not list(client.list_prefixes()), "the back ends left prefixes on the server")
    except Exception as error:  # noqa: BLE001 (reported, then everything is removed)
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return report(failures, began)


def check_comparison(name, result, check):
    check(result.max_logit_difference <= TOLERANCE,
          f"{name}: logits differ by {result.max_logit_difference} > {TOLERANCE}")
    check(result.argmax_mismatches == 0,
          f"{name}: {result.argmax_mismatches} argmax mismatches beyond 4x the tolerance's margin")
    for s in range(SEQUENCES):
        check(result.identical_until[s] >= result.first_near_tie[s],
              f"{name}, sequence {s}: free-running output differs at step "
              f"{result.identical_until[s]}, before its first near-tie "
              f"({result.first_near_tie[s]})")
        check(result.distinct_tokens[s] >= STEPS // 3,
              f"{name}, sequence {s}: {result.distinct_tokens[s]} distinct tokens of {STEPS}")


def check_micro_batches(model, client, prompts, check):
    """2 and 3 micro-batches in a ping-pong, teacher-forced on the local reference's tokens:
    every step's logits within the tolerance of the reference's, each back end's calls all
    answered (one per layer and step)."""
    free = m.generate(model, m.LocalAttention(model), prompts, STEPS)
    forced = [seq[len(prompts[0]):] for seq in free.tokens]
    ref = m.generate(model, m.LocalAttention(model), prompts, STEPS, forced=forced)
    for k in (2, 3):
        backends = []

        def make(i, backends=backends, k=k):
            backends.append(m.MlaServeAttention(model, client, run_id=f"mb{k}/{i}"))
            return backends[-1]
        run = m.generate_micro_batched(model, make, prompts, STEPS, k, forced=forced)
        worst = max(float((a - b).abs().max()) for a, b in zip(ref.logits, run.logits))
        print(f"{k} micro-batches: logits within {worst:.4f} of the reference")
        check(worst <= TOLERANCE, f"{k} micro-batches: logits differ by {worst} > {TOLERANCE}")
        layers = model.config.num_hidden_layers
        check(all(b.calls == run.steps * layers for b in backends),
              f"{k} micro-batches: calls {[b.calls for b in backends]}, not "
              f"{run.steps * layers} each")


def check_moe(dense, client, prompts, check):
    """MoE layers after the first (32 experts in 8 groups): the router and the layer against a
    token-by-token loop in float64 (sorting, not topk), then generation through the server
    (the attention weights the dense model's, which the server holds)."""
    config = m.ModelConfig.tiny(layers=2, experts=32)
    model = m.DeepSeekModel(config, seed=2)
    for name, tensor in dense.w.items():
        if "self_attn" in name:
            model.w[name] = tensor
    h = torch.randn(12, config.hidden_size, generator=torch.Generator().manual_seed(3))
    experts, weights = model.route(1, h)
    p = "model.layers.1.mlp."
    gate, bias = model.w[p + "gate.weight"].double(), model.w[p + "gate.e_score_correction_bias"]
    per_group = config.n_routed_experts // config.n_group
    for t in range(h.shape[0]):
        scores = [1 / (1 + math.exp(-float(h[t].double() @ gate[e])))
                  for e in range(config.n_routed_experts)]
        choice = [scores[e] + float(bias[e]) for e in range(config.n_routed_experts)]
        group_score = [sum(sorted(choice[g * per_group:(g + 1) * per_group])[-2:])
                       for g in range(config.n_group)]
        groups = sorted(range(config.n_group), key=lambda g: -group_score[g])[:config.topk_group]
        allowed = [e for g in groups for e in range(g * per_group, (g + 1) * per_group)]
        chosen = sorted(allowed, key=lambda e: -choice[e])[:config.num_experts_per_tok]
        total = sum(scores[e] for e in chosen)
        want = {e: scores[e] / total * config.routed_scaling_factor for e in chosen}
        got = dict(zip(experts[t].tolist(), weights[t].tolist()))
        check(set(got) == set(want), f"MoE token {t}: experts {sorted(got)} != {sorted(want)}")
        check(all(abs(got[e] - want[e]) < 1e-5 for e in want if e in got),
              f"MoE token {t}: weights {got} != {want}")
    def mlp(prefix, x):
        w = {n: model.w[prefix + n].double() for n in ("gate_proj.weight", "up_proj.weight",
                                                        "down_proj.weight")}
        g = x @ w["gate_proj.weight"].T
        return (g * torch.sigmoid(g) * (x @ w["up_proj.weight"].T)) @ w["down_proj.weight"].T
    out = model.ffn(1, h)
    for t in range(h.shape[0]):
        x = h[t].double()
        want = mlp(p + "shared_experts.", x) + sum(
            w * mlp(f"{p}experts.{e}.", x) for e, w in zip(experts[t].tolist(),
                                                           weights[t].tolist()))
        error = float((out[t].double() - want).abs().max() / want.abs().max())
        check(error < 1e-5, f"MoE token {t}: the layer's output is {error} off a per-token sum")
    result = m.compare_teacher_forced(model, m.LocalAttention(model),
                                      m.MlaServeAttention(model, client), prompts, STEPS,
                                      TOLERANCE)
    print("MoE", result)
    check_comparison("MoE", result, check)


def check_decode_async(client, config, check):
    """Two calls in flight at once answer what decode() answers, bit for bit; a call's
    error (an unknown sequence) comes from result() with its code; without a server the
    retries end within the deadline."""
    rng = np.random.default_rng()
    width = config.kv_row_width
    rows = mlaserve.float_to_bf16_bits(rng.standard_normal((40, width)).astype(np.float32))
    q = rng.standard_normal((1, config.num_attention_heads, width)).astype(np.float32)
    client.create_sequence("async/s")
    try:
        client.append_kv("async/s", 0, 0, rows)
        query = mlaserve.latent_query("async/s", 0, q, dtype="bf16")
        expected = client.decode([query], output_dtype="fp32")[0]
        first = client.decode_async([query], output_dtype="fp32")
        second = client.decode_async([query], output_dtype="fp32")
        for pending in (second, first):
            got = pending.result()[0]
            check(np.array_equal(got.out, expected.out) and np.array_equal(got.lse, expected.lse),
                  "decode_async answered otherwise than decode")
        missing = client.decode_async([mlaserve.latent_query("async/none", 0, q, dtype="bf16")])
        try:
            missing.result()
            check(False, "decode_async on an unknown sequence did not fail")
        except grpc.RpcError as error:
            check(error.code() == grpc.StatusCode.NOT_FOUND,
                  f"decode_async on an unknown sequence: {error.code()}, not NOT_FOUND")
        # No server: the call's UNAVAILABLE is retried in result() (decode()'s attempts and
        # backoff), then raised within the client's deadline.
        nobody = mlaserve.Client(f"127.0.0.1:{free_port()}", timeout=1.0)
        began = time.monotonic()
        try:
            nobody.decode_async([query]).result()
            check(False, "decode_async without a server answered")
        except grpc.RpcError as error:
            check(error.code() in (grpc.StatusCode.UNAVAILABLE,
                                   grpc.StatusCode.DEADLINE_EXCEEDED),
                  f"decode_async without a server: {error.code()}")
        check(time.monotonic() - began < 5, "decode_async's retries outlived the deadline")
        nobody.close()
    finally:
        client.release_sequence("async/s")


if __name__ == "__main__":
    sys.exit(main())
