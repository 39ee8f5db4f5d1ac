"""Writes model cases for `k3 conform` on random configurations: each a
tiny random-weight checkpoint (`k3 new-tiny -set`) of a layout drawn from
the config switches testdata/model/README.md describes, with its expected
outputs computed by model.py in float64, in the golden files' format
(prefill of a prompt, then 8 greedy decode steps; the MoE picks and the
DSA kept positions, order included).

    /usr/bin/python3 cases.py -out DIR [-n 12] [-seed 1] [-k3 PATH]
    /usr/bin/python3 cases.py -out DIR -seeds S1,S2,...   (those draws again)
    /usr/bin/python3 cases.py -out DIR -wide ...          (wider layouts)
    /usr/bin/python3 cases.py -out DIR -quant mixed ...   (MXFP4 experts, fp8 matrices)

A draw whose outputs a float32 engine could not reproduce exactly is drawn
again: a greedy token, an expert pick or a kept position decided by less
than a margin float32's rounding could cross (the metadata records the
smallest margins kept). check_golden.py checks model.py against the
independent goldens first."""

import argparse
import atexit
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

import model
import st

STEPS = 8


def draw(r):
    """A random text config change (for `k3 new-tiny -set`) and the preset."""
    preset = r.choice(["k31pro", "k31pro", "k31pro", "kimi_linear"])
    d = r.choice([24, 36, 40, 48, 64, 72, 100])
    layers = r.randint(2, 8)
    kinds = [r.random() < 0.6 for _ in range(layers)]  # True: KDA
    kda = [l + 1 for l in range(layers) if kinds[l]]
    full = [l + 1 for l in range(layers) if not kinds[l]]
    rope = r.choice([4, 8])
    c = {
        "vocab_size": r.choice([300, 384, 512]),
        "hidden_size": d,
        "intermediate_size": r.choice([32, 48, 96]),
        "num_hidden_layers": layers,
        "rms_norm_eps": r.choice([1e-5, 1e-6]),
        "tie_word_embeddings": r.random() < 0.3,
        "num_attention_heads": r.randint(1, 4),
        "q_lora_rank": r.choice([None, 16, 24]),
        "kv_lora_rank": r.choice([12, 16, 24, 32]),
        "qk_nope_head_dim": r.choice([8, 16]),
        "qk_rope_head_dim": rope,
        "v_head_dim": r.choice([8, 16, 24]),
        "mla_use_nope": r.random() < 0.6,
        "mla_use_output_gate": r.random() < 0.6,
        "rope_theta": 10000.0,
        "linear_attn_config": {
            "kda_layers": kda,
            "full_attn_layers": full,
            "num_heads": r.randint(1, 4),
            "head_dim": r.choice([8, 12, 16, 20, 24, 32, 48]),
            "short_conv_kernel_size": r.choice([2, 3, 4]),
            "use_full_rank_gate": r.random() < 0.5,
            "gate_lower_bound": r.choice([None, -5.0, -3.0]),
        },
    }
    if not c["mla_use_nope"] and r.random() < 0.5:
        # YaRN as DeepSeek configures it (mscale equal to mscale_all_dim),
        # over an original context the prompts cross.
        orig, factor, m = r.choice([16, 32, 64, 256]), r.choice([2.0, 4.0, 8.0, 40.0]), r.choice([1.0, 0.707])
        c["max_position_embeddings"] = max(int(orig * factor), 4096)  # as the presets: past any prompt here
        c["rope_scaling"] = {"type": "yarn", "factor": factor, "original_max_position_embeddings": orig,
                             "beta_fast": r.choice([32, 8]), "beta_slow": r.choice([1, 2]), "mscale": m, "mscale_all_dim": m}
    if r.random() < 0.5:
        c["hidden_act"], c["activation_situ_beta"] = "situ", 4.0
        c["activation_situ_linear_beta"] = r.choice([None, 25.0])
    else:
        c["hidden_act"] = "silu"
    if r.random() < 0.7:
        c["index_topk"] = r.randint(3, 24)
        c["index_n_heads"] = r.randint(1, 4)
        c["index_head_dim"] = r.choice([8, 12, 16, 32])
    else:
        c["index_topk"] = None
    if r.random() < 0.85:
        e = r.choice([4, 6, 8, 16])
        groups = r.choice([g for g in (1, 2) if e % g == 0 and e // g >= 2])
        c.update({
            "num_experts": e,
            "num_experts_per_token": r.randint(1, min(4, e)),
            "num_shared_experts": r.choice([0, 1, 2]),
            "moe_intermediate_size": r.choice([8, 12, 16, 24, 40]),
            "routed_expert_hidden_size": r.choice([None, d // 2, d, 20]),
            "latent_moe_use_norm": r.random() < 0.7,
            "moe_renormalize": r.random() < 0.7,
            "routed_scaling_factor": round(r.uniform(0.5, 3.0), 3),
            "num_expert_group": groups,
            "topk_group": r.randint(1, groups),
            "first_k_dense_replace": r.randint(0, 2),
            "moe_layer_freq": r.choice([1, 1, 2]),
        })
        if c["num_experts_per_token"] > c["topk_group"] * (e // groups):
            c["num_experts_per_token"] = c["topk_group"] * (e // groups)
    else:
        c["num_experts"] = None
    c["attn_res_block_size"] = r.choice([None, 1, 2, 3, 4, 5])
    if preset == "kimi_linear":
        # The flat Kimi Linear config: its softplus gate, no AttnRes.
        c["linear_attn_config"]["gate_lower_bound"] = None
        c["attn_res_block_size"] = None
    return preset, c


def widen(r, c):
    """Widths at which k3's products take their k-major panels (384 rows
    or more), the packed GEMM for long prompts and the 512-bit state
    kernels (head dims multiples of 32): the narrow draw's switches, wider
    sizes, at most four layers."""
    d = r.choice([384, 512])
    c["hidden_size"], c["intermediate_size"] = d, r.choice([384, 768, 1024])
    if c["num_hidden_layers"] > 4:
        n = c["num_hidden_layers"] = 4
        la = c["linear_attn_config"]
        la["kda_layers"] = [l for l in la["kda_layers"] if l <= n]
        la["full_attn_layers"] = [l for l in la["full_attn_layers"] if l <= n]
    c["linear_attn_config"]["head_dim"] = r.choice([64, 128])
    c["num_attention_heads"] = r.choice([2, 4])
    c["q_lora_rank"] = r.choice([None, 384])
    c["kv_lora_rank"] = r.choice([128, 256, 512])
    c["qk_nope_head_dim"], c["v_head_dim"] = r.choice([64, 128]), r.choice([64, 128])
    c["qk_rope_head_dim"] = r.choice([32, 64])
    if c.get("index_topk") is not None:
        c["index_n_heads"], c["index_head_dim"] = r.choice([4, 16]), r.choice([64, 128])
        c["index_topk"] = r.choice([16, 48, 96])
    if c.get("num_experts"):
        c["moe_intermediate_size"] = r.choice([128, 384, 512])
        if c.get("routed_expert_hidden_size") is not None:
            c["routed_expert_hidden_size"] = r.choice([d // 2, d, 400])
    c["vocab_size"] = 512
    return c


def margins(lm, cfg):
    """The smallest decision margins of the last forward: MoE picks (and
    groups), and DSA kept lists (order included). Exact ties in the DSA
    lists are allowed where both scores are zero with every head's dot
    robustly negative (ReLU zeroes them in any precision); the tie rule
    then decides."""
    moe, dsa = float("inf"), float("inf")
    for layer in lm.model.layers:
        if layer.moe:
            sel = layer.block_sparse_moe.last_sel
            k = cfg["num_experts_per_token"]
            groups = cfg.get("num_expert_group") or 1
            if groups > 1:
                raw = layer.block_sparse_moe.last_sel_groups
                g = raw.reshape(raw.shape[0], groups, -1)
                gs = g.topk(2, dim=-1).values.sum(-1).sort(-1, descending=True).values
                kg = cfg["topk_group"]
                if kg < groups:  # which groups stay, not their order, matters
                    moe = min(moe, (gs[:, kg - 1] - gs[:, kg]).min().item())
            s = sel.sort(-1, descending=True).values
            s = s[:, : min(k + 1, s.shape[1])]
            finite = torch.isfinite(s[:, 1:])
            gaps = (s[:, :-1] - s[:, 1:])[finite]
            if gaps.numel():
                moe = min(moe, gaps.min().item())
        at = layer.self_attn
        if isinstance(at, model.DSA) and at.indexer is not None:
            score, dots = at.last_scores[0], at.indexer.last_dots[0]  # [T, S], [h, T, S]
            K = cfg["index_topk"]
            for t in range(score.shape[0]):
                sc = score[t, : t + 1]
                order = torch.sort(sc, descending=True, stable=True).indices
                n = min(K + 1, t + 1)
                scale = sc.abs().max().item() or 1.0
                for a, b in zip(order[: n - 1].tolist(), order[1:n].tolist()):
                    if sc[a] == sc[b]:
                        if sc[a] != 0 or dots[:, t, [a, b]].max().item() > -1e-6 * scale:
                            dsa = min(dsa, 0.0)
                    else:
                        dsa = min(dsa, (sc[a] - sc[b]).item() / scale)
    return moe, dsa


def topk_lists(lm, cfg, rows):
    """The DSA layers' kept positions of rows, K wide, -1 past the visible."""
    K, out = cfg["index_topk"], []
    for layer in lm.model.layers:
        at = layer.self_attn
        if isinstance(at, model.DSA) and at.indexer is not None:
            score = at.last_scores[0]
            lists = []
            for t in rows:
                order = torch.sort(score[t, : t + 1], descending=True, stable=True).indices[:K].tolist()
                lists.append(order + [-1] * (K - len(order)))
            out.append(lists)
    return out  # [layers][rows][K]


def moe_picks(lm, cfg):
    """Each MoE layer's picks (descending, ties to the lower expert) and
    their weights: the unbiased scores, renormalized, scaled."""
    idx, wts = [], []
    for layer in lm.model.layers:
        if layer.moe:
            m = layer.block_sparse_moe
            i = torch.sort(m.last_sel, dim=-1, descending=True, stable=True).indices[:, : cfg["num_experts_per_token"]]
            w = (m.last_sel - m.gate.e_score_correction_bias).gather(-1, i)
            if cfg["moe_renormalize"]:
                w = w / w.sum(-1, keepdim=True)
            idx.append(i)
            wts.append(w * cfg["routed_scaling_factor"])
    return idx, wts


def reference(case, cfg, ids):
    """model.py in float64 on the checkpoint in case: prefill logits, the
    greedy continuation and its logits, the picks and the margins."""
    torch.set_default_dtype(torch.float64)
    lm = model.load_checkpoint(case, cfg)
    T = len(ids)
    with torch.no_grad():
        logits, _ = lm(torch.tensor(ids)[None])
        prefill = logits[0]
        moe_m, dsa_m = margins(lm, cfg)
        picks, weights = moe_picks(lm, cfg)
        lists = topk_lists(lm, cfg, range(T)) if cfg.get("index_topk") is not None else None
        gen = [int(prefill[-1].argmax())]
        seq = list(ids)
        decode, dlists, arg = [], [], [top2(prefill[-1])]
        for i in range(STEPS):
            seq.append(gen[i])
            out, _ = lm(torch.tensor(seq)[None])
            row = out[0, -1]
            decode.append(row)
            m1, m2 = margins(lm, cfg)
            moe_m, dsa_m = min(moe_m, m1), min(dsa_m, m2)
            if lists is not None:
                dlists.append([l[0] for l in topk_lists(lm, cfg, [len(seq) - 1])])
            arg.append(top2(row))
            if i + 1 < STEPS:
                gen.append(int(row.argmax()))
    return prefill, gen, torch.stack(decode), picks, weights, lists, dlists, min(arg), moe_m, dsa_m


def to_f16(path):
    """Rewrites a float32 checkpoint's matrices as F16 (vectors stay F32)."""
    t, meta = st.read(path)
    st.write(path, t, {n: "F16" for n, v in t.items() if v.dim() >= 2 and v.is_floating_point()}, meta)


def e4m3_codes(a):
    """The nearest fp8 e4m3fn codes to the float32 array a (clipped to
    +-448)."""
    table = st.E4M3[:127]  # codes 0-126: the non-negative finite values, ascending
    m = np.minimum(np.abs(a), 448.0)
    hi = np.clip(np.searchsorted(table, m), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    c = np.where(np.abs(table[lo] - m) <= np.abs(table[hi] - m), lo, hi)
    return (c | np.where(np.signbit(a), 0x80, 0)).astype(np.uint8)


def fp8_form(name, w, form, r):
    """w (float32 [R, C]) as fp8 tensors: the codes and a scale tensor of
    the form ("inv": DeepSeek's 128x128 weight_scale_inv; "row", "tensor",
    "block": compressed-tensors' weight_scale), F32 or BF16."""
    R, C = w.shape
    br, bc = {"inv": (128, 128), "block": (128, 128), "row": (1, C), "tensor": (R, C)}[form]
    nr, nc = (R + br - 1) // br, (C + bc - 1) // bc
    a = w.numpy()
    scale = np.zeros((nr, nc), dtype=np.float32)
    for i in range(nr):
        for j in range(nc):
            scale[i, j] = np.abs(a[i * br:(i + 1) * br, j * bc:(j + 1) * bc]).max() / np.float32(448)
    scale[scale == 0] = 1
    dt = "F32" if form == "inv" else r.choice(["F32", "BF16"])
    st_scale = torch.from_numpy(scale)
    if dt == "BF16":
        st_scale = st.bf16_round(st_scale)
    full = st_scale.numpy().repeat(br, 0)[:R].repeat(bc, 1)[:, :C]
    codes = torch.from_numpy(e4m3_codes(a / full))
    shape = {"inv": [nr, nc], "block": [nr, nc], "row": r.choice([[R, 1], [R]]), "tensor": r.choice([[1], [1, 1], []])}[form]
    sname = name + ("_scale_inv" if form == "inv" else "_scale")
    return {name: codes, sname: st_scale.reshape(shape)}, {name: "F8_E4M3", sname: dt}


def mxfp4_form(name, w, shape_dtype):
    """w (float32 [R, C], C even) as compressed-tensors MXFP4 tensors."""
    R, C = w.shape
    G = (C + 31) // 32
    a = w.double().numpy()
    mags = np.array(model.E2M1)
    codes = np.zeros((R, C), dtype=np.uint8)
    scale = np.zeros((R, G), dtype=np.uint8)
    for g in range(G):
        blk = a[:, g * 32:(g + 1) * 32]
        amax = np.abs(blk).max(1)
        e = np.where(amax > 0, np.ceil(np.log2(np.where(amax > 0, amax, 1) / 6)), -20).astype(np.int64)
        e = np.clip(e, -127, 127)
        scale[:, g] = e + 127
        x = np.abs(blk) / np.ldexp(1.0, e)[:, None]
        idx = np.abs(x[..., None] - mags).argmin(-1)
        codes[:, g * 32:(g + 1) * 32] = idx | np.where(np.signbit(blk), 8, 0)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    base = name[: -len(".weight")]
    t = {base + ".weight_packed": torch.from_numpy(packed), base + ".weight_scale": torch.from_numpy(scale)}
    d = {base + ".weight_packed": "U8", base + ".weight_scale": "U8"}
    if shape_dtype:
        t[base + ".weight_shape"] = torch.tensor([R, C], dtype=torch.int64)
        d[base + ".weight_shape"] = shape_dtype
    return t, d


def quantize(path, quant, r):
    """Rewrites the checkpoint's matrices in quantised forms: "mxfp4" the
    routed experts, "fp8" the other matrices (not the embedding, lm_head or
    the routers), each in a scale form drawn from r, "mixed" both. Returns
    a description for the metadata."""
    stored = st.dtypes(path)
    t, meta = st.read(path)
    out, dtypes, forms = {}, {}, set()
    for n, v in t.items():
        matrix = v.dim() == 2 and n.endswith(".weight")
        if matrix and ".experts." in n and quant in ("mxfp4", "mixed") and v.shape[1] % 2 == 0:
            shape_dtype = r.choice(["", "I64", "I32"])
            q, d = mxfp4_form(n, v, shape_dtype)
            forms.add("MXFP4 experts" + (f" (weight_shape {shape_dtype})" if shape_dtype else ""))
        elif (matrix and ".experts." not in n and quant in ("fp8", "mixed") and "embed_tokens" not in n
              and "lm_head" not in n and not n.endswith("block_sparse_moe.gate.weight")):
            form = r.choice(["inv", "row", "tensor", "block"])
            q, d = fp8_form(n, v, form, r)
            forms.add(f"fp8 ({form} scales)")
        else:
            out[n], dtypes[n] = v, stored[n]
            continue
        out.update(q)
        dtypes.update(d)
    st.write(path, out, dtypes, meta)
    return ", ".join(sorted(forms))


def top2(row):
    v = row.topk(2).values
    return (v[0] - v[1]).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-out", required=True)
    ap.add_argument("-n", type=int, default=12)
    ap.add_argument("-seed", type=int, default=1)
    ap.add_argument("-first", type=int, default=0, help="the number of the first case directory (caseNN)")
    ap.add_argument("-wide", action="store_true", help="wide layouts (widen): k-major panels, the packed GEMM")
    ap.add_argument("-seeds", default="", help="comma-separated draw seeds to write (as printed), instead of -n new draws")
    ap.add_argument("-k3", default="", help="the k3 binary (default: go build it)")
    ap.add_argument("-quant", default="none", choices=["none", "mxfp4", "fp8", "mixed", "any"],
                    help="quantised weights: MXFP4 experts, fp8 matrices, both, or one of the four drawn per case")
    a = ap.parse_args()
    k3 = a.k3
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    if not k3:
        tmp = tempfile.mkdtemp()
        atexit.register(shutil.rmtree, tmp)
        k3 = os.path.join(tmp, "k3")
        subprocess.run(["go", "build", "-o", k3, "./cmd/k3"], cwd=repo, check=True)
    seeds = [int(x) for x in a.seeds.split(",")] if a.seeds else None
    n = len(seeds) if seeds else a.n
    made, draws = 0, 0
    while made < n:
        draws += 1
        seed = seeds[made] if seeds else a.seed * 1000003 + draws
        r = random.Random(seed)
        preset, change = draw(r)
        if a.wide:
            change = widen(random.Random(seed * 31 + 7), change)
        case = os.path.join(a.out, f"case{a.first + made:02d}")
        bf16 = r.random() < 0.5
        cmd = [k3, "new-tiny", "-preset", preset, "-seed", str(seed), "-set", json.dumps(change), "-out", case]
        if bf16:
            cmd.append("-bf16")
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            if seeds:
                sys.exit(f"draw {seed}: new-tiny refused it: {res.stderr.strip()}")
            print(f"draw {seed}: new-tiny refused it: {res.stderr.strip()}", file=sys.stderr)
            continue
        full = json.load(open(f"{case}/config.json"))
        cfg = full.get("text_config", full)
        cfg.setdefault("activation_situ_linear_beta", None)
        T = r.choice([r.randint(12, 40), r.randint(60, 150)])  # past one and two 64-token chunks too
        ids = [r.randrange(3, cfg["vocab_size"]) for _ in range(T)]
        stored = "BF16" if bf16 else "F32"
        if not bf16 and r.random() < 0.5:
            stored = "F16"
            to_f16(f"{case}/model.safetensors")
        if a.quant != "none":
            qr = random.Random(seed * 17 + 3)  # a stream of its own: the draws above stay as they were
            quant = qr.choice(["none", "mxfp4", "fp8", "mixed"]) if a.quant == "any" else a.quant
            if quant != "none":
                stored += "; " + quantize(f"{case}/model.safetensors", quant, qr)
        prefill, gen, decode, picks, weights, lists, dlists, arg, moe_m, dsa_m = reference(case, cfg, ids)
        scale = prefill.abs().max().item()
        if arg < 1e-3 * scale or moe_m < 1e-5 or dsa_m < 1e-5:
            msg = f"draw {seed}: margins too small (argmax {arg:.2e}, MoE {moe_m:.2e}, DSA {dsa_m:.2e})"
            if seeds:
                sys.exit(msg)
            print(msg + "; drawn again", file=sys.stderr)
            continue
        t = {
            "input_ids": torch.tensor(ids, dtype=torch.int32),
            "prefill_logits": prefill.float(),
            "generated_ids": torch.tensor(gen, dtype=torch.int32),
            "decode_positions": torch.arange(T, T + STEPS, dtype=torch.int32),
            "decode_logits": decode.float(),
        }
        if picks:
            t["moe_topk_idx"] = torch.stack(picks).to(torch.int32)
            t["moe_topk_weight"] = torch.stack(weights).float()
        if lists is not None and lists:
            t["dsa_topk_indices"] = torch.tensor(lists, dtype=torch.int32)
            t["decode_dsa_topk_indices"] = torch.tensor(dlists, dtype=torch.int32)
        meta = {
            "op": "model.forward",
            "description": f"{os.path.basename(case)}: a random {'wide ' if a.wide else ''}{preset} layout (k3 new-tiny -set, seed {seed}); prefill of {T} tokens then {STEPS} greedy decode steps",
            "generator": "tools/train/cases.py: model.py in float64, itself checked against testdata/model's goldens by check_golden.py",
            "preset": preset,
            "seed": str(seed),
            "set": json.dumps(change),
            "weights": stored,
            "min_argmax_margin": f"{arg:.3e}",
            "min_router_margin": f"{moe_m:.3e}" if moe_m != float("inf") else "no MoE",
            "min_indexer_rel_gap": f"{dsa_m:.3e}" if dsa_m != float("inf") else "no DSA",
        }
        st.write(f"{case}/expected.safetensors", t, metadata=meta)
        print(f"{case}: {preset}, {cfg['num_hidden_layers']} layers, seed {seed}, margins: argmax {arg:.2e}, MoE {moe_m:.2e}, DSA {dsa_m:.2e}")
        made += 1


if __name__ == "__main__":
    main()
