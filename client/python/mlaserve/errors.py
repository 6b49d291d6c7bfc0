"""Errors the client raises of its own: a call's status that did not come from grpcio, and
the cluster client's (apart so that its placement and etcd modules share them)."""

import grpc


class StatusError(grpc.RpcError):
    """A call's status as grpc.RpcError gives it (code(), details()), where the client made
    the error itself: callers catch it with grpcio's."""

    def __init__(self, code, details):
        super().__init__(f"{code}: {details}")
        self._code = code
        self._details = details

    def code(self):
        return self._code

    def details(self):
        return self._details

    def __str__(self):
        return f"{self._code.name}: {self._details}"



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
