// Package dsa implements DeepSeek Sparse Attention as Kimi K3.1 Pro uses
// it: multi-head latent attention (MLA) whose queries read only the top-K
// latent KV entries chosen by the Lightning Indexer. The same layer runs
// densely for Kimi K3's MLA layers.
//
// It owns the MLA query and latent paths (with or without q-LoRA, NoPE or
// RoPE), the indexer, top-K selection with a defined tie order, sparse and
// dense attention in the absorbed (MQA) form, and the per-layer latent KV
// and index-key caches: pages of PageSize positions from a Pool,
// reference-counted so that forks and a prefix cache share them.
package dsa
