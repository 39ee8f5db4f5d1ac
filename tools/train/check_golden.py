"""Checks model.py against k3's whole-model golden vectors (computed by an
independent float64 reference): python3 check_golden.py ../../testdata/model/tiny_k31pro
(any of the four layouts there)."""

import json
import sys

import torch

import model
import st


def main(case):
    cfg = json.load(open(f"{case}/config.json"))
    cfg = cfg.get("text_config", cfg)
    cfg.setdefault("activation_situ_linear_beta", None)
    torch.set_default_dtype(torch.float64)
    lm = model.load_checkpoint(case, cfg)
    exp, _ = st.read(f"{case}/expected.safetensors")
    ids = exp["input_ids"].long()[None]
    with torch.no_grad():
        logits, _ = lm(ids)
        d = (logits[0] - exp["prefill_logits"].double()).abs().max().item()
        full = torch.cat([ids[0], exp["generated_ids"].long()])[None]
        dl, _ = lm(full)
        T = ids.shape[1]
        dd = (dl[0, T:] - exp["decode_logits"].double()).abs().max().item()
    print(f"{case}: prefill max|diff| {d:.3g}, decode (recomputed) max|diff| {dd:.3g}, logit scale {exp['prefill_logits'].abs().max():.3g}")
    assert d < 1e-5 and dd < 1e-5


if __name__ == "__main__":
    main(sys.argv[1])
