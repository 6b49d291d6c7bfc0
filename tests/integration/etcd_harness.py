"""What the cluster tests share: Debian's etcd (/usr/bin/etcd) started on loopback ports with
a data directory the test owns, read through etcd's JSON gateway (its v3 API over HTTP, POST
/v3/kv/range) with urllib, and a polling wait."""

import base64
import json
import os
import ssl
import subprocess
import time
import urllib.request

from harness import free_port


def wait_for(predicate, timeout, step=0.1):
    """predicate()'s first truthy value within `timeout` s, else its value at the end."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


class Etcd:
    """One etcd member on loopback ports, its data in `directory`; members() reads the keys
    under `prefix` (a cluster's /mlaserve/NAME/servers/)."""

    def __init__(self, binary, directory, prefix, pki=None):
        """pki: a directory of harness.make_pki's files: etcd then serves TLS on its client
        port and requires a client certificate its CA signed."""
        self.binary, self.directory, self.prefix, self.pki = binary, directory, prefix, pki
        self.client_port, self.peer_port = free_port(), free_port()
        self.process = None
        self.log = None
        self.context = None
        if pki:
            self.context = ssl.create_default_context(cafile=f"{pki}/ca.pem")
            self.context.load_cert_chain(f"{pki}/client.pem", f"{pki}/client.key")

    def start(self):
        scheme = "https" if self.pki else "http"
        url = f"{scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        tls = [f"--cert-file={self.pki}/server.pem", f"--key-file={self.pki}/server.key",
               f"--trusted-ca-file={self.pki}/ca.pem", "--client-cert-auth"] if self.pki else []
        self.log = open(os.path.join(self.directory, "etcd.log"), "a")
        self.process = subprocess.Popen(
            [self.binary, "--name=test", f"--data-dir={self.directory}/data",
             f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
             f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
             f"--initial-cluster=test={peer}", "--log-level=error", *tls],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                self.members()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("etcd did not answer within 30 s")

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.process = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def endpoint(self):
        return f"127.0.0.1:{self.client_port}"

    def _post(self, path, body):
        request = urllib.request.Request(
            f"{'https' if self.pki else 'http'}://{self.endpoint()}{path}",
            data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=5, context=self.context) as answer:
            return json.load(answer)

    def put(self, key, value):
        """Writes `value` (text) under `key`, without a lease."""
        encode = lambda text: base64.b64encode(text.encode()).decode()
        self._post("/v3/kv/put", {"key": encode(key), "value": encode(value)})

    def members(self):
        """{key: record} of the keys under the prefix, through etcd's JSON gateway (v3 API)."""
        encode = lambda text: base64.b64encode(text.encode()).decode()
        end = self.prefix[:-1] + chr(ord(self.prefix[-1]) + 1)
        body = self._post("/v3/kv/range", {"key": encode(self.prefix), "range_end": encode(end)})
        return {base64.b64decode(kv["key"]).decode(): json.loads(base64.b64decode(kv["value"]))
                for kv in body.get("kvs", [])}
