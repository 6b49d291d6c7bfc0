"""The safetensors format (a little-endian u64 header length, a JSON header, the raw tensors),
written and read with numpy, in the layout of DeepSeek's checkpoints (the server's --weights
reads `model.layers.{i}.self_attn.kv_b_proj.weight` from the same file)."""

import json
import struct

import numpy as np

from mlaserve.bfloat16 import bf16_bits_to_float

_DTYPES = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}


def save(path, tensors):
    """tensors: {name: (dtype name, numpy array)}; BF16 arrays are uint16 bit patterns."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        dtype, array = tensors[name]
        data = np.ascontiguousarray(array.astype(_DTYPES[dtype], copy=False)).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load(path):
    """{name: float32 array} of every tensor (BF16 widened)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=_DTYPES[entry["dtype"]])
        array = array.reshape(entry["shape"])
        out[name] = bf16_bits_to_float(array) if entry["dtype"] == "BF16" else \
            array.astype(np.float32)
    return out
