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
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time

import grpc
import numpy as np

import mlaserve
from cluster_py_cases import (CLUSTER, LAYERS, LSE_TOLERANCE, OUT_TOLERANCE, PREFIX, LogLines,
                              check_drain, check_moves, check_placement_rule, reference,
                              same_bits)
from etcd_harness import Etcd, wait_for
from harness import Server, close, free_port, make_pki


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
