#!/usr/bin/env python3
"""The PyTorch half of the interop tests (tests/interop/interop_gpt.cpp is the other).

The GPT here is the peer's (shared/peer/torch_bench.py) at a small size, with
the state_dict names frugal's nn::Gpt uses: tok, pos, blocks.N.{ln1, attn.qkv,
attn.proj, ln2, fc, fc_proj}, ln_f, head (no bias); exact (erf) GELU; the
causal mask is a non-persistent buffer, so it is not in the state_dict.

safetensors files are read and written here with json + struct + numpy (no
safetensors package), so this side is an independent implementation of the
format, and the tests check frugal's files against it.

  torch_interop.py check DIR   load DIR/gpt.safetensors (frugal's weights) strictly,
                               run DIR/gpt-io.safetensors' tokens, compare the logits
  torch_interop.py export DIR  write DIR/torch-gpt.safetensors (a seeded, perturbed
                               model) and DIR/torch-io.safetensors (tokens, logits)
"""
import json
import math
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CTX, LAYERS, D, HEADS = 65, 32, 2, 64, 4

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32, "I64": np.int64,
          "U8": np.uint8}


def read_safetensors(path):
    """Tensors (name -> numpy array) and metadata of a safetensors file, checked as the spec says."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), f"{path}: header length {n} past the end of the file"
    assert n % 8 == 0, f"{path}: header length {n} is not a multiple of 8"
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    spans = sorted((info["data_offsets"][0], info["data_offsets"][1], name) for name, info in header.items())
    end = 0
    for begin, stop, name in spans:
        assert begin == end, f"{path}: tensor {name} does not start where the previous one ended"
        end = stop
    assert end == len(data), f"{path}: data is {len(data)} bytes but the header accounts for {end}"
    out = {}
    for name, info in header.items():
        begin, stop = info["data_offsets"]
        dt = np.dtype(DTYPES[info["dtype"]]).newbyteorder("<")
        arr = np.frombuffer(data[begin:stop], dtype=dt).reshape(info["shape"])
        out[name] = arr.copy()
    return out, meta


def write_safetensors(path, tensors, metadata=None):
    """Writes name -> numpy array as safetensors (header sorted by name, space-padded to 8 bytes)."""
    names = {np.dtype(v): k for k, v in DTYPES.items()}
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        blob = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


class CausalSelfAttention(nn.Module):
    def __init__(self, d, h, ctx):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.h
        qkv = self.qkv(x).view(B, T, 3, self.h, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d, h, ctx):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, h, ctx)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x))))  # exact erf GELU, as frugal's default


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(CTX, D)
        self.blocks = nn.ModuleList([Block(D, HEADS, CTX) for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        B, T = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def compare(got, expected, what):
    diff = float(np.max(np.abs(got - expected)))
    scale = float(np.max(np.abs(expected)))
    tol = 1e-4 * max(1.0, scale)
    print(f"{what}: max abs difference {diff:.3g} (largest |logit| {scale:.3g}, tolerance {tol:.3g})")
    return diff <= tol  # a NaN difference fails too


def check(d):
    weights, meta = read_safetensors(f"{d}/gpt.safetensors")
    model = GPT()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    model.eval()
    io, _ = read_safetensors(f"{d}/gpt-io.safetensors")
    with torch.no_grad():
        logits = model(torch.from_numpy(io["tokens"])).numpy()
    print(f"loaded {len(weights)} tensors from frugal (metadata {meta})")
    return compare(logits, io["logits"], "torch vs frugal logits")


def export(d):
    torch.manual_seed(0)
    model = GPT()
    with torch.no_grad():  # off the initial values: LayerNorm weights not 1, biases not 0
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.eval()
    tokens = torch.randint(0, VOCAB, (2, CTX))
    with torch.no_grad():
        logits = model(tokens)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    write_safetensors(f"{d}/torch-gpt.safetensors", state, {"source": "torch_interop.py"})
    write_safetensors(f"{d}/torch-io.safetensors", {"tokens": tokens.numpy(), "logits": logits.numpy()})
    print(f"wrote {len(state)} tensors to {d}/torch-gpt.safetensors")
    return True


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("check", "export"):
        sys.exit("usage: torch_interop.py check DIR | torch_interop.py export DIR")
    ok = check(sys.argv[2]) if sys.argv[1] == "check" else export(sys.argv[2])
    sys.exit(0 if ok else 1)
