"""A client of a cluster of mlaserve servers that find each other through etcd.

    import mlaserve
    with mlaserve.ClusterClient("10.0.0.5:2379", cluster="prod") as cluster:
        cluster.register_prefix("system", latent)          # [layers, tokens, dl + dr]
        cluster.create_sequence("req-1", prefix_id="system")
        cluster.append_kv("req-1", 0, prefix_tokens, rows)
        [result] = cluster.decode([mlaserve.latent_query("req-1", 0, q)])

The membership is the servers' records under /mlaserve/CLUSTER/servers/ (docs/cluster.md,
"The record"), read through etcd's JSON gateway (its v3 API over HTTP/1.1: POST
/v3/kv/range and the streaming /v3/watch), so no etcd package is needed. The client places
each new sequence by the cluster's rule (prefix affinity, then capacity; docs/cluster.md,
"Placement", the same rule as cluster/placement.h), remembers the server, and sends every
later call for the sequence straight to it. With context_part_tokens > 0 a sequence is cut
by position into parts on different servers and a decode over several parts is merged by
LSE (context parallelism). A sequence a server moved to another member (MigrateSequences,
mlaserve-ctl drain) is followed there without the caller noticing, also once a drained server
has stopped.
"""

import collections
import concurrent.futures
import logging
import math
import random
import threading
import time

import grpc
import numpy as np

from mlaserve.client import Client
from mlaserve.cluster_decode import _Decode
from mlaserve.cluster_groups import _Groups
from mlaserve.cluster_membership import _MOVING_OUT, _Membership
from mlaserve.cluster_routing import _Part, _Routing, _ServerStopped
from mlaserve.errors import ClusterError
from mlaserve.etcd import Etcd
from mlaserve.group_table import GroupTable
from mlaserve.placement import PlacementCandidate, place_sequence  # noqa: F401
from mlaserve.v1 import tensor_pb2

_log = logging.getLogger("mlaserve.cluster")

_KV_DTYPE_NAMES = {tensor_pb2.KV_DTYPE_BF16: "bf16", tensor_pb2.KV_DTYPE_FP8: "fp8"}

# A new sequence refused UNAVAILABLE (its server leaving the cluster in a drain, or gone), or
# CANCELLED by a drained server as it stops, is placed again on another server, this many
# placements in all (as the C++ client's CreateSequence).
_CREATE_ATTEMPTS = 3
_MOVED_OUT_REMEMBERED = 64  # the latest instances that left moving out


class _Prefix:
    def __init__(self, prefix_id, latent, kv_dtype):
        self.prefix_id = prefix_id
        self.latent = latent
        self.kv_dtype = kv_dtype
        self.tokens = int(latent.shape[1]) if latent.ndim == 3 else 0
        self.holders = {}  # instance id -> live sequences this client placed on it there
        self.lock = threading.Lock()  # placement and registration of its sequences


class _Sequence:
    def __init__(self, sequence_id, prefix, kv_dtype, layers):
        self.sequence_id = sequence_id
        self.prefix = prefix  # _Prefix or None
        self.prefix_tokens = prefix.tokens if prefix is not None else 0
        self.requested_kv_dtype = kv_dtype
        self.kv_dtype = kv_dtype  # the effective one once created ("bf16"/"fp8")
        self.parts = []
        self.lengths = [self.prefix_tokens] * layers  # tokens per layer, as appended here
        self.lock = threading.Lock()  # opening parts
        self.group = None  # its placement group's name


class ClusterClient(_Membership, _Routing, _Groups, _Decode):
    """Places sequences on the members of an mlaserve cluster and routes each call to the
    server holding its sequence. Thread-safe; one per process is enough."""

    def __init__(self, etcd_endpoints, cluster="default", etcd_ca=None, etcd_cert=None,
                 etcd_key=None, context_part_tokens=0, expected_sequence_tokens=2048,
                 spread_group=None, etcd_timeout_s=5.0, placement_groups=True,
                 load_slack=0.15, placement_group_of=None, group_lease_ttl_s=10,
                 rebalance_interval_s=0, **client_kwargs):
        """etcd_endpoints: "host:port[,host:port...]" or a list; etcd_ca/cert/key: PEM files
        for an etcd serving TLS (and requiring client certificates). context_part_tokens: C >
        0 cuts each sequence into parts of C tokens (the first also holds its prefix) on
        different servers. expected_sequence_tokens: the room placement asks for a new
        sequence. spread_group: a prefix's group on one server beyond which its sequences
        go to another server; None: 2 x ceil(TyphoonMLA's B_theta for sq 1) from the
        servers' GetServerInfo (a group stays above B_theta, and so hybrid, while its
        sequences come and go), 0: never spread while a holder has room. etcd_timeout_s
        bounds the first read of the membership (ClusterError UNAVAILABLE naming the endpoints
        past it) and every later etcd request. placement_groups: a new sequence on a prefix,
        or in a placement group (create_sequence's placement_group, else
        placement_group_of(sequence_id) when given: a rank, say), joins its group's server;
        a new group is claimed in etcd against every client's claims (C++ clients' too) and
        placed within (1 + load_slack) of the mean load (docs/cluster.md, "Placement
        groups"); False: each client places alone. rebalance_interval_s > 0: a thread calls
        rebalance() that often. client_kwargs go to every mlaserve.Client.
        Each client draws its own random order among equally roomy servers (tie_break), so
        clients started together do not all place on one server."""
        self._etcd = Etcd(etcd_endpoints, etcd_ca, etcd_cert, etcd_key, etcd_timeout_s)
        self.cluster = cluster
        self._prefix = f"/mlaserve/{cluster}/servers/"
        self._context_part_tokens = int(context_part_tokens)
        if self._context_part_tokens < 0:
            raise ValueError("context_part_tokens must be >= 0")
        self._expected_tokens = int(expected_sequence_tokens)
        self._spread_group = spread_group
        self._client_kwargs = client_kwargs

        self._lock = threading.RLock()
        self._members = {}  # etcd key -> record
        self._by_instance = {}  # instance id -> record
        # Instances whose key went while their record said "moving-out", the latest first out.
        self._moved_out = collections.deque(maxlen=_MOVED_OUT_REMEMBERED)
        self._revision = 0
        self._stale = False
        self._changes = 0
        # instance id -> (the record's load.updated_unix_ms, bytes, sequences) placed there
        # by this client since that record was written
        self._reserved = {}
        # This client's order among equally roomy servers (random: clients started together
        # spread out), as the C++ client's.
        self._tie_break = random.SystemRandom().randint(1, (1 << 64) - 1)
        self._clients = {}  # instance id -> Client
        self._infos = {}  # instance id -> GetServerInfoResponse
        self._model = None  # the cluster's ModelInfo (the first server asked)
        self._prefixes = {}
        self._sequences = {}
        self._load_slack = float(load_slack)
        self._group_floor = 1  # ceil(B_theta) for sq 1, once a server has told it
        self._placement_group_of = placement_group_of
        self._groups = {}  # group name -> _Group
        self._open_group = {}  # (prefix, hint) name -> number of its group taking new ones
        self._group_lock = threading.Lock()  # placement of grouped sequences, one at a time
        self._claims_lock = threading.Lock()  # a group's count and its claim's write
        self._stop = threading.Event()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=16,
                                                           thread_name_prefix="mlaserve-cluster")

        deadline = time.monotonic() + etcd_timeout_s
        while True:
            try:  # each try within what is left of the bound
                self._etcd.timeout = max(0.1, deadline - time.monotonic())
                self._read_all()
                break
            except OSError as error:
                if time.monotonic() + 0.1 >= deadline:
                    raise ClusterError(grpc.StatusCode.UNAVAILABLE, (
                        f"etcd at {','.join(self._etcd.endpoints)} did not answer within "
                        f"{etcd_timeout_s:g} s ({error}); cluster '{cluster}' unknown")) from None
                time.sleep(0.1)
            finally:
                self._etcd.timeout = etcd_timeout_s
        self._thread = threading.Thread(target=self._run, name="mlaserve-cluster-watch",
                                        daemon=True)
        self._thread.start()
        self.group_table = GroupTable(self._etcd, cluster, group_lease_ttl_s) \
            if placement_groups else None
        self._rebalancer = None
        if rebalance_interval_s > 0 and self.group_table is not None:
            self._rebalancer = threading.Thread(
                target=self._rebalance_loop, args=(rebalance_interval_s,), daemon=True,
                name="mlaserve-cluster-rebalance")
            self._rebalancer.start()

    # --- Lifetime ----------------------------------------------------------------------

    def close(self):
        """Stops the membership thread and closes every channel."""
        self._stop.set()
        if self._rebalancer is not None and self._rebalancer is not threading.current_thread():
            self._rebalancer.join(timeout=130)
        if self.group_table is not None:
            self.group_table.close()
        self._etcd.close()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=True)
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- Servers -----------------------------------------------------------------------

    def _client(self, instance_id, address):
        with self._lock:
            client = self._clients.get(instance_id)
            if client is None:
                client = Client(address, **self._client_kwargs)
                self._clients[instance_id] = client
            return client

    def _info(self, instance_id, address):
        with self._lock:
            info = self._infos.get(instance_id)
        if info is None:
            info = self._client(instance_id, address).server_info()
            with self._lock:
                self._infos[instance_id] = info
                if self._model is None:
                    self._model = info.model
                    b_theta = next((t.b_theta for t in info.naive_thresholds if t.sq == 1), 0.0)
                    self._group_floor = math.ceil(max(1.0, b_theta))
                    if self._spread_group is None:
                        self._spread_group = 2 * self._group_floor
        return info

    def _cluster_model(self):
        """The model the members serve (the first one's GetServerInfo): dims for the bytes."""
        with self._lock:
            if self._model is not None:
                return self._model
            members = sorted(self._by_instance.values(), key=lambda r: r["instance_id"])
        error = None
        for record in members:
            try:
                return self._info(record["instance_id"], record["address"]).model
            except grpc.RpcError as e:
                error = e
        if error is not None:
            raise error
        raise ClusterError(grpc.StatusCode.UNAVAILABLE,
                           f"cluster '{self.cluster}' has no member to ask for its model")

    @property
    def spread_group(self):
        """The group size beyond which a prefix spreads to another server."""
        if self._spread_group is None:
            self._cluster_model()
        return self._spread_group

    def _sequence_bytes(self, model, tokens):
        return tokens * model.layers * (model.dl + model.dr) * 2

    def _prefix_bytes(self, model, tokens):
        dv = model.dv or model.dn
        return tokens * model.layers * ((model.dl + model.dr) * 2 +
                                        model.heads * (model.dn + model.dr + dv) * 2)

    def _candidates(self, prefix):
        """Under the lock: every member serving the cluster's model, as placement sees it."""
        candidates = []
        for instance, record in sorted(self._by_instance.items()):
            model = record.get("model", {})
            if model.get("name") != self._model.name or model.get("layers") != self._model.layers:
                continue
            if record.get("state") == _MOVING_OUT:
                continue  # a drain is taking it out of the cluster: it creates nothing new
            load = record.get("load", {})
            updated, reserved, placed = self._reserved.get(instance, (None, 0, 0))
            if updated != load.get("updated_unix_ms", 0):
                reserved = placed = 0
            candidates.append(PlacementCandidate(
                instance, int(record.get("kv_budget_bytes", 0)) - int(load.get("kv_used_bytes", 0))
                - reserved, int(load.get("sequences", 0)) + placed,
                prefix.holders.get(instance, -1) if prefix is not None else -1))
        return candidates

    def _reserve(self, instance_id, nbytes, sequences=1):
        """Under the lock: nbytes and `sequences` placements (a prefix's registration counts
        one) more on the member since its record was written; negative to take back a
        placement that failed."""
        record = self._by_instance.get(instance_id)
        if record is None:
            return
        updated = record.get("load", {}).get("updated_unix_ms", 0)
        previous, reserved, placed = self._reserved.get(instance_id, (None, 0, 0))
        if previous != updated:
            reserved = placed = 0
        self._reserved[instance_id] = (updated, max(0, reserved + nbytes),
                                       max(0, placed + sequences))

    # --- Prefixes ----------------------------------------------------------------------

    def register_prefix(self, prefix_id, latent, kv_dtype=None):
        """Registers latent [layers, tokens, dl + dr] as prefix_id on the member with the most
        free bytes (that has room for it) and keeps the latent, to register it on more
        servers when its sequences spread."""
        latent = np.array(latent)
        with self._lock:
            known = self._prefixes.get(prefix_id)
        if known is not None:
            if known.kv_dtype == kv_dtype and known.latent.dtype == latent.dtype and \
                    np.array_equal(known.latent, latent):
                return
            raise ClusterError(grpc.StatusCode.ALREADY_EXISTS,
                               f"prefix '{prefix_id}' is registered with other rows")
        model = self._cluster_model()
        prefix = _Prefix(prefix_id, latent, kv_dtype)
        nbytes = self._prefix_bytes(model, prefix.tokens)
        with self._lock:
            instance, _ = place_sequence(self._candidates(None), nbytes,
                                         tie_break=self._tie_break)
            address = self._by_instance[instance]["address"]
            self._reserve(instance, nbytes)
        self._client(instance, address).register_prefix(prefix_id, latent, kv_dtype=kv_dtype)
        with self._lock:
            prefix.holders[instance] = 0
            self._prefixes[prefix_id] = prefix

    def release_prefix(self, prefix_id):
        """Releases the prefix on every server this client registered it on (sequences on it
        keep reading it there) and forgets its latent."""
        with self._lock:
            prefix = self._prefixes.pop(prefix_id, None)
        if prefix is None:
            return
        for instance in list(prefix.holders):
            address = self._address(instance)
            if address is None:
                continue  # that server left the cluster, and the prefix with it
            try:
                self._client(instance, address).release_prefix(prefix_id)
            except grpc.RpcError as error:
                if not (error.code() == grpc.StatusCode.UNAVAILABLE and self._gone(instance)):
                    raise

    def prefixes(self):
        """{prefix id: {instance id: live sequences this client placed on it there}}."""
        with self._lock:
            return {p.prefix_id: dict(p.holders) for p in self._prefixes.values()}

    # --- Sequences ---------------------------------------------------------------------

    def _place_and_create(self, prefix, sequence_bytes, create, exclude=(), fallback=False,
                          chooser=None):
        """Chooses a server by the rule (or by chooser(candidates, unavailable) -> (instance,
        register_prefix), called without the client's lock: a placement group's claim goes to
        etcd), reserves the room, registers the prefix there first when the rule says so, and
        calls create(client) there; (instance id, address, what create returned). A server
        that answers UNAVAILABLE (leaving the cluster in a drain, or dead but still listed),
        or CANCELLED as a drain stops it, is passed over and the sequence placed again,
        _CREATE_ATTEMPTS placements in all. With fallback, a placement that finds no room
        outside `exclude` tries again among every member."""
        model = self._cluster_model()
        prefix_bytes = self._prefix_bytes(model, prefix.tokens) if prefix is not None else 0
        unavailable = set()
        last_error = None
        for attempt in range(_CREATE_ATTEMPTS):
            with self._lock:
                candidates = self._candidates(prefix)
            try:
                if chooser is not None:
                    instance, register = chooser(candidates, unavailable)
                else:
                    try:
                        instance, register = place_sequence(
                            candidates, sequence_bytes, prefix_bytes, prefix is not None,
                            self.spread_group, set(exclude) | unavailable, self._tie_break)
                    except ClusterError:
                        if not fallback or not exclude:
                            raise
                        instance, register = place_sequence(
                            candidates, sequence_bytes, prefix_bytes, prefix is not None,
                            self.spread_group, unavailable, self._tie_break)
            except ClusterError:
                if last_error is not None:
                    raise last_error from None
                raise
            with self._lock:
                record = self._by_instance.get(instance)
                if record is None:  # left the cluster while it was chosen
                    unavailable.add(instance)
                    last_error = ClusterError(grpc.StatusCode.UNAVAILABLE, (
                        f"instance {instance} left cluster '{self.cluster}' while the sequence "
                        "was placed"))
                    continue
                address = record["address"]
                reserved = sequence_bytes + (prefix_bytes if register else 0)
                placements = 2 if register else 1  # the prefix's registration counts too
                self._reserve(instance, reserved, placements)
                if prefix is not None and not register:
                    prefix.holders[instance] += 1
            client = self._client(instance, address)
            try:
                if register:
                    client.register_prefix(prefix.prefix_id, prefix.latent,
                                           kv_dtype=prefix.kv_dtype)
                    with self._lock:
                        prefix.holders[instance] = 1
                return instance, address, create(client)
            except grpc.RpcError as error:
                with self._lock:
                    self._reserve(instance, -reserved, -placements)
                    if prefix is not None and prefix.holders.get(instance, 0) > 0:
                        prefix.holders[instance] -= 1
                    # A drained server cancels what it has not answered as it stops (a create
                    # it refused, retried by mlaserve.Client until then): created nowhere.
                    stopping = error.code() == grpc.StatusCode.CANCELLED and \
                        self._moving_out(instance)
                if error.code() != grpc.StatusCode.UNAVAILABLE and not stopping:
                    raise
                unavailable.add(instance)
                last_error = error
                if attempt + 1 < _CREATE_ATTEMPTS:
                    _log.info("cluster '%s': %s refused a new sequence (%s: %s); placing it "
                              "on another server", self.cluster, address, error.code().name,
                              error.details())
        raise last_error

    def _part_bytes(self, model):
        """The room a new sequence, or a new part of one, asks for: its expected tokens."""
        return self._sequence_bytes(model, self._expected_tokens)

    def create_sequence(self, sequence_id, prefix_id="", kv_dtype=None, placement_group=None):
        """Places a new sequence (on prefix_id, registered through this client) and creates it
        there; returns the server's Sequence message. Later calls go to that server.
        placement_group (a serving framework's rank: sequences its calls carry together; else
        placement_group_of(sequence_id) when the client was given one): the sequence joins
        that group's server, as a prefix's sequences do, up to the spread size."""
        with self._lock:
            existing = self._sequences.get(sequence_id)
            prefix = self._prefixes.get(prefix_id) if prefix_id else None
        if prefix_id and prefix is None:
            raise ClusterError(grpc.StatusCode.NOT_FOUND,
                               f"prefix '{prefix_id}' was not registered through this client")
        if existing is not None:
            if existing.prefix is not prefix or existing.requested_kv_dtype != kv_dtype:
                raise ClusterError(grpc.StatusCode.ALREADY_EXISTS,
                                   f"sequence '{sequence_id}' exists with other arguments")
            # Where it is now (a create there could not tell it moved, and would make an
            # empty twin on the server it left).
            return self._following_moves(lambda: self._call(
                existing.parts[0], sequence_id,
                lambda c: c.get_sequence(existing.parts[0].sub_id)))
        model = self._cluster_model()
        sequence = _Sequence(sequence_id, prefix, kv_dtype, model.layers)

        def create(client):
            return client.create_sequence(sequence_id, prefix_id=prefix_id, kv_dtype=kv_dtype)

        hint = placement_group
        if hint is None:
            hint = self._placement_group_of(sequence_id) if self._placement_group_of else ""
        # Without a prefix or a group there is nothing to keep together: placed alone by room.
        if prefix is not None or hint:
            chosen = []
            sequence_bytes = self._part_bytes(model)
            prefix_bytes = self._prefix_bytes(model, prefix.tokens) if prefix is not None else 0
            chooser = self._group_chooser(prefix, f"{prefix_id or '-'}|{hint}", sequence_bytes,
                                          prefix_bytes, chosen)
            with self._group_lock:  # one grouped placement at a time, as the C++ client's
                try:
                    instance, address, created = self._place_and_create(
                        prefix, sequence_bytes, create, chooser=chooser)
                except BaseException:
                    if chosen:
                        self._count_in_group(chosen[-1], 0)
                    raise
                self._count_in_group(chosen[-1], 1)
                sequence.group = chosen[-1]
        elif prefix is not None:
            with prefix.lock:  # one placement (and registration) at a time on a prefix
                instance, address, created = self._place_and_create(
                    prefix, self._part_bytes(model), create)
        else:
            instance, address, created = self._place_and_create(
                None, self._part_bytes(model), create)
        if kv_dtype is None:
            sequence.kv_dtype = _KV_DTYPE_NAMES.get(created.kv_dtype)
        end = sequence.prefix_tokens + self._context_part_tokens \
            if self._context_part_tokens > 0 else None
        sequence.parts.append(_Part(sequence_id, instance, address, 0, end))
        with self._lock:
            self._sequences[sequence_id] = sequence
        return created

    def _sequence(self, sequence_id):
        with self._lock:
            sequence = self._sequences.get(sequence_id)
        if sequence is None:
            raise ClusterError(grpc.StatusCode.NOT_FOUND,
                               f"sequence '{sequence_id}' was not created through this client")
        return sequence

    def server_of(self, sequence_id):
        """The address of the server holding the sequence (its first part)."""
        return self._sequence(sequence_id).parts[0].address

    def parts_of(self, sequence_id):
        """The sequence's parts: [(part's sequence id, address, first position, end)] (end
        None for a sequence that is not cut)."""
        return [(p.sub_id, p.address, p.start, p.end)
                for p in list(self._sequence(sequence_id).parts)]

    def release_sequence(self, sequence_id):
        """Releases every part of the sequence; parts on servers that were lost (and parts a
        drained server had that no member holds now) are forgotten."""
        with self._lock:
            sequence = self._sequences.get(sequence_id)
        if sequence is None:
            return
        self._following_moves(lambda: self._release_once(sequence), len(sequence.parts),
                              unfound=lambda: self._forget(sequence))

    def _release_once(self, sequence):
        """Releases the parts (raising _ServerStopped, after releasing the others, for one on
        a drained server that has stopped) and forgets the sequence."""
        stopped = None
        for part in list(sequence.parts):
            if self._route(part) is None:
                continue
            try:
                self._call(part, sequence.sequence_id,
                           lambda c: c.release_sequence(part.sub_id))
            except _ServerStopped as error:
                stopped = stopped or error
            except ClusterError:
                pass  # lost meanwhile: nothing to release
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.NOT_FOUND:
                    raise  # (NOT_FOUND: released by an earlier try)
        if stopped is not None:
            raise stopped
        self._forget(sequence)

    def _forget(self, sequence):
        with self._lock:
            if self._sequences.get(sequence.sequence_id) is not sequence:
                return  # released meanwhile by another thread
            del self._sequences[sequence.sequence_id]
            group = sequence.group
            if sequence.prefix is not None:
                holders = sequence.prefix.holders
                instance = sequence.parts[0].instance_id
                if holders.get(instance, 0) > 0:
                    holders[instance] -= 1
        if group:
            self._count_in_group(group, -1)
