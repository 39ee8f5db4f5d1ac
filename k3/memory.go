package k3

import (
	"errors"
	"fmt"
	"sync"

	"k3/config"
	"k3/dsa"
)

// ErrMemoryBudget is wrapped by errors of calls that would take the
// model's sequence state past its budget (WithMemoryBudget). Nothing has
// changed when it is returned: the session is as it was.
var ErrMemoryBudget = errors.New("k3: memory budget exceeded")

// WithMemoryBudget bounds the memory of all sequence state: sessions' KDA
// states, attention caches, replay logs and snapshots, and the prefix
// cache, which gives up its least recently used blocks before a session
// is refused. A call that would pass the budget fails with
// ErrMemoryBudget before it changes anything; the Batcher holds prompts
// back instead, and keeps room for what the sequences it admits may
// still grow by, which their passes grow into (a new session that would
// take that room fails). It fails the newest waiting request when
// nothing runs and either the waiting requests' own sessions hold the
// memory the oldest needs or none has come back for two seconds. bytes
// 0, the default, sets no bound; Model.MemoryUsage reports the use
// either way.
func WithMemoryBudget(bytes int64) Option { return func(o *options) { o.budget = bytes } }

// MemoryUsage is the sequence state a model holds against its budget.
type MemoryUsage struct {
	Used   int64 // bytes of sessions' state, the prefix cache, free pages and kept states, and Promised
	Budget int64 // 0: no bound
	// Promised is the part of Used that running Batchers keep for what
	// their admitted sequences may still grow by (under a budget), so
	// that memory taken outside them cannot stop a sequence once admitted.
	Promised int64
	// Of Used, what can be given back for sessions: the prefix cache (its
	// snapshots and the pages its blocks hold, each page once, though
	// sessions may hold some of them too), and attention-cache pages
	// released and kept for reuse (dsa.MaxFree a layer at most).
	PrefixCache, FreePages int64
	// PrefixAlone is the part of PrefixCache no session holds too: its
	// snapshots and the pages only its blocks hold, which emptying the
	// cache would give back.
	PrefixAlone int64
	// FreeSlots is the bytes of the free slots of the KDA state slabs
	// (on a backend that captures graphs, sessions' KDA states are slots
	// of slabs of 32, each counted in Used whole); empty slabs are given
	// back when sessions need the memory.
	FreeSlots int64
	// FreeStates is the bytes of KDA states kept for reuse: closed
	// sessions' states for new sessions on a backend without slabs, and
	// the buffers of snapshots the prefix cache let go for new snapshots
	// (at most four of each).
	FreeStates int64
	// PageTokens is the attention caches' page size in tokens, PageBytes
	// the memory of one page in every attention layer: what a sequence's
	// attention state grows by each PageTokens tokens.
	PageTokens int
	PageBytes  int64
	// PrefixPages is the most the prefix cache holds, in pages' worth of
	// tokens (PageTokens each): its budget, or the model's if smaller,
	// over PageBytes plus the share of a page's tokens in the KDA
	// snapshot it keeps every 512 tokens inside a prompt. Prompts that
	// end sooner keep a snapshot each and fit fewer. 0 without a prefix
	// cache or without attention layers.
	PrefixPages int64
}

// Fraction is Used over Budget (0 without a budget).
func (u MemoryUsage) Fraction() float64 {
	if u.Budget <= 0 {
		return 0
	}
	return float64(u.Used) / float64(u.Budget)
}

// MemoryUsage reports the model's sequence state against its budget.
func (m *Model) MemoryUsage() MemoryUsage {
	var u MemoryUsage
	if m.prefix != nil {
		u.PrefixCache, u.PrefixAlone = m.prefix.footprint()
	}
	if m.slabs != nil {
		u.FreeSlots = m.slabs.spare()
	}
	u.FreeStates = m.free.spare()
	if m.prefix != nil {
		u.FreeStates += m.prefix.spareBytes()
	}
	for _, ly := range m.layers {
		if ly.pages != nil {
			_, free := ly.pages.Pages()
			u.FreePages += int64(free) * ly.pages.PageBytes()
			u.PageBytes += ly.pages.PageBytes()
			u.PageTokens = dsa.PageSize
		}
	}
	m.mem.mu.Lock()
	u.Used, u.Budget, u.Promised = m.mem.used, m.mem.budget, m.mem.promised
	m.mem.mu.Unlock()
	if m.prefix != nil && u.PageBytes > 0 {
		room := m.prefix.budget
		if u.Budget > 0 {
			room = min(room, u.Budget)
		}
		perPage := u.PageBytes + m.snapshotBytes()*int64(u.PageTokens)/prefixInterior
		u.PrefixPages = room / perPage
	}
	return u
}

// snapshotBytes is the memory of one sequence's KDA states and conv
// windows, every layer's: a snapshot's size (Session.KDAStateBytes of any
// session).
func (m *Model) snapshotBytes() int64 {
	var n int64
	for _, ly := range m.layers {
		if ly.kind == config.KDA {
			n += ly.kdaCfg.StateBytes()
		}
	}
	return n
}

// ledger counts the bytes of all sequence state against the budget.
type ledger struct {
	mu     sync.Mutex
	used   int64
	budget int64
	// promised is the part of used that Batchers keep for what their
	// admitted sequences may still grow by (Batcher.keep); their own
	// passes grow into it.
	promised int64
	// spare, when set, frees reclaimable memory (the prefix cache) of at
	// least n bytes if it can; called without mu held.
	spare func(n int64)
}

// take reserves n bytes, first asking spare for room; it fails, taking
// nothing, when they do not fit.
func (l *ledger) take(n int64, what string) error {
	if n <= 0 {
		return nil
	}
	for {
		l.mu.Lock()
		if l.budget <= 0 || l.used+n <= l.budget {
			l.used += n
			l.mu.Unlock()
			return nil
		}
		short := l.used + n - l.budget
		used, budget := l.used, l.budget
		l.mu.Unlock()
		if l.spare != nil {
			l.spare(short)
			l.mu.Lock()
			freed := l.used < used
			l.mu.Unlock()
			if freed {
				continue // look again: the room may do now
			}
		}
		return fmt.Errorf("%w: %s needs %d bytes, %d of %d in use", ErrMemoryBudget, what, n, used, budget)
	}
}

// promise changes a Batcher's promise from old to n bytes, first asking
// spare for room when it grows past the budget; it reports whether n
// fits, changing nothing when it does not. A promise can always shrink
// (the count may be past the budget for a moment, while a pass's growth
// is counted both in its sessions and in the promise).
func (l *ledger) promise(old, n int64) bool {
	for {
		l.mu.Lock()
		if l.budget <= 0 || n <= old || l.used-old+n <= l.budget {
			l.used += n - old
			l.promised += n - old
			l.mu.Unlock()
			return true
		}
		short, used := l.used-old+n-l.budget, l.used
		l.mu.Unlock()
		if l.spare == nil {
			return false
		}
		l.spare(short)
		l.mu.Lock()
		freed := l.used < used
		l.mu.Unlock()
		if !freed {
			return false
		}
	}
}

// tryAdd counts n bytes if they fit the budget, without asking spare for
// room, and reports whether it did.
func (l *ledger) tryAdd(n int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.budget > 0 && l.used+n > l.budget {
		return false
	}
	l.used += n
	return true
}

// add counts n bytes (negative: gives them back) without a check: memory
// that is already held.
func (l *ledger) add(n int64) {
	l.mu.Lock()
	l.used += n
	l.mu.Unlock()
}

// spare frees reclaimable memory for sessions that need n bytes: the
// kept KDA states and snapshot buffers, the pools' free pages and the
// empty slabs first, then the prefix cache's blocks, least recently used
// first, with the pages they leave free.
func (m *Model) spare(n int64) {
	used := func() int64 {
		m.mem.mu.Lock()
		defer m.mem.mu.Unlock()
		return m.mem.used
	}
	target := used() - n
	m.free.trim(m, n)
	if m.prefix != nil {
		m.prefix.trimSpares()
	}
	for {
		for _, ly := range m.layers {
			if ly.pages != nil {
				if short := used() - target; short > 0 {
					ly.pages.Trim(short)
				}
			}
		}
		if short := used() - target; short > 0 && m.slabs != nil {
			m.slabs.trim(short)
		}
		if used() <= target || m.prefix == nil || !m.prefix.evictOne() {
			return
		}
	}
}

// over returns how far the count is past the budget (0 within it).
func (l *ledger) over() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.budget <= 0 {
		return 0
	}
	return max(0, l.used-l.budget)
}

// charge brings the ledger's count of s to its state's bytes now, but for
// its attention-cache pages, which their pools count (once, however many
// forks share them).
func (s *Session) charge() {
	n := s.StateBytes() - s.slabBytes()
	for _, c := range s.caches {
		if c != nil {
			n -= c.Bytes()
		}
	}
	s.m.mem.add(n - s.charged)
	s.charged = n
}

// growth returns the bytes s's state grows by when it takes n more
// tokens: cache reallocations, and a first snapshot buffer.
func (s *Session) growth(n int) int64 {
	var g int64
	for _, c := range s.caches {
		if c != nil {
			g += c.GrowthBytes(n)
		}
	}
	if iv := s.m.snapInterval; iv > 0 && s.pos+n >= s.nextSnap && len(s.snaps) < s.m.snapKeep {
		g += s.KDAStateBytes()
	}
	if s.m.prefix != nil && !s.uncached && s.turn == nil && (s.pos+n)/PrefixBlock > s.pos/PrefixBlock {
		g += s.KDAStateBytes()
	}
	return g
}
