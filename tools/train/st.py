"""safetensors read and write (8-byte little-endian header length, JSON
header, raw little-endian data) for F32, F16, BF16 and I32 tensors."""

import json
import struct

import numpy as np
import torch


def read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        raw = data[a:b]
        if h["dtype"] == "F32":
            t = torch.from_numpy(np.frombuffer(raw, dtype="<f4").copy())
        elif h["dtype"] == "F16":
            t = torch.from_numpy(np.frombuffer(raw, dtype="<f2").astype(np.float32))
        elif h["dtype"] == "I32":
            t = torch.from_numpy(np.frombuffer(raw, dtype="<i4").copy())
        elif h["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            t = torch.from_numpy(u.view(np.float32).copy())
        else:
            raise ValueError(f"{path}: {name}: dtype {h['dtype']}")
        out[name] = t.reshape(h["shape"])
    return out, meta


def bf16_round(t):
    """Round float32 to the nearest bfloat16 (ties to even), kept as float32."""
    u = t.detach().float().contiguous().numpy().view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return torch.from_numpy(u.astype(np.uint32).view(np.float32).copy()).reshape(t.shape)


def write(path, tensors, dtypes=None, metadata=None):
    """tensors: name -> tensor; dtypes: name -> "F32" | "F16" | "BF16" | "I32" (F32 by default)."""
    dtypes = dtypes or {}
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        dt = dtypes.get(name, "I32" if t.dtype in (torch.int32, torch.int64) else "F32")
        if dt == "F32":
            raw = t.float().numpy().astype("<f4").tobytes()
        elif dt == "F16":
            raw = t.float().numpy().astype("<f2").tobytes()
        elif dt == "I32":
            raw = t.numpy().astype("<i4").tobytes()
        elif dt == "BF16":
            raw = (bf16_round(t).numpy().view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raise ValueError(dt)
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
