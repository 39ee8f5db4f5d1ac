"""A DSpark-style draft module (parallel block logits, a low-rank Markov
head, a per-position confidence head) reading the target's hidden states.

Given an anchor position t whose next token x_{t+1} is known (the target
produced it), the module proposes x_{t+2} .. x_{t+1+K} in one pass:

  c      = RMSNorm(W_fc [h^{l_1}_t; ...; h^{l_n}_t]) + E[x_{t+1}]   context
  f_k    = MLP stack(c + P_k)                                        k = 1..K, in parallel
  U_k    = lm_head(RMSNorm(f_k))                                     target's own head
  B_k    = W_out W_in[x_{t+k}]                                       Markov head, rank r
  q_k    = softmax(U_k + B_k)
  conf_k = sigmoid(w . [f_k; W_in[x_{t+k}]] + b)

h^l_t is the input of target layer l's MLP sublayer (the AttnRes output
before its pre-norm). The block is drafted left to right: x_{t+k} for k > 1
is the token drafted at k-1, so B_k costs one row of W_out W_in per token.
"""

import torch
import torch.nn as nn

from model import act, rms_norm


class DraftLayer(nn.Module):
    def __init__(self, cfg, d, width):
        super().__init__()
        self.cfg = cfg
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(d))
        self.gate_proj = nn.Linear(d, width, bias=False)
        self.up_proj = nn.Linear(d, width, bias=False)
        self.down_proj = nn.Linear(width, d, bias=False)

    def forward(self, x):
        h = rms_norm(x, self.norm.weight, self.cfg["rms_norm_eps"])
        return x + self.down_proj(act(self.cfg, self.gate_proj(h), self.up_proj(h)))


class Draft(nn.Module):
    def __init__(self, cfg, dcfg):
        super().__init__()
        d, V = cfg["hidden_size"], cfg["vocab_size"]
        self.cfg, self.dcfg = cfg, dcfg
        n, K, r = len(dcfg["target_layers"]), dcfg["block_size"], dcfg["markov_rank"]
        self.fc = nn.Linear(n * d, d, bias=False)
        self.fc_norm = nn.Module()
        self.fc_norm.weight = nn.Parameter(torch.ones(d))
        self.pos_embed = nn.Parameter(torch.zeros(K, d))
        self.layers = nn.ModuleList(DraftLayer(cfg, d, dcfg["intermediate_size"]) for _ in range(dcfg["num_layers"]))
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(d))
        self.markov_in = nn.Embedding(V, r)
        self.markov_out = nn.Linear(r, V, bias=False)
        self.confidence = nn.Linear(d + r, 1)

    def features(self, taps, next_emb):
        """taps: [..., n*d] concatenated target hidden states at the anchor;
        next_emb: [..., d] the embedding of x_{t+1}. Returns f [..., K, d]."""
        eps = self.cfg["rms_norm_eps"]
        c = rms_norm(self.fc(taps), self.fc_norm.weight, eps) + next_emb
        f = c[..., None, :] + self.pos_embed
        for layer in self.layers:
            f = layer(f)
        return f

    def block_logits(self, f, lm_head):
        return lm_head(rms_norm(f, self.norm.weight, self.cfg["rms_norm_eps"]))

    def markov(self, prev):
        m = self.markov_in(prev)
        return self.markov_out(m), m

    def conf(self, f, m):
        return torch.sigmoid(self.confidence(torch.cat([f, m], -1)))[..., 0]

    def state_dict_hf(self, prefix="dspark."):
        return {prefix + k: v for k, v in self.state_dict().items()}
