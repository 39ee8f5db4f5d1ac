package cpu

import (
	"fmt"
	"math"
	"sync"

	"k3/compute"
	"k3/internal/kernel"
)

// kdaJob is one KDAChunk call, split over (sequence, head) items.
type kdaJob struct {
	a                 *compute.KDAArgs
	q, k, v, g, beta  []float32
	alog, dtb         []float32
	state, out        []float32
	cu                []int32
	h, dk, dv, nseq   int
	slots             []int32 // the pool rows of the sequences' states; nil: row s
	qStride, vStride  int     // elements per token of q and k, and of v
	chunk             int
	scale, lowerBound float32
	records           []float32 // [T, 6·H·D] replay records, or nil
}

// kdaScratch holds one (sequence, head) item's working set.
type kdaScratch struct {
	q, k, v, g, beta []float32 // the item's tokens, preprocessed, contiguous
	u, o             []float32 // per chunk: [C, V]
	kd, qd           []float32 // decayed keys/queries [C, K], views of kq
	kq, uo           []float32 // [kd; qd] [2C, K] and its product with the state [2C, V]
	ka, kb, qa       []float32 // factorised decays [C, K]
	lm, mqk          []float32 // [C, C]
	sk               []float32 // the state K-first over a sequence's chunks [K, V]
	kdt              []float32 // state update: (k e^{G_last-G})ᵀ [K, C]
	cg, e            []float32 // cumulative gates, exponentials [C, K]
	unsafe           []int32
	uk, uq, ug, ue   []float32 // the unsafe channels' keys, queries, gates and pair terms [C, U]
	ur               []float32 // one row's pair sums for L and Mqk [2C]
	lmc, mqkc        []float32 // blockedLocal's L and Mqk [C, C] (swapped into lm, mqk)
	cgb, sb          []float32 // blockedLocal: a block's gates summed from its start, spans back to its anchor
	kbo, ko, lo      []float32 // blockedLocal: the earlier rows' factors, the block's, their products
	tmp              []float32
	macc             []float32 // MatAccumulate's scratch
	nl               []float32 // a block's rows of -L over the rows before it
}

var kdaScratchPool = sync.Pool{New: func() any { return new(kdaScratch) }}

// safeSpan bounds the decay span of a chunk channel over which the
// factorised form e^{G_i-G_0}·e^{G_0-G_j} is used; beyond it e^{G_0-G_j}
// could overflow float32, and that channel's terms are exponentiated pair
// by pair instead (only differences G_i - G_j with i >= j).
const safeSpan = 60

// decayFlush is the log decay below which the chunk stage takes a decay
// factor as 0. The terms it drops are at most e^-40 (4e-18) of their
// undecayed size, far below float32's resolution of the sums they join;
// kept, they would carry keys, queries and state entries toward the
// subnormal range, whose arithmetic some CPUs run a hundred times slower
// (docs/bench: a repeated-token prompt on an Intel Xeon). The factorised
// decays of the chunk-local stage are not flushed: their products restore
// spans up to safeSpan.
const decayFlush = -40

// KDAChunk runs the KDA core over packed sequences.
func (b *Backend) KDAChunk(a *compute.KDAArgs) error {
	j, err := b.kdaPrepare(a)
	if err != nil {
		return err
	}
	b.pool.Run(kdaRange, kernel.Args{Job: j}, j.nseq*j.h, 1)
	return nil
}

func (b *Backend) kdaPrepare(a *compute.KDAArgs) (*kdaJob, error) {
	var t, h, dk, dv int
	switch {
	case !a.QKV.IsZero():
		if a.G.Rank != 3 || a.QKV.Rank != 2 || a.QKV.Dims[1] != 3*a.G.Dims[1]*a.G.Dims[2] {
			return nil, shapeErr("kda qkv %v for gate %v, want [T, 3·H·D]", a.QKV, a.G)
		}
		t, h, dk = a.G.Dims[0], a.G.Dims[1], a.G.Dims[2]
		dv = dk
	case a.Q.Rank != 3:
		return nil, shapeErr("kda q %v, want [T, H, K]", a.Q)
	default:
		t, h, dk = a.Q.Dims[0], a.Q.Dims[1], a.Q.Dims[2]
		if a.V.Rank != 3 || a.V.Dims[0] != t || a.V.Dims[1] != h {
			return nil, shapeErr("kda v %v for q %v", a.V, a.Q)
		}
		dv = a.V.Dims[2]
	}
	j := &kdaJob{a: a, h: h, dk: dk, dv: dv, chunk: a.ChunkSize, scale: a.Scale, lowerBound: a.LowerBound,
		qStride: h * dk, vStride: h * dv}
	var err error
	get := func(name string, x compute.Tensor, dims ...int) []float32 {
		if err != nil {
			return nil
		}
		if err = compute.CheckShape("kda "+name, x, compute.F32, dims...); err != nil {
			return nil
		}
		return F32(x)
	}
	if !a.QKV.IsZero() {
		all := get("qkv", a.QKV, t, 3*h*dk)
		if all != nil {
			hd := h * dk
			j.q, j.k, j.v = all, all[hd:], all[2*hd:]
			j.qStride, j.vStride = 3*hd, 3*hd
		}
	} else {
		j.q = get("q", a.Q, t, h, dk)
		j.k = get("k", a.K, t, h, dk)
		j.v = get("v", a.V, t, h, dv)
	}
	j.g = get("g", a.G, t, h, dk)
	j.beta = get("beta", a.Beta, t, h)
	j.out = get("out", a.Out, t, h, dv)
	if err != nil {
		return nil, err
	}
	j.cu = a.CuSeqlens
	if j.cu == nil {
		j.cu = []int32{0, int32(t)}
	}
	j.nseq = len(j.cu) - 1
	if j.nseq < 1 || j.cu[0] != 0 || int(j.cu[j.nseq]) != t {
		return nil, shapeErr("kda cu_seqlens %v for %d tokens", j.cu, t)
	}
	for i := 0; i < j.nseq; i++ {
		if j.cu[i+1] < j.cu[i] {
			return nil, shapeErr("kda cu_seqlens %v decreases", j.cu)
		}
	}
	if a.StateIdx.IsZero() {
		j.state, j.slots = get("state", a.State, j.nseq, h, dv, dk), nil
	} else if a.State.Rank != 4 {
		return nil, shapeErr("kda state pool %v, want [P, %d, %d, %d]", a.State, h, dv, dk)
	} else if j.state = get("state", a.State, a.State.Dims[0], h, dv, dk); err == nil {
		j.slots, err = stateSlots("kda", a.StateIdx, j.nseq, a.State.Dims[0])
	}
	if a.Gate != compute.GateGiven {
		j.alog = get("A_log", a.ALog, h)
		j.dtb = get("dt_bias", a.DTBias, h*dk)
	}
	if err != nil {
		return nil, err
	}
	switch a.Gate {
	case compute.GateGiven, compute.GateSoftplus:
	case compute.GateLowerBound:
		if !(a.LowerBound < 0) {
			return nil, fmt.Errorf("cpu: kda: gate lower bound %g must be negative", a.LowerBound)
		}
	default:
		return nil, fmt.Errorf("cpu: kda: gate mode %d: %w", a.Gate, compute.ErrUnsupported)
	}
	if j.chunk < 0 {
		return nil, fmt.Errorf("cpu: kda: chunk size %d", j.chunk)
	}
	if !a.Records.IsZero() {
		// The records' last part is the raw projections, copied here; the
		// recurrence writes the rest, head by head.
		hd := h * dk
		if j.chunk != 0 || dv != dk {
			return nil, fmt.Errorf("cpu: kda: replay records with chunk size %d, key width %d and value width %d (want token by token, equal widths): %w", j.chunk, dk, dv, compute.ErrUnsupported)
		}
		j.records = get("records", a.Records, t, 6*hd)
		raw := get("raw projections", a.Raw, t, 3*hd)
		if err != nil {
			return nil, err
		}
		for r := range t {
			copy(j.records[r*6*hd+3*hd:(r+1)*6*hd], raw[r*3*hd:(r+1)*3*hd])
		}
	}
	return j, nil
}

// grow returns s resized to n, reallocating with room to spare so that
// a buffer that grows with the context (one more key per decode step)
// reallocates only logarithmically often.
func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n, max(n, 2*cap(s)))
	}
	return s[:n]
}

func kdaRange(args *kernel.Args, lo, hi int) {
	j := args.Job.(*kdaJob)
	sc := kdaScratchPool.Get().(*kdaScratch)
	defer kdaScratchPool.Put(sc)
	for item := lo; item < hi; item++ {
		n, hd := item/j.h, item%j.h
		t0, t1 := int(j.cu[n]), int(j.cu[n+1])
		if t1 == t0 {
			continue
		}
		row := n
		if j.slots != nil {
			row = int(j.slots[n])
		}
		st := j.state[(row*j.h+hd)*j.dk*j.dv : (row*j.h+hd+1)*j.dk*j.dv]
		// The head's tokens are gathered a block at a time, so that the
		// rows stay in L2 from their gather to their chunk's products
		// (a long prompt's whole head is megabytes).
		blk := kdaLoadBlock
		if j.chunk > 0 {
			blk = max(j.chunk, kdaLoadBlock/j.chunk*j.chunk)
		}
		if j.chunk == 0 {
			for b0 := t0; b0 < t1; b0 += blk {
				b1 := min(b0+blk, t1)
				j.load(sc, hd, b0, b1)
				j.recurrent(sc, st, hd, b0, b1)
			}
			continue
		}
		// The chunks run on the state K-first (row k = S[k, :]), where
		// both of a chunk's state products are register-tiled GEMMs
		// (kernel.MatAccumulate) with the state as their B operand.
		sc.sk = grow(sc.sk, j.dk*j.dv)
		kernel.Transpose(sc.sk, st, j.dv, j.dk)
		for b0 := t0; b0 < t1; b0 += blk {
			b1 := min(b0+blk, t1)
			j.load(sc, hd, b0, b1)
			for c0 := 0; c0 < b1-b0; c0 += j.chunk {
				j.chunkStep(sc, sc.sk, hd, b0, c0, min(c0+j.chunk, b1-b0))
			}
		}
		kernel.Transpose(st, sc.sk, j.dk, j.dv)
	}
}

// solveBlock is how many rows of a chunk's triangular solve take the rows
// before them as one matrix product.
const solveBlock = 8

// kdaLoadBlock is how many of a head's tokens kdaRange gathers at a time
// (rounded down to whole chunks): four rows of q, k, v and the gate a
// token, 512 KB at 128 channels.
const kdaLoadBlock = 256

// load gathers head hd of tokens [t0, t1) and applies the token-parallel
// preprocessing: L2 norm of q and k, the decay gate, sigmoid of beta, and
// the output scale folded into q. Every element gets the decode step's
// arithmetic (stepHead), whole rows at a time.
func (j *kdaJob) load(sc *kdaScratch, hd, t0, t1 int) {
	n, dk, dv := t1-t0, j.dk, j.dv
	sc.q, sc.k, sc.g = grow(sc.q, n*dk), grow(sc.k, n*dk), grow(sc.g, n*dk)
	sc.v, sc.beta = grow(sc.v, n*dv), grow(sc.beta, n)
	qk := t0*j.qStride + hd*dk
	kernel.GatherRows(sc.q, j.q[qk:], n, dk, j.qStride)
	kernel.GatherRows(sc.k, j.k[qk:], n, dk, j.qStride)
	kernel.GatherRows(sc.v, j.v[t0*j.vStride+hd*dv:], n, dv, j.vStride)
	kernel.GatherRows(sc.g, j.g[(t0*j.h+hd)*dk:], n, dk, j.h*dk)
	for i := 0; i < n; i++ {
		sc.beta[i] = j.beta[(t0+i)*j.h+hd]
	}
	if j.a.Preprocess {
		for i := 0; i < n; i++ {
			l2norm(sc.q[i*dk : (i+1)*dk])
			l2norm(sc.k[i*dk : (i+1)*dk])
			sc.beta[i] = kernel.Sigmoid(sc.beta[i])
		}
	}
	kernel.Scale(sc.q, j.scale)
	if j.a.Gate != compute.GateGiven {
		decayGate(sc.g, sc.g, j.dtb[hd*dk:(hd+1)*dk], j.alog[hd], j.a.Gate, j.lowerBound)
	}
}

func l2norm(x []float32) {
	ss := float64(kernel.Dot(x, x))
	kernel.Scale(x, float32(1/math.Sqrt(ss+1e-6)))
}

// recurrent runs the delta rule token by token (the oracle of the chunked
// form and the decode step): decay, read, write and output, one pass over
// the state per token.
func (j *kdaJob) recurrent(sc *kdaScratch, st []float32, hd, t0, t1 int) {
	dk, dv := j.dk, j.dv
	sc.tmp = grow(sc.tmp, 2*dv+dk)
	o, u, ke := sc.tmp[:dv], sc.tmp[dv:2*dv], sc.tmp[2*dv:]
	w := j.h * dk // a record part's width
	for i := 0; i < t1-t0; i++ {
		q, k, g := sc.q[i*dk:(i+1)*dk], sc.k[i*dk:(i+1)*dk], sc.g[i*dk:(i+1)*dk]
		v := sc.v[i*dv : (i+1)*dv]
		var rec []float32
		if j.records != nil {
			// The fused step's record of the token (KDAStepArgs.Records).
			rec = j.records[(t0+i)*6*w : (t0+i+1)*6*w]
			u = rec[2*w+hd*dv : 2*w+(hd+1)*dv]
		}
		kdaToken(st, q, k, g, v, sc.beta[i], o, u, ke, dk, dv)
		if rec != nil {
			copy(rec[hd*dk:(hd+1)*dk], k)
			copy(rec[w+hd*dk:w+(hd+1)*dk], g) // now the decay factors
		}
		copy(j.out[((t0+i)*j.h+hd)*dv:], o)
	}
}

// kdaToken advances state st (V-first: row v holds S[:, v] over the key
// channels) by one token and writes the output (q already scaled) to o and
// the corrected values β(v - (Diag(α)S)ᵀk) to u. ke is scratch of dk; g is
// the log decay and is overwritten with the decay factors α.
func kdaToken(st, q, k, g, v []float32, beta float32, o, u, ke []float32, dk, dv int) {
	kernel.ExpSlice(g)
	kernel.Mul(ke, k, g)
	// Row by row, so each state row comes from memory once: its read for
	// (S e^g)ᵀk and its update both hit L1. The state of a batch of sessions
	// outgrows the caches, and this is the traffic that decode pays for it.
	kernel.KDARows(st[:dv*dk], ke[:dk], g[:dk], k[:dk], q[:dk], v[:dv], o[:dv], u[:dv], beta)
}

// chunkStep processes tokens [c0, c1) of the item (a chunk), its state sk
// K-first ([K, V], row k = S[k, :]), in the WY form:
// the chunk-local stage (cumulative gates, the strictly lower L and the
// inclusive Mqk, decayed keys and queries) needs no state; the state stage
// then solves (I + L) U = β(V - S0ᵀ(k e^G)) by forward substitution,
// outputs O = S0ᵀ(q e^G) + Mqk U and advances
// S1 = diag(e^{G_last}) S0 + Σ_j (k_j e^{G_last-G_j}) u_jᵀ.
func (j *kdaJob) chunkStep(sc *kdaScratch, sk []float32, hd, t0, c0, c1 int) {
	dk, dv, c := j.dk, j.dv, c1-c0
	sc.kq, sc.uo = grow(sc.kq, 2*c*dk), grow(sc.uo, 2*c*dv)
	sc.kd, sc.qd = sc.kq[:c*dk], sc.kq[c*dk:2*c*dk]
	sc.tmp = grow(sc.tmp, 2*dk)
	gLast := sc.tmp[dk:] // cumulative gate of the chunk's last token
	q, k, g := sc.q[c0*dk:c1*dk], sc.k[c0*dk:c1*dk], sc.g[c0*dk:c1*dk]
	v, beta := sc.v[c0*dv:c1*dv], sc.beta[c0:c1]

	// Chunk-local stage. Cumulative gates stay in log space; every factor
	// is an exponential of a difference, computed eight at a time.
	sc.cg, sc.e = grow(sc.cg, c*dk), grow(sc.e, c*dk)
	clear(sc.cg[:dk])
	prev := sc.cg[:dk]
	for i := 0; i < c; i++ {
		row := sc.cg[i*dk : (i+1)*dk]
		kernel.Add(row, prev, g[i*dk:(i+1)*dk])
		prev = row
	}
	copy(gLast, prev)
	// e^{G_i} <= 1, relative to the chunk start: kd = k e^G, qd = q e^G.
	// (kernel.ExpScale forms each factor and its products in one pass.)
	kernel.ExpScale(sc.kd, sc.qd, k, q, sc.cg, dk, nil, 0, c, dk, decayFlush, sc.e)
	if c > subChunk && kernel.Max(g) <= 0 {
		j.blockedLocal(sc, hd, t0, c0, c1)
	} else {
		j.local(sc, hd, t0, c0, c1, sc.cg)
	}

	// State stage: P = (k e^G)·S into u and O = (q e^G)·S into o, one
	// product over the state for both, so the state is read once.
	sc.macc = grow(sc.macc, kernel.MatAccumulateScratch(max(dk, c)))
	clear(sc.uo)
	kernel.MatAccumulate(sc.uo, dv, sc.kq, sk, dv, 2*c, dv, dk, sc.macc)
	// (I + L) U = β(V - P) by forward substitution, in place in P; then
	// O += Mqk U in one product, Mqk's upper triangle cleared.
	sc.u, sc.o = sc.uo[:c*dv], sc.uo[c*dv:2*c*dv]
	kernel.Sub(sc.u, v, sc.u)
	// Row i is β_i(v_i - p_i) - Σ_{j<i} L_ij u_j, one FMA chain per element
	// over j in order: in blocks of solveBlock rows, the terms of the rows
	// before the block as one product, then those within it row by row.
	// (The product's FMA chains are Axpy's where the value width is a
	// multiple of 64, which the tile covers whole; otherwise one block.)
	blk := c
	if dv%64 == 0 {
		blk = solveBlock
	}
	for b0 := 0; b0 < c; b0 += blk {
		b1 := min(b0+blk, c)
		for i := b0; i < b1; i++ {
			kernel.Scale(sc.u[i*dv:(i+1)*dv], beta[i])
		}
		if b0 > 0 {
			sc.nl = grow(sc.nl, (b1-b0)*b0)
			for i := b0; i < b1; i++ {
				for jj, l := range sc.lm[i*c : i*c+b0] {
					sc.nl[(i-b0)*b0+jj] = -l
				}
			}
			kernel.MatAccumulate(sc.u[b0*dv:], dv, sc.nl, sc.u, dv, b1-b0, dv, b0, sc.macc)
		}
		for i := b0; i < b1; i++ {
			ui := sc.u[i*dv : (i+1)*dv]
			for jj := b0; jj < i; jj++ {
				kernel.Axpy(ui, -sc.lm[i*c+jj], sc.u[jj*dv:(jj+1)*dv])
			}
		}
	}
	for i := 0; i < c; i++ {
		clear(sc.mqk[i*c+i+1 : (i+1)*c])
	}
	kernel.MatAccumulate(sc.o, dv, sc.mqk, sc.u, dv, c, dv, c, sc.macc)
	for i := 0; i < c; i++ {
		copy(j.out[((t0+c0+i)*j.h+hd)*dv:], sc.o[i*dv:(i+1)*dv])
	}
	// k_j e^{G_last - G_j} (e^{G_j} alone may have underflowed, so it is not
	// derived from kd).
	kernel.ExpScale(sc.kd, nil, k, nil, gLast, 0, sc.cg, dk, c, dk, decayFlush, sc.e)
	// S1 = diag(e^{G_last}) S0 + Σ_j (k_j e^{G_last-G_j}) u_jᵀ: row k of
	// S scaled by e^{G_last}[k] as the tile loads it, then one FMA chain
	// per element over the chunk: the decayed keys transposed, each
	// element broadcast against a row of U, six state rows at a time.
	kernel.ExpSliceFlush(gLast, decayFlush)
	sc.kdt = grow(sc.kdt, dk*c)
	kernel.Transpose(sc.kdt, sc.kd, c, dk)
	kernel.MatAccumulateScaled(sk, dv, gLast, sc.kdt, sc.u, dv, dk, dv, c, sc.macc)
}

// subChunk is the row block of a longer chunk's local stage
// (blockedLocal).
const subChunk = 16

// local fills L (β-scaled, strictly lower part used) and Mqk (lower with
// the diagonal) of rows [c0, c1) as [C, C] in sc.lm and sc.mqk, C =
// c1-c0, from cg, the rows' gates summed from c0 (row i: G_i - G_{c0-1}).
// Channels whose decay over the rows spans at most safeSpan take the
// factorised form anchored at the first row; the others' terms are
// exponentiated pair by pair (unsafeTerms).
func (j *kdaJob) local(sc *kdaScratch, hd, t0, c0, c1 int, cg []float32) {
	dk, c := j.dk, c1-c0
	q, k, beta := sc.q[c0*dk:c1*dk], sc.k[c0*dk:c1*dk], sc.beta[c0:c1]
	sc.ka, sc.kb, sc.qa = grow(sc.ka, c*dk), grow(sc.kb, c*dk), grow(sc.qa, c*dk)
	sc.lm, sc.mqk = grow(sc.lm, c*c), grow(sc.mqk, c*c)
	last := cg[(c-1)*dk : c*dk]
	sc.unsafe = sc.unsafe[:0]
	for ch := 0; ch < dk; ch++ {
		if cg[ch]-last[ch] > safeSpan {
			sc.unsafe = append(sc.unsafe, int32(ch))
		}
	}
	// Factorised decays for safe channels, anchored at the first token:
	// ka_i = k_i e^{G_i - G_0}, qa_i = q_i e^{G_i - G_0}, kb_j = k_j e^{G_0 - G_j}.
	noFlush := float32(math.Inf(-1))
	kernel.ExpScale(sc.ka, sc.qa, k, q, cg, dk, cg[:dk], 0, c, dk, noFlush, sc.e)
	kernel.ExpScale(sc.kb, nil, k, nil, cg[:dk], 0, cg, dk, c, dk, noFlush, sc.e)
	// Zero the unsafe channels of the factors; their terms are added exactly.
	for _, ch := range sc.unsafe {
		for i := 0; i < c; i++ {
			sc.ka[i*dk+int(ch)], sc.qa[i*dk+int(ch)], sc.kb[i*dk+int(ch)] = 0, 0, 0
		}
	}
	// L (strictly lower part used) and Mqk (lower with the diagonal) as
	// full products: the unused upper halves cost less than pairwise dots.
	kernel.MatMulSerial(sc.lm, sc.ka, sc.kb, c, c, dk)
	kernel.MatMulSerial(sc.mqk, sc.qa, sc.kb, c, c, dk)
	for i := 0; i < c; i++ {
		kernel.Scale(sc.lm[i*c:i*c+i+1], beta[i])
	}
	if len(sc.unsafe) > 0 {
		j.unsafeTerms(sc, hd, t0, c0, c1)
	}
}

// blockedLocal is local for a chunk longer than subChunk whose gates all
// decay (g <= 0), in blocks of subChunk rows, so that no channel's
// factors span the whole chunk: the diagonal blocks are local's, with
// gates summed from the block's start; block (I, J) below them, I > J,
// takes e^{G_i-G_j} = e^{G_i-G_a}·e^{G_a-G_j} anchored at a, the last row
// before block I, where both factors are at most 1 for any span, so no
// channel needs the pair-by-pair path there, and factors below e^-40
// (decayFlush) are 0. A chunk of 64 so does the chunk-16 form's
// diagonal work, the blocks below it and a quarter of its state passes
// (still slower than chunks of 16 on the CPUs measured: docs/bench).
func (j *kdaJob) blockedLocal(sc *kdaScratch, hd, t0, c0, c1 int) {
	dk, c := j.dk, c1-c0
	q, k, g, beta := sc.q[c0*dk:c1*dk], sc.k[c0*dk:c1*dk], sc.g[c0*dk:c1*dk], sc.beta[c0:c1]
	sc.lmc, sc.mqkc = grow(sc.lmc, c*c), grow(sc.mqkc, c*c)
	sc.cgb, sc.sb = grow(sc.cgb, subChunk*dk), grow(sc.sb, c*dk)
	sc.kbo, sc.ko = grow(sc.kbo, c*dk), grow(sc.ko, 2*subChunk*dk)
	sc.lo = grow(sc.lo, 2*subChunk*c)
	for r0 := 0; r0 < c; r0 += subChunk {
		r1 := min(r0+subChunk, c)
		n := r1 - r0
		// Gates summed from the block's start, as local takes them: row i
		// holds G_{r0+i} - G_{r0-1}.
		cgb := sc.cgb[:n*dk]
		copy(cgb[:dk], g[r0*dk:(r0+1)*dk])
		for i := 1; i < n; i++ {
			kernel.Add(cgb[i*dk:(i+1)*dk], cgb[(i-1)*dk:i*dk], g[(r0+i)*dk:(r0+i+1)*dk])
		}
		j.local(sc, hd, t0, c0+r0, c0+r1, cgb)
		for i := 0; i < n; i++ {
			copy(sc.lmc[(r0+i)*c+r0:(r0+i)*c+r1], sc.lm[i*n:(i+1)*n])
			copy(sc.mqkc[(r0+i)*c+r0:(r0+i)*c+r1], sc.mqk[i*n:(i+1)*n])
		}
		if r0 == 0 {
			continue
		}
		// Rows of block I: k_i e^{G_i-G_a} and q_i e^{G_i-G_a} (cgb);
		// the rows before it: k_j e^{G_a-G_j}, each span summed back from a.
		ka, qa := sc.ko[:n*dk], sc.ko[n*dk:2*n*dk]
		kernel.ExpScale(ka, qa, k[r0*dk:r1*dk], q[r0*dk:r1*dk], cgb, dk, nil, 0, n, dk, decayFlush, sc.e)
		sb := sc.sb[:r0*dk]
		clear(sb[(r0-1)*dk:])
		for jj := r0 - 2; jj >= 0; jj-- {
			kernel.Add(sb[jj*dk:(jj+1)*dk], sb[(jj+1)*dk:(jj+2)*dk], g[(jj+1)*dk:(jj+2)*dk])
		}
		kb := sc.kbo[:r0*dk]
		kernel.ExpScale(kb, nil, k[:r0*dk], nil, sb, dk, nil, 0, r0, dk, decayFlush, sc.e)
		// Both products at once: [ka; qa] against the earlier rows.
		lo := sc.lo[:2*n*r0]
		kernel.MatMulSerial(lo, sc.ko[:2*n*dk], kb, 2*n, r0, dk)
		for i := 0; i < n; i++ {
			row := (r0 + i) * c
			kernel.MulScale(sc.lmc[row:row+r0], lo[i*r0:(i+1)*r0], nil, beta[r0+i])
			copy(sc.mqkc[row:row+r0], lo[(n+i)*r0:(n+i+1)*r0])
		}
	}
	sc.lm, sc.lmc = sc.lmc, sc.lm
	sc.mqk, sc.mqkc = sc.mqkc, sc.mqk
}

// unsafeTerms adds to L and Mqk the contributions of channels whose decay
// span is too wide for the factorised form, exponentiating G_i - G_j for
// each pair i >= j. The unsafe channels are gathered first ([C, U] rows),
// so that row i of L and Mqk takes one vector exponential over its pairs'
// spans and two matrix-vector products. Each span is summed backwards
// from j = i, so a near pair's span carries no rounding of the large
// cumulative gates. Where every gate is a decay (g <= 0) the spans only
// fall as j goes back, and the pairs past the first whose exponentials
// are all 0 are left out.
func (j *kdaJob) unsafeTerms(sc *kdaScratch, hd, t0, c0, c1 int) {
	dk, c, n := j.dk, c1-c0, len(sc.unsafe)
	q, k, g := sc.q[c0*dk:c1*dk], sc.k[c0*dk:c1*dk], sc.g[c0*dk:c1*dk]
	beta := sc.beta[c0:c1]
	sc.uk, sc.uq, sc.ug = grow(sc.uk, c*n), grow(sc.uq, c*n), grow(sc.ug, c*n)
	sc.ue, sc.ur = grow(sc.ue, c*n), grow(sc.ur, 2*c)
	decays := true
	for i := 0; i < c; i++ {
		for x, ch := range sc.unsafe {
			sc.uk[i*n+x], sc.uq[i*n+x], sc.ug[i*n+x] = k[i*dk+int(ch)], q[i*dk+int(ch)], g[i*dk+int(ch)]
			decays = decays && sc.ug[i*n+x] <= 0
		}
	}
	if n < unsafeFew {
		unsafeFewTerms(sc, c, n, beta, decays)
		return
	}
	for i := 0; i < c; i++ {
		// Rows j0..i of ue: the spans G_i - G_j of pairs (i, j).
		ue := sc.ue
		clear(ue[i*n : (i+1)*n])
		j0 := 0
		for jj := i - 1; jj >= 0; jj-- {
			kernel.Add(ue[jj*n:(jj+1)*n], ue[(jj+1)*n:(jj+2)*n], sc.ug[(jj+1)*n:(jj+2)*n])
			if decays && kernel.Max(ue[jj*n:(jj+1)*n]) < decayFlush {
				j0 = jj + 1
				break
			}
		}
		m := i + 1 - j0
		blk := ue[j0*n : (i+1)*n]
		kernel.ExpSliceFlush(blk, decayFlush)
		kernel.Mul(blk, blk, sc.uk[j0*n:(i+1)*n]) // k_j e^{G_i-G_j}
		lm, mq := sc.ur[:m], sc.ur[c:c+m]
		kernel.MatMulSerial(lm, sc.uk[i*n:(i+1)*n], blk, 1, m, n)
		kernel.MatMulSerial(mq, sc.uq[i*n:(i+1)*n], blk, 1, m, n)
		for x := 0; x < m; x++ {
			sc.lm[i*c+j0+x] += beta[i] * lm[x]
			sc.mqk[i*c+j0+x] += mq[x]
		}
	}
}

// unsafeFew is the channel count below which unsafeTerms runs
// unsafeFewTerms: a chunk seldom has more than one or two unsafe
// channels, and the general loop then makes hundreds of kernel calls on
// vectors of that length. A variable so that tests can take either.
var unsafeFew = 8

// unsafeFewTerms is unsafeTerms' loop for n < 8 gathered channels, with
// the same arithmetic: the spans summed backwards in the same order, the
// flushed exponential (kernel.Exp, the vector one's bits), the two
// matrix-vector products as the dot-form tiles sum fewer than eight
// terms (fewDot).
func unsafeFewTerms(sc *kdaScratch, c, n int, beta []float32, decays bool) {
	var span, kd [8]float32
	for i := 0; i < c; i++ {
		uki, uqi := sc.uk[i*n:(i+1)*n], sc.uq[i*n:(i+1)*n]
		clear(span[:n])
		for jj := i; jj >= 0; jj-- {
			if jj < i {
				for x := range n {
					span[x] += sc.ug[(jj+1)*n+x]
				}
				top := span[0] // kernel.Max's
				for _, s := range span[1:n] {
					if s > top {
						top = s
					}
				}
				if decays && top < decayFlush {
					break
				}
			}
			for x := range n {
				e := float32(0)
				if !(span[x] < decayFlush) { // as ExpSliceFlush: NaN stays NaN
					e = kernel.Exp(span[x])
				}
				kd[x] = e * sc.uk[jj*n+x] // k_j e^{G_i-G_j}
			}
			sc.lm[i*c+jj] += beta[i] * fewDot(uki, kd[:n])
			sc.mqk[i*c+jj] += fewDot(uqi, kd[:n])
		}
	}
}

// fewDot is the dot-form tiles' sum of fewer than eight products
// (kernel's dot4): even and odd terms in two chains, then their sum (the
// tiles add it to a zero, which changes nothing: neither chain can be
// -0).
func fewDot(x, w []float32) float32 {
	var a, b float32
	i := 0
	for ; i+2 <= len(x); i += 2 {
		a += x[i] * w[i]
		b += x[i+1] * w[i+1]
	}
	if i < len(x) {
		a += x[i] * w[i]
	}
	return a + b
}

// decayGate writes one head's log decay for tokens from the raw gate
// projection (g and raw hold rows as long as dtBias; g may be raw): Kimi
// Linear's -exp(A_log)·softplus(raw + dt_bias), or K3's
// lowerBound·sigmoid(exp(A_log)·(raw + dt_bias)). Prefill and the decode
// step share it, so both paths decay alike.
func decayGate(g, raw, dtBias []float32, aLog float32, gate compute.KDAGate, lowerBound float32) {
	rate := float32(math.Exp(float64(aLog)))
	d := len(dtBias)
	for r := 0; r < len(g); r += d {
		kernel.Add(g[r:r+d], raw[r:r+d], dtBias)
	}
	if gate == compute.GateLowerBound {
		kernel.Scale(g, rate)
		kernel.SigmoidSlice(g)
		kernel.Scale(g, lowerBound)
		return
	}
	kernel.SoftplusSlice(g)
	kernel.Scale(g, -rate)
}
