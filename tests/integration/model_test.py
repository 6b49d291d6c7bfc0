"""A DeepSeek-V3-architecture model generating through a real server (docs/model.md): the
tiny configuration (2 layers, DeepSeek-V3's attention widths, seeded weights written as the
server's --weights), 4 sequences x 24 steps on different prompts, local attention (PyTorch)
against mlaserve's (one Decode call per layer and step, the step's KV row appended in it).
Teacher-forced logits within the stated tolerance at every step; the argmax equal wherever
the reference's top-2 margin exceeds 4x the tolerance; free-running output identical up to
the first near-tie at least; the output not degenerate. Also the weights' round trip
through safetensors.

    /usr/bin/python3 tests/integration/model_test.py --server build/bin/mlaserve-server
        (PYTHONPATH=build/python)
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

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
        result = m.compare_teacher_forced(model, m.LocalAttention(model),
                                          m.MlaServeAttention(model, client), prompts, STEPS,
                                          TOLERANCE)
        print(result)
        check(result.max_logit_difference <= TOLERANCE,
              f"logits differ by {result.max_logit_difference} > {TOLERANCE}")
        check(result.argmax_mismatches == 0,
              f"{result.argmax_mismatches} argmax mismatches beyond 4x the tolerance's margin")
        for s in range(SEQUENCES):
            check(result.identical_until[s] >= result.first_near_tie[s],
                  f"sequence {s}: free-running output differs at step "
                  f"{result.identical_until[s]}, before its first near-tie "
                  f"({result.first_near_tie[s]})")
            check(result.distinct_tokens[s] >= STEPS // 3,
                  f"sequence {s}: {result.distinct_tokens[s]} distinct tokens of {STEPS}")
        check(not list(client.list_sequences()), "the back end left sequences on the server")
    except Exception as error:  # noqa: BLE001 (reported, then everything is removed)
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return report(failures, began)


if __name__ == "__main__":
    sys.exit(main())
