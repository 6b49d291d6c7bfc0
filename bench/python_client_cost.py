#!/usr/bin/python3
"""The Python client's own time per Decode call over grpcio, the list form (head_query per
sequence, Client.decode) against the batch form (stacked arrays, Client.decode_batch, the
packed message), side by side in one run (docs/performance.md, "The Python client's time
per call"). bench/python_layer_call.py times the whole call against a server, the C++
client over the data plane included.

A framework calls once per layer and step, and its decode thread pays this time where no
overlap hides it (docs/model.md). No server is needed: each form builds and serialises the
request of one layer's B head-space queries (128 heads, DeepSeek-V3's widths, each with its
step's KV row appended) as Client.decode sends it, and parses an answer of B fp32 outputs
[1, 128, 128] with their LSEs into the arrays the caller uses (the list form's outputs
stacked, as a framework stacks them). Both forms' requests are checked to carry the same
tensor bytes, and their answers to be the same arrays.
Rounds alternate the forms; the best round of each counts.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_client_cost.py [--batches 1,8,64]
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlaserve  # noqa: E402
from machine import cpu_line  # noqa: E402  (beside this script)
from mlaserve.batch import batch_request, batch_result  # noqa: E402
from mlaserve.client import _decode_request, _results  # noqa: E402
from mlaserve.v1 import decode_pb2, tensor_pb2  # noqa: E402

HEADS, DN, DR, WIDTH, DV = 128, 128, 64, 576, 128


def forms(batch, rng):
    q_nope = mlaserve.float_to_bf16_bits(rng.standard_normal((batch, 1, HEADS, DN)))
    q_pe = mlaserve.float_to_bf16_bits(rng.standard_normal((batch, 1, HEADS, DR)))
    rows = mlaserve.float_to_bf16_bits(rng.standard_normal((batch, 1, WIDTH)))
    ids = [f"bench/{b}" for b in range(batch)]
    positions = list(range(100, 100 + batch))

    def list_request():
        queries = [mlaserve.head_query(ids[b], 3, q_nope[b], q_pe[b], append_rows=rows[b],
                                       append_position=positions[b]) for b in range(batch)]
        return _decode_request(queries, "fp32", 0.1).SerializeToString()

    def batch_form_request():
        return batch_request(ids, 3, q_nope=q_nope, q_pe=q_pe, append_rows=rows,
                             append_positions=positions, output_dtype="fp32",
                             softmax_scale=0.1).SerializeToString()

    listed = decode_pb2.DecodeRequest.FromString(list_request())
    packed = decode_pb2.DecodeRequest.FromString(batch_form_request()).packed
    if packed.head.q_nope.data != b"".join(q.head.q_nope.data for q in listed.queries):
        raise SystemExit("the two forms' requests carry different bytes")

    response = decode_pb2.DecodeResponse()
    for _ in range(batch):
        result = response.results.add()
        result.out.dtype = result.lse.dtype = tensor_pb2.DTYPE_FP32
        result.out.shape.extend([1, HEADS, DV])
        result.out.data = rng.standard_normal((1, HEADS, DV)).astype(np.float32).tobytes()
        result.lse.shape.extend([1, HEADS])
        result.lse.data = rng.standard_normal((1, HEADS)).astype(np.float32).tobytes()
        result.plan.queue_us = 10
    wire = response.SerializeToString()
    # The same answers as the packed form carries them.
    packed_response = decode_pb2.DecodeResponse()
    out, lse = packed_response.packed.out, packed_response.packed.lse
    out.dtype = lse.dtype = tensor_pb2.DTYPE_FP32
    out.shape.extend([batch, 1, HEADS, DV])
    out.data = b"".join(r.out.data for r in response.results)
    lse.shape.extend([batch, 1, HEADS])
    lse.data = b"".join(r.lse.data for r in response.results)
    packed_response.packed.plans.extend(r.plan for r in response.results)
    packed_wire = packed_response.SerializeToString()

    def list_answer():
        results = _results(decode_pb2.DecodeResponse.FromString(wire))
        return np.stack([r.out for r in results]), np.stack([r.lse for r in results])

    def batch_answer():
        answer = batch_result(decode_pb2.DecodeResponse.FromString(packed_wire))
        return answer.out, answer.lse

    for a, b in zip(list_answer(), batch_answer()):
        if not np.array_equal(a, b):
            raise SystemExit("the two forms' answers differ")
    return {"list": (list_request, list_answer), "batch": (batch_form_request, batch_answer)}


def best_us(function, seconds):
    function()
    best = float("inf")
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        began = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - began)
    return best * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,8,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="per form and round")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(cpu_line())
    print("| B | request, list (us) | request, batch (us) | answer, list (us) | "
          "answer, batch (us) | list / batch |")
    print("|---|---|---|---|---|---|")
    for batch in [int(b) for b in args.batches.split(",")]:
        timed = forms(batch, rng)
        best = {(form, part): float("inf") for form in timed for part in (0, 1)}
        for _ in range(args.rounds):
            for form, parts in timed.items():
                for part, function in enumerate(parts):
                    best[form, part] = min(best[form, part], best_us(function, args.seconds))
        list_total = best["list", 0] + best["list", 1]
        batch_total = best["batch", 0] + best["batch", 1]
        print(f"| {batch} | {best['list', 0]:.0f} | {best['batch', 0]:.0f} | "
              f"{best['list', 1]:.0f} | {best['batch', 1]:.0f} | "
              f"{list_total / batch_total:.2f}x |")


if __name__ == "__main__":
    main()
