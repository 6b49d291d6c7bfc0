"""etcd's v3 API over its HTTP/1.1 JSON gateway, as the cluster client needs it: prefix
reads and watches of the membership, and the placement groups' leases, puts and guarded
transaction (no etcd package is needed)."""

import base64
import http.client
import json
import ssl
import threading


def _b64(data):
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _prefix_end(prefix):
    """etcd's range_end for every key starting with `prefix` (its last byte plus one)."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    raw[-1] += 1
    return bytes(raw)


class Etcd:
    """etcd's v3 API over its HTTP/1.1 JSON gateway: one request per connection, trying the
    endpoints in turn from the last one that answered."""

    def __init__(self, endpoints, ca=None, cert=None, key=None, timeout=5.0):
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        self.endpoints = [e.strip() for e in endpoints if e.strip()]
        if not self.endpoints:
            raise ValueError("etcd_endpoints names no endpoint")
        if (cert is None) != (key is None):
            raise ValueError("etcd_cert and etcd_key go together: give both or neither")
        if ca is None and cert is not None:
            raise ValueError("etcd_cert and etcd_key need etcd_ca")
        self.context = None
        if ca is not None:
            self.context = ssl.create_default_context(cafile=ca)
            if cert is not None:
                self.context.load_cert_chain(cert, key)
        self.timeout = timeout
        self.current = 0
        self._watch_lock = threading.Lock()
        self._watch_connection = None
        self._closed = False

    def _connect(self, endpoint, timeout):
        host, _, port = endpoint.rpartition(":")
        host = host.strip("[]")
        if self.context is not None:
            return http.client.HTTPSConnection(host, int(port), timeout=timeout,
                                               context=self.context)
        return http.client.HTTPConnection(host, int(port), timeout=timeout)

    def _endpoint_order(self):
        n = len(self.endpoints)
        return [(self.current + i) % n for i in range(n)]

    def post(self, path, body):
        """The answer's JSON; OSError (the last endpoint's) when none answered."""
        error = None
        for index in self._endpoint_order():
            connection = self._connect(self.endpoints[index], self.timeout)
            try:
                connection.request("POST", path, json.dumps(body),
                                   {"Content-Type": "application/json"})
                answer = connection.getresponse()
                data = answer.read()
                if answer.status != 200:
                    raise OSError(f"etcd {self.endpoints[index]} answered HTTP {answer.status}: "
                                  f"{data[:200]!r}")
                self.current = index
                return json.loads(data)
            except (OSError, http.client.HTTPException, ValueError) as e:
                error = e if isinstance(e, OSError) else OSError(str(e))
            finally:
                connection.close()
        raise error

    def put(self, key, value, lease=0):
        self.post("/v3/kv/put", {"key": _b64(key), "value": _b64(value), "lease": str(lease)})

    def delete(self, key):
        self.post("/v3/kv/deleterange", {"key": _b64(key)})

    def put_if_unchanged_since(self, guard, revision, puts, lease=0):
        """Writes puts [(key, value)] on `lease` and `guard` in one transaction, only if guard
        was not written after `revision` (EtcdClient::PutIfUnchangedSince); False when it
        was (read again and retry)."""
        success = [{"request_put": {"key": _b64(k), "value": _b64(v), "lease": str(lease)}}
                   for k, v in puts]
        success.append({"request_put": {"key": _b64(guard), "value": _b64(str(revision))}})
        body = self.post("/v3/kv/txn", {
            # An absent key's mod revision is 0, less than any revision + 1.
            "compare": [{"key": _b64(guard), "target": "MOD", "result": "LESS",
                         "mod_revision": str(revision + 1)}],
            "success": success})
        return bool(body.get("succeeded", False))  # the gateway leaves a false one out

    def grant_lease(self, ttl_s):
        return int(self.post("/v3/lease/grant", {"TTL": str(int(ttl_s))})["ID"])

    def keep_alive(self, lease):
        """Renews the lease once; False when it has expired (its keys are gone)."""
        body = self.post("/v3/lease/keepalive", {"ID": str(lease)})
        result = body.get("result", body)
        return int(result.get("TTL", 0)) > 0

    def revoke(self, lease):
        self.post("/v3/lease/revoke", {"ID": str(lease)})

    def range_prefix(self, prefix):
        """(revision, [(key, value bytes)]) of every key under `prefix`."""
        body = self.post("/v3/kv/range", {"key": _b64(prefix),
                                          "range_end": _b64(_prefix_end(prefix))})
        revision = int(body.get("header", {}).get("revision", 0))
        return revision, [(base64.b64decode(kv["key"]).decode(errors="replace"),
                           base64.b64decode(kv.get("value", ""))) for kv in body.get("kvs", [])]

    def watch_prefix(self, prefix, start_revision, idle_timeout):
        """Yields the watch's results (dicts with header, events, created, canceled, ...)
        until the stream ends; raises OSError when it breaks or stays silent idle_timeout s."""
        connection = self._connect(self.endpoints[self.current], idle_timeout)
        with self._watch_lock:
            if self._closed:
                return
            self._watch_connection = connection
        try:
            connection.connect()
            with self._watch_lock:
                if self._closed:  # close() came before the socket existed
                    return
            connection.request("POST", "/v3/watch", json.dumps({"create_request": {
                "key": _b64(prefix), "range_end": _b64(_prefix_end(prefix)),
                "start_revision": str(start_revision)}}), {"Content-Type": "application/json"})
            answer = connection.getresponse()
            if answer.status != 200:
                raise OSError(f"etcd watch answered HTTP {answer.status}")
            while True:
                line = answer.readline()
                if not line:
                    return
                line = line.strip()
                if not line:
                    continue
                message = json.loads(line)
                if "error" in message:
                    raise OSError(f"etcd watch: {message['error'].get('message', message)}")
                yield message.get("result", {})
        except (http.client.HTTPException, ValueError) as e:
            raise OSError(str(e)) from e
        finally:
            with self._watch_lock:
                self._watch_connection = None
            connection.close()

    def close(self):
        """Ends a watch in progress (its reader sees the stream end)."""
        import socket
        with self._watch_lock:
            self._closed = True
            connection = self._watch_connection
            if connection is not None and connection.sock is not None:
                try:
                    connection.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
