package k3

import (
	"context"
	"fmt"
	"slices"

	"k3/comm"
	"k3/compute"
	"k3/config"
	"k3/dsa"
	"k3/internal/moe"
	"k3/kda"
)

// cpSeq is one rank's share of a sequence under context parallelism: the
// rank's model (the whole model, or with TP its shard), KDA states kept
// equal on every rank of its CP group, and the attention caches of the
// positions placed on this rank.
//
// A pass of T ≥ 2n new tokens (n ranks) is cut into 2n near-equal pieces;
// rank r takes piece r and piece 2n-1-r, the head-and-tail split that
// evens out causal attention's work. KDA layers are a recurrence, so a
// layer runs its pieces in order, each piece's rank taking the state from
// the previous piece's rank (Send/Recv) and the last one's rank handing the
// final state to all; attention layers run dsa's ForwardSplit, which moves
// only the keys each query attends to. Shorter inputs, decode steps among
// them, run on every rank alike, one token a pass: each rank computes the
// same row, the rank holding the fewest positions keeps its keys, and the
// attention gathers its top-K keys from wherever they are.
type cpSeq struct {
	m     *Model
	c     comm.Communicator
	bt    *Batch // the pass and the layers' scratch (its sessions unused)
	st    []*kda.State
	cache []*dsa.Cache
	place *dsa.Placement
	ex    *dsa.Exchange
	limit int

	// The running pass.
	ctx     context.Context
	shared  bool
	pos     []int32   // this rank's rows' positions
	queries [][]int32 // every rank's rows' positions
	pieces  [][3]int  // per piece: owner, first row in the owner's rows, rows
	seqs    kda.Seqs
	cu      [2]int32
	one     [1]*kda.State
	split   dsa.SplitPass
	tr      *Trace
	res     []cpResult // the last forward's results
	bufs    []cpBuf    // their positions and logits
	used    int        // bufs the running forward has taken
	ids     []int32
	pick    [1]int32

	// Beside EP, the MoE dispatches tokens over every rank; in a split
	// pass only this rank's CP slice (its TP group) holds its rows.
	disp  *moe.Dispatch
	slice moe.Holders
}

func (m *Model) newCPSeq(c comm.Communicator) (*cpSeq, error) {
	if err := m.life.enter(); err != nil {
		return nil, err
	}
	defer m.life.exit()
	q := &cpSeq{m: m, c: c, place: dsa.NewPlacement(c.Size()), ex: dsa.NewExchange(m.b), limit: m.Config.MaxPositionEmbeddings}
	if q.limit <= 0 {
		q.limit = 1 << 20
	}
	var err error
	if q.bt, err = m.newBatch(m.chunk); err != nil {
		return nil, err
	}
	for _, me := range q.bt.p.moeL {
		if me != nil {
			q.disp = me.Dispatch()
			break
		}
	}
	if p := m.par; q.disp != nil {
		q.slice = moe.Holders{Rank: p.tpIndex(), Ranks: p.layout.TP,
			AllGather: func(dst, src compute.Tensor) error { return p.tp.AllGather(q.ctx, dst, src) }}
	}
	for _, ly := range m.layers {
		var ks *kda.State
		var ch *dsa.Cache
		if ly.kind == config.KDA {
			ks, err = kda.NewState(m.b, ly.kdaCfg, 1)
		} else {
			ch, err = dsa.NewCache(ly.pages, q.limit)
		}
		if err != nil {
			q.close()
			return nil, err
		}
		q.st, q.cache = append(q.st, ks), append(q.cache, ch)
	}
	return q, nil
}

// fork returns a new sequence of q's rank holding what q holds: the KDA
// states copied, the attention caches sharing their full pages, the
// placement copied.
func (q *cpSeq) fork() (*cpSeq, error) {
	c, err := q.m.newCPSeq(q.c)
	if err != nil {
		return nil, err
	}
	if err := q.m.life.enter(); err != nil {
		c.close()
		return nil, err
	}
	defer q.m.life.exit()
	b := q.m.b
	for l, st := range q.st {
		if st != nil {
			if err := b.Copy(c.st[l].Conv, st.Conv); err != nil {
				c.close()
				return nil, err
			}
			if err := b.Copy(c.st[l].S, st.S); err != nil {
				c.close()
				return nil, err
			}
		}
		if src := q.cache[l]; src != nil {
			if err := c.cache[l].Fork(src); err != nil {
				c.close()
				return nil, err
			}
		}
	}
	c.place = q.place.Clone()
	return c, nil
}

func (q *cpSeq) close() {
	for _, s := range q.st {
		if s != nil {
			s.Free(q.m.b)
		}
	}
	for _, c := range q.cache {
		if c != nil {
			c.Free()
		}
	}
	q.ex.Free()
	q.st, q.cache = nil, nil
}

// cpResult is what one pass left on one rank: the positions of the rows
// whose logits it kept, their logits, and its trace.
type cpResult struct {
	pos    []int32
	logits []float32
	tr     *Trace
}

// forward feeds tokens after the sequence's positions: split passes over
// windows of up to n passes' rows, shared passes for what is shorter than
// 2n tokens. Each pass's result keeps every row's logits with all, else
// the last row's.
func (q *cpSeq) forward(ctx context.Context, tokens []int32, all, traced bool) ([]cpResult, error) {
	// The rank's model may have closed (Group.Close): its weights and
	// backend are gone then.
	if err := q.m.life.enter(); err != nil {
		return nil, err
	}
	defer q.m.life.exit()
	n := q.c.Size()
	q.ctx = ctx
	defer func() { q.ctx, q.tr = nil, nil }()
	if q.place.Len()+len(tokens) > q.limit {
		return nil, fmt.Errorf("%w: %d tokens after %d exceed %d", ErrContextFull, len(tokens), q.place.Len(), q.limit)
	}
	// Results and their buffers are reused from call to call: the caller
	// reads them before the next.
	res := q.res[:0]
	q.used = 0
	window := n * q.bt.max // a window's pieces each fit a pass
	for c0 := 0; c0 < len(tokens); {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		k := min(window, len(tokens)-c0)
		if k >= 2*n {
			r, err := q.splitPass(tokens[c0:c0+k], all, traced)
			if err != nil {
				return nil, err
			}
			res = append(res, r)
		} else {
			for i := range k {
				r, err := q.sharedPass(tokens[c0+i], traced)
				if err != nil {
					return nil, err
				}
				res = append(res, r)
			}
		}
		c0 += k
	}
	q.res = res
	return res, nil
}

// splitPass runs one head-and-tail split pass over tokens.
func (q *cpSeq) splitPass(tokens []int32, all, traced bool) (cpResult, error) {
	n, me := q.c.Size(), q.c.Rank()
	t, base := len(tokens), q.place.Len()
	q.shared = false
	q.pieces = q.pieces[:0]
	for len(q.queries) < n {
		q.queries = append(q.queries, nil)
	}
	for r := range n {
		q.queries[r] = q.queries[r][:0]
	}
	for j := range 2 * n {
		owner := j
		if j >= n {
			owner = 2*n - 1 - j
		}
		lo, hi := j*t/(2*n), (j+1)*t/(2*n)
		q.pieces = append(q.pieces, [3]int{owner, len(q.queries[owner]), hi - lo})
		for p := lo; p < hi; p++ {
			q.queries[owner] = append(q.queries[owner], int32(base+p))
		}
		q.place.Add(owner, hi-lo)
	}
	q.pos = q.queries[me]
	if q.disp != nil {
		q.disp.Holders = &q.slice
	}
	q.ids = q.ids[:0]
	for _, p := range q.pos {
		q.ids = append(q.ids, tokens[int(p)-base])
	}
	q.pick[0] = int32(len(q.ids) - 1)
	return q.run(all, traced)
}

// sharedPass runs one token on every rank alike.
func (q *cpSeq) sharedPass(token int32, traced bool) (cpResult, error) {
	p := q.place.Len()
	q.shared = true
	if q.disp != nil {
		q.disp.Holders = nil // every rank holds the row
	}
	q.place.Add(q.place.Fewest(), 1)
	q.pos = append(q.pos[:0], int32(p))
	q.ids = append(q.ids[:0], token)
	q.pick[0] = 0
	return q.run(false, traced)
}

// run runs the pass set up in q.pos and q.ids.
func (q *cpSeq) run(all, traced bool) (cpResult, error) {
	var r cpResult
	if traced {
		r.tr = &Trace{}
	}
	q.tr = r.tr
	if err := q.bt.p.run(q.ids, q.mix, r.tr, all, q.pick[:]); err != nil {
		return r, err
	}
	rows := 1
	pos := q.pos[len(q.pos)-1:]
	if all {
		rows, pos = len(q.pos), q.pos
	}
	if q.used == len(q.bufs) {
		q.bufs = append(q.bufs, cpBuf{})
	}
	buf := &q.bufs[q.used]
	q.used++
	buf.pos = append(buf.pos[:0], pos...)
	buf.logits = growF32(buf.logits, rows*q.m.Config.VocabSize)
	r.pos, r.logits = buf.pos, buf.logits
	return r, q.m.b.Read(&buf.logits, q.bt.p.logits.Rows(0, rows))
}

// cpBuf holds one pass's result between a forward and the next.
type cpBuf struct {
	pos    []int32
	logits []float32
}

// mix runs layer l's token mixer for the pass's rows on this rank.
func (q *cpSeq) mix(l int, normed, out compute.Tensor) error {
	if kl := q.bt.kdaL[l]; kl != nil {
		return q.mixKDA(kl, q.st[l], normed, out)
	}
	q.split = dsa.SplitPass{Comm: q.c, Cache: q.cache[l], Place: q.place, Pos: q.pos, Queries: q.queries, Shared: q.shared}
	if err := q.bt.mlaL[l].ForwardSplit(q.ctx, q.ex, &q.split, normed, out); err != nil {
		return err
	}
	if tr := q.tr; tr != nil && q.m.layers[l].kind == config.DSA {
		tr.DSAIndices = append(tr.DSAIndices, q.bt.p.readI32(q.bt.mlaL[l].Indices(normed.Dim(0))))
	}
	return nil
}

// mixKDA runs a KDA layer: a shared row with the decode arithmetic; split
// pieces in order, the state travelling from each piece's rank to the
// next's, then from the last piece's rank to every rank.
func (q *cpSeq) mixKDA(kl *kda.Layer, st *kda.State, normed, out compute.Tensor) error {
	q.one[0] = st
	if q.shared {
		q.cu = [2]int32{0, 1}
		q.seqs = kda.Seqs{Cu: q.cu[:], States: q.one[:], Exact: 1}
		return kl.Forward(normed, &q.seqs, out)
	}
	me := q.c.Rank()
	holder := q.pieces[0][0] // every rank starts from the same state
	for _, pc := range q.pieces {
		owner, r0, rows := pc[0], pc[1], pc[2]
		if owner != holder {
			if err := q.moveState(st, holder, owner); err != nil {
				return err
			}
			holder = owner
		}
		if owner != me {
			continue
		}
		q.cu = [2]int32{0, int32(rows)}
		q.seqs = kda.Seqs{Cu: q.cu[:], States: q.one[:]}
		if err := kl.Forward(normed.Rows(r0, r0+rows), &q.seqs, out.Rows(r0, r0+rows)); err != nil {
			return err
		}
	}
	for r := range q.c.Size() {
		if r != holder {
			if err := q.moveState(st, holder, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// moveState sends rank from's state to rank to (a no-op for the others).
func (q *cpSeq) moveState(st *kda.State, from, to int) error {
	me := q.c.Rank()
	for _, t := range []compute.Tensor{st.Conv, st.S} {
		var err error
		switch me {
		case from:
			err = q.c.Send(q.ctx, t, to)
		case to:
			err = q.c.Recv(q.ctx, t, from)
		}
		if err != nil {
			return fmt.Errorf("k3: KDA state from rank %d to %d: %w", from, to, err)
		}
	}
	return nil
}

// forwardCP feeds tokens to every rank's share and returns every new
// position's logits with all (else nil), leaving the last one's in the
// shell for Generate. A failure inside a pass leaves the ranks' shares
// apart (the group's collectives abort), so the session is unusable after.
func (gs *GroupSession) forwardCP(ctx context.Context, tokens []int32, all bool, tr *Trace) ([]float32, error) {
	if gs.cp == nil {
		return nil, ErrSessionClosed
	}
	if gs.broken != nil {
		return nil, fmt.Errorf("k3: group session unusable after an earlier failure: %w", gs.broken)
	}
	v := gs.g.ranks[0].Config.VocabSize
	if len(tokens) == 0 {
		return nil, ErrEmptyPrompt
	}
	for i, t := range tokens {
		if t < 0 || int(t) >= v {
			return nil, fmt.Errorf("%w: token %d at index %d (vocabulary %d)", ErrBadToken, t, i, v)
		}
	}
	base := gs.cp[0].place.Len()
	if base+len(tokens) > gs.cp[0].limit {
		return nil, fmt.Errorf("%w: %d tokens after %d exceed %d", ErrContextFull, len(tokens), base, gs.cp[0].limit)
	}
	res := make([][]cpResult, len(gs.cp))
	gs.g.pass.Lock()
	defer gs.g.pass.Unlock()
	err := gs.each(len(gs.cp), func(r int) error {
		var err error
		res[r], err = gs.cp[r].forward(ctx, tokens, all, tr != nil)
		return err
	})
	if err != nil {
		gs.broken = err
		return nil, err
	}
	// The ranks of a CP slice's TP group computed the same rows: one
	// each (TP index 0) says what the slice did.
	if tp := gs.g.layout.TP; tp > 1 {
		for c := range len(res) / tp {
			res[c] = res[c*tp]
		}
		res = res[:len(res)/tp]
	}
	var out []float32
	if all {
		out = make([]float32, len(tokens)*v)
	}
	if gs.shell.last == nil {
		gs.shell.last = make([]float32, v)
	}
	final := int32(base + len(tokens) - 1)
	var mark traceMark
	if tr != nil {
		mark = tr.mark()
	}
	for i := range res[0] {
		for r := range res {
			pr := res[r][i]
			for k, p := range pr.pos {
				row := pr.logits[k*v : (k+1)*v]
				if all {
					copy(out[(int(p)-base)*v:], row)
				}
				if p == final && r == 0 {
					copy(gs.shell.last, row)
				}
			}
		}
		if tr != nil {
			var pass Trace
			mergeTrace(&pass, res, i)
			tr.fold(mark, &pass)
		}
	}
	gs.shell.tokens = append(gs.shell.tokens, tokens...)
	gs.shell.pos += len(tokens)
	return out, nil
}

// generateCP is Generate under context parallelism: the draws run on the
// caller's goroutine from rank 0's logits (every rank has the last
// position's after a shared pass; after a split one rank 0 holds it), and
// each drawn token runs on every rank.
func (gs *GroupSession) generateCP(ctx context.Context, prompt []int32, opts []GenerateOption, yield func(Token, error) bool) {
	if gs.cp == nil {
		yield(Token{}, ErrSessionClosed)
		return
	}
	g, err := gs.shell.prepareGeneration(prompt, opts)
	if err != nil {
		yield(Token{}, err)
		return
	}
	if len(prompt) > 0 {
		if _, err := gs.forwardCP(ctx, prompt, false, nil); err != nil {
			yield(Token{}, err)
			return
		}
	}
	var one [1]int32
	for {
		st, err := g.advance(ctx)
		for _, tok := range st.ready {
			if !yield(tok, nil) {
				if tok.Finish == FinishNone {
					return
				}
				yield = func(Token, error) bool { return false }
			}
		}
		if err != nil {
			yield(Token{}, err)
			return
		}
		if st.feed {
			one[0] = st.id
			if _, err := gs.forwardCP(ctx, one[:], false, nil); err != nil {
				yield(Token{}, err)
				return
			}
		}
		if st.done {
			return
		}
	}
}

// mergeTrace appends pass i of every rank's results to tr, the rows of
// each intermediate in position order as one rank's pass would record
// them.
func mergeTrace(tr *Trace, res [][]cpResult, i int) {
	parts := make([]cpResult, len(res))
	for r := range res {
		parts[r] = res[r][i]
	}
	if len(parts[0].pos) == 1 && len(parts) > 1 && len(parts[1].pos) == 1 && parts[0].pos[0] == parts[1].pos[0] {
		// A shared pass: every rank recorded the same row.
		appendTrace(tr, parts[0].tr)
		return
	}
	type src = struct{ p, r, k int }
	var order []src
	for r, pr := range parts {
		for k, p := range pr.pos {
			order = append(order, src{int(p), r, k})
		}
	}
	slices.SortFunc(order, func(a, b src) int { return a.p - b.p })
	f32 := func(get func(*Trace) [][]float32) [][]float32 { return mergeRows(parts, order, get) }
	tr.HiddenAfterLayer = append(tr.HiddenAfterLayer, f32(func(t *Trace) [][]float32 { return t.HiddenAfterLayer })...)
	tr.AttnInput = append(tr.AttnInput, f32(func(t *Trace) [][]float32 { return t.AttnInput })...)
	tr.MLPInput = append(tr.MLPInput, f32(func(t *Trace) [][]float32 { return t.MLPInput })...)
	tr.AttnOutput = append(tr.AttnOutput, f32(func(t *Trace) [][]float32 { return t.AttnOutput })...)
	tr.MLPOutput = append(tr.MLPOutput, f32(func(t *Trace) [][]float32 { return t.MLPOutput })...)
	tr.MoEWeights = append(tr.MoEWeights, f32(func(t *Trace) [][]float32 { return t.MoEWeights })...)
	for _, h := range f32(func(t *Trace) [][]float32 { return [][]float32{t.FinalHidden} }) {
		tr.FinalHidden = append(tr.FinalHidden, h...)
	}
	tr.DSAIndices = append(tr.DSAIndices, mergeRows(parts, order, func(t *Trace) [][]int32 { return t.DSAIndices })...)
	tr.MoEIndices = append(tr.MoEIndices, mergeRows(parts, order, func(t *Trace) [][]int32 { return t.MoEIndices })...)
}

// mergeRows interleaves each entry's rows from every rank by position.
func mergeRows[E any](parts []cpResult, order []struct{ p, r, k int }, get func(*Trace) [][]E) [][]E {
	entries := get(parts[0].tr)
	out := make([][]E, len(entries))
	for li := range entries {
		var buf []E
		for _, o := range order {
			e := get(parts[o.r].tr)[li]
			w := len(e) / len(parts[o.r].pos)
			buf = append(buf, e[o.k*w:(o.k+1)*w]...)
		}
		out[li] = buf
	}
	return out
}

// appendTrace appends every entry of src to tr.
func appendTrace(tr, src *Trace) {
	tr.HiddenAfterLayer = append(tr.HiddenAfterLayer, src.HiddenAfterLayer...)
	tr.AttnInput = append(tr.AttnInput, src.AttnInput...)
	tr.MLPInput = append(tr.MLPInput, src.MLPInput...)
	tr.AttnOutput = append(tr.AttnOutput, src.AttnOutput...)
	tr.MLPOutput = append(tr.MLPOutput, src.MLPOutput...)
	tr.FinalHidden = append(tr.FinalHidden, src.FinalHidden...)
	tr.DSAIndices = append(tr.DSAIndices, src.DSAIndices...)
	tr.MoEIndices = append(tr.MoEIndices, src.MoEIndices...)
	tr.MoEWeights = append(tr.MoEWeights, src.MoEWeights...)
}
