"""The cluster's placement rules, the same as cluster/placement.h's (docs/cluster.md,
"Placement" and "Placement groups"): where a new sequence goes alone (place_sequence), and
where a new placement group goes (place_group: bounded-load rendezvous hashing). The C++ and
Python clients must agree, so every hash and tie-break here is the C++ one written again."""

import collections
import math

import grpc

from mlaserve.errors import ClusterError

PlacementCandidate = collections.namedtuple(
    "PlacementCandidate",
    ["instance_id", "free_bytes", "sequences", "prefix_group", "group_load", "group_bytes"],
    defaults=(0, 0))
PlacementCandidate.__doc__ = """A server as this client sees it: free_bytes = kv_budget_bytes
- load.kv_used_bytes - bytes this client placed there since its record was written; sequences
= load.sequences + this client's placements there since then (each placement, a prefix's
registration included, counts one); prefix_group = live sequences this client placed on the
new sequence's prefix there, -1 when the prefix is not registered there; group_load and
group_bytes = what every client's placement groups claim there (queries per step, KV bytes),
the group being placed left out."""

# Free bytes within this share of the most free count as as roomy (then fewer sequences and
# the tie order decide): a few bytes more should not pull every new sequence to one server.
_ROOMY_SHARE = 20  # 5 %
_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_U64 = (1 << 64) - 1


def _tie_key(instance_id, tie_break):
    """FNV-1a 64 of the instance id's UTF-8 bytes, started from FNV's offset basis XORed with
    tie_break: cluster/placement.cc's TieKey (the two clients must agree)."""
    h = _FNV_OFFSET ^ tie_break
    for byte in instance_id.encode():
        h = ((h ^ byte) * _FNV_PRIME) & _U64
    return h


def _tie_order(tie_break):
    """The order among otherwise equal servers: the smallest instance id with tie_break 0,
    else the smallest _tie_key (each client its own seed, so clients that start together do
    not all choose the same server)."""
    if tie_break == 0:
        return lambda c: c.instance_id
    return lambda c: _tie_key(c.instance_id, tie_break)


def _roomy(eligible):
    """Those of `eligible` whose free bytes are within 5 % of the most free."""
    most_free = max([0] + [c.free_bytes for c in eligible])
    return [c for c in eligible if c.free_bytes >= most_free - most_free // _ROOMY_SHARE]


def place_sequence(candidates, sequence_bytes, prefix_bytes=0, has_prefix=False,
                   spread_group=0, exclude=(), tie_break=0):
    """Where a new sequence goes, by the cluster's rule (cluster/placement.h, PlaceSequence):

    1. with a prefix: a holder (prefix_group >= 0) with room for the sequence whose group is
       below spread_group (any group when spread_group is 0): the smallest group, then the
       roomiest, then the tie order;
    2. else the roomiest server that has room for the sequence plus, where it lacks the
       prefix, the prefix (holders at or past spread_group skipped): then the fewest
       sequences, then the tie order; the prefix is registered there;
    3. else a holder with room for the sequence whatever its group (smallest group first).

    "The roomiest": free bytes within 5 % of the most free among those eligible (free >=
    most_free - most_free // 20) count the same. The tie order: the smallest instance id when
    tie_break is 0, else the smallest FNV-1a 64 of the id from the offset basis XORed with
    tie_break (a ClusterClient draws its own tie_break at random). Returns (instance_id,
    register_prefix); ClusterError RESOURCE_EXHAUSTED naming the bytes when no candidate has
    room. Servers in `exclude` are never chosen."""
    exclude = set(exclude)
    tie = _tie_order(tie_break)

    def holder(within_spread):
        eligible = [c for c in candidates
                    if c.prefix_group >= 0 and c.instance_id not in exclude and
                    c.free_bytes >= sequence_bytes and
                    not (within_spread and spread_group > 0 and c.prefix_group >= spread_group)]
        if not eligible:
            return None
        smallest = min(c.prefix_group for c in eligible)
        return min(_roomy([c for c in eligible if c.prefix_group == smallest]), key=tie)

    if has_prefix:
        best = holder(True)
        if best is not None:
            return best.instance_id, False
    eligible = []
    for c in candidates:
        if c.instance_id in exclude:
            continue
        needed = sequence_bytes + (prefix_bytes if has_prefix and c.prefix_group < 0 else 0)
        if c.free_bytes < needed:
            continue
        if has_prefix and c.prefix_group >= 0 and spread_group > 0 and \
                c.prefix_group >= spread_group:
            continue
        eligible.append(c)
    if eligible:
        best = min(_roomy(eligible), key=lambda c: (c.sequences, tie(c)))
        return best.instance_id, has_prefix and best.prefix_group < 0
    if has_prefix:
        best = holder(False)
        if best is not None:
            return best.instance_id, False
    raise _no_room(candidates, sequence_bytes, prefix_bytes, has_prefix, exclude)


def _no_room(candidates, sequence_bytes, prefix_bytes, has_prefix, exclude):
    return ClusterError(grpc.StatusCode.RESOURCE_EXHAUSTED, (
        f"no server of the cluster has room for a new sequence: it needs {sequence_bytes} bytes"
        + (f" ({prefix_bytes} more where its prefix is not registered)" if has_prefix else "")
        + f", among {len(candidates)} members"
        + (f" ({len(exclude)} excluded)" if exclude else "")))


def rendezvous_score(group, instance_id):
    """Rendezvous hashing's score of instance_id for group: FNV-1a 64 over the group's UTF-8
    bytes, a 0 byte and the instance id's, finished by splitmix64 (cluster/placement.cc's
    RendezvousScore). A group's servers in descending score are its order."""
    h = _FNV_OFFSET
    for byte in group.encode() + b"\0" + instance_id.encode():
        h = ((h ^ byte) * _FNV_PRIME) & _U64
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _U64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _U64
    return h ^ (h >> 31)


def load_bound(total, members, slack):
    """ceil((1 + slack) x total / members): the most a server may hold (cluster/placement.h,
    LoadBound)."""
    return math.ceil((1 + max(0.0, slack)) * total / max(1, members) - 1e-9)


def place_group(candidates, group, weight, nbytes, sequence_bytes, prefix_bytes=0,
                has_prefix=False, exclude=(), load_slack=0.15):
    """Where a new placement group goes (cluster/placement.h, PlaceGroup): among the
    candidates not excluded with room for its first sequence (and the prefix where
    prefix_group < 0), those within the bound (group_load + weight <= ceil((1 + load_slack) x
    (the candidates' total group_load + weight) / their number), and the same for bytes),
    holders of the prefix first, then in descending rendezvous_score(group, id); when none is
    within the bound, the least loaded (group_load, then group_bytes) in that order. Returns
    (instance_id, register_prefix); ClusterError RESOURCE_EXHAUSTED when none has room."""
    exclude = set(exclude)
    members = [c for c in candidates if c.instance_id not in exclude]
    roomy = [c for c in members
             if c.free_bytes >= sequence_bytes +
             (prefix_bytes if has_prefix and c.prefix_group < 0 else 0)]
    if not roomy:
        raise _no_room(candidates, sequence_bytes, prefix_bytes, has_prefix, exclude)
    n = len(members)
    load_cap = load_bound(sum(c.group_load for c in members) + weight, n, load_slack)
    bytes_cap = load_bound(sum(c.group_bytes for c in members) + nbytes, n, load_slack)
    roomy.sort(key=lambda c: (not (has_prefix and c.prefix_group >= 0),
                              -rendezvous_score(group, c.instance_id)))
    chosen = next((c for c in roomy if c.group_load + weight <= load_cap and
                   c.group_bytes + nbytes <= bytes_cap), None)
    if chosen is None:
        chosen = min(roomy, key=lambda c: (c.group_load, c.group_bytes))  # min keeps the order
    return chosen.instance_id, has_prefix and chosen.prefix_group < 0
