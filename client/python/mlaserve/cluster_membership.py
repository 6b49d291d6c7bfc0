"""The cluster client's view of the membership: the servers' records read from etcd and kept
current by a watch (docs/cluster.md, "Python cluster client", "Membership")."""

import base64
import json
import logging

_log = logging.getLogger("mlaserve.cluster")

# A record's "state" while mlaserve-ctl drain takes its server out of the cluster
# (cluster/member_record.h): placement passes it over, and once its key is gone its
# sequences are still called there (they are being moved, and the calls redirected).
_MOVING_OUT = "moving-out"


class _Membership:
    """ClusterClient's membership methods (a mixin: the state is ClusterClient's)."""

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
