#!/usr/bin/env python3
"""The cases of scripts/bench.lua with PyTorch (Debian python3-torch 1.13), same JSON fields.

    /usr/bin/python3 scripts/bench_torch.py [--cases LIST] [--threads N] [--reps N]

Attention cases use torch.nn.functional._scaled_dot_product_attention (1.13's
CPU math kernel) with is_causal; `mha` is nn.MultiheadAttention(768, 12) with a
causal attn_mask, batch_first; `tiny` times the notebooks' CausalAttention and
MultiHeadAttention classes (eager), `tiny_train` the same with recording:
forward + backward of m(x).sum() per call, `fwd_us` the recorded forward alone. The `*_bwd` cases time the same SDPA call's
forward and backward (dout = out, as bench.lua), `fwd_ms` its forward alone
with recording on, gflops = 14*b*h*lq*lk*e / time (C_causal_bwd is left out,
as C_causal: its [8, 16384, 16384] scores do not fit); `train_gpt` one training
step (forward, cross entropy, backward, AdamW) of the book's GPTModel (vocab 256,
context 128, emb 128, 4 heads, 4 layers, batch 16), with `tokens_per_s`; `block_sparse`
is B with the dense float mask of 8 equal documents (-inf across documents:
1.13 has no block-sparse attention, so it computes every score), `vs_dense`
against B in the same run. `decode` / `decode_gqa` (one query row against
65536 keys; GQA as repeat_interleave'd K and V, what torch 1.13 has, gbps
counting K and V once as bench.lua) and `window` (B with an explicit float
mask of the 256-key causal window, gflops on the visible pairs) use the same
math kernel. Not part of the tests.

Warm-up: as in a long-running process, each case first runs until its time is
stable (the last 3 calls within 5% of each other; at most 30 calls or 60 s),
so that the allocator has settled (glibc reuses freed blocks up to 32 MiB once
it has seen them); ms is then the best of --reps calls. Each line adds
`warmup_runs`, `stable`, `page_faults` (minor faults of the best call) and
`fault_ms`: those faults times this machine's first-touch cost per fault,
measured at start. PyTorch allocates its score matrix and outputs anew on every
call, and blocks above 32 MiB come fresh from the kernel each time, so on a
machine with slow page faults they dominate: when `fault_ms` is more than half
of `ms` the line has `"fault_dominated": true` and a warning goes to stderr.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

STABLE_CALLS, STABLE_SPREAD, WARMUP_MAX_CALLS, WARMUP_MAX_S = 3, 1.05, 30, 60.0


def page_faults():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_minflt + usage.ru_majflt


def timed_call(fn):
    """(milliseconds, page faults) of one call of fn"""
    faults0, t0 = page_faults(), time.perf_counter()
    fn()
    ms = (time.perf_counter() - t0) * 1000
    return ms, page_faults() - faults0


def best_ms(fn, reps):
    """warm up until stable, then the best of reps calls: a dict of ms, page_faults, warmup_runs, stable"""
    times, start, stable = [], time.perf_counter(), False
    while True:
        times.append(timed_call(fn)[0])
        last = times[-STABLE_CALLS:]
        if len(last) == STABLE_CALLS and max(last) <= STABLE_SPREAD * min(last):
            stable = True
            break
        if len(times) >= WARMUP_MAX_CALLS or time.perf_counter() - start > WARMUP_MAX_S:
            break
    best = (math.inf, 0)
    for _ in range(reps):
        best = min(best, timed_call(fn))
    return dict(ms=best[0], page_faults=best[1], warmup_runs=len(times), stable=stable)


def first_touch_ms_per_fault(torch):
    """this machine's cost of one first-touch page fault: filling a fresh 64 MiB
    tensor minus refilling it, per fault taken (median of 3)"""
    costs = []
    for _ in range(3):
        x = torch.empty(16 << 20)
        first_ms, faults = timed_call(lambda: x.fill_(1.0))
        again_ms, _ = timed_call(lambda: x.fill_(2.0))
        del x
        costs.append(max(first_ms - again_ms, 0.0) / max(faults, 1))
    return sorted(costs)[1]


class Emitter:
    """prints one JSON line per measurement, with the run's threads, torch version and fault cost"""

    def __init__(self, torch, threads, fault_cost_ms):
        self.version, self.threads, self.fault_cost_ms = torch.__version__, threads, fault_cost_ms

    def __call__(self, fields, timing, per_call=1):
        """fields: the case's shape; timing: best_ms's dict for per_call calls"""
        d = dict(fields)
        d["ms"] = timing["ms"] / per_call
        if "flops" in d:
            d["gflops"] = d.pop("flops") / (d["ms"] * 1e6)
        if per_call > 1:
            d["us_per_call"] = d["ms"] * 1000
        d["threads"] = self.threads
        d["blas_core"] = "torch " + self.version
        d["warmup_runs"], d["stable"] = timing["warmup_runs"], timing["stable"]
        d["page_faults"] = timing["page_faults"]
        d["fault_ms"] = timing["page_faults"] * self.fault_cost_ms
        if d["fault_ms"] > 0.5 * timing["ms"]:
            d["fault_dominated"] = True
            print("bench_torch.py: %s %s: dominated by first-touch page faults: %d faults at %.2f us each on this "
                  "machine are about %.0f ms of its %.1f ms (PyTorch allocates its large buffers anew on every call)" %
                  (d["case"], d["kernel"], d["page_faults"], self.fault_cost_ms * 1000, d["fault_ms"], timing["ms"]),
                  file=sys.stderr, flush=True)
        if not timing["stable"]:
            print("bench_torch.py: %s %s: its time did not settle in %d warm-up calls (a busy machine?)" %
                  (d["case"], d["kernel"], timing["warmup_runs"]), file=sys.stderr, flush=True)
        d["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        # 4 significant digits, as bench.lua prints them
        print(json.dumps({k: float("%.4g" % v) if isinstance(v, float) else v for k, v in d.items()}), flush=True)


def notebook_causal_attention(torch):
    """notebook 002's CausalAttention class (defined here so that --help needs no torch)"""
    nn = torch.nn

    class CausalAttention(nn.Module):
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

    return CausalAttention


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="all",
                    help="comma-separated from sgemm_peak, A, A_causal, B, B_causal, A_bwd, A_causal_bwd, B_bwd, "
                    "mha, tiny, tiny_train, block_sparse, train_gpt, decode, decode_gqa, window (default: all)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (default: OMP_NUM_THREADS, else every CPU, as bench.lua)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls after the warm-up; ms is the best")
    a = ap.parse_args()
    if a.reps < 1 or (a.threads is not None and a.threads < 1):
        ap.error("--reps and --threads expect positive integers")
    known = {"sgemm_peak", "A", "A_causal", "B", "B_causal", "A_bwd", "A_causal_bwd", "B_bwd", "mha", "tiny",
             "tiny_train", "block_sparse", "train_gpt"}
    known |= {"decode", "decode_gqa", "window"}
    want = None if a.cases == "all" else set(a.cases.split(","))
    if want is not None and not want <= known:
        ap.error("unknown case(s) %s; known: %s" % (", ".join(sorted(want - known)), ", ".join(sorted(known))))
    wanted = lambda name: want is None or name in want

    import torch  # after the arguments, so that --help and usage errors need no torch
    import torch.nn as nn
    import torch.nn.functional as F
    sys.dont_write_bytecode = True  # no scripts/__pycache__ from the next import
    from export_torch import MultiHeadAttention  # notebook 002's class, scaled by the head width

    # the same default as bench.lua and bench_ggml.sh (torch's own counts physical cores only)
    torch.set_num_threads(a.threads or int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count()))
    emit = Emitter(torch, torch.get_num_threads(), first_touch_ms_per_fault(torch))
    torch.manual_seed(0)
    with torch.no_grad():
        if wanted("sgemm_peak"):
            n = 2048
            x, y = torch.randn(n, n), torch.randn(n, n)
            emit(dict(case="sgemm_peak", kernel="torch.mm", b=1, h=1, lq=n, lk=n, e=n, causal=False,
                      flops=2.0 * n ** 3), best_ms(lambda: x @ y, a.reps))
        for name, b, h, n, e, causal in [("A", 4, 12, 1024, 64, False), ("A_causal", 4, 12, 1024, 64, True),
                                          ("B", 1, 8, 4096, 64, False), ("B_causal", 1, 8, 4096, 64, True)]:
            if not wanted(name):
                continue
            q, k, v = torch.randn(b, h, n, e), torch.randn(b, h, n, e), torch.randn(b, h, n, e)
            timing = best_ms(lambda: F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal), a.reps)
            emit(dict(case=name, kernel="torch_sdpa", b=b, h=h, lq=n, lk=n, e=e, causal=causal,
                      flops=4.0 * b * h * n * n * e), timing)
            del q, k, v
        if wanted("block_sparse"):
            b, h, n, e, docs = 1, 8, 4096, 64, 8
            q, k, v = torch.randn(b, h, n, e), torch.randn(b, h, n, e), torch.randn(b, h, n, e)
            ids = torch.arange(n) * docs // n
            mask = torch.zeros(n, n).masked_fill(ids.view(n, 1) != ids.view(1, n), float("-inf"))
            dense = best_ms(lambda: F._scaled_dot_product_attention(q, k, v, None, 0.0, False, False), a.reps)
            timing = best_ms(lambda: F._scaled_dot_product_attention(q, k, v, mask, 0.0, False, False), a.reps)
            emit(dict(case="block_sparse", kernel="torch_sdpa dense float mask", b=b, h=h, lq=n, lk=n, e=e,
                      causal=False, docs=docs, dense_ms=dense["ms"], vs_dense=timing["ms"] / dense["ms"],
                      flops=4.0 * b * h * n * n * e), timing)
            del q, k, v, mask
        if wanted("mha"):
            b, n, d, h = 4, 1024, 768, 12
            shape = dict(b=b, h=h, lq=n, lk=n, e=d // h, causal=True, flops=4.0 * b * h * n * n * (d // h))
            m = nn.MultiheadAttention(d, h, batch_first=True).eval()
            x = torch.randn(b, n, d)
            mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
            emit(dict(case="mha", kernel="nn.MultiheadAttention", **shape),
                 best_ms(lambda: m(x, x, x, attn_mask=mask, need_weights=False), a.reps))
            m2 = MultiHeadAttention(d, d, n, 0.0, h).eval()
            emit(dict(case="mha", kernel="notebook MultiHeadAttention", **shape), best_ms(lambda: m2(x), a.reps))
        if wanted("tiny"):
            batch = torch.rand(2, 6, 3)
            for label, m in [("CausalAttention", notebook_causal_attention(torch)(3, 2, 6, 0.0)),
                             ("MultiHeadAttention", MultiHeadAttention(3, 2, 6, 0.0, 2))]:
                calls = 5000

                def loop():
                    for _ in range(calls):
                        m(batch)
                emit(dict(case="tiny", kernel=label, b=2, h=getattr(m, "num_heads", 1), lq=6, lk=6, e=2, causal=True),
                     best_ms(loop, a.reps), per_call=calls)
    if wanted("tiny_train"):
        # bench.lua's tiny_train: the recorded forward, and forward + backward of m(x).sum()
        batch = torch.rand(2, 6, 3)
        for label, m in [("CausalAttention", notebook_causal_attention(torch)(3, 2, 6, 0.0)),
                         ("MultiHeadAttention", MultiHeadAttention(3, 2, 6, 0.0, 2))]:
            calls = 2000

            def forward_loop():
                for _ in range(calls):
                    m(batch)

            def train_loop():
                for _ in range(calls):
                    m(batch).sum().backward()
            fwd = best_ms(forward_loop, a.reps)
            emit(dict(case="tiny_train", kernel=label, b=2, h=getattr(m, "num_heads", 1), lq=6, lk=6, e=2,
                      causal=True, fwd_us=fwd["ms"] * 1000 / calls), best_ms(train_loop, a.reps), per_call=calls)
    for name, b, h, n, e, causal in [("A_bwd", 4, 12, 1024, 64, False), ("A_causal_bwd", 4, 12, 1024, 64, True),
                                      ("B_bwd", 1, 8, 4096, 64, False)]:
        if not wanted(name):
            continue
        q, k, v = (torch.randn(b, h, n, e).requires_grad_() for _ in range(3))

        def forward():
            return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal)[0]

        def forward_backward():
            out = forward()
            out.backward(out.detach())
        fwd = best_ms(forward, a.reps)
        timing = best_ms(forward_backward, a.reps)
        emit(dict(case=name, kernel="torch_sdpa", b=b, h=h, lq=n, lk=n, e=e, causal=causal, fwd_ms=fwd["ms"],
                  flops=14.0 * b * h * n * n * e), timing)
        del q, k, v
    if wanted("train_gpt"):
        train_gpt_case(torch, emit, a.reps)
    with torch.no_grad():
        variant_cases(torch, emit, a.reps, wanted)


def variant_cases(torch, emit, reps, wanted):
    """bench.lua's decode, decode_gqa and window in torch 1.13's math SDPA (no enable_gqa, no window option)"""
    import torch.nn.functional as F
    b, hkv, lk, e = 1, 8, 65536, 64
    if wanted("decode") or wanted("decode_gqa"):
        k, v = torch.randn(b, hkv, lk, e), torch.randn(b, hkv, lk, e)
        nbytes = 2.0 * b * hkv * lk * e * 4
        for name, h in [("decode", hkv), ("decode_gqa", 4 * hkv)]:
            if not wanted(name):
                continue
            q = torch.randn(b, h, 1, e)
            g = h // hkv

            def call():
                kk = k.repeat_interleave(g, dim=1) if g > 1 else k
                vv = v.repeat_interleave(g, dim=1) if g > 1 else v
                return F._scaled_dot_product_attention(q, kk, vv, None, 0.0, False, False)
            timing = best_ms(call, reps)
            emit(dict(case=name, kernel="torch_sdpa", b=b, h=h, h_kv=hkv, lq=1, lk=lk, e=e, causal=False,
                      flops=4.0 * b * h * lk * e, gbps=nbytes / (timing["ms"] * 1e6)), timing)
        del k, v
    if wanted("window"):
        b, h, n, e, left = 1, 8, 4096, 64, 255
        q, k, v = torch.randn(b, h, n, e), torch.randn(b, h, n, e), torch.randn(b, h, n, e)
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        hidden = (j > i) | (i - j > left)
        mask = torch.zeros(n, n).masked_fill(hidden, float("-inf"))  # additive float mask
        pairs = sum(min(r + 1, left + 1) for r in range(n))
        emit(dict(case="window", kernel="torch_sdpa", b=b, h=h, lq=n, lk=n, e=e, causal=True, window=left,
                  visible_pairs=pairs, flops=4.0 * b * h * pairs * e),
             best_ms(lambda: F._scaled_dot_product_attention(q, k, v, mask, 0.0, False, False), reps))


def train_gpt_case(torch, emit, reps):
    """one training step (forward, cross entropy, backward, AdamW) of the book's GPTModel
    (scripts/fixtures/make_gpt_fixtures.py, drop_rate 0) at the size of bench.lua's train_gpt"""
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
    from make_gpt_fixtures import GPTModel
    cfg = {"vocab_size": 256, "context_length": 128, "emb_dim": 128, "n_heads": 4, "n_layers": 4,
           "drop_rate": 0.0, "qkv_bias": False}
    b, n = 16, cfg["context_length"]
    torch.manual_seed(123)
    model = GPTModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    x = torch.randint(0, 256, (b, n))
    y = torch.randint(0, 256, (b, n))

    def step():
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    timing = best_ms(step, reps)
    emit(dict(case="train_gpt", kernel="book GPTModel + AdamW", b=b, h=cfg["n_heads"], lq=n, lk=n,
              e=cfg["emb_dim"] // cfg["n_heads"], causal=True, tokens_per_s=b * n / (timing["ms"] / 1000)), timing)


if __name__ == "__main__":
    main()
