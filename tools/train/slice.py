"""Writes the fixtures k3's tests read from a trained checkpoint:
a small held-out slice of the corpus with PyTorch's token ids and bits for
every file (k3 must tokenize it identically and score it within 1%).

    python3 slice.py -model DIR -out ../../testdata/trained
"""

import argparse
import json
import os

import torch

import data
import model
import st
import train


def load(dirname):
    cfg = json.load(open(os.path.join(dirname, "config.json")))["text_config"]
    lm = model.LM(cfg).eval()
    sd, meta = st.read(os.path.join(dirname, "model.safetensors"))
    model.load_hf_state_dict(lm, sd)
    tok = data.Tokenizer(data.read_tokens(os.path.join(dirname, "tiktoken.model")))
    return lm, tok, meta


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-model", required=True)
    ap.add_argument("-out", required=True)
    ap.add_argument("-bytes", type=int, default=24_000, help="held-out bytes in the slice")
    ap.add_argument("-max-file", dest="max_file", type=int, default=8_000, help="skip held-out files larger than this")
    args = ap.parse_args()
    torch.set_num_threads(2)
    lm, tok, meta = load(args.model)
    goroot, version = data.go_info()
    _, held = data.corpus(goroot)
    os.makedirs(os.path.join(args.out, "heldout"), exist_ok=True)
    files, n = [], 0
    total = {"bits": 0.0, "tokens": 0, "bytes": 0}
    for path, text in held:
        if n >= args.bytes:
            break
        if len(text.encode()) > args.max_file:
            continue
        name = path.replace("/", "__")
        with open(os.path.join(args.out, "heldout", name), "w") as f:
            f.write(text)
        ids = tok.encode(text)
        bits, ntok = train.score_file(lm, tok, text)
        files.append({"name": name, "path": "src/" + path, "ids": ids, "bits": bits, "tokens": ntok, "bytes": len(text.encode())})
        total["bits"] += bits
        total["tokens"] += ntok
        total["bytes"] += len(text.encode())
        n += len(text.encode())
    total["bits_per_byte"] = total["bits"] / total["bytes"]
    out = {"description": "held-out Go source files scored by tools/train (PyTorch, float32, the checkpoint's bf16 weights), "
                          f"{train.EVAL_WINDOW}-token windows from [BOS]",
           "go_version": version, "window": train.EVAL_WINDOW, "files": files, "total": total}
    with open(os.path.join(args.out, "heldout.json"), "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(json.dumps(total))


if __name__ == "__main__":
    main()
