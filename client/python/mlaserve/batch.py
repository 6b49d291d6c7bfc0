"""One layer's queries of many sequences as stacked arrays, in one Decode call.

What a framework's decode loop sends once per layer and step: q [B, sq, heads, d] for B
sequences, their new KV rows [B, n, dl + dr] appended first, the answers back as
out [B, sq, heads, width] and lse [B, sq, heads]. It travels in DecodeRequest's packed form
(PackedQueries: one tensor per field, each array's bytes copied once into the message) and
comes back as PackedResults, whose tensors are the answer arrays as they are.
"""

import collections

import numpy as np

from mlaserve.tensors import from_bytes, wire_array, wire_dtype
from mlaserve.v1 import decode_pb2

BatchResult = collections.namedtuple("BatchResult", ["out", "lse", "plans"])
BatchResult.__doc__ = """A batch's answers: out [B, sq, heads, width] and lse [B, sq, heads]
(float32, natural log, -inf where a token saw no key), and the B DecodePlan messages."""


def batch_request(sequence_ids, layer, q_nope=None, q_pe=None, latent=None, append_rows=None,
                  append_positions=None, dtype=None, first_head=0, output_dtype="bf16",
                  softmax_scale=None, batch_invariant=None):
    """A DecodeRequest for len(sequence_ids) = B sequences at one layer.

    Head space: q_nope [B, sq, heads, dn] and q_pe [B, sq, heads, dr] (RoPE applied), heads
    the model's [first_head, first_head + heads). Latent: latent [B, sq, heads, dl + dr].
    append_rows [B, n, dl + dr] with append_positions [B]: each sequence's rows appended at
    its position first (both or neither). Arrays convert as to_tensor() does (`dtype`; a
    uint16 array is bf16 bits). Raises ValueError naming the argument whose shape does not
    fit the batch; the server checks the rest (widths, heads, positions) and names the field.
    """
    ids = list(sequence_ids)
    count = len(ids)
    if count == 0:
        raise ValueError("sequence_ids: at least one sequence")
    head = latent is None
    if head and (q_nope is None or q_pe is None):
        raise ValueError("q_nope and q_pe (a head-space batch) or latent (a latent one)")
    if not head and (q_nope is not None or q_pe is not None):
        raise ValueError("latent with q_nope or q_pe: a batch is in one space")
    named = [("q_nope", q_nope), ("q_pe", q_pe)] if head else [("latent", latent)]
    queries = [(name,) + wire_array(array, dtype) for name, array in named]
    for name, _, data in queries:
        if data.ndim != 4 or data.shape[0] != count:
            raise ValueError(f"{name}: want [{count} sequences, sq, heads, width], got shape "
                             f"{list(data.shape)}")
    sq, heads = queries[0][2].shape[1:3]
    if head and queries[1][2].shape[1:3] != (sq, heads):
        raise ValueError(f"q_pe: [sq, heads] {list(queries[1][2].shape[1:3])} are not "
                         f"q_nope's {[sq, heads]}")
    if (append_rows is None) != (append_positions is None):
        raise ValueError("append_rows and append_positions go together")
    if append_rows is not None:
        rows_dtype, rows = wire_array(append_rows, dtype)
        if rows.ndim != 3 or rows.shape[0] != count:
            raise ValueError(f"append_rows: want [{count} sequences, rows, width], got shape "
                             f"{list(rows.shape)}")
        positions = [int(p) for p in np.asarray(append_positions).reshape(-1)]
        if len(positions) != count:
            raise ValueError(f"append_positions: want {count} positions, got {len(positions)}")

    request = decode_pb2.DecodeRequest()
    request.options.output_dtype = wire_dtype(output_dtype)
    if softmax_scale is not None:
        request.options.softmax_scale = float(softmax_scale)
    if batch_invariant is not None:
        request.options.batch_invariant = bool(batch_invariant)
    packed = request.packed
    packed.sequence_ids.extend(ids)
    packed.layer = layer
    if head:
        _fill(packed.head.q_nope, *queries[0][1:])
        _fill(packed.head.q_pe, *queries[1][1:])
        packed.head.first_head = first_head
    else:
        _fill(packed.latent, *queries[0][1:])
    if append_rows is not None:
        _fill(packed.append_rows, rows_dtype, rows)
        packed.append_positions.extend(positions)
    return request


def _fill(tensor, dtype, data):
    """`tensor` := the batch's converted array `data`, as it is."""
    tensor.dtype = dtype
    tensor.shape.extend(data.shape)
    tensor.data = data.tobytes()


def batch_result(response):
    """A DecodeResponse of a batch_request as a BatchResult."""
    if response.HasField("packed"):
        packed = response.packed
        return BatchResult(_array(packed.out), _array(packed.lse), list(packed.plans))
    # A server older than the packed form answers a list (it would not have parsed the
    # request, so this is for list-form responses handed here by other code).
    results = response.results
    count = len(results)
    return BatchResult(_stacked([r.out for r in results], count),
                       _stacked([r.lse for r in results], count),
                       [r.plan for r in results])


def _array(tensor):
    return from_bytes(tensor.dtype, tensor.data, tuple(tensor.shape))


def _stacked(tensors, count):
    first = tensors[0]
    # Joined into a bytearray: numpy can then use it in place, the answers copied once.
    return from_bytes(first.dtype, bytearray().join([t.data for t in tensors]),
                      (count,) + tuple(first.shape))
