#!/usr/bin/python3
"""PyTorch peer for the MLA decode-attention benchmarks (bench only, never used by tests).

A long-lived worker speaking JSON lines: one request per stdin line, one reply per
stdout line (flushed), so a C++ benchmark can alternate between its own kernel and
torch without paying the torch import (~1 s) per measurement.

  {"op":"info"}  -> {"torch", "threads", "cpu_capability", "mkldnn", "env"}
  {"op":"time", "form":"absorb"|"naive", "dtype":"fp32"|"bf16", "batch", "heads",
   "sq", "sk", "repeats", "warmup", "seed", ["threads"], ["softmax":"fp32"|"native"]}
                 -> {"best_s", "median_s", "flops", "gflops", "softmax"}
  {"op":"quit"}
Errors reply {"error": "..."} so the caller never blocks on a missing line.
Run with Debian's /usr/bin/python3 (python3-torch), not a pyenv python.
"""
import ctypes
import os
import statistics
import sys
import time

from json_lines import serve  # beside this script

try:
    import torch
except ImportError:
    sys.exit("torch_mla_worker: PyTorch is missing; `make bench-deps` installs Debian's "
             "python3-torch (a benchmark-only dependency)")

DL, DR, DQK, DV = 512, 64, 192, 128  # latent, rope, naive qk and v head dims
DK = DL + DR                         # absorbed key width (576)
SCALE = DQK ** -0.5                  # MLA scales by the *unabsorbed* qk dim, in both forms
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# torch 1.13 does not forward set_num_threads to OpenBLAS (fp32 bmm goes there), and
# OpenBLAS keeps its own pool sized to all cores; keep both in step when we can.
try:
    _openblas = ctypes.CDLL("libopenblas.so.0")
except OSError:
    _openblas = None


def set_threads(n):
    torch.set_num_threads(n)
    if _openblas is not None:
        _openblas.openblas_set_num_threads(n)


def cpu_capability():
    cpu = getattr(torch.backends, "cpu", None)  # get_cpu_capability() only exists from torch 2.0
    if cpu is not None and hasattr(cpu, "get_cpu_capability"):
        return cpu.get_cpu_capability()
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def build(req):
    """Random inputs (built outside the timed region) and the forward closure."""
    if req.get("form") not in ("absorb", "naive"):
        raise ValueError("unknown form %r" % req.get("form"))
    b, h, sq, sk = req["batch"], req["heads"], req["sq"], req["sk"]
    dt = DTYPES[req["dtype"]]
    # DeepSeek's reference model.py does softmax in fp32 and casts back; "native" keeps
    # the input dtype (the other thing a PyTorch user might write).
    sm_fp32 = req.get("softmax", "fp32") == "fp32"
    g = torch.Generator().manual_seed(req.get("seed", 0))
    randn = lambda *shape: torch.randn(*shape, generator=g).to(dt)

    def attend(q, k, v, mask):
        s = torch.bmm(q, k.transpose(1, 2)).mul_(SCALE)  # in place: scores reach ~1 GB fp32
        if mask is not None:
            s.add_(mask)
        p = s.softmax(dim=-1, dtype=torch.float32).to(dt) if sm_fp32 else s.softmax(dim=-1)
        return torch.bmm(p, v)

    if req["form"] == "absorb":
        # Rows ordered (token, head) like DeepSeek's "bshc" einsum: row r is token r // h.
        q, kv = randn(b, sq * h, DK), randn(b, sk, DK)
        v = kv[..., :DL]  # values are the latent part of the same cache (a strided view)
        mask = None
        if sq > 1:  # token s sees sk - sq + s + 1 keys; additive mask broadcast over batch
            tok = torch.arange(sq).repeat_interleave(h).unsqueeze(1)
            mask = torch.zeros(sq * h, sk, dtype=dt)
            mask.masked_fill_(torch.arange(sk).unsqueeze(0) > sk - sq + tok, float("-inf"))
        flops = 2 * b * h * sq * sk * (DK + DL)
        return (lambda: attend(q, kv, v, mask)), flops
    # naive form (TyphoonMLA shared prefix): all b*sq queries see the whole prefix, no mask.
    q, k, v = randn(h, b * sq, DQK), randn(h, sk, DQK), randn(h, sk, DV)
    flops = 2 * h * b * sq * sk * (DQK + DV)
    return (lambda: attend(q, k, v, None)), flops


def time_op(req):
    set_threads(req.get("threads", DEFAULT_THREADS))
    fwd, flops = build(req)
    times = []
    # Inputs are reused across repeats, so caches that fit in L3 (32 MB here) run hot;
    # time the C++ kernel the same way for a like-for-like comparison.
    with torch.inference_mode():
        for i in range(req.get("warmup", 1) + req.get("repeats", 5)):
            t0 = time.perf_counter()
            out = fwd()
            t1 = time.perf_counter()
            del out  # free before the next call so peak memory stays one forward
            if i >= req.get("warmup", 1):
                times.append(t1 - t0)
    best = min(times)
    # OpenBLAS's pool spins on sched_yield for ~0.1 s after a call, which would steal the
    # cores from mlaserve's timing that follows; stop it (the next call's warm-up restarts it).
    if _openblas is not None and hasattr(_openblas, "blas_thread_shutdown_"):
        _openblas.blas_thread_shutdown_()
    return {"best_s": best, "median_s": statistics.median(times), "flops": flops,
            "gflops": flops / best / 1e9, "softmax": req.get("softmax", "fp32")}


def handle(req):
    op = req.get("op")
    if op == "info":
        return {"torch": torch.__version__, "threads": torch.get_num_threads(),
                "cpu_capability": cpu_capability(),
                "mkldnn": torch.backends.mkldnn.is_available(),
                # these change results a lot on this VM (see /work/notes/torch_peer.md)
                "env": {k: os.environ.get(k) for k in
                        ("GLIBC_TUNABLES", "OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY")}}
    if op == "time":
        return time_op(req)
    raise ValueError("unknown op %r" % op)


# Debian's torch 1.13 defaults to 1 intra-op thread on this 2-core Zen 5 VM; use every
# core this process may run on instead.
DEFAULT_THREADS = len(os.sched_getaffinity(0))


def main():
    set_threads(DEFAULT_THREADS)
    serve(handle)


if __name__ == "__main__":
    main()
