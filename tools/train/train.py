"""Trains k3's embedded model: a tiny K3.1 Pro-shaped language model on the
Go standard library source, its BPE tokenizer and a DSpark-style draft
module, and exports them in the Hugging Face layout k3 loads.

    python3 train.py -out DIR            # everything; see README.md

Deterministic for a given seed, Go source tree and PyTorch build. CPU only.
"""

import argparse
import hashlib
import json
import math
import os
import time

import torch
import torch.nn.functional as F

import data
import draft
import model
import st

CONFIG = {
    "model_type": "kimi_linear", "vocab_size": 4096, "hidden_size": 192, "intermediate_size": 512,
    "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 4,
    "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "max_position_embeddings": 8192,
    "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "mla_use_nope": True, "mla_use_output_gate": True, "rope_theta": 10000.0,
    "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 128,
    "routed_expert_hidden_size": 96, "latent_moe_use_norm": True, "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc", "use_grouped_topk": True,
    "num_expert_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "attn_res_block_size": 2, "num_nextn_predict_layers": 0,
    "index_n_heads": 4, "index_head_dim": 32, "index_topk": 64,
    "linear_attn_config": {"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3, 6], "num_heads": 4, "head_dim": 48,
                           "short_conv_kernel_size": 4, "use_full_rank_gate": True, "gate_lower_bound": -5.0},
}
DRAFT = {"target_layers": [1, 3, 5], "block_size": 7, "markov_rank": 64, "num_layers": 2, "intermediate_size": 384}
EVAL_WINDOW = 2048  # tokens per scoring window, BOS first (k3 eval -window)
# Left in float32 in the checkpoint, as the released Kimi checkpoints do.
F32_TENSORS = ("A_log", "dt_bias", "e_score_correction_bias")


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def prepare(args):
    goroot, version = data.go_info()
    train, held = data.corpus(goroot)
    log(f"corpus {version}: {len(train)} training files, {len(held)} held out")
    order = sorted(train, key=lambda f: hashlib.sha256(f[0].encode()).digest())
    bpe_text, n = [], 0
    for _, t in order:
        if n >= args.bpe_bytes:
            break
        bpe_text.append(t)
        n += len(t)
    tokens = data.learn_bpe(bpe_text, CONFIG["vocab_size"] - data.NUM_SPECIAL)
    tok = data.Tokenizer(tokens)
    log(f"tokenizer: {len(tokens)} ranks learned on {n} bytes")
    bos = tok.special["[BOS]"]
    stream, nbytes = [], 0
    for _, t in order:
        if nbytes >= args.train_bytes:
            break
        stream.append(bos)
        stream.extend(tok.encode(t))
        nbytes += len(t.encode())
    log(f"training stream: {len(stream)} tokens from {nbytes} bytes")
    info = {"go_version": version, "train_files": len(train), "heldout_files": len(held),
            "train_list_sha256": data.list_hash(train), "heldout_list_sha256": data.list_hash(held),
            "heldout_rule": f"sha256(path relative to GOROOT/src)[0] < {data.HELDOUT_BELOW}",
            "tokenizer_bytes": n, "stream_tokens": len(stream), "stream_bytes": nbytes}
    return tok, torch.tensor(stream, dtype=torch.int32), held, info


def init_weights(lm, cfg, gen):
    for name, p in lm.named_parameters():
        if name.endswith("norm.weight") or "layernorm" in name or name.endswith("k_norm.weight"):
            torch.nn.init.ones_(p)
        elif name.endswith("k_norm.bias"):
            torch.nn.init.zeros_(p)
        elif "_res.proj" in name:
            torch.nn.init.zeros_(p)  # AttnRes starts as a uniform mix
        elif name.endswith("A_log"):
            torch.nn.init.zeros_(p)
        elif name.endswith("dt_bias"):
            # sigmoid(x) from 3e-4 to 0.27: memories from a few to ~700 tokens
            p.data.copy_(torch.rand(p.shape, generator=gen) * 7 - 8)
        elif name.endswith("conv1d.weight"):
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        else:
            std = 0.02
            if name.endswith(("o_proj.weight", "down_proj.weight", "w2.weight", "routed_expert_up_proj.weight")):
                std = 0.02 / math.sqrt(2 * cfg["num_hidden_layers"])
            p.data.copy_(torch.randn(p.shape, generator=gen) * std)


def lr_at(step, steps, peak, warm):
    if step < warm:
        return peak * (step + 1) / warm
    x = (step - warm) / max(1, steps - warm)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * x)))


def train_model(args, stream, gen):
    cfg = CONFIG
    lm = model.LM(cfg)
    init_weights(lm, cfg, gen)
    log(f"model: {sum(p.numel() for p in lm.parameters())} parameters")
    decay = [p for n, p in lm.named_parameters() if p.dim() >= 2 and "embed" not in n]
    other = [p for n, p in lm.named_parameters() if not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    dsa = [l.self_attn for l in lm.model.layers if isinstance(l.self_attn, model.DSA)]
    moe = [l.block_sparse_moe for l in lm.model.layers if l.moe]
    lm.train()
    t0 = time.time()
    ema = None
    for step in range(args.steps):
        T = args.seq if step < args.steps * 3 // 4 else args.seq_long
        B = args.batch * args.seq // T
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        for m in dsa:
            m.dense = step < args.dense_steps
        starts = torch.randint(0, len(stream) - T - 1, (B,), generator=gen)
        batch = torch.stack([stream[s:s + T + 1] for s in starts]).long()
        logits, _ = lm(batch[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), batch[:, 1:].reshape(-1))
        il = sum(m.index_loss for m in dsa)
        opt.zero_grad(set_to_none=True)
        (ce + il).backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free balancing of the routers
            for m in moe:
                load = m.load
                m.gate.e_score_correction_bias += args.bias_rate * torch.sign(load.mean() - load)
        ema = ce.item() if ema is None else 0.98 * ema + 0.02 * ce.item()
        if step % 50 == 0 or step == args.steps - 1:
            el = time.time() - t0
            log(f"step {step}/{args.steps} T={T} ce {ce.item():.3f} (ema {ema:.3f}) index {il.item():.3f} "
                f"lr {opt.param_groups[0]['lr']:.2e} {el/60:.1f} min, {(step+1)*args.batch*args.seq/el:.0f} tok/s")
    return lm


def bf16_model(lm):
    """The model as the checkpoint stores it: every tensor rounded to bf16
    except F32_TENSORS."""
    with torch.no_grad():
        for name, p in list(lm.named_parameters()) + list(lm.named_buffers()):
            if not name.endswith(F32_TENSORS):
                p.copy_(st.bf16_round(p))
    return lm


@torch.no_grad()
def taps_of(hidden, layers):
    return torch.cat([hidden[l] for l in layers], -1)


def train_draft(args, lm, stream, gen):
    cfg, dcfg = CONFIG, DRAFT
    dm = draft.Draft(cfg, dcfg)
    for name, p in dm.named_parameters():
        if name.endswith("norm.weight"):
            torch.nn.init.ones_(p)
        elif name in ("pos_embed", "confidence.bias"):
            torch.nn.init.zeros_(p)
        else:
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    opt = torch.optim.AdamW(dm.parameters(), lr=args.draft_lr, weight_decay=0.0)
    lm.eval()
    for p in lm.parameters():
        p.requires_grad_(False)
    K, T, B, A = dcfg["block_size"], args.seq, args.batch, args.draft_anchors
    w = torch.exp(-torch.arange(K, dtype=torch.float32) / args.draft_gamma)
    t0 = time.time()
    for step in range(args.draft_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.draft_steps, args.draft_lr, 50)
        starts = torch.randint(0, len(stream) - T - 1, (B,), generator=gen)
        x = torch.stack([stream[s:s + T + 1] for s in starts]).long()
        with torch.no_grad():
            logits, hidden = lm(x[:, :-1], taps=dcfg["target_layers"])
            taps = taps_of(hidden, dcfg["target_layers"])
        # anchors t: x_{t+1} known; draft x_{t+2..t+1+K}; target p_k = logits[t+k]
        t = torch.stack([torch.randperm(T - K - 1, generator=gen)[:A] for _ in range(B)])  # [B, A]
        bi = torch.arange(B)[:, None]
        ks = torch.arange(1, K + 1)
        f = dm.features(taps[bi, t], lm.model.embed_tokens(x[bi, t + 1]))  # [B, A, K, d]
        prev = x[bi[..., None], t[..., None] + ks]  # x_{t+k}: teacher forcing
        truth = x[bi[..., None], t[..., None] + ks + 1]  # x_{t+k+1}
        bk, m = dm.markov(prev)
        ql = dm.block_logits(f, lm.lm_head) + bk
        p = logits[bi[..., None], t[..., None] + ks].softmax(-1)
        logq = ql.log_softmax(-1)
        ce = F.cross_entropy(ql.reshape(-1, ql.shape[-1]), truth.reshape(-1), reduction="none").reshape(B, A, K)
        tv = 0.5 * (logq.exp() - p).abs().sum(-1)
        hit = (ql.argmax(-1) == p.argmax(-1)).float()
        conf = dm.conf(f, m)
        bce = F.binary_cross_entropy(conf, hit, reduction="none")
        loss = ((0.1 * ce + 0.9 * tv + 1.0 * bce) * w).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(dm.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.draft_steps - 1:
            log(f"draft step {step}/{args.draft_steps} loss {loss.item():.3f} tv {tv.mean().item():.3f} "
                f"greedy hit by position {[round(v, 2) for v in hit.mean((0, 1)).tolist()]} {(time.time()-t0)/60:.1f} min")
    return dm


@torch.no_grad()
def score_file(lm, tok, text):
    """bits (base 2) of the file's tokens, scored in windows of EVAL_WINDOW
    tokens that each start from a fresh state with [BOS]."""
    ids = tok.encode(text)
    bos = tok.special["[BOS]"]
    bits = 0.0
    for a in range(0, len(ids), EVAL_WINDOW):
        w = ids[a:a + EVAL_WINDOW]
        x = torch.tensor([[bos] + w[:-1]])
        logits, _ = lm(x)
        lp = logits[0].float().log_softmax(-1)
        bits -= lp[torch.arange(len(w)), torch.tensor(w)].sum().item() / math.log(2)
    return bits, len(ids)


def evaluate(lm, tok, held, max_bytes):
    """Scores held-out files in order until max_bytes (k3 eval scores them all)."""
    lm.eval()
    bits = ntok = nbytes = 0
    for _, text in held:
        if nbytes >= max_bytes:
            break
        b, n = score_file(lm, tok, text)
        bits, ntok, nbytes = bits + b, ntok + n, nbytes + len(text.encode())
    return {"tokens": ntok, "bytes": nbytes, "bits_per_token": bits / ntok, "bits_per_byte": bits / nbytes}


@torch.no_grad()
def acceptance(lm, dm, held, tok, n_anchors, gen, max_len=512):
    """Mean tokens per verification step under greedy verification: the
    target's next token, then the drafted block accepted while it equals
    the target's greedy continuation (1 + accepted drafts)."""
    dcfg, K = DRAFT, DRAFT["block_size"]
    bos = tok.special["[BOS]"]
    seqs = [[bos] + tok.encode(t)[:max_len - 1] for _, t in held]
    seqs = [s for s in seqs if len(s) > 4 * K]
    accepted = []
    for i in range(n_anchors):
        s = seqs[int(torch.randint(len(seqs), (1,), generator=gen))]
        t = int(torch.randint(2, len(s) - 1 - K, (1,), generator=gen))
        prefix = torch.tensor([s[:t + 1]])
        logits, hidden = lm(prefix, taps=dcfg["target_layers"])
        nxt = int(logits[0, -1].argmax())
        f = dm.features(taps_of(hidden, dcfg["target_layers"])[0, -1], lm.model.embed_tokens(torch.tensor(nxt)))
        base = dm.block_logits(f, lm.lm_head)
        prev, drafts = nxt, []
        for k in range(K):
            bk, _ = dm.markov(torch.tensor(prev))
            prev = int((base[k] + bk).argmax())
            drafts.append(prev)
        ver, _ = lm(torch.tensor([s[:t + 1] + [nxt] + drafts]))
        greedy = ver[0, t + 1:t + 1 + K].argmax(-1).tolist()
        a = 0
        while a < K and drafts[a] == greedy[a]:
            a += 1
        accepted.append(a)
    return sum(accepted) / len(accepted)


def export(out, lm, dm, tok, info):
    cfg = dict(CONFIG)
    cfg["bos_token_id"] = tok.special["[BOS]"]
    cfg["eos_token_id"] = tok.special["[EOS]"]
    cfg["pad_token_id"] = tok.special["[PAD]"]
    cfg["dspark_config"] = dict(DRAFT, tensor_prefix="dspark.", hidden_source="mlp_input")
    outer = {"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3", "text_config": cfg,
             "tie_word_embeddings": False, "bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
             "pad_token_id": cfg["pad_token_id"], "torch_dtype": "bfloat16"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(outer, f, indent=2)
        f.write("\n")
    tensors = {"language_model." + k: v for k, v in model.hf_state_dict(lm).items()}
    tensors.update({"language_model." + k: v for k, v in dm.state_dict_hf().items()})
    dtypes = {k: ("F32" if k.endswith(F32_TENSORS) else "BF16") for k in tensors}
    st.write(os.path.join(out, "model.safetensors"), tensors, dtypes, info)
    tok.write(out)


@torch.no_grad()
def fixture(path, lm, tok, held, n_prompt, n_decode):
    """k3's cross-check: a held-out prompt, the logits of every position,
    then greedy decode steps (the logits after feeding each generated token,
    computed by full recomputation here)."""
    lm.eval()
    _, text = held[0]
    ids = [tok.special["[BOS]"]] + tok.encode(text)[:n_prompt - 1]
    x = torch.tensor([ids])
    logits, _ = lm(x)
    gen = []
    seq = list(ids)
    nxt = int(logits[0, -1].argmax())
    dec = []
    for _ in range(n_decode):
        gen.append(nxt)
        seq.append(nxt)
        l2, _ = lm(torch.tensor([seq]))
        dec.append(l2[0, -1])
        nxt = int(l2[0, -1].argmax())
    T = len(ids)
    # the prefix of the recomputation equals the prefill: causality
    assert (l2[0, :T] - logits[0]).abs().max() < 1e-4
    st.write(path, {"input_ids": torch.tensor(ids, dtype=torch.int32), "prefill_logits": logits[0],
                    "generated_ids": torch.tensor(gen, dtype=torch.int32),
                    "decode_positions": torch.arange(T, T + n_decode, dtype=torch.int32),
                    "decode_logits": torch.stack(dec)},
             metadata={"format": "the model.forward tensors of testdata/model/README.md; read by k3/trained_test.go", "description": f"held-out prefix of {held[0][0]} scored by tools/train (PyTorch {torch.__version__}, float32, bf16 weights)"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-out", required=True, help="checkpoint directory to write")
    ap.add_argument("-fixture", help="also write k3's cross-check fixture (safetensors) here")
    ap.add_argument("-seed", type=int, default=1)
    ap.add_argument("-steps", type=int, default=520)
    ap.add_argument("-batch", type=int, default=8)
    ap.add_argument("-seq", type=int, default=512)
    ap.add_argument("-seq-long", dest="seq_long", type=int, default=1024, help="sequence length of the last quarter of the steps")
    ap.add_argument("-lr", type=float, default=3e-3)
    ap.add_argument("-warmup", type=int, default=50)
    ap.add_argument("-dense-steps", dest="dense_steps", type=int, default=80, help="DSA steps with dense attention while the indexer learns")
    ap.add_argument("-bias-rate", dest="bias_rate", type=float, default=1e-3)
    ap.add_argument("-draft-steps", dest="draft_steps", type=int, default=150)
    ap.add_argument("-draft-lr", dest="draft_lr", type=float, default=2e-3)
    ap.add_argument("-draft-anchors", dest="draft_anchors", type=int, default=32)
    ap.add_argument("-draft-gamma", dest="draft_gamma", type=float, default=4.0)
    ap.add_argument("-bpe-bytes", dest="bpe_bytes", type=int, default=6_000_000)
    ap.add_argument("-train-bytes", dest="train_bytes", type=int, default=15_000_000)
    ap.add_argument("-accept-anchors", dest="accept_anchors", type=int, default=200)
    ap.add_argument("-eval-bytes", dest="eval_bytes", type=int, default=150_000, help="held-out bytes scored here (k3 eval scores the whole split)")
    ap.add_argument("-threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    tok, stream, held, info = prepare(args)
    for _, text in held:
        assert tok.decode_bytes(tok.encode(text)) == text.encode(), "tokenizer round trip"
    lm = train_model(args, stream, gen)
    bf16_model(lm)
    dm = train_draft(args, lm, stream, gen)
    dm = bf16_model(dm)
    info.update({"seed": args.seed, "steps": args.steps, "batch": args.batch, "seq": args.seq, "seq_long": args.seq_long,
                 "torch": torch.__version__, "train_minutes": round((time.time() - t0) / 60, 1)})
    log("training done in", info["train_minutes"], "min")
    export(args.out, lm, dm, tok, info)
    ev = evaluate(lm, tok, held, args.eval_bytes)
    log("held-out slice:", ev)
    acc = acceptance(lm, dm, held, tok, args.accept_anchors, gen)
    log(f"draft: mean accepted drafts {acc:.3f} of {DRAFT['block_size']} (tokens per verification step {1 + acc:.3f})")
    info.update({"heldout_slice_" + k: v for k, v in ev.items()})
    info["draft_mean_accepted"] = round(acc, 4)
    export(args.out, lm, dm, tok, info)
    with open(os.path.join(args.out, "train_info.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    if args.fixture:
        fixture(args.fixture, lm, tok, held, 160, 16)
    log("total", round((time.time() - t0) / 60, 1), "min")


if __name__ == "__main__":
    main()
