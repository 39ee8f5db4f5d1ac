"""Corpus and tokenizer for the embedded model.

The corpus is the Go standard library source of the toolchain that runs the
script ($(go env GOROOT)/src, *.go, testdata directories left out). A file is
held out when the first byte of sha256(its path relative to src) is below
HELDOUT_BELOW: the split depends on the path alone, so it is the same on
every machine and for every Go version.

The tokenizer is a byte-level BPE learned on the training split with the
Kimi pre-tokenizer (the regular expression of tokenization_kimi.py), written
as a tiktoken rank file: one "base64(token bytes) rank" line per token,
ranks 0..255 the single bytes and the merges after them in the order they
were learned.
"""

import base64
import hashlib
import heapq
import json
import os
import subprocess

import regex

HELDOUT_BELOW = 6  # of 256: about 2.3% of the files

# The Kimi pre-tokenizer. regex's V1 mode gives the class intersections (&&).
KIMI_PATTERN = "|".join([
    r"[\p{Han}]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
_pat = regex.compile(KIMI_PATTERN, regex.V1)

# Special tokens at the Kimi offsets from the first id after the ranks.
SPECIAL_OFFSETS = {
    "[BOS]": 0, "[EOS]": 1, "<|im_end|>": 2, "<|im_user|>": 3, "<|im_assistant|>": 4,
    "<|start_header_id|>": 6, "<|end_header_id|>": 7, "[EOT]": 9, "<|im_system|>": 10,
    "<|im_middle|>": 17, "[UNK]": 62, "[PAD]": 63,
}
NUM_SPECIAL = 64


def go_info():
    goroot = subprocess.check_output(["go", "env", "GOROOT"], text=True).strip()
    version = subprocess.check_output(["go", "env", "GOVERSION"], text=True).strip()
    return goroot, version


def corpus(goroot):
    """Returns (train, heldout): sorted lists of (relative path, text)."""
    src = os.path.join(goroot, "src")
    paths = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if d != "testdata")
        for f in sorted(filenames):
            if f.endswith(".go"):
                paths.append(os.path.relpath(os.path.join(dirpath, f), src))
    paths.sort()
    train, held = [], []
    for p in paths:
        with open(os.path.join(src, p), "rb") as fh:
            b = fh.read()
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError:
            continue  # not UTF-8: not Go source
        if is_heldout(p):
            held.append((p, text))
        else:
            train.append((p, text))
    return train, held


def is_heldout(path):
    return hashlib.sha256(path.encode()).digest()[0] < HELDOUT_BELOW


def list_hash(files):
    h = hashlib.sha256()
    for p, text in files:
        h.update(p.encode() + b"\0" + hashlib.sha256(text.encode()).digest())
    return h.hexdigest()


def pretokenize(text):
    return _pat.findall(text)


def learn_bpe(texts, num_ranks):
    """Learns num_ranks-256 merges. Ties in pair counts go to the pair of
    lower ids, so the result depends on the input alone."""
    counts = {}
    for t in texts:
        for piece in pretokenize(t):
            b = piece.encode("utf-8")
            counts[b] = counts.get(b, 0) + 1
    words = [list(w) for w in counts]  # symbols: token ids
    freq = list(counts.values())
    tokens = [bytes([i]) for i in range(256)]
    pairs, where = {}, {}
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] = pairs.get((a, b), 0) + freq[wi]
            where.setdefault((a, b), set()).add(wi)
    heap = [(-c, p) for p, c in pairs.items()]
    heapq.heapify(heap)
    while len(tokens) < num_ranks and heap:
        negc, pair = heapq.heappop(heap)
        if pairs.get(pair, 0) != -negc or negc == 0:
            continue  # stale entry
        new = len(tokens)
        tokens.append(tokens[pair[0]] + tokens[pair[1]])
        touched = {}
        for wi in sorted(where.pop(pair, ())):
            w, f = words[wi], freq[wi]
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] -= f
                touched[(a, b)] = True
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == pair[0] and w[i + 1] == pair[1]:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[wi] = out
            for a, b in zip(out, out[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + f
                where.setdefault((a, b), set()).add(wi)
                touched[(a, b)] = True
        pairs.pop(pair, None)
        for p in touched:
            c = pairs.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pairs.pop(p, None)
    return tokens


class Tokenizer:
    """tiktoken-style encoder: each pre-token is split into bytes and the
    adjacent pair whose concatenation has the lowest rank is merged until no
    pair is a token."""

    def __init__(self, tokens):
        self.tokens = tokens
        self.rank = {t: i for i, t in enumerate(tokens)}
        self.base = len(tokens)
        self.special = {name: self.base + off for name, off in SPECIAL_OFFSETS.items()}
        self.vocab_size = self.base + NUM_SPECIAL
        self._cache = {}

    def encode_piece(self, b):
        ids = self._cache.get(b)
        if ids is not None:
            return ids
        parts = [b[i:i + 1] for i in range(len(b))]
        while len(parts) > 1:
            best, bi = None, -1
            for i in range(len(parts) - 1):
                r = self.rank.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best):
                    best, bi = r, i
            if best is None:
                break
            parts[bi:bi + 2] = [parts[bi] + parts[bi + 1]]
        ids = [self.rank[p] for p in parts]
        if len(self._cache) < 2_000_000:
            self._cache[b] = ids
        return ids

    def encode(self, text):
        out = []
        for piece in pretokenize(text):
            out.extend(self.encode_piece(piece.encode("utf-8")))
        return out

    def decode_bytes(self, ids):
        return b"".join(self.tokens[i] for i in ids)

    def write(self, outdir):
        with open(os.path.join(outdir, "tiktoken.model"), "w") as f:
            for i, t in enumerate(self.tokens):
                f.write(base64.b64encode(t).decode() + " " + str(i) + "\n")
        added = {}
        for i in range(NUM_SPECIAL):
            added[str(self.base + i)] = {"content": f"<|reserved_token_{i}|>", "special": True}
        for name, id_ in self.special.items():
            added[str(id_)] = {"content": name, "special": True}
        cfg = {
            "added_tokens_decoder": dict(sorted(added.items(), key=lambda kv: int(kv[0]))),
            "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
            "model_max_length": 1048576,
            "tokenizer_class": "TikTokenTokenizer",
        }
        with open(os.path.join(outdir, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")


def read_tokens(path):
    tokens = []
    with open(path) as f:
        for i, line in enumerate(f):
            b64, r = line.split()
            assert int(r) == i, path
            tokens.append(base64.b64decode(b64))
    return tokens
