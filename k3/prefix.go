package k3

import (
	"fmt"
	"slices"
	"sync"

	"k3/dsa"
)

// PrefixBlock is the prefix cache's granularity: sequences share state in
// whole blocks of this many tokens from their start.
const PrefixBlock = 16

// prefixInterior is the spacing of the snapshots a long prompt leaves
// inside itself, so that prompts sharing only a long head (a system
// prompt) still find one. A snapshot holds every KDA layer's state, far
// more than a block's attention rows, so they are sparse.
const prefixInterior = 512

// WithPrefixCache makes the model keep, in up to bytes of memory, the
// state of sequences it has run: the attention-cache pages of every block
// of PrefixBlock tokens (references, shared with the sessions that made
// them), and KDA snapshots at some block ends (the last
// block before a prompt's end, every 512 tokens inside long prompts, the
// point where a prompt was found to part from the cached ones, the last
// block before the end of each finished generation). A new session whose
// prompt starts with cached blocks resumes from the deepest snapshot among
// them instead of prefilling those tokens; Usage.CachedTokens counts them.
// Its logits are within the conformance tolerance of a cold prefill's,
// and bitwise equal where the cold prefill would have cut a chunk at the
// snapshot too: with the cache on, every run is cut at absolute positions
// (multiples of the prefill chunk, and its own snapshot points). Least
// recently used blocks go first when the cache is full. bytes 0, the
// default, keeps none; Model.PrefixCacheStats reports the counters.
func WithPrefixCache(bytes int64) Option { return func(o *options) { o.prefixBytes = bytes } }

// PrefixStats are the prefix cache's counters.
type PrefixStats struct {
	Lookups      int64 // prompts looked up (new sessions' generations)
	Hits         int64 // lookups that resumed from a snapshot
	ReusedTokens int64 // prompt tokens not computed again
	// Bytes is the cache's memory: its snapshots, and its blocks' shares
	// of the attention pages they hold (pages that sessions hold too
	// free only when the last holder lets go).
	Bytes     int64
	Blocks    int // cached blocks
	Snapshots int // cached KDA snapshots
}

// PrefixCacheStats returns the prefix cache's counters (zero without
// WithPrefixCache).
func (m *Model) PrefixCacheStats() PrefixStats {
	c := m.prefix
	if c == nil {
		return PrefixStats{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// prefixCache is a tree of token blocks: a node is the block of tokens
// [pos-PrefixBlock, pos) of every sequence whose first pos tokens are its
// path from the root.
type prefixCache struct {
	mu     sync.Mutex
	budget int64
	mem    *ledger // the model's: the cache's bytes count there too
	root   prefixNode
	clock  uint64
	stats  PrefixStats
	// The recency list of every cached node, newest first. A lookup or
	// an insert marks a whole path from the root, so no node was used
	// longer ago than its descendants, and touch keeps a node ahead of
	// its descendants: the oldest node is always a leaf, the block
	// eviction drops, found without walking the tree.
	newest, oldest *prefixNode
	// held counts, per layer, the cache's holds of each attention page,
	// kept as blocks come and go so that footprint (read by every
	// metrics scrape) walks no tree; model is set with it.
	held  []map[*dsa.Page]int
	model *Model

	// spare holds buffers of snapshots the cache let go, counted in the
	// ledger, for new snapshots: a copy into memory already touched
	// skips the first touch's page faults (ARCHITECTURE).
	spare [][][]float32

	watchers  map[int]func([]KVEvent) // WatchPrefixCache's
	nextWatch int
	pending   []KVEvent // this operation's events, for the watchers
}

type prefixNode struct {
	parent *prefixNode
	kids   map[uint64]*prefixNode
	toks   [PrefixBlock]int32
	pos    int
	pages  []*dsa.Page // per layer: the page holding the block, held (nil at KDA layers)
	share  int64       // the block's share of its pages' bytes, counted as the cache's
	snap   [][]float32 // per layer: the KDA state then conv window at pos; nil without a snapshot
	used   uint64
	// newer and older link the cache's recency list (prefixCache.touch).
	newer, older *prefixNode
	model        *Model
	hash         uint64 // chainHash: the block's name in KV events
	snaps        int    // snapshots at this node and below it; announced while > 0
}

func newPrefixCache(budget int64, mem *ledger) *prefixCache {
	return &prefixCache{budget: budget, mem: mem}
}

// evictOne drops the least recently used leaf block, reporting false
// when the cache is empty (the model's ledger calls it for sessions that
// need the memory).
func (c *prefixCache) evictOne() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stats.Blocks == 0 {
		return false
	}
	c.evictTo(c.stats.Bytes-1, false)
	c.flush()
	return true
}

// maxSpareSnapshots is the most buffers of let-go snapshots the prefix
// cache keeps for new ones.
const maxSpareSnapshots = 4

// drop lets go of a snapshot buffer (with c.mu held): it is kept for a
// new snapshot when keep allows and the spare list and the budget have
// room, else left to the garbage collector. counted says whether the
// ledger counts it already (a cached snapshot's buffer); a kept buffer
// is counted, a dropped one not.
func (c *prefixCache) drop(snap [][]float32, counted, keep bool) {
	n := floats(snap)
	switch {
	case keep && n > 0 && len(c.spare) < maxSpareSnapshots && (counted || c.mem.tryAdd(n)):
		c.spare = append(c.spare, snap)
	case counted:
		c.mem.add(-n)
	}
}

// takeSpare returns a kept snapshot buffer, no longer counted, or nil
// (also without a cache).
func (c *prefixCache) takeSpare() [][]float32 {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	i := len(c.spare) - 1
	if i < 0 {
		return nil
	}
	snap := c.spare[i]
	c.spare[i] = nil
	c.spare = c.spare[:i]
	c.mem.add(-floats(snap))
	return snap
}

// spareBytes returns the memory of the kept snapshot buffers.
func (c *prefixCache) spareBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, snap := range c.spare {
		n += floats(snap)
	}
	return n
}

// trimSpares gives back every kept snapshot buffer.
func (c *prefixCache) trimSpares() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, snap := range c.spare {
		c.mem.add(-floats(snap))
		c.spare[i] = nil
	}
	c.spare = c.spare[:0]
}

// blockKey hashes a block's tokens (FNV-1a); a match is confirmed
// against the tokens themselves.
func blockKey(toks []int32) uint64 {
	h := uint64(14695981039346656037)
	for _, t := range toks {
		for range 4 {
			h ^= uint64(byte(t))
			h *= 1099511628211
			t >>= 8
		}
	}
	return h
}

func (n *prefixNode) child(toks []int32) *prefixNode {
	c := n.kids[blockKey(toks)]
	if c != nil && slices.Equal(c.toks[:], toks) {
		return c
	}
	return nil
}

func floats(v [][]float32) int64 {
	var n int64
	for _, x := range v {
		n += int64(len(x))
	}
	return 4 * n
}

// lookup walks the blocks of tokens (a new sequence's prompt) and returns
// the deepest cached node with a snapshot whose position leaves at least
// one token to run (nil: a miss), and the position of the deepest
// matching block (where the prompt parts from what is cached). The nodes
// of a hit are marked used; restore counts the hit.
func (c *prefixCache) lookup(tokens []int32) (hit *prefixNode, matched int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.Lookups++
	n := &c.root
	for p := PrefixBlock; p <= len(tokens); p += PrefixBlock {
		next := n.child(tokens[p-PrefixBlock : p])
		if next == nil {
			break
		}
		n, matched = next, p
		if n.snap != nil && p < len(tokens) {
			hit = n
		}
	}
	if hit != nil {
		c.clock++
		c.touch(hit)
	}
	return hit, matched
}

// touch marks n and its ancestors used now: each moves to the front of
// the recency list, n first, so that every node stays ahead of its
// descendants.
func (c *prefixCache) touch(n *prefixNode) {
	for m := n; m != &c.root; m = m.parent {
		m.used = c.clock
		c.unlink(m)
		m.older = c.newest
		if c.newest != nil {
			c.newest.newer = m
		} else {
			c.oldest = m
		}
		c.newest = m
	}
}

// unlink takes m off the recency list (nothing for a node not on it).
func (c *prefixCache) unlink(m *prefixNode) {
	if m.newer != nil {
		m.newer.older = m.older
	} else if c.newest == m {
		c.newest = m.older
	}
	if m.older != nil {
		m.older.newer = m.newer
	} else if c.oldest == m {
		c.oldest = m.newer
	}
	m.newer, m.older = nil, nil
}

// restore puts the cached state of hit's path into s (an empty session):
// its attention pages (shared; the partial last one copied), its KDA
// snapshot, its tokens. It reports false, changing nothing, when hit was
// evicted since lookup (the memory its session reserved in between may
// have emptied the cache; its snapshot's buffer may serve another).
func (c *prefixCache) restore(s *Session, hit *prefixNode) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if hit.snap == nil {
		return false, nil
	}
	c.stats.Hits++
	c.stats.ReusedTokens += int64(hit.pos)
	var path []*prefixNode
	for m := hit; m != &c.root; m = m.parent {
		path = append(path, m)
	}
	slices.Reverse(path)
	for l, ca := range s.caches {
		if ca == nil {
			continue
		}
		// Page j's rows are valid up to the deepest block of the path in
		// it: that block's page (a holder may have copied the page since
		// an earlier block took it).
		pages := make([]*dsa.Page, 0, (hit.pos+dsa.PageSize-1)/dsa.PageSize)
		for i, m := range path {
			if (i+1)*PrefixBlock%dsa.PageSize == 0 || i == len(path)-1 {
				pages = append(pages, m.pages[l])
			}
		}
		if err := ca.Adopt(pages, hit.pos); err != nil {
			return false, fmt.Errorf("k3: prefix cache: %w", err)
		}
	}
	if err := s.loadState(hit.pos, hit.snap); err != nil {
		return false, err
	}
	s.tokens = s.tokens[:0]
	for _, m := range path {
		s.tokens = append(s.tokens, m.toks[:]...)
	}
	s.pos, s.last = hit.pos, nil
	if iv := s.m.snapInterval; iv > 0 {
		s.nextSnap = (s.pos/iv + 1) * iv
	}
	return true, nil
}

// insert caches s's blocks up to upto (a multiple of PrefixBlock, at most
// s.pos) and, when snap is not nil, the KDA snapshot at upto, taking snap
// over (or keeping its buffer as a spare). Then it evicts down to the
// budget.
func (c *prefixCache) insert(s *Session, upto int, snap [][]float32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.flush()
	defer func() {
		if snap != nil {
			c.drop(snap, false, true) // not taken
		}
	}()
	c.clock++
	n := &c.root
	var err error
	stopped := false
blocks:
	for p := PrefixBlock; p <= upto; p += PrefixBlock {
		toks := s.tokens[p-PrefixBlock : p]
		next := n.child(toks)
		if next == nil {
			if n.kids == nil {
				n.kids = map[uint64]*prefixNode{}
			}
			// A colliding key keeps the older block; the new one is not
			// cached (and neither is anything after it).
			key := blockKey(toks)
			if _, taken := n.kids[key]; taken {
				stopped = true
				break
			}
			next = &prefixNode{parent: n, pos: p, pages: make([]*dsa.Page, len(s.caches)), model: s.m, hash: chainHash(n.hash, toks)}
			copy(next.toks[:], toks)
			for l, ca := range s.caches {
				if ca == nil {
					continue
				}
				var pg *dsa.Page
				if pg, err = ca.Hold(p - 1); err != nil {
					next.release()
					err = fmt.Errorf("k3: prefix cache: %w", err)
					break blocks
				}
				next.pages[l] = pg
				next.share += s.m.layers[l].pages.PageBytes() * PrefixBlock / dsa.PageSize
			}
			n.kids[key] = next
			c.hold(next, 1)
			c.stats.Blocks++
			c.stats.Bytes += next.share
		}
		n = next
	}
	c.touch(n)
	if stopped || err != nil {
		return err
	}
	if snap != nil && upto > 0 && n.snap == nil {
		n.snap, snap = snap, nil
		c.stats.Snapshots++
		c.stats.Bytes += floats(n.snap)
		c.mem.add(floats(n.snap))
		c.gainSnapshot(n)
	}
	// The cache fits its own budget, and yields to sessions when the
	// model's is exceeded (keeping no spare buffers then).
	limit := c.budget
	over := c.mem.over()
	if over > 0 {
		limit = min(limit, c.stats.Bytes-over)
	}
	c.evictTo(limit, over == 0)
	return nil
}

// evictTo drops least recently used leaf blocks until the cache holds at
// most limit bytes: a block's descendants need its attention rows, so
// leaves go first (the recency list's oldest node is one). keep lets
// their snapshots' buffers become spares.
func (c *prefixCache) evictTo(limit int64, keep bool) {
	for c.stats.Bytes > limit {
		lru := c.oldest
		if lru == nil {
			return
		}
		c.unlink(lru)
		delete(lru.parent.kids, blockKey(lru.toks[:]))
		c.hold(lru, -1)
		lru.release()
		c.stats.Blocks--
		c.stats.Bytes -= lru.share
		if lru.snap != nil {
			c.loseSnapshot(lru)
			c.stats.Snapshots--
			c.stats.Bytes -= floats(lru.snap)
			c.drop(lru.snap, true, keep)
			lru.snap = nil
		}
	}
}

// prefillPoints returns the snapshot points of a prompt run over
// positions [start, end): every prefixInterior tokens, the last block end
// before end, and matched (where the prompt parted from the cache) when it
// lies inside; ascending.
func prefillPoints(start, end, matched int) []int {
	var pts []int
	for p := (start/prefixInterior + 1) * prefixInterior; p < end; p += prefixInterior {
		pts = append(pts, p)
	}
	if last := (end - 1) / PrefixBlock * PrefixBlock; last > start {
		pts = append(pts, last)
	}
	if matched > start && matched < end {
		pts = append(pts, matched)
	}
	slices.Sort(pts)
	return slices.Compact(pts)
}

// nextCut returns where the chunk that starts at pos ends, for a run to
// end: with the prefix cache at the next multiple of chunk or snapshot
// point (absolute positions, so a resumed run cuts where a cold one
// does), else chunk tokens on.
func (s *Session) nextCut(pos, end, chunk int, pts []int) int {
	if s.m.prefix == nil {
		return min(end, pos+chunk)
	}
	c := min(end, (pos/chunk+1)*chunk)
	for _, p := range pts {
		if p > pos && p < c {
			return p
		}
	}
	return c
}

// atPoint caches s's blocks and KDA snapshot when s stands at one of the
// snapshot points pts.
func (s *Session) atPoint(pts []int) error {
	if s.m.prefix == nil || s.uncached || !slices.Contains(pts, s.pos) {
		return nil
	}
	snap, err := s.snapshotState(s.m.prefix.takeSpare())
	if err != nil {
		return err
	}
	return s.m.prefix.insert(s, s.pos, snap)
}

// resume looks up a new session's prompt in the prefix cache and restores
// the hit; it returns how many prompt tokens the session now holds and
// the position where the prompt parts from the cache.
func (s *Session) resume(prompt []int32) (held, matched int, err error) {
	if s.m.prefix == nil || s.uncached || s.pos != 0 {
		return 0, 0, nil
	}
	hit, matched := s.m.prefix.lookup(prompt)
	if hit == nil {
		return 0, matched, nil
	}
	if !s.reserving {
		grow := s.growth(hit.pos)
		if err := s.m.mem.take(grow, "a prefix-cache hit"); err != nil {
			return 0, matched, nil // resumed by prefilling instead
		}
		defer func() {
			s.m.mem.add(-grow)
			s.charge()
		}()
	}
	ok, err := s.m.prefix.restore(s, hit)
	if err != nil {
		s.broken = err
		return 0, 0, err
	}
	if !ok {
		return 0, matched, nil // evicted meanwhile: prefilled instead
	}
	return hit.pos, matched, nil
}

// trackTurn keeps the session's KDA state at the last block end it
// stood at, for endTurn.
func (s *Session) trackTurn() error {
	if s.m.prefix == nil || s.uncached || s.pos%PrefixBlock != 0 || s.pos == 0 {
		return nil
	}
	var into [][]float32
	if s.turn != nil {
		into = s.turn.data
	} else {
		s.turn = &snapshot{}
		into = s.m.prefix.takeSpare()
	}
	data, err := s.snapshotState(into)
	if err != nil {
		return err
	}
	s.turn.pos, s.turn.data = s.pos, data
	return nil
}

// endTurn caches the session's blocks up to the last block end of the
// generation that just ended, with its KDA snapshot, so that the next turn
// of the conversation, sent as a new prompt, resumes there.
func (s *Session) endTurn() {
	if s.m.prefix == nil || s.turn == nil || s.broken != nil || s.closed || s.turn.pos > s.pos {
		return
	}
	t := s.turn
	s.turn = nil
	// An error only means the blocks are not cached.
	_ = s.m.prefix.insert(s, t.pos, t.data)
}

// release gives back the pages n holds (their pools free a page with
// its last holder).
func (n *prefixNode) release() {
	for l, pg := range n.pages {
		if pg != nil {
			n.model.layers[l].pages.Release(pg)
			n.pages[l] = nil
		}
	}
}

// hold counts n's pages into the cache's holds (by 1 when it is cached,
// -1 when it goes; with c.mu held).
func (c *prefixCache) hold(n *prefixNode, by int) {
	if c.held == nil {
		c.held, c.model = make([]map[*dsa.Page]int, len(n.pages)), n.model
	}
	for l, pg := range n.pages {
		if pg == nil {
			continue
		}
		if c.held[l] == nil {
			c.held[l] = map[*dsa.Page]int{}
		}
		if k := c.held[l][pg] + by; k > 0 {
			c.held[l][pg] = k
		} else {
			delete(c.held[l], pg)
		}
	}
}

// footprint is the memory the cache's snapshots and the pages its blocks
// hold take, each page counted once, and of it what the cache alone
// holds: its snapshots and the pages no session holds too.
func (c *prefixCache) footprint() (all, alone int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.model == nil {
		return 0, 0 // nothing cached yet
	}
	all = int64(c.stats.Snapshots) * c.model.snapshotBytes() // every snapshot is a sequence's KDA states
	alone = all
	for l, h := range c.held {
		if len(h) == 0 {
			continue
		}
		pool := c.model.layers[l].pages
		all += int64(len(h)) * pool.PageBytes()
		alone += int64(pool.HeldOnly(h)) * pool.PageBytes()
	}
	return all, alone
}
