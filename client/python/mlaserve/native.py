"""Client.decode_batch through mlaserve's C++ client (the extension mlaserve._native, built by
CMake into build/python/mlaserve/ where pybind11 is installed): over the server's same-host
data plane when it offers one on this host, else over gRPC's packed form. The arrays are
read in place (numpy through the buffer protocol; CPU torch tensors as numpy views of their
memory) and the answers written into numpy arrays by the C++ side, the GIL released while a
call is on its way. Without the extension (a pip-installed package) Client.decode_batch goes
over grpcio as before."""

import concurrent.futures

import grpc
import numpy as np

from mlaserve.batch import BatchResult
from mlaserve.bfloat16 import bf16_bits_to_float
from mlaserve.tensors import wire_array
from mlaserve.v1 import decode_pb2

try:
    from mlaserve import _native  # imported first by mlaserve/__init__.py, which says why
except ImportError:  # a pip-installed package, or a build without pybind11
    _native = None


def available():
    """Whether the C++ client is built into this package."""
    return _native is not None


class NativeCallError(grpc.RpcError):
    """A call the C++ client could not complete: the server's status, as grpc.RpcError gives
    it (code(), details()), so callers catch both alike."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self._code = next((c for c in grpc.StatusCode if c.value[0] == code),
                          grpc.StatusCode.UNKNOWN)
        self._message = message

    def code(self):
        return self._code

    def details(self):
        return self._message

    def __str__(self):
        return f"{self._code.name}: {self._message}"


def _in_place(array, dtype):
    """A C-contiguous array of the wire's element type; a CPU torch tensor without a copy
    where its dtype allows (bfloat16 as the uint16 bits numpy can hold)."""
    if array is None:
        return None
    if type(array).__module__.startswith("torch"):
        if str(array.dtype) == "torch.bfloat16":
            import torch  # only when given a torch tensor
            return array.contiguous().view(torch.int16).numpy().view(np.uint16)
        array = array.contiguous().numpy()
    return wire_array(array, dtype)[1]


class NativeBatch:
    """Client.decode_batch and decode_batch_async on the C++ client."""

    def __init__(self, target, model, data_plane, token, timeout):
        self._client = _native.NativeClient(target, data_plane, token or "", float(timeout))
        self._model = model
        # decode_batch_async's calls run here, the GIL released while each waits.
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4,
                                                           thread_name_prefix="mlaserve-native")

    def on_data_plane(self):
        return self._client.on_data_plane()

    def close(self):
        self._pool.shutdown(wait=True)

    def decode_batch(self, sequence_ids, layer, q_nope=None, q_pe=None, latent=None,
                     append_rows=None, append_positions=None, output_dtype="bf16",
                     softmax_scale=None, first_head=0, dtype=None):
        head = latent is None
        width = self._model.dv if head else self._model.dl
        # A refusal raises NativeCallError (the C++ side raises it with the status).
        out, lse, plans = self._client.decode_batch(
            list(sequence_ids), layer, _in_place(q_nope, dtype), _in_place(q_pe, dtype),
            _in_place(latent, dtype), _in_place(append_rows, dtype),
            [] if append_positions is None else [int(p) for p in
                                                 np.asarray(append_positions).reshape(-1)],
            first_head, output_dtype, softmax_scale, width)
        if out.dtype == np.uint16:
            out = bf16_bits_to_float(out)
        else:
            out = out.astype(np.float32, copy=False)
        return BatchResult(out, lse, [decode_pb2.DecodePlan.FromString(p) for p in plans])

    def decode_batch_async(self, *args, **kwargs):
        return PendingNative(self._pool.submit(self.decode_batch, *args, **kwargs))


class PendingNative:
    """decode_batch_async's call in flight on the C++ client (as PendingDecode)."""

    def __init__(self, future):
        self._future = future

    def done(self):
        return self._future.done()

    def result(self):
        return self._future.result()
