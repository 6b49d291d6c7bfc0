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

import base64
import collections
import concurrent.futures
import json
import logging
import math
import random
import threading
import time

import grpc
import numpy as np

from mlaserve.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from mlaserve.client import Client, DecodeResult
from mlaserve.errors import ClusterError
from mlaserve.etcd import Etcd
from mlaserve.group_table import GroupTable
from mlaserve.placement import PlacementCandidate, place_group, place_sequence  # noqa: F401
from mlaserve.tensors import BF16, FP16, FP32, wire_dtype
from mlaserve.v1 import decode_pb2, kv_cache_pb2, tensor_pb2

_log = logging.getLogger("mlaserve.cluster")

_KV_DTYPE_NAMES = {tensor_pb2.KV_DTYPE_BF16: "bf16", tensor_pb2.KV_DTYPE_FP8: "fp8"}

# A sequence a server moved (MigrateSequences) is followed to its new server and the call
# repeated (every call here is idempotent); as the C++ cluster client
# (client/cluster/cluster_client.cc, FollowMove). A server refuses one moved sequence per
# call, so a call follows as many moves as it names sequences (parts), and a few more.
_MOVES_FOLLOWED_BEYOND_SEQUENCES = 8
# A new sequence refused UNAVAILABLE (its server leaving the cluster in a drain, or gone), or
# CANCELLED by a drained server as it stops, is placed again on another server, this many
# placements in all (as the C++ client's CreateSequence).
_CREATE_ATTEMPTS = 3
# A record's "state" while mlaserve-ctl drain takes its server out of the cluster
# (cluster/member_record.h): placement passes it over, and once its key is gone its
# sequences are still called there (they are being moved, and the calls redirected).
_MOVING_OUT = "moving-out"
_MOVED_OUT_REMEMBERED = 64  # the latest instances that left moving out
_MOVING = "' is moving to server "  # UNAVAILABLE while its last rows go over
_MOVED = "' moved to server "  # FAILED_PRECONDITION "sequence 'ID' moved to server ADDRESS"
_NAMED = "sequence '"


class _ServerStopped(Exception):
    """Internal: a call to a server that left the cluster moving out (a drain) failed
    UNAVAILABLE (it has stopped, its sequences on other members) or CANCELLED (it cancelled
    the call as it stopped). Caught by _following_moves, which finds them there (_relocate)
    or raises `error`. `instance`: the member called (the part's own, or the one that came
    back at its address)."""

    def __init__(self, part, error, instance):
        super().__init__(f"{part.address}: {error.details()}")
        self.part = part
        self.error = error
        self.instance = instance


# --- The client's book --------------------------------------------------------------------

class _Prefix:
    def __init__(self, prefix_id, latent, kv_dtype):
        self.prefix_id = prefix_id
        self.latent = latent
        self.kv_dtype = kv_dtype
        self.tokens = int(latent.shape[1]) if latent.ndim == 3 else 0
        self.holders = {}  # instance id -> live sequences this client placed on it there
        self.lock = threading.Lock()  # placement and registration of its sequences


_Part = collections.namedtuple("_Part", ["sub_id", "instance_id", "address", "start", "end"])


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


class _Group:
    """A placement group of this client: its server and live sequences."""

    def __init__(self, instance, has_prefix, claimed_weight):
        self.instance = instance
        self.has_prefix = has_prefix
        self.sequences = 0
        self.claimed_weight = claimed_weight


class ClusterClient:
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

    # --- Membership --------------------------------------------------------------------

    def members(self):
        """The members' records (dicts, docs/cluster.md "The record"), by instance id."""
        with self._lock:
            return [json.loads(json.dumps(r)) for _, r in sorted(self._by_instance.items())]

    @property
    def stale(self):
        """True while etcd does not answer and members() is the last membership seen."""
        with self._lock:
            return self._stale

    @property
    def changes(self):
        """Membership changes seen (records written, removed, or everything re-read)."""
        with self._lock:
            return self._changes

    def _parse(self, key, value):
        try:
            record = json.loads(value)
            if not isinstance(record, dict) or not record.get("instance_id") or \
                    not record.get("address"):
                raise ValueError("no instance_id or address")
            return record
        except ValueError as error:
            _log.warning("cluster '%s': ignoring the record under %s: %s", self.cluster, key,
                         error)
            return None

    def _set_members(self, members, moved_out=()):
        """Under the lock: the key -> record map becomes `members`; `moved_out`: records
        removed while they said "moving-out" (remembered: their sequences are being moved)."""
        for record in moved_out:
            instance = record["instance_id"]
            _log.info("cluster '%s': %s (%s) left, moving its sequences out", self.cluster,
                      instance, record["address"])
            if instance not in self._moved_out:
                self._moved_out.append(instance)
        self._members = members
        self._by_instance = {r["instance_id"]: r for r in members.values()}
        for instance in list(self._reserved):
            if instance not in self._by_instance:
                del self._reserved[instance]
        self._changes += 1

    def _read_all(self):
        revision, kvs = self._etcd.range_prefix(self._prefix)
        members = {}
        for key, value in kvs:
            record = self._parse(key, value)
            if record is not None:
                members[key] = record
        with self._lock:
            present = {r["instance_id"] for r in members.values()}
            self._set_members(members, [
                r for i, r in self._by_instance.items()
                if i not in present and r.get("state") == _MOVING_OUT])
            self._revision = revision
            if self._stale:
                _log.info("cluster '%s': etcd at %s answers again; %d members", self.cluster,
                          self._etcd.endpoints[self._etcd.current], len(members))
            self._stale = False

    def _apply(self, result):
        with self._lock:
            members = dict(self._members)
            moved_out = []
            for event in result.get("events", []):
                kv = event.get("kv", {})
                key = base64.b64decode(kv.get("key", "")).decode(errors="replace")
                if event.get("type") == "DELETE":
                    # (its last record may have come in this same result)
                    record = members.pop(key, None)
                    if record is not None and record.get("state") == _MOVING_OUT:
                        moved_out.append(record)
                else:
                    record = self._parse(key, base64.b64decode(kv.get("value", "")))
                    if record is not None:
                        members[key] = record
            self._set_members(members, moved_out)
            revision = int(result.get("header", {}).get("revision", 0))
            self._revision = max(self._revision, revision)

    def _run(self):
        """Keeps the membership current: a full read, then a watch from its revision; the
        stream breaking (or silent for a while) means a full read again. While etcd does not
        answer, the last membership stays, marked stale."""
        idle_timeout = 30.0
        read = False  # the constructor has just read everything
        while not self._stop.is_set():
            try:
                if read:
                    self._read_all()
                read = True
            except OSError as error:
                with self._lock:
                    first = not self._stale
                    self._stale = True
                    count = len(self._by_instance)
                if first:
                    _log.warning("cluster '%s': etcd at %s unreachable (%s); keeping the last "
                                 "membership (%d members) until it answers", self.cluster,
                                 ",".join(self._etcd.endpoints), error, count)
                self._stop.wait(0.5)
                continue
            with self._lock:
                start = self._revision + 1
            try:
                for result in self._etcd.watch_prefix(self._prefix, start, idle_timeout):
                    if self._stop.is_set():
                        return
                    if result.get("canceled") or result.get("compact_revision"):
                        break  # compacted past our revision: read everything again
                    if result.get("events"):
                        self._apply(result)
            except OSError as error:
                _log.debug("cluster '%s': etcd watch ended: %s", self.cluster, error)

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

    def _address(self, instance_id):
        with self._lock:
            record = self._by_instance.get(instance_id)
            return record["address"] if record is not None else None

    def _left(self, part, sequence_id):
        return ClusterError(grpc.StatusCode.UNAVAILABLE, (
            f"server {part.address} (instance {part.instance_id}) left cluster "
            f"'{self.cluster}'; sequence '{sequence_id}' was on it"))

    def _gone(self, instance_id):
        """Whether the server has left the membership (a drained one included)."""
        with self._lock:
            return instance_id not in self._by_instance

    def _moving_out(self, instance_id):
        """Under the lock: whether a drain is taking the server out of the cluster (its record
        says "moving-out") or has (its key went while it said so)."""
        record = self._by_instance.get(instance_id)
        if record is not None:
            return record.get("state") == _MOVING_OUT
        return instance_id in self._moved_out

    def _lost(self, instance_id):
        """Whether the server left the cluster without moving its sequences out (killed, lease
        expired): its sequences are gone with it."""
        with self._lock:
            return instance_id not in self._by_instance and instance_id not in self._moved_out

    def _route(self, part):
        """The member to call for the part: its own server while that is a member or left
        moving out (a drain); for one that was lost, a member now at its address (a server
        restarted there, e.g. by systemd with --state_dir: it holds the sequences again, or
        answers NOT_FOUND), as the C++ client's RouteTo; None without one."""
        with self._lock:
            if not self._lost(part.instance_id):
                return part.instance_id
            return next((i for i, r in sorted(self._by_instance.items())
                         if r["address"] == part.address), None)

    def _call(self, part, sequence_id, function):
        """function(client) against the part's server (_route), failing at once when the
        server has been lost and no member has come back at its address (and when a call
        fails UNAVAILABLE because the server called has been lost since). A server drained
        out of the cluster is still called (its sequences move, and calls naming them are
        redirected); when it fails UNAVAILABLE (stopped) or CANCELLED (stopping),
        _ServerStopped."""
        instance = self._route(part)
        if instance is None:
            raise self._left(part, sequence_id)
        try:
            return function(self._client(instance, part.address))
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                if self._lost(instance):
                    raise self._left(part._replace(instance_id=instance), sequence_id) from None
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                # (a stopping server cancels calls it has not answered: CANCELLED from it)
                with self._lock:
                    stopped = self._moving_out(instance)
                if stopped and _MOVING not in (error.details() or ""):
                    raise _ServerStopped(part, error, instance) from None
            raise

    def _following_moves(self, function, sequences=1, unfound=None):
        """function(), repeated after each failure _follow_move follows or _relocate mends,
        at most `sequences` (those the call names on the servers) + a few times. A part on a
        stopped drained server that no member holds: unfound() if given, else the server's
        UNAVAILABLE."""
        bound = sequences + _MOVES_FOLLOWED_BEYOND_SEQUENCES
        moves = 0
        while True:
            try:
                return function()
            except _ServerStopped as stopped:
                found = moves < bound and self._relocate(stopped.part, stopped.instance)
                if not found and stopped.error.code() == grpc.StatusCode.CANCELLED:
                    # (a call the stopping server cancelled is repeated in any case)
                    _log.info("cluster '%s': %s cancelled a call as it stopped; repeating it",
                              self.cluster, stopped.part.address)
                if not found and (moves >= bound or
                                  stopped.error.code() != grpc.StatusCode.CANCELLED):
                    if unfound is None:
                        raise stopped.error from None
                    return unfound()
            except grpc.RpcError as error:
                if moves >= bound or not self._follow_move(error):
                    raise
            moves += 1

    def _parts_named(self, sequence_ids):
        """How many sequences the servers hold for these of this client (parts count)."""
        with self._lock:
            return sum(len(s.parts) if s is not None else 1
                       for s in (self._sequences.get(i) for i in sequence_ids))

    def _repoint(self, sequence, index, instance, address):
        """Under the lock: part `index` of the sequence is now on `instance` (for part 0 its
        prefix's group with it, the prefix counted as registered there: a move registers
        it)."""
        part = sequence.parts[index]
        if index == 0 and sequence.prefix is not None:
            holders = sequence.prefix.holders
            if holders.get(part.instance_id, 0) > 0:
                holders[part.instance_id] -= 1
            holders[instance] = holders.get(instance, 0) + 1
        sequence.parts[index] = part._replace(instance_id=instance, address=address)

    def _relocate(self, stopped, called):
        """After a call for part `stopped` failed UNAVAILABLE on `called`, a server a drain
        took out of the cluster (it has stopped, maybe before this client heard of every
        move): finds every part this client had there on the other members (ListSequences)
        and points it at the one holding it. True if the call is worth repeating (its part is
        elsewhere now, also when another call relocated it first)."""
        instance = stopped.instance_id
        there = {instance, called}  # (a lost server's parts go to one back at its address)

        def still_there():
            return any(p.sub_id == stopped.sub_id and p.instance_id == instance
                       for s in self._sequences.values() for p in s.parts)

        with self._lock:
            if not still_there():
                return True  # another call found it (or followed its move) meanwhile
            if not self._moving_out(called):
                return False
            members = [r for i, r in sorted(self._by_instance.items()) if i not in there]
        holder = {}  # a server-side sequence id -> the member holding it
        for record in members:
            try:
                summaries = self._client(record["instance_id"], record["address"]) \
                    .list_sequences()
            except grpc.RpcError as error:
                _log.debug("cluster '%s': listing %s: %s", self.cluster, record["address"], error)
                continue
            for summary in summaries:
                holder.setdefault(summary.sequence.sequence_id, record)
        with self._lock:
            for sequence in self._sequences.values():
                for index, part in enumerate(sequence.parts):
                    record = holder.get(part.sub_id) if part.instance_id in there else None
                    if record is None:
                        continue
                    _log.info("cluster '%s': sequence '%s' found on %s after %s stopped",
                              self.cluster, part.sub_id, record["address"], part.address)
                    self._repoint(sequence, index, record["instance_id"], record["address"])
            return not still_there()

    def _follow_move(self, error):
        """For a call refused because a sequence moved (FAILED_PRECONDITION "sequence 'ID'
        moved to server ADDRESS", ID being a part's id): points that part at the member with
        that address (its prefix now counted there: the move registered it). For one refused
        while it moves (UNAVAILABLE "... is moving to server ..."): waits a moment. True if
        the call is worth repeating."""
        code, message = error.code(), error.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE and _MOVING in message:
            # Its last rows are on their way: the move ends within moments (mlaserve.Client's
            # own retries of UNAVAILABLE may not have waited long enough).
            time.sleep(0.1)
            return True
        if code != grpc.StatusCode.FAILED_PRECONDITION:
            return False
        moved = message.find(_MOVED)
        named = message.rfind(_NAMED, 0, moved) if moved >= 0 else -1
        if named < 0:
            return False
        part_id = message[named + len(_NAMED):moved]
        address = message[moved + len(_MOVED):]
        for stop in " ;,)":
            address = address.split(stop, 1)[0]
        with self._lock:
            member = next((r for r in self._by_instance.values() if r["address"] == address),
                          None)
            if member is None:
                _log.warning("cluster '%s': sequence '%s' moved to %s, which is no member",
                             self.cluster, part_id, address)
                return False
            instance = member["instance_id"]
            for sequence in self._sequences.values():
                for index, part in enumerate(sequence.parts):
                    if part.sub_id != part_id:
                        continue
                    if part.instance_id == instance:
                        return True  # another call followed it meanwhile
                    _log.info("cluster '%s': sequence '%s' moved from %s to %s", self.cluster,
                              part_id, part.address, address)
                    self._repoint(sequence, index, instance, address)
                    return True
        return False

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

    def _group_weight(self, has_prefix, sequences):
        """Queries per step a group claims: at least B_theta for a prefix group (it is placed
        to become hybrid)."""
        self._cluster_model()  # (the servers' B_theta)
        return max(self._group_floor if has_prefix else 1, sequences)

    def _group_chooser(self, prefix, base, sequence_bytes, prefix_bytes, chosen):
        """A chooser for _place_and_create: the open group of `base` while it is below the
        spread size with room on a member not refused; else a new group claimed in etcd by
        place_group. Appends the group's name to `chosen`."""
        def choose(candidates, unavailable):
            by_id = {c.instance_id: c for c in candidates}
            with self._lock:
                number = self._open_group.get(base, 0)
                name = f"{base}#{number}"
                group = self._groups.get(name)
            if group is not None:
                c = by_id.get(group.instance)
                full = self.spread_group > 0 and group.sequences >= self.spread_group
                if c is not None and group.instance not in unavailable and not full and \
                        c.free_bytes >= sequence_bytes:
                    chosen.append(name)
                    return group.instance, prefix is not None and c.prefix_group < 0
                if group.sequences == 0:
                    self._count_in_group(name, 0)  # a claim no sequence came to
                with self._lock:
                    number = self._open_group[base] = number + 1
                name = f"{base}#{number}"
            weight = self._group_weight(prefix is not None, 1)
            table = self.group_table
            full_name = f"{table.client_id if table else ''}/{name}"
            result = []

            def place(loads):
                with_loads = [c._replace(group_load=loads.get(c.instance_id, (0, 0))[0],
                                         group_bytes=loads.get(c.instance_id, (0, 0))[1])
                              for c in candidates]
                result[:] = place_group(with_loads, full_name, weight, weight * sequence_bytes,
                                        sequence_bytes, prefix_bytes, prefix is not None,
                                        unavailable, self._load_slack)
                return result[0]

            if table is None:
                with self._lock:
                    own = {}
                    for g in self._groups.values():
                        load = own.setdefault(g.instance, [0, 0])
                        w = self._group_weight(g.has_prefix, g.sequences)
                        load[0] += w
                        load[1] += w * sequence_bytes
                place(own)
            else:
                try:
                    table.claim(name, weight, weight * sequence_bytes, place)
                except OSError as error:
                    _log.warning("cluster '%s': group '%s' placed without its claim in etcd: "
                                 "%s", self.cluster, name, error)
                    place({})
            with self._lock:
                self._groups[name] = _Group(result[0], prefix is not None, weight)
            chosen.append(name)
            return result[0], result[1]
        return choose

    def _count_in_group(self, name, delta):
        """A group gained (+1) or lost (-1) a sequence: its claim follows (dropped at 0)."""
        with self._lock:
            group = self._groups.get(name)
            if group is None:
                return
            group.sequences = max(0, group.sequences + delta)
            weight = self._group_weight(group.has_prefix, group.sequences)
            drop = group.sequences == 0
            if drop:
                del self._groups[name]
            elif weight == group.claimed_weight:
                return
            group.claimed_weight = weight
            nbytes = weight * self._part_bytes(self._model) if self._model is not None else 0
        if self.group_table is None:
            return
        try:
            if drop:
                self.group_table.drop(name)
            else:
                self.group_table.update(name, weight, nbytes)
        except (OSError, KeyError) as error:
            _log.warning("cluster '%s': group '%s''s claim in etcd not updated: %s",
                         self.cluster, name, error)

    def rebalance(self):
        """Moves this client's placement groups that sit on a server past the load bound (a
        server joined, groups grew, others left) to servers within it, as the C++ client's
        Rebalance: the new server claimed in etcd, then the group's sequences moved there by
        their server (MigrateSequences: calls naming them are held for the last rows, none
        fails). Returns {"groups_moved", "sequences_moved", "bytes_moved", "seconds"}; a group
        whose move failed stays (its claim too) and the first such error is raised after the
        others were tried. ClusterError FAILED_PRECONDITION without placement groups."""
        if self.group_table is None:
            raise ClusterError(grpc.StatusCode.FAILED_PRECONDITION, (
                "rebalancing moves placement groups: this client places without them "
                "(placement_groups=False)"))
        began = time.monotonic()
        report = {"groups_moved": 0, "sequences_moved": 0, "bytes_moved": 0, "seconds": 0.0}
        first_error = None
        with self._group_lock:
            with self._lock:
                groups = sorted(((name, g.instance, g.claimed_weight)
                                 for name, g in self._groups.items() if g.sequences > 0),
                                key=lambda t: (-t[2], t[0]))
            for name, instance, weight in groups:
                try:
                    self._rebalance_group(name, instance, weight, report)
                except (ClusterError, grpc.RpcError, OSError) as error:
                    first_error = first_error or error
        report["seconds"] = time.monotonic() - began
        if first_error is not None:
            raise first_error
        return report

    def _rebalance_loop(self, interval_s):
        while not self._stop.wait(interval_s):
            try:
                self.rebalance()
            except (ClusterError, grpc.RpcError, OSError) as error:
                _log.warning("cluster '%s': rebalancing: %s", self.cluster, error)

    def _rebalance_group(self, name, instance, weight, report):
        with self._lock:
            moving = [s for s in self._sequences.values()
                      if s.group == name and len(s.parts) == 1 and
                      s.parts[0].instance_id == instance]
            if not moving or instance not in self._by_instance:
                return  # nothing whole there, or its server left (a drain moves its own)
            prefix = moving[0].prefix
            candidates = self._candidates(prefix)
            source = self._by_instance[instance]["address"]
        model = self._cluster_model()
        sequence_bytes = self._part_bytes(model)
        prefix_bytes = self._prefix_bytes(model, prefix.tokens) if prefix is not None else 0
        table = self.group_table
        full_name = f"{table.client_id}/{name}"
        nbytes = weight * sequence_bytes

        def choose(loads):
            """Stays while its server is within the bound with the group on it; else where a
            new group of its weight would go, if that is another server within the bound."""
            loaded = [c._replace(group_load=loads.get(c.instance_id, (0, 0))[0],
                                 group_bytes=loads.get(c.instance_id, (0, 0))[1])
                      for c in candidates]
            total = weight + sum(c.group_load for c in loaded)
            cap = math.ceil((1 + max(0.0, self._load_slack)) * total / max(1, len(loaded))
                            - 1e-9)
            here = next((c for c in loaded if c.instance_id == instance), None)
            if here is not None and here.group_load + weight <= cap:
                return instance
            target, _ = place_group(loaded, full_name, weight, nbytes, sequence_bytes,
                                    prefix_bytes, prefix is not None, (), self._load_slack)
            chosen = next(c for c in loaded if c.instance_id == target)
            better = here is None or chosen.group_load < here.group_load
            return target if chosen.group_load + weight <= cap and better else instance

        loads = table.loads()
        if instance in loads:  # its own claim is what would move
            loads[instance] = [max(0, loads[instance][0] - weight),
                               max(0, loads[instance][1] - nbytes)]
        if choose(loads) == instance:
            return
        target = table.claim(name, weight, nbytes, choose)
        if target == instance:
            return
        with self._lock:
            record = self._by_instance.get(target)
        if record is None:
            table.claim(name, weight, nbytes, lambda _: instance)
            raise ClusterError(grpc.StatusCode.UNAVAILABLE, (
                f"group '{name}': a server left the cluster while it was rebalanced"))
        try:
            moved = self._client(instance, source).migrate_sequences(
                record["address"], [s.parts[0].sub_id for s in moving], timeout=120)
        except grpc.RpcError:
            table.claim(name, weight, nbytes, lambda _: instance)
            raise
        with self._lock:
            for sequence in moving:
                self._repoint(sequence, 0, target, record["address"])
            group = self._groups.get(name)
            if group is not None:
                group.instance = target
        report["groups_moved"] += 1
        report["sequences_moved"] += moved.sequences
        report["bytes_moved"] += moved.bytes
        _log.info("cluster '%s': group '%s' (%d sequences) moved from %s to %s in %.2f s",
                  self.cluster, name, moved.sequences, source, record["address"],
                  moved.seconds)

    def group_of(self, sequence_id):
        """(group name, instance id) of the sequence's placement group; None in none."""
        sequence = self._sequence(sequence_id)
        with self._lock:
            group = self._groups.get(sequence.group) if sequence.group else None
            return (sequence.group, group.instance) if group is not None else None

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

    # --- Context-parallel parts --------------------------------------------------------

    def _part_index(self, sequence, position):
        c = self._context_part_tokens
        if c <= 0 or position < sequence.prefix_tokens + c:
            return 0
        return (position - sequence.prefix_tokens) // c

    def _part_range(self, sequence, index):
        c, p = self._context_part_tokens, sequence.prefix_tokens
        if c <= 0:
            return 0, None
        return (0 if index == 0 else p + index * c), p + (index + 1) * c

    def _open_parts(self, sequence, last):
        """Opens parts up to `last`: each a sequence without prefix, on a server none of the
        earlier parts is on when one has room (else on any with room)."""
        with sequence.lock:
            while len(sequence.parts) <= last:
                index = len(sequence.parts)
                start, end = self._part_range(sequence, index)
                sub_id = f"{sequence.sequence_id}@p{index}"
                instance, address, _ = self._place_and_create(
                    None, self._part_bytes(self._cluster_model()),
                    lambda c: c.create_sequence(sub_id, kv_dtype=sequence.kv_dtype),
                    exclude={p.instance_id for p in sequence.parts}, fallback=True)
                sequence.parts.append(_Part(sub_id, instance, address, start, end))

    def append_kv(self, sequence_id, layer, start_position, rows, dtype=None):
        """Appends rows [n, dl + dr] at start_position of one layer (positions count the
        prefix's tokens), cut at part boundaries for a context-parallel sequence."""
        return self._following_moves(lambda: self._append_once(
            sequence_id, layer, start_position, rows, dtype), self._parts_named([sequence_id]))

    def _append_once(self, sequence_id, layer, start_position, rows, dtype):
        sequence = self._sequence(sequence_id)
        rows = np.asarray(rows)
        n = len(rows) if rows.ndim >= 1 else 0
        pieces = []
        if self._context_part_tokens <= 0 or rows.ndim != 2 or n == 0:
            pieces.append((0, 0, n))
        else:
            first = self._part_index(sequence, start_position)
            last = self._part_index(sequence, start_position + n - 1)
            self._open_parts(sequence, last)
            for index in range(first, last + 1):
                a, b = self._part_range(sequence, index)
                lo, hi = max(a, start_position), min(b, start_position + n)
                pieces.append((index, lo - start_position, hi - start_position))
        chunks = total_rows = 0
        response = None
        for index, lo, hi in pieces:
            part = sequence.parts[index]
            local = start_position + lo - part.start
            piece = rows if (lo, hi) == (0, n) else rows[lo:hi]
            response = self._call(part, sequence_id, lambda c: c.append_kv(
                part.sub_id, layer, local, piece, dtype=dtype))
            chunks += response.chunks
            total_rows += response.rows
        if n > 0 and 0 <= layer < len(sequence.lengths):
            with self._lock:
                sequence.lengths[layer] = max(sequence.lengths[layer], start_position + n)
        if len(pieces) == 1:
            return response
        return kv_cache_pb2.AppendKvResponse(chunks=chunks, rows=total_rows)

    # --- Decode ------------------------------------------------------------------------

    def decode(self, queries, output_dtype="bf16", softmax_scale=None, timeout=None):
        """Decode of head_query/latent_query queries on sequences of this client -> a list of
        DecodeResult in query order: one Decode call per server (in parallel); a query over
        several context-parallel parts is answered by sub-queries merged by LSE."""
        return self._following_moves(lambda: self._decode_once(
            queries, output_dtype, softmax_scale, timeout),
            self._parts_named(q.sequence_id for q in queries))

    def _decode_once(self, queries, output_dtype, softmax_scale, timeout):
        out_wire = wire_dtype(output_dtype)
        groups = collections.OrderedDict()  # (instance, wire dtype) -> [(part, slot, query)]
        merges = []  # (query index, sequence, sq, heads, [(part index, s0, s1, slot)])
        slots = []  # results, filled per sub-call
        answers = [None] * len(queries)

        def add(part, sequence_id, dtype, query):
            slots.append(None)
            groups.setdefault((part.instance_id, dtype), []).append(
                (part, sequence_id, len(slots) - 1, query))
            return len(slots) - 1

        direct = []  # (query index, slot, sequence, layer, append end)
        for i, query in enumerate(queries):
            sequence = self._sequence(query.sequence_id)
            appended = query.HasField("append_position")
            append_end = (query.append_position + query.append_rows.shape[0]) if appended else 0
            if len(sequence.parts) == 1 and (
                    self._context_part_tokens <= 0 or not appended or
                    self._part_index(sequence, max(append_end - 1, 0)) == 0):
                slot = add(sequence.parts[0], query.sequence_id, out_wire, query)
                direct.append((i, slot, sequence, query.layer, append_end))
                continue
            merges.append(self._split(i, sequence, query, add))

        # A call names each (sequence, layer) at most once (the server refuses a repeat), and
        # a part answers several sub-queries of one query (the tokens inside it, and each
        # token past it): those go in consecutive calls to the server, run in parallel.
        calls = []  # (instance, wire dtype, [(part, sequence id, slot, query)])
        for (instance, dtype), items in groups.items():
            limit = self._max_batch(items[0][0])
            rounds = []
            for item in items:
                key = (item[3].sequence_id, item[3].layer)
                for keys, batch in rounds:
                    if key not in keys and len(batch) < limit:
                        break
                else:
                    keys, batch = set(), []
                    rounds.append((keys, batch))
                keys.add(key)
                batch.append(item)
            calls += [(instance, dtype, batch) for _, batch in rounds]

        def run(dtype, items):
            part = items[0][0]
            results = self._call(part, items[0][1], lambda c: c.decode(
                [q for _, _, _, q in items], output_dtype=dtype, timeout=timeout,
                softmax_scale=softmax_scale))
            for (_, _, slot, _), result in zip(items, results):
                slots[slot] = result

        if len(calls) == 1:
            run(calls[0][1], calls[0][2])
        else:
            futures = [self._pool.submit(run, dtype, items) for _, dtype, items in calls]
            errors = []
            for future in futures:
                try:
                    future.result()
                except Exception as error:
                    errors.append(error)
            if errors:  # the first failing call's, in query order
                raise errors[0]

        for i, slot, sequence, layer, append_end in direct:
            answers[i] = slots[slot]
            if append_end and 0 <= layer < len(sequence.lengths):
                with self._lock:
                    sequence.lengths[layer] = max(sequence.lengths[layer], append_end)
        for i, sq, heads, pieces in merges:
            answers[i] = self._merge(sq, heads, pieces, slots, out_wire)
        return answers

    def _max_batch(self, part):
        try:
            instance = self._route(part) or part.instance_id
            return max(1, self._info(instance, part.address).limits.max_batch)
        except grpc.RpcError:
            return 256

    def _split(self, i, sequence, query, add):
        """A query on a context-parallel sequence as sub-queries on its parts (its append done
        first through append_kv). Returns (query index, sq, heads, [(part, s0, s1, slot)])."""
        if query.HasField("append_position"):
            rows = query.append_rows
            self.append_kv(sequence.sequence_id, query.layer, query.append_position,
                           _rows_of(rows), dtype=_dtype_name(rows.dtype))
            stripped = decode_pb2.DecodeQuery()
            stripped.CopyFrom(query)
            stripped.ClearField("append_rows")
            stripped.ClearField("append_position")
            query = stripped
        if not 0 <= query.layer < len(sequence.lengths):
            raise ClusterError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"layer {query.layer} out of range [0, {len(sequence.lengths)})")
        sq = query.sq
        length = sequence.lengths[query.layer]
        q_tensor = query.latent if query.HasField("latent") else query.head.q_nope
        heads = q_tensor.shape[1]
        positions = [length - sq + s for s in range(sq)]  # the tokens' own positions
        pieces = []
        for index, part in enumerate(list(sequence.parts)):
            a = part.start
            if a >= length:
                break  # this layer has nothing there yet
            b = length if part.end is None else min(part.end, length)
            inside = [s for s, t in enumerate(positions) if a <= t < b]
            if inside:
                s0, s1 = inside[0], inside[-1] + 1
                pieces.append((index, s0, s1, add(part, sequence.sequence_id, FP32,
                                                  _sub_query(query, part.sub_id, s0, s1))))
            for s, t in enumerate(positions):
                if t >= b:
                    pieces.append((index, s, s + 1, add(part, sequence.sequence_id, FP32,
                                                        _sub_query(query, part.sub_id, s, s + 1))))
        return i, sq, heads, pieces

    def _merge(self, sq, heads, pieces, slots, out_wire):
        parts = 1 + max(p for p, _, _, _ in pieces)
        first = slots[pieces[0][3]]
        width = first.out.shape[-1]
        lse = np.full((parts, sq, heads), -np.inf)
        out = np.zeros((parts, sq, heads, width))
        plan = None
        for index, s0, s1, slot in pieces:
            result = slots[slot]
            lse[index, s0:s1] = result.lse
            out[index, s0:s1] = result.out
            if index == 0 and plan is None:
                plan = result.plan
        peak = lse.max(axis=0)
        seen = np.isfinite(peak)  # rows that saw a key in some part
        safe_peak = np.where(seen, peak, 0.0)
        weights = np.where(np.isfinite(lse), np.exp(lse - safe_peak), 0.0)
        total = np.where(seen, weights.sum(axis=0), 1.0)
        merged = (weights[..., None] * out).sum(axis=0) / total[..., None]
        merged[~seen] = 0.0
        merged_lse = np.where(seen, safe_peak + np.log(total), -np.inf)
        return DecodeResult(_cast(merged, out_wire), merged_lse.astype(np.float32), plan)


def _dtype_name(dtype):
    return {BF16: "bf16", FP16: "fp16", FP32: "fp32"}.get(dtype)


def _rows_of(tensor):
    """A wire Tensor's values as numpy, bf16 kept as bit patterns (uint16) so they travel
    unchanged."""
    shape = tuple(tensor.shape)
    if tensor.dtype == BF16:
        return np.frombuffer(tensor.data, dtype="<u2").reshape(shape)
    if tensor.dtype == FP16:
        return np.frombuffer(tensor.data, dtype="<f2").reshape(shape)
    return np.frombuffer(tensor.data, dtype="<f4").reshape(shape)


def _slice_tokens(tensor, s0, s1):
    """Tokens [s0, s1) of a [sq, heads, d] wire tensor, its bytes unchanged."""
    stride = len(tensor.data) // max(1, tensor.shape[0])
    return tensor_pb2.Tensor(dtype=tensor.dtype, shape=[s1 - s0] + list(tensor.shape[1:]),
                             data=tensor.data[s0 * stride:s1 * stride])


def _sub_query(query, sub_id, s0, s1):
    sub = decode_pb2.DecodeQuery(sequence_id=sub_id, layer=query.layer, sq=s1 - s0)
    if query.HasField("latent"):
        sub.latent.CopyFrom(_slice_tokens(query.latent, s0, s1))
    else:
        sub.head.q_nope.CopyFrom(_slice_tokens(query.head.q_nope, s0, s1))
        sub.head.q_pe.CopyFrom(_slice_tokens(query.head.q_pe, s0, s1))
        sub.head.first_head = query.head.first_head
    return sub


def _cast(values, out_wire):
    """float64 outputs as the float32 array a Decode in out_wire gives: to float32, then bf16
    or fp16 rounded to nearest even (as the C++ client's merge does)."""
    narrow = values.astype(np.float32)
    if out_wire == FP32:
        return narrow
    if out_wire == FP16:
        return narrow.astype(np.float16).astype(np.float32)
    return bf16_bits_to_float(float_to_bf16_bits(narrow))
