"""The placement groups of every client of a cluster, in etcd (cluster/group_table.h; docs/
cluster.md, "Placement groups"): the same keys, values and compare-and-swap as the C++
client's, so that Python and C++ clients of one cluster see each other's groups."""

import json
import logging
import random
import threading
import time

import grpc

from mlaserve.errors import ClusterError

_log = logging.getLogger("mlaserve.cluster")
_CLAIM_ROUNDS = 32


def groups_prefix(cluster):
    return f"/mlaserve/{cluster}/groups/"


def _guard_key(cluster):
    return f"/mlaserve/{cluster}/placement-guard"


def parse_claim(value):
    """(instance_id, weight, bytes) of a claim's JSON; ValueError naming the field."""
    claim = json.loads(value)
    if not isinstance(claim, dict):
        raise ValueError("group claim: not a JSON object")
    instance = claim.get("instance_id")
    if not isinstance(instance, str) or not instance:
        raise ValueError("group claim: instance_id is missing or not a string")
    for field in ("weight", "bytes"):
        if not isinstance(claim.get(field), int) or isinstance(claim.get(field), bool) or \
                claim[field] < 0:
            raise ValueError(f"group claim: {field} is missing or not a count >= 0")
    return instance, claim["weight"], claim["bytes"]


def sum_claims(prefix, pairs, skip=None):
    """{instance id: [weight, bytes]} over the claims under prefix; `skip`: the key of the
    claim being replaced."""
    loads = {}
    for key, value in pairs:
        if key == skip or "/" not in key[len(prefix):]:
            continue
        try:
            instance, weight, nbytes = parse_claim(value)
        except ValueError:
            continue  # another version's or a stranger's key: not a load
        load = loads.setdefault(instance, [0, 0])
        load[0] += weight
        load[1] += nbytes
    return loads


class GroupTable:
    """This client's group claims under its own id, on a lease kept alive by a thread (a
    client that dies loses them within lease_ttl_s; close() revokes them at once)."""

    def __init__(self, etcd, cluster, lease_ttl_s=10):
        self._etcd = etcd
        self._cluster = cluster
        self._ttl = max(2, int(lease_ttl_s))
        self.client_id = "c%016x" % random.SystemRandom().randint(1, (1 << 64) - 1)
        self._lock = threading.Lock()
        self._own = {}  # group -> (instance, weight, bytes)
        self.contended = 0
        try:
            self._lease = etcd.grant_lease(self._ttl)
        except OSError as error:
            raise ClusterError(grpc.StatusCode.UNAVAILABLE, (
                f"cluster '{cluster}': no lease for placement groups from etcd: {error}")) from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_alive, daemon=True,
                                        name="mlaserve-groups-lease")
        self._thread.start()

    def _key(self, group):
        return f"{groups_prefix(self._cluster)}{self.client_id}/{group}"

    @staticmethod
    def _value(instance, weight, nbytes):
        return json.dumps({"instance_id": instance, "weight": weight, "bytes": nbytes})

    def _keep_alive(self):
        while not self._stop.wait(self._ttl / 3):
            with self._lock:
                try:
                    if not self._etcd.keep_alive(self._lease):
                        self._lease = self._etcd.grant_lease(self._ttl)
                        _log.warning("cluster '%s': the placement groups' lease had expired; "
                                     "%d claims written again", self._cluster, len(self._own))
                        for group, claim in self._own.items():
                            self._etcd.put(self._key(group), self._value(*claim), self._lease)
                except OSError as error:
                    _log.warning("cluster '%s': placement groups' lease: %s", self._cluster,
                                 error)

    def claim(self, group, weight, nbytes, choose):
        """Claims `group` with weight and bytes on the instance choose(loads) picks, loads
        being {instance: [weight, bytes]} of every other claim as of one revision; written
        only if no client claimed a group since (else read again). ClusterError ABORTED after
        32 lost rounds; the chooser's errors as they are."""
        prefix = groups_prefix(self._cluster)
        with self._lock:
            for round_ in range(_CLAIM_ROUNDS):
                revision, pairs = self._etcd.range_prefix(prefix)
                pairs = [(k, v.decode(errors="replace")) for k, v in pairs]
                instance = choose(sum_claims(prefix, pairs, skip=self._key(group)))
                if self._etcd.put_if_unchanged_since(
                        _guard_key(self._cluster), revision,
                        [(self._key(group), self._value(instance, weight, nbytes))],
                        self._lease):
                    self._own[group] = (instance, weight, nbytes)
                    return instance
                self.contended += 1
                time.sleep(random.uniform(0, 0.0005 * (round_ + 1)))
        raise ClusterError(grpc.StatusCode.ABORTED, (
            f"cluster '{self._cluster}': placing group '{group}' lost {_CLAIM_ROUNDS} rounds to "
            "other clients placing at once"))

    def update(self, group, weight, nbytes):
        with self._lock:
            instance = self._own[group][0]
            self._etcd.put(self._key(group), self._value(instance, weight, nbytes), self._lease)
            self._own[group] = (instance, weight, nbytes)

    def drop(self, group):
        with self._lock:
            if self._own.pop(group, None) is not None:
                self._etcd.delete(self._key(group))

    def loads(self):
        """{instance id: [weight, bytes]} of every client's claims, as of now."""
        prefix = groups_prefix(self._cluster)
        _, pairs = self._etcd.range_prefix(prefix)
        return sum_claims(prefix, [(k, v.decode(errors="replace")) for k, v in pairs])

    def close(self):
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            try:
                self._etcd.revoke(self._lease)
            except OSError:
                pass  # etcd gone: the lease expires on its own
            self._own.clear()
