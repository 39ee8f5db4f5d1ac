package cpu

import (
	"math"
	"sync"

	"k3/compute"
	"k3/internal/kernel"
)

// CausalConv runs the depthwise causal conv with SiLU over packed sequences.
func (b *Backend) CausalConv(a *compute.ConvArgs) error {
	if a.X.Rank != 2 || a.Weight.Rank != 2 || a.Weight.Dims[0] != a.X.Dims[1] {
		return shapeErr("conv input %v, weight %v", a.X, a.Weight)
	}
	t, ch, w := a.X.Dims[0], a.X.Dims[1], a.Weight.Dims[1]
	if w < 1 {
		return shapeErr("conv width %d", w)
	}
	cu := a.CuSeqlens
	if cu == nil {
		cu = []int32{0, int32(t)}
	}
	n := len(cu) - 1
	if n < 1 || cu[0] != 0 || int(cu[n]) != t {
		return shapeErr("conv cu_seqlens %v for %d tokens", cu, t)
	}
	var slots []int32
	if a.StateIdx.IsZero() {
		if err := compute.CheckShape("conv state", a.State, compute.F32, n, w-1, ch); err != nil {
			return err
		}
	} else {
		if a.State.Rank != 3 {
			return shapeErr("conv state pool %v, want [P, %d, %d]", a.State, w-1, ch)
		}
		if err := compute.CheckShape("conv state pool", a.State, compute.F32, a.State.Dims[0], w-1, ch); err != nil {
			return err
		}
		var err error
		if slots, err = stateSlots("conv", a.StateIdx, n, a.State.Dims[0]); err != nil {
			return err
		}
	}
	if err := compute.CheckShape("conv output", a.Out, compute.F32, t, ch); err != nil {
		return err
	}
	x, wt, st, out := F32(a.X), F32(a.Weight), F32(a.State), F32(a.Out)
	if x == nil || wt == nil {
		return shapeErr("conv operands must be f32: x %v weight %v", a.X, a.Weight)
	}
	for s := 0; s < n; s++ {
		if cu[s+1] < cu[s] {
			return shapeErr("conv cu_seqlens %v decreases", cu)
		}
	}
	sc := convScratchPool.Get().(*convScratch)
	defer convScratchPool.Put(sc)
	wT := b.convTaps(a.Weight, wt, ch, w)
	for s := 0; s < n; s++ {
		t0, t1 := int(cu[s]), int(cu[s+1])
		row := s
		if slots != nil {
			row = int(slots[s])
		}
		sc.job = convJob{out: out[t0*ch : t1*ch], x: x[t0*ch : t1*ch], wT: wT,
			state: st[row*(w-1)*ch : (row+1)*(w-1)*ch], t: t1 - t0, ch: ch, w: w}
		// Channels are independent: each piece is one contiguous range of
		// whole zmm vectors where the channels allow, so every call of the
		// vector kernels below covers that range (per-call costs dominated
		// with 64-channel blocks).
		b.pool.Run(convChannels, kernel.Args{Job: &sc.job}, ch, 16)
	}
	return nil
}

// stateSlots checks a state pool's indices (I32 [n], each in [0, p), no
// two alike: two sequences writing one state would race) and returns them.
func stateSlots(op string, idx compute.Tensor, n, p int) ([]int32, error) {
	if err := compute.CheckShape(op+" state indices", idx, compute.I32, n); err != nil {
		return nil, err
	}
	slots := I32(idx)
	if slots == nil {
		return nil, shapeErr("%s state indices %v are not a tensor of this backend", op, idx)
	}
	for i, v := range slots {
		if v < 0 || int(v) >= p {
			return nil, shapeErr("%s state index %d of sequence %d outside a pool of %d", op, v, i, p)
		}
		for _, u := range slots[:i] {
			if u == v {
				return nil, shapeErr("%s state index %d given to two sequences", op, v)
			}
		}
	}
	return slots, nil
}

type convJob struct {
	out, x, wT, state []float32
	t, ch, w          int
}

type convScratch struct{ job convJob }

// convTaps returns the conv taps wt ([ch, w], the checkpoint's layout)
// transposed to [w, ch], so that each tap is a vector over channels. The
// transpose is kept with the weight's storage (buffer.taps): weights do
// not change after loading, and a decode step would otherwise redo it for
// every token.
func (b *Backend) convTaps(t compute.Tensor, wt []float32, ch, w int) []float32 {
	buf := t.Mem.(*buffer) // wt is F32(t)
	b.tapsMu.Lock()
	defer b.tapsMu.Unlock()
	for _, c := range buf.taps {
		if c.off == t.Off && c.ch == ch && c.w == w {
			return c.v
		}
	}
	v := make([]float32, w*ch)
	for c := 0; c < ch; c++ {
		for tap := 0; tap < w; tap++ {
			v[tap*ch+c] = wt[c*w+tap]
		}
	}
	buf.taps = append(buf.taps, convTaps{off: t.Off, ch: ch, w: w, v: v})
	return v
}

// convTaps is one conv weight's taps transposed, [w, ch], for the view at
// element off of its storage.
type convTaps struct {
	off, ch, w int
	v          []float32
}

var convScratchPool = sync.Pool{New: func() any { return new(convScratch) }}

func convChannels(args *kernel.Args, lo, hi int) {
	convSeq(args.Job.(*convJob), lo, hi)
}

// convSeq convolves channels [c0, c1) of one sequence: input row i of the
// virtual sequence [state; x] is state row i for i < W-1, else x row
// i-(W-1). Each output sums its taps oldest first, like convStep, with
// products rounded before the sum. With four taps the rows whose taps all
// fall in x go sixteen channels at a time through kernel.ConvSiLU4 where
// it runs, with the same bits.
func convSeq(j *convJob, c0, c1 int) {
	ch, w := j.ch, j.w
	if w == 4 && j.t > w-1 {
		cols := (c1 - c0) &^ 15
		if kernel.ConvSiLU4(j.out[(w-1)*ch+c0:], j.x[c0:], j.wT[c0:], ch, j.t-(w-1), cols) {
			convRows(j, c0, c1, 0, w-1)
			convRows(j, c0+cols, c1, w-1, j.t)
			convState(j, c0, c1)
			return
		}
	}
	convRows(j, c0, c1, 0, j.t)
	convState(j, c0, c1)
}

// row returns channels [c0, c1) of row i of the virtual sequence.
func (j *convJob) row(i, c0, c1 int) []float32 {
	ch, w := j.ch, j.w
	if i < w-1 {
		return j.state[i*ch+c0 : i*ch+c1]
	}
	return j.x[(i-w+1)*ch+c0 : (i-w+1)*ch+c1]
}

// convRows computes output rows [i0, i1) for channels [c0, c1).
func convRows(j *convJob, c0, c1, i0, i1 int) {
	if c0 >= c1 {
		return
	}
	ch := j.ch
	for i := i0; i < i1; i++ {
		o := j.out[i*ch+c0 : i*ch+c1]
		clear(o)
		for tap := 0; tap < j.w; tap++ {
			kernel.MulAdd(o, j.wT[tap*ch+c0:tap*ch+c1], j.row(i+tap, c0, c1))
		}
		kernel.SiLUInPlace(o)
	}
}

// convState writes the new state, the last W-1 rows of [state; x]: row r
// takes virtual row t+r, and going up in r never reads a row already
// overwritten.
func convState(j *convJob, c0, c1 int) {
	ch := j.ch
	for r := 0; r < j.w-1; r++ {
		copy(j.state[r*ch+c0:r*ch+c1], j.row(j.t+r, c0, c1))
	}
}

// stepScratch holds KDAStep's intermediates for one call.
type stepScratch struct {
	raw, conv, fa, graw, braw, gate, ga, core []float32
	convs, states                             [][]float32 // per sequence
	records                                   []float32   // [rows, 6·H·D] or nil
	cu                                        []int32     // row offsets when the call gives a uniform count
	job                                       stepJob
}

// stepJob is the per-head part of KDAStep.
type stepJob struct {
	w                *compute.KDAWeights
	sc               *stepScratch
	alog, dtb, onorm []float32
	wt               []float32 // conv taps transposed, [width, 3·H·D]
	h, d, width      int
	cu               []int32 // row offsets per sequence
	// bounds[i] is the first item of part i: Run hands each worker one
	// part, a contiguous run of items holding about its share of the
	// tokens, since a sequence's items step all its tokens.
	bounds []int
}

// split fills j.bounds for per items a sequence over parts parts: an
// item costs its sequence's token count, and each part ends at the item
// whose middle passes the part's share of the total cost.
func (j *stepJob) split(per, parts int) {
	n := (len(j.cu) - 1) * per
	total := int(j.cu[len(j.cu)-1]) * per
	j.bounds = append(j.bounds[:0], 0)
	done, item := 0, 0
	for p := 1; p < parts; p++ {
		share := p * total / parts
		for item < n && 2*done+j.tokens(item/per) <= 2*share {
			done += j.tokens(item / per)
			item++
		}
		j.bounds = append(j.bounds, item)
	}
	j.bounds = append(j.bounds, n)
}

func (j *stepJob) tokens(s int) int { return int(j.cu[s+1] - j.cu[s]) }

// headScratch is one worker's q, k, g, o and decayed-key vectors.
type headScratch struct{ v []float32 }

var headScratchPool = sync.Pool{New: func() any { return new(headScratch) }}

// stepHeads steps the (sequence, head) items of parts [lo, hi), each
// through all its sequence's tokens in order.
func stepHeads(args *kernel.Args, lo, hi int) {
	j := args.Job.(*stepJob)
	h, d := j.h, j.d
	hs := headScratchPool.Get().(*headScratch)
	defer headScratchPool.Put(hs)
	hs.v = grow(hs.v, 6*d)
	q, k, g := hs.v[:d], hs.v[d:2*d], hs.v[2*d:3*d]
	o, ke, u := hs.v[3*d:4*d], hs.v[4*d:5*d], hs.v[5*d:6*d]
	for item := j.bounds[lo]; item < j.bounds[hi]; item++ {
		s, hh := item/h, item%h
		for row := int(j.cu[s]); row < int(j.cu[s+1]); row++ {
			stepHead(j, row, s, hh, q, k, g, o, ke, u)
		}
	}
}

// stepHead runs head hh of sequence s for the token in row.
func stepHead(j *stepJob, row, s, hh int, q, k, g, o, ke, u []float32) {
	w, sc, h, d := j.w, j.sc, j.h, j.d
	hd := h * d
	qkv := sc.conv[row*3*hd : (row+1)*3*hd]
	copy(q, qkv[hh*d:(hh+1)*d])
	copy(k, qkv[hd+hh*d:hd+(hh+1)*d])
	v := qkv[2*hd+hh*d : 2*hd+(hh+1)*d]
	l2norm(q)
	l2norm(k)
	kernel.Scale(q, float32(1/math.Sqrt(float64(d))))
	decayGate(g, sc.graw[row*hd+hh*d:row*hd+(hh+1)*d], j.dtb[hh*d:(hh+1)*d], j.alog[hh], w.Gate, w.LowerBound)
	beta := kernel.Sigmoid(sc.braw[row*h+hh])
	st := sc.states[s][hh*d*d : (hh+1)*d*d]
	var rec []float32
	if sc.records != nil {
		rec = sc.records[row*6*hd : (row+1)*6*hd]
		u = rec[2*hd+hh*d : 2*hd+(hh+1)*d]
	}
	kdaToken(st, q, k, g, v, beta, o, u, ke, d, d)
	if rec != nil {
		copy(rec[hh*d:(hh+1)*d], k)
		copy(rec[hd+hh*d:hd+(hh+1)*d], g) // now the decay factors
	}
	out := sc.core[row*hd+hh*d : row*hd+(hh+1)*d]
	kernel.RMSNorm(out, o, j.onorm, d, w.Eps)
	gate := sc.gate[row*hd+hh*d : row*hd+(hh+1)*d]
	kernel.SigmoidSlice(gate)
	kernel.Mul(out, out, gate)
}

// stepConv runs the short conv of the items of parts [lo, hi), an item
// being one of the q, k and v parts of one sequence: whole parts, so that
// each reads its conv state rows as long runs (per head, a row's 512-byte
// pieces lie kilobytes apart and each came from memory on its own). A
// token's conv needs only the conv state and the tokens before it, so
// each item runs all its sequence's tokens, before any recurrence.
func stepConv(args *kernel.Args, lo, hi int) {
	j := args.Job.(*stepJob)
	sc, hd := j.sc, j.h*j.d
	for item := j.bounds[lo]; item < j.bounds[hi]; item++ {
		s, part := item/3, item%3
		for row := int(j.cu[s]); row < int(j.cu[s+1]); row++ {
			convStep(sc.conv[row*3*hd:(row+1)*3*hd], sc.raw[row*3*hd:(row+1)*3*hd], j.wt, sc.convs[s], 3*hd, j.width, part*hd, (part+1)*hd)
		}
	}
}

var stepScratchPool = sync.Pool{New: func() any { return new(stepScratch) }}

// KDAStep runs a whole KDA layer for T tokens per sequence, stepped one
// after another: every weight is read once per call for all rows, and
// nothing is allocated once the scratch pool is warm.
func (b *Backend) KDAStep(a *compute.KDAStepArgs) error {
	w := a.W
	if w == nil || w.QKV.Rank != 2 || w.Conv.Rank != 2 {
		return shapeErr("kda step: missing or malformed weights")
	}
	h, d := w.NumHeads, w.HeadDim
	hd := h * d
	hidden := w.QKV.Dims[1]
	width := w.Conv.Dims[1]
	if a.X.Rank != 2 || a.X.Dims[1] != hidden {
		return shapeErr("kda step input %v, want [rows, %d]", a.X, hidden)
	}
	rows := a.X.Dims[0]
	sc := stepScratchPool.Get().(*stepScratch)
	defer stepScratchPool.Put(sc)
	cu := a.CuSeqlens
	if cu == nil {
		tokens := max(a.Tokens, 1)
		if rows%tokens != 0 {
			return shapeErr("kda step input %v, want [B·%d, %d]", a.X, tokens, hidden)
		}
		sc.cu = sc.cu[:0]
		for r := 0; r <= rows; r += tokens {
			sc.cu = append(sc.cu, int32(r))
		}
		cu = sc.cu
	}
	bsz := len(cu) - 1
	for s := range bsz {
		if cu[s+1]-cu[s] < 1 || cu[0] != 0 {
			return shapeErr("kda step cu_seqlens %v: every sequence needs a token", cu)
		}
	}
	if bsz < 1 || int(cu[bsz]) != rows {
		return shapeErr("kda step cu_seqlens %v for %d rows", cu, rows)
	}
	if a.Core.IsZero() {
		if err := compute.CheckShape("kda step output", a.Y, compute.F32, rows, hidden); err != nil {
			return err
		}
	} else if err := compute.CheckShape("kda step core", a.Core, compute.F32, rows, hd); err != nil {
		return err
	} else if F32(a.Core) == nil {
		return shapeErr("kda step core %v is not a tensor of this backend", a.Core)
	}
	sc.convs, sc.states = sc.convs[:0], sc.states[:0]
	if a.States != nil {
		if len(a.States) != bsz || len(a.Convs) != bsz {
			return shapeErr("kda step: %d states and %d conv states for %d sequences", len(a.States), len(a.Convs), bsz)
		}
		for i := range a.States {
			if err := compute.CheckShape("kda step conv state", a.Convs[i], compute.F32, width-1, 3*hd); err != nil {
				return err
			}
			if err := compute.CheckShape("kda step state", a.States[i], compute.F32, h, d, d); err != nil {
				return err
			}
			sc.convs, sc.states = append(sc.convs, F32(a.Convs[i])), append(sc.states, F32(a.States[i]))
		}
	} else {
		if err := compute.CheckShape("kda step conv state", a.Conv, compute.F32, bsz, width-1, 3*hd); err != nil {
			return err
		}
		if err := compute.CheckShape("kda step state", a.State, compute.F32, bsz, h, d, d); err != nil {
			return err
		}
		conv, state := F32(a.Conv), F32(a.State)
		for i := 0; i < bsz; i++ {
			sc.convs = append(sc.convs, conv[i*(width-1)*3*hd:(i+1)*(width-1)*3*hd])
			sc.states = append(sc.states, state[i*h*d*d:(i+1)*h*d*d])
		}
	}
	if w.QKV.Dims[0] != 3*hd || w.Conv.Dims[0] != 3*hd {
		return shapeErr("kda step: qkv %v conv %v for %d heads of %d", w.QKV, w.Conv, h, d)
	}
	sc.raw, sc.conv = grow(sc.raw, rows*3*hd), grow(sc.conv, rows*3*hd)
	sc.fa, sc.graw, sc.braw = grow(sc.fa, rows*d), grow(sc.graw, rows*hd), grow(sc.braw, rows*h)
	sc.gate, sc.core = grow(sc.gate, rows*hd), grow(sc.core, rows*hd)
	x := F32(a.X)
	mm := func(dst, src []float32, wt compute.Tensor, m int) error { return b.matmulHost(dst, src, wt, m) }
	given := !a.QKVIn.IsZero()
	if given {
		if err := stepProjected(sc, a, rows, h, hd); err != nil {
			return err
		}
	} else if err := mm(sc.raw, x, w.QKV, rows); err != nil {
		return err
	}
	sc.records = nil
	if !a.Records.IsZero() {
		if err := compute.CheckShape("kda step records", a.Records, compute.F32, rows, 6*hd); err != nil {
			return err
		}
		sc.records = F32(a.Records)
		for i := range rows {
			copy(sc.records[i*6*hd+3*hd:(i+1)*6*hd], sc.raw[i*3*hd:(i+1)*3*hd])
		}
	}
	if !given {
		if err := stepProjections(sc, mm, w, x, rows, d); err != nil {
			return err
		}
	}
	wt := F32(w.Conv)
	alog, dtb, onorm := F32(w.ALog), F32(w.DTBias), F32(w.ONorm)
	if wt == nil || len(alog) < h || len(dtb) != hd || len(onorm) != d {
		return shapeErr("kda step: conv %v, A_log %v, dt_bias %v, o_norm %v must be f32 for %d heads of %d", w.Conv, w.ALog, w.DTBias, w.ONorm, h, d)
	}
	wt = b.convTaps(w.Conv, wt, 3*hd, width)
	// The short conv, then the recurrence, the norm and the gate of every
	// (sequence, head) in parallel.
	sc.job = stepJob{w: w, sc: sc, alog: alog, dtb: dtb, onorm: onorm, h: h, d: d, wt: wt, width: width, cu: cu, bounds: sc.job.bounds}
	parts := min(b.pool.Pieces(), bsz*3)
	sc.job.split(3, parts)
	b.pool.Run(stepConv, kernel.Args{Job: &sc.job}, parts, 1)
	parts = min(b.pool.Pieces(), bsz*h)
	sc.job.split(h, parts)
	b.pool.Run(stepHeads, kernel.Args{Job: &sc.job}, parts, 1)
	if !a.Core.IsZero() {
		copy(F32(a.Core), sc.core[:rows*hd])
		return nil
	}
	return mm(F32(a.Y), sc.core, w.OProj, rows)
}

// stepProjections computes the step's projections of x other than q|k|v:
// the decay gate's low-rank pair, b_proj and the output gate.
func stepProjections(sc *stepScratch, mm func(dst, src []float32, wt compute.Tensor, m int) error, w *compute.KDAWeights, x []float32, rows, d int) error {
	if err := mm(sc.fa, x, w.FA, rows); err != nil {
		return err
	}
	if err := mm(sc.graw, sc.fa, w.FB, rows); err != nil {
		return err
	}
	if err := mm(sc.braw, x, w.B, rows); err != nil {
		return err
	}
	if !w.G.IsZero() {
		return mm(sc.gate, x, w.G, rows)
	}
	sc.ga = grow(sc.ga, rows*d)
	if err := mm(sc.ga, x, w.GA, rows); err != nil {
		return err
	}
	return mm(sc.gate, sc.ga, w.GB, rows)
}

// stepProjected takes the step's projections from the caller
// (KDAStepArgs.QKVIn and the rest), checked.
func stepProjected(sc *stepScratch, a *compute.KDAStepArgs, rows, h, hd int) error {
	if err := compute.CheckShape("kda step q|k|v in", a.QKVIn, compute.F32, rows, 3*hd); err != nil {
		return err
	}
	if err := compute.CheckShape("kda step gate in", a.GIn, compute.F32, rows, hd); err != nil {
		return err
	}
	if err := compute.CheckShape("kda step beta in", a.BetaIn, compute.F32, rows, h); err != nil {
		return err
	}
	if err := compute.CheckShape("kda step output gate in", a.GateIn, compute.F32, rows, hd); err != nil {
		return err
	}
	qkv, g, beta, gate := F32(a.QKVIn), F32(a.GIn), F32(a.BetaIn), F32(a.GateIn)
	if qkv == nil || g == nil || beta == nil || gate == nil {
		return shapeErr("kda step: projections given that are not tensors of this backend")
	}
	copy(sc.raw, qkv)
	copy(sc.graw, g)
	copy(sc.braw, beta)
	copy(sc.gate, gate)
	return nil
}

// convStep convolves one token for channels [c0, c1) of rows ch wide and
// shifts those channels of the conv state (W-1 rows, oldest first). wT holds
// the taps as [W, ch]. Same order and rounding as convSeq: oldest tap
// first, each product rounded before the sum.
func convStep(out, x, wT, state []float32, ch, w, c0, c1 int) {
	o := out[c0:c1]
	clear(o)
	for t := 0; t < w-1; t++ {
		kernel.MulAdd(o, wT[t*ch+c0:t*ch+c1], state[t*ch+c0:t*ch+c1])
	}
	kernel.MulAdd(o, wT[(w-1)*ch+c0:(w-1)*ch+c1], x[c0:c1])
	for t := 0; t+1 < w-1; t++ {
		copy(state[t*ch+c0:t*ch+c1], state[(t+1)*ch+c0:(t+1)*ch+c1])
	}
	if w > 1 {
		copy(state[(w-2)*ch+c0:(w-2)*ch+c1], x[c0:c1])
	}
	kernel.SiLUInPlace(o)
}
