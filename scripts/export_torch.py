#!/usr/bin/python3
"""PyTorch weights to and from safetensors files for attn (torch 1.13 + NumPy;
no safetensors package needed: the format is written and read here).

    /usr/bin/python3 scripts/export_torch.py [--skip-int] module.pt out.safetensors
        a saved nn.Module (torch.save(model)) or state_dict (torch.save(model.state_dict()))
        as a safetensors file that attn's m:load(path) / attn.load_safetensors read.
        Floating tensors are written as F32 (float64/float16/bfloat16 converted);
        integer and bool tensors (buffers such as BatchNorm's num_batches_tracked,
        position ids, masks) keep their dtype (I64, I32, I16, I8, U8, BOOL), which
        attn loads as float32, exactly while |x| <= 2^24 (a warning names any
        tensor past that); --skip-int leaves them out. Anything else in the state
        dict (complex or quantized tensors, non-tensor extra state) is skipped
        with a warning naming it: the model is never refused as a whole.

    /usr/bin/python3 scripts/export_torch.py --demo-mha out.safetensors inputs.npy outputs.npy
        a seeded MultiHeadAttention of the notebook (002, defined below as it is
        there), its state_dict, a random input [2, 6, d_in] and the module's output
        on it. In attn:
          local m = attn.nn.MultiHeadAttention(8, 12, 6, 0.0, 3)   -- the sizes printed
          m:load("out.safetensors")
          print((m(attn.load("inputs.npy")) - attn.load("outputs.npy")):abs():max())

    /usr/bin/python3 scripts/export_torch.py --run-mha weights.safetensors inputs.npy outputs.npy
        the other direction: weights saved by attn's MultiHeadAttention:save(path,
        {num_heads = "3"}) loaded (strictly) into the notebook class, run on inputs.npy.
"""
import argparse
import json
import struct
import sys

import numpy as np
import torch
import torch.nn as nn

# ---- the format ---------------------------------------------------------

MAX_HEADER = 100_000_000
READ_DTYPES = {"F32": np.dtype("<f4"), "F64": np.dtype("<f8"), "F16": np.dtype("<f2")}
# integer and bool dtypes: written as they are; attn reads them as float32 (exact while |x| <= 2^24)
INT_DTYPES = {torch.int64: ("I64", "<i8"), torch.int32: ("I32", "<i4"), torch.int16: ("I16", "<i2"),
              torch.int8: ("I8", "|i1"), torch.uint8: ("U8", "|u1"), torch.bool: ("BOOL", "|b1")}
READ_INT_DTYPES = {st: (np.dtype(np_dtype), dt) for dt, (st, np_dtype) in INT_DTYPES.items()}
FLOAT32_EXACT = 2 ** 24


def warn(msg):
    print("export_torch: warning: " + msg, file=sys.stderr)


def exportable(tensors, skip_int=False):
    """The entries of a state dict that write_safetensors writes: floating tensors,
    and integer/bool ones unless skip_int. Every other entry is left out with a
    warning naming it; so is nothing else."""
    out = {}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            warn(f"'{name}' is a {type(t).__name__}, not a tensor: skipped")
        elif t.is_quantized or t.is_complex() or t.is_sparse:
            warn(f"tensor '{name}' ({t.dtype}, {t.layout}) has no float32 form attn reads: skipped")
        elif torch.is_floating_point(t):
            out[name] = t
        elif t.dtype in INT_DTYPES:
            if skip_int:
                warn(f"integer or bool tensor '{name}' ({t.dtype}) skipped (--skip-int)")
                continue
            if t.numel() and t.dtype != torch.bool and int(t.abs().max()) > FLOAT32_EXACT:
                warn(f"integer tensor '{name}' holds {int(t.abs().max())}, past 2^24: attn will refuse to load it "
                     "(float32 cannot hold it exactly); --skip-int leaves integer tensors out")
            out[name] = t
        else:
            warn(f"tensor '{name}' has dtype {t.dtype}, which attn does not read: skipped")
    return out


def write_safetensors(path, tensors, metadata=None):
    """tensors: dict name -> torch tensor, names sorted: floating ones written as
    F32, integer and bool ones (INT_DTYPES) as they are. Other dtypes raise
    (exportable() filters a whole state dict first)."""
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if torch.is_floating_point(t):
            dtype, raw = "F32", t.to(torch.float32).numpy().astype("<f4").tobytes()
        elif t.dtype in INT_DTYPES:
            dtype, np_dtype = INT_DTYPES[t.dtype]
            raw = t.numpy().astype(np_dtype).tobytes()
        else:
            raise SystemExit(f"export_torch: tensor '{name}' has dtype {t.dtype}, which attn does not read")
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def read_safetensors(path):
    """dict name -> torch tensor (float32; integer and bool tensors in their own
    dtype, so that load_state_dict fills integer buffers), and the metadata dict."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise SystemExit(f"export_torch: {path}: bad header length {n}")
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = body[begin:end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif info["dtype"] in READ_DTYPES:
            arr = np.frombuffer(raw, dtype=READ_DTYPES[info["dtype"]]).astype(np.float32)
        elif info["dtype"] in READ_INT_DTYPES:
            np_dtype, torch_dtype = READ_INT_DTYPES[info["dtype"]]
            arr = np.frombuffer(raw, dtype=np_dtype).astype(np_dtype.newbyteorder("="))
            out[name] = torch.from_numpy(arr.copy().reshape(info["shape"])).to(torch_dtype)
            continue
        else:
            raise SystemExit(f"export_torch: {path}: tensor '{name}' has dtype {info['dtype']}")
        out[name] = torch.from_numpy(arr.copy().reshape(info["shape"]))
    return out, metadata


# ---- the notebook's class (002_attention_chapter) ---------------------------

class MultiHeadAttention(nn.Module):
    """As notebook 002 defines it, with one fix: the notebook scales the scores
    by a stale global (`key.shape[-1]`); this uses the head width
    (`keys.shape[-1]`), which is what attn.nn.MultiHeadAttention does."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert (d_out % num_heads == 0), \
            "d_out must be divisible by num_heads"

        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads

        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # Linear layer to combine head outputs
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape

        keys = self.W_key(x)  # Shape: (b, num_tokens, d_out)
        queries = self.W_query(x)
        values = self.W_value(x)

        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)

        keys = keys.transpose(1, 2)
        queries = queries.transpose(1, 2)
        values = values.transpose(1, 2)

        attn_scores = queries @ keys.transpose(2, 3)
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)

        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)

        context_vec = (attn_weights @ values).transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        context_vec = self.out_proj(context_vec)
        return context_vec


def demo_mha(seed=123, d_in=8, d_out=12, context_length=6, num_heads=3, batch=2):
    """A seeded module, an input and its output (eval mode, dropout 0)."""
    torch.manual_seed(seed)
    m = MultiHeadAttention(d_in, d_out, context_length, 0.0, num_heads).eval()
    x = torch.rand(batch, context_length, d_in)
    with torch.no_grad():
        y = m(x)
    config = {"class": "MultiHeadAttention", "d_in": d_in, "d_out": d_out, "context_length": context_length,
              "dropout": 0.0, "num_heads": num_heads, "seed": seed}
    return m, x, y, config


def run_mha(weights, inputs, outputs):
    sd, meta = read_safetensors(weights)
    if "num_heads" not in meta:
        raise SystemExit("export_torch: --run-mha needs the metadata key num_heads (m:save(path, {num_heads = ...}))")
    d_out, d_in = sd["W_query.weight"].shape
    context_length = sd["mask"].shape[0]
    m = MultiHeadAttention(d_in, d_out, context_length, 0.0, int(meta["num_heads"]),
                           qkv_bias="W_query.bias" in sd).eval()
    m.load_state_dict(sd, strict=True)
    with torch.no_grad():
        y = m(torch.from_numpy(np.load(inputs).astype(np.float32)))
    np.save(outputs, y.numpy().astype("<f4"))


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--demo-mha", action="store_true", help="write a seeded notebook MultiHeadAttention")
    ap.add_argument("--run-mha", action="store_true", help="run attn-saved MultiHeadAttention weights in torch")
    ap.add_argument("--skip-int", action="store_true", help="leave integer and bool tensors out of the export")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    if a.demo_mha or a.run_mha:
        if len(a.files) != 3:
            ap.error("expected: weights.safetensors inputs.npy outputs.npy")
        if a.run_mha:
            run_mha(*a.files)
            return
        out, inputs, outputs = a.files
        m, x, y, config = demo_mha()
        write_safetensors(out, m.state_dict(), config)
        np.save(inputs, x.numpy().astype("<f4"))
        np.save(outputs, y.numpy().astype("<f4"))
        print("attn.nn.MultiHeadAttention(%d, %d, %d, 0.0, %d): %s, input %s -> %s" % (
            config["d_in"], config["d_out"], config["context_length"], config["num_heads"], out, inputs, outputs))
        return
    if len(a.files) != 2:
        ap.error("expected: module.pt out.safetensors")
    obj = torch.load(a.files[0], map_location="cpu")
    sd = obj.state_dict() if isinstance(obj, nn.Module) else obj
    if not isinstance(sd, dict):
        raise SystemExit(f"export_torch: {a.files[0]} holds neither an nn.Module nor a state_dict")
    kept = exportable(sd, skip_int=a.skip_int)
    write_safetensors(a.files[1], kept, {"format": "pt"})
    print(f"{a.files[1]}: {len(kept)} tensors" + (f" ({len(sd) - len(kept)} skipped)" if len(kept) < len(sd) else ""))


if __name__ == "__main__":
    main(sys.argv[1:])
