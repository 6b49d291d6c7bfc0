"""The installed server run the way its systemd unit runs it, without systemd: the
sd_notify socket the unit's Type=notify listens on, the unit's kernel-level restrictions
(NoNewPrivileges, MemoryDenyWriteExecute, an unprivileged user) applied before exec, and the
nearly empty environment a service gets. Used by deploy_test.py."""

import ctypes
import os
import re
import signal
import socket
import struct
import subprocess
import time

PR_SET_NO_NEW_PRIVS = 38
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
PR_GET_MDWE = 66
NOBODY = 65534


class NotifySocket:
    """What systemd listens on for sd_notify: a datagram socket whose path the service gets
    in NOTIFY_SOCKET. Each message comes with its sender's credentials (SO_PASSCRED), which
    is how NotifyAccess=main tells the main process's messages from others'."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o666)  # writable by the unprivileged server, as systemd's is
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)

    def wait_for(self, field, timeout):
        """(pid of the sender, message) of the first message holding line `field`, or None."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except socket.timeout:
                return None
            pid = None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[:12])[0]
            message = data.decode()
            if field in message.split("\n"):
                return pid, message

    def close(self):
        self.sock.close()


def sandbox_like_the_unit(as_nobody, deny_write_execute):
    """The unit's restrictions that need no systemd, applied in the child before exec."""
    def apply():
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
        if deny_write_execute:
            # The kernel's own MemoryDenyWriteExecute (Linux 6.3); older kernels lack it.
            libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0)
        if as_nobody:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
    return apply


def mdwe_supported():
    """Whether this kernel has PR_SET_MDWE (Linux 6.3): PR_GET_MDWE fails with EINVAL if not."""
    return ctypes.CDLL(None).prctl(PR_GET_MDWE, 0, 0, 0, 0) >= 0


class Server:
    """The installed binary, started as the unit would start it."""

    def __init__(self, command, env, as_nobody, log_dir, wrapper=(), deny_write_execute=False):
        self.log_path = os.path.join(log_dir, f"server-{time.monotonic_ns()}.log")
        self.log = open(self.log_path, "w+")
        self.process = subprocess.Popen(
            list(wrapper) + command, stdin=subprocess.DEVNULL, stdout=self.log,
            stderr=subprocess.STDOUT, cwd="/", env=env,
            preexec_fn=sandbox_like_the_unit(as_nobody, deny_write_execute))

    def wait_log(self, text, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.output():
                return True
            if self.process.poll() is not None:
                return False
            time.sleep(0.02)
        return False

    def port(self, which):
        found = re.search(rf"{which} on port (\d+)", self.output())
        return int(found.group(1)) if found else None

    def stop(self, pid=None, timeout=60):
        try:
            os.kill(pid or self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return f"killed after {timeout} s"

    def output(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()


def server_env(notify, profiles, unit_environment):
    """systemd's environment for a service: nearly empty, plus the unit's Environment=.
    MLASERVE_PROFILE_PATH makes the binary read the installed profiles although its
    compiled-in prefix is not populated here (the files are under the DESTDIR)."""
    env = dict(unit_environment, PATH="/usr/bin:/bin", NOTIFY_SOCKET=notify.path)
    if profiles:
        env["MLASERVE_PROFILE_PATH"] = profiles
    return env
