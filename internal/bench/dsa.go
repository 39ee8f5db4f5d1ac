// Package bench holds the measurement harnesses shared by the go test
// benchmarks and the `k3 bench` command, so that both report the same
// figures the same way.
package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"k3/compute"
)

// DSAShape is the attention core of a DSA layer at decode.
type DSAShape struct {
	Heads, Latent, Rope  int // query heads, kv_lora_rank, qk_rope_head_dim
	IndexHeads, IndexDim int
	TopK                 int
}

// K31Pro is the K3.1 Pro-shaped DSA layer (96 query heads, latent 512 +
// rope 64, indexer 64 × 128, top-2048).
var K31Pro = DSAShape{Heads: 96, Latent: 512, Rope: 64, IndexHeads: 64, IndexDim: 128, TopK: 2048}

// SparseFLOPs and DenseFLOPs count one decode step's attention core at
// context l: the indexer (2·HI·DI·l) plus MLA-MQA attention over K entries
// (2·H·(Dc+Dr)·K for the logits, 2·H·Dc·K for the values), against the same
// attention over all l entries.
func (s DSAShape) SparseFLOPs(l int) float64 {
	k := float64(min(s.TopK, l))
	return 2*float64(s.IndexHeads*s.IndexDim*l) + float64(2*s.Heads*(2*s.Latent+s.Rope))*k
}

// DenseFLOPs counts dense MLA-MQA attention over l entries.
func (s DSAShape) DenseFLOPs(l int) float64 {
	return float64(2*s.Heads*(2*s.Latent+s.Rope)) * float64(l)
}

// SparseBytes and DenseBytes are the cache bytes one step reads (float32
// caches): every index key, then the selected latent and rope rows; or
// every latent and rope row.
func (s DSAShape) SparseBytes(l int) float64 {
	return 4 * (float64(s.IndexDim*l) + float64((s.Latent+s.Rope)*min(s.TopK, l)))
}

// DenseBytes is the dense step's cache traffic.
func (s DSAShape) DenseBytes(l int) float64 { return 4 * float64((s.Latent+s.Rope)*l) }

// DSAResult is one context length's measurement.
type DSAResult struct {
	Context                int
	Sparse, Indexer, Dense time.Duration // per step; Indexer is part of Sparse
}

// DSADecode times one decode step's attention core, sparse (indexer with
// top-K, then attention over the K picks) and dense, at context l on b,
// over iters steps each (median).
func DSADecode(b compute.Backend, s DSAShape, l, iters int) (DSAResult, error) {
	r := rand.New(rand.NewPCG(uint64(l), 7))
	fill := func(dims ...int) (compute.Tensor, error) {
		n := 1
		for _, d := range dims {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		t, err := b.Alloc(compute.F32, dims...)
		if err == nil {
			err = b.Write(t, v)
		}
		return t, err
	}
	var err error
	must := func(dims ...int) compute.Tensor {
		if err != nil {
			return compute.Tensor{}
		}
		var t compute.Tensor
		t, err = fill(dims...)
		return t
	}
	kv, pe, ik := must(l, 1, s.Latent), must(l, s.Rope), must(l, s.IndexDim)
	q, qr := must(1, s.Heads, s.Latent), must(1, s.Heads, s.Rope)
	iq, iw := must(1, s.IndexHeads, s.IndexDim), must(1, s.IndexHeads)
	if err != nil {
		return DSAResult{}, err
	}
	idx, err := b.Alloc(compute.I32, 1, s.TopK)
	if err != nil {
		return DSAResult{}, err
	}
	out, _ := b.Alloc(compute.F32, 1, s.Heads, s.Latent)
	pos := []int32{int32(l - 1)}
	posT, err := b.Alloc(compute.I32, 1)
	if err == nil {
		err = b.Write(posT, pos)
	}
	if err != nil {
		return DSAResult{}, err
	}
	scale := float32(1 / math.Sqrt(float64(s.Latent)))
	ix := compute.IndexerArgs{Q: iq, K: ik, W: iw, QPos: posT, TopK: s.TopK, Indices: idx}
	sparse := compute.AttnArgs{Q: q, QRope: qr, K: kv, KRope: pe, V: kv, Indices: idx.Reshape(1, 1, s.TopK), QPos: posT, KVLen: l, Causal: true, Scale: scale, Out: out}
	dense := sparse
	dense.Indices = compute.Tensor{}
	var tIdx, tSparse, tDense []time.Duration
	for i := 0; i < iters; i++ {
		start := time.Now()
		if err := b.LightningIndexer(&ix); err != nil {
			return DSAResult{}, fmt.Errorf("indexer: %w", err)
		}
		mid := time.Now()
		if err := b.Attention(&sparse); err != nil {
			return DSAResult{}, fmt.Errorf("sparse attention: %w", err)
		}
		end := time.Now()
		if err := b.Attention(&dense); err != nil {
			return DSAResult{}, fmt.Errorf("dense attention: %w", err)
		}
		tIdx = append(tIdx, mid.Sub(start))
		tSparse = append(tSparse, end.Sub(start))
		tDense = append(tDense, time.Since(end))
	}
	for _, t := range []compute.Tensor{kv, pe, ik, q, qr, iq, iw, idx, out} {
		b.Free(t)
	}
	return DSAResult{Context: l, Sparse: median(tSparse), Indexer: median(tIdx), Dense: median(tDense)}, nil
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
