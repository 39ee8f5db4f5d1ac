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

	// Capture, when set, runs the device work of one step through the
	// caller's graph cache: step j is sublayer j's Next and step J (the
	// number of queries) is Final; fn's operations have fixed shapes and
	// addresses once j, the rows and deps are. The stream's bookkeeping
	// (which block, whether the partial holds a value) is host state and
	// runs outside fn, so a replay, which skips fn, keeps it.
	Capture func(j, rows int, deps []compute.Tensor, fn func() error) error

	// The step planned by Next or Final for its device work.
	step struct {
		delta, blk compute.Tensor // a block start: the delta to fold in and the block to commit into
		copy, add  bool           // fold the delta in by Copy (the partial was empty) or Add
		commit     bool
		prepare    bool
		deps       []compute.Tensor
	}
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

// Norm is the pre-norm of the sublayer a Stream step feeds: where Out is
// set, the step also writes RMSNorm(h) with Weight (zero: none) and Eps
// into it, fused into the step's AttnResUpdate on a backend that fuses it
// (compute.AttnResUpdateArgs.Normed).
type Norm struct {
	Out, Weight compute.Tensor
	Eps         float32
}

// Next computes into h [T, D] the input of the next sublayer, and its
// pre-norm where norm asks for it; delta is the output of the previous
// sublayer (the zero Tensor before sublayer 0).
func (s *Stream) Next(delta, h compute.Tensor, norm Norm) error {
	if s.j >= s.queries.Dims[0] {
		return fmt.Errorf("attnres: all %d sublayers already done", s.j)
	}
	j := s.j
	s.j++
	st := &s.step
	st.copy, st.add, st.commit, st.prepare = false, false, false, false
	if j%s.per == 0 {
		if !delta.IsZero() {
			st.delta, st.copy, st.add = delta, !s.has, s.has
			s.has = true
		}
		if !s.has {
			return fmt.Errorf("attnres: block boundary at sublayer %d with an empty partial", j)
		}
		st.blk = s.blocks.Rows(s.nblocks, s.nblocks+1).Reshape(s.maxT, s.d).Rows(0, s.t)
		st.commit = true
		// Begin starts a pass with nblocks = 0, so views holds exactly
		// this pass's blocks (their row count follows the pass's T).
		s.views = append(s.views[:s.nblocks], st.blk)
		s.nblocks++
		s.has = false
		s.j0 = j
		s.plan(s.queries.Rows(j, min(j+s.per, s.queries.Dims[0])))
		s.planUpdate(0, compute.Tensor{}, s.queries.Rows(j, j+1), h, norm)
	} else {
		s.planUpdate(j-s.j0, delta, s.queries.Rows(j, j+1), h, norm)
	}
	return s.run(j, delta, h, norm)
}

// Final computes into h the output aggregation over the committed blocks
// and the partial (after adding the last sublayer's output delta), and
// the final norm where norm asks for it.
func (s *Stream) Final(delta, h compute.Tensor, norm Norm) error {
	st := &s.step
	st.copy, st.add, st.commit = false, false, false
	s.plan(s.outQuery)
	s.planUpdate(0, delta, s.outQuery, h, norm)
	return s.run(s.queries.Dims[0], delta, h, norm)
}

// run does step j's device work, through Capture when set.
func (s *Stream) run(j int, delta, h compute.Tensor, norm Norm) error {
	if s.Capture == nil {
		return s.device()
	}
	st := &s.step
	st.deps = append(st.deps[:0], delta, h, s.partial, s.blocks)
	if !norm.Out.IsZero() {
		st.deps = append(st.deps, norm.Out, norm.Weight)
	}
	return s.Capture(j, s.t, st.deps, s.device)
}

// device does the planned step's device work: fold the delta into the
// partial and commit it as a block (a block start), phase 1 (at a block
// start and for Final), phase 2.
func (s *Stream) device() error {
	st := &s.step
	p := s.partial.Rows(0, s.t)
	switch {
	case st.copy:
		if err := s.b.Copy(p, st.delta); err != nil {
			return err
		}
	case st.add:
		if err := s.b.Binary(compute.Add, p, p, st.delta); err != nil {
			return err
		}
	}
	if st.commit {
		if err := s.b.Copy(st.blk, p); err != nil {
			return err
		}
	}
	if st.prepare {
		if err := Prepare(s.b, &s.prep); err != nil {
			return err
		}
	}
	// The argument structs live in the Stream: a local would escape
	// through the interface call and allocate on every sublayer. (Update
	// sets HasPartial in them; the stream planned its own.)
	return Update(s.b, &s.upd)
}

// Blocks returns views of the committed blocks of the current pass.
func (s *Stream) Blocks() []compute.Tensor { return s.views }

// Partial returns the current partial sum and whether it holds a value.
func (s *Stream) Partial() (compute.Tensor, bool) { return s.partial.Rows(0, s.t), s.has }

// stats returns the phase-1 buffers as contiguous [n, T, D] and [n, T].
func (s *Stream) stats(n int) (num, mx, sum compute.Tensor) {
	num = s.num.Reshape(-1).Rows(0, n*s.t*s.d).Reshape(n, s.t, s.d)
	mx = s.mx.Reshape(-1).Rows(0, n*s.t).Reshape(n, s.t)
	sum = s.sum.Reshape(-1).Rows(0, n*s.t).Reshape(n, s.t)
	return num, mx, sum
}

// plan sets phase 1's arguments for queries.
func (s *Stream) plan(queries compute.Tensor) {
	num, mx, sum := s.stats(queries.Dims[0])
	s.nq = queries.Dims[0]
	s.prep = compute.AttnResPrepareArgs{Blocks: s.views, Queries: queries, Eps: s.eps, Num: num, Max: mx, Sum: sum}
	s.step.prepare = true
}

// planUpdate sets phase 2's arguments: query qi's statistics merged with
// the partial (plus delta) into h, and h's pre-norm where norm asks for
// it. A non-zero delta leaves a partial.
func (s *Stream) planUpdate(qi int, delta, query, h compute.Tensor, norm Norm) {
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
		Normed:     norm.Out,
		NormWeight: norm.Weight,
		NormEps:    norm.Eps,
	}
	s.has = s.has || !delta.IsZero()
}
