package k3

import (
	"context"
	"errors"
	"fmt"

	"k3/compute"
	"k3/config"
	"k3/dsa"
	"k3/kda"
)

// Batch decodes one token for each of several sessions in one pass over
// the weights (Step), or a short run of tokens for each (Forward): every
// projection and expert reads its weights once for the whole batch, while
// each session keeps its own caches and states. Results equal decoding
// each session alone, bitwise. Sessions may differ from one Step to
// the next (continuous batching). A Batch is not safe for concurrent use.
type Batch struct {
	m       *Model
	max     int
	kdaL    []*kda.Layer
	mlaL    []*dsa.Layer
	p       *pass
	mix     mixer
	cur     []*Session // the sessions of the running step
	states  []*kda.State
	caches  []*dsa.Cache // one per session of the running pass
	kdaSeqs kda.Seqs
	dsaSeqs dsa.Seqs
	rec     *recorder
	cu      []int32 // the running pass's row offsets per session
	cuAll   []int32 // Step's offsets: one row per session
	ids     []int32 // the running pass's tokens
	picked  []int32 // the running pass's rows that get logits, without all
	nExact  int     // sessions of the running pass that are exact runs
	passes  []batchPass
	trace   *Trace    // a single session's trace, while it runs
	tapRows []float32 // keepTaps' view of a session's new taps (read by pointer: no allocation)
	// promised is the room the Batcher that runs the batch keeps for its
	// sequences' growth (Batcher.keep; 0 for other batches).
	promised int64
	// fan, on rank 0's batch of a GroupBatcher, runs each pass on the
	// group's other ranks too.
	fan *batchFan

	// With state slabs: the running pass's exact sessions' slots (I32
	// [slabSize], written before the pass) and their slab, nil when they
	// are not in one.
	slots    compute.Tensor
	slotHost []int32
	slab     *slab

	// A whole step's prepared attention layers and key (stepGraph).
	prepared []*dsa.Layer
	keyDeps  []compute.Tensor
	keyInts  []int32
}

// NewBatch prepares a batch of up to max rows per pass: max sessions a
// Step, or max tokens in all a Forward.
func (m *Model) NewBatch(max int) (*Batch, error) {
	if max <= 0 {
		return nil, fmt.Errorf("k3: batch size %d must be positive", max)
	}
	if err := m.life.enter(); err != nil {
		return nil, err
	}
	defer m.life.exit()
	return m.newBatch(max)
}

// newBatch builds a batch of up to max rows per pass; sessions' workspaces
// are batches too.
func (m *Model) newBatch(max int) (*Batch, error) { return m.newBatchExact(max, max) }

// newBatchExact is newBatch for passes of at most exact exact rows (a
// session's workspace runs one session: at most ExactTokens), which sizes
// the replay records' rows.
func (m *Model) newBatchExact(max, exact int) (*Batch, error) {
	bt := &Batch{m: m, max: max}
	var err error
	if bt.p, err = newPass(m, max); err != nil {
		return nil, err
	}
	bt.mix = bt.mixLayer
	if bt.rec, err = m.newRecorder(min(exact, max)); err != nil {
		return nil, err
	}
	var firstKDA *kda.Layer
	firstAttn := map[config.LayerKind]*dsa.Layer{}
	for _, ly := range m.layers {
		var kl *kda.Layer
		var ml *dsa.Layer
		switch {
		case ly.kind == config.KDA && firstKDA != nil:
			kl = firstKDA.Share(ly.kda)
		case ly.kind == config.KDA:
			kl, err = kda.NewLayer(m.b, ly.kdaCfg, ly.kda, max) // prefill chunks use its scratch
			firstKDA = kl
		case firstAttn[ly.kind] != nil:
			ml = firstAttn[ly.kind].Share(ly.mla)
		default:
			ml, err = dsa.NewLayer(m.b, ly.mlaCfg, ly.mla, max)
			if err == nil && m.par.splitIndexer() && ly.kind == config.DSA {
				ml.SplitIndexer = m.par.reduceTP
			}
			firstAttn[ly.kind] = ml
		}
		if err != nil {
			return nil, err
		}
		if ml != nil && m.graphs != nil {
			ml.Capture = m.graphs.capture(bt, len(bt.mlaL))
		}
		if _, ok := m.b.(compute.Capturer); ok && ml != nil {
			ml.StaticTopK = true
		}
		bt.kdaL, bt.mlaL = append(bt.kdaL, kl), append(bt.mlaL, ml)
	}
	if m.slabs != nil {
		if bt.slots, err = m.b.Alloc(compute.I32, slabSize); err != nil {
			return nil, err
		}
		bt.slotHost = make([]int32, 0, slabSize)
	}
	return bt, nil
}

// Step feeds tokens[i] to sessions[i] for every i, in one pass. Each
// session's next-token logits are then available to its generation (and
// through Logits).
func (bt *Batch) Step(ctx context.Context, sessions []*Session, tokens []int32) error {
	n := len(sessions)
	if n != len(tokens) {
		return fmt.Errorf("k3: batch step with %d sessions but %d tokens (one token per session)", n, len(tokens))
	}
	if n > bt.max {
		return fmt.Errorf("k3: batch step with %d sessions, more than the batch's limit of %d (NewBatch(%d))", n, bt.max, bt.max)
	}
	bt.cuAll = bt.cuAll[:0]
	for i := range n + 1 {
		bt.cuAll = append(bt.cuAll, int32(i))
	}
	return bt.run(ctx, sessions, bt.cuAll, tokens, nil, nil)
}

// Forward feeds tokens[i] to sessions[i] for every i in one ragged pass
// (more when the rows outgrow a group; see below) and returns the logits
// of every new position, session after session ([Σ len(tokens[i])][vocab]).
// A session with at most ExactTokens tokens is computed with the
// single-step arithmetic: its logits and states are bitwise those of its
// tokens fed one by one alone, which is how drafted tokens of many
// sequences are verified together. Longer runs are prefill chunks in the
// same pass, after the exact rows, with the products split between the
// two so the exact rows keep their arithmetic; a chunk's results are
// within the conformance tolerance of decoding it. Each session's tokens
// must fit the batch (NewBatch's limit).
func (bt *Batch) Forward(ctx context.Context, sessions []*Session, tokens [][]int32) ([]float32, error) {
	if len(sessions) != len(tokens) {
		return nil, fmt.Errorf("k3: batch forward with %d sessions but %d token lists", len(sessions), len(tokens))
	}
	cu := []int32{0}
	var flat []int32
	for i, ts := range tokens {
		if len(ts) == 0 || len(ts) > bt.max {
			return nil, fmt.Errorf("k3: batch forward: session %d has %d tokens, want 1..%d (the batch's limit)", i, len(ts), bt.max)
		}
		flat = append(flat, ts...)
		cu = append(cu, int32(len(flat)))
	}
	out := make([]float32, len(flat)*bt.m.Config.VocabSize)
	if err := bt.run(ctx, sessions, cu, flat, out, nil); err != nil {
		return nil, err
	}
	return out, nil
}

// run feeds sessions[i] the tokens ids[cu[i]:cu[i+1]], and writes every
// row's logits to out when it is not nil. Exact sessions go in groups of
// at most compute.InvariantRows rows, one pass each; prefill sessions join
// the last pass while the rows fit the batch, else passes of their own.
func (bt *Batch) run(ctx context.Context, sessions []*Session, cu, ids []int32, out []float32, rows [][]float32) error {
	if len(sessions) == 0 {
		return errors.New("k3: batch step with no sessions")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := bt.m.life.enter(); err != nil {
		return err
	}
	defer bt.m.life.exit()
	if err := bt.check(sessions, cu, ids); err != nil {
		return err
	}
	if bt.fan != nil {
		return bt.fan.run(bt, sessions, cu, ids, out, rows)
	}
	return bt.reserveAndExecute(sessions, cu, ids, out, rows)
}

// check refuses a call no pass can run.
func (bt *Batch) check(sessions []*Session, cu, ids []int32) error {
	m := bt.m
	cfg := m.Config
	for i, s := range sessions {
		if s == nil {
			return fmt.Errorf("k3: batch step: session %d is nil", i)
		}
		if s.m != m {
			return errors.New("k3: batch step with a session of another model")
		}
		if s.closed {
			return fmt.Errorf("k3: batch step: session %d: %w", i, ErrSessionClosed)
		}
		if s.broken != nil {
			return fmt.Errorf("k3: session %d unusable after an earlier failure: %w", i, s.broken)
		}
		k := int(cu[i+1] - cu[i])
		if k > bt.max {
			return fmt.Errorf("k3: batch step: session %d has %d tokens, more than the batch's limit of %d (NewBatch(%d))", i, k, bt.max, bt.max)
		}
		for _, t := range ids[cu[i]:cu[i+1]] {
			if t < 0 || int(t) >= cfg.VocabSize {
				return fmt.Errorf("%w: token %d for session %d", ErrBadToken, t, i)
			}
		}
		if s.pos+k > s.limit {
			return fmt.Errorf("%w: session %d holds %d tokens, %d more exceed %d", ErrContextFull, i, s.pos, k, s.limit)
		}
		for j := 0; j < i; j++ {
			if sessions[j] == s {
				return fmt.Errorf("k3: session %d appears twice in one batch step", i)
			}
		}
	}
	return nil
}

// reserveAndExecute runs a checked call: the state it will grow by is
// reserved first, so that past the budget the call fails before anything
// changes.
func (bt *Batch) reserveAndExecute(sessions []*Session, cu, ids []int32, out []float32, rows [][]float32) error {
	// A Batcher's pass grows into the room it keeps for its sequences,
	// which the ledger already counts; only what goes past it is taken.
	var grow int64
	for i, s := range sessions {
		grow += s.growth(int(cu[i+1] - cu[i]))
	}
	grow = max(0, grow-bt.promised)
	taken := bt.m.mem.take(grow, "a batch pass")
	if err := bt.m.par.agree(taken); err != nil {
		if taken == nil {
			bt.m.mem.add(-grow) // taken here, refused elsewhere
		}
		return err
	}
	defer func() {
		bt.m.mem.add(-grow)
		for _, s := range sessions {
			s.charge()
		}
	}()
	return bt.execute(sessions, cu, ids, out, rows, nil, out != nil)
}

// execute runs the passes of a call whose input is valid. With all every
// row gets logits (and out, when not nil, receives them), else each
// session's last row alone, but for sessions whose rows[i] is not nil:
// those get every row's logits, into rows[i] (a verify pass beside other
// sequences). tr, when not nil (one session only), receives the
// intermediates.
func (bt *Batch) execute(sessions []*Session, cu, ids []int32, out []float32, rows [][]float32, tr *Trace, all bool) error {
	b, v := bt.m.b, bt.m.Config.VocabSize
	bt.plan(cu)
	bt.trace = tr
	defer func() { bt.trace = nil; bt.forget() }()
	for _, ps := range bt.passes {
		bt.cur, bt.cu, bt.ids = bt.cur[:0], append(bt.cu[:0], 0), bt.ids[:0]
		for _, i := range ps.sessions {
			bt.cur = append(bt.cur, sessions[i])
			bt.ids = append(bt.ids, ids[cu[i]:cu[i+1]]...)
			bt.cu = append(bt.cu, int32(len(bt.ids)))
		}
		bt.nExact = ps.exact
		if e := int(bt.cu[ps.exact]); bt.rec.short(e) {
			// Before anything of the pass runs: no session is touched.
			return fmt.Errorf("k3: a pass of %d exact rows in a batch that records %d", e, bt.rec.max)
		}
		if err := bt.writeSlots(); err != nil {
			return err
		}
		bt.p.split = int(bt.cu[ps.exact])
		bt.picked = bt.picked[:0]
		for j, i := range ps.sessions {
			lo := bt.cu[j+1] - 1
			if rows != nil && rows[i] != nil {
				lo = bt.cu[j]
			}
			for r := lo; r < bt.cu[j+1]; r++ {
				bt.picked = append(bt.picked, r)
			}
		}
		picks := 0 // the picked rows of the sessions before this one
		whole, err := bt.stepGraph(all)
		if !whole && err == nil {
			err = bt.p.run(bt.ids, bt.mix, tr, all, bt.picked)
		}
		bt.p.split = 0
		if err == nil {
			// Each KDA layer's records, when they have rows of their own.
			err = bt.rec.appendAll(b, bt.cur[:bt.nExact], bt.cu[:bt.nExact+1])
		}
		if err != nil {
			for _, s := range bt.cur {
				s.broken = err
			}
			return err
		}
		for j, i := range ps.sessions {
			s := sessions[i]
			r0, r1 := int(bt.cu[j]), int(bt.cu[j+1])
			if out != nil {
				if err := b.Read(out[int(cu[i])*v:int(cu[i+1])*v], bt.p.logits.Rows(r0, r1)); err != nil {
					return err
				}
			}
			if s.last == nil {
				s.last = make([]float32, v)
			}
			last := r1 - 1
			if !all {
				// The pass computed the picked rows' logits alone.
				if rows != nil && rows[i] != nil {
					if err := b.Read(rows[i][:(r1-r0)*v], bt.p.logits.Rows(picks, picks+r1-r0)); err != nil {
						return err
					}
					picks += r1 - r0
				} else {
					picks++
				}
				last = picks - 1
			}
			if err := b.Read(&s.last, bt.p.logits.Rows(last, last+1)); err != nil { // by pointer: no allocation
				return err
			}
			k := r1 - r0
			if err := bt.keepTaps(s, r0, r1); err != nil {
				return err
			}
			s.pos += k
			s.tokens = append(s.tokens, ids[cu[i]:cu[i+1]]...)
			if err := s.commitLogs(k); err != nil {
				s.broken = err
				return err
			}
			if err := s.takeSnapshot(); err != nil {
				s.broken = err
				return err
			}
			if err := s.trackTurn(); err != nil {
				s.broken = err
				return err
			}
		}
	}
	return nil
}

// forget drops the batch's references to the sessions of the last call,
// so that a workspace kept by the model holds no closed session alive.
func (bt *Batch) forget() {
	bt.kdaSeqs, bt.dsaSeqs, bt.slab = kda.Seqs{}, dsa.Seqs{}, nil
	clear(bt.cur[:cap(bt.cur)])
	clear(bt.states[:cap(bt.states)])
	clear(bt.caches[:cap(bt.caches)])
	bt.cur, bt.states, bt.caches = bt.cur[:0], bt.states[:0], bt.caches[:0]
}

// batchPass is one pass of a batch step: sessions (indices into the
// call's), the exact ones first.
type batchPass struct {
	sessions []int
	exact    int
}

// plan splits a call's sessions (row offsets cu) into passes.
func (bt *Batch) plan(cu []int32) {
	n := len(cu) - 1
	for i := range bt.passes {
		bt.passes[i].sessions = bt.passes[i].sessions[:0]
	}
	bt.passes = bt.passes[:0]
	next := func() *batchPass {
		if len(bt.passes) < cap(bt.passes) {
			bt.passes = bt.passes[:len(bt.passes)+1]
		} else {
			bt.passes = append(bt.passes, batchPass{})
		}
		p := &bt.passes[len(bt.passes)-1]
		p.sessions, p.exact = p.sessions[:0], 0
		return p
	}
	rows := func(p *batchPass) int {
		r := 0
		for _, i := range p.sessions {
			r += int(cu[i+1] - cu[i])
		}
		return r
	}
	limit := min(bt.max, compute.InvariantRows)
	var cur *batchPass
	for i := range n {
		if k := int(cu[i+1] - cu[i]); k <= ExactTokens {
			if cur == nil || rows(cur)+k > limit {
				cur = next()
			}
			cur.sessions = append(cur.sessions, i)
			cur.exact++
		}
	}
	for i := range n {
		if k := int(cu[i+1] - cu[i]); k > ExactTokens {
			if cur == nil || rows(cur)+k > bt.max {
				cur = next()
			}
			cur.sessions = append(cur.sessions, i)
		}
	}
}

// mixLayer runs layer l's token mixer over the rows of every session of
// the pass, each against its own state, in one call: the exact sessions'
// rows with the single-step arithmetic, then the prefill chunks, each
// kind reading every weight once.
func (bt *Batch) mixLayer(l int, normed, out compute.Tensor) error {
	ne := bt.nExact
	e := int(bt.cu[ne])
	if kl := bt.kdaL[l]; kl != nil {
		bt.states = bt.states[:0]
		for _, s := range bt.cur {
			bt.states = append(bt.states, s.kdaSt[l])
		}
		bt.kdaSeqs = kda.Seqs{Cu: bt.cu, States: bt.states, Exact: ne}
		if bt.slab != nil {
			bt.kdaSeqs.Pool, bt.kdaSeqs.Slots = bt.slab.pools[l], bt.slots
		}
		if ne > 0 {
			bt.kdaSeqs.Records = bt.rec.rows(l, e)
		}
		if err := bt.kdaForward(l, kl, normed, out); err != nil {
			return err
		}
		if ne > 0 && !bt.rec.perLayer {
			// The layers share the rows: this layer's go to the logs now.
			return bt.rec.appendRuns(bt.m.b, bt.cur[:ne], bt.cu[:ne+1], l)
		}
		return nil
	}
	ml := bt.mlaL[l]
	ml.DenseSelections = bt.trace != nil // a trace records every row's selection
	bt.dsaSeqs = dsa.Seqs{Cu: bt.cu, Caches: bt.cachesOf(l), Exact: ne}
	if err := ml.Forward(normed, &bt.dsaSeqs, out); err != nil {
		return err
	}
	if bt.trace != nil && bt.m.layers[l].kind == config.DSA {
		bt.trace.DSAIndices = append(bt.trace.DSAIndices, bt.p.readI32(ml.Indices(normed.Dim(0))))
	}
	return nil
}

// cachesOf sets bt.caches to layer l's cache of every session of the
// running pass and returns it.
func (bt *Batch) cachesOf(l int) []*dsa.Cache {
	bt.caches = bt.caches[:0]
	for _, s := range bt.cur {
		bt.caches = append(bt.caches, s.caches[l])
	}
	return bt.caches
}

// kdaForward runs KDA layer kl over bt.kdaSeqs, through the model's graphs
// when the pass is a decode step they capture: exact rows only, at most
// graphMaxRows of them, no trace (whose reads would fail a capture), and
// replay records only in rows of the layer's own, which the logs read
// after the step. The rows are not padded: a padding row would need a
// state of its own.
func (bt *Batch) kdaForward(l int, kl *kda.Layer, normed, out compute.Tensor) error {
	g, s := bt.m.graphs, &bt.kdaSeqs
	t := normed.Dim(0)
	if g == nil || bt.trace != nil || s.Exact != len(s.States) || t > graphMaxRows || (!s.Records.IsZero() && !bt.rec.perLayer) {
		return kl.Forward(normed, s, out)
	}
	g.begin()
	g.dep(normed, out, s.Records)
	if s.Pool != nil && kl.Composes() {
		// The composition reads the states through the slots written
		// before the pass: the key holds the pools and the slots tensor,
		// whichever sessions fill them.
		g.dep(s.Pool.Conv, s.Pool.S, s.Slots)
	} else {
		// A replay updates the states it was captured on, which the key
		// holds.
		for _, st := range s.States {
			g.dep(st.S, st.Conv)
		}
	}
	g.num(s.Cu...)
	return g.run(graphKDA, l, t, func() error { return kl.Forward(normed, s, out) })
}

// keepTaps copies the last rows of r0..r1 of the pass's DSpark taps (the
// session's new positions) to the session, where a DSpark drafter reads
// its anchor: the last position, or after a verify run of at most
// ExactTokens rows and its rollback, one of them; so ExactTokens rows
// suffice. A run may be cut into several passes (with the prefix cache,
// at multiples of the prefill chunk), so the rows kept from the passes
// before it stay below the new ones, up to ExactTokens in all, where they
// end at the pass's first position.
func (bt *Batch) keepTaps(s *Session, r0, r1 int) error {
	taps := bt.p.taps
	if taps == nil {
		return nil
	}
	d := bt.m.Config.HiddenSize
	k0 := max(r0, r1-ExactTokens)
	n := r1 - k0
	if len(s.taps) != len(taps) {
		s.taps, s.tapsRows = make([][]float32, len(taps)), 0
		for i := range s.taps {
			s.taps[i] = make([]float32, 0, ExactTokens*d)
		}
	}
	// The rows kept before s.pos (a rollback may have taken back the
	// rest) that end where the pass begins.
	old, end := 0, s.pos-s.tapsPos
	if end > 0 && end <= s.tapsRows {
		old = min(end, ExactTokens-n)
	}
	for i, t := range taps {
		tp := s.taps[i][:(old+n)*d]
		if old > 0 {
			copy(tp, s.taps[i][(end-old)*d:end*d])
		}
		bt.tapRows = tp[old*d:]
		if err := bt.m.b.Read(&bt.tapRows, t.Rows(k0, r1)); err != nil {
			return err
		}
		s.taps[i] = tp
	}
	s.tapsPos, s.tapsRows = s.pos+k0-r0-old, old+n
	return nil
}

// stepGraph runs the pass as one graph when a capturing backend can hold
// it whole: a decode or verification pass of exact runs (at most
// graphMaxRows rows, no trace; replay records only in rows of each
// layer's own, and a DSpark module's taps, all read after the step) whose
// sessions' KDA states share a slab and whose KDA layers take their
// composition, and whose attention layers all have their pages in one
// page slab. The host work a replay skips is done first: the attention
// layers' reservations, positions, slots and page tables and their
// caches' lengths (dsa.Layer.Prepare and Commit), the KDA slots
// (writeSlots, before) and the token ids. The key names the pass's
// buffers, the slabs' pools and the layers' tables, with the rows'
// offsets, the picked rows and every attention run's dense rows and page
// bucket. A step of one row per session is padded to its bucket of rows
// first (pad), so that one graph serves every batch size of the bucket.
// Inside it every piece runs directly (graphs.inline). It reports
// whether it ran the pass; when it did not, nothing but room and
// metadata the pass's own run finds again has changed.
func (bt *Batch) stepGraph(all bool) (bool, error) {
	m, p, g := bt.m, bt.p, bt.m.graphs
	t := len(bt.ids)
	if g == nil || g.piecesOnly || bt.trace != nil || bt.nExact != len(bt.cur) || t > graphMaxRows || (!bt.rec.dev.IsZero() && !bt.rec.perLayer) ||
		(m.slabs != nil && bt.slab == nil) {
		return false, nil
	}
	for _, kl := range bt.kdaL {
		if kl != nil && !kl.Composes() {
			return false, nil // the first pass decides; a fused step on the host is not captured
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n, picked := len(bt.cur), len(bt.picked)
	padded := bt.pad()
	whole := false
	if padded > 0 {
		if err := bt.writeSlots(); err != nil {
			bt.unpad(n, picked, padded)
			return false, err
		}
		defer func() {
			bt.unpad(n, picked, padded)
			if !whole {
				// The pass runs unpadded in pieces: its own slots again.
				if err := bt.writeSlots(); err != nil {
					bt.slab = nil
				}
			}
		}()
	}
	bt.prepared = bt.prepared[:0]
	defer func() {
		for _, ml := range bt.prepared {
			ml.Done()
		}
		clear(bt.prepared)
	}()
	t = len(bt.ids) // with the padding
	for l, ml := range bt.mlaL {
		if ml == nil {
			continue
		}
		bt.dsaSeqs = dsa.Seqs{Cu: bt.cu, Caches: bt.cachesOf(l), Exact: bt.nExact}
		ok, err := ml.Prepare(&bt.dsaSeqs, t)
		bt.prepared = append(bt.prepared, ml)
		if err != nil || !ok {
			return false, err
		}
	}
	deps, ints := append(bt.keyDeps[:0], p.x, p.logits, bt.slots, bt.rec.dev), bt.keyInts[:0]
	deps = append(deps, p.taps...) // a DSpark module's taps, read after the step (keepTaps)
	if bt.slab != nil {
		for _, st := range bt.slab.pools {
			if st != nil {
				deps = append(deps, st.Conv, st.S)
			}
		}
	}
	for _, ml := range bt.prepared {
		ml.Commit()
		deps, ints = ml.AppendKey(deps, ints)
	}
	ints = append(append(ints, bt.cu...), bt.picked...)
	if all {
		ints = append(ints, -1)
	}
	bt.keyDeps, bt.keyInts = deps, ints
	if err := p.writeIDs(bt.ids); err != nil {
		return true, err
	}
	g.begin()
	g.dep(deps...)
	g.num(ints...)
	p.inStep = true
	defer func() { p.inStep = false }()
	whole = true
	return true, g.run(graphStep, 0, t, func() error {
		g.inline = true
		defer func() { g.inline = false }()
		return p.run(bt.ids, bt.mix, nil, all, bt.picked)
	})
}
