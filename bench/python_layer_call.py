#!/usr/bin/python3
"""A framework's per-layer call from Python, timed whole against a real server: the model back
end's call (Client.decode_batch: B sequences' head-space queries at one layer, each appending
its step's KV row) over the C++ client and the server's same-host data plane, against the
same call over grpcio's packed message and the list form (Client.decode), side by side in one
run, rounds alternating (docs/performance.md, "14. Transports").

    PYTHONPATH=build/python /usr/bin/python3 bench/python_layer_call.py \\
        [--batches 1,8] [--server-flag=--devices=cuda:0] --server build/bin/mlaserve-server
"""

import argparse
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mlaserve  # noqa: E402
from machine import cpu_line  # noqa: E402  (beside this script)


def start_server(binary, flags):
    process = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--metrics_listen=",
                                "--layers=2", *flags], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    port = None
    for line in process.stdout:
        found = re.search(r"listening: gRPC on port (\d+)", line)
        port = found.group(1) if found else port
        if "ready: serving" in line:
            # Its later lines are read (and dropped) so that its log never fills the pipe.
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
            return process, f"127.0.0.1:{port}"
    raise SystemExit("the server did not start")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--server-flag", action="append", default=[],
                        help="a flag for the server, repeatable: --server-flag=--devices=cuda:0")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--calls", type=int, default=200, help="per form and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server, target = start_server(args.server, args.server_flag)
    try:
        clients = {"shm": mlaserve.Client(target, data_plane="auto"),
                   "grpcio": mlaserve.Client(target, data_plane="grpc")}
        if not (mlaserve.native.available() and clients["shm"].on_data_plane()):
            raise SystemExit("the C++ client is not built, or the server offers no data plane")
        info = clients["grpcio"].server_info()
        m = info.model
        print(cpu_line())
        print(f"server: {info.devices[0].kind} {info.devices[0].description or info.devices[0].profile}")
        print("| B | form | p50 (us) | p90 (us) |")
        print("|---|---|---|---|")
        rng = np.random.default_rng(0)
        for batch in [int(b) for b in args.batches.split(",")]:
            ids = [f"layer-call/{batch}/{b}" for b in range(batch)]
            for i in ids:
                clients["grpcio"].create_sequence(i)
                clients["grpcio"].append_kv(i, 0, 0, rng.standard_normal((1024, m.kv_row_width)),
                                            "bf16")
            q_nope = mlaserve.float_to_bf16_bits(rng.standard_normal((batch, 1, m.heads, m.dn)))
            q_pe = mlaserve.float_to_bf16_bits(rng.standard_normal((batch, 1, m.heads, m.dr)))
            rows = mlaserve.float_to_bf16_bits(rng.standard_normal((batch, 1, m.kv_row_width)))
            position = [1024]

            def batch_call(client):
                client.decode_batch(ids, 0, q_nope=q_nope, q_pe=q_pe, append_rows=rows,
                                    append_positions=[position[0]] * batch)
                position[0] += 1

            def list_call():
                client = clients["grpcio"]
                client.decode([mlaserve.head_query(ids[b], 0, q_nope[b], q_pe[b],
                                                   append_rows=rows[b],
                                                   append_position=position[0])
                               for b in range(batch)])
                position[0] += 1

            forms = {"decode_batch, C++ client over the data plane":
                     lambda: batch_call(clients["shm"]),
                     "decode_batch over grpcio (packed)": lambda: batch_call(clients["grpcio"]),
                     "decode over grpcio (list)": list_call}
            times = {form: [] for form in forms}
            for _ in range(args.rounds):
                for form, call in forms.items():
                    call()  # warm
                    for _ in range(args.calls):
                        began = time.perf_counter()
                        call()
                        times[form].append((time.perf_counter() - began) * 1e6)
            for form, us in times.items():
                print(f"| {batch} | {form} | {np.percentile(us, 50):.0f} | "
                      f"{np.percentile(us, 90):.0f} |")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
