package k3

import (
	"errors"
	"slices"
)

// ErrNoPrefixCache is returned by Model.WatchPrefixCache for a model loaded
// without WithPrefixCache.
var ErrNoPrefixCache = errors.New("k3: the model has no prefix cache")

// KVEventKind says what a KVEvent reports.
type KVEventKind uint8

const (
	// BlockStored: the blocks became reusable.
	BlockStored KVEventKind = iota + 1
	// BlockRemoved: the blocks are no longer reusable.
	BlockRemoved
	// AllBlocksCleared: no block is reusable; a watcher's first batch
	// opens with it.
	AllBlocksCleared
)

func (k KVEventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "KVEventKind(?)"
}

// A KVEvent is a change to the set of prefix-cache blocks a new prompt can
// resume from, in the shape of vLLM's KV-cache events. A block is
// PrefixBlock tokens at a multiple of PrefixBlock from a sequence's start;
// its hash names it and, through its parent's, every block before it
// (never 0). A block is reusable while a KDA snapshot exists at it or
// after it on its branch of the cache: a hit resumes from a snapshot and
// needs every block before it, whereas blocks past a branch's last
// snapshot are kept but would be prefilled again.
type KVEvent struct {
	Kind KVEventKind
	// Hashes are the blocks. A BlockStored's form one chain, each the
	// parent of the next.
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0] (BlockStored; 0
	// when Hashes[0] is a sequence's first block).
	Parent uint64
	// Tokens are the blocks' tokens, PrefixBlock per hash (BlockStored).
	Tokens []int32
}

// WatchPrefixCache calls f with the model's reusable prefix-cache blocks:
// at once with AllBlocksCleared and a BlockStored for every block reusable
// now, then with each change, the events of one cache operation in one
// call. The calls come in order with the cache locked, so f sees every
// change exactly once; f must return quickly and must not call the
// model. stop ends the calls (f is not called once stop returns).
// A KV-cache index for routing (llm-d's, through k3/serve) is built on
// this.
func (m *Model) WatchPrefixCache(f func([]KVEvent)) (stop func(), err error) {
	c := m.prefix
	if c == nil {
		return nil, ErrNoPrefixCache
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watchers == nil {
		c.watchers = map[int]func([]KVEvent){}
	}
	id := c.nextWatch
	c.nextWatch++
	c.watchers[id] = f
	f(c.dump())
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.watchers, id)
	}, nil
}

// chainHash names the block of toks after the block named parent (0 at a
// sequence's start): FNV-1a over both, then a 64-bit finalizer (MurmurHash3's)
// so that nearby inputs spread over all bits; 0 is kept for "no parent".
func chainHash(parent uint64, toks []int32) uint64 {
	h := uint64(14695981039346656037)
	for i := range 8 {
		h ^= uint64(byte(parent >> (8 * i)))
		h *= 1099511628211
	}
	for _, t := range toks {
		for i := range 4 {
			h ^= uint64(byte(uint32(t) >> (8 * i)))
			h *= 1099511628211
		}
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	if h == 0 {
		h = 1
	}
	return h
}

// gainSnapshot counts a snapshot just added at n. The nodes whose count
// leaves 0 become reusable: they are one chain ending at n (an ancestor
// that already had a snapshot below it has all its ancestors counted too).
func (c *prefixCache) gainSnapshot(n *prefixNode) {
	var chain []*prefixNode
	for m := n; m != &c.root; m = m.parent {
		m.snaps++
		if m.snaps == 1 && len(c.watchers) > 0 {
			chain = append(chain, m)
		}
	}
	if len(chain) == 0 {
		return
	}
	slices.Reverse(chain)
	ev := KVEvent{Kind: BlockStored, Parent: chain[0].parent.hash}
	for _, m := range chain {
		ev.Hashes = append(ev.Hashes, m.hash)
		ev.Tokens = append(ev.Tokens, m.toks[:]...)
	}
	c.pending = append(c.pending, ev)
}

// loseSnapshot uncounts the snapshot of n, a leaf being evicted; the
// nodes whose count reaches 0 are no longer reusable.
func (c *prefixCache) loseSnapshot(n *prefixNode) {
	var gone []uint64
	for m := n; m != &c.root; m = m.parent {
		m.snaps--
		if m.snaps == 0 && len(c.watchers) > 0 {
			gone = append(gone, m.hash)
		}
	}
	if len(gone) > 0 {
		c.pending = append(c.pending, KVEvent{Kind: BlockRemoved, Hashes: gone})
	}
}

// flush hands the operation's events to the watchers (with c.mu held).
func (c *prefixCache) flush() {
	if len(c.pending) == 0 {
		return
	}
	evs := c.pending
	c.pending = nil
	for _, f := range c.watchers {
		f(evs)
	}
}

// dump lists the cache as a new watcher must see it: AllBlocksCleared,
// then the reusable blocks, parents before children, a branch's run of
// blocks in one BlockStored.
func (c *prefixCache) dump() []KVEvent {
	evs := []KVEvent{{Kind: AllBlocksCleared}}
	var walk func(n *prefixNode, open bool)
	walk = func(n *prefixNode, open bool) {
		for _, k := range n.kids {
			if k.snaps == 0 {
				continue
			}
			// The first reusable child continues the parent's event;
			// the others start their own.
			if !open {
				evs = append(evs, KVEvent{Kind: BlockStored, Parent: n.hash})
			}
			ev := &evs[len(evs)-1]
			ev.Hashes = append(ev.Hashes, k.hash)
			ev.Tokens = append(ev.Tokens, k.toks[:]...)
			walk(k, true)
			open = false
		}
	}
	walk(&c.root, false)
	return evs
}
