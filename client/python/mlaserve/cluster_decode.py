"""The cluster client's appends and decodes: a call's queries grouped by server, and
context-parallel sequences cut by position into parts whose answers merge by LSE."""

import collections

import grpc
import numpy as np

from mlaserve.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from mlaserve.client import DecodeResult
from mlaserve.cluster_routing import _Part
from mlaserve.errors import ClusterError
from mlaserve.tensors import BF16, FP16, FP32, wire_dtype
from mlaserve.v1 import decode_pb2, kv_cache_pb2, tensor_pb2


class _Decode:
    """ClusterClient's append and decode methods (a mixin: the state is ClusterClient's)."""

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

    def decode(self, queries, output_dtype="bf16", softmax_scale=None, timeout=None,
               batch_invariant=None):
        """Decode of head_query/latent_query queries on sequences of this client -> a list of
        DecodeResult in query order: one Decode call per server (in parallel); a query over
        several context-parallel parts is answered by sub-queries merged by LSE.
        batch_invariant: as Client.decode's, on every server's part."""
        return self._following_moves(lambda: self._decode_once(
            queries, output_dtype, softmax_scale, timeout, batch_invariant),
            self._parts_named(q.sequence_id for q in queries))

    def _decode_once(self, queries, output_dtype, softmax_scale, timeout, batch_invariant=None):
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
                softmax_scale=softmax_scale, batch_invariant=batch_invariant))
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
