"""Client.decode_batch (mlaserve.batch) against the list form on a real server, for
python_smoke_test: its request in the packed form carrying the arrays' own bytes, the same
answers as head_query/latent_query in one list-form call (bit for bit in fp32), the async
form alike; a batch's shapes that do not agree raise ValueError naming the argument before
anything is sent; a field the server refuses is named with its packed field's index and
changes nothing."""

import grpc
import numpy as np

import mlaserve
from mlaserve.batch import batch_request
from mlaserve.client import _decode_request


def check_decode_batch(target, rng, failures):
    client = mlaserve.Client(target)
    # The build tree's package has the C++ client: decode_batch then goes over the server's
    # same-host data plane, and every check below is of that path.
    if mlaserve.native.available() and not client.on_data_plane():
        failures.append("decode_batch: the C++ client did not open the server's data plane")
    model = client.server_info().model
    width, heads = model.kv_row_width, model.heads
    lengths = [1, 37, 70]
    ids = [f"batch/{i}" for i in range(len(lengths))]
    try:
        for sequence_id, length in zip(ids, lengths):
            client.create_sequence(sequence_id)
            client.append_kv(sequence_id, 1, 0, rng.standard_normal((length, width)), "bf16")
        sq = 2
        q_nope = rng.standard_normal((len(ids), sq, heads, model.dn))
        q_pe = rng.standard_normal((len(ids), sq, heads, model.dr))
        rows = rng.standard_normal((len(ids), sq, width))
        arrays = dict(q_nope=q_nope, q_pe=q_pe, append_rows=rows, append_positions=lengths)
        as_list = [mlaserve.head_query(ids[b], 1, q_nope[b], q_pe[b], append_rows=rows[b],
                                       append_position=lengths[b], dtype="bf16")
                   for b in range(len(ids))]
        packed = batch_request(ids, 1, dtype="bf16", output_dtype="fp32", **arrays).packed
        listed_request = _decode_request(as_list, "fp32", None)
        if (list(packed.sequence_ids) != ids or list(packed.head.q_nope.shape) != list(q_nope.shape)
                or packed.head.q_nope.data != b"".join(
                    q.head.q_nope.data for q in listed_request.queries)
                or packed.append_rows.data != b"".join(
                    q.append_rows.data for q in listed_request.queries)):
            failures.append("decode_batch: its packed request does not carry the list form's bytes")

        batch = client.decode_batch(ids, 1, dtype="bf16", output_dtype="fp32", **arrays)
        # The rows were appended by the batch; the list form's same appends are retries.
        listed = client.decode(as_list, output_dtype="fp32")
        if (batch.out.shape != (len(ids), sq, heads, model.dv)
                or batch.lse.shape != (len(ids), sq, heads) or len(batch.plans) != len(ids)):
            failures.append(f"decode_batch: out {batch.out.shape}, lse {batch.lse.shape}")
        elif not (np.array_equal(batch.out, np.stack([r.out for r in listed]))
                  and np.array_equal(batch.lse, np.stack([r.lse for r in listed]))):
            failures.append("decode_batch answered otherwise than decode")
        pending = client.decode_batch_async(ids, 1, dtype="bf16", output_dtype="fp32", **arrays)
        again = pending.result()
        if not (np.array_equal(again.out, batch.out) and np.array_equal(again.lse, batch.lse)):
            failures.append("decode_batch_async answered otherwise than decode_batch")
        lengths_now = [list(client.get_sequence(i).layer_lengths) for i in ids]

        latent = rng.standard_normal((len(ids), 1, heads, width))
        batch = client.decode_batch(ids, 1, latent=latent, dtype="bf16", output_dtype="fp32")
        listed = client.decode([mlaserve.latent_query(ids[b], 1, latent[b], dtype="bf16")
                                for b in range(len(ids))], output_dtype="fp32")
        if batch.out.shape != (len(ids), 1, heads, model.dl) or not np.array_equal(
                batch.out, np.stack([r.out for r in listed])):
            failures.append("decode_batch in latent space answered otherwise than decode")

        refused = [
            ("q_pe", dict(arrays, q_pe=q_pe[:2])),
            ("q_pe", dict(arrays, q_pe=q_pe[:, :1])),
            ("append_rows and append_positions", dict(arrays, append_positions=None)),
            ("append_positions", dict(arrays, append_positions=lengths[:2])),
            ("latent", dict(arrays, latent=latent)),
            ("q_nope and q_pe", dict(q_nope=q_nope)),
        ]
        for name, kwargs in refused:
            try:
                client.decode_batch(ids, 1, **kwargs)
                failures.append(f"decode_batch took a batch whose {name} does not fit")
            except ValueError as error:
                if name not in str(error):
                    failures.append(f"decode_batch's error does not name {name}: {error}")
        try:
            client.decode_batch([], 1, latent=latent[:0])
            failures.append("decode_batch took no sequences")
        except ValueError as error:
            if "sequence_ids" not in str(error):
                failures.append(f"decode_batch's error does not name sequence_ids: {error}")

        # The server's checks name the query: q_pe one element too narrow, with new rows
        # that must not be appended.
        try:
            client.decode_batch(ids, 1, q_nope=q_nope, q_pe=q_pe[..., 1:],
                                append_rows=rows, append_positions=[n + sq for n in lengths])
            failures.append("the server took a batch with a narrow q_pe")
        except grpc.RpcError as error:
            if (error.code() != grpc.StatusCode.INVALID_ARGUMENT
                    or "packed.head.q_pe[0]" not in error.details()):
                failures.append(f"a narrow q_pe: {error.code()} {error.details()}")
        if [list(client.get_sequence(i).layer_lengths) for i in ids] != lengths_now:
            failures.append("a refused batch changed its sequences")
    finally:
        _release(client, ids)


def check_batch_invariant(target, rng, failures):
    """Batch-invariant answers through both Python paths: each query of a decode_batch call in
    the mode answers, bit for bit, as it does alone in a list-form call in the mode, and runs
    absorb-only; long and short sequences, so that split-KV would cut a lone query otherwise."""
    client = mlaserve.Client(target)
    model = client.server_info().model
    lengths = [5, 700, 2500, 3000, 64, 1]
    ids = [f"invariant/{i}" for i in range(len(lengths))]
    try:
        for sequence_id, length in zip(ids, lengths):
            client.create_sequence(sequence_id)
            client.append_kv(sequence_id, 0, 0, rng.standard_normal((length, model.kv_row_width)),
                             "bf16")
        q_nope = rng.standard_normal((len(ids), 1, model.heads, model.dn))
        q_pe = rng.standard_normal((len(ids), 1, model.heads, model.dr))
        batch = client.decode_batch(ids, 0, q_nope=q_nope, q_pe=q_pe, dtype="bf16",
                                    output_dtype="fp32", batch_invariant=True)
        for b in (2, 3):
            alone = client.decode([mlaserve.head_query(ids[b], 0, q_nope[b], q_pe[b],
                                                       dtype="bf16")],
                                  output_dtype="fp32", batch_invariant=True)[0]
            if not (np.array_equal(alone.out, batch.out[b]) and
                    np.array_equal(alone.lse, batch.lse[b])):
                failures.append(f"batch_invariant: query {b} answered otherwise alone")
            if alone.plan.formulation != batch.plans[b].formulation:
                failures.append(f"batch_invariant: query {b} planned otherwise alone")
    finally:
        _release(client, ids)


def _release(client, ids):
    """Releases a case's sequences (those it made; others are gone already) and closes."""
    for sequence_id in ids:
        try:
            client.release_sequence(sequence_id)
        except grpc.RpcError:
            pass
    client.close()
