// Package kda implements Kimi Delta Attention, the linear-attention token
// mixer of about three of every four Kimi K3 layers: a gated delta-rule
// recurrence with a per-head K×V state and a short causal convolution cache.
//
// It owns the layer (projections, short conv, gates, recurrence, output norm
// and gate, output projection) written against the compute seam, the state
// layout, and one entry point, Layer.Forward, over the packed new tokens of
// many sequences. It serves each sequence by one of two execution paths
// over the same state: the fused decode step (MegaKDA) for exact runs,
// stepped with the single-token arithmetic and optionally emitting the
// ReplaySSM records of package replay, and chunked prefill (FlashKDA's
// split into a token-parallel chunk stage and a sequential inter-chunk
// stage) for the rest.
package kda
