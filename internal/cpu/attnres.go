package cpu

import (
	"fmt"
	"math"
	"sync"

	"k3/compute"
	"k3/internal/kernel"
)

// lowestFinite is phase 1's running maximum over an empty history.
const lowestFinite = -math.MaxFloat32

// AttnResPrepare computes, for every fused query and token, the unnormalised
// softmax-weighted sum of the blocks and its statistics. Each block row is
// normalised once and read once for all queries.
func (b *Backend) AttnResPrepare(a *compute.AttnResPrepareArgs) error {
	q, err := f32Of("attnres queries", a.Queries)
	if err != nil {
		return err
	}
	if a.Queries.Rank != 2 {
		return shapeErr("attnres queries %v, want [S, D]", a.Queries)
	}
	s, d := a.Queries.Dims[0], a.Queries.Dims[1]
	num, err := f32Of("attnres numerator", a.Num)
	if err != nil {
		return err
	}
	mx, err := f32Of("attnres max", a.Max)
	if err != nil {
		return err
	}
	sum, err := f32Of("attnres sum", a.Sum)
	if err != nil {
		return err
	}
	t := len(mx) / max(s, 1)
	if len(num) != s*t*d || len(mx) != s*t || len(sum) != s*t {
		return shapeErr("attnres outputs num %v max %v sum %v for %d queries of width %d", a.Num, a.Max, a.Sum, s, d)
	}
	bp := blockListPool.Get().(*[][]float32)
	defer blockListPool.Put(bp)
	blocks := append((*bp)[:0], make([][]float32, len(a.Blocks))...)
	*bp = blocks
	for i, bt := range a.Blocks {
		v, err := f32Of("attnres block", bt)
		if err != nil {
			return err
		}
		if len(v) != t*d {
			return shapeErr("attnres block %d is %v, want [%d, %d]", i, bt, t, d)
		}
		blocks[i] = v
	}
	if len(blocks) == 0 {
		clear(num)
		for i := range mx {
			mx[i], sum[i] = lowestFinite, 0
		}
		return nil
	}
	job := &prepareJob{q: q, num: num, mx: mx, sum: sum, blocks: blocks, s: s, t: t, d: d, eps: a.Eps}
	if t < 2 || t*s*len(blocks)*d < prepareSerial { // one decode row: not worth a dispatch
		prepareTokens(job, 0, t)
		return nil
	}
	sc := prepareJobPool.Get().(*prepareJob)
	defer prepareJobPool.Put(sc)
	*sc = *job
	b.pool.Run(prepareRange, kernel.Args{Job: sc}, t, 4)
	return nil
}

// prepareSerial is the work (tokens × queries × blocks × width) below
// which AttnResPrepare runs on the calling goroutine.
var prepareSerial = 1 << 16

// prepareJob is AttnResPrepare's work: tokens are independent, so a long
// pass splits over the pool by token.
type prepareJob struct {
	q, num, mx, sum []float32
	blocks          [][]float32
	s, t, d         int
	eps             float32
}

var prepareJobPool = sync.Pool{New: func() any { return new(prepareJob) }}

func prepareRange(args *kernel.Args, lo, hi int) { prepareTokens(args.Job.(*prepareJob), lo, hi) }

// prepareTokens computes phase one for tokens [lo, hi): for every query,
// the maximum logit over the committed blocks, then the sum of the
// exponentials below it and the rows they weight, so that each numerator
// row is written once, block by block in block order, while the token's
// block rows sit in cache (an online softmax rewrote it once a block).
func prepareTokens(j *prepareJob, lo, hi int) {
	s, t, d, nb := j.s, j.t, j.d, len(j.blocks)
	var zbuf [256]float32
	z := zbuf[:]
	if s*nb > len(z) {
		z = make([]float32, s*nb)
	}
	z = z[:s*nb]
	for tok := lo; tok < hi; tok++ {
		for n, blk := range j.blocks {
			row := blk[tok*d : (tok+1)*d]
			inv := rmsInv(row, j.eps)
			for qi := range s {
				z[qi*nb+n] = kernel.Dot(j.q[qi*d:(qi+1)*d], row) * inv
			}
		}
		for qi := range s {
			zq := z[qi*nb : (qi+1)*nb]
			m := zq[0]
			for _, v := range zq[1:] {
				m = max(m, v)
			}
			o := qi*t + tok
			acc := j.num[o*d : (o+1)*d]
			var sum float32
			for n, blk := range j.blocks {
				e := float32(math.Exp(float64(zq[n] - m)))
				sum += e
				row := blk[tok*d : (tok+1)*d]
				if n == 0 {
					kernel.MulScale(acc, row, nil, e)
				} else {
					kernel.Axpy(acc, e, row)
				}
			}
			j.mx[o], j.sum[o] = m, sum
		}
	}
}

func rmsInv(row []float32, eps float32) float32 {
	ss := float64(kernel.Dot(row, row))
	return float32(1 / math.Sqrt(ss/float64(len(row))+float64(eps)))
}

// AttnResUpdate adds the sublayer delta to the partial and merges it with
// one query's phase-1 statistics; where asked, it normalises each merged
// row as it is written (the next sublayer's pre-norm).
func (b *Backend) AttnResUpdate(a *compute.AttnResUpdateArgs) error {
	q, err := f32Of("attnres query", a.Query)
	if err != nil {
		return err
	}
	d := len(q)
	h, err := f32Of("attnres output", a.H)
	if err != nil {
		return err
	}
	num, err := f32Of("attnres numerator", a.Num)
	if err != nil {
		return err
	}
	mx, err := f32Of("attnres max", a.Max)
	if err != nil {
		return err
	}
	sum, err := f32Of("attnres sum", a.Sum)
	if err != nil {
		return err
	}
	t := len(mx)
	if len(h) != t*d || len(num) != t*d || len(sum) != t {
		return shapeErr("attnres update: h %v num %v max %v sum %v for query width %d", a.H, a.Num, a.Max, a.Sum, d)
	}
	var p []float32
	if !a.Partial.IsZero() {
		if p, err = f32Of("attnres partial", a.Partial); err != nil {
			return err
		}
		if len(p) != t*d {
			return shapeErr("attnres partial %v, want [%d, %d]", a.Partial, t, d)
		}
	}
	j := elementwiseJob{q: q, h: h, num: num, mx: mx, sum: sum, p: p, width: d, eps: a.Eps}
	if !a.Normed.IsZero() {
		if j.normed, err = f32Of("attnres normed output", a.Normed); err != nil {
			return err
		}
		if len(j.normed) != t*d {
			return shapeErr("attnres normed output %v, want [%d, %d]", a.Normed, t, d)
		}
		if !a.NormWeight.IsZero() {
			if j.normW, err = f32Of("attnres norm weight", a.NormWeight); err != nil {
				return err
			}
			if len(j.normW) != d {
				return shapeErr("attnres norm weight %v for rows of %d", a.NormWeight, d)
			}
		}
		j.normEps = a.NormEps
	}
	if !a.Delta.IsZero() {
		delta, err := f32Of("attnres delta", a.Delta)
		if err != nil {
			return err
		}
		if p == nil || len(delta) != t*d {
			return shapeErr("attnres delta %v needs a partial buffer of [%d, %d]", a.Delta, t, d)
		}
		j.delta, j.addDelta = delta, a.HasPartial
		a.HasPartial = true
	}
	j.merge = a.HasPartial
	if !j.merge {
		for tok, v := range sum {
			if v == 0 {
				return fmt.Errorf("cpu: attnres update: no sources for token %d (empty history and no partial)", tok)
			}
		}
	}
	if t*d < elementwiseMin {
		updateTokens(&j, 0, t)
		return nil
	}
	b.split(&j, updateRange, t, 1)
	return nil
}

func updateRange(a *kernel.Args, lo, hi int) { updateTokens(a.Job.(*elementwiseJob), lo, hi) }

// updateTokens is AttnResUpdate for tokens [lo, hi): the delta into the
// partial, then each token's output and, where asked, its pre-norm
// (kernel.RMSNorm on the row just written, as RMSNorm's rows get it).
func updateTokens(j *elementwiseJob, lo, hi int) {
	d := j.width
	if j.delta != nil {
		p, delta := j.p[lo*d:hi*d], j.delta[lo*d:hi*d]
		if j.addDelta {
			kernel.Add(p, p, delta)
		} else {
			copy(p, delta)
		}
	}
	for tok := lo; tok < hi; tok++ {
		out, n := j.h[tok*d:(tok+1)*d], j.num[tok*d:(tok+1)*d]
		if !j.merge {
			kernel.MulScale(out, n, nil, 1/j.sum[tok])
		} else {
			row := j.p[tok*d : (tok+1)*d]
			s := kernel.Dot(j.q, row) * rmsInv(row, j.eps)
			m := max(j.mx[tok], s)
			e1 := float32(math.Exp(float64(j.mx[tok] - m)))
			e2 := float32(math.Exp(float64(s - m)))
			inv := 1 / (j.sum[tok]*e1 + e2)
			kernel.Mix(out, n, row, e1, e2, inv)
		}
		if j.normed != nil {
			kernel.RMSNorm(j.normed[tok*d:(tok+1)*d], out, j.normW, d, j.normEps)
		}
	}
}

// blockListPool holds AttnResPrepare's list of block views, so that a
// decode step allocates nothing.
var blockListPool = sync.Pool{New: func() any { return new([][]float32) }}
