"""numpy arrays <-> mlaserve.v1.Tensor (raw little-endian, row-major bytes)."""

import numpy as np

from mlaserve.bfloat16 import bf16_bits_to_float, float_to_bf16_bits
from mlaserve.v1 import tensor_pb2

BF16 = tensor_pb2.DTYPE_BF16
FP16 = tensor_pb2.DTYPE_FP16
FP32 = tensor_pb2.DTYPE_FP32

_NAMES = {"bf16": BF16, "bfloat16": BF16, "fp16": FP16, "float16": FP16, "fp32": FP32,
          "float32": FP32}


def wire_dtype(dtype):
    """'bf16' / 'fp16' / 'fp32' (or a DTYPE_* value) -> the DType enum value."""
    if isinstance(dtype, str):
        try:
            return _NAMES[dtype.lower()]
        except KeyError:
            raise ValueError(f"unknown dtype {dtype!r}; use bf16, fp16 or fp32") from None
    return dtype


def wire_array(array, dtype=None):
    """A numpy array as (DType value, contiguous little-endian array of the wire's element
    type), converted as to_tensor() describes."""
    array = np.asarray(array)
    if array.dtype == np.uint16:
        if dtype is not None and wire_dtype(dtype) != BF16:
            raise ValueError("a uint16 array holds bf16 bit patterns; it can only be sent as bf16")
        target, data = BF16, array
    else:
        if not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"cannot send a {array.dtype} array as a tensor")
        target = wire_dtype(dtype) if dtype is not None else (
            FP16 if array.dtype == np.float16 else FP32)
        if target == BF16:
            data = float_to_bf16_bits(array)
        elif target == FP16:
            data = array.astype(np.float16)
        else:
            data = array.astype(np.float32)
    return target, np.ascontiguousarray(data).astype(data.dtype.newbyteorder("<"), copy=False)


def to_tensor(array, dtype=None):
    """A numpy array as a wire Tensor.

    numpy has no bfloat16, so a uint16 array is taken as bf16 bit patterns (see
    mlaserve.bfloat16). Without `dtype` the array's own type is kept: uint16 -> BF16,
    float16 -> FP16, float32/float64 -> FP32. With `dtype` float arrays are converted to it
    (bf16 and fp16 round to nearest even, as the server would).
    """
    target, data = wire_array(array, dtype)
    return tensor_pb2.Tensor(dtype=target, shape=list(data.shape), data=data.tobytes())


def from_tensor(tensor):
    """A wire Tensor as a float32 numpy array of its shape (exact for every dtype)."""
    return from_bytes(tensor.dtype, tensor.data, tuple(tensor.shape))


def from_bytes(dtype, data, shape):
    """Raw wire bytes of a DType as a float32 numpy array of `shape` (exact for every dtype)."""
    if dtype == BF16:
        values = bf16_bits_to_float(np.frombuffer(data, dtype="<u2"))
    elif dtype == FP16:
        values = np.frombuffer(data, dtype="<f2").astype(np.float32)
    elif dtype == FP32:
        values = np.frombuffer(data, dtype="<f4").astype(np.float32, copy=False)
        if not values.flags.writeable:  # over immutable bytes: the caller gets its own copy
            values = values.copy()
    else:
        raise ValueError(f"tensor has no valid dtype ({dtype})")
    return values.reshape(shape)
