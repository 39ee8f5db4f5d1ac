package k3

import (
	"fmt"
	"sync"

	"k3/config"
	"k3/kda"
)

// slabSize is the sessions one slab of KDA states holds: twice the most
// rows a captured step takes (graphMaxRows, one a session in decode), so
// that a batch one graph can serve fits one slab beside the padding
// sessions that fill its rows up to a bucket (fewer than half of them).
const slabSize = 2 * graphMaxRows

// pageSlab is the pages of an attention layer's first page slab on a
// capturing backend (dsa.Pool.Slabs; later slabs double the pool, up to
// dsa.MaxSlab pages): a decode batch whose pages share a slab attends
// through page tables written before its graph, not its pages.
const pageSlab = 16

// A slab holds the KDA states of up to slabSize sessions: per KDA layer
// one pool ([slabSize, ...] per kind, kda.State's layout), a session's
// states being the rows of its slot in every pool. A pass whose exact
// sessions share a slab runs their KDA decode over the pools with the
// slots written to the device before it (kda.Seqs.Pool), so the graph
// it captures names the slab and the pass's slots tensor, not the
// sessions: sessions that come and go replay it.
type slab struct {
	pools []*kda.State // per layer; nil for attention layers
	used  [slabSize]bool
	n     int
	bytes int64
}

// slabs are a model's slabs. They exist on a capturing backend only (the
// Go backend keeps one allocation per state, which is what its fused
// decode step reads either way), and their memory is counted against
// the model's budget a slab at a time: a session in a slab does not
// count its KDA states itself.
type slabs struct {
	m      *Model
	mu     sync.Mutex
	all    []*slab
	closed bool
}

// newSlabs returns the slabs of m, or nil when m keeps no graphs or has
// no KDA layer.
func newSlabs(m *Model) *slabs {
	if m.graphs == nil {
		return nil
	}
	for _, ly := range m.layers {
		if ly.kind == config.KDA {
			return &slabs{m: m}
		}
	}
	return nil
}

// take gives a free slot, in the first slab with one (so that sessions
// pack into few slabs), making a slab when none has room: its memory is
// taken from the budget first. The slot's states are zeroed (on the
// device; a capture another goroutine runs meanwhile does not take the
// fills in: the backend holds them back until it ends).
func (p *slabs) take() (*slab, int, error) {
	var sl *slab
	var slot int
	for sl == nil {
		p.mu.Lock()
		sl, slot = p.free()
		p.mu.Unlock()
		if sl != nil {
			break
		}
		// Made without the lock: the budget may ask the slabs to trim.
		// Another session may take its slots first; then it looks again.
		fresh, err := p.alloc()
		if err != nil {
			return nil, 0, err
		}
		p.mu.Lock()
		closed := p.closed
		if !closed {
			p.all = append(p.all, fresh)
		}
		p.mu.Unlock()
		if closed {
			p.destroy(fresh)
			return nil, 0, ErrClosed
		}
	}
	b := p.m.b
	for _, st := range sl.pools {
		if st == nil {
			continue
		}
		err := b.Fill(st.Conv.Rows(slot, slot+1), 0)
		if err == nil {
			err = b.Fill(st.S.Rows(slot, slot+1), 0)
		}
		if err != nil {
			p.give(sl, slot)
			return nil, 0, err
		}
	}
	return sl, slot, nil
}

// free claims the first free slot; p.mu is held.
func (p *slabs) free() (*slab, int) {
	for _, sl := range p.all {
		if sl.n == slabSize {
			continue
		}
		for i := range sl.used {
			if !sl.used[i] {
				sl.used[i] = true
				sl.n++
				return sl, i
			}
		}
	}
	return nil, 0
}

// alloc makes an empty slab, its bytes taken from the budget.
func (p *slabs) alloc() (*slab, error) {
	m := p.m
	sl := &slab{pools: make([]*kda.State, len(m.layers)), bytes: slabSize * m.snapshotBytes()}
	if err := m.mem.take(sl.bytes, "a slab of KDA states"); err != nil {
		return nil, err
	}
	for l, ly := range m.layers {
		if ly.kind != config.KDA {
			continue
		}
		st, err := kda.NewState(m.b, ly.kdaCfg, slabSize)
		if err != nil {
			p.destroy(sl)
			return nil, fmt.Errorf("k3: a slab of KDA states: %w", err)
		}
		sl.pools[l] = st
	}
	return sl, nil
}

// destroy frees a slab's pools and gives its bytes back.
func (p *slabs) destroy(sl *slab) {
	for _, st := range sl.pools {
		if st != nil {
			st.Free(p.m.b)
		}
	}
	p.m.mem.add(-sl.bytes)
}

// give returns a slot. An emptied slab is kept for the next sessions (a
// graph that names it stays usable) until trim gives it back.
func (p *slabs) give(sl *slab, slot int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sl.used[slot] {
		sl.used[slot] = false
		sl.n--
	}
}

// trim frees empty slabs until at least n bytes are released or none is
// left, and returns the bytes released.
func (p *slabs) trim(n int64) int64 {
	var done int64
	for done < n {
		p.mu.Lock()
		i := len(p.all) - 1
		for i >= 0 && p.all[i].n > 0 {
			i--
		}
		if i < 0 {
			p.mu.Unlock()
			break
		}
		sl := p.all[i]
		p.all = append(p.all[:i], p.all[i+1:]...)
		p.mu.Unlock()
		p.destroy(sl)
		done += sl.bytes
	}
	return done
}

// spare returns the bytes of the slabs' free slots.
func (p *slabs) spare() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, sl := range p.all {
		n += sl.bytes / slabSize * int64(slabSize-sl.n)
	}
	return n
}

// close frees every slab; slots given back later are ignored.
func (p *slabs) close() {
	p.mu.Lock()
	all := p.all
	p.all, p.closed = nil, true
	p.mu.Unlock()
	for _, sl := range all {
		p.destroy(sl)
	}
}

// slotStates returns the views of slot in sl's pools: a session's states.
func (sl *slab) slotStates(slot int) []*kda.State {
	out := make([]*kda.State, len(sl.pools))
	for l, st := range sl.pools {
		if st != nil {
			out[l] = &kda.State{Conv: st.Conv.Rows(slot, slot+1), S: st.S.Rows(slot, slot+1)}
		}
	}
	return out
}

// poolOf returns the slab every one of sessions is in, or nil.
func poolOf(sessions []*Session) *slab {
	if len(sessions) == 0 {
		return nil
	}
	sl := sessions[0].slab
	for _, s := range sessions[1:] {
		if s.slab != sl {
			return nil
		}
	}
	return sl
}

// writeSlots writes the slots of the pass's exact sessions into bt.slots
// when they share a slab, before the pass: the KDA mixers then run over
// that slab's pools (bt.slab). The write is the only per-step metadata a
// KDA graph reads.
func (bt *Batch) writeSlots() error {
	bt.slab = nil
	if bt.m.slabs == nil || bt.slots.IsZero() || bt.nExact == 0 || bt.nExact > slabSize {
		return nil
	}
	sl := poolOf(bt.cur[:bt.nExact])
	if sl == nil {
		return nil
	}
	bt.slotHost = bt.slotHost[:bt.nExact]
	for i, s := range bt.cur[:bt.nExact] {
		bt.slotHost[i] = int32(s.slot)
	}
	if err := bt.m.b.Write(bt.slots.Rows(0, bt.nExact), &bt.slotHost); err != nil {
		return err
	}
	bt.slab = sl
	return nil
}

// pad fills an exact pass of one row per session up to its bucket of rows
// (graphBucket: 1, 2, 4, 8, 16) with padding sessions, so that a whole
// step is one graph per bucket whatever number of sessions fills it. A
// padding session is the model's (Model.pads, made on first need, kept
// until Close), in the batch's slab, at position 1 of its caches (unpad
// takes each step's row back), and its logits are computed and dropped.
// It reports how many it added (none when the rows are a bucket already,
// or the sessions would not fit the batch's slabs or the budget); g.mu
// is held.
func (bt *Batch) pad() int {
	m, n := bt.m, len(bt.cur)
	k := graphBucket(n, bt.p.max) - n
	if k <= 0 || int(bt.cu[n]) != n || (m.slabs != nil && bt.slab == nil) {
		return 0
	}
	for len(m.pads) < k {
		s, err := m.NewSession()
		if err != nil {
			return 0 // no room: the step runs unpadded
		}
		m.pads = append(m.pads, s)
	}
	for _, s := range m.pads[:k] {
		if s.slab != bt.slab {
			return 0
		}
	}
	for _, s := range m.pads[:k] {
		bt.cur = append(bt.cur, s)
		bt.ids = append(bt.ids, 0)
		bt.cu = append(bt.cu, int32(len(bt.ids)))
		bt.picked = append(bt.picked, int32(len(bt.ids)-1))
	}
	bt.nExact = len(bt.cur)
	return k
}

// unpad takes the k padding sessions of the pass back out: its first n
// sessions and picked rows remain, and each padding session's caches
// return to one position.
func (bt *Batch) unpad(n, picked, k int) {
	if k == 0 {
		return
	}
	for _, s := range bt.cur[n:] {
		for _, c := range s.caches {
			if c != nil && c.Len > 1 {
				c.Truncate(1)
			}
		}
	}
	clear(bt.cur[n:])
	bt.cur, bt.ids, bt.cu, bt.picked = bt.cur[:n], bt.ids[:n], bt.cu[:n+1], bt.picked[:picked]
	bt.nExact = n
}

// maxFreeStates is the most closed sessions' KDA state sets a model keeps
// for new sessions on a backend without slabs.
const maxFreeStates = 4

// freeStates keeps the KDA states of closed sessions (a set is a
// session's kdaSt: one state per KDA layer, nil elsewhere) for new ones,
// so that a new session's states are memory already touched rather than
// fresh pages. The sets stay counted in the model's ledger until a new
// session takes one or trim gives them back.
type freeStates struct {
	mu     sync.Mutex
	sets   [][]*kda.State
	bytes  int64 // of one set
	closed bool
}

// setBytes returns the memory of a state set.
func setBytes(set []*kda.State) int64 {
	var n int64
	for _, st := range set {
		if st != nil {
			n += 4 * int64(st.Conv.Len()+st.S.Len())
		}
	}
	return n
}

// put keeps set for a new session, counting it in the ledger, and
// reports whether it did (else the caller frees it): not past
// maxFreeStates, nor past the budget (a session refused for memory
// must not leave its states counted).
func (f *freeStates) put(m *Model, set []*kda.State) bool {
	if len(set) != len(m.layers) {
		return false // a session that failed while it was made
	}
	for l, ly := range m.layers {
		if (ly.kind == config.KDA) != (set[l] != nil) {
			return false
		}
	}
	n := setBytes(set)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || len(f.sets) >= maxFreeStates || n == 0 || !m.mem.tryAdd(n) {
		return false
	}
	f.sets = append(f.sets, set)
	f.bytes = n
	return true
}

// pop removes and returns the last kept set, or nil.
func (f *freeStates) pop() []*kda.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := len(f.sets) - 1
	if i < 0 {
		return nil
	}
	set := f.sets[i]
	f.sets[i] = nil
	f.sets = f.sets[:i]
	return set
}

// take returns a kept set, zeroed and no longer counted, or nil.
func (f *freeStates) take(m *Model) []*kda.State {
	set := f.pop()
	if set == nil {
		return nil
	}
	m.mem.add(-setBytes(set))
	for _, st := range set {
		if st == nil {
			continue
		}
		err := m.b.Fill(st.Conv, 0)
		if err == nil {
			err = m.b.Fill(st.S, 0)
		}
		if err != nil {
			freeSet(m, set)
			return nil
		}
	}
	return set
}

// spare returns the bytes of the kept sets.
func (f *freeStates) spare() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return int64(len(f.sets)) * f.bytes
}

// trim frees kept sets until at least n bytes are released or none is
// left.
func (f *freeStates) trim(m *Model, n int64) {
	for done := int64(0); done < n; {
		set := f.pop()
		if set == nil {
			break
		}
		b := setBytes(set)
		freeSet(m, set)
		m.mem.add(-b)
		done += b
	}
}

// close frees every kept set; sets put later are refused.
func (f *freeStates) close(m *Model) {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.trim(m, 1<<62)
}

// freeSet frees a state set's tensors.
func freeSet(m *Model, set []*kda.State) {
	for _, st := range set {
		if st != nil {
			st.Free(m.b)
		}
	}
}
