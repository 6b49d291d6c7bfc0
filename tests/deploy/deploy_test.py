#!/usr/bin/python3
"""The deployment story without a running systemd (CI has none):

1. the unit passes `systemd-analyze verify` and stays below an exposure score of
   `systemd-analyze security --offline` (skipped without systemd-analyze), and so do an
   instance of the template mlaserve@.service and one of the GPU template
   mlaserve-gpu@.service; the GPU unit differs from the unit only where it means to (the
   NVIDIA device nodes of its one GPU under DevicePolicy=closed instead of PrivateDevices=yes,
   its flag files, device and state directory), setting by setting: no GPU needed;
2. deploy/install.sh into a scratch DESTDIR installs every file where the unit and the
   binary expect it, twice (idempotent) and without overwriting an edited flag file, and
   deploy/uninstall.sh removes it all but the configuration; the GPU unit only from a tree
   with CUDA, and no build without CUDA over an enabled GPU instance (gpu_install.py);
3. the installed binary, started the way the unit starts it (the installed flag file, an
   unprivileged user when run as root, NoNewPrivileges and MemoryDenyWriteExecute through
   their kernel equivalents, NOTIFY_SOCKET on a datagram socket this test reads), sends
   READY=1 from its main process, answers the installed health probe, sends STOPPING=1 on
   SIGTERM and exits 0; a SIGTERM during warm-up also ends in a drained exit 0;
4. under strace (skipped without strace or ptrace): every syscall it makes is allowed by
   the unit's SystemCallFilter=, and it looks for its profiles under the install prefix.

    /usr/bin/python3 tests/deploy/deploy_test.py --source-dir . --build-dir build \
        --prefix /usr/local
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

from gpu_install import check_gpu_install
from unit_runner import NotifySocket, Server, mdwe_supported, server_env

# The server runs with the example flag file but a small model, loopback and free ports,
# so that the test takes seconds and never collides with another server on the machine.
TEST_OVERRIDES = ["--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0", "--layers=2",
                  "--kv_budget=256MiB", "--devices=1"]
# `systemd-analyze security` exposure, 0 to 10, that the unit stays at or below (1.4 with
# StateDirectory= and the LoadCredential= examples): a hardening setting dropped by mistake
# raises it. The option takes tenths.
MAX_EXPOSURE = 1.4
# The GPU template's instance: 1.5, the 0.1 more being PrivateDevices=no (its DeviceAllow=
# list of three NVIDIA nodes under DevicePolicy=closed scores as the unit's does).
MAX_GPU_EXPOSURE = 1.5
# What mlaserve-gpu@.service changes in mlaserve.service (deploy/CMakeLists.txt makes the one
# from the other), as (section, key): its values in order; None: a value of its own that
# names the instance. Every other setting, the hardening above all, must be the unit's.
NVIDIA_DEVICE_ALLOW = ["/dev/nvidiactl rw", "/dev/nvidia-uvm rw", "/dev/nvidia%i rw"]
GPU_UNIT_DIFFERENCES = {
    ("Unit", "Description"): None,
    ("Unit", "After"): ["network-online.target", "nvidia-persistenced.service"],
    ("Unit", "AssertPathExists"): ["/etc/mlaserve/gpu%i.flags", "/dev/nvidiactl",
                                   "/dev/nvidia-uvm", "/dev/nvidia%i"],
    ("Service", "ExecStart"): ["{prefix}/bin/mlaserve-server --flagfile=/etc/mlaserve/mlaserve.flags "
                               "--flagfile=/etc/mlaserve/gpu%i.flags --devices=cuda:0"],
    ("Service", "StateDirectory"): ["mlaserve/gpu%i"],
    ("Service", "RuntimeDirectory"): ["mlaserve/gpu%i"],
    ("Service", "PrivateDevices"): ["no"],
    ("Service", "DevicePolicy"): ["closed"],
    ("Service", "DeviceAllow"): NVIDIA_DEVICE_ALLOW,
}


class Failures(list):
    def check(self, condition, message):
        if not condition:
            self.append(message)
        return condition


def run(command, **kwargs):
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          **kwargs)


# --- 1. The unit --------------------------------------------------------------------------

def check_unit(unit_path, server, scratch, failures, name="mlaserve.service",
               max_exposure=MAX_EXPOSURE, device_acl=None):
    """device_acl: the device access list systemd must compute for this instance (entries
    as `systemd-analyze security` prints them), checked where it prints one."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        print("unit: systemd-analyze not found, verify and security skipped")
        return
    # verify insists that ExecStart's binary exists: point it at the one just installed.
    with open(unit_path) as f:
        text = f.read()
    exec_start = re.search(r"^ExecStart=(\S+)", text, re.M)
    if not failures.check(exec_start, "the unit has no ExecStart="):
        return
    checked = os.path.join(scratch, name)
    with open(checked, "w") as f:
        f.write(text.replace(exec_start.group(1), server))
    verify = run([analyze, "verify", checked])
    print(f"unit: {name} systemd-analyze verify exit {verify.returncode} {verify.stdout.strip()}")
    failures.check(verify.returncode == 0 and name not in verify.stdout,
                   f"systemd-analyze verify: {verify.stdout}")
    security = run([analyze, "security", "--offline=true", f"--threshold={round(max_exposure * 10)}",
                    checked])
    score = re.search(rf"Overall exposure level for {re.escape(name)}: (\S+)", security.stdout)
    print(f"unit: {name} exposure {score.group(1) if score else '?'} (at most {max_exposure})")
    failures.check(security.returncode == 0,
                   f"systemd-analyze security {name}: exposure above {max_exposure}:\n{security.stdout}")
    if device_acl is not None:
        # systemd's own reading of DevicePolicy=/DeviceAllow= for the instance (%i resolved),
        # plus the RTC read-only that ProtectClock=yes adds.
        row = re.search(r"^.*DeviceAllow=.*$", security.stdout, re.M)
        entries = set(re.findall(r"((?:/dev/|char-|block-)\S+):(r?w?m?)\b", row.group(0))) if row else set()
        if not entries:
            print(f"unit: {name}: this systemd-analyze prints no device list, not compared")
        else:
            listed = {f"{path}:{mode}" for path, mode in entries} - {"char-rtc:r"}
            failures.check(listed == set(device_acl),
                           f"{name}: systemd allows the devices {sorted(listed)}, not exactly "
                           f"{sorted(device_acl)}:\n{row.group(0)}")
            print(f"unit: {name} may open {' '.join(sorted(listed))} (and the pseudo-devices)")


def unit_settings(text):
    """{(section, key): [values in order]}: the settings systemd reads from a unit's text."""
    settings, section, pending = {}, None, ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        settings.setdefault((section, key.strip()), []).append(value.strip())
    return settings


def check_gpu_unit(unit_text, gpu_text, prefix, known_flags, failures):
    """The GPU template is the unit but for GPU_UNIT_DIFFERENCES, setting by setting."""
    unit, gpu = unit_settings(unit_text), unit_settings(gpu_text)
    intended = {key: None if values is None else [v.format(prefix=prefix) for v in values]
                for key, values in GPU_UNIT_DIFFERENCES.items()}
    for key in sorted(set(unit) | set(gpu), key=lambda k: (k[0] or "", k[1])):
        where = f"[{key[0]}] {key[1]}="
        if key not in intended:
            failures.check(gpu.get(key) == unit.get(key),
                           f"mlaserve-gpu@.service {where} is {gpu.get(key)}, mlaserve.service's is "
                           f"{unit.get(key)}: not one of the intended differences (GPU_UNIT_DIFFERENCES)")
        elif intended[key] is None:
            failures.check(key in gpu and gpu[key] != unit.get(key) and "%i" in gpu[key][0],
                           f"mlaserve-gpu@.service {where} should name the instance: {gpu.get(key)}")
        else:
            failures.check(gpu.get(key) == intended[key],
                           f"mlaserve-gpu@.service {where} is {gpu.get(key)}, not {intended[key]}")
            failures.check(unit.get(key) != intended[key],
                           f"GPU_UNIT_DIFFERENCES lists {where} but the units do not differ there")
    # The point of the unit, said on its own: every device closed but the NVIDIA nodes of one GPU.
    failures.check(gpu.get(("Service", "PrivateDevices")) == ["no"] and
                   gpu.get(("Service", "DevicePolicy")) == ["closed"],
                   "mlaserve-gpu@.service must have PrivateDevices=no with DevicePolicy=closed")
    allowed = gpu.get(("Service", "DeviceAllow"), [])
    failures.check(sorted(allowed) == sorted(NVIDIA_DEVICE_ALLOW),
                   f"mlaserve-gpu@.service allows the devices {allowed}, not exactly {NVIDIA_DEVICE_ALLOW}")
    exec_start = " ".join(gpu.get(("Service", "ExecStart"), []))
    named = set(re.findall(r"--([a-z_]+)=", exec_start)) - {"flagfile"}
    failures.check(named and named <= known_flags,
                   f"mlaserve-gpu@.service's ExecStart names unknown flags: {sorted(named - known_flags)}")
    same = sum(1 for key in unit if key not in intended and gpu.get(key) == unit[key])
    print(f"unit: mlaserve-gpu@.service = mlaserve.service in {same} settings, differs in the "
          f"{len(intended)} intended: {' '.join(f'{k[1]}=' for k in intended)}")


# --- 2. Install ---------------------------------------------------------------------------

def run_install(source_dir, build_dir, prefix, destdir, **extra):
    # GPU only as the caller says: not a GPU=1 of the environment the test runs in.
    env = {k: v for k, v in os.environ.items() if k != "GPU"}
    env.update(DESTDIR=destdir, PREFIX=prefix, BUILD_DIR=build_dir, **extra)
    return run([os.path.join(source_dir, "deploy", "install.sh"), "--no-build"], env=env)


def install(source_dir, build_dir, prefix, destdir, failures):
    result = run_install(source_dir, build_dir, prefix, destdir)
    failures.check(result.returncode == 0, f"install.sh failed:\n{result.stdout}")
    return result.stdout


def check_install(source_dir, build_dir, prefix, destdir, failures):
    first = install(source_dir, build_dir, prefix, destdir, failures)
    failures.check("daemon-reload" in first and "no daemon-reload" in first,
                   "install.sh into a DESTDIR must skip daemon-reload")
    root = destdir + prefix
    expected = {
        "binary": f"{root}/bin/mlaserve-server",
        "health probe": f"{root}/bin/mlaserve-health",
        "admin tool": f"{root}/bin/mlaserve-ctl",
        "profile": f"{root}/share/mlaserve/profiles/ascend910-die.json",
        "profile (whole chip)": f"{root}/share/mlaserve/profiles/ascend910.json",
        "example unit": f"{root}/share/doc/mlaserve/mlaserve.service",
        "example flags": f"{root}/share/doc/mlaserve/mlaserve.flags",
        "guide": f"{root}/share/doc/mlaserve/deploy.md",
        "unit": f"{destdir}/etc/systemd/system/mlaserve.service",
        "template unit": f"{destdir}/etc/systemd/system/mlaserve@.service",
        # The example only: the GPU unit goes to /etc from a build with CUDA (gpu_install.py).
        "example GPU unit": f"{root}/share/doc/mlaserve/mlaserve-gpu@.service",
        "flags": f"{destdir}/etc/mlaserve/mlaserve.flags",
    }
    for name, path in expected.items():
        failures.check(os.path.isfile(path), f"install: no {name} at {path}")
    for name in ("binary", "health probe"):
        failures.check(os.access(expected[name], os.X_OK), f"install: the {name} is not executable")
    if failures:
        return expected

    # The unit starts the binary the prefix puts in bin/ with the flag file install.sh put
    # in /etc. (That the binary looks for its profiles under the prefix is checked under
    # strace, below.)
    with open(expected["unit"]) as f:
        unit = f.read()
    failures.check(
        f"\nExecStart={prefix}/bin/mlaserve-server --flagfile=/etc/mlaserve/mlaserve.flags\n"
        in unit, "the installed unit's ExecStart does not name the installed binary")
    with open(expected["example unit"]) as f:
        failures.check(f.read() == unit, "the unit in /etc differs from the installed example")
    # The template is the unit with the instance name in its flag file and state directory.
    with open(expected["template unit"]) as f:
        template = f.read()
    derived = unit.replace("Description=mlaserve: ", "Description=mlaserve %i: ").replace(
        "--flagfile=/etc/mlaserve/mlaserve.flags", "--flagfile=/etc/mlaserve/%i.flags").replace(
        "\nStateDirectory=mlaserve\n", "\nStateDirectory=mlaserve/%i\n").replace(
        "\nRuntimeDirectory=mlaserve\n", "\nRuntimeDirectory=mlaserve/%i\n")
    failures.check(template.split("\n", 2)[2] == derived,
                   "the template unit differs from the unit in more than the instance name")
    with open(expected["example GPU unit"]) as f:
        gpu_unit = f.read()
    failures.check(oct(os.stat(expected["flags"]).st_mode & 0o777) == "0o644",
                   "the flag file must be readable by the service's dynamic user")

    # Every flag the example names, commented out or not, is one the binary knows.
    helpfull = run([expected["binary"], "--helpfull"]).stdout
    known = set(re.findall(r"^\s+--([a-z_]+) \(", helpfull, re.M))
    with open(expected["flags"]) as f:
        named = set(re.findall(r"^#?--([a-z_]+)=", f.read(), re.M))
    failures.check(len(known) > 10, f"could not read the flags from --helpfull:\n{helpfull}")
    failures.check(named and named <= known,
                   f"the example flag file names unknown flags: {sorted(named - known)}")
    check_gpu_unit(unit, gpu_unit, prefix, known, failures)

    # Idempotent, and an edited configuration survives a reinstall.
    with open(expected["flags"], "a") as f:
        f.write("# edited by the operator\n")
    second = install(source_dir, build_dir, prefix, destdir, failures)
    failures.check("-- Kept:" in second, "a second install.sh did not report keeping the flags")
    with open(expected["flags"]) as f:
        failures.check(f.read().endswith("# edited by the operator\n"),
                       "install.sh overwrote an existing flag file")
    print(f"install: {len(expected)} files in place, twice, the edited flag file kept")
    return expected


def check_uninstall(source_dir, prefix, destdir, installed, failures):
    env = dict(os.environ, DESTDIR=destdir, PREFIX=prefix)
    result = run([os.path.join(source_dir, "deploy", "uninstall.sh")], env=env)
    failures.check(result.returncode == 0, f"uninstall.sh failed:\n{result.stdout}")
    left = [path for name, path in installed.items() if name != "flags" and os.path.exists(path)]
    failures.check(not left, f"uninstall.sh left {left}")
    failures.check(os.path.exists(installed["flags"]), "uninstall.sh without --purge removed the flags")
    result = run([os.path.join(source_dir, "deploy", "uninstall.sh"), "--purge"], env=env)
    failures.check(result.returncode == 0 and not os.path.exists(installed["flags"]),
                   f"uninstall.sh --purge kept the flags:\n{result.stdout}")
    print("uninstall: everything removed, the flag file only with --purge")


# --- 3. Start and stop as the unit does -----------------------------------------------------

def state_dir_override(scratch, name):
    """--state_dir on a directory of the scratch's (the unit's StateDirectory= stands for
    /var/lib/mlaserve), writable by the unprivileged server, so its drain saves the KV state
    there: through the same syscalls as on a real host."""
    state = os.path.join(scratch, name)
    os.mkdir(state)
    os.chmod(state, 0o777)
    return [f"--state_dir={state}"]


def check_lifecycle(installed, unit_environment, scratch, failures):
    as_nobody = os.geteuid() == 0
    command = ([installed["binary"], f"--flagfile={installed['flags']}"] + TEST_OVERRIDES +
               state_dir_override(scratch, "state"))
    health = installed["health probe"]
    with open(installed["unit"]) as f:
        unit_denies_write_execute = re.search(r"^MemoryDenyWriteExecute=yes", f.read(), re.M) is not None
    notify = NotifySocket(scratch)
    env = server_env(notify, os.path.dirname(installed["profile"]), unit_environment)
    try:
        started = time.monotonic()
        server = Server(command, env, as_nobody, scratch, deny_write_execute=unit_denies_write_execute)
        ready = notify.wait_for("READY=1", timeout=60)
        if not failures.check(ready, f"no READY=1 within 60 s; log:\n{server.output()}"):
            server.stop()
            return
        pid, message = ready
        mdwe = "unsupported by this kernel" if not mdwe_supported() else (
            "on" if unit_denies_write_execute else "off, as in the unit")
        print(f"lifecycle: READY=1 after {time.monotonic() - started:.2f} s "
              f"({'as nobody' if as_nobody else 'as the current user'}, MDWE {mdwe}): "
              f"{message.strip()!r}")
        if not unit_denies_write_execute:
            failures.check("matrix unit on oneDNN" in server.output(),
                           f"the unit permits oneDNN's generated code but the server does not use it:\n"
                           f"{server.output()}")
        failures.check(pid == server.process.pid,
                       f"READY=1 came from pid {pid}, not the main process {server.process.pid}")
        port = server.port("gRPC")
        probe = run([health, "--target", f"127.0.0.1:{port}", "--timeout", "5"])
        failures.check(probe.returncode == 0 and "SERVING" in probe.stdout,
                       f"mlaserve-health after READY=1: {probe.stdout}")
        metrics_port = server.port("metrics")
        try:
            page = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                          timeout=5).read().decode()
            failures.check("mlaserve_kv_pages" in page, "/metrics lacks mlaserve_kv_pages")
        except OSError as error:
            failures.append(f"/metrics on port {metrics_port}: {error}")

        code = server.stop()
        stopping = notify.wait_for("STOPPING=1", timeout=1)
        failures.check(stopping and stopping[0] == server.process.pid,
                       "no STOPPING=1 from the main process after SIGTERM")
        failures.check(code == 0, f"exit {code} after SIGTERM; log:\n{server.output()}")
        failures.check("stopped: drained cleanly" in server.output(),
                       f"no clean drain in the log:\n{server.output()}")
        print(f"lifecycle: SIGTERM -> STOPPING=1, exit {code}")

        # `systemctl stop` while the server warms up: the stop waits for the warm-up, then
        # drains, instead of the process dying by the signal. Without the unit's
        # OPENBLAS_NUM_THREADS=1, OpenBLAS starts threads before main() that do not block
        # SIGTERM (on machines with more than one core), which is the harder case.
        env.pop("OPENBLAS_NUM_THREADS", None)
        server = Server(command, env, as_nobody, scratch)
        failures.check(server.wait_log("starting:", timeout=30), "no 'starting:' line")
        early = "ready:" not in server.output()
        code = server.stop()
        failures.check(code == 0, f"SIGTERM during warm-up: exit {code}; log:\n{server.output()}")
        failures.check(notify.wait_for("STOPPING=1", timeout=1),
                       "SIGTERM during warm-up: no STOPPING=1")
        print(f"lifecycle: SIGTERM during warm-up ({'before' if early else 'after'} "
              f"'ready:') -> exit {code}")

        # Someone re-enables MemoryDenyWriteExecute=: oneDNN's JIT is refused, and the
        # server must notice and serve through OpenBLAS instead of crashing.
        if mdwe_supported():
            server = Server(command, env, as_nobody, scratch, deny_write_execute=True)
            ready = notify.wait_for("READY=1", timeout=60)
            failures.check(ready, f"under MDWE: no READY=1; log:\n{server.output()}")
            if ready:
                probe = run([health, "--target", f"127.0.0.1:{server.port('gRPC')}", "--timeout", "5"])
                failures.check(probe.returncode == 0 and "SERVING" in probe.stdout,
                               f"under MDWE: mlaserve-health: {probe.stdout}")
            failures.check("matrix unit on OpenBLAS" in server.output(),
                           f"under MDWE: no OpenBLAS fallback in the log:\n{server.output()}")
            code = server.stop()
            failures.check(code == 0, f"under MDWE: exit {code}; log:\n{server.output()}")
            print(f"lifecycle: under MDWE the matrix unit falls back to OpenBLAS, exit {code}")
    finally:
        notify.close()


# --- 4. Syscalls against SystemCallFilter= ---------------------------------------------------

def syscall_group(analyze, group, seen=None):
    seen = set() if seen is None else seen
    names = set()
    listing = run([analyze, "syscall-filter", group]).stdout.splitlines()[1:]
    for line in listing:
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        if entry.startswith("@"):
            if entry not in seen:
                seen.add(entry)
                names |= syscall_group(analyze, entry, seen)
        else:
            names.add(entry)
    return names


def check_under_strace(installed, prefix, unit_environment, scratch, failures):
    analyze, strace = shutil.which("systemd-analyze"), shutil.which("strace")
    if analyze is None or strace is None:
        print("syscalls: strace or systemd-analyze not found, skipped")
        return
    with open(installed["unit"]) as f:
        filters = re.findall(r"^SystemCallFilter=(.*)$", f.read(), re.M)
    allowed, denied = set(), set()
    for line in filters:
        deny = line.startswith("~")
        for entry in line.lstrip("~").split():
            names = syscall_group(analyze, entry) if entry.startswith("@") else {entry}
            (denied if deny else allowed).update(names)
    permitted = allowed - denied
    if not failures.check(len(permitted) > 100, f"could not expand SystemCallFilter= {filters}"):
        return

    trace = os.path.join(scratch, "strace.txt")
    command = ([installed["binary"], f"--flagfile={installed['flags']}"] + TEST_OVERRIDES +
               state_dir_override(scratch, "strace-state"))
    notify_dir = os.path.join(scratch, "strace")
    os.mkdir(notify_dir)
    notify = NotifySocket(notify_dir)
    try:
        # Without MLASERVE_PROFILE_PATH, so that the binary searches its compiled-in
        # profile directory (empty outside the DESTDIR: it then falls back to the source
        # tree's).
        env = server_env(notify, None, unit_environment)
        # LeakSanitizer cannot run under ptrace and fails the exit of an ASan build (the
        # sanitizer stage); leaks are checked by every other run of the binary. Other builds
        # ignore the variable.
        env["ASAN_OPTIONS"] = "detect_leaks=0"
        server = Server(command, env, False, scratch,
                        wrapper=[strace, "-f", "-qq", "-o", trace])
        ready = notify.wait_for("READY=1", timeout=60)
        if ready is None:
            if "ptrace" in server.output() or "Operation not permitted" in server.output():
                print("syscalls: ptrace not permitted here, skipped")
                server.stop()
                return
            failures.append(f"under strace: no READY=1; log:\n{server.output()}")
            server.stop()
            return
        run([installed["health probe"], "--target", f"127.0.0.1:{server.port('gRPC')}"])
        code = server.stop(pid=ready[0])
        failures.check(code == 0, f"under strace: exit {code}")
    finally:
        notify.close()
    used = set()
    with open(trace) as f:
        text = f.read()
    profile = f'"{prefix}/share/mlaserve/profiles/ascend910-die.json"'
    failures.check(profile in text, f"the binary never looked for its profile at {profile}")
    with open(trace) as f:
        for line in f:
            found = re.match(r"\d+\s+([a-z_0-9]+)\(", line)
            if found:
                used.add(found.group(1))
    outside = sorted(used - permitted)
    failures.check(used and not outside,
                   f"syscalls the unit's SystemCallFilter= refuses (EPERM): {outside}")
    print(f"syscalls: {len(used)} distinct, all within SystemCallFilter=")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--build-dir", required=True)
    parser.add_argument("--prefix", required=True, help="the build's CMAKE_INSTALL_PREFIX")
    args = parser.parse_args()
    source_dir, build_dir = os.path.abspath(args.source_dir), os.path.abspath(args.build_dir)
    failures = Failures()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mlaserve-deploy-") as scratch:
        destdir = os.path.join(scratch, "root")
        installed = check_install(source_dir, build_dir, args.prefix, destdir, failures)
        if not failures:
            # The unprivileged server must reach the installed files and the notify socket.
            os.chmod(scratch, 0o755)
            with open(installed["unit"]) as f:
                unit_environment = dict(re.findall(r"^Environment=(\w+)=(\S*)$", f.read(), re.M))
            check_unit(installed["unit"], installed["binary"], scratch, failures)
            # The template, as the instance `mlaserve@a` that systemd would make of it.
            check_unit(installed["template unit"], installed["binary"], scratch, failures,
                       name="mlaserve@a.service")
            # The GPU template as GPU 3's instance: its DeviceAllow= must resolve to GPU 3.
            check_unit(installed["example GPU unit"], installed["binary"], scratch, failures,
                       name="mlaserve-gpu@3.service", max_exposure=MAX_GPU_EXPOSURE,
                       device_acl=[entry.replace("%i", "3").replace(" ", ":")
                                   for entry in NVIDIA_DEVICE_ALLOW])
            check_lifecycle(installed, unit_environment, scratch, failures)
            check_under_strace(installed, args.prefix, unit_environment, scratch, failures)
            check_uninstall(source_dir, args.prefix, destdir, installed, failures)
            check_gpu_install(
                lambda tree, dest, **env: run_install(source_dir, tree, args.prefix, dest, **env),
                build_dir, args.prefix, scratch, failures)
    for failure in failures:
        print("FAILED:", failure)
    print(f"deploy test: {'failed' if failures else 'all checks passed'} "
          f"in {time.monotonic() - started:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
