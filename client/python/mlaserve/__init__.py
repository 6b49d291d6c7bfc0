"""Python client of mlaserve, decode attention for MLA models over gRPC.

    import mlaserve
    client = mlaserve.Client("127.0.0.1:50051")
    info = client.server_info()

`mlaserve.flash_mla` is a FlashMLA-compatible entry point (change an import to switch).
`mlaserve.ClusterClient` places sequences on the servers of a cluster found through etcd
(docs/cluster.md, "Python cluster client").
Generated messages and stubs are in `mlaserve.v1`. `mlaserve.__version__` is the server
version this client was built with.
"""

# The C++ client, where it is built, before any generated message module when Python's
# protobuf is its C++ implementation: both then register mlaserve.v1's messages with one C++
# descriptor pool, and Python's messages work only when the C++ ones came first. Under the
# upb or pure-Python implementations they never meet, and the module loads on first use
# (mlaserve.native), so a process that never takes the data plane never loads it.
import importlib as _importlib

from google.protobuf.internal import api_implementation as _protobuf_implementation

if _protobuf_implementation.Type() == "cpp":
    try:
        _importlib.import_module("mlaserve._native")
    except ImportError:
        pass

from mlaserve._version import __version__

from mlaserve.batch import BatchResult, batch_request
from mlaserve.bfloat16 import bf16_bits_to_float, float_to_bf16_bits, round_to_bf16
from mlaserve.client import (Client, DecodeResult, PendingDecode, StreamError, head_query,
                             latent_query)
from mlaserve.cluster import ClusterClient, ClusterError
from mlaserve.tensors import from_tensor, to_tensor

__all__ = [
    "BatchResult",
    "Client",
    "ClusterClient",
    "ClusterError",
    "DecodeResult",
    "PendingDecode",
    "StreamError",
    "batch_request",
    "bf16_bits_to_float",
    "float_to_bf16_bits",
    "from_tensor",
    "head_query",
    "latent_query",
    "round_to_bf16",
    "to_tensor",
    "__version__",
]
