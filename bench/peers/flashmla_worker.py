#!/usr/bin/env python3
"""GPU peers for `mlaserve-bench gpu-peers` (bench only, never used by tests): FlashMLA's dense
decode and a plain PyTorch absorb (bmm, softmax, bmm) on the inputs mlaserve's side wrote.

A long-lived worker speaking JSON lines on stdin/stdout, as bench/peers/torch_mla_worker.py:

  {"op":"info"} -> {"torch", "cuda", "gpu", "flash_mla"}
  {"op":"load", "file", "tensors": {name: {"offset", "shape"}}, "form": "absorb"|"typhoon",
   "batch", "heads", "sq", "page_size", "pages_per_seq", "pool_pages", "seqlen", "scale",
   ["table"]: [[page, ...], ...]}
      Reads the bf16 tensors from `file` onto the GPU and lays them out for each peer:
      absorb: q [B, sq, H, 576] and `distinct` pages [D, page, 576]; the pool's page p holds
        distinct page p % D, sequence b's pages are b * pages_per_seq onwards.
      typhoon: q_nope [B, sq, H, 128], q_pe [B, sq, H, 64], kv_b [H, 256, 512] (W_UK rows, then
        W_UV's), pool [pages, page, 576] and `table`; the peers take the absorbed query
        bf16(q_nope . W_UK) and their latent answers are projected by W_UV to compare.
      -> {"peers": [...]} (those that loaded: flashmla needs the flash_mla module)
  {"op":"time", "peer", "repeats", "warmup"} -> {"us": [...]} (CUDA events around each call)
  {"op":"answer", "peer", "out_file"} -> {"elements", "lse_elements"}
      writes the peer's answer as float32: out [B, sq, H, width], then its natural-log LSE
      [B, sq, H] (absorb form only; the typhoon form's projected answer has none)
  {"op":"quit"}
Errors reply {"error": "..."} so the caller never blocks on a missing line.
"""
import time

import numpy as np
import torch

from json_lines import serve  # beside this script

try:
    import flash_mla
except ImportError:  # the PyTorch peer still runs; the caller reports FlashMLA as missing
    flash_mla = None

DL, DR, DN, DV = 512, 64, 128, 128
DK = DL + DR
# The PyTorch peer runs on the CPU where there is no GPU: only to try the file protocol against
# mlaserve's fake GPU (its times mean nothing there).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Problem:
    """One shape's inputs on the GPU, in each peer's layout, and the peers' forward calls."""

    def __init__(self, req):
        self.form = req["form"]
        self.b, self.h, self.sq = req["batch"], req["heads"], req["sq"]
        self.page = req["page_size"]
        self.seqlen = req["seqlen"]
        self.scale = req["scale"]
        t = {name: self._read(req["file"], d) for name, d in req["tensors"].items()}
        if self.form == "absorb":
            distinct = t["distinct"]
            reps = -(-req["pool_pages"] // distinct.shape[0])
            pool = distinct.repeat(reps, 1, 1)[: req["pool_pages"]].contiguous()
            table = torch.arange(self.b * req["pages_per_seq"], dtype=torch.int32,
                                 device=DEVICE).view(self.b, req["pages_per_seq"])
            self.q = t["q"]
            self.w_uv = None
        else:
            pool = t["pool"]
            table = torch.tensor(req["table"], dtype=torch.int32, device=DEVICE)
            kv_b = t["kv_b"].float().view(self.h, DN + DV, DL)
            w_uk, self.w_uv = kv_b[:, :DN, :], kv_b[:, DN:, :]
            q_nope, q_pe = t["q_nope"][: self.b], t["q_pe"][: self.b]  # the file's are the largest B's
            q_lat = torch.einsum("bshn,hnl->bshl", q_nope.float(), w_uk).to(torch.bfloat16)
            self.q = torch.cat([q_lat, q_pe], dim=-1).contiguous()
        self.k_cache = pool.view(pool.shape[0], self.page, 1, DK)
        self.table = table
        self.seqlens = torch.full((self.b,), self.seqlen, dtype=torch.int32, device=DEVICE)
        # PyTorch's side reads a dense copy of each sequence's keys (gathered once, untimed).
        pages = -(-self.seqlen // self.page)
        dense = pool[table[:, :pages].long()].view(self.b, pages * self.page, DK)
        self.dense = dense[:, : self.seqlen].contiguous()
        self.mask = None
        if self.sq > 1:  # token s of sq sees seqlen - sq + s + 1 keys (bottom-right causal)
            tok = torch.arange(self.sq, device=DEVICE).repeat_interleave(self.h).unsqueeze(1)
            keys = torch.arange(self.seqlen, device=DEVICE).unsqueeze(0)
            self.mask = torch.zeros(self.sq * self.h, self.seqlen, device=DEVICE)
            self.mask.masked_fill_(keys > self.seqlen - self.sq + tok, float("-inf"))
        self.meta = flash_mla.get_mla_metadata()[0] if flash_mla is not None else None

    @staticmethod
    def _read(path, d):
        count = int(np.prod(d["shape"]))
        raw = np.fromfile(path, dtype=np.uint16, count=count, offset=d["offset"])
        return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16).view(d["shape"]).to(DEVICE)

    def flashmla(self):
        return flash_mla.flash_mla_with_kvcache(
            self.q, self.k_cache, self.table, self.seqlens, DL, self.meta,
            softmax_scale=self.scale, causal=self.sq > 1)

    def torch_absorb(self):
        """DeepSeek's reference decode: bf16 products (scores rounded to bf16 as its einsum's
        are), then scale, softmax and LSE in fp32."""
        q = self.q.view(self.b, self.sq * self.h, DK)
        s = torch.bmm(q, self.dense.transpose(1, 2)).float().mul_(self.scale)
        if self.mask is not None:
            s.add_(self.mask)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.softmax(s, dim=-1).to(torch.bfloat16)
        out = torch.bmm(p, self.dense[..., :DL])
        return out.view(self.b, self.sq, self.h, DL), lse.view(self.b, self.sq, self.h)

    def call(self, peer):
        if peer == "flashmla":
            out, lse = self.flashmla()
            return out, lse.transpose(1, 2)  # FlashMLA's LSE is [b, h, sq]
        if peer == "torch":
            return self.torch_absorb()
        raise ValueError("unknown peer %r" % peer)

    def answer(self, peer, path):
        out, lse = self.call(peer)
        out = out.float()
        if self.form == "typhoon":  # the head-space answer the server would send back
            out = torch.einsum("bshl,hvl->bshv", out.to(torch.bfloat16).float(), self.w_uv)
            lse = None
        with open(path, "wb") as f:
            f.write(out.contiguous().cpu().numpy().tobytes())
            if lse is not None:
                f.write(lse.float().contiguous().cpu().numpy().tobytes())
        return {"elements": out.numel(), "lse_elements": 0 if lse is None else lse.numel()}

    def time(self, peer, repeats, warmup):
        for _ in range(warmup):
            self.call(peer)
        if DEVICE == "cpu":
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                self.call(peer)
                times.append((time.perf_counter() - start) * 1e6)
            return {"us": times}
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeats)]
        for start, end in events:
            start.record()
            self.call(peer)
            end.record()
        torch.cuda.synchronize()
        return {"us": [start.elapsed_time(end) * 1e3 for start, end in events]}


class Worker:
    """The requests' handler; a load replaces the problem the other requests act on."""

    problem = None

    def handle(self, req):
        op = req.get("op")
        if op == "info":
            return {"torch": torch.__version__, "cuda": torch.version.cuda or "none",
                    "gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "the CPU",
                    "flash_mla": None if flash_mla is None else flash_mla.__file__}
        if op == "load":
            self.problem = None  # its GPU memory back before the next one's
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            self.problem = Problem(req)
            return {"peers": (["flashmla"] if flash_mla is not None else []) + ["torch"]}
        if op == "time":
            return self.problem.time(req["peer"], req.get("repeats", 20), req.get("warmup", 2))
        if op == "answer":
            return self.problem.answer(req["peer"], req["out_file"])
        raise ValueError("unknown op %r" % op)


def main():
    serve(Worker().handle)


if __name__ == "__main__":
    main()
