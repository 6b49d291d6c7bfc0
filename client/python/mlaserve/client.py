"""A retrying client of mlaserve.v1.MlaServe with numpy arrays in and out."""

import collections
import random
import time

import grpc
import numpy as np

from mlaserve import native
from mlaserve.batch import batch_request, batch_result
from mlaserve.fp8 import quantize_rows
from mlaserve.tensors import BF16, FP16, from_tensor, to_tensor, wire_dtype
from mlaserve.transport import explain
from mlaserve.v1 import (admin_pb2, decode_pb2, kv_cache_pb2, mlaserve_pb2_grpc,
                         server_info_pb2, tensor_pb2)

DecodeResult = collections.namedtuple("DecodeResult", ["out", "lse", "plan"])
DecodeResult.__doc__ = """One query's answer: out [sq, heads, width] and lse [sq, heads]
(float32, natural log, -inf where a token saw no key), and the DecodePlan message."""


def _kv_dtype(name):
    """"bf16" / "fp8" / None -> the wire's KvDtype."""
    values = {None: tensor_pb2.KV_DTYPE_UNSPECIFIED, "bf16": tensor_pb2.KV_DTYPE_BF16,
              "fp8": tensor_pb2.KV_DTYPE_FP8}
    if name not in values:
        raise ValueError(f"kv_dtype must be 'bf16', 'fp8' or None, got {name!r}")
    return values[name]


def head_query(sequence_id, layer, q_nope, q_pe, append_rows=None, append_position=None,
               dtype=None):
    """A head-space query: q_nope [sq, heads, dn], q_pe [sq, heads, dr] (RoPE applied).

    With append_rows [n, dl + dr], those KV rows are appended at append_position first.
    """
    q_nope = np.asarray(q_nope)
    query = decode_pb2.DecodeQuery(
        sequence_id=sequence_id, layer=layer, sq=q_nope.shape[0],
        head=decode_pb2.HeadSpaceQuery(q_nope=to_tensor(q_nope, dtype),
                                       q_pe=to_tensor(q_pe, dtype)))
    return _with_append(query, append_rows, append_position, dtype)


def latent_query(sequence_id, layer, q, append_rows=None, append_position=None, dtype=None):
    """A latent (absorbed) query q [sq, heads, dl + dr]; its output is [sq, heads, dl]."""
    q = np.asarray(q)
    query = decode_pb2.DecodeQuery(sequence_id=sequence_id, layer=layer, sq=q.shape[0],
                                   latent=to_tensor(q, dtype))
    return _with_append(query, append_rows, append_position, dtype)


def _with_append(query, rows, position, dtype):
    if (rows is None) != (position is None):
        raise ValueError("append_rows and append_position go together")
    if rows is not None:
        query.append_rows.CopyFrom(to_tensor(rows, dtype))
        query.append_position = position
    return query


def tls_channel_credentials(ca, cert=None, key=None):
    """gRPC channel credentials from PEM files: the CA that signed the server's certificate,
    and the client's certificate and key (both or neither) for mutual TLS."""
    if (cert is None) != (key is None):
        raise ValueError("tls_cert and tls_key go together: give both or neither")

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    return grpc.ssl_channel_credentials(
        root_certificates=read(ca),
        private_key=read(key) if key is not None else None,
        certificate_chain=read(cert) if cert is not None else None)


class Client:
    """One channel to a server. Thread-safe; reuse it.

    Every call is retried on UNAVAILABLE (server draining, queue full, not listening yet)
    with exponential backoff, within `timeout` seconds for the whole call: every call of
    this API is idempotent by client-chosen ids (and a Decode's append by its position).
    """

    def __init__(self, target="127.0.0.1:50051", timeout=30.0, max_attempts=4,
                 initial_backoff=0.025, max_backoff=1.0, append_chunk_bytes=1 << 20,
                 tls_ca=None, tls_cert=None, tls_key=None, tls_server_name=None, token=None,
                 data_plane="auto"):
        """tls_ca: path of the PEM CA that signed the server's certificate (TLS; plaintext
        without it). tls_cert, tls_key: the client's certificate and key, for a server that
        requires one (mutual TLS). tls_server_name: the name the server's certificate
        carries, when it is not the target's host. token: the tenant's bearer token, for a
        server with --auth_tokens_file (sent as `authorization: Bearer TOKEN` on every call;
        in the clear without TLS). data_plane: how decode_batch travels where the C++ client
        is built into the package (mlaserve.native): "auto" over the server's same-host data
        plane when it offers one on this host, else gRPC's packed form through the C++
        client; "shm" needs the plane; "grpc" always through grpcio (as without the
        extension, and with TLS)."""
        self._metadata = (("authorization", f"Bearer {token}"),) if token else None
        # Decode answers for large batches exceed gRPC's default 4 MiB receive limit.
        options = [("grpc.max_receive_message_length", -1)]
        if tls_ca is None:
            if tls_cert is not None or tls_key is not None:
                raise ValueError("tls_cert and tls_key need tls_ca")
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            credentials = tls_channel_credentials(tls_ca, tls_cert, tls_key)
            if tls_server_name:
                options.append(("grpc.ssl_target_name_override", tls_server_name))
            self._channel = grpc.secure_channel(target, credentials, options=options)
        self._tls = tls_ca is not None
        self._stub = mlaserve_pb2_grpc.MlaServeStub(self._channel)
        self._timeout = timeout
        self._max_attempts = max_attempts
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._append_chunk_bytes = append_chunk_bytes
        self._info = None
        if data_plane not in ("auto", "shm", "grpc"):
            raise ValueError(f"data_plane: {data_plane!r} is not auto, shm or grpc")
        if data_plane == "shm" and not native.available():
            raise ValueError("data_plane: 'shm' needs the C++ client (mlaserve._native), "
                             "which this package was built without")
        self._target, self._token, self._data_plane = target, token, data_plane
        self._native = None  # made on the first decode_batch

    def close(self):
        if self._native is not None:
            self._native.close()
        self._channel.close()

    def _native_batch(self):
        """The C++ client decode_batch goes through, or None (not built, TLS, or asked not)."""
        if self._native is None and native.available() and not self._tls and (
                self._data_plane != "grpc"):
            model = (self._info or self.server_info()).model
            self._native = native.NativeBatch(self._target, model, self._data_plane,
                                              self._token, self._timeout)
        return self._native

    def on_data_plane(self):
        """Whether decode_batch goes over the server's same-host data plane."""
        batch = self._native_batch()
        return batch is not None and batch.on_data_plane()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_ready(self, timeout=30.0):
        """Blocks until the channel connects; raises grpc.FutureTimeoutError otherwise."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def _call(self, method, request, timeout=None):
        deadline = time.monotonic() + (self._timeout if timeout is None else timeout)
        backoff = self._initial_backoff
        attempt = 1
        while True:
            # A client stream's messages (a list) are sent afresh by every attempt.
            message = iter(request) if isinstance(request, list) else request
            try:
                return method(message, timeout=max(0.0, deadline - time.monotonic()),
                              metadata=self._metadata)
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE or attempt >= self._max_attempts:
                    raise explain(error, self._tls) from error
                pause = backoff * random.uniform(0.5, 1.0)
                if time.monotonic() + pause >= deadline:
                    raise explain(error, self._tls) from error
                time.sleep(pause)
                backoff = min(2 * backoff, self._max_backoff)
                attempt += 1

    # --- Server ------------------------------------------------------------------------

    def server_info(self):
        """GetServerInfoResponse: model dims and scale, devices, thresholds, limits."""
        info = self._call(self._stub.GetServerInfo, server_info_pb2.GetServerInfoRequest())
        self._info = info
        return info

    # --- KV cache ----------------------------------------------------------------------

    def register_prefix(self, prefix_id, latent, parent_id="", dtype=None, kv_dtype=None):
        """latent [layers, tokens, dl + dr] for every layer of the model; kv_dtype "bf16" or
        "fp8" (None: the parent's, or the server's default)."""
        self._call(self._stub.RegisterPrefix, kv_cache_pb2.RegisterPrefixRequest(
            prefix_id=prefix_id, parent_id=parent_id, latent=to_tensor(latent, dtype),
            kv_dtype=_kv_dtype(kv_dtype)))

    def release_prefix(self, prefix_id):
        self._call(self._stub.ReleasePrefix, kv_cache_pb2.ReleasePrefixRequest(prefix_id=prefix_id))

    def create_sequence(self, sequence_id, prefix_id="", kv_dtype=None):
        """kv_dtype "bf16" or "fp8" (None: the prefix's, or the server's default)."""
        return self._call(self._stub.CreateSequence, kv_cache_pb2.CreateSequenceRequest(
            sequence_id=sequence_id, prefix_id=prefix_id,
            kv_dtype=_kv_dtype(kv_dtype))).sequence

    def fork_sequence(self, source_sequence_id, new_sequence_id):
        return self._call(self._stub.ForkSequence, kv_cache_pb2.ForkSequenceRequest(
            source_sequence_id=source_sequence_id, new_sequence_id=new_sequence_id)).sequence

    def release_sequence(self, sequence_id):
        self._call(self._stub.ReleaseSequence,
                   kv_cache_pb2.ReleaseSequenceRequest(sequence_id=sequence_id))

    def get_sequence(self, sequence_id):
        return self._call(self._stub.GetSequence,
                          kv_cache_pb2.GetSequenceRequest(sequence_id=sequence_id)).sequence

    def append_kv(self, sequence_id, layer, start_position, rows, dtype=None):
        """Appends rows [n, dl + dr] to one layer, streamed in chunks below the message limit.

        Retrying the whole stream is safe: rows already appended are skipped by the server.
        """
        rows = np.asarray(rows)
        if rows.ndim != 2 or len(rows) == 0:
            # Not splittable: sent whole, so the server names what is wrong.
            chunks = [kv_cache_pb2.AppendKvChunk(sequence_id=sequence_id, layer=layer,
                                                 start_position=start_position,
                                                 rows=to_tensor(rows, dtype))]
        else:
            element_bytes = 2 if wire_dtype(dtype) in (BF16, FP16) or (
                dtype is None and rows.dtype in (np.uint16, np.float16)) else 4
            per_chunk = max(1, self._append_chunk_bytes // (rows.shape[1] * element_bytes))
            chunks = [kv_cache_pb2.AppendKvChunk(
                sequence_id=sequence_id, layer=layer, start_position=start_position + first,
                rows=to_tensor(rows[first:first + per_chunk], dtype))
                for first in range(0, len(rows), per_chunk)]
        return self._call(self._stub.AppendKv, chunks)

    def append_kv_fp8(self, sequence_id, layer, start_position, rows):
        """Appends rows [n, dl + dr] to one layer of an FP8 sequence, quantised here
        (mlaserve.fp8: the bytes the server would write) and sent as 644-byte FP8 rows."""
        rows = np.asarray(rows)
        dl = self.server_info().model.dl if self._info is None else self._info.model.dl
        data = quantize_rows(rows, dl)
        row_bytes = len(data) // max(1, len(rows))
        per_chunk = max(1, self._append_chunk_bytes // max(1, row_bytes))
        chunks = [kv_cache_pb2.AppendKvChunk(
            sequence_id=sequence_id, layer=layer, start_position=start_position + first,
            fp8_rows=tensor_pb2.Fp8Rows(
                count=min(per_chunk, len(rows) - first),
                data=data[first * row_bytes:(first + per_chunk) * row_bytes]))
            for first in range(0, len(rows), per_chunk)]
        return self._call(self._stub.AppendKv, chunks)

    # --- Admin -------------------------------------------------------------------------

    def list_prefixes(self):
        """Every prefix the caller's tenant holds (ListPrefixes, all pages): PrefixSummary
        messages in id order."""
        return self._list(self._stub.ListPrefixes, admin_pb2.ListPrefixesRequest(),
                          "prefixes")

    def list_sequences(self, prefix_id=""):
        """Every sequence (started on prefix_id, when given), all pages of ListSequences:
        SequenceSummary messages in id order."""
        return self._list(self._stub.ListSequences,
                          admin_pb2.ListSequencesRequest(prefix_id=prefix_id), "sequences")

    def migrate_sequences(self, target, sequence_ids=(), leave_cluster=False, stop_after=False,
                          timeout=600):
        """Moves sequences of this server to the server at `target` (host:port, reached by this
        server in plaintext): sequence_ids, or every sequence when empty (docs/cluster.md,
        "Migration and drain"). leave_cluster: this server first leaves its cluster;
        stop_after: it stops once it has answered. Returns the MigrateSequencesResponse
        (sequences, prefixes, tokens, bytes, seconds, held_seconds). Never retried (a move is
        not idempotent). When the server answers an error, nothing moved (e.g. UNAVAILABLE
        "target: server ADDRESS: ..." when the target did not answer it; NOT_FOUND naming
        sequence_ids[i] for a sequence it does not hold)."""
        request = admin_pb2.MigrateSequencesRequest(
            target=target, sequence_ids=list(sequence_ids), leave_cluster=leave_cluster,
            stop_after=stop_after)
        return self._stub.MigrateSequences(request, timeout=timeout, metadata=self._metadata)

    def _list(self, method, request, field):
        entries = []
        request.page_size = 1000
        while True:
            answer = self._call(method, request)
            entries += list(getattr(answer, field))
            if not answer.next_page_token:
                return entries
            request.page_token = answer.next_page_token

    # --- Decode ------------------------------------------------------------------------

    def decode(self, queries, output_dtype="bf16", timeout=None, softmax_scale=None,
               batch_invariant=None):
        """One Decode call: a list of head_query/latent_query -> list of DecodeResult.
        softmax_scale (None: the model's) is the factor on q.k, applied in fp32 by the
        server. batch_invariant (None: the server's default) asks for answers bit for bit
        independent of the other callers' queries batched with these (docs/api.md)."""
        request = _decode_request(queries, output_dtype, softmax_scale, batch_invariant)
        return _results(self._call(self._stub.Decode, request, timeout))

    def decode_async(self, queries, output_dtype="bf16", timeout=None, softmax_scale=None,
                     batch_invariant=None):
        """decode() without waiting for the answer: the call is sent now and gRPC's own
        threads carry it (without Python's GIL) while the caller computes; the returned
        PendingDecode's result() gives decode()'s list. A framework's micro-batch ping-pong
        keeps one micro-batch's call in flight this way while another's layers run. An
        UNAVAILABLE answer is retried in result(), as decode() retries it, within `timeout`."""
        return self._send(_decode_request(queries, output_dtype, softmax_scale,
                                          batch_invariant), timeout, _results)

    def decode_batch(self, sequence_ids, layer, q_nope=None, q_pe=None, latent=None,
                     append_rows=None, append_positions=None, output_dtype="bf16",
                     timeout=None, softmax_scale=None, first_head=0, dtype=None,
                     batch_invariant=None):
        """One Decode call for B sequences at one layer with stacked arrays (mlaserve.batch:
        q_nope [B, sq, heads, dn] and q_pe [B, sq, heads, dr], or latent [B, sq, heads,
        dl + dr]; append_rows [B, n, dl + dr] at append_positions [B]) -> BatchResult
        (out [B, sq, heads, width], lse [B, sq, heads], plans). The same call as decode() with
        B queries, at about half its Python time: what a framework sends per layer. Through
        the C++ client, and the data plane, where it is built (mlaserve.native)."""
        batch = self._native_batch()
        if batch is not None:
            return batch.decode_batch(sequence_ids, layer, q_nope, q_pe, latent, append_rows,
                                      append_positions, output_dtype, softmax_scale, first_head,
                                      dtype, batch_invariant)
        request = batch_request(sequence_ids, layer, q_nope, q_pe, latent, append_rows,
                                append_positions, dtype, first_head, output_dtype, softmax_scale,
                                batch_invariant)
        return batch_result(self._call(self._stub.Decode, request, timeout))

    def decode_batch_async(self, sequence_ids, layer, q_nope=None, q_pe=None, latent=None,
                           append_rows=None, append_positions=None, output_dtype="bf16",
                           timeout=None, softmax_scale=None, first_head=0, dtype=None,
                           batch_invariant=None):
        """decode_batch() sent now, answered by the returned PendingDecode's result() (a
        BatchResult), as decode_async() is."""
        batch = self._native_batch()
        if batch is not None:
            return batch.decode_batch_async(sequence_ids, layer, q_nope, q_pe, latent,
                                            append_rows, append_positions, output_dtype,
                                            softmax_scale, first_head, dtype, batch_invariant)
        request = batch_request(sequence_ids, layer, q_nope, q_pe, latent, append_rows,
                                append_positions, dtype, first_head, output_dtype, softmax_scale,
                                batch_invariant)
        return self._send(request, timeout, batch_result)

    def _send(self, request, timeout, answer):
        timeout = self._timeout if timeout is None else timeout
        future = self._stub.Decode.future(request, timeout=timeout, metadata=self._metadata)
        return PendingDecode(self, request, future, time.monotonic() + timeout, answer)

    def decode_stream(self, requests, timeout=None):
        """A DecodeStream. `requests` yields (request_id, [queries]); the result yields
        (request_id, answer) in completion order, where answer is a list of DecodeResult or,
        for a request that failed (the stream goes on), a StreamError. Not retried."""
        def wire_requests():
            for request_id, queries in requests:
                yield decode_pb2.DecodeStreamRequest(
                    request_id=request_id, request=decode_pb2.DecodeRequest(queries=queries))
        for answer in self._stub.DecodeStream(wire_requests(), timeout=timeout,
                                              metadata=self._metadata):
            if answer.status.code != 0:
                yield answer.request_id, StreamError(_STATUS_CODES[answer.status.code],
                                                     answer.status.message)
            else:
                yield answer.request_id, [
                    DecodeResult(from_tensor(r.out), from_tensor(r.lse), r.plan)
                    for r in answer.response.results]


def _decode_request(queries, output_dtype, softmax_scale, batch_invariant=None):
    request = decode_pb2.DecodeRequest(queries=queries)
    request.options.output_dtype = wire_dtype(output_dtype)
    if softmax_scale is not None:
        request.options.softmax_scale = float(softmax_scale)
    if batch_invariant is not None:
        request.options.batch_invariant = bool(batch_invariant)
    return request


def _results(response):
    return [DecodeResult(from_tensor(r.out), from_tensor(r.lse), r.plan)
            for r in response.results]


class PendingDecode:
    """A Decode call in flight (Client.decode_async, Client.decode_batch_async)."""

    def __init__(self, client, request, future, deadline, answer):
        self._client, self._request, self._future = client, request, future
        self._deadline = deadline
        self._answer = answer  # the response as the caller's method returns it

    def done(self):
        """Whether the answer (or an error) has come; result() then does not wait for it."""
        return self._future.done()

    def result(self):
        """The call's answer (decode()'s list, or decode_batch()'s BatchResult), waiting for
        it; raises grpc.RpcError as decode() does."""
        try:
            response = self._future.result()
        except grpc.RpcError as error:
            remaining = self._deadline - time.monotonic()
            if error.code() != grpc.StatusCode.UNAVAILABLE or remaining <= 0:
                raise explain(error, self._client._tls) from error
            response = self._client._call(self._client._stub.Decode, self._request, remaining)
        return self._answer(response)


class StreamError(Exception):
    """A DecodeStream request's in-band error: a grpc.StatusCode and the server's message."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
