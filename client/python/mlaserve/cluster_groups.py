"""The cluster client's placement groups and their rebalancing (docs/cluster.md, "Placement
groups", "Rebalancing"): the claims in etcd, the group a new sequence joins, moves of
groups off servers past the load bound."""

import logging
import time

import grpc

from mlaserve.errors import ClusterError
from mlaserve.placement import load_bound, place_group

_log = logging.getLogger("mlaserve.cluster")


class _Group:
    """A placement group of this client: its server and live sequences."""

    def __init__(self, instance, has_prefix, claimed_weight):
        self.instance = instance
        self.has_prefix = has_prefix
        self.sequences = 0
        self.claimed_weight = claimed_weight


class _Groups:
    """ClusterClient's placement-group methods (a mixin: the state is ClusterClient's)."""

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
        """A group gained (+1) or lost (-1) a sequence: its claim follows (dropped at 0).
        Counting and writing go together (two releases must not write in the other order)."""
        with self._claims_lock:
            self._count_and_write(name, delta)

    def _count_and_write(self, name, delta):
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
            cap = load_bound(total, len(loaded), self._load_slack)
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
