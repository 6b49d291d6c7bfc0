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
from mlaserve.errors import StatusError
from mlaserve.bfloat16 import bf16_bits_to_float
from mlaserve.tensors import BF16, FP16, FP32, wire_array, wire_dtype
from mlaserve.v1 import decode_pb2

_native = None  # the extension, once loaded
_tried = False


def available():
    """Whether the C++ client is built into this package (loading it on the first ask;
    mlaserve/__init__.py loads it earlier under protobuf's C++ implementation, and says why)."""
    global _native, _tried
    if not _tried:
        _tried = True
        try:
            from mlaserve import _native as module
            _native = module
        except ImportError:  # a pip-installed package, or a build without pybind11
            _native = None
    return _native is not None


class NativeCallError(StatusError):
    """A call the C++ client could not complete: its status (a grpc code number from the C++
    side, and the message), caught as grpcio's errors are."""

    def __init__(self, code, message):
        super().__init__(next((c for c in grpc.StatusCode if c.value[0] == code),
                              grpc.StatusCode.UNKNOWN), message)


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


# The arrays the C++ side writes each output dtype's answers into (bf16 as its bits).
_OUTPUT_TYPES = {"bf16": np.uint16, "fp16": np.float16, "fp32": np.float32}
_OUTPUT_NAMES = {BF16: "bf16", FP16: "fp16", FP32: "fp32"}


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
                     softmax_scale=None, first_head=0, dtype=None, batch_invariant=None):
        head = latent is None
        width = self._model.dv if head else self._model.dl
        q = _in_place(q_nope if head else latent, dtype)
        sequences, sq, heads = q.shape[:3] if q.ndim == 4 else (len(sequence_ids), 0, 0)
        output_dtype = _OUTPUT_NAMES[wire_dtype(output_dtype)]
        out = np.empty((sequences, sq, heads, width), _OUTPUT_TYPES[output_dtype])
        lse = np.empty((sequences, sq, heads), np.float32)
        # A refusal raises NativeCallError (the C++ side raises it with the status).
        plans = self._client.decode_batch(
            list(sequence_ids), layer, q if head else None, _in_place(q_pe, dtype),
            None if head else q, _in_place(append_rows, dtype),
            [] if append_positions is None else [int(p) for p in
                                                 np.asarray(append_positions).reshape(-1)],
            first_head, output_dtype, softmax_scale, out, lse, batch_invariant)
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
