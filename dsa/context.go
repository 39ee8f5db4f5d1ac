package dsa

import (
	"context"
	"fmt"
	"math"
	"slices"

	"k3/comm"
	"k3/compute"
)

// Placement records where the positions of a sequence split over the ranks
// of a context-parallel group live: which rank's cache holds each position,
// and at which of its rows. Every rank keeps its own copy, updated by the
// same calls, so each knows without asking where any key is.
type Placement struct {
	rank []int32   // per position: the rank holding it
	row  []int32   // per position: its row in that rank's cache
	pos  [][]int32 // per rank: the positions it holds, increasing
}

// NewPlacement returns the placement of an empty sequence over ranks ranks.
func NewPlacement(ranks int) *Placement {
	return &Placement{pos: make([][]int32, ranks)}
}

// Len is the number of positions placed.
func (p *Placement) Len() int { return len(p.rank) }

// Ranks is the size of the group.
func (p *Placement) Ranks() int { return len(p.pos) }

// Held is the number of positions rank r holds.
func (p *Placement) Held(r int) int { return len(p.pos[r]) }

// Rank is the rank holding position i.
func (p *Placement) Rank(i int) int { return int(p.rank[i]) }

// Add places the next n positions on rank r.
func (p *Placement) Add(r, n int) {
	for range n {
		i := int32(len(p.rank))
		p.rank = append(p.rank, int32(r))
		p.row = append(p.row, int32(len(p.pos[r])))
		p.pos[r] = append(p.pos[r], i)
	}
}

// Clone returns a copy of p that changes apart from it.
func (p *Placement) Clone() *Placement {
	c := &Placement{rank: slices.Clone(p.rank), row: slices.Clone(p.row), pos: make([][]int32, len(p.pos))}
	for r := range p.pos {
		c.pos[r] = slices.Clone(p.pos[r])
	}
	return c
}

// Fewest is the rank holding the fewest positions, the lowest on a tie: the
// rank that keeps the next decoded position, so the shares stay even.
func (p *Placement) Fewest() int {
	best := 0
	for r := range p.pos {
		if len(p.pos[r]) < len(p.pos[best]) {
			best = r
		}
	}
	return best
}

// below is how many positions before end rank r holds.
func (p *Placement) below(r, end int) int {
	n, _ := slices.BinarySearch(p.pos[r], int32(end))
	return n
}

// maxPositions bounds a split sequence: positions travel between ranks as
// F32 elements, exact up to 2^24.
const maxPositions = 1 << 24

// SplitPass describes one ForwardSplit call on one rank of a
// context-parallel group.
type SplitPass struct {
	Comm  comm.Communicator
	Cache *Cache     // this rank's rows of the sequence, in increasing position
	Place *Placement // where every position lives, the pass's included
	Pos   []int32    // the positions of x's rows
	// Queries[r] are the positions of rank r's rows in this pass; every
	// rank passes every rank's. Unused with Shared.
	Queries [][]int32
	// Shared says every rank passes the same rows (decode steps): every
	// rank computes their outputs, and the rank Place names for each keeps
	// its key. Otherwise each rank passes the rows it holds.
	Shared bool
	// GatherRows makes shared rows fetch the keys they attend to from the
	// ranks holding them, as unshared rows do, instead of merging each
	// rank's partial attention over its own keys (which moves less; this
	// is for measuring the difference).
	GatherRows bool
}

// Exchange is one rank's scratch for ForwardSplit; the layers of a rank
// run one after another and share one.
type Exchange struct {
	b                compute.Backend
	hostQ, allQ      []float32
	scores, cand     []float32
	got              []float32
	local            []int32
	cnt, qpos, slots []int32
	sel, idx         []int32
	mark             []bool
	need             []int32
	want             [][]int32 // per rank: the needed positions it holds
	sendN, recvN     []int
	starts           []int
	acc              []float64
	// view is a slice header the backend is handed by pointer for the
	// subslices moved to and from it (boxing a local's would allocate).
	view           []float32
	send, recv     []float32
	lat, pe        []float32
	iqT, iwT       compute.Tensor
	scoreT, idxT   compute.Tensor
	qposT          compute.Tensor // the queries' positions (e.qpos) for the indexer and attention
	sendT, recvT   compute.Tensor
	kvT, peT, selT compute.Tensor
}

// NewExchange returns scratch for ForwardSplit on backend b.
func NewExchange(b compute.Backend) *Exchange { return &Exchange{b: b} }

// tensor resizes *t to dims, reallocating only to grow.
func (e *Exchange) tensor(t *compute.Tensor, dt compute.DType, dims ...int) error {
	n := 1
	for _, d := range dims {
		n *= d
	}
	if n == 0 {
		return fmt.Errorf("dsa: split scratch of shape %v", dims)
	}
	if !t.IsZero() && t.Len() >= n && t.DType == dt {
		*t = t.Reshape(t.Len()).Rows(0, n).Reshape(dims...)
		return nil
	}
	if !t.IsZero() {
		e.b.Free(*t)
	}
	var err error
	*t, err = e.b.Alloc(dt, dims...)
	return err
}

// Free returns the exchange's tensors to the backend.
func (e *Exchange) Free() {
	for _, t := range []*compute.Tensor{&e.iqT, &e.iwT, &e.scoreT, &e.idxT, &e.qposT, &e.sendT, &e.recvT, &e.kvT, &e.peT, &e.selT} {
		if !t.IsZero() {
			e.b.Free(*t)
			*t = compute.Tensor{}
		}
	}
}

// alltoall sends e.send's blocks (e.sendN floats to each rank) and returns
// the received ones (e.recvN from each), packed in rank order.
func (e *Exchange) alltoall(ctx context.Context, c comm.Communicator, what string) ([]float32, error) {
	var ns, nr int
	for r := range e.sendN {
		ns += e.sendN[r]
		nr += e.recvN[r]
	}
	if err := e.tensor(&e.sendT, compute.F32, max(ns, 1)); err != nil {
		return nil, err
	}
	if err := e.tensor(&e.recvT, compute.F32, max(nr, 1)); err != nil {
		return nil, err
	}
	if ns > 0 {
		e.view = e.send[:ns]
		if err := e.b.Write(e.sendT.Rows(0, ns), &e.view); err != nil {
			return nil, err
		}
	}
	if err := c.AllToAllV(ctx, e.recvT, e.recvN, e.sendT, e.sendN); err != nil {
		return nil, fmt.Errorf("dsa: split %s: %w", what, err)
	}
	e.recv = growF(e.recv, nr)
	if nr > 0 {
		if err := e.b.Read(e.recv, e.recvT.Rows(0, nr)); err != nil {
			return nil, err
		}
	}
	return e.recv, nil
}

// ForwardSplit runs the layer over x [T, D], the rows at positions a.Pos of
// a sequence whose keys are split over the ranks of a.Comm, and writes y
// [T, D]. The rows' own keys go to the caches Place names. Attention needs
// keys other ranks hold; only those travel: for DSA past the indexer's K,
// each rank scores its own keys for every query of the pass, keeps its best
// K, and the query's rank merges them into the global top-K by the
// indexer's order (larger score first, ties to the lower position), the
// selection the unsplit indexer makes. Each rank then fetches just the
// selected rows it lacks, every row once per pass however many of its
// queries chose it. Dense attention (MLA, or DSA up to K positions) needs
// every earlier key, so those all travel.
//
// Every rank of the group calls ForwardSplit for each layer in the same
// order, as with any collective.
func (l *Layer) ForwardSplit(ctx context.Context, e *Exchange, a *SplitPass, x, y compute.Tensor) error {
	cfg, w, b := l.cfg, l.W, l.b
	t := 0 // a rank may have no rows in a pass, and still serve the others'
	if !x.IsZero() {
		t = x.Dim(0)
	}
	n, me := a.Comm.Size(), a.Comm.Rank()
	c, pl := a.Cache, a.Place
	switch {
	case len(a.Pos) != t:
		return fmt.Errorf("dsa: split pass: %d positions for %d rows", len(a.Pos), t)
	case t > l.maxT:
		return fmt.Errorf("dsa: split pass: %d rows, layer sized for %d", t, l.maxT)
	case pl.Ranks() != n:
		return fmt.Errorf("dsa: split pass: placement over %d ranks in a group of %d", pl.Ranks(), n)
	case pl.Len() > maxPositions:
		return fmt.Errorf("dsa: split pass: %d positions, more than the %d a split sequence may hold", pl.Len(), maxPositions)
	case !a.Shared && (len(a.Queries) != n || !slices.Equal(a.Queries[me], a.Pos)):
		return fmt.Errorf("dsa: split pass: rank %d's rows are not its entry of the group's queries", me)
	case a.Shared && t == 0:
		return fmt.Errorf("dsa: split pass: no shared rows")
	}
	if t == 0 {
		return l.serveSplit(ctx, e, a)
	}
	for i, p := range a.Pos {
		if p < 0 || int(p) >= pl.Len() || (!a.Shared && pl.Rank(int(p)) != me) {
			return fmt.Errorf("dsa: split pass: row %d at position %d, not placed on rank %d", i, p, me)
		}
	}
	// The projections, and the rows' keys finished and kept where placed.
	qn, qr, kvNew, peNew, err := l.project(x)
	if err != nil {
		return err
	}
	qa := l.qa.Rows(0, t)
	if err := b.HeadMatMul(qa, qn, w.UKT); err != nil {
		return fmt.Errorf("dsa: absorbed query: %w", err)
	}
	kv, qri, pe, ik, err := l.finishRun(a.Pos, 0, qr, kvNew, peNew)
	if err != nil {
		return err
	}
	row := func(t compute.Tensor, i int) compute.Tensor {
		if t.IsZero() {
			return t
		}
		return t.Rows(i, i+1)
	}
	for i, p := range a.Pos {
		if pl.Rank(int(p)) != me {
			continue
		}
		if err := c.reserve(1); err != nil {
			return err
		}
		if err := c.write(row(kv, i), row(pe, i), row(ik, i), 1); err != nil {
			return err
		}
		c.Len++
	}
	if c.Len != pl.Held(me) {
		return fmt.Errorf("dsa: split pass: rank %d's cache holds %d positions, its placement %d", me, c.Len, pl.Held(me))
	}

	// The selection, where sparse.
	// The indexer selects whenever there is one, as unsplit, so Indices
	// reports the same lists; attention uses them once sparse.
	sparse := l.sparseSplit(a)
	if cfg.Indexer != nil {
		if err := e.selectTopK(ctx, l, a); err != nil {
			return err
		}
		// The selections are also what Indices reports, as unsplit.
		if err := b.Write(l.idxRows(0, t).Reshape(t*cfg.Indexer.TopK), &e.sel); err != nil {
			return err
		}
	}

	if a.Shared && !a.GatherRows {
		return l.partialShared(ctx, e, a, sparse, qa, qri, x, y)
	}

	// The keys the rows attend to, in increasing position: every earlier
	// one for dense attention, the union of the selections for sparse.
	last := int(slices.Max(a.Pos))
	e.mark = growBool(e.mark, last+1)
	if sparse {
		for _, p := range e.sel {
			if p >= 0 {
				e.mark[p] = true
			}
		}
	} else {
		for i := range e.mark {
			e.mark[i] = true
		}
	}
	e.need = e.need[:0]
	for p, ok := range e.mark {
		if ok {
			e.need = append(e.need, int32(p))
		}
	}
	if err := e.fetch(ctx, l, a); err != nil {
		return err
	}

	// Attention over the gathered keys: each row sees those up to its own
	// position (all of them, for sparse rows, are its selection's).
	m := len(e.need)
	dc, dr := cfg.KVLoRARank, cfg.RopeDim
	if err := e.tensor(&e.kvT, compute.F32, m, 1, dc); err != nil {
		return err
	}
	if err := b.Write(e.kvT, &e.lat); err != nil {
		return err
	}
	e.qpos = e.qpos[:0]
	for _, p := range a.Pos {
		k, _ := slices.BinarySearch(e.need, p+1)
		e.qpos = append(e.qpos, int32(k-1))
	}
	qposT, err := e.positions(b)
	if err != nil {
		return err
	}
	l.attn = compute.AttnArgs{Q: qa, K: e.kvT, V: e.kvT, KVLen: m, QPos: qposT, Causal: true,
		Scale: float32(l.scale), Out: l.ol.Rows(0, t)}
	if dr > 0 {
		if err := e.tensor(&e.peT, compute.F32, m, dr); err != nil {
			return err
		}
		if err := b.Write(e.peT, &e.pe); err != nil {
			return err
		}
		l.attn.QRope, l.attn.KRope = qri, e.peT
	}
	if sparse {
		k := cfg.Indexer.TopK
		e.slots = growI32(e.slots, t*k)
		for i, p := range e.sel {
			e.slots[i] = -1
			if p >= 0 {
				s, _ := slices.BinarySearch(e.need, p)
				e.slots[i] = int32(s)
			}
		}
		if err := e.tensor(&e.selT, compute.I32, t, 1, k); err != nil {
			return err
		}
		if err := b.Write(e.selT, &e.slots); err != nil {
			return err
		}
		l.attn.Indices = e.selT
	}
	if err := b.Attention(&l.attn); err != nil {
		return fmt.Errorf("dsa: split attention: %w", err)
	}
	return l.output(x, t, y)
}

// partialShared is attention for rows every rank holds: each rank attends
// over its own keys (with sparse, those of the merged selection it holds),
// keeping each head's log-sum-exp, lifts that to the value heads, and the
// ranks all-gather those partial outputs and merge them. A decode step then moves one output per rank and
// head and no keys at all, where gathering moves the selected rows (or
// for dense attention the whole cache). Every rank merges the same
// gathered parts in rank order: the outputs agree bitwise.
func (l *Layer) partialShared(ctx context.Context, e *Exchange, a *SplitPass, sparse bool, qa, qri, x, y compute.Tensor) error {
	cfg, b, c, pl := l.cfg, l.b, a.Cache, a.Place
	n, me, t := a.Comm.Size(), a.Comm.Rank(), len(a.Pos)
	h, dc, dv := cfg.NumHeads, cfg.KVLoRARank, cfg.VDim
	// Each rank lifts its partial output to the value heads before the
	// exchange (the lift is linear, so merging after it is the same sum):
	// dv floats a head travel instead of dc.
	part := t * h * (dv + 1) // outputs, then log-sum-exps
	e.got = growF(e.got, part)
	outs, lses := e.got[:t*h*dv], e.got[t*h*dv:]
	clear(outs)
	for i := range lses {
		lses[i] = float32(math.Inf(-1))
	}
	if c.Len > 0 {
		e.qpos, e.cnt = e.qpos[:0], e.cnt[:0]
		for _, p := range a.Pos {
			k := int32(pl.below(me, int(p)+1))
			e.cnt = append(e.cnt, k)
			e.qpos = append(e.qpos, max(k-1, 0))
		}
		if err := e.tensor(&e.kvT, compute.F32, t, h, dc); err != nil {
			return err
		}
		if err := e.tensor(&e.peT, compute.F32, t, h); err != nil {
			return err
		}
		qposT, err := e.positions(b)
		if err != nil {
			return err
		}
		l.attn = compute.AttnArgs{Q: qa, KPages: c.lat, PageSize: PageSize, QPos: qposT, KVLen: c.Len, Causal: true,
			Scale: float32(l.scale), Out: e.kvT, LSE: e.peT}
		if cfg.RopeDim > 0 {
			l.attn.QRope, l.attn.KRopePages = qri, c.pe
		}
		if sparse {
			// This rank's rows of each selection, in the selection's order.
			k := cfg.Indexer.TopK
			e.slots = growI32(e.slots, t*k)
			for i := range t {
				at := i * k
				for _, p := range e.sel[i*k : (i+1)*k] {
					if p >= 0 && pl.Rank(int(p)) == me {
						e.slots[at] = pl.row[p]
						at++
					}
				}
				for ; at < (i+1)*k; at++ {
					e.slots[at] = -1
				}
				if e.slots[i*k] < 0 {
					e.cnt[i] = 0 // none of the selection is here
				}
			}
			if err := e.tensor(&e.selT, compute.I32, t, 1, k); err != nil {
				return err
			}
			if err := b.Write(e.selT, &e.slots); err != nil {
				return err
			}
			l.attn.Indices = e.selT
		}
		if err := b.Attention(&l.attn); err != nil {
			return fmt.Errorf("dsa: split partial attention: %w", err)
		}
		if err := b.HeadMatMul(l.o.Rows(0, t), e.kvT, l.W.UV); err != nil {
			return fmt.Errorf("dsa: split value lift: %w", err)
		}
		e.view = outs
		if err := b.Read(&e.view, l.o.Rows(0, t)); err != nil {
			return err
		}
		e.view = lses
		if err := b.Read(&e.view, e.peT); err != nil {
			return err
		}
		for i, k := range e.cnt {
			if k == 0 { // none of this rank's keys precede the row
				clear(outs[i*h*dv : (i+1)*h*dv])
				for j := range h {
					lses[i*h+j] = float32(math.Inf(-1))
				}
			}
		}
	}
	if err := e.tensor(&e.sendT, compute.F32, part); err != nil {
		return err
	}
	if err := e.tensor(&e.recvT, compute.F32, n*part); err != nil {
		return err
	}
	if err := b.Write(e.sendT, &e.got); err != nil {
		return err
	}
	if err := a.Comm.AllGather(ctx, e.recvT, e.sendT); err != nil {
		return fmt.Errorf("dsa: split partial outputs: %w", err)
	}
	e.recv = growF(e.recv, n*part)
	if err := b.Read(e.recv, e.recvT); err != nil {
		return err
	}
	e.lat = growF(e.lat, t*h*dv)
	merged := e.lat // written to the value heads' outputs below
	for i := range t {
		for j := range h {
			m := math.Inf(-1)
			for r := range n {
				m = max(m, float64(e.recv[r*part+t*h*dv+i*h+j]))
			}
			o := merged[(i*h+j)*dv : (i*h+j+1)*dv]
			clear(o)
			if math.IsInf(m, -1) {
				continue
			}
			var sum float64
			acc := make64(&e.acc, dv)
			for r := range n {
				lse := float64(e.recv[r*part+t*h*dv+i*h+j])
				if math.IsInf(lse, -1) {
					continue
				}
				wt := math.Exp(lse - m)
				sum += wt
				src := e.recv[r*part+(i*h+j)*dv : r*part+(i*h+j+1)*dv]
				for d, v := range src {
					acc[d] += wt * float64(v)
				}
			}
			for d := range o {
				o[d] = float32(acc[d] / sum)
			}
		}
	}
	if err := b.Write(l.o.Rows(0, t), &e.lat); err != nil {
		return err
	}
	return l.gateAndProject(x, t, y)
}

// make64 returns *b resized to n and zeroed.
func make64(b *[]float64, n int) []float64 {
	if cap(*b) < n {
		*b = make([]float64, n)
	}
	*b = (*b)[:n]
	clear(*b)
	return *b
}

// sparseSplit reports whether a pass selects: DSA with a row that sees more
// than K positions, anywhere in the group.
func (l *Layer) sparseSplit(a *SplitPass) bool {
	ix := l.cfg.Indexer
	if ix == nil {
		return false
	}
	last := int32(-1)
	for _, p := range a.Pos {
		last = max(last, p)
	}
	if !a.Shared {
		for _, q := range a.Queries {
			for _, p := range q {
				last = max(last, p)
			}
		}
	}
	return int(last)+1 > ix.TopK
}

// serveSplit is ForwardSplit for a rank with no rows of its own in the
// pass: it takes part in the selection and sends the rows others ask for.
func (l *Layer) serveSplit(ctx context.Context, e *Exchange, a *SplitPass) error {
	if a.Cache.Len != a.Place.Held(a.Comm.Rank()) {
		return fmt.Errorf("dsa: split pass: rank %d's cache holds %d positions, its placement %d", a.Comm.Rank(), a.Cache.Len, a.Place.Held(a.Comm.Rank()))
	}
	if l.cfg.Indexer != nil {
		if err := e.selectTopK(ctx, l, a); err != nil {
			return err
		}
	}
	e.need = e.need[:0]
	return e.fetch(ctx, l, a)
}

// selectTopK leaves in e.sel ([T, K] for this rank's T rows, -1 padded)
// each row's global top-K positions in the indexer's order.
func (e *Exchange) selectTopK(ctx context.Context, l *Layer, a *SplitPass) error {
	ix := l.cfg.Indexer
	b, c, pl := l.b, a.Cache, a.Place
	n, me, t := a.Comm.Size(), a.Comm.Rank(), len(a.Pos)
	k, hi, di := ix.TopK, ix.NumHeads, ix.HeadDim
	// Every query of the pass, with its indexer query and head weights:
	// this rank's own, or, unshared, every rank's (rank-major).
	iq, iw := l.iq.Rows(0, t), l.iw.Rows(0, t)
	qpos := a.Pos
	if !a.Shared {
		qw := hi*di + hi
		e.hostQ = growF(e.hostQ, t*qw)
		mine := e.hostQ
		e.view = mine[:t*hi*di]
		if err := b.Read(&e.view, iq); err != nil {
			return err
		}
		e.view = mine[t*hi*di:]
		if err := b.Read(&e.view, iw); err != nil {
			return err
		}
		e.send, e.sendN, e.recvN = e.send[:0], e.sendN[:0], e.recvN[:0]
		for r := range n {
			e.send = append(e.send, mine...)
			e.sendN = append(e.sendN, t*qw)
			e.recvN = append(e.recvN, len(a.Queries[r])*qw)
		}
		got, err := e.alltoall(ctx, a.Comm, "indexer queries")
		if err != nil {
			return err
		}
		// Unpack [rank: iq rows, iw rows] into one iq and one iw.
		total := len(got) / qw
		e.allQ = growF(e.allQ, total*qw)
		q, wts := e.allQ[:total*hi*di], e.allQ[total*hi*di:]
		at, row := 0, 0
		for r := range n {
			m := len(a.Queries[r])
			copy(q[row*hi*di:], got[at:at+m*hi*di])
			copy(wts[row*hi:], got[at+m*hi*di:at+m*qw])
			at, row = at+m*qw, row+m
		}
		if err := e.tensor(&e.iqT, compute.F32, total, hi, di); err != nil {
			return err
		}
		if err := e.tensor(&e.iwT, compute.F32, total, hi); err != nil {
			return err
		}
		e.view = q
		if err := b.Write(e.iqT, &e.view); err != nil {
			return err
		}
		e.view = wts
		if err := b.Write(e.iwT, &e.view); err != nil {
			return err
		}
		iq, iw = e.iqT, e.iwT
		e.local = e.local[:0]
		for _, qs := range a.Queries {
			e.local = append(e.local, qs...)
		}
		qpos = e.local
	}
	// This rank's candidates for every query: its best K keys up to the
	// query's position, as (score, position) pairs, -1 padded.
	nq := len(qpos)
	e.cand = growF(e.cand, nq*2*k)
	for i := 0; i < len(e.cand); i += 2 {
		e.cand[i], e.cand[i+1] = float32(math.Inf(-1)), -1
	}
	if keys := c.Len; keys > 0 {
		e.cnt, e.qpos = growI32(e.cnt, nq), growI32(e.qpos, nq)
		for q, p := range qpos {
			e.cnt[q] = int32(pl.below(me, int(p)+1))
			e.qpos[q] = max(e.cnt[q]-1, 0)
		}
		if err := e.tensor(&e.idxT, compute.I32, nq, k); err != nil {
			return err
		}
		if err := e.tensor(&e.scoreT, compute.F32, nq, keys); err != nil {
			return err
		}
		qposT, err := e.positions(b)
		if err != nil {
			return err
		}
		l.ixArgs = compute.IndexerArgs{Q: iq, W: iw, KPages: c.ik, PageSize: PageSize, KLen: keys,
			QPos: qposT, TopK: k, Indices: e.idxT, Scores: e.scoreT}
		if err := b.LightningIndexer(&l.ixArgs); err != nil {
			return fmt.Errorf("dsa: split indexer: %w", err)
		}
		if l.SplitIndexer != nil {
			// This rank's heads' share of the scores: the TP group adds
			// them before anything is chosen.
			if err := l.SplitIndexer(e.scoreT); err != nil {
				return fmt.Errorf("dsa: indexer scores over the heads' ranks: %w", err)
			}
		}
		e.idx, e.scores = growI32(e.idx, nq*k), growF(e.scores, nq*keys)
		if err := b.Read(&e.scores, e.scoreT); err != nil {
			return err
		}
		if l.SplitIndexer != nil {
			for q := range nq {
				topKPadded(e.idx[q*k:(q+1)*k], e.scores[q*keys:q*keys+int(e.cnt[q])])
			}
		} else if err := b.Read(&e.idx, e.idxT); err != nil {
			return err
		}
		held := pl.pos[me]
		for q := range nq {
			if e.cnt[q] == 0 {
				continue
			}
			for i := range k {
				li := e.idx[q*k+i]
				if li < 0 {
					break
				}
				e.cand[(q*k+i)*2] = e.scores[q*keys+int(li)]
				e.cand[(q*k+i)*2+1] = float32(held[li])
			}
		}
	}
	// Each query's candidates from every rank, at the query's rank.
	var lists []float32 // [rank][t queries][k pairs]
	if a.Shared {
		e.send = append(e.send[:0], e.cand...)
	} else {
		e.send = e.send[:0]
	}
	e.sendN, e.recvN = e.sendN[:0], e.recvN[:0]
	at := 0
	for r := range n {
		if a.Shared {
			// Every rank holds the same queries: each gets every list.
			if r > 0 {
				e.send = append(e.send, e.cand...)
			}
			e.sendN = append(e.sendN, nq*2*k)
		} else {
			m := len(a.Queries[r]) * 2 * k
			e.send = append(e.send, e.cand[at:at+m]...)
			e.sendN = append(e.sendN, m)
			at += m
		}
		e.recvN = append(e.recvN, t*2*k)
	}
	lists, err := e.alltoall(ctx, a.Comm, "candidates")
	if err != nil {
		return err
	}
	// The global top-K of each query: every rank's list is ranked, so
	// merge them.
	e.sel = growI32(e.sel, t*k)
	for q := range t {
		var head [maxMerge]int
		var hs []int
		if n <= maxMerge {
			hs = head[:n]
		} else {
			hs = make([]int, n)
		}
		sel := e.sel[q*k : (q+1)*k]
		for i := range sel {
			sel[i] = -1
		}
		for j := 0; j < k; j++ {
			best := -1
			var bs, bp float32
			for r := range n {
				if hs[r] >= k {
					continue
				}
				o := ((r*t+q)*k + hs[r]) * 2
				s, p := lists[o], lists[o+1]
				if p < 0 {
					continue
				}
				if best < 0 || better(s, p, bs, bp) {
					best, bs, bp = r, s, p
				}
			}
			if best < 0 {
				break
			}
			sel[j] = int32(bp)
			hs[best]++
		}
	}
	return nil
}

// maxMerge is the group size up to which merging needs no allocation.
const maxMerge = 16

// fetch gathers the latent and rope rows of e.need (increasing positions)
// into e.lat and e.pe: this rank's from its cache, the others' from the
// ranks holding them. With Shared every rank needs the same rows, so each
// sends what it holds without being asked; otherwise a rank first tells
// each holder which positions it wants.
func (e *Exchange) fetch(ctx context.Context, l *Layer, a *SplitPass) error {
	c, pl := a.Cache, a.Place
	n, me := a.Comm.Size(), a.Comm.Rank()
	dc, dr := l.cfg.KVLoRARank, l.cfg.RopeDim
	w := dc + dr
	for len(e.want) < n {
		e.want = append(e.want, nil)
	}
	for r := range n {
		e.want[r] = e.want[r][:0]
	}
	for _, p := range e.need {
		r := pl.Rank(int(p))
		e.want[r] = append(e.want[r], p)
	}
	// asked[r]: the positions rank r wants from this rank.
	asked := func(r int) []int32 { return e.want[me] }
	if !a.Shared {
		e.send, e.sendN, e.recvN = e.send[:0], e.sendN[:0], e.recvN[:0]
		for r := range n {
			e.send = append(e.send, float32(len(e.want[r])))
			e.sendN, e.recvN = append(e.sendN, 1), append(e.recvN, 1)
		}
		counts, err := e.alltoall(ctx, a.Comm, "request sizes")
		if err != nil {
			return err
		}
		e.send, e.sendN, e.recvN = e.send[:0], e.sendN[:0], e.recvN[:0]
		for r := range n {
			for _, p := range e.want[r] {
				e.send = append(e.send, float32(p))
			}
			e.sendN = append(e.sendN, len(e.want[r]))
			e.recvN = append(e.recvN, int(counts[r]))
		}
		req, err := e.alltoall(ctx, a.Comm, "requests")
		if err != nil {
			return err
		}
		e.got = append(e.got[:0], req...)
		e.starts = e.starts[:0]
		at := 0
		for r := range n {
			e.starts = append(e.starts, at)
			at += e.recvN[r]
		}
		asked = func(r int) []int32 {
			lo := e.starts[r]
			e.local = e.local[:0]
			for _, p := range e.got[lo : lo+e.recvN[r]] {
				e.local = append(e.local, int32(p))
			}
			return e.local
		}
	}
	// Reply: the asked rows, latent then rope, in the order asked.
	e.send, e.sendN = e.send[:0], e.sendN[:0]
	for r := range n {
		var rows []int32
		if r != me {
			rows = asked(r)
		}
		for _, p := range rows {
			if p < 0 || int(p) >= pl.Len() || pl.Rank(int(p)) != me {
				return fmt.Errorf("dsa: split rows: rank %d asked rank %d for position %d, which it does not hold", r, me, p)
			}
			at := len(e.send)
			e.send = slices.Grow(e.send, w)[:at+w]
			if err := c.readRow(&e.view, e.send[at:at+dc], e.send[at+dc:at+w], int(pl.row[p])); err != nil {
				return err
			}
		}
		e.sendN = append(e.sendN, len(rows)*w)
	}
	e.recvN = e.recvN[:0]
	for r := range n {
		m := len(e.want[r])
		if r == me {
			m = 0
		}
		e.recvN = append(e.recvN, m*w)
	}
	rows, err := e.alltoall(ctx, a.Comm, "rows")
	if err != nil {
		return err
	}
	// Every needed row in position order, from its holder's block.
	m := len(e.need)
	e.lat, e.pe = growF(e.lat, m*dc), growF(e.pe, m*dr)
	var next [maxMerge]int
	var start []int
	if n <= maxMerge {
		start = next[:n]
	} else {
		start = make([]int, n)
	}
	at := 0
	for r := range n {
		start[r] = at
		at += e.recvN[r]
	}
	for i, p := range e.need {
		r := pl.Rank(int(p))
		lat, pe := e.lat[i*dc:(i+1)*dc], e.pe[i*dr:(i+1)*dr]
		if r == me {
			if err := c.readRow(&e.view, lat, pe, int(pl.row[p])); err != nil {
				return err
			}
			continue
		}
		copy(lat, rows[start[r]:start[r]+dc])
		copy(pe, rows[start[r]+dc:start[r]+w])
		start[r] += w
	}
	return nil
}

// readRow copies the latent and rope key of row i into lat and pe,
// through view (a caller-owned slice header, so that handing the backend
// a pointer allocates nothing).
func (c *Cache) readRow(view *[]float32, lat, pe []float32, i int) error {
	if i < 0 || i >= c.Len {
		return fmt.Errorf("dsa: read row %d of %d", i, c.Len)
	}
	p := c.pool
	pg, r := i/PageSize, i%PageSize
	*view = lat
	if err := p.b.Read(view, c.pages[pg].kv.Rows(r, r+1)); err != nil {
		return err
	}
	if len(pe) == 0 {
		return nil
	}
	*view = pe
	return p.b.Read(view, c.pe[pg].Rows(r, r+1))
}

func growBool(b []bool, n int) []bool {
	if cap(b) < n {
		return make([]bool, n)
	}
	b = b[:n]
	clear(b)
	return b
}

func growF(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

func growI32(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

// positions writes e.qpos into e.qposT and returns it.
func (e *Exchange) positions(b compute.Backend) (compute.Tensor, error) {
	if err := e.tensor(&e.qposT, compute.I32, len(e.qpos)); err != nil {
		return compute.Tensor{}, err
	}
	return e.qposT, b.Write(e.qposT, &e.qpos)
}

// better is the indexer's order: larger score first, exact ties to the
// lower position.
func better(a, pa, b, pb float32) bool {
	if a != b {
		return a > b
	}
	return pa < pb
}
