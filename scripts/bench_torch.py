#!/usr/bin/env python3
"""The cases of scripts/bench.lua with PyTorch (Debian python3-torch 1.13), same JSON fields.

    /usr/bin/python3 scripts/bench_torch.py [--cases LIST] [--threads N] [--reps N]

Attention cases use torch.nn.functional._scaled_dot_product_attention (1.13's
CPU math kernel) with is_causal; `mha` is nn.MultiheadAttention(768, 12) with a
causal attn_mask, batch_first; `tiny` times the notebooks' CausalAttention and
MultiHeadAttention classes (eager). Not part of the tests.
"""
import argparse
import json
import math
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from export_torch import MultiHeadAttention  # notebook 002's class, scaled by the head width


def best_ms(fn, reps):
    fn()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1000)
    return best


def emit(d, threads):
    d["threads"] = threads
    d["blas_core"] = "torch " + torch.__version__
    d["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(d), flush=True)


class CausalAttention(nn.Module):  # notebook 002
    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, n, _ = x.shape
        keys, queries, values = self.W_key(x), self.W_query(x), self.W_value(x)
        s = queries @ keys.transpose(1, 2)
        s.masked_fill_(self.mask.bool()[:n, :n], -torch.inf)
        w = self.dropout(torch.softmax(s / keys.shape[-1] ** 0.5, dim=-1))
        return w @ values


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="all")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    want = None if a.cases == "all" else set(a.cases.split(","))
    wanted = lambda name: want is None or name in want
    torch.manual_seed(0)
    with torch.no_grad():
        if wanted("sgemm_peak"):
            n = 2048
            x, y = torch.randn(n, n), torch.randn(n, n)
            ms = best_ms(lambda: x @ y, a.reps)
            emit(dict(case="sgemm_peak", kernel="torch.mm", b=1, h=1, lq=n, lk=n, e=n, causal=False, ms=ms,
                      gflops=2.0 * n ** 3 / (ms * 1e6)), threads)
        for name, b, h, n, e, causal in [("A", 4, 12, 1024, 64, False), ("A_causal", 4, 12, 1024, 64, True),
                                          ("B", 1, 8, 4096, 64, False), ("B_causal", 1, 8, 4096, 64, True)]:
            if not wanted(name):
                continue
            q, k, v = torch.randn(b, h, n, e), torch.randn(b, h, n, e), torch.randn(b, h, n, e)
            ms = best_ms(lambda: F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal), a.reps)
            emit(dict(case=name, kernel="torch_sdpa", b=b, h=h, lq=n, lk=n, e=e, causal=causal, ms=ms,
                      gflops=4.0 * b * h * n * n * e / (ms * 1e6)), threads)
        if wanted("mha"):
            b, n, d, h = 4, 1024, 768, 12
            m = nn.MultiheadAttention(d, h, batch_first=True).eval()
            x = torch.randn(b, n, d)
            mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
            ms = best_ms(lambda: m(x, x, x, attn_mask=mask, need_weights=False), a.reps)
            emit(dict(case="mha", kernel="nn.MultiheadAttention", b=b, h=h, lq=n, lk=n, e=d // h, causal=True,
                      ms=ms, gflops=4.0 * b * h * n * n * (d // h) / (ms * 1e6)), threads)
            m2 = MultiHeadAttention(d, d, n, 0.0, h).eval()
            ms = best_ms(lambda: m2(x), a.reps)
            emit(dict(case="mha", kernel="notebook MultiHeadAttention", b=b, h=h, lq=n, lk=n, e=d // h,
                      causal=True, ms=ms, gflops=4.0 * b * h * n * n * (d // h) / (ms * 1e6)), threads)
        if wanted("tiny"):
            batch = torch.rand(2, 6, 3)
            for label, m in [("CausalAttention", CausalAttention(3, 2, 6, 0.0)),
                             ("MultiHeadAttention", MultiHeadAttention(3, 2, 6, 0.0, 2))]:
                calls = 5000
                def loop():
                    for _ in range(calls):
                        m(batch)
                us = best_ms(loop, a.reps) * 1000 / calls
                emit(dict(case="tiny", kernel=label, b=2, h=getattr(m, "num_heads", 1), lq=6, lk=6, e=2,
                          causal=True, ms=us / 1000, us_per_call=us), threads)


if __name__ == "__main__":
    main()
