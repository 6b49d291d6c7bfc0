"""What the Python integration tests share: free loopback ports, a throw-away PKI made with
openssl at run time (never committed), and the server binary started until it is ready."""

import socket
import subprocess
import threading
import time

import numpy as np

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


def close(actual, expected, tolerance):
    """FlashMLA's check: None when every finite element is within abs_tol or rel_tol
    (infinities equal) and the cosine difference is under its bound (none: unchecked); else
    what is wrong. `tolerance` is (abs_tol, rel_tol, cos_tol)."""
    abs_tol, rel_tol, cos_tol = tolerance
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return f"shape {actual.shape}, expected {expected.shape}"
    if not np.array_equal(np.isinf(actual), np.isinf(expected)):
        return "infinities differ"
    finite = np.isfinite(expected)
    a, e = actual[finite], expected[finite]
    error = np.abs(a - e)
    bad = ~((error < abs_tol) | (error < rel_tol * np.abs(e)))
    if np.any(bad):
        return f"{int(bad.sum())} of {a.size} elements off (worst abs {error.max():.2e})"
    if cos_tol is not None and a.size:
        cos_diff = 1 - 2 * float((a * e).sum()) / max(float((a * a + e * e).sum()), 1e-12)
        if cos_diff >= cos_tol:
            return f"cos_diff {cos_diff:.2e}"
    return None


def report(failures, began):
    """Prints each failure and the verdict with the seconds since `began`; the exit status."""
    for failure in failures:
        print("FAIL:", failure)
    print(f"{'FAIL' if failures else 'PASS'} ({time.time() - began:.1f} s)")
    return 1 if failures else 0
