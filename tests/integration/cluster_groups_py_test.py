"""Placement groups through mlaserve.ClusterClient (docs/cluster.md, "Placement groups"),
against a real etcd (Debian's, on loopback, its data in a directory the test removes) and
three servers registered in it: place_group case by case (the bound, prefix holders first,
one order whatever the candidates' order, the least loaded past the bound, no room); six
ranks with a client each placing at once end two a server, each rank whole; one client for
six ranks (placement_group_of) likewise; a group's claim follows its sequences and goes with
the client; and C++ and Python clients of one cluster see each other's groups: three ranks
placed by mlaserve-loadgen's C++ cluster clients, three by Python clients, two a server.

    /usr/bin/python3 tests/integration/cluster_groups_py_test.py \\
        --server build/bin/mlaserve-server --loadgen build/bin/mlaserve-loadgen \\
        --etcd /usr/bin/etcd   (PYTHONPATH=build/python)
"""

import argparse
import collections
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
from harness import Server, free_port, report
from mlaserve.cluster import ClusterError, PlacementCandidate
from mlaserve.placement import place_group

CLUSTER = "py-groups-test"
PREFIX = f"/mlaserve/{CLUSTER}/servers/"
LAYERS = 2
RANKS = 6
PER_RANK = 4


def check_place_group(check):
    def c(name, load=0, prefix_group=-1, free=1 << 30):
        return PlacementCandidate(name, free, 0, prefix_group, load, load)

    servers = [c("a"), c("b"), c("c")]
    firsts = collections.Counter()
    for g in range(60):
        name = f"client/rank{g}"
        chosen = place_group(servers, name, 1, 1, 1)[0]
        check(chosen == place_group(servers[::-1], name, 1, 1, 1)[0],
              f"{name}: the order depends on the candidates' order")
        firsts[chosen] += 1
    check(len(firsts) == 3 and min(firsts.values()) >= 8, f"groups do not spread: {firsts}")
    loaded = [c("a", 130), c("b", 65), c("c", 0)]
    check(all(place_group(loaded, f"g{g}", 65, 65, 1)[0] == "c" for g in range(20)),
          "a server past the bound was chosen")
    large = [c("a", 10), c("b", 10), c("c", 40)]
    check(all(place_group(large, f"g{g}", 100, 100, 1)[0] != "c" for g in range(20)),
          "a group too large for the bound did not go to the least loaded")
    holders = [c("a"), c("b", prefix_group=3), c("c")]
    check(all(place_group(holders, f"g{g}", 65, 65, 1, 4, True) == ("b", False)
              for g in range(20)), "the prefix's holder lost within the bound")
    holders = [c("a"), c("b", 65, prefix_group=3), c("c")]
    chosen = place_group(holders, "g", 65, 65, 1, 4, True)
    check(chosen[0] != "b" and chosen[1], f"past the bound the holder won: {chosen}")
    full = [c("a", free=0), c("b", free=0)]
    try:
        place_group(full, "g", 1, 1, 5)
        check(False, "no room: no error")
    except ClusterError as error:
        check(error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "5 bytes" in error.message,
              f"no room: {error}")
    check(place_group([c("a"), c("b"), c("c")], "g", 5, 5, 1, exclude={"a", "c"})[0] == "b",
          "an excluded server was chosen")


def ranks_per_server(client_of_rank, check):
    """{address: ranks on it}, failing a rank whose sequences are on several servers."""
    per_server = collections.Counter()
    for r, client in enumerate(client_of_rank):
        on = {client.server_of(f"run/r{r}/s{s}") for s in range(PER_RANK)}
        check(len(on) == 1, f"rank {r} split over {on}")
        per_server[min(on)] += 1
    return per_server


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--loadgen", required=True)
    parser.add_argument("--etcd", required=True)
    args = parser.parse_args()
    began = time.time()
    failures = []
    directory = tempfile.mkdtemp(prefix="mlaserve-cluster-groups-test-")
    etcd = Etcd(args.etcd, directory, PREFIX)
    servers = []
    opened = []

    def check(condition, message):
        if not condition:
            failures.append(message)
        return condition

    def connect(**kwargs):
        client = mlaserve.ClusterClient(etcd.endpoint(), cluster=CLUSTER,
                                        expected_sequence_tokens=256, spread_group=100, **kwargs)
        opened.append(client)
        return client

    def start_server():
        server = Server(args.server, [
            f"--listen=127.0.0.1:{free_port()}", "--metrics_listen=", f"--layers={LAYERS}",
            "--devices=1", "--kv_budget=64MiB", f"--etcd_endpoints={etcd.endpoint()}",
            f"--cluster={CLUSTER}", "--etcd_lease_ttl_s=3"])
        servers.append(server)
        if not server.ready(60):
            raise RuntimeError("a server did not become ready: " + "".join(server.log))

    try:
        check_place_group(check)
        etcd.start()
        for _ in range(3):
            start_server()
        if not wait_for(lambda: len(etcd.members()) == 3, 30):
            raise RuntimeError("the servers did not all register")
        rng = np.random.default_rng()

        # Six ranks, a client each, placing at once.
        clients = [connect() for _ in range(RANKS)]
        model = clients[0]._cluster_model()
        prompt = rng.standard_normal((model.layers, 16, model.dl + model.dr)).astype(np.float32)
        errors = []

        def rank(r):
            try:
                clients[r].register_prefix("system", prompt)
                for s in range(PER_RANK):
                    clients[r].create_sequence(f"run/r{r}/s{s}", "system", placement_group="rank")
            except Exception as error:  # noqa: BLE001 (reported below)
                errors.append(f"rank {r}: {error!r}")
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(RANKS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(not errors, f"ranks failed: {errors}")
        if not errors:
            spread = ranks_per_server(clients, check)
            check(sorted(spread.values()) == [2, 2, 2], f"a client per rank: {dict(spread)}")
            loads = clients[0].group_table.loads()
            check(len(loads) == 3 and len({w for w, _ in loads.values()}) == 1,
                  f"claims not even: {loads}")
        for client in clients:
            client.close()
        opened.clear()
        check(wait_for(lambda: not connect(placement_groups=False)._etcd.range_prefix(
            f"/mlaserve/{CLUSTER}/groups/")[1], 10), "closed clients' claims stayed in etcd")

        # One client for six ranks, sequences interleaved as ranks that start together.
        shared = connect(placement_group_of=lambda i: i.rpartition("/")[0])
        shared.register_prefix("system", prompt)
        for s in range(PER_RANK):
            for r in range(RANKS):
                shared.create_sequence(f"run/r{r}/s{s}", "system")
        spread = ranks_per_server([shared] * RANKS, check)
        check(sorted(spread.values()) == [2, 2, 2], f"one client for every rank: {dict(spread)}")
        check(shared.rebalance()["groups_moved"] == 0, "a balanced cluster was rebalanced")
        q = rng.standard_normal((1, model.heads, model.dl + model.dr)).astype(np.float32)
        answers = shared.decode([mlaserve.latent_query(f"run/r3/s{s}", 0, q)
                                 for s in range(PER_RANK)])
        check(len(answers) == PER_RANK, "a rank's decode")

        # A claim follows its sequences: weight 3 for 3 prefix-less ones, 2, then gone.
        observer = connect()
        for s in range(3):
            shared.create_sequence(f"g/s{s}", placement_group="batch-0")
        name, instance = shared.group_of("g/s0")
        check(shared.group_of("g/s2")[0] == name, "one group's sequences in two groups")
        before = observer.group_table.loads()[instance][0]
        shared.release_sequence("g/s0")
        check(observer.group_table.loads()[instance][0] == before - 1,
              "a released sequence did not lower its group's claim")
        shared.release_sequence("g/s1")
        shared.release_sequence("g/s2")
        check(observer.group_table.loads()[instance][0] == before - 3,
              "the last sequence's release left its group's claim")
        check(shared.group_of("run/r0/s0") is not None, "a prefix sequence in no group")
        shared.create_sequence("alone")
        check(shared.group_of("alone") is None, "a sequence without prefix or group in one")

        # A fourth server joins under load: rebalancing moves it its share, no call fails.
        failed, calls, stop = [], [0], threading.Event()

        def load():
            while not stop.is_set():
                for r in range(RANKS):
                    try:
                        shared.decode([mlaserve.latent_query(f"run/r{r}/s{s}", 0, q)
                                       for s in range(PER_RANK)])
                    except Exception as error:  # noqa: BLE001 (every failure is reported)
                        failed.append(repr(error))
                    calls[0] += 1
        loader = threading.Thread(target=load)
        loader.start()
        try:
            start_server()
            check(wait_for(lambda: len(shared.members()) == 4, 30), "the fourth did not join")
            moved = shared.rebalance()
            time.sleep(0.2)
        finally:
            stop.set()
            loader.join()
        check(not failed and calls[0] > 0, f"calls failed while groups moved: {failed[:3]}")
        check(moved["groups_moved"] >= 1 and moved["sequences_moved"] >= PER_RANK,
              f"nothing moved to the new server: {moved}")
        spread = ranks_per_server([shared] * RANKS, check)
        check(len(spread) == 4 and max(spread.values()) == 2,
              f"after the join: {dict(spread)}")
        check(shared.rebalance()["groups_moved"] == 0, "a second pass moved groups again")
        shared.close()
        servers.pop().stop()  # three servers again for the last part
        if not wait_for(lambda: len(etcd.members()) == 3, 30):
            raise RuntimeError("the fourth server did not leave")
        observer.close()
        opened.clear()

        # C++ and Python clients in one cluster: mlaserve-loadgen's three ranks (a C++ cluster
        # client each) place their groups; three Python ranks then place theirs.
        loadgen = subprocess.Popen([
            args.loadgen, "--etcd_endpoints", etcd.endpoint(), f"--cluster={CLUSTER}",
            "--client_per_rank", "--workers=3", "--sequences=4", "--prefix-tokens=16",
            "--context-tokens=4", "--duration-s=20", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            watcher = connect()
            check(wait_for(lambda: len(watcher.group_table.loads()) == 3 and
                           sum(w for w, _ in watcher.group_table.loads().values()) >= 3, 30),
                  f"the C++ ranks' claims did not show: {watcher.group_table.loads()}")
            cpp = watcher.group_table.loads()
            python = [connect() for _ in range(3)]
            for r, client in enumerate(python):
                client.register_prefix("system", prompt)
                client.create_sequence(f"py/r{r}/s0", "system", placement_group="rank")
            placed = collections.Counter(c.group_of(f"py/r{r}/s0")[1]
                                         for r, c in enumerate(python))
            check(sorted(placed.values()) == [1, 1, 1] and len(cpp) == 3,
                  f"C++ claims {cpp}, Python groups then {dict(placed)}")
        finally:
            loadgen.terminate()
            loadgen.wait(timeout=30)
    except Exception as error:  # noqa: BLE001 (the test reports, then cleans up)
        failures.append(f"{type(error).__name__}: {error}")
    finally:
        for client in opened:
            client.close()
        for server in servers:
            server.stop()
        etcd.stop()
        shutil.rmtree(directory, ignore_errors=True)
    return report(failures, began)


if __name__ == "__main__":
    sys.exit(main())
