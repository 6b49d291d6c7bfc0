"""What the Python benches print about the machine they ran on: its CPU model, the CPUs this
process may use and the best matrix ISA, so that every table names them."""

import os


def cpu_line():
    model = "unknown CPU"
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    flags = open("/proc/cpuinfo").read()
    isa = [name for name, flag in (("AMX", " amx_tile"), ("AVX-512 BF16", " avx512_bf16"),
                                   ("AVX-512", " avx512f"), ("AVX2", " avx2")) if flag in flags]
    return (f"{model}, {len(os.sched_getaffinity(0))} usable CPUs, "
            f"{' + '.join(isa[:2]) or 'no AVX2'}")
