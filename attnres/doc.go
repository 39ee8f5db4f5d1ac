// Package attnres implements Block Attention Residuals: before every
// sublayer, a learned softmax over the representations of earlier blocks
// replaces the plain residual sum.
//
// It owns the K3 block bookkeeping (which blocks are committed when), the
// direct aggregation (the test oracle) and the two-phase inference path:
// one batched pass over the committed blocks per block (prepare), then an
// online-softmax merge with the running partial sum per sublayer (update).
package attnres
