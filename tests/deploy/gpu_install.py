"""deploy/install.sh and the GPU unit (deploy_test.py's part 2b): mlaserve-gpu@.service goes to
/etc only from a build with CUDA, whose `--devices=cuda:0` a build without CUDA refuses at
every start. So into scratch DESTDIRs:

  * the CPU build installs no GPU unit, and says how to get one;
  * GPU=1 on a tree configured without CUDA is refused, naming the cause;
  * the CPU build over an enabled mlaserve-gpu@N instance is refused before anything is
    installed, naming the instance;
  * a tree configured with CUDA installs the GPU unit (the installed example's text); the
    CPU build installed over it removes it again.

CI builds no CUDA: the CUDA tree is the CPU build's own files beside a copy of its
CMakeCache.txt that says MLASERVE_HAVE_CUDA=ON, which is all install.sh reads of the tree
to decide.
"""

import os
import re

GPU_UNIT = "mlaserve-gpu@.service"


def fake_cuda_tree(build_dir, scratch):
    """A build tree that install.sh reads as configured with CUDA: the build's binaries,
    units and install script, and its cache with MLASERVE_HAVE_CUDA=ON."""
    tree = os.path.join(scratch, "cuda-build")
    os.mkdir(tree)
    for name in ("bin", "deploy", "cmake_install.cmake"):
        os.symlink(os.path.join(build_dir, name), os.path.join(tree, name))
    with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
        cache, found = re.subn(r"^MLASERVE_HAVE_CUDA:INTERNAL=\w+$",
                               "MLASERVE_HAVE_CUDA:INTERNAL=ON", f.read(), flags=re.M)
    if found != 1:
        raise RuntimeError(f"{build_dir}/CMakeCache.txt has no MLASERVE_HAVE_CUDA entry")
    with open(os.path.join(tree, "CMakeCache.txt"), "w") as f:
        f.write(cache)
    return tree


def check_gpu_install(install, build_dir, prefix, scratch, failures):
    """install(build_dir, destdir, **env) -> the finished process of deploy/install.sh
    --no-build."""
    cpu_dest = os.path.join(scratch, "gpu-root-cpu")
    done = install(build_dir, cpu_dest)
    gpu_unit = os.path.join(cpu_dest, "etc", "systemd", "system", GPU_UNIT)
    failures.check(done.returncode == 0, f"install.sh of the CPU build failed:\n{done.stdout}")
    failures.check(not os.path.exists(gpu_unit),
                   f"the CPU build installed {GPU_UNIT}, whose instances it cannot serve")
    failures.check(f"No {GPU_UNIT}" in done.stdout and "make install GPU=1" in done.stdout,
                   f"install.sh of the CPU build does not say how to get {GPU_UNIT}:\n{done.stdout}")

    refused = install(build_dir, os.path.join(scratch, "gpu-root-refused"), GPU="1")
    failures.check(refused.returncode != 0 and "configured without CUDA" in refused.stdout
                   and "make build-gpu" in refused.stdout,
                   f"GPU=1 on a tree without CUDA: exit {refused.returncode}, not a refusal "
                   f"naming the cause:\n{refused.stdout}")

    # An instance enabled for an earlier CUDA build (what `systemctl enable` leaves).
    enabled_dest = os.path.join(scratch, "gpu-root-enabled")
    wants = os.path.join(enabled_dest, "etc", "systemd", "system", "multi-user.target.wants")
    os.makedirs(wants)
    os.symlink(f"/etc/systemd/system/{GPU_UNIT}", os.path.join(wants, "mlaserve-gpu@0.service"))
    refused = install(build_dir, enabled_dest)
    failures.check(refused.returncode != 0 and "mlaserve-gpu@0.service enabled" in refused.stdout
                   and "no CUDA" in refused.stdout,
                   f"the CPU build over an enabled mlaserve-gpu@0: exit {refused.returncode}, "
                   f"not a refusal naming it:\n{refused.stdout}")
    failures.check(not os.path.exists(os.path.join(enabled_dest + prefix, "bin", "mlaserve-server")),
                   "the refused install installed the server all the same")

    gpu_dest = os.path.join(scratch, "gpu-root-cuda")
    done = install(fake_cuda_tree(build_dir, scratch), gpu_dest)
    gpu_unit = os.path.join(gpu_dest, "etc", "systemd", "system", GPU_UNIT)
    example = os.path.join(gpu_dest + prefix, "share", "doc", "mlaserve", GPU_UNIT)
    failures.check(done.returncode == 0, f"install.sh of the CUDA tree failed:\n{done.stdout}")
    if failures.check(os.path.isfile(gpu_unit), f"the CUDA tree installed no {GPU_UNIT}"):
        with open(gpu_unit) as installed, open(example) as shipped:
            failures.check(installed.read() == shipped.read(),
                           f"the {GPU_UNIT} in /etc differs from the installed example")
    done = install(build_dir, gpu_dest)
    failures.check(done.returncode == 0 and not os.path.exists(gpu_unit) and
                   "-- Removed:" in done.stdout,
                   f"the CPU build installed over the CUDA one kept {GPU_UNIT}:\n{done.stdout}")
    print(f"install: {GPU_UNIT} only from a tree with CUDA; GPU=1 without CUDA and the CPU "
          f"build over an enabled instance refused")
