package attnres

import (
	"fmt"
	"math"

	"k3/compute"
)

// FuseQuery writes dst = w * g: the logit w·(RMSNorm(v)·g) only needs the
// product of the pseudo-query and the key-norm weight.
func FuseQuery(dst, w, g []float32) {
	for i := range dst {
		dst[i] = w[i] * g[i]
	}
}

// Aggregate is the direct form of one AttnRes step, kept as the oracle the
// two-phase path is tested against: out[t] = Σ_i softmax_i(z_i[t]) v_i[t]
// with z_i[t] = query · RMSNorm(v_i[t]) · g. sources are [T*D] each. It
// returns the softmax weights alpha[i][t].
func Aggregate(out []float32, sources [][]float32, query, g []float32, t, d int, eps float32) [][]float32 {
	alpha := make([][]float32, len(sources))
	for i := range alpha {
		alpha[i] = make([]float32, t)
	}
	z := make([]float64, len(sources))
	for tok := 0; tok < t; tok++ {
		m := math.Inf(-1)
		for i, src := range sources {
			row := src[tok*d : (tok+1)*d]
			var ss, dot float64
			for c, v := range row {
				ss += float64(v) * float64(v)
				dot += float64(query[c]) * float64(g[c]) * float64(v)
			}
			z[i] = dot / math.Sqrt(ss/float64(d)+float64(eps))
			m = math.Max(m, z[i])
		}
		var sum float64
		for i := range z {
			z[i] = math.Exp(z[i] - m)
			sum += z[i]
		}
		o := out[tok*d : (tok+1)*d]
		clear(o)
		for i, src := range sources {
			a := z[i] / sum
			alpha[i][tok] = float32(a)
			for c := range o {
				o[c] += float32(a * float64(src[tok*d+c]))
			}
		}
	}
	return alpha
}

// Stream carries the residual state of one forward pass through the K3
// block bookkeeping, for T tokens at a time (a prefill chunk or a decode
// batch). Sublayer j = 2·layer + (0 attention, 1 MLP). Before sublayer j
// with j % BlockSublayers == 0 the running partial (the embedding at j = 0)
// is committed as a block and the partial restarts empty; the input of
// sublayer j is AttnRes over [committed blocks..., partial if any].
//
// At each block start one AttnResPrepare pass computes the statistics of
// all the block's queries over the committed blocks; each sublayer then
// costs one AttnResUpdate (merge with the partial, fused with adding the
// previous sublayer's output to it).
type Stream struct {
	b        compute.Backend
	queries  compute.Tensor // [J, D] fused queries, one per sublayer
	outQuery compute.Tensor // [D]
	per      int
	eps      float32
	maxT, d  int

	blocks  compute.Tensor // [maxBlocks, maxT, D]
	views   []compute.Tensor
	partial compute.Tensor // [maxT, D]
	num     compute.Tensor // [per, maxT, D]
	mx, sum compute.Tensor // [per, maxT]

	t, j, j0, nblocks, nq int
	prep                  compute.AttnResPrepareArgs
	upd                   compute.AttnResUpdateArgs
	has                   bool
}

// NewStream allocates the state for up to maxT tokens. queries [J, D] holds
// the fused query of every sublayer (J = 2·layers), outQuery [D] the output
// aggregation's; blockSublayers is 2·attn_res_block_size for Block AttnRes
// or 1 for Full AttnRes.
func NewStream(b compute.Backend, queries, outQuery compute.Tensor, blockSublayers, maxT int, eps float32) (*Stream, error) {
	if queries.Rank != 2 || outQuery.Len() != queries.Dim(1) {
		return nil, fmt.Errorf("attnres: queries %v and output query %v disagree", queries, outQuery)
	}
	if blockSublayers <= 0 || maxT <= 0 {
		return nil, fmt.Errorf("attnres: block of %d sublayers for %d tokens", blockSublayers, maxT)
	}
	j, d := queries.Dims[0], queries.Dims[1]
	maxBlocks := (j + blockSublayers - 1) / blockSublayers
	s := &Stream{b: b, queries: queries, outQuery: outQuery.Reshape(1, d), per: blockSublayers, eps: eps, maxT: maxT, d: d,
		views: make([]compute.Tensor, 0, maxBlocks)}
	var err error
	alloc := func(dims ...int) compute.Tensor {
		if err != nil {
			return compute.Tensor{}
		}
		var t compute.Tensor
		t, err = b.Alloc(compute.F32, dims...)
		return t
	}
	s.blocks = alloc(maxBlocks, maxT, d)
	s.partial = alloc(maxT, d)
	s.num = alloc(blockSublayers, maxT, d)
	s.mx = alloc(blockSublayers, maxT)
	s.sum = alloc(blockSublayers, maxT)
	if err != nil {
		return nil, fmt.Errorf("attnres: %w", err)
	}
	return s, nil
}

// Begin starts a forward pass of embedding.Dim(0) tokens.
func (s *Stream) Begin(embedding compute.Tensor) error {
	t := embedding.Dim(0)
	if t > s.maxT || embedding.Len() != t*s.d {
		return fmt.Errorf("attnres: embedding %v for at most %d tokens of width %d", embedding, s.maxT, s.d)
	}
	s.t, s.j, s.nblocks, s.has = t, 0, 0, true
	return s.b.Copy(s.partial.Rows(0, t), embedding)
}

// Next computes into h [T, D] the input of the next sublayer; delta is the
// output of the previous sublayer (the zero Tensor before sublayer 0).
func (s *Stream) Next(delta, h compute.Tensor) error {
	if s.j >= s.queries.Dims[0] {
		return fmt.Errorf("attnres: all %d sublayers already done", s.j)
	}
	j := s.j
	s.j++
	if j%s.per == 0 {
		if err := s.addDelta(delta); err != nil {
			return err
		}
		if err := s.commit(); err != nil {
			return err
		}
		s.j0 = j
		if err := s.prepare(s.queries.Rows(j, min(j+s.per, s.queries.Dims[0]))); err != nil {
			return err
		}
		return s.update(j-s.j0, compute.Tensor{}, s.queries.Rows(j, j+1), h)
	}
	return s.update(j-s.j0, delta, s.queries.Rows(j, j+1), h)
}

// Final computes into h the output aggregation over the committed blocks
// and the partial (after adding the last sublayer's output delta).
func (s *Stream) Final(delta, h compute.Tensor) error {
	if err := s.prepare(s.outQuery); err != nil {
		return err
	}
	return s.update(0, delta, s.outQuery, h)
}

// Blocks returns views of the committed blocks of the current pass.
func (s *Stream) Blocks() []compute.Tensor { return s.views }

// Partial returns the current partial sum and whether it holds a value.
func (s *Stream) Partial() (compute.Tensor, bool) { return s.partial.Rows(0, s.t), s.has }

func (s *Stream) addDelta(delta compute.Tensor) error {
	if delta.IsZero() {
		return nil
	}
	p := s.partial.Rows(0, s.t)
	if !s.has {
		s.has = true
		return s.b.Copy(p, delta)
	}
	return s.b.Binary(compute.Add, p, p, delta)
}

func (s *Stream) commit() error {
	if !s.has {
		return fmt.Errorf("attnres: block boundary at sublayer %d with an empty partial", s.j-1)
	}
	blk := s.blocks.Rows(s.nblocks, s.nblocks+1).Reshape(s.maxT, s.d).Rows(0, s.t)
	if err := s.b.Copy(blk, s.partial.Rows(0, s.t)); err != nil {
		return err
	}
	// Begin starts a pass with nblocks = 0, so views holds exactly this
	// pass's blocks (their row count follows the pass's T).
	s.views = append(s.views[:s.nblocks], blk)
	s.nblocks++
	s.has = false
	return nil
}

// stats returns the phase-1 buffers as contiguous [n, T, D] and [n, T].
func (s *Stream) stats(n int) (num, mx, sum compute.Tensor) {
	num = s.num.Reshape(-1).Rows(0, n*s.t*s.d).Reshape(n, s.t, s.d)
	mx = s.mx.Reshape(-1).Rows(0, n*s.t).Reshape(n, s.t)
	sum = s.sum.Reshape(-1).Rows(0, n*s.t).Reshape(n, s.t)
	return num, mx, sum
}

func (s *Stream) prepare(queries compute.Tensor) error {
	num, mx, sum := s.stats(queries.Dims[0])
	s.nq = queries.Dims[0]
	// The argument structs live in the Stream: a local would escape through
	// the interface call and allocate on every sublayer.
	s.prep = compute.AttnResPrepareArgs{Blocks: s.views, Queries: queries, Eps: s.eps, Num: num, Max: mx, Sum: sum}
	return Prepare(s.b, &s.prep)
}

// update merges query qi's statistics with the partial (plus delta) into h.
func (s *Stream) update(qi int, delta, query, h compute.Tensor) error {
	num, mx, sum := s.stats(s.nq)
	s.upd = compute.AttnResUpdateArgs{
		Partial:    s.partial.Rows(0, s.t),
		HasPartial: s.has,
		Delta:      delta,
		Query:      query.Reshape(s.d),
		Eps:        s.eps,
		Num:        num.Rows(qi, qi+1).Reshape(s.t, s.d),
		Max:        mx.Rows(qi, qi+1).Reshape(s.t),
		Sum:        sum.Rows(qi, qi+1).Reshape(s.t),
		H:          h,
	}
	if err := Update(s.b, &s.upd); err != nil {
		return err
	}
	s.has = s.upd.HasPartial
	return nil
}
