// Package kda implements Kimi Delta Attention, the linear-attention token
// mixer of about three of every four Kimi K3 layers: a gated delta-rule
// recurrence with a per-head K×V state and a short causal convolution cache.
//
// It owns the layer (projections, short conv, gates, recurrence, output norm
// and gate, output projection) written against the compute seam, the state
// layout, and the two execution paths over the same state: chunked prefill
// (Prefill: FlashKDA's split into a token-parallel chunk stage and a
// sequential inter-chunk stage) and the fused decode step (MegaKDA:
// Decode, and DecodeBatch for many sequences with one or more tokens each,
// stepped with the single-token arithmetic and optionally emitting the
// ReplaySSM records of package replay).
package kda
