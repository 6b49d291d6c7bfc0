#!/usr/bin/python3
"""Decode attention against a running mlaserve server, checked against numpy.

    PYTHONPATH=build/python /usr/bin/python3 client/python/examples/decode_example.py \
        --target 127.0.0.1:50051

Registers a shared prefix (a "system prompt"), starts three sequences on it, appends each
one's own tokens, decodes one latent-space query per sequence in a single call (one of them
with two MTP tokens), and compares outputs and LSEs with a float64 reference computed here
from the same bf16 inputs. Then a head-space decode shows the other query form (its
reference would need the server's up-projection weights). Exits non-zero on a mismatch.
"""

import argparse
import sys
import uuid

import numpy as np

import mlaserve
from mlaserve.v1 import decode_pb2


def reference_attention(q, kv, scale, dv):
    """float64 attention of q [sq, heads, dk] over kv [L, dk] with the causal MTP mask:
    token s sees keys [0, L - sq + s + 1). Returns out [sq, heads, dv], lse [sq, heads]."""
    q = q.astype(np.float64)
    kv = kv.astype(np.float64)
    sq, heads, _ = q.shape
    length = kv.shape[0]
    out = np.zeros((sq, heads, dv))
    lse = np.full((sq, heads), -np.inf)
    for s in range(sq):
        visible = max(0, min(length, length - sq + s + 1))
        if visible == 0:
            continue
        scores = q[s] @ kv[:visible].T * scale  # [heads, visible]
        peak = scores.max(axis=1, keepdims=True)
        weights = np.exp(scores - peak)
        total = weights.sum(axis=1, keepdims=True)
        out[s] = (weights / total) @ kv[:visible, :dv]
        lse[s] = (peak + np.log(total))[:, 0]
    return out, lse


def relative_error(actual, expected):
    return np.linalg.norm(actual - expected) / (np.linalg.norm(expected) + 1e-10)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="127.0.0.1:50051")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    with mlaserve.Client(args.target) as client:
        info = client.server_info()
        model = info.model
        width, heads, layers = model.kv_row_width, model.heads, model.layers
        print(f"server {info.server_version}: {model.name}, {layers} layers, {heads} heads, "
              f"scale {model.softmax_scale:.7f}, {len(info.devices)} device(s), "
              f"B_theta(sq=1) = {info.naive_thresholds[0].b_theta:.1f}")
        run = uuid.uuid4().hex[:8]  # fresh ids: the example can run again on the same server
        layer = layers - 1

        # A shared prefix for every layer; bf16 values, kept as uint16 bit patterns.
        prefix_tokens = 48
        prefix = mlaserve.float_to_bf16_bits(rng.standard_normal((layers, prefix_tokens, width)))
        prefix_id = f"example/{run}/system-prompt"
        client.register_prefix(prefix_id, prefix)

        suffix_lengths = [5, 37, 2]
        sequences, caches = [], []
        for i, length in enumerate(suffix_lengths):
            sequence_id = f"example/{run}/seq{i}"
            client.create_sequence(sequence_id, prefix_id)
            own = mlaserve.float_to_bf16_bits(rng.standard_normal((length, width)))
            client.append_kv(sequence_id, layer, prefix_tokens, own)
            sequences.append(sequence_id)
            caches.append(np.concatenate([prefix[layer], own]))

        token_counts = [1, 2, 1]
        queries, expected = [], []
        for sequence_id, cache, sq in zip(sequences, caches, token_counts):
            q = mlaserve.float_to_bf16_bits(rng.standard_normal((sq, heads, width)))
            queries.append(mlaserve.latent_query(sequence_id, layer, q))
            expected.append(reference_attention(mlaserve.bf16_bits_to_float(q),
                                                mlaserve.bf16_bits_to_float(cache),
                                                model.softmax_scale, model.dl))
        results = client.decode(queries, output_dtype="fp32")

        ok = True
        for sequence_id, result, (out, lse) in zip(sequences, results, expected):
            out_error = relative_error(mlaserve.round_to_bf16(result.out), out)
            lse_error = np.max(np.abs(result.lse - lse))
            good = out_error < 1e-2 and lse_error < 1e-3
            ok &= good
            plan = result.plan
            print(f"{sequence_id}: out {list(result.out.shape)} rel err {out_error:.2e}, "
                  f"lse max err {lse_error:.2e}  [{'ok' if good else 'MISMATCH'}]  "
                  f"plan: {decode_pb2.Formulation.Name(plan.formulation)}, "
                  f"group {plan.group_size}, device {plan.device}, batch {plan.batch_size}, "
                  f"queue {plan.queue_us:.0f} us, modelled {plan.device_modeled_us:.1f} us")

        # Head space: q_nope and RoPE'd q_pe as the model's q projection makes them.
        head = client.decode([mlaserve.head_query(
            sequences[0], layer,
            mlaserve.float_to_bf16_bits(rng.standard_normal((1, heads, model.dn))),
            mlaserve.float_to_bf16_bits(rng.standard_normal((1, heads, model.dr))))])[0]
        finite = bool(np.all(np.isfinite(head.out)) and np.all(np.isfinite(head.lse)))
        ok &= finite and head.out.shape == (1, heads, model.dv)
        print(f"head space: out {list(head.out.shape)} (o_proj input), finite: {finite}")

        for sequence_id in sequences:
            client.release_sequence(sequence_id)
        client.release_prefix(prefix_id)
    print("all answers match the reference" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
