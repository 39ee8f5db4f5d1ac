"""A K3.1 Pro-shaped language model in PyTorch, written from the published
equations (the layer descriptions in testdata/model/README.md and
testdata/kda/README.md of the k3 repository): KDA and DSA token mixers,
Block AttnRes over depth, and sigmoid-routed latent MoE with a shared
expert. Tensor names are the Hugging Face ones, so the state dict is the
checkpoint.

It also reads the switches of the other layouts testdata/model/README.md
describes, for checking k3 on any of them (check_golden.py, cases.py):
dense MLA (no index_topk), no query LoRA, RoPE (mla_use_nope false), no
MLA output gate, KDA's low-rank output gate, plain MoE (no
routed_expert_hidden_size), no latent norm, no shared experts, grouped
routing, no AttnRes, tied embeddings, YaRN rope scaling; absent fields
mean what they mean to k3's config parser. Training uses the K3.1 Pro
layout only.

KDA runs in chunks of 16 tokens (the WY form: a unit lower-triangular solve
per chunk) so that training is not a Python loop over every token.
"""


import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import st


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


def linear(i, o):
    return nn.Linear(i, o, bias=False)


def act(cfg, g, u):
    if cfg["hidden_act"] == "silu":
        return F.silu(g) * u
    b, lb = cfg["activation_situ_beta"], cfg["activation_situ_linear_beta"]
    a = b * torch.tanh(g / b) * torch.sigmoid(g)
    if lb is not None:
        u = lb * torch.tanh(u / lb)
    return a * u


class MLP(nn.Module):
    def __init__(self, cfg, d, width):
        super().__init__()
        self.cfg = cfg
        self.gate_proj, self.up_proj, self.down_proj = linear(d, width), linear(d, width), linear(width, d)

    def forward(self, x):
        return self.down_proj(act(self.cfg, self.gate_proj(x), self.up_proj(x)))


class Expert(nn.Module):
    def __init__(self, cfg, d, width):
        super().__init__()
        self.cfg = cfg
        self.w1, self.w3, self.w2 = linear(d, width), linear(d, width), linear(width, d)

    def forward(self, x):
        return self.w2(act(self.cfg, self.w1(x), self.w3(x)))


class Gate(nn.Module):
    def __init__(self, d, e):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(e, d))
        self.register_buffer("e_score_correction_bias", torch.zeros(e))


class LatentMoE(nn.Module):
    """Router on x; experts at the latent width on z = x W_down; the routed
    sum is RMS-normed and lifted back; the shared expert works on x. Without
    routed_expert_hidden_size the experts work on x at the hidden width
    (plain MoE)."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        lat = cfg.get("routed_expert_hidden_size")
        self.cfg, self.latent = cfg, lat is not None
        self.gate = Gate(d, cfg["num_experts"])
        self.experts = nn.ModuleList(Expert(cfg, lat or d, cfg["moe_intermediate_size"]) for _ in range(cfg["num_experts"]))
        self.norm = self.latent and cfg.get("latent_moe_use_norm", False)
        if self.latent:
            self.routed_expert_down_proj = linear(d, lat)
            if self.norm:
                self.routed_expert_norm = RMSNorm(lat)
            self.routed_expert_up_proj = linear(lat, d)
        self.shared_experts = None
        if cfg.get("num_shared_experts", 0) > 0:
            self.shared_experts = MLP(cfg, d, cfg["moe_intermediate_size"] * cfg["num_shared_experts"])
        self.load = None  # tokens per expert in the last forward (training only)

    def forward(self, x):
        cfg = self.cfg
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = torch.sigmoid(F.linear(x, self.gate.weight))
        sel = scores + self.gate.e_score_correction_bias
        k = cfg["num_experts_per_token"]
        groups = cfg.get("num_expert_group") or 1
        self.last_sel_groups = sel.detach()  # before the group mask, for cases.py
        if groups > 1:
            # A group scores the sum of its two best; the topk_group best
            # groups (ties to the lower group) keep their experts.
            g = sel.reshape(sel.shape[0], groups, -1)
            gs = g.topk(2, dim=-1).values.sum(-1)
            keep = torch.sort(gs, dim=-1, descending=True, stable=True).indices[:, :cfg["topk_group"]]
            mask = torch.zeros_like(gs, dtype=torch.bool).scatter(-1, keep, True)
            sel = g.masked_fill(~mask[..., None], float("-inf")).reshape(sel.shape)
        if self.training:
            idx = sel.topk(k, dim=-1).indices
        else:
            # descending, ties to the lower expert id
            idx = torch.sort(sel, dim=-1, descending=True, stable=True).indices[:, :k]
        w = scores.gather(-1, idx)
        self.last_sel = sel.detach()  # for cases.py's decision margins
        if cfg["moe_renormalize"]:
            w = w / w.sum(-1, keepdim=True)
        w = w * cfg["routed_scaling_factor"]
        z = self.routed_expert_down_proj(x) if self.latent else x
        # Every expert runs on every row and the unpicked ones weigh zero: at
        # these widths one batched product beats gathering rows per expert.
        dense = torch.zeros_like(scores).scatter(-1, idx, w)  # [N, E]
        w1 = torch.stack([e.w1.weight for e in self.experts])  # [E, I, Dlat]
        w3 = torch.stack([e.w3.weight for e in self.experts])
        w2 = torch.stack([e.w2.weight for e in self.experts])  # [E, Dlat, I]
        hcat = act(cfg, torch.einsum("nd,eid->eni", z, w1), torch.einsum("nd,eid->eni", z, w3))
        hcat = hcat * dense.t()[:, :, None]
        routed = torch.einsum("eni,edi->nd", hcat, w2)
        self.load = torch.bincount(idx.flatten(), minlength=cfg["num_experts"]).float()
        if self.norm:
            routed = rms_norm(routed, self.routed_expert_norm.weight, cfg["rms_norm_eps"])
        out = self.routed_expert_up_proj(routed) if self.latent else routed
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out.reshape(shape)


def kda_chunked(q, k, v, g, beta, chunk):
    """Gated delta rule from a zero state, o_t = S_t^T q_t with
    S_t = Diag(exp g_t) S_{t-1} + k_t u_t^T and
    u_t = beta_t (v_t - (Diag(exp g_t) S_{t-1})^T k_t).
    q, k, g: [B,H,T,K]; v: [B,H,T,V]; beta: [B,H,T]. q carries the scale.

    Within a chunk, with G_t the cumulative log decay from the chunk start
    and S0 the state before it, the u_t solve the unit lower-triangular
    system u_t + sum_{j<t} beta_t (k_t e^{G_t - G_m} . k_j e^{G_m - G_j}) u_j =
    beta_t (v_t - S0^T (k_t e^{G_t})), G_m the chunk's middle row. Every gate
    is above the lower bound b, so |G_t - G_m| < chunk |b| / 2: with chunk 16
    and b = -5 the factors stay far inside float32's range."""
    B, H, T, K = k.shape
    V = v.shape[-1]
    pad = (-T) % chunk
    if pad:
        q, k, v, g = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    N = (T + pad) // chunk
    q, k, v, g = (t.reshape(B, H, N, chunk, -1) for t in (q, k, v, g))
    beta = beta.reshape(B, H, N, chunk, 1)
    G = g.cumsum(3)
    Gm = G[:, :, :, chunk // 2 : chunk // 2 + 1, :]
    eG = G.exp()
    kng = (k * (Gm - G).exp()).transpose(-1, -2)
    kg, qg = k * eG, q * eG
    A = torch.tril(beta * ((k * (G - Gm).exp()) @ kng), -1)
    QK = torch.tril((q * (G - Gm).exp()) @ kng)
    L = torch.eye(chunk) + A
    # T^-1 applied once for every chunk: U = U0 - W S0.
    U0 = torch.linalg.solve_triangular(L, beta * v, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(L, beta * kg, upper=False, unitriangular=True)
    kend = (k * (G[:, :, :, -1:, :] - G).exp()).transpose(-1, -2)  # k_j e^{G_C - G_j}
    decay = eG[:, :, :, -1, :, None]
    S = q.new_zeros(B, H, K, V)
    outs = []
    # unbind, not indexing: the gradient of x[:, :, n] is a zero tensor of
    # x's full size per chunk.
    for u0, w, qgn, qk, dec, ke in zip(*(t.unbind(2) for t in (U0, W, qg, QK, decay, kend))):
        U = u0 - w @ S
        outs.append(qgn @ S + qk @ U)
        S = dec * S + ke @ U
    o = torch.stack(outs, 2).reshape(B, H, N * chunk, V)
    return o[:, :, :T]


class KDA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        la = cfg["linear_attn_config"]
        d, H, D, W = cfg["hidden_size"], la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
        self.cfg, self.H, self.D, self.W = cfg, H, D, W
        self.q_proj, self.k_proj, self.v_proj = linear(d, H * D), linear(d, H * D), linear(d, H * D)
        self.q_conv1d = nn.Conv1d(H * D, H * D, W, groups=H * D, bias=False)
        self.k_conv1d = nn.Conv1d(H * D, H * D, W, groups=H * D, bias=False)
        self.v_conv1d = nn.Conv1d(H * D, H * D, W, groups=H * D, bias=False)
        self.f_a_proj, self.f_b_proj = linear(d, D), linear(D, H * D)
        self.b_proj = linear(d, H)
        self.full_gate = la.get("use_full_rank_gate", False)
        if self.full_gate:
            self.g_proj = linear(d, H * D)
        else:
            self.g_a_proj, self.g_b_proj = linear(d, D), linear(D, H * D)
        self.o_norm = RMSNorm(D)
        self.o_proj = linear(H * D, d)
        self.A_log = nn.Parameter(torch.zeros(H))
        self.dt_bias = nn.Parameter(torch.zeros(H * D))
        self.chunk = 16

    def conv(self, conv, x):  # causal depthwise conv over time, then SiLU
        y = conv(F.pad(x.transpose(1, 2), (self.W - 1, 0)))
        return F.silu(y.transpose(1, 2))

    def heads(self, t):
        B, T, _ = t.shape
        return t.reshape(B, T, self.H, -1).transpose(1, 2)

    def forward(self, x):
        B, T, _ = x.shape
        la = self.cfg["linear_attn_config"]
        q = self.heads(self.conv(self.q_conv1d, self.q_proj(x)))
        k = self.heads(self.conv(self.k_conv1d, self.k_proj(x)))
        v = self.heads(self.conv(self.v_conv1d, self.v_proj(x)))
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + 1e-6) * self.D ** -0.5
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + 1e-6)
        graw = self.heads(self.f_b_proj(self.f_a_proj(x)) + self.dt_bias)
        a = self.A_log.exp()[None, :, None, None]
        if la.get("gate_lower_bound") is not None:
            g = la["gate_lower_bound"] * torch.sigmoid(a * graw)
        else:
            g = -a * F.softplus(graw)
        beta = torch.sigmoid(self.b_proj(x)).transpose(1, 2)
        o = kda_chunked(q, k, v, g, beta, self.chunk)  # [B,H,T,D]
        o = rms_norm(o, self.o_norm.weight, self.cfg["rms_norm_eps"])
        gate = self.g_proj(x) if self.full_gate else self.g_b_proj(self.g_a_proj(x))
        o = o * torch.sigmoid(self.heads(gate))
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


def yarn_mscale(factor, m):
    return 0.1 * m * math.log(factor) + 1 if factor > 1 else 1.0


def yarn(cfg):
    """rope_scaling of type yarn, in force when max_position_embeddings
    exceeds the original length (DeepSeek's rule), else None."""
    rs = cfg.get("rope_scaling")
    if not rs or rs.get("factor", 1) <= 1 or cfg["max_position_embeddings"] <= rs["original_max_position_embeddings"]:
        return None
    return rs


def rope_freqs(cfg, dr, dtype):
    """theta^(-2i/dr) for the dr/2 pairs; with YaRN, the pairs whose
    wavelength crosses the original context move toward f/factor over a
    linear ramp between beta_fast and beta_slow rotations."""
    theta = cfg["rope_theta"]
    f = theta ** (-torch.arange(0, dr, 2, dtype=dtype) / dr)
    rs = yarn(cfg)
    if rs is None:
        return f
    orig, factor = rs["original_max_position_embeddings"], rs["factor"]

    def corr(rot):
        return dr * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(corr(rs.get("beta_fast", 32))), 0)
    high = min(math.ceil(corr(rs.get("beta_slow", 1))), dr - 1)
    if low == high:
        high += 0.001
    smooth = 1 - ((torch.arange(dr // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)
    return f / factor * (1 - smooth) + f * smooth


def rope_scales(cfg):
    """YaRN's multipliers of cos/sin and of the softmax scale (Hugging
    Face's DeepSeek code: mscale over mscale_all_dim, and mscale_all_dim
    squared)."""
    rs = yarn(cfg)
    if rs is None:
        return 1.0, 1.0
    f, all_dim = rs["factor"], yarn_mscale(rs["factor"], rs.get("mscale_all_dim", 0))
    return yarn_mscale(f, rs.get("mscale", 1)) / all_dim, all_dim * all_dim


def rope_interleaved(x, cfg):
    """Rotates pairs (2i, 2i+1) of x [..., T, n, dr] by position * freq_i."""
    T, dr = x.shape[-3], x.shape[-1]
    ang = torch.arange(T, dtype=x.dtype)[:, None] * rope_freqs(cfg, dr, x.dtype)
    m = rope_scales(cfg)[0]
    c, s = m * ang.cos()[:, None, :], m * ang.sin()[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)


def rope_halves(x, cfg, dr):
    """Rotates pairs (i, i + dr/2) of the first dr dims of x [..., T, n, D]
    by position * freq_i; the other dims pass."""
    T, h = x.shape[-3], dr // 2
    ang = torch.arange(T, dtype=x.dtype)[:, None] * rope_freqs(cfg, dr, x.dtype)
    m = rope_scales(cfg)[0]
    c, s = m * ang.cos()[:, None, :], m * ang.sin()[:, None, :]
    a, b = x[..., :h], x[..., h:dr]
    return torch.cat((a * c - b * s, a * s + b * c, x[..., dr:]), -1)


class Indexer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, HI, DI = cfg["hidden_size"], cfg["index_n_heads"], cfg["index_head_dim"]
        self.cfg, self.HI, self.DI = cfg, HI, DI
        self.wq_b = linear(cfg.get("q_lora_rank") or d, HI * DI)
        self.wk = linear(d, DI)
        self.k_norm = nn.LayerNorm(DI, eps=1e-6)
        self.weights_proj = linear(d, HI)

    def scores(self, x, cq):
        """score[b,t,s] = sum_j w[t,j] relu(q_I[t,j] . k_I[s])"""
        B, T, _ = x.shape
        qI = self.wq_b(cq).reshape(B, T, self.HI, self.DI)
        kI = self.k_norm(self.wk(x))
        if not self.cfg.get("mla_use_nope", True):
            dr = self.cfg["qk_rope_head_dim"]
            qI = rope_halves(qI, self.cfg, dr)
            kI = rope_halves(kI[:, :, None], self.cfg, dr)[:, :, 0]
        w = self.weights_proj(x) * (self.HI ** -0.5 * self.DI ** -0.5)
        dots = torch.einsum("bthd,bsd->bhts", qI, kI)
        self.last_dots = dots.detach()  # for cases.py's decision margins
        return torch.einsum("bth,bhts->bts", w, dots.relu())


class DSA(nn.Module):
    """MLA (NoPE: the rope half of query and key is used unrotated) where
    each query attends only to the index_topk positions the indexer scores
    highest. dense=True attends to every visible position (the warm-up)."""

    def __init__(self, cfg):
        super().__init__()
        d, H = cfg["hidden_size"], cfg["num_attention_heads"]
        dn, dr, dv, Dc, ql = (cfg[k] for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank", "q_lora_rank"))
        self.cfg, self.H, self.dn, self.dr, self.dv, self.Dc = cfg, H, dn, dr, dv, Dc
        if ql:
            self.q_a_proj = linear(d, ql)
            self.q_a_layernorm = RMSNorm(ql)
            self.q_b_proj = linear(ql, H * (dn + dr))
        else:
            self.q_proj = linear(d, H * (dn + dr))
        self.kv_a_proj_with_mqa = linear(d, Dc + dr)
        self.kv_a_layernorm = RMSNorm(Dc)
        self.kv_b_proj = linear(Dc, H * (dn + dv))
        self.gated = cfg.get("mla_use_output_gate", False)
        if self.gated:
            self.g_proj = linear(d, H * dv)
        self.o_proj = linear(H * dv, d)
        # Dense MLA (Kimi K3, Kimi Linear) where the config has no index_topk.
        self.indexer = Indexer(cfg) if cfg.get("index_topk") is not None else None
        self.dense = False
        self.index_loss = None

    def forward(self, x):
        B, T, _ = x.shape
        H, dn, dr, dv = self.H, self.dn, self.dr, self.dv
        if hasattr(self, "q_a_proj"):
            cq = rms_norm(self.q_a_proj(x), self.q_a_layernorm.weight, 1e-6)
            q = self.q_b_proj(cq).reshape(B, T, H, dn + dr)
        else:
            cq = x  # the indexer's query input without q-LoRA
            q = self.q_proj(x).reshape(B, T, H, dn + dr)
        kv = self.kv_a_proj_with_mqa(x)
        c = rms_norm(kv[..., :self.Dc], self.kv_a_layernorm.weight, 1e-6)
        krope = kv[..., self.Dc:]
        if not self.cfg.get("mla_use_nope", True):
            q = torch.cat((q[..., :dn], rope_interleaved(q[..., dn:], self.cfg)), -1)
            krope = rope_interleaved(krope[:, :, None], self.cfg)[:, :, 0]
        kvb = self.kv_b_proj(c).reshape(B, T, H, dn + dv)
        knope, vv = kvb[..., :dn], kvb[..., dn:]
        logits = (torch.einsum("bthd,bshd->bhts", q[..., :dn], knope) +
                  torch.einsum("bthd,bsd->bhts", q[..., dn:], krope)) * (dn + dr) ** -0.5 * rope_scales(self.cfg)[1]
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        if self.indexer is None:
            p = logits.masked_fill(~causal, float("-inf")).softmax(-1)
            return self.out(x, torch.einsum("bhts,bshd->bthd", p, vv).reshape(B, T, H * dv))
        K = self.cfg["index_topk"]
        # The indexer learns from the main attention but does not steer the
        # main model's gradients: its inputs are detached.
        score = self.indexer.scores(x.detach(), cq.detach()).masked_fill(~causal, float("-inf"))
        self.last_scores = score.detach()  # for cases.py's decision margins
        if self.dense or K >= T:
            keep = causal
        elif self.training:  # ties in any order: the rule matters only for inference
            keep = torch.zeros_like(score, dtype=torch.bool).scatter(-1, score.topk(K, dim=-1).indices, True) & causal
        else:
            keep = topk_mask(score, K) & causal
        if self.training:
            with torch.no_grad():
                target = logits.masked_fill(~causal, float("-inf")).softmax(-1).mean(1)
            self.index_loss = -(target * score.log_softmax(-1).masked_fill(~causal, 0)).sum(-1).mean()
        p = logits.masked_fill(~keep[:, None] if keep.dim() == 3 else ~keep, float("-inf")).softmax(-1)
        return self.out(x, torch.einsum("bhts,bshd->bthd", p, vv).reshape(B, T, H * dv))

    def out(self, x, o):
        if self.gated:
            o = o * torch.sigmoid(self.g_proj(x))
        return self.o_proj(o)


def topk_mask(score, K):
    """Keeps the K best scores of each row: descending, equal scores by lower
    position first (a stable sort of the scores in position order)."""
    idx = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :K]
    keep = torch.zeros_like(score, dtype=torch.bool)
    return keep.scatter(-1, idx, True)


class AttnResWeights(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.proj = linear(d, 1)
        self.norm = RMSNorm(d)


def attn_res(srcs, w, eps):
    """softmax over sources of w . g . RMSNorm(v_i), mixing the raw v_i."""
    if len(srcs) == 1:
        return srcs[0]
    V = torch.stack(srcs, 0)
    logit = (rms_norm(V, 1.0, eps) * w.norm.weight * w.proj.weight[0]).sum(-1)
    a = logit.softmax(0)
    return (a[..., None] * V).sum(0)


class Layer(nn.Module):
    def __init__(self, cfg, l):
        super().__init__()
        d = cfg["hidden_size"]
        kda = (l + 1) in cfg["linear_attn_config"]["kda_layers"]
        self.self_attn = KDA(cfg) if kda else DSA(cfg)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(d), RMSNorm(d)
        self.moe = (cfg.get("num_experts") is not None and l >= cfg.get("first_k_dense_replace", 0)
                    and l % cfg.get("moe_layer_freq", 1) == 0)
        if self.moe:
            self.block_sparse_moe = LatentMoE(cfg)
        else:
            self.mlp = MLP(cfg, d, cfg["intermediate_size"])
        if cfg.get("attn_res_block_size"):
            self.self_attention_res = AttnResWeights(d)
            self.mlp_res = AttnResWeights(d)


class Model(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], d)
        self.layers = nn.ModuleList(Layer(cfg, l) for l in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(d)
        if cfg.get("attn_res_block_size"):
            self.output_attn_res = AttnResWeights(d)


class LM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Model(cfg)
        if not cfg.get("tie_word_embeddings", False):
            self.lm_head = linear(cfg["hidden_size"], cfg["vocab_size"])

    def forward(self, ids, taps=()):
        """Returns (logits, hidden) where hidden[l] is the input of layer l's
        MLP sublayer for l in taps (what the draft module reads)."""
        cfg, eps = self.cfg, self.cfg["rms_norm_eps"]
        S = cfg.get("attn_res_block_size")
        h = self.model.embed_tokens(ids)
        if not S:
            return self.plain(h, taps)
        blocks, p = [], h
        hidden = {}
        for l, layer in enumerate(self.model.layers):
            x = attn_res(blocks + [p], layer.self_attention_res, eps)
            if l % S == 0:
                blocks, p = blocks + [p], None
            a = layer.self_attn(rms_norm(x, layer.input_layernorm.weight, eps))
            p = a if p is None else p + a
            x = attn_res(blocks + [p], layer.mlp_res, eps)
            if l in taps:
                hidden[l] = x
            xn = rms_norm(x, layer.post_attention_layernorm.weight, eps)
            p = p + (layer.block_sparse_moe(xn) if layer.moe else layer.mlp(xn))
        out = attn_res(blocks + [p], self.model.output_attn_res, eps)
        return self.head(out), hidden

    def plain(self, h, taps):
        """The forward without AttnRes: a residual add after each sublayer."""
        eps, hidden = self.cfg["rms_norm_eps"], {}
        for l, layer in enumerate(self.model.layers):
            h = h + layer.self_attn(rms_norm(h, layer.input_layernorm.weight, eps))
            if l in taps:
                hidden[l] = h
            xn = rms_norm(h, layer.post_attention_layernorm.weight, eps)
            h = h + (layer.block_sparse_moe(xn) if layer.moe else layer.mlp(xn))
        return self.head(h), hidden

    def head(self, h):
        h = rms_norm(h, self.model.norm.weight, self.cfg["rms_norm_eps"])
        if hasattr(self, "lm_head"):
            return self.lm_head(h)
        return F.linear(h, self.model.embed_tokens.weight)


def hf_state_dict(lm):
    """The checkpoint's tensor names: AttnRes weights flattened to
    self_attention_res_proj / _norm, the buffer bias included."""
    out = {}
    for name, t in lm.state_dict().items():
        name = (name.replace("self_attention_res.proj", "self_attention_res_proj")
                .replace("self_attention_res.norm", "self_attention_res_norm")
                .replace("mlp_res.proj", "mlp_res_proj").replace("mlp_res.norm", "mlp_res_norm")
                .replace("output_attn_res.proj", "output_attn_res_proj")
                .replace("output_attn_res.norm", "output_attn_res_norm"))
        out[name] = t
    return out


def load_checkpoint(case, cfg):
    """An LM in eval mode holding the checkpoint in directory case
    (model.safetensors, or the shards model.safetensors.index.json names)
    in the default dtype; A_log keeps its first H values (checkpoints pad
    it or store it [1,1,H,1])."""
    index = f"{case}/model.safetensors.index.json"
    files = ["model.safetensors"]
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    sd = {}
    for f in files:
        sd.update(st.read(f"{case}/{f}")[0])
    sd = dequantize(sd)
    H = cfg["linear_attn_config"]["num_heads"]
    dtype = torch.get_default_dtype()
    sd = {k: (v.flatten()[:H] if k.endswith("A_log") else v).to(dtype) for k, v in sd.items()}
    lm = LM(cfg).eval()
    load_hf_state_dict(lm, sd)
    return lm


E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]  # an fp4 e2m1 nibble's magnitude by its low three bits


def dequantize(sd):
    """sd with its quantised matrices replaced by the bf16 values they stand
    for (as float32; docs/ARCHITECTURE.md, "Quantised weights"): fp8 X.weight
    times X.weight_scale_inv (128x128 blocks) or X.weight_scale (a row's,
    the tensor's, or blocks), the product in float32 rounded to bf16; MXFP4
    X.weight_packed (column 2j in the low nibble) times 2^(s-127) for the
    X.weight_scale code s of its 32 columns (exact in bf16)."""
    out = {}
    for k, v in sd.items():
        if k.endswith(".weight_packed"):
            base = k[: -len(".weight_packed")]
            rows, cols = v.shape[0], 2 * v.shape[1]
            if base + ".weight_shape" in sd:
                assert sd[base + ".weight_shape"].tolist() == [rows, cols], base
            codes = sd[base + ".weight_scale"].long()
            assert codes.shape == (rows, (cols + 31) // 32) and int(codes.max()) < 255, base
            nib = torch.stack([v.long() & 15, v.long() >> 4], -1).reshape(rows, cols)
            mag = torch.tensor(E2M1, dtype=torch.float64)[nib & 7]
            val = torch.where(nib & 8 != 0, -mag, mag)
            scale = torch.pow(torch.tensor(2.0, dtype=torch.float64), codes - 127).repeat_interleave(32, 1)[:, :cols]
            w = (val * scale).float()
            assert torch.equal(st.bf16_round(w), w), base
            out[base + ".weight"] = w
        elif k.endswith((".weight_scale", ".weight_scale_inv", ".weight_shape")):
            continue
        elif k + "_scale_inv" in sd or k + "_scale" in sd:
            inv = k + "_scale_inv" in sd
            s = sd[k + "_scale_inv"] if inv else sd[k + "_scale"]
            R, C = v.shape
            blocks = [(R + 127) // 128, (C + 127) // 128]
            if inv or list(s.shape) == blocks and s.numel() > 1:
                assert list(s.shape) == blocks, k
                s = s.repeat_interleave(128, 0)[:R].repeat_interleave(128, 1)[:, :C]
            elif s.numel() == 1:
                s = s.reshape(())
            else:
                assert s.numel() == R and s.dim() in (1, 2), k
                s = s.reshape(R, 1)
            out[k] = st.bf16_round(v.float() * s.float())
        else:
            out[k] = v
    return out


def load_hf_state_dict(lm, sd):
    inv = {}
    for name in lm.state_dict():
        inv[(name.replace("self_attention_res.proj", "self_attention_res_proj")
             .replace("self_attention_res.norm", "self_attention_res_norm")
             .replace("mlp_res.proj", "mlp_res_proj").replace("mlp_res.norm", "mlp_res_norm")
             .replace("output_attn_res.proj", "output_attn_res_proj")
             .replace("output_attn_res.norm", "output_attn_res_norm"))] = name
    mine = {}
    for k, v in sd.items():
        k = k.removeprefix("language_model.")
        if k in inv:
            mine[inv[k]] = v
    missing = set(lm.state_dict()) - set(mine)
    if missing:
        raise KeyError(f"missing tensors: {sorted(missing)[:5]}")
    lm.load_state_dict(mine)
