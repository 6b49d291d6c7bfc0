"""The cluster client's routing: a call for a sequence goes to its server, and follows the
sequence when its server moved it (MigrateSequences, a drain) or left the cluster."""

import collections
import logging
import time

import grpc

from mlaserve.cluster_membership import _MOVING_OUT
from mlaserve.errors import ClusterError

_log = logging.getLogger("mlaserve.cluster")

# A sequence a server moved (MigrateSequences) is followed to its new server and the call
# repeated (every call here is idempotent); as the C++ cluster client
# (client/cluster/cluster_client.cc, FollowMove). A server refuses one moved sequence per
# call, so a call follows as many moves as it names sequences (parts), and a few more.
_MOVES_FOLLOWED_BEYOND_SEQUENCES = 8
_MOVING = "' is moving to server "  # UNAVAILABLE while its last rows go over
_MOVED = "' moved to server "  # FAILED_PRECONDITION "sequence 'ID' moved to server ADDRESS"
_NAMED = "sequence '"


# Where a piece of a sequence lives: its id there, its server, and the positions it holds.
_Part = collections.namedtuple("_Part", ["sub_id", "instance_id", "address", "start", "end"])


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


class _Routing:
    """ClusterClient's routing methods (a mixin: the state is ClusterClient's)."""

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
