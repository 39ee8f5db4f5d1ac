"""safetensors read and write (8-byte little-endian header length, JSON
header, raw little-endian data) for F32, F16, BF16, I32, I64, U8 and
F8_E4M3 tensors. F8_E4M3 reads as its values (float32, exact) and is
written from its byte codes (a uint8 tensor)."""

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
        elif h["dtype"] == "I64":
            t = torch.from_numpy(np.frombuffer(raw, dtype="<i8").copy())
        elif h["dtype"] == "U8":
            t = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())
        elif h["dtype"] == "F8_E4M3":
            t = torch.from_numpy(E4M3[np.frombuffer(raw, dtype=np.uint8)])
        elif h["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            t = torch.from_numpy(u.view(np.float32).copy())
        else:
            raise ValueError(f"{path}: {name}: dtype {h['dtype']}")
        out[name] = t.reshape(h["shape"])
    return out, meta


def dtypes(path):
    """name -> stored dtype of the tensors of the file at path."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return {k: h["dtype"] for k, h in header.items()}


def _e4m3(b):
    """An fp8 e4m3fn byte's value: sign, four exponent bits (bias 7, 0 is
    subnormal), three mantissa bits; 0x7f and 0xff are NaN."""
    e, m = (b >> 3) & 15, b & 7
    if e == 15 and m == 7:
        v = float("nan")
    elif e == 0:
        v = m / 8 * 2.0 ** -6
    else:
        v = (1 + m / 8) * 2.0 ** (e - 7)
    return -v if b & 0x80 else v


E4M3 = np.array([_e4m3(b) for b in range(256)], dtype=np.float32)


def bf16_round(t):
    """Round float32 to the nearest bfloat16 (ties to even), kept as float32."""
    u = t.detach().float().contiguous().reshape(-1).numpy().view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return torch.from_numpy(u.astype(np.uint32).view(np.float32).copy()).reshape(t.shape)


def write(path, tensors, dtypes=None, metadata=None):
    """tensors: name -> tensor; dtypes: name -> "F32" | "F16" | "BF16" |
    "I32" | "I64" | "U8" | "F8_E4M3" (F32 by default; uint8 tensors are U8)."""
    dtypes = dtypes or {}
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        dt = dtypes.get(name, "I32" if t.dtype in (torch.int32, torch.int64) else "U8" if t.dtype == torch.uint8 else "F32")
        if dt == "F32":
            raw = t.float().numpy().astype("<f4").tobytes()
        elif dt == "F16":
            raw = t.float().numpy().astype("<f2").tobytes()
        elif dt == "I32":
            raw = t.numpy().astype("<i4").tobytes()
        elif dt == "I64":
            raw = t.numpy().astype("<i8").tobytes()
        elif dt in ("U8", "F8_E4M3"):
            assert t.dtype == torch.uint8, f"{name}: {dt} is written from uint8 codes"
            raw = t.numpy().tobytes()
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
