#!/usr/bin/python3
"""mlaserve.ClusterClient against a real etcd (Debian's, on loopback, its data in a directory
the test removes) and three servers registered in it (docs/cluster.md, "Python cluster
client"): the placement rule on hand-made candidates, the membership as the servers write
it, capacity placement, prefix affinity until the spread group and the prefix then
registered on a second server (seen through the servers' ListPrefixes/ListSequences), decode
answers bit for bit equal to one server's, context-parallel decode over three servers against
an fp64 reference (sq 1 and 2, tokens straddling part boundaries, an append inside the
query), sequences moved by their servers (MigrateSequences: a sequence on a prefix, an FP8
one and a context-parallel part, followed by the cluster client without being told, answers
bit for bit as before, also during the moves; a dead target and an unknown id refused,
nothing moved), `mlaserve-ctl drain` of a fourth server holding the client's sequences while
it decodes and creates (the server exits 0; every sequence answers bit for bit as before, one
not called since before the drain found once the server has stopped; new ones placed on the
others; fake records: one moving out never chosen, a dead one's create placed again), a
kill -9 (calls for its sequences fail at once with UNAVAILABLE naming it once its key is
gone, the others answer), a server stopped with SIGTERM and restarted on its port with its
--state_dir (a new instance at the old address: its sequences fail at once while it is away,
then answer bit for bit as before), etcd stopped (stale, decodes go on) and restarted. The
rule's checks include the 5 % within which servers count as equally roomy and the tie order of
a client's seed (tie_break 0: the smallest id).

    /usr/bin/python3 tests/integration/cluster_client_py_test.py \\
        --server build/bin/mlaserve-server --etcd /usr/bin/etcd   (PYTHONPATH=build/python)
        [--ctl build/bin/mlaserve-ctl: by default next to --server]
"""

import argparse
import base64
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import grpc
import numpy as np

import mlaserve
from etcd_harness import Etcd, wait_for
from harness import Server, close, free_port, make_pki
from mlaserve.cluster import PlacementCandidate, place_sequence

CLUSTER = "py-client-test"
PREFIX = f"/mlaserve/{CLUSTER}/servers/"
LAYERS = 2
# FlashMLA's test tolerances (tests/integration/flash_mla_cases.py), for bf16 inputs: out
# within abs 8e-4 or rel 2.01/128 with cosine difference < 5e-6; lse within abs 1e-6 or rel
# 8.01/65536.
OUT_TOLERANCE = (8e-4, 2.01 / 128, 5e-6)
LSE_TOLERANCE = (1e-6, 8.01 / 65536, None)


def reference(q, kv, scale):
    """fp64 MLA decode attention in latent space: q [sq, heads, 576] over kv [L, 576] (k = the
    whole row, v = its first 512), token s seeing keys [0, L - sq + s + 1)."""
    q, kv = q.astype(np.float64), kv.astype(np.float64)
    sq, heads, _ = q.shape
    length = len(kv)
    out = np.zeros((sq, heads, 512))
    lse = np.full((sq, heads), -np.inf)
    for s in range(sq):
        visible = length - sq + s + 1
        scores = q[s] @ kv[:visible].T * scale
        peak = scores.max(axis=1, keepdims=True)
        weights = np.exp(scores - peak)
        total = weights.sum(axis=1, keepdims=True)
        out[s] = (weights / total) @ kv[:visible, :512]
        lse[s] = (peak + np.log(total))[:, 0]
    return out, lse


def same_bits(a, b):
    a, b = np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def same_answers(answers, before, which):
    """answers, for queries `which`, bit for bit those `before` gave."""
    return len(answers) == len(which) and all(
        same_bits(a.out, before[i].out) and same_bits(a.lse, before[i].lse)
        for a, i in zip(answers, which))


def keep_decoding(client, queries, which, before, stop, load):
    """Decodes queries `which` until `stop`, counting calls in load["decodes"]; the first
    error, or an answer unlike `before`, goes to load["errors"] and ends the loop."""
    while not stop.is_set():
        try:
            answers = client.decode([queries[i] for i in which], output_dtype="fp32")
        except Exception as error:  # reported by the caller
            load["errors"].append(f"decode: {type(error).__name__}: {error}")
            return
        if not same_answers(answers, before, which):
            load["errors"].append("decode: an answer differs from before")
            return
        load["decodes"] += 1


def check_placement_rule(check):
    """place_sequence on hand-made candidates: each step of the rule and its tie-breaks."""
    c = PlacementCandidate
    # Step 1: the holder with the smallest group, then the most free, then the smallest id.
    servers = [c("a", 100, 0, 2), c("b", 100, 0, 1), c("c", 500, 0, -1), c("d", 100, 0, 1)]
    check(place_sequence(servers, 10, 50, True, 3) == ("b", False), "step 1: smallest group")
    servers[3] = c("d", 120, 0, 1)
    check(place_sequence(servers, 10, 50, True, 3) == ("d", False), "step 1: most free")
    # Step 2: holders at the spread group skipped; the most free server gets the prefix.
    servers = [c("a", 900, 0, 3), c("b", 100, 0, -1), c("c", 300, 0, -1)]
    check(place_sequence(servers, 10, 50, True, 3) == ("c", True), "step 2: spread")
    # ... with room for the prefix where it lacks it; ties: fewest sequences, then id.
    servers = [c("a", 900, 0, 3), c("b", 59, 0, -1), c("c", 60, 5, -1), c("d", 60, 5, -1)]
    check(place_sequence(servers, 10, 50, True, 3) == ("c", True), "step 2: ties")
    servers = [c("a", 60, 9, -1), c("b", 60, 4, -1)]
    check(place_sequence(servers, 10) == ("b", False), "no prefix: fewest sequences")
    # spread_group 0: a holder with room keeps taking them.
    servers = [c("a", 100, 0, 50), c("b", 1000, 0, -1)]
    check(place_sequence(servers, 10, 50, True, 0) == ("a", False), "spread 0: affinity")
    # Step 3: nobody else has room: a holder past the spread group.
    servers = [c("a", 100, 0, 4), c("b", 100, 0, 3), c("c", 40, 0, -1)]
    check(place_sequence(servers, 10, 50, True, 3) == ("b", False), "step 3")
    # Exclusion, and RESOURCE_EXHAUSTED naming the bytes.
    servers = [c("a", 100, 0, -1), c("b", 90, 0, -1)]
    check(place_sequence(servers, 10, exclude={"a"}) == ("b", False), "exclude")
    try:
        place_sequence(servers, 95, exclude={"a"})
        check(False, "no room must raise")
    except mlaserve.ClusterError as error:
        check(error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "95 bytes" in error.message
              and "1 excluded" in error.message, f"no room: {error}")

    # The tie order: FNV-1a 64 of the id's bytes from FNV's offset basis ^ tie_break
    # (cluster/placement.cc), checked against a uint64 computation of its own.
    def key(instance_id, seed):
        h = np.uint64(14695981039346656037) ^ np.uint64(seed)
        with np.errstate(over="ignore"):
            for byte in instance_id.encode():
                h = (h ^ np.uint64(byte)) * np.uint64(1099511628211)
        return int(h)

    # "The roomiest": free bytes within 5 % of the most free (>= most - most // 20) count the
    # same. Step 2: among those, the fewest sequences.
    servers = [c("a", 1000, 3, -1), c("b", 951, 1, -1), c("c", 949, 0, -1)]
    check(place_sequence(servers, 10) == ("b", False), "step 2: within 5 %, fewer sequences")
    servers[2] = c("c", 950, 0, -1)
    check(place_sequence(servers, 10) == ("c", False), "step 2: exactly 5 % below counts")
    # Step 1: the smallest group, then within 5 % of its most free the tie order alone
    # (sequences do not count there); a holder with a larger group never, however roomy.
    servers = [c("a", 1000, 9, 1), c("b", 955, 0, 1), c("d", 5000, 0, 2)]
    check(place_sequence(servers, 10, 50, True, 3) == ("a", False), "step 1: 5 %, tie 0")
    b_first = next(seed for seed in range(1, 1000) if key("b", seed) < key("a", seed))
    check(place_sequence(servers, 10, 50, True, 3, tie_break=b_first) == ("b", False),
          "step 1: 5 %, a seed that orders b first")
    servers[1] = c("b", 949, 0, 1)
    check(place_sequence(servers, 10, 50, True, 3, tie_break=b_first) == ("a", False),
          "step 1: past 5 % the most free")

    for instance_id, seed in (("a", 1), ("b", 4), ("0123456789abcdef0123456789abcdef", 1 << 63),
                              ("é", (1 << 64) - 1)):
        check(mlaserve.placement._tie_key(instance_id, seed) == key(instance_id, seed),
              f"tie key of {instance_id!r}, seed {seed}")
    # Equally roomy (4 % apart), equal sequences: tie_break 0 the smallest id; seeds order them
    # their own ways (each client its own); a server 6 % below is never chosen.
    servers = [c("a", 1000, 2, -1), c("b", 990, 2, -1), c("c", 960, 2, -1),
               c("d", 940, 0, -1)]
    check(place_sequence(servers, 10)[0] == "a", "tie_break 0: the smallest id")
    for seed in range(1, 17):
        best = min("abc", key=lambda i: key(i, seed))
        chosen = place_sequence(servers, 10, tie_break=seed)[0]
        check(chosen == best, f"seed {seed} chose {chosen}, its key order {best}")
    seen = {place_sequence(servers, 10, tie_break=seed)[0] for seed in range(1, 17)}
    check(seen == {"a", "b", "c"}, f"16 seeds chose {seen}")


def check_moves(cluster, address_of, instance_of, model, system, bf16, check, log):
    """Section 4b: sequences moved by Client(source).migrate_sequences, followed by the
    cluster client (answers bit for bit as before, also for decodes running during the
    moves); a move to a dead target and one naming an unknown sequence change nothing.
    `cluster` makes one attempt per call (max_attempts=1), so a call meeting a sequence in
    its last rows (UNAVAILABLE "is moving") is waited out by the cluster client itself."""
    heads, width = model.heads, model.kv_row_width
    fp8_row = model.dl + 4 + 2 * model.dr  # e4m3 content, fp32 scale, bf16 RoPE
    cluster.register_prefix("sys", system)
    cluster.create_sequence("mv-sys", prefix_id="sys")
    cluster.create_sequence("mv-fp8", kv_dtype="fp8")
    moving = ["mv-sys", "mv-fp8"]
    own = {"mv-sys": 21, "mv-fp8": 13}  # rows per layer after the prefix
    ends = {}
    for sequence_id in moving:
        base = 40 if sequence_id == "mv-sys" else 0
        for layer in range(LAYERS):
            cluster.append_kv(sequence_id, layer, base, bf16((own[sequence_id], width), 0.1))
            ends[(sequence_id, layer)] = base + own[sequence_id]
    queries = [mlaserve.latent_query(s, layer, bf16((1 + layer, heads, width)))
               for s in moving for layer in range(LAYERS)]
    before = cluster.decode(queries, output_dtype="fp32")
    source_of = {s: cluster.server_of(s) for s in moving}
    groups_before = cluster.prefixes()["sys"]

    def same_as_before(answers, which=range(len(queries))):
        return same_answers(answers, before, which)

    def expect_rpc_error(function, code, *words):
        try:
            function()
        except grpc.RpcError as error:
            check(error.code() == code and all(w in (error.details() or "") for w in words),
                  f"expected {code.name} naming {words}, got {error.code()}: {error.details()}")
            return
        check(False, f"expected {code.name}, nothing raised")

    def holds(address, sequence_id):
        return sequence_id in {x.sequence.sequence_id
                               for x in address_of[address][1].list_sequences()}

    # A target that does not answer, and an unknown sequence: refused, nothing moves.
    with mlaserve.Client(source_of["mv-sys"]) as source:
        dead = f"127.0.0.1:{free_port()}"
        started = time.monotonic()
        expect_rpc_error(lambda: source.migrate_sequences(dead, sequence_ids=["mv-sys"]),
                         grpc.StatusCode.UNAVAILABLE, f"target: server {dead}")
        print(f"a move to a dead target failed after {time.monotonic() - started:.2f} s")
        other = min(t for t in address_of if t != source_of["mv-sys"])
        expect_rpc_error(lambda: source.migrate_sequences(
            other, sequence_ids=["mv-sys", "nobody"]), grpc.StatusCode.NOT_FOUND,
            "sequence_ids[1]", "nobody")
    check(cluster.server_of("mv-sys") == source_of["mv-sys"] and
          holds(source_of["mv-sys"], "mv-sys") and not holds(other, "mv-sys"),
          "mv-sys left its server after refused moves")
    check(same_as_before(cluster.decode(queries, output_dtype="fp32")),
          "decode after refused moves differs")

    # The moves, each server's sequences to the next server, while a thread decodes them
    # (one sq-1 query on each: a few milliseconds a call, against calls held ~20 ms).
    targets = sorted(address_of)
    by_source = {}
    for sequence_id in moving:
        by_source.setdefault(source_of[sequence_id], []).append(sequence_id)
    destination_of = {}
    light = [i for i, q in enumerate(queries) if q.layer == 0]
    load = {"decodes": 0, "errors": [], "waits": 0}
    stop = threading.Event()
    follow = cluster._follow_move

    def counting_follow(error):
        if error.code() == grpc.StatusCode.UNAVAILABLE:
            load["waits"] += 1
        return follow(error)

    cluster._follow_move = counting_follow
    loader = threading.Thread(target=keep_decoding,
                              args=(cluster, queries, light, before, stop, load))
    loader.start()
    try:
        for source_address, ids in sorted(by_source.items()):
            target = targets[(targets.index(source_address) + 1) % len(targets)]
            with mlaserve.Client(source_address) as source:
                moved = source.migrate_sequences(target, sequence_ids=ids)
            on_prefix = "mv-sys" in ids
            tokens = (40 if on_prefix else 0) + sum(own[s] for s in ids) * LAYERS
            nbytes = (40 * LAYERS * width * 2 if on_prefix else 0) + sum(
                own[s] * LAYERS * (fp8_row if s == "mv-fp8" else width * 2) for s in ids)
            check((moved.sequences, moved.prefixes, moved.tokens, moved.bytes) ==
                  (len(ids), 1 if on_prefix else 0, tokens, nbytes),
                  f"moved {ids} to {target}: {moved}, expected {len(ids)} sequences, "
                  f"{1 if on_prefix else 0} prefixes, {tokens} tokens, {nbytes} bytes")
            print(f"moved {ids} in {moved.seconds * 1e3:.1f} ms, calls held "
                  f"{moved.held_seconds * 1e3:.1f} ms")
            for sequence_id in ids:
                destination_of[sequence_id] = target
            # The source names the new server.
            expect_rpc_error(lambda: address_of[source_address][1].decode(
                [q for q in queries if q.sequence_id == ids[0]][:1]),
                grpc.StatusCode.FAILED_PRECONDITION,
                f"sequence '{ids[0]}' moved to server {target}")
        time.sleep(0.05)  # a few decodes after the last move
    finally:
        stop.set()
        loader.join()
        cluster._follow_move = follow
    check(not load["errors"], f"decodes during the moves: {load['errors'][:3]}")
    print(f"{load['decodes']} decodes through the cluster client during the moves, all equal "
          f"to before; {load['waits']} met a sequence moving and waited")

    # Through the cluster client, told nothing: the same bits, from the new servers.
    check(same_as_before(cluster.decode(queries, output_dtype="fp32")),
          "decode after the moves differs from before")
    for sequence_id in moving:
        check(cluster.server_of(sequence_id) == destination_of[sequence_id],
              f"server_of({sequence_id}) {cluster.server_of(sequence_id)}, expected "
              f"{destination_of[sequence_id]}")
        check(holds(destination_of[sequence_id], sequence_id) and
              not holds(source_of[sequence_id], sequence_id),
              f"{sequence_id} not (only) on {destination_of[sequence_id]}")
    followed = sorted(m for m in log.messages if "' moved from " in m)
    check(followed == sorted(f"cluster '{CLUSTER}': sequence '{s}' moved from {source_of[s]} to "
                             f"{destination_of[s]}" for s in moving),
          f"one move followed per sequence: {followed}")
    # The prefix's group moved with mv-sys.
    old, new = instance_of[source_of["mv-sys"]], instance_of[destination_of["mv-sys"]]
    expected = dict(groups_before)
    expected[old] -= 1
    expected[new] = expected.get(new, 0) + 1
    check(cluster.prefixes()["sys"] == expected,
          f"prefix groups after the move {cluster.prefixes()['sys']}, expected {expected}")

    # And it goes on there: an append, a decode with an append inside, the releases.
    for sequence_id in moving:
        cluster.append_kv(sequence_id, 0, ends[(sequence_id, 0)], bf16((2, width), 0.1))
        [answer] = cluster.decode([mlaserve.latent_query(
            sequence_id, 1, bf16((1, heads, width)), append_rows=bf16((1, width), 0.1),
            append_position=ends[(sequence_id, 1)])])
        check(np.isfinite(answer.lse).all(), f"decode with an append on moved {sequence_id}")
        there = address_of[destination_of[sequence_id]][1].get_sequence(sequence_id)
        check(list(there.layer_lengths) == [ends[(sequence_id, 0)] + 2,
                                            ends[(sequence_id, 1)] + 1],
              f"{sequence_id} on its new server: lengths {list(there.layer_lengths)}")
    for sequence_id in moving:
        cluster.release_sequence(sequence_id)
        check(not holds(destination_of[sequence_id], sequence_id),
              f"{sequence_id} still on its new server after its release")
    expected[new] -= 1
    check(cluster.prefixes()["sys"] == expected,
          f"prefix groups after the releases {cluster.prefixes()['sys']}, expected {expected}")


def check_drain(etcd, ctl, start_server, others, bf16, check, log):
    """Section 5b: `mlaserve-ctl drain` of a fourth server D holding sequences of a
    ClusterClient (some on a prefix) while the client decodes some of them and creates new
    ones; D exits 0, and the client, told nothing, answers every sequence bit for bit as
    before, one it had not called since before the drain (found by _relocate once D has
    stopped) included, and places new sequences on the three servers left (`others`:
    address -> (server, Client)). First, with fake records in etcd: a member whose record
    says "moving-out" is never chosen, and one that refuses a create (a dead address) has
    the sequence placed again elsewhere."""
    # D has the most room by far, so the drainer's prefix and sequences all go there.
    d_server, d_address, d_client = start_server("--kv_budget=256MiB")
    d_instance = d_client.server_info().state.instance_id
    model = d_client.server_info().model
    heads, width = model.heads, model.kv_row_width
    drainer = mlaserve.ClusterClient(etcd.endpoint(), cluster=CLUSTER, spread_group=8,
                                     expected_sequence_tokens=64)
    try:
        members = wait_for(lambda: {m["address"]: m for m in drainer.members()}
                           if len(drainer.members()) == 4 else None, 10)
        if not check(members and d_address in members, f"D not a member: {drainer.members()}"):
            return

        # Fake members with far more room than D: one moving out (never chosen, never even
        # called), one at a dead address (its create refused: placed again on D).
        def fake(name, **fields):
            record = dict(members[d_address], instance_id=name,
                          address=f"127.0.0.1:{free_port()}", kv_budget_bytes=1 << 40,
                          **fields)
            record["load"] = dict(record["load"], kv_used_bytes=0, sequences=0)
            etcd.put(PREFIX + name, json.dumps(record))
            check(bool(wait_for(lambda: name in {m["instance_id"] for m in drainer.members()},
                                10)), f"fake member {name} not seen")

        def unfake(name):
            etcd._post("/v3/kv/deleterange", {"key": base64.b64encode(
                (PREFIX + name).encode()).decode()})
            check(bool(wait_for(lambda: name not in {m["instance_id"]
                                                     for m in drainer.members()}, 10)),
                  f"fake member {name} still listed")

        fake("zz-moving-out", state="moving-out")
        drainer.create_sequence("dr-probe-0")
        check(drainer.server_of("dr-probe-0") == d_address and
              "zz-moving-out" not in drainer._clients,
              f"placed on (or called) a member moving out: {drainer.server_of('dr-probe-0')}")
        unfake("zz-moving-out")
        check(any("zz-moving-out" in m and "moving its sequences out" in m
                  for m in log.messages), "the moving-out member's leaving not logged")
        fake("zz-dead")
        drainer.create_sequence("dr-probe-1")
        check(drainer.server_of("dr-probe-1") == d_address and
              any("refused a new sequence" in m for m in log.messages),
              f"a refused create: placed on {drainer.server_of('dr-probe-1')}, "
              f"log {log.messages[-3:]}")
        unfake("zz-dead")
        # (the dead one left without moving out: not remembered)
        check(not drainer._lost("zz-moving-out") and drainer._lost("zz-dead"),
              "which fake members are remembered as moved out")

        # The drainer's sequences, all on D: three on a prefix, three without.
        system = bf16((LAYERS, 24, width), 0.1)
        drainer.register_prefix("dr-sys", system)
        ids = [f"dr-sys-{i}" for i in range(3)] + [f"dr-free-{i}" for i in range(3)]
        rows = {}
        for n, sequence_id in enumerate(ids):
            on_prefix = sequence_id.startswith("dr-sys")
            drainer.create_sequence(sequence_id, prefix_id="dr-sys" if on_prefix else "")
            for layer in range(LAYERS):
                rows[(sequence_id, layer)] = 3 + 2 * n + layer
                drainer.append_kv(sequence_id, layer, 24 if on_prefix else 0,
                                  bf16((rows[(sequence_id, layer)], width), 0.1))
        for sequence_id in ["dr-probe-0", "dr-probe-1"]:
            drainer.release_sequence(sequence_id)
        on_d = {x.sequence.sequence_id for x in d_client.list_sequences()}
        if not check(on_d == set(ids), f"D holds {sorted(on_d)}, expected {sorted(ids)}"):
            return
        queries = [mlaserve.latent_query(s, layer, bf16((1 + layer, heads, width)))
                   for s in ids for layer in range(LAYERS)]
        before = drainer.decode(queries, output_dtype="fp32")

        def same_as_before(answers, which):
            return same_answers(answers, before, which)

        # During the drain: decodes of every sequence but dr-sys-0 (left alone, so only
        # _relocate can find it), and new sequences created (on the prefix or not).
        untouched = "dr-sys-0"
        busy = [i for i, q in enumerate(queries) if q.sequence_id != untouched]
        load = {"decodes": 0, "errors": [], "created": {}}
        stop = threading.Event()

        def create_during_drain():
            n = 0
            while not stop.is_set() and n < 60:
                sequence_id = f"dr-new-{n}"
                try:
                    drainer.create_sequence(sequence_id, prefix_id="" if n % 2 else "dr-sys")
                except Exception as error:  # reported below
                    load["errors"].append(f"create: {type(error).__name__}: {error}")
                    return
                load["created"][sequence_id] = drainer.server_of(sequence_id)
                n += 1
                time.sleep(0.005)

        threads = [threading.Thread(target=keep_decoding,
                                    args=(drainer, queries, busy, before, stop, load)),
                   threading.Thread(target=create_during_drain)]
        for thread in threads:
            thread.start()
        try:
            time.sleep(0.05)
            started = time.monotonic()
            drained = subprocess.run(
                [ctl, f"--etcd_endpoints={etcd.endpoint()}", f"--cluster={CLUSTER}",
                 f"--target={d_address}", "--json", "drain"],
                capture_output=True, text=True, timeout=60)
            drain_s = time.monotonic() - started
            try:
                exit_code = d_server.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                exit_code = None
            exit_s = time.monotonic() - started
            time.sleep(0.1)  # a few calls more after D stopped
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        if not check(drained.returncode == 0,
                     f"mlaserve-ctl drain exited {drained.returncode}: {drained.stderr[-2000:]}"):
            return
        report = json.loads(drained.stdout)
        moves = report["moves"]
        created_on_d = [s for s, a in load["created"].items() if a == d_address]
        moved = sum(m["sequences"] for m in moves)
        check(report["drained"] == d_address and moves and
              all(m["target"] in others for m in moves), f"drain report {report}")
        check(moved == len(ids) + len(created_on_d),
              f"{moved} sequences moved, expected {len(ids)} + {len(created_on_d)} created "
              f"there during the drain: {report}")
        check(sum(m["prefixes"] for m in moves) >= 1 and sum(m["tokens"] for m in moves) ==
              sum(rows.values()) + 24 * sum(m["prefixes"] for m in moves),
              f"prefixes and tokens moved: {report}")
        check(exit_code == 0, f"the drained server exited {exit_code}: "
              f"{''.join(d_server.log[-10:])}")
        check(not load["errors"], f"calls during the drain: {load['errors'][:3]}")
        print(f"drain of D: {moved} sequences ({len(created_on_d)} created during it) to "
              f"{len(moves)} servers in {report['seconds']:.2f} s, ctl {drain_s:.2f} s, D "
              f"exited after {exit_s:.2f} s; meanwhile {load['decodes']} decodes (all as "
              f"before) and {len(load['created'])} creates through the cluster client")

        # Told nothing: the untouched sequence first (D has stopped: found by _relocate),
        # then every one, the same bits as before the drain.
        mine = [i for i, q in enumerate(queries) if q.sequence_id == untouched]
        started = time.monotonic()
        check(same_as_before(drainer.decode([queries[i] for i in mine], output_dtype="fp32"),
                             mine), f"{untouched} after the drain differs from before")
        print(f"{untouched}, not called since before the drain, answered after "
              f"{(time.monotonic() - started) * 1e3:.0f} ms")
        check(any(f"sequence '{untouched}' found on " in m and f"after {d_address} stopped"
                  in m for m in log.messages), f"{untouched} not relocated: {log.messages[-5:]}")
        check(same_as_before(drainer.decode(queries, output_dtype="fp32"),
                             range(len(queries))), "decode after the drain differs from before")
        check(any(d_instance in m and "moving its sequences out" in m for m in log.messages),
              "D's leaving not logged as moving out")
        followed = [m for m in log.messages if "' moved from " in m and d_address in m]
        refused = [m for m in log.messages if "refused a new sequence" in m and d_address in m]
        cancelled = [m for m in log.messages if "cancelled a call as it stopped" in m]
        print(f"{len(followed)} moves followed by redirection during the drain, the rest "
              f"found after it; {len(refused)} creates refused by D and placed again, "
              f"{len(cancelled)} calls cancelled by D as it stopped and repeated")

        # Every sequence of the drainer answers from the three servers left; new ones go there.
        for n in range(4):
            drainer.create_sequence(f"dr-after-{n}", prefix_id="dr-sys" if n % 2 else "")
        every = sorted(set(ids) | set(load["created"]) | {f"dr-after-{n}" for n in range(4)})
        for sequence_id in every:
            if sequence_id not in ids:
                base = 24 if drainer._sequence(sequence_id).prefix is not None else 0
                drainer.append_kv(sequence_id, 0, base, bf16((2, width), 0.1))
        answers = drainer.decode([mlaserve.latent_query(s, 0, bf16((1, heads, width)))
                                  for s in every], output_dtype="fp32")
        check(all(np.isfinite(a.lse).all() for a in answers), "a decode after the drain")
        where = {s: drainer.server_of(s) for s in every}
        check(all(a in others for a in where.values()),
              f"sequences still on D: {[s for s, a in where.items() if a not in others]}")
        held = {x.sequence.sequence_id: a for a, (_, c) in others.items()
                for x in c.list_sequences() if x.sequence.sequence_id.startswith("dr-")}
        check(held == where, f"the servers hold {held}, the client says {where}")
        for sequence_id in every:
            drainer.release_sequence(sequence_id)
        left = [x.sequence.sequence_id for _, c in others.values() for x in c.list_sequences()
                if x.sequence.sequence_id.startswith("dr-")]
        check(not left, f"still on the servers after the releases: {left}")
        drainer.release_prefix("dr-sys")
    finally:
        drainer.close()  # (its membership thread would count in section 6's warnings)


class LogLines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--etcd", required=True)
    parser.add_argument("--ctl", help="mlaserve-ctl (default: next to --server)")
    args = parser.parse_args()
    ctl = args.ctl or os.path.join(os.path.dirname(os.path.abspath(args.server)),
                                   "mlaserve-ctl")
    began = time.time()
    failures = []
    directory = tempfile.mkdtemp(prefix="mlaserve-cluster-client-test-")
    etcd = Etcd(args.etcd, directory, PREFIX)
    servers = []
    clients = []
    log = LogLines()
    logging.getLogger("mlaserve.cluster").addHandler(log)
    logging.getLogger("mlaserve.cluster").setLevel(logging.INFO)

    def check(condition, message):
        if not condition:
            failures.append(message)
        return condition

    def start_server(kv_budget="--kv_budget=64MiB", target=None):
        """A server registered in the cluster, its KV state saved on SIGTERM to a directory
        of its port (`target`: the address of one restarted, its state loaded again)."""
        target = target or f"127.0.0.1:{free_port()}"
        state_dir = os.path.join(directory, "state-" + target.rpartition(":")[2])
        os.makedirs(state_dir, exist_ok=True)
        server = Server(args.server, [
            f"--listen={target}", "--metrics_listen=", f"--layers={LAYERS}", "--devices=1",
            kv_budget, "--model=kimi-k2", f"--etcd_endpoints={etcd.endpoint()}",
            f"--cluster={CLUSTER}", "--etcd_lease_ttl_s=3", f"--state_dir={state_dir}"])
        servers.append(server)
        if not server.ready(60):
            raise RuntimeError("the server did not become ready: " + "".join(server.log))
        direct = mlaserve.Client(target)
        clients.append(direct)
        return server, target, direct

    def expect_error(function, code, *words):
        """function() must raise ClusterError `code` whose message has every word; returns
        the seconds it took."""
        started = time.monotonic()
        try:
            function()
        except mlaserve.ClusterError as error:
            check(error.code == code and all(w in error.message for w in words),
                  f"expected {code.name} naming {words}, got {error}")
            return time.monotonic() - started
        except grpc.RpcError as error:
            failures.append(f"expected ClusterError {code.name}, got {error.code()}: "
                            f"{error.details()}")
            return time.monotonic() - started
        failures.append(f"expected ClusterError {code.name}, nothing raised")
        return time.monotonic() - started

    rng = np.random.default_rng(15)

    def bf16(shape, scale=1.0):
        return mlaserve.float_to_bf16_bits(rng.standard_normal(shape) * scale)

    try:
        check_placement_rule(check)
        etcd.start()

        # An etcd that does not answer: a clear error naming the endpoint, within the bound.
        dead = f"127.0.0.1:{free_port()}"
        waited = expect_error(lambda: mlaserve.ClusterClient(dead, cluster=CLUSTER,
                                                             etcd_timeout_s=1.0),
                              grpc.StatusCode.UNAVAILABLE, dead)
        check(waited < 3, f"a dead etcd took {waited:.1f} s to report")

        started = [start_server() for _ in range(3)]
        address_of = {target: (server, direct) for server, target, direct in started}
        cluster = mlaserve.ClusterClient(etcd.endpoint(), cluster=CLUSTER, spread_group=3)
        clients.append(cluster)

        # 1. The members, as the servers registered them.
        members = wait_for(lambda: len(cluster.members()) == 3 and cluster.members(), 10) or []
        check(sorted(m["address"] for m in members) == sorted(address_of),
              f"members {[m.get('address') for m in members]}, expected {sorted(address_of)}")
        check([m["instance_id"] for m in members] == sorted(m["instance_id"] for m in members),
              "members() not in instance id order")
        info = started[0][2].server_info()
        instance_of = {t: d.server_info().state.instance_id for t, (_, d) in address_of.items()}
        check({m["address"]: m["instance_id"] for m in members} == instance_of,
              "members' instance ids")
        b_theta = info.naive_thresholds[0].b_theta
        with mlaserve.ClusterClient(etcd.endpoint(), cluster=CLUSTER) as default:
            check(default.spread_group == 2 * math.ceil(max(1.0, b_theta)),
                  f"default spread group {default.spread_group}, B_theta {b_theta}")
            # Each client its own tie order among equally roomy servers, drawn at random.
            check(all(1 <= t < 1 << 64 for t in (default._tie_break, cluster._tie_break))
                  and default._tie_break != cluster._tie_break,
                  f"tie_break {default._tie_break}, {cluster._tie_break}")
        # A placement counts on its server until that server's next record: its bytes and one
        # sequence (two with the prefix's registration), both taken back when it fails.
        cluster._cluster_model()  # (what _candidates compares the records' models with)
        with cluster._lock:  # (no record refresh in between)
            any_member = members[0]["instance_id"]
            before = {x.instance_id: x for x in cluster._candidates(None)}[any_member]
            cluster._reserve(any_member, 1000, 2)
            after = {x.instance_id: x for x in cluster._candidates(None)}[any_member]
            cluster._reserve(any_member, -1000, -2)
            undone = {x.instance_id: x for x in cluster._candidates(None)}[any_member]
        check(after.free_bytes == before.free_bytes - 1000 and
              after.sequences == before.sequences + 2 and undone == before,
              f"reserved: {before} -> {after} -> {undone}")
        scale = float(np.float32(info.model.softmax_scale))
        heads, width = info.model.heads, info.model.kv_row_width

        # 2. Capacity: sequences without prefix spread over the servers (each placement
        # reserves its expected bytes until the member's next record).
        for i in range(6):
            cluster.create_sequence(f"free-{i}")
        placed = [cluster.server_of(f"free-{i}") for i in range(6)]
        counts = {t: placed.count(t) for t in address_of}
        check(all(1 <= n <= 3 for n in counts.values()), f"capacity placement {counts}")
        for target, (_, direct) in address_of.items():
            on_server = {s.sequence.sequence_id for s in direct.list_sequences()}
            check(on_server == {f"free-{i}" for i in range(6) if placed[i] == target},
                  f"{target} holds {sorted(on_server)}")
        huge = mlaserve.ClusterClient(etcd.endpoint(), cluster=CLUSTER,
                                      expected_sequence_tokens=1 << 20)
        clients.append(huge)
        expect_error(lambda: huge.create_sequence("too-big"),
                     grpc.StatusCode.RESOURCE_EXHAUSTED, str((1 << 20) * LAYERS * width * 2))

        # 3. Prefix affinity: a prefix's sequences go to its server until the spread group
        # (3), then the prefix is registered on a second server that takes the next ones.
        system = bf16((LAYERS, 40, width), 0.1)
        cluster.register_prefix("sys", system)
        [first_holder] = list(cluster.prefixes()["sys"])
        first = next(t for t, i in instance_of.items() if i == first_holder)
        for target, (_, direct) in address_of.items():
            has = "sys" in {p.prefix_id for p in direct.list_prefixes()}
            check(has == (target == first), f"{target} has prefix 'sys': {has}")
        for i in range(5):
            cluster.create_sequence(f"sys-{i}", prefix_id="sys")
        on = [cluster.server_of(f"sys-{i}") for i in range(5)]
        check(on[:3] == [first] * 3, f"the first 3 on the prefix's server {first}: {on}")
        second = on[3]
        check(second != first and on[4] == second, f"then a second server: {on}")
        check(cluster.prefixes()["sys"] == {instance_of[first]: 3, instance_of[second]: 2},
              f"prefix groups {cluster.prefixes()}")
        for target, (_, direct) in address_of.items():
            prefixes = {p.prefix_id for p in direct.list_prefixes()}
            sequences = {s.sequence.sequence_id for s in direct.list_sequences("sys")}
            expected = {f"sys-{i}" for i in range(5) if on[i] == target}
            check(("sys" in prefixes) == (target in (first, second)),
                  f"{target}: prefixes {prefixes}")
            check(sequences == expected, f"{target}: sequences on 'sys' {sorted(sequences)}, "
                  f"expected {sorted(expected)}")

        # The records follow (the watch carries every refresh): 11 sequences in all.
        check(bool(wait_for(lambda: sum(m["load"]["sequences"] for m in cluster.members())
                            == 11, 10)),
              f"load in the records: {[m['load'] for m in cluster.members()]}")

        # 4. Decode through the cluster = the same data decoded on one server, bit for bit.
        ids = [f"free-{i}" for i in range(6)] + [f"sys-{i}" for i in range(5)]
        lengths = {}
        for n, sequence_id in enumerate(ids):
            own = 5 + 7 * n
            base = 40 if sequence_id.startswith("sys") else 0
            for layer in range(LAYERS):
                rows = bf16((own + layer, width), 0.1)
                cluster.append_kv(sequence_id, layer, base, rows)
                lengths[(sequence_id, layer)] = (base, rows)
        reference_server = address_of[started[2][1]][1]
        reference_server.register_prefix("ref-sys", system)
        for sequence_id in ids:
            reference_server.create_sequence(
                "ref-" + sequence_id, prefix_id="ref-sys" if sequence_id.startswith("sys") else "")
            for layer in range(LAYERS):
                base, rows = lengths[(sequence_id, layer)]
                reference_server.append_kv("ref-" + sequence_id, layer, base, rows)
        latent = [(sequence_id, n % LAYERS, bf16((1 + n % 2, heads, width)))
                  for n, sequence_id in enumerate(ids)]
        through_cluster = cluster.decode(
            [mlaserve.latent_query(s, layer, q) for s, layer, q in latent])
        on_one = reference_server.decode(
            [mlaserve.latent_query("ref-" + s, layer, q) for s, layer, q in latent])
        check(all(same_bits(a.out, b.out) and same_bits(a.lse, b.lse)
                  for a, b in zip(through_cluster, on_one)),
              "latent decode through the cluster differs from one server's")
        head = [(s, 0, bf16((1, heads, info.model.dn)), bf16((1, heads, info.model.dr)))
                for s in ids]
        through_cluster = cluster.decode(
            [mlaserve.head_query(s, layer, qn, qp) for s, layer, qn, qp in head],
            output_dtype="fp32")
        on_one = reference_server.decode(
            [mlaserve.head_query("ref-" + s, layer, qn, qp) for s, layer, qn, qp in head],
            output_dtype="fp32")
        check(all(same_bits(a.out, b.out) and same_bits(a.lse, b.lse)
                  for a, b in zip(through_cluster, on_one)),
              "head-space decode through the cluster differs from one server's")
        # With appends inside the queries.
        appended = []
        for sequence_id in ids[::3]:
            base, rows = lengths[(sequence_id, 1)]
            appended.append((sequence_id, bf16((1, heads, width)), bf16((1, width), 0.1),
                             base + len(rows)))
        through_cluster = cluster.decode([mlaserve.latent_query(
            s, 1, q, append_rows=row, append_position=at) for s, q, row, at in appended])
        on_one = reference_server.decode([mlaserve.latent_query(
            "ref-" + s, 1, q, append_rows=row, append_position=at) for s, q, row, at in appended])
        check(all(same_bits(a.out, b.out) and same_bits(a.lse, b.lse)
                  for a, b in zip(through_cluster, on_one)),
              "decode with appends through the cluster differs from one server's")

        # 4b. Moves (MigrateSequences): a sequence on the prefix and an FP8 one, moved by their
        # servers to the next server; the cluster client follows without being told.
        mover = mlaserve.ClusterClient(etcd.endpoint(), cluster=CLUSTER, max_attempts=1)
        clients.append(mover)
        check_moves(mover, address_of, instance_of, info.model, system, bf16, check, log)
        mover.close()  # (its membership thread would count in section 6's warnings)

        # 5. Context parallel: parts of 16 tokens after an 8-token prefix, each part on
        # another server; decodes merged by LSE against fp64 attention.
        part_tokens, prefix_tokens = 16, 8
        cp = mlaserve.ClusterClient(etcd.endpoint(), cluster=CLUSTER,
                                    context_part_tokens=part_tokens)
        clients.append(cp)
        cp_prefix = bf16((LAYERS, prefix_tokens, width), 0.1)
        cp.register_prefix("cp-sys", cp_prefix)
        cp.create_sequence("cp", prefix_id="cp-sys")
        kv = [mlaserve.bf16_bits_to_float(cp_prefix[layer]) for layer in range(LAYERS)]
        # Layer 0 up to one short of part 2 in one append (cut at the part 0/1 boundary);
        # layer 1 to one past part 0's end.
        for layer, end in ((0, prefix_tokens + 2 * part_tokens - 1),
                           (1, prefix_tokens + part_tokens + 1)):
            rows = bf16((end - prefix_tokens, width), 0.1)
            cp.append_kv("cp", layer, prefix_tokens, rows)
            kv[layer] = np.concatenate([kv[layer], mlaserve.bf16_bits_to_float(rows)])
        parts = cp.parts_of("cp")
        check(len(parts) == 2 and parts[0][1] != parts[1][1] and
              [p[2:] for p in parts] == [(0, 24), (24, 40)], f"two parts: {parts}")

        ref_server = address_of[parts[0][1]][1]
        ref_server.register_prefix("ref-cp-sys", cp_prefix)
        ref_server.create_sequence("ref-cp", prefix_id="ref-cp-sys")
        for layer in range(LAYERS):
            ref_server.append_kv("ref-cp", layer, prefix_tokens,
                                 mlaserve.float_to_bf16_bits(kv[layer][prefix_tokens:]))

        worst = {"out": 0.0, "lse": 0.0}

        def cp_case(name, layer, sq, append=0, output_dtype="fp32"):
            q = bf16((sq, heads, width))
            rows = bf16((append, width), 0.1) if append else None
            position = len(kv[layer]) if append else None
            [answer] = cp.decode([mlaserve.latent_query("cp", layer, q, append_rows=rows,
                                                        append_position=position)],
                                 output_dtype=output_dtype)
            if append:
                kv[layer] = np.concatenate([kv[layer], mlaserve.bf16_bits_to_float(rows)])
                ref_server.append_kv("ref-cp", layer, position, rows)
            out, lse = reference(mlaserve.bf16_bits_to_float(q), kv[layer], scale)
            if output_dtype == "fp32":
                worst["out"] = max(worst["out"], float(np.abs(answer.out - out).max()))
                worst["lse"] = max(worst["lse"], float(np.abs(answer.lse - lse).max()))
                problem = close(answer.out, out, OUT_TOLERANCE)
                check(problem is None, f"context parallel {name}: out {problem}")
                problem = close(answer.lse, lse, LSE_TOLERANCE)
                check(problem is None, f"context parallel {name}: lse {problem}")
                [single] = ref_server.decode([mlaserve.latent_query("ref-cp", layer, q)],
                                             output_dtype="fp32")
                problem = close(answer.out, single.out, OUT_TOLERANCE)
                check(problem is None, f"context parallel {name} against one server: {problem}")
            else:  # the merged fp32 values rounded to bf16, to nearest even
                [wide] = cp.decode([mlaserve.latent_query("cp", layer, q)], output_dtype="fp32")
                check(same_bits(answer.out, mlaserve.round_to_bf16(wide.out)) and
                      same_bits(answer.lse, wide.lse), f"context parallel {name}: bf16 out")
            check(answer.out.shape == (sq, heads, 512) and answer.lse.shape == (sq, heads),
                  f"context parallel {name}: shapes {answer.out.shape} {answer.lse.shape}")
            check(answer.plan.formulation != 0, f"context parallel {name}: no plan")
            return answer

        cp_case("sq 1 on two parts", 0, 1)
        cp_case("sq 2 within part 1", 0, 2)
        cp_case("sq 2 straddling parts 0 and 1", 1, 2)
        cp_case("sq 1, bf16 out", 1, 1, output_dtype="bf16")
        # The append opens part 2 (on the third server); the two tokens straddle parts 1/2.
        cp_case("sq 2 appending across parts 1 and 2", 0, 2, append=2)
        parts = cp.parts_of("cp")
        check(len(parts) == 3 and len({p[1] for p in parts}) == 3 and parts[2][2:] == (40, 56),
              f"three parts on three servers: {parts}")
        cp_case("sq 1 on three parts", 0, 1)
        cp_case("sq 2 on three parts", 0, 2)
        cp_case("sq 1 on layer 1 (two parts)", 1, 1, append=1)
        print(f"context parallel against fp64: worst out error {worst['out']:.1e}, "
              f"lse {worst['lse']:.1e}")
        # A part moved by its server (named "cp@pK" there) to the second prefix holder (which
        # keeps its own part, for section 7): followed, the merged answers unchanged.
        q = [mlaserve.latent_query("cp", layer, bf16((2, heads, width))) for layer in (0, 1)]
        unmoved = cp.decode(q, output_dtype="fp32")
        index, (sub_id, address, _, _) = next(
            (i, p) for i, p in enumerate(cp.parts_of("cp")) if i > 0 and p[1] != second)
        with mlaserve.Client(address) as source:
            moved = source.migrate_sequences(second, sequence_ids=[sub_id])
        check(moved.sequences == 1 and moved.prefixes == 0, f"moved part {sub_id}: {moved}")
        check(all(np.array_equal(a.out, b.out) and np.array_equal(a.lse, b.lse)
                  for a, b in zip(cp.decode(q, output_dtype="fp32"), unmoved)),
              f"context-parallel decode after moving part {sub_id} differs")
        check(cp.parts_of("cp")[index][1] == second, f"part {sub_id} not followed to {second}: "
              f"{cp.parts_of('cp')}")

        # 5b. mlaserve-ctl drain of a fourth server holding a cluster client's sequences.
        check_drain(etcd, ctl, start_server, address_of, bf16, check, log)

        # 6. etcd stopped: stale, the last membership kept, decodes go on; restarted: fresh.
        before = [m["instance_id"] for m in cluster.members()]
        etcd.stop()
        check(bool(wait_for(lambda: cluster.stale, 10)), "not stale with etcd stopped")
        check([m["instance_id"] for m in cluster.members()] == before,
              "the membership changed while etcd was away")
        answers = cluster.decode([mlaserve.latent_query(s, layer, q) for s, layer, q in latent])
        check(len(answers) == len(latent), "decode while etcd is away")
        [answer] = cp.decode([mlaserve.latent_query("cp", 0, bf16((1, heads, width)))])
        check(np.isfinite(answer.lse).all(), "context-parallel decode while etcd is away")
        etcd.start()
        check(bool(wait_for(lambda: not any(c.stale for c in (cluster, cp, huge)), 15)),
              "still stale after etcd came back")
        check(bool(wait_for(lambda: len(cluster.members()) == 3, 15)),
              f"members after etcd came back: {cluster.members()}")
        unreachable = [m for m in log.messages if "unreachable" in m]
        check(len(unreachable) == 3, f"one warning per client while etcd was away: {unreachable}")
        check(len([m for m in log.messages if "answers again" in m]) == 3,
              f"'answers again' per client: {log.messages}")

        # 7. kill -9 of the second prefix holder: once its key is gone, calls for its
        # sequences fail at once naming it; the others answer; releasing forgets them.
        victim_server, victim_client = address_of[second]
        victim = instance_of[second]
        lost = [s for s in ids if cluster.server_of(s) == second]
        kept = [s for s in ids if cluster.server_of(s) != second]
        victim_server.process.kill()
        victim_server.process.wait()
        killed = time.monotonic()
        check(bool(wait_for(lambda: victim not in {m["instance_id"] for m in cluster.members()}
                            and victim not in {m["instance_id"] for m in cp.members()}, 15)),
              "the killed server is still a member")
        print(f"killed server left the membership after {time.monotonic() - killed:.1f} s "
              "(lease 3 s)")
        q = bf16((1, heads, width))
        took = expect_error(lambda: cluster.decode([mlaserve.latent_query(lost[0], 0, q)]),
                            grpc.StatusCode.UNAVAILABLE, second, victim, lost[0], CLUSTER)
        check(took < 0.5, f"a call for a lost sequence took {took:.2f} s")
        print(f"a decode for a sequence on the killed server failed after {took * 1e3:.1f} ms")
        expect_error(lambda: cluster.append_kv(lost[0], 0, 999, bf16((1, width))),
                     grpc.StatusCode.UNAVAILABLE, second)
        expect_error(lambda: cluster.decode([mlaserve.latent_query(s, 0, q) for s in ids]),
                     grpc.StatusCode.UNAVAILABLE, second)
        expect_error(lambda: cp.decode([mlaserve.latent_query("cp", 0, q)]),
                     grpc.StatusCode.UNAVAILABLE, second, "'cp'")
        answers = cluster.decode([mlaserve.latent_query(s, 0, q) for s in kept])
        check(len(answers) == len(kept) and all(np.isfinite(a.lse).all() for a in answers),
              "the other servers' sequences answer")
        cluster.release_sequence(lost[0])
        expect_error(lambda: cluster.server_of(lost[0]), grpc.StatusCode.NOT_FOUND, lost[0])
        cp.release_sequence("cp")
        # New sequences go to the two servers left.
        cluster.create_sequence("after-kill")
        check(cluster.server_of("after-kill") != second, "placed on a dead server")

        # 7b. A server stopped (SIGTERM: its key removed, its KV state saved) and started again
        # on its port with its --state_dir, as systemd restarts one: a new instance at the old
        # address. While it is away its sequences fail at once; once it is back the cluster
        # client calls it for them, and they answer bit for bit as before.
        back = cluster.server_of(kept[0])
        back_server, back_client = address_of[back]
        gone = instance_of[back]
        mine = [s for s in kept if cluster.server_of(s) == back]
        q_back = [mlaserve.latent_query(s, 1, bf16((2, heads, width))) for s in mine]
        before = cluster.decode(q_back, output_dtype="fp32")
        stopping = time.monotonic()
        back_server.process.terminate()
        check(bool(wait_for(lambda: gone not in {m["instance_id"] for m in cluster.members()},
                            10)), "the stopped server is still a member")
        took = expect_error(lambda: cluster.decode(q_back[:1]), grpc.StatusCode.UNAVAILABLE,
                            back, gone, "left cluster")
        check(took < 0.5, f"a call for a stopped server's sequence took {took:.2f} s")
        check(back_server.process.wait(timeout=30) == 0, "the stopped server's exit code")
        back_server, _, _ = start_server(target=back)
        address_of[back] = (back_server, back_client)
        instance_of[back] = back_client.server_info().state.instance_id
        state = back_client.server_info().state
        check(state.restored_from_instance_id == gone and state.instance_id != gone,
              f"restarted: instance {state.instance_id}, restored from "
              f"{state.restored_from_instance_id}, expected {gone}")
        check(bool(wait_for(lambda: back in {m["address"] for m in cluster.members()}, 10)),
              "the restarted server is no member")
        again = cluster.decode(q_back, output_dtype="fp32")
        check(all(same_bits(a.out, b.out) and same_bits(a.lse, b.lse)
                  for a, b in zip(again, before)),
              "decode after the restart differs from before")
        print(f"{len(mine)} sequences answered as before after their server restarted "
              f"({time.monotonic() - stopping:.2f} s from SIGTERM)")
        cluster.release_sequence(mine[-1])
        check(mine[-1] not in {x.sequence.sequence_id for x in back_client.list_sequences()},
              "a sequence released through the cluster client is still on the restarted "
              "server")

        # 8. etcd over TLS requiring client certificates: the read and the watch over HTTPS
        # (a record written there shows up), and a client without a certificate refused.
        pki = os.path.join(directory, "pki")
        tls_dir = os.path.join(directory, "tls")
        os.makedirs(pki)
        os.makedirs(tls_dir)
        make_pki(pki)
        tls_etcd = Etcd(args.etcd, tls_dir, PREFIX, pki=pki)
        etcd.stop()
        etcd = tls_etcd
        etcd.start()
        secure = mlaserve.ClusterClient(etcd.endpoint(), cluster=CLUSTER,
                                        etcd_ca=f"{pki}/ca.pem", etcd_cert=f"{pki}/client.pem",
                                        etcd_key=f"{pki}/client.key")
        clients.append(secure)
        check(secure.members() == [] and not secure.stale, "an empty TLS membership")
        record = {"instance_id": "tls-1", "address": "127.0.0.1:1", "model": {"name": "x"},
                  "kv_budget_bytes": 1, "load": {"kv_used_bytes": 0}}
        etcd.put(PREFIX + "tls-1", json.dumps(record))
        seen = wait_for(lambda: secure.members(), 10)
        check(seen == [record], f"a record written in the TLS etcd: {seen}")
        expect_error(lambda: mlaserve.ClusterClient(etcd.endpoint(), cluster=CLUSTER,
                                                    etcd_ca=f"{pki}/ca.pem", etcd_timeout_s=1.0),
                     grpc.StatusCode.UNAVAILABLE, etcd.endpoint())
    except Exception as error:  # a failure to report, with the logs
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        for client in clients:
            try:
                client.close()
            except Exception:
                pass
        for server in servers:
            server.stop()
        if etcd.process is not None:
            etcd.stop()
        shutil.rmtree(directory, ignore_errors=True)
        logging.getLogger("mlaserve.cluster").removeHandler(log)

    if failures:
        for server in servers:
            print("".join(server.log[-20:]), file=sys.stderr)
        for failure in failures:
            print("FAIL:", failure, file=sys.stderr)
        print(f"0 passed, {len(failures)} failed")
        return 1
    print(f"cluster_client_py_test: 1 passed, 0 failed ({time.time() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
