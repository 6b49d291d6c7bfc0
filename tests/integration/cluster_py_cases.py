"""The cases cluster_client_py_test runs, by concept: the fp64 reference and bit-for-bit
comparisons, the placement rule on hand-made candidates, sequences moved by their servers
(MigrateSequences) and a drain by mlaserve-ctl, each against the live cluster the test
starts."""

import base64
import json
import logging
import subprocess
import threading
import time

import grpc
import numpy as np

import mlaserve
from etcd_harness import wait_for
from harness import free_port
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
