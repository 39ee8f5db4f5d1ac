"""Writes the fixture k3's DSpark drafter test reads: the embedded model's
draft module run by PyTorch at a few anchors of a held-out file (the
target's hidden states at the draft's target layers, its greedy next
token, the draft block's logits with the Markov term, the greedy drafts
and the confidences).

    python3 draft_fixture.py -model ../../internal/tinymodel/gocode -out ../../testdata/trained/draft_crosscheck.safetensors
"""

import argparse
import json
import os

import torch

import draft
import slice
import st
import train


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-model", required=True)
    ap.add_argument("-out", required=True)
    ap.add_argument("-file", default="../../testdata/trained/heldout/cmd__asm__internal__lex__lex_test.go")
    ap.add_argument("-anchors", default="40,97,160")
    args = ap.parse_args()
    torch.set_num_threads(2)
    lm, tok, _ = slice.load(args.model)
    cfg = json.load(open(os.path.join(args.model, "config.json")))["text_config"]
    dcfg = cfg["dspark_config"]
    dm = draft.Draft(cfg, dcfg).eval()
    sd, _ = st.read(os.path.join(args.model, "model.safetensors"))
    prefix = "language_model." + dcfg["tensor_prefix"]
    dm.load_state_dict({k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)})
    anchors = [int(a) for a in args.anchors.split(",")]
    ids = [tok.special["[BOS]"]] + tok.encode(open(args.file).read())
    ids = ids[:max(anchors) + 1]
    layers, K = dcfg["target_layers"], dcfg["block_size"]
    taps, nexts, drafts, logits, confs = [], [], [], [], []
    with torch.no_grad():
        for t in anchors:
            out, hidden = lm(torch.tensor([ids[:t + 1]]), taps=layers)
            nxt = int(out[0, -1].argmax())
            tp = train.taps_of(hidden, layers)[0, -1]
            f = dm.features(tp, lm.model.embed_tokens(torch.tensor(nxt)))
            base = dm.block_logits(f, lm.lm_head)
            prev, ds, ls, cs = nxt, [], [], []
            for k in range(K):
                bk, m = dm.markov(torch.tensor(prev))
                q = base[k] + bk
                ls.append(q)
                cs.append(dm.conf(f[k], m))
                prev = int(q.argmax())
                ds.append(prev)
            taps.append(tp)
            nexts.append(nxt)
            drafts.append(ds)
            logits.append(torch.stack(ls))
            confs.append(torch.stack(cs))
    st.write(args.out, {
        "input_ids": torch.tensor(ids, dtype=torch.int32),
        "anchors": torch.tensor(anchors, dtype=torch.int32),
        "taps": torch.stack(taps).float(),
        "next_ids": torch.tensor(nexts, dtype=torch.int32),
        "draft_ids": torch.tensor(drafts, dtype=torch.int32),
        "draft_logits": torch.stack(logits).float(),
        "confidence": torch.stack(confs).float(),
    }, metadata={"description": "the embedded model's DSpark draft module at held-out anchors, run by tools/train (PyTorch "
                 + torch.__version__ + ", float32, the checkpoint's bf16 weights)",
                 "format": "taps [A, 3D] are the MLP-sublayer inputs of target_layers at each anchor (the anchor's "
                 "position is anchors[a], ids up to it fed); next_ids the target's greedy token after it; draft_logits "
                 "[A, K, V] each block position's U_k + B_k; draft_ids their greedy chain; confidence [A, K]; read by k3/dspark_test.go"})


if __name__ == "__main__":
    main()
