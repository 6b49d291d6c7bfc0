"""What the Python integration tests share: free loopback ports, a throw-away PKI made with
openssl at run time (never committed), and the server binary started until it is ready."""

import socket
import subprocess
import threading

KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_pki(d):
    """In directory d: ca.pem/.key, server.pem/.key (127.0.0.1 and localhost) and
    client.pem/.key (CN=tenant-a), both signed by the CA; EC P-256, valid a day."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-x509", *KEY, "-days", "1", "-subj", "/CN=test-ca",
            "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem")
    with open(f"{d}/san.ext", "w") as ext:
        ext.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, subject, extra in (("server", "/CN=localhost", ["-extfile", f"{d}/san.ext"]),
                                 ("client", "/CN=tenant-a", [])):
        openssl("req", *KEY, "-subj", subject, "-keyout", f"{d}/{name}.key",
                "-out", f"{d}/{name}.csr")
        openssl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/ca.pem",
                "-CAkey", f"{d}/ca.key", "-CAcreateserial", "-days", "1", *extra,
                "-out", f"{d}/{name}.pem")


class Server:
    """The server binary with `flags`, its log collected; ready() waits for "ready: serving"."""

    def __init__(self, binary, flags, env=None):
        self.process = subprocess.Popen([binary, *flags], stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=env)
        self.log = []
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        for line in self.process.stdout:
            self.log.append(line)
            if "ready: serving" in line:
                self._ready.set()

    def ready(self, timeout):
        return self._ready.wait(timeout)

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
