"""The cluster client's errors, apart so that its placement and etcd modules share them."""


class ClusterError(Exception):
    """A cluster-level failure: a grpc.StatusCode and a message, like mlaserve.StreamError.

    RESOURCE_EXHAUSTED: no member has room for a new sequence (the message names the bytes);
    UNAVAILABLE: the server holding a sequence left the cluster, or etcd never answered;
    NOT_FOUND: a sequence or prefix this client did not create; ALREADY_EXISTS: an id
    reused with other arguments."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
