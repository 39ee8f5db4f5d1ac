package ascend

import (
	"fmt"
	"math"
	"strconv"

	"k3/compute"
)

// maxRecurrentTokens is aclnnRecurrentGatedDeltaRule's limit on the
// tokens of one sequence in one call.
const maxRecurrentTokens = 8

// KDAChunk implements compute.Backend. Token by token (ChunkSize 0) with
// at most eight tokens per sequence, as decode and verification run it,
// it is a composition ending in aclnnRecurrentGatedDeltaRule: q, k and v
// copied out of their (possibly packed) views; with Preprocess, q and k
// L2-normalised as an RMSNorm with weight 1/√D and eps 1e-6/D (the same
// function: x/√(Σx² + 1e-6)) and beta through a sigmoid; the log decay
// computed from the raw gate; the per-sequence token counts and state
// indices uploaded from the host offsets. Chunked prefill needs
// FlashKDA's custom operator and is not mapped.
func (b *Backend) KDAChunk(a *compute.KDAArgs) error {
	shape, ok := kdaShape(a)
	if !ok {
		return b.onHost("KDAChunk", a, func(c compute.Backend, h any) error { return c.KDAChunk(h.(*compute.KDAArgs)) })
	}
	b.lock()
	defer b.mu.Unlock()
	return b.recurrentKDA(a, shape)
}

// kdaDims are the sizes of a KDAChunk call.
type kdaDims struct {
	T, H, Dk, Dv, N int
	P               int // the states State holds: N, or a pool's size
	cu              []int32
}

// kdaShape reports whether a is a call the recurrent operator serves, and
// its sizes. Anything else (chunked form, long sequences, other dtypes,
// malformed operands) goes to the general path, which checks it.
func kdaShape(a *compute.KDAArgs) (kdaDims, bool) {
	var d kdaDims
	if a.ChunkSize < 0 || a.Beta.Rank != 2 || a.State.Rank != 4 || a.Out.Rank != 3 || a.G.Rank != 3 {
		return d, false
	}
	d.T, d.H = a.Beta.Dims[0], a.Beta.Dims[1]
	if !a.QKV.IsZero() {
		if a.QKV.Rank != 2 || a.QKV.Dims[0] != d.T || a.QKV.Dims[1]%(3*d.H) != 0 || a.QKV.DType != compute.F32 {
			return d, false
		}
		d.Dk = a.QKV.Dims[1] / (3 * d.H)
		d.Dv = d.Dk
	} else {
		if a.Q.Rank != 3 || a.K.Rank != 3 || a.V.Rank != 3 {
			return d, false
		}
		d.Dk, d.Dv = a.Q.Dims[2], a.V.Dims[2]
		for _, t := range []compute.Tensor{a.Q, a.K, a.V} {
			if t.DType != compute.F32 || t.Dims[0] != d.T || t.Dims[1] != d.H {
				return d, false
			}
		}
		if a.K.Dims[2] != d.Dk {
			return d, false
		}
	}
	d.cu = a.CuSeqlens
	if d.cu == nil {
		d.cu = []int32{0, int32(d.T)}
	}
	d.N = len(d.cu) - 1
	if d.N < 1 || d.cu[0] != 0 || int(d.cu[d.N]) != d.T {
		return d, false
	}
	for i := range d.N {
		if d.cu[i+1] < d.cu[i] {
			return d, false
		}
	}
	st, g, out := a.State, a.G, a.Out
	d.P = d.N
	if !a.StateIdx.IsZero() {
		// A pool: the indices must be one I32 per sequence.
		d.P = st.Dims[0]
		if a.StateIdx.DType != compute.I32 || a.StateIdx.Len() != d.N || d.P < d.N {
			return d, false
		}
	}
	ok := st.DType == compute.F32 && st.Dims[0] == d.P && st.Dims[1] == d.H && st.Dims[2] == d.Dv && st.Dims[3] == d.Dk &&
		g.DType == compute.F32 && g.Dims[0] == d.T && g.Dims[1] == d.H && g.Dims[2] == d.Dk &&
		out.DType == compute.F32 && out.Dims[0] == d.T && out.Dims[1] == d.H && out.Dims[2] == d.Dv &&
		a.Beta.DType == compute.F32
	if !a.Records.IsZero() {
		// Replay records: token by token, keys and values of one width.
		hd := d.H * d.Dk
		ok = ok && a.ChunkSize == 0 && d.Dk == d.Dv &&
			a.Records.DType == compute.F32 && a.Records.Rank == 2 && a.Records.Dims[0] == d.T && a.Records.Dims[1] == 6*hd &&
			a.Raw.DType == compute.F32 && a.Raw.Rank == 2 && a.Raw.Dims[0] == d.T && a.Raw.Dims[1] == 3*hd
	}
	switch a.Gate {
	case compute.GateGiven:
	case compute.GateSoftplus, compute.GateLowerBound:
		ok = ok && a.ALog.DType == compute.F32 && a.ALog.Len() == d.H && a.DTBias.DType == compute.F32 && a.DTBias.Len() == d.H*d.Dk
		ok = ok && (a.Gate == compute.GateSoftplus || a.LowerBound < 0)
	default:
		ok = false
	}
	return d, ok
}

func i64(v ...int) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// recurrentKDA runs the composition; b.mu is held.
func (b *Backend) recurrentKDA(a *compute.KDAArgs, d kdaDims) error {
	T, H, Dk, Dv := d.T, d.H, d.Dk, d.Dv
	// Scratch: q, k, v and the log decay per token and head, beta, the
	// per-head decay rates.
	f, err := b.allocTensor(compute.F32, 3*T*H*Dk+T*H*Dv+T*H+H)
	if err != nil {
		return err
	}
	defer b.freeBuf(f.Mem.(*devBuf))
	at := func(t compute.Tensor, off int) compute.Tensor { t.Off += off; return t }
	qn, kn, gk := at(f, 0), at(f, T*H*Dk), at(f, 2*T*H*Dk)
	vv, beta, rate := at(f, 3*T*H*Dk), at(f, 3*T*H*Dk+T*H*Dv), at(f, 3*T*H*Dk+T*H*Dv+T*H)
	tokens3 := func(t compute.Tensor, d int) operand { return operand{t: t, view: i64(T, H, d)} }

	// q, k and v into contiguous scratch.
	src := [3]operand{tokens3(a.Q, Dk), tokens3(a.K, Dk), tokens3(a.V, Dv)}
	if !a.QKV.IsZero() {
		st := i64(3*H*Dk, Dk, 1)
		src = [3]operand{{t: a.QKV, view: i64(T, H, Dk), strides: st}, {t: at(a.QKV, H*Dk), view: i64(T, H, Dk), strides: st},
			{t: at(a.QKV, 2*H*Dk), view: i64(T, H, Dv), strides: st}}
	}
	for i, dst := range []operand{tokens3(qn, Dk), tokens3(kn, Dk), tokens3(vv, Dv)} {
		if err := b.runAs("aclnnInplaceCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) }, dst, src[i]); err != nil {
			return err
		}
	}
	rows := func(t compute.Tensor, d int) operand { return operand{t: t, view: i64(T*H, d)} }
	if a.Preprocess {
		inv, err := b.constOf(Dk, float32(1/math.Sqrt(float64(Dk))))
		if err != nil {
			return err
		}
		scratch, err := b.allocTensor(compute.F32, T*H)
		if err != nil {
			return err
		}
		defer b.freeBuf(scratch.Mem.(*devBuf))
		for _, x := range []compute.Tensor{qn, kn} {
			if err := b.runAs("aclnnRmsNorm "+strconv.FormatFloat(1e-6/float64(Dk), 'g', -1, 64), func(ts []tensorDesc) (prepared, error) {
				return b.drv.rmsNorm(ts[0], ts[1], 1e-6/float64(Dk), ts[2], ts[3])
			}, rows(x, Dk), operand{t: inv, view: i64(Dk)}, rows(x, Dk), rows(scratch, 1)); err != nil {
				return err
			}
		}
		if err := b.runAs("aclnnSigmoid", func(ts []tensorDesc) (prepared, error) { return b.drv.unary("aclnnSigmoid", ts[0], ts[1]) },
			operand{t: a.Beta, view: i64(T, H)}, operand{t: beta, view: i64(T, H)}); err != nil {
			return err
		}
	} else if err := b.runAs("aclnnInplaceCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) },
		operand{t: beta, view: i64(T, H)}, operand{t: a.Beta, view: i64(T, H)}); err != nil {
		return err
	}

	// The log decay.
	decay := tokens3(a.G, Dk)
	if a.Gate != compute.GateGiven {
		if err := b.decayGate(a, gk, rate, T, H, Dk); err != nil {
			return err
		}
		decay = tokens3(gk, Dk)
	}

	ops := kdaOperands{q: qn, k: kn, v: vv, beta: beta, decay: decay.t, out: a.Out}
	if !a.Records.IsZero() {
		return b.recordedPieces(a, d, ops)
	}
	if d.longest() <= maxRecurrentTokens {
		return b.recurrentPiece(a, d, ops, d.cu)
	}
	return b.recurrentPieces(a, d, ops)
}

// kdaOperands are the contiguous per-token operands of the recurrence:
// q, k, v, beta, the log decay and the output, all [T, H, ·].
type kdaOperands struct{ q, k, v, beta, decay, out compute.Tensor }

// longest is the most tokens any sequence has.
func (d kdaDims) longest() int {
	m := 0
	for s := range d.N {
		m = max(m, int(d.cu[s+1]-d.cu[s]))
	}
	return m
}

// recurrentPiece runs aclnnRecurrentGatedDeltaRule once over the tokens of
// src, which belong to the sequences with offsets cu (a piece of d.cu's);
// the token counts and each token's sequence are int32 constants on the
// device (constInts), so a decode step uploads nothing. A token's state
// block is its sequence, or with a pool (StateIdx) the sequence's index,
// gathered on the device. Sequences without tokens are left out of the
// call.
func (b *Backend) recurrentPiece(a *compute.KDAArgs, d kdaDims, src kdaOperands, cu []int32) error {
	H, Dk, Dv := d.H, d.Dk, d.Dv
	n := int(cu[len(cu)-1])
	var lens, seq []int32
	for s := range len(cu) - 1 {
		c := cu[s+1] - cu[s]
		if c == 0 {
			continue
		}
		lens = append(lens, c)
		for range c {
			seq = append(seq, int32(s))
		}
	}
	consts, err := b.constInts(append(lens, seq...))
	if err != nil {
		return err
	}
	t3 := func(t compute.Tensor, w int) operand { return operand{t: t, view: i64(n, H, w)} }
	lensT, idxT := part(consts, 0, len(lens)), part(consts, len(lens), n)
	if !a.StateIdx.IsZero() {
		slots, err := b.allocTensor(compute.I32, n)
		if err != nil {
			return err
		}
		defer b.freeBuf(slots.Mem.(*devBuf))
		if err := b.runAs("aclnnIndexSelect", func(ts []tensorDesc) (prepared, error) { return b.drv.indexSelect(ts[0], 0, ts[1], ts[2]) },
			operand{t: a.StateIdx, view: i64(d.N)}, operand{t: idxT, view: i64(n)}, operand{t: slots, view: i64(n)}); err != nil {
			return err
		}
		idxT = slots
	}
	scale := a.Scale
	return b.runAs("aclnnRecurrentGatedDeltaRule "+attr(scale), func(ts []tensorDesc) (prepared, error) {
		return b.drv.rgdr(ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6], nil, ts[7], scale, ts[8])
	}, t3(src.q, Dk), t3(src.k, Dk), t3(src.v, Dv), operand{t: src.beta, view: i64(n, H)},
		operand{t: a.State, view: i64(d.P, H, Dv, Dk)}, operand{t: lensT, view: i64(len(lens))}, operand{t: idxT, view: i64(n)},
		t3(src.decay, Dk), t3(src.out, Dv))
}

// scratchParts allocates one F32 scratch buffer and cuts it into parts,
// parts[i] holding rows rows of width[i]; the caller frees the buffer.
func (b *Backend) scratchParts(rows int, width []int, parts []compute.Tensor) (*devBuf, error) {
	total := 0
	for _, w := range width {
		total += rows * w
	}
	sc, err := b.allocTensor(compute.F32, total)
	if err != nil {
		return nil, err
	}
	off := 0
	for i, w := range width {
		parts[i] = part(sc, off, rows*w)
		off += rows * w
	}
	return sc.Mem.(*devBuf), nil
}

// recurrentPieces is the recurrence over sequences longer than the
// operator takes (chunked prefill): in pieces of at most eight tokens per
// sequence, each piece's rows gathered into scratch, run, and the outputs
// copied back. The state carries from piece to piece in place. It is the
// token-by-token oracle of FlashKDA's chunked form, slower but the same
// function, until a custom chunked operator is bound.
func (b *Backend) recurrentPieces(a *compute.KDAArgs, d kdaDims, src kdaOperands) error {
	H, Dk, Dv, N := d.H, d.Dk, d.Dv, d.N
	rows := maxRecurrentTokens * N
	width := [6]int{H * Dk, H * Dk, H * Dv, H, H * Dk, H * Dv} // q, k, v, beta, decay, out
	var piece [6]compute.Tensor
	sc, err := b.scratchParts(rows, width[:], piece[:])
	if err != nil {
		return err
	}
	defer b.freeBuf(sc)
	full := [6]compute.Tensor{src.q, src.k, src.v, src.beta, src.decay, src.out}
	block := func(t compute.Tensor, row, n, w int) operand {
		t.Off += row * w
		return operand{t: t, view: i64(n, w)}
	}
	cp := func(dst, from operand) error {
		return b.runAs("aclnnInplaceCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) }, dst, from)
	}
	cu := make([]int32, N+1)
	for p0 := 0; p0 < d.longest(); p0 += maxRecurrentTokens {
		// This piece's tokens of each sequence, packed in sequence order.
		at := 0
		for s := range N {
			r0, r1 := int(d.cu[s])+p0, min(int(d.cu[s])+p0+maxRecurrentTokens, int(d.cu[s+1]))
			n := max(r1-r0, 0)
			cu[s+1] = cu[s] + int32(n)
			if n == 0 {
				continue
			}
			for i := range 5 {
				if err := cp(block(piece[i], at, n, width[i]), block(full[i], r0, n, width[i])); err != nil {
					return err
				}
			}
			at += n
		}
		pieceOps := kdaOperands{q: piece[0], k: piece[1], v: piece[2], beta: piece[3], decay: piece[4], out: piece[5]}
		if err := b.recurrentPiece(a, d, pieceOps, cu); err != nil {
			return err
		}
		at = 0
		for s := range N {
			n := int(cu[s+1] - cu[s])
			if n == 0 {
				continue
			}
			if err := cp(block(full[5], int(d.cu[s])+p0, n, width[5]), block(piece[5], at, n, width[5])); err != nil {
				return err
			}
			at += n
		}
	}
	return nil
}

// recordedPieces is the recurrence that writes replay records (a.Records,
// the layout of compute.KDAStepArgs.Records). A record's corrected values
// u = β(v - S·(α⊙k)) (V-first S, α = exp(decay)) need the state before
// its token, which aclnnRecurrentGatedDeltaRule does not return, so the
// tokens run a step at a time: for step i, the i-th token of every
// sequence that has one. Before the step the states of those sequences
// are gathered (aclnnIndexSelect over the pool), S·(α⊙k) taken by one
// aclnnBatchMatMul over sequences and heads and u written to the records;
// then the operator advances the states. Keys (as normalised), α and the
// raw projections are written for all tokens at once. A decode step (one
// token a sequence) reads its operands in place; longer runs gather each
// step's rows into scratch, as recurrentPieces does.
func (b *Backend) recordedPieces(a *compute.KDAArgs, d kdaDims, src kdaOperands) error {
	T, H, D, N := d.T, d.H, d.Dk, d.N
	hd := H * D
	cp := func(dst, from operand) error {
		return b.runAs("aclnnInplaceCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) }, dst, from)
	}
	// col is the records' columns [off, off+w) of rows [r, r+n).
	col := func(r, n, off, w int) operand {
		t := a.Records
		t.Off += r*6*hd + off
		return operand{t: t, view: i64(n, w), strides: i64(6*hd, 1)}
	}
	flat := func(t compute.Tensor, r, n, w int) operand {
		t.Off += r * w
		return operand{t: t, view: i64(n, w)}
	}
	if err := cp(col(0, T, 0, hd), flat(src.k, 0, T, hd)); err != nil {
		return err
	}
	if err := b.runAs("aclnnExp", func(ts []tensorDesc) (prepared, error) { return b.drv.unary("aclnnExp", ts[0], ts[1]) },
		flat(src.decay, 0, T, hd), col(0, T, hd, hd)); err != nil {
		return err
	}
	if err := cp(col(0, T, 3*hd, 3*hd), flat(a.Raw, 0, T, 3*hd)); err != nil {
		return err
	}

	// Scratch for a step's rows: q, k, v, beta, decay, out and u of up to
	// N tokens, α⊙k, S·(α⊙k) and the gathered states.
	width := [...]int{hd, hd, hd, H, hd, hd, hd, hd, hd, hd * D}
	var piece [len(width)]compute.Tensor
	sc, err := b.scratchParts(N, width[:], piece[:])
	if err != nil {
		return err
	}
	defer b.freeBuf(sc)
	slots, err := b.allocTensor(compute.I32, N)
	if err != nil {
		return err
	}
	defer b.freeBuf(slots.Mem.(*devBuf))
	full := [...]compute.Tensor{src.q, src.k, src.v, src.beta, src.decay, src.out}
	inPlace := d.longest() == 1 // a decode step: each token is its sequence's
	cu := make([]int32, N+1)
	var seqs []int32
	for i := range d.longest() {
		seqs = seqs[:0]
		for s := range N {
			n := int32(0)
			if int(d.cu[s])+i < int(d.cu[s+1]) {
				n = 1
				seqs = append(seqs, int32(s))
			}
			cu[s+1] = cu[s] + n
		}
		n := len(seqs)
		step := kdaOperands{q: src.q, k: src.k, v: src.v, beta: src.beta, decay: src.decay, out: src.out}
		if !inPlace {
			step = kdaOperands{q: piece[0], k: piece[1], v: piece[2], beta: piece[3], decay: piece[4], out: piece[5]}
			for j, s := range seqs {
				r := int(d.cu[s]) + i
				for f, t := range []compute.Tensor{step.q, step.k, step.v, step.beta, step.decay} {
					if err := cp(flat(t, j, 1, width[f]), flat(full[f], r, 1, width[f])); err != nil {
						return err
					}
				}
			}
		}
		// The states before the step, [n·H, D, D].
		idx, err := b.constInts(seqs)
		if err != nil {
			return err
		}
		if !a.StateIdx.IsZero() {
			if err := b.runAs("aclnnIndexSelect", func(ts []tensorDesc) (prepared, error) { return b.drv.indexSelect(ts[0], 0, ts[1], ts[2]) },
				operand{t: a.StateIdx, view: i64(N)}, operand{t: idx, view: i64(n)}, operand{t: slots, view: i64(n)}); err != nil {
				return err
			}
			idx = slots
		}
		states := piece[9]
		if err := b.runAs("aclnnIndexSelect", func(ts []tensorDesc) (prepared, error) { return b.drv.indexSelect(ts[0], 0, ts[1], ts[2]) },
			operand{t: a.State, view: i64(d.P, hd*D)}, operand{t: idx, view: i64(n)}, flat(states, 0, n, hd*D)); err != nil {
			return err
		}
		// u = β(v - S·(α⊙k)), α⊙k in piece 7, S·(α⊙k) in piece 8.
		ak, sk, u := piece[7], piece[8], piece[6]
		if err := b.runAs("aclnnExp", func(ts []tensorDesc) (prepared, error) { return b.drv.unary("aclnnExp", ts[0], ts[1]) },
			flat(step.decay, 0, n, hd), flat(ak, 0, n, hd)); err != nil {
			return err
		}
		if err := b.runAs("aclnnMul", func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) },
			flat(ak, 0, n, hd), flat(step.k, 0, n, hd), flat(ak, 0, n, hd)); err != nil {
			return err
		}
		if err := b.runAs("aclnnBatchMatMul", func(ts []tensorDesc) (prepared, error) {
			return b.drv.matmul("aclnnBatchMatMul", ts[0], ts[1], ts[2], 0)
		},
			operand{t: states, view: i64(n*H, D, D)}, operand{t: ak, view: i64(n*H, D, 1)}, operand{t: sk, view: i64(n*H, D, 1)}); err != nil {
			return err
		}
		minus, err := b.scalar(-1)
		if err != nil {
			return err
		}
		if err := b.runAs("aclnnAdd "+attr(-1), func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], minus, ts[2]) },
			flat(step.v, 0, n, hd), flat(sk, 0, n, hd), flat(u, 0, n, hd)); err != nil {
			return err
		}
		if err := b.runAs("aclnnMul", func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) },
			operand{t: u, view: i64(n*H, D)}, operand{t: step.beta, view: i64(n*H, 1)}, operand{t: u, view: i64(n*H, D)}); err != nil {
			return err
		}
		if inPlace {
			if err := cp(col(0, T, 2*hd, hd), flat(u, 0, T, hd)); err != nil {
				return err
			}
		} else {
			for j, s := range seqs {
				if err := cp(col(int(d.cu[s])+i, 1, 2*hd, hd), flat(u, j, 1, hd)); err != nil {
					return err
				}
			}
		}
		if err := b.recurrentPiece(a, d, step, cu); err != nil {
			return err
		}
		if !inPlace {
			for j, s := range seqs {
				if err := cp(flat(src.out, int(d.cu[s])+i, 1, hd), flat(step.out, j, 1, hd)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// decayGate writes the log decay into gk from the raw gate a.G: Kimi
// Linear's -exp(A_log)·softplus(G + dt_bias), or K3's
// lowerBound·sigmoid(exp(A_log)·(G + dt_bias)); rate is scratch for the
// per-head exp(A_log).
func (b *Backend) decayGate(a *compute.KDAArgs, gk, rate compute.Tensor, T, H, Dk int) error {
	flat2 := operand{t: gk, view: i64(T, H*Dk)}
	heads := operand{t: gk, view: i64(T, H, Dk)}
	perHead := operand{t: rate, view: i64(H, 1)}
	one, err := b.scalar(1)
	if err != nil {
		return err
	}
	steps := []func() error{
		func() error {
			return b.runAs("aclnnAdd "+attr(1), func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], one, ts[2]) },
				operand{t: a.G, view: i64(T, H*Dk)}, operand{t: a.DTBias, view: i64(H * Dk)}, flat2)
		},
		func() error {
			return b.runAs("aclnnExp", func(ts []tensorDesc) (prepared, error) { return b.drv.unary("aclnnExp", ts[0], ts[1]) },
				operand{t: a.ALog, view: i64(H)}, operand{t: rate, view: i64(H)})
		},
	}
	muls := func(v float32, x operand) func() error {
		return func() error {
			sc, err := b.scalar(v)
			if err != nil {
				return err
			}
			return b.runAs("aclnnMuls "+attr(v), func(ts []tensorDesc) (prepared, error) { return b.drv.muls(ts[0], sc, ts[1]) }, x, x)
		}
	}
	mulRate := func() error {
		return b.runAs("aclnnMul", func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) }, heads, perHead, heads)
	}
	if a.Gate == compute.GateSoftplus {
		steps = append(steps,
			func() error { return b.softplus(flat2, flat2) },
			muls(-1, operand{t: rate, view: i64(H)}),
			mulRate)
	} else {
		steps = append(steps,
			mulRate,
			func() error {
				return b.runAs("aclnnSigmoid", func(ts []tensorDesc) (prepared, error) { return b.drv.unary("aclnnSigmoid", ts[0], ts[1]) }, flat2, flat2)
			},
			muls(a.LowerBound, flat2))
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("ascend: KDA decay gate: %w", err)
		}
	}
	return nil
}

// CausalConv implements compute.Backend: KDA's depthwise causal
// convolution with SiLU, per sequence, as a composition. The window
// [state; x] is copied into scratch; the output is Σ_j window[j:j+n] ·
// w[:, j] (Mul and Add, the taps broadcast over rows), then Silu; the
// state becomes the window's last W-1 rows. aclnn has no causal-conv
// operator (the Ascend recipes use a custom one), so this is the
// device route until one is bound. With a pool of states (StateIdx) the
// sequences' rows are gathered into scratch first (aclnnIndexSelect) and
// put back after (aclnnInplaceIndexCopy), the indices staying on the
// device.
func (b *Backend) CausalConv(a *compute.ConvArgs) error {
	if a.X.Rank != 2 || a.Weight.Rank != 2 || a.Weight.Dims[0] != a.X.Dims[1] || a.Weight.Dims[1] < 2 ||
		a.X.DType != compute.F32 || (a.Weight.DType != compute.F32 && a.Weight.DType != compute.BF16) ||
		a.State.DType != compute.F32 || a.Out.DType != compute.F32 {
		return b.onHost("CausalConv", a, func(c compute.Backend, h any) error { return c.CausalConv(h.(*compute.ConvArgs)) })
	}
	T, C, W := a.X.Dims[0], a.X.Dims[1], a.Weight.Dims[1]
	cu := a.CuSeqlens
	if cu == nil {
		cu = []int32{0, int32(T)}
	}
	N := len(cu) - 1
	P := N
	pooled := !a.StateIdx.IsZero()
	if pooled {
		P = a.State.Dims[0]
	}
	ok := N >= 1 && cu[0] == 0 && int(cu[N]) == T && a.State.Len() == P*(W-1)*C && a.Out.Len() == T*C &&
		(!pooled || a.StateIdx.DType == compute.I32 && a.StateIdx.Len() == N && a.State.Rank == 3 && P >= N)
	for s := 0; ok && s < N; s++ {
		ok = cu[s+1] >= cu[s]
	}
	if !ok {
		return fmt.Errorf("%w: conv input %v, weight %v, state %v, indices %v, out %v, cu_seqlens %v",
			compute.ErrShape, a.X, a.Weight, a.State, a.StateIdx, a.Out, cu)
	}
	b.lock()
	defer b.mu.Unlock()
	maxN := 0
	for s := range N {
		maxN = max(maxN, int(cu[s+1]-cu[s]))
	}
	rows := func(t compute.Tensor, n int) operand { return operand{t: t, view: i64(n, (W-1)*C)} }
	states := a.State
	if pooled {
		var err error
		if states, err = b.allocTensor(compute.F32, N*(W-1)*C); err != nil {
			return err
		}
		defer b.freeBuf(states.Mem.(*devBuf))
		if err := b.runAs("aclnnIndexSelect", func(ts []tensorDesc) (prepared, error) { return b.drv.indexSelect(ts[0], 0, ts[1], ts[2]) },
			rows(a.State, P), operand{t: a.StateIdx, view: i64(N)}, rows(states, N)); err != nil {
			return err
		}
	}
	scratch, err := b.allocTensor(compute.F32, 2*(W-1+maxN)*C)
	if err != nil {
		return err
	}
	defer b.freeBuf(scratch.Mem.(*devBuf))
	one, err := b.scalar(1)
	if err != nil {
		return err
	}
	win, tmp := scratch, scratch
	tmp.Off += (W - 1 + maxN) * C
	at := func(t compute.Tensor, row, rows int) operand {
		t.Off += row * C
		return operand{t: t, view: i64(rows, C)}
	}
	cp := func(dst, src operand) error {
		return b.runAs("aclnnInplaceCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) }, dst, src)
	}
	for s := range N {
		r0, n := int(cu[s]), int(cu[s+1]-cu[s])
		if n == 0 {
			continue
		}
		state := states
		state.Off += s * (W - 1) * C
		if err := cp(at(win, 0, W-1), at(state, 0, W-1)); err != nil {
			return err
		}
		if err := cp(at(win, W-1, n), at(a.X, r0, n)); err != nil {
			return err
		}
		out := at(a.Out, r0, n)
		for j := range W {
			tap := a.Weight
			tap.Off += j
			taps := operand{t: tap, view: i64(C), strides: i64(W)}
			dst := out
			if j > 0 {
				dst = at(tmp, 0, n)
			}
			if err := b.runAs("aclnnMul", func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) },
				at(win, j, n), taps, dst); err != nil {
				return err
			}
			if j > 0 {
				if err := b.runAs("aclnnAdd "+attr(1), func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], one, ts[2]) }, out, dst, out); err != nil {
					return err
				}
			}
		}
		if err := b.runAs("aclnnSilu", func(ts []tensorDesc) (prepared, error) { return b.drv.unary("aclnnSilu", ts[0], ts[1]) }, out, out); err != nil {
			return err
		}
		if err := cp(at(state, 0, W-1), at(win, n, W-1)); err != nil {
			return err
		}
	}
	if pooled {
		return b.runAs("aclnnInplaceIndexCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.indexCopy(ts[0], 0, ts[1], ts[2]) },
			rows(a.State, P), operand{t: a.StateIdx, view: i64(N)}, rows(states, N))
	}
	return nil
}
