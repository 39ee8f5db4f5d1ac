package k3

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// kvIndex is a subscriber's view of a server's blocks, built from events
// alone as a router's index is.
type kvIndex struct {
	mu      sync.Mutex
	blocks  map[uint64]kvBlock
	calls   int
	removed int
	err     error
}

type kvBlock struct {
	parent uint64
	toks   []int32
}

func (x *kvIndex) apply(evs []KVEvent) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.calls++
	fail := func(format string, a ...any) {
		if x.err == nil {
			x.err = fmt.Errorf(format, a...)
		}
	}
	for _, ev := range evs {
		switch ev.Kind {
		case AllBlocksCleared:
			x.blocks = map[uint64]kvBlock{}
		case BlockStored:
			if len(ev.Tokens) != PrefixBlock*len(ev.Hashes) || len(ev.Hashes) == 0 {
				fail("BlockStored of %d hashes with %d tokens", len(ev.Hashes), len(ev.Tokens))
				continue
			}
			parent := ev.Parent
			for i, h := range ev.Hashes {
				if _, dup := x.blocks[h]; dup || h == 0 {
					fail("block %x stored twice or zero", h)
				}
				if _, ok := x.blocks[parent]; parent != 0 && !ok {
					fail("block %x stored under %x, which is not stored", h, parent)
				}
				x.blocks[h] = kvBlock{parent, ev.Tokens[i*PrefixBlock : (i+1)*PrefixBlock]}
				parent = h
			}
		case BlockRemoved:
			x.removed += len(ev.Hashes)
			for _, h := range ev.Hashes {
				if _, ok := x.blocks[h]; !ok {
					fail("block %x removed but not stored", h)
				}
				delete(x.blocks, h)
			}
			for h, b := range x.blocks {
				if slices.Contains(ev.Hashes, b.parent) {
					fail("block %x kept after its parent %x went", h, b.parent)
				}
			}
		default:
			fail("event kind %v", ev.Kind)
		}
	}
}

// match is the router's score: how many tokens of prompt the stored
// blocks hold, block by block from its start, found by their tokens.
func (x *kvIndex) match(prompt []int32) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	parent, n := uint64(0), 0
	for p := PrefixBlock; p <= len(prompt); p += PrefixBlock {
		found := uint64(0)
		for h, b := range x.blocks {
			if b.parent == parent && slices.Equal(b.toks, prompt[p-PrefixBlock:p]) {
				found = h
			}
		}
		if found == 0 {
			break
		}
		parent, n = found, p
	}
	return n
}

// reusable lists the cache's nodes with a snapshot at or below them, by a
// walk of the tree that does not use the nodes' counts.
func reusable(c *prefixCache) map[uint64]kvBlock {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[uint64]kvBlock{}
	var walk func(n *prefixNode) bool
	walk = func(n *prefixNode) bool {
		any := n.snap != nil
		for _, k := range n.kids {
			if walk(k) {
				any = true
			}
		}
		if any && n != &c.root {
			out[n.hash] = kvBlock{n.parent.hash, n.toks[:]}
		}
		return any
	}
	walk(&c.root)
	return out
}

func (x *kvIndex) check(t *testing.T, m *Model, msg string) {
	t.Helper()
	x.mu.Lock()
	defer x.mu.Unlock()
	require.NoError(t, x.err, msg)
	want := reusable(m.prefix)
	require.Equal(t, len(want), len(x.blocks), "%s: blocks announced", msg)
	for h, b := range want {
		got, ok := x.blocks[h]
		require.True(t, ok, "%s: block %x not announced", msg, h)
		require.Equal(t, b.parent, got.parent, "%s: block %x's parent", msg, h)
		require.Equal(t, b.toks, got.toks, "%s: block %x's tokens", msg, h)
	}
}

// TestWatchPrefixCache: a watcher's index, built from the events alone,
// equals the cache's reusable blocks after every request, through hits,
// branches, chat turns and evictions; a watcher added late starts from a
// full view; the index's prefix match bounds what a request resumes.
func TestWatchPrefixCache(t *testing.T) {
	ctx := context.Background()
	none, err := Load(ctx, tinyDir)
	require.NoError(t, err)
	_, err = none.WatchPrefixCache(func([]KVEvent) {})
	require.ErrorIs(t, err, ErrNoPrefixCache)
	none.Close()

	probe, err := Load(ctx, tinyDir, WithPrefixCache(1<<30))
	require.NoError(t, err)
	genTokens(t, probe, words(60, "a"), WithMaxTokens(1), WithoutDefaultStops())
	one := probe.PrefixCacheStats().Bytes
	probe.Close()

	m, err := Load(ctx, tinyDir, WithPrefillChunk(32), WithPrefixCache(4*one))
	require.NoError(t, err)
	defer m.Close()
	first := &kvIndex{}
	stop, err := m.WatchPrefixCache(first.apply)
	require.NoError(t, err)
	defer stop()
	first.check(t, m, "empty")
	require.Equal(t, 1, first.calls, "the first call is the dump")

	var late *kvIndex
	var stopLate func()
	system := words(130, "sys") // a shared head past one interior snapshot
	for i := range 9 {
		var prompt string
		switch i % 3 {
		case 0:
			prompt = words(25+i, fmt.Sprintf("q%d-", i))
		case 1:
			prompt = system + " " + words(10, fmt.Sprintf("u%d-", i))
		case 2:
			prompt = words(25+i-2, fmt.Sprintf("q%d-", i-2)) + " again" // a branch of an earlier prompt
		}
		toks := m.Encode(prompt)
		before := first.match(toks)
		out := genTokens(t, m, prompt, WithMaxTokens(40), WithoutDefaultStops())
		cached := out[len(out)-1].Usage.CachedTokens
		assert.LessOrEqual(t, cached, before, "request %d resumed past the announced blocks", i)
		if cached > 0 {
			assert.Less(t, before-cached, prefixInterior, "request %d: the announced match overstates the hit", i)
		}
		first.check(t, m, fmt.Sprintf("after request %d", i))
		if i == 2 {
			late = &kvIndex{}
			stopLate, err = m.WatchPrefixCache(late.apply)
			require.NoError(t, err)
		}
		if late != nil {
			late.check(t, m, fmt.Sprintf("late watcher after request %d", i))
		}
	}
	st := m.PrefixCacheStats()
	assert.LessOrEqual(t, st.Bytes, 4*one)
	assert.Greater(t, first.calls, 9, "one call per cache operation")
	assert.Positive(t, st.Hits, "some requests resumed")
	assert.Positive(t, first.removed, "evictions were announced")

	// A repeated prompt resumes exactly where its announced blocks end
	// or before, and the router sees it.
	prompt := system + " " + words(10, "u4-")
	assert.Positive(t, first.match(m.Encode(prompt)))

	stopLate()
	calls := late.calls
	genTokens(t, m, words(30, "after-stop"), WithMaxTokens(2), WithoutDefaultStops())
	assert.Equal(t, calls, late.calls, "no call after stop")
	first.check(t, m, "after the late watcher stopped")
}

// TestChainHash: a block's hash depends on its tokens and on every block
// before it, and is never 0.
func TestChainHash(t *testing.T) {
	a := make([]int32, PrefixBlock)
	b := slices.Clone(a)
	b[PrefixBlock-1] = 1
	seen := map[uint64]string{}
	add := func(h uint64, name string) {
		require.NotZero(t, h, name)
		prev, dup := seen[h]
		require.False(t, dup, "%s collides with %s", name, prev)
		seen[h] = name
	}
	add(chainHash(0, a), "a")
	add(chainHash(0, b), "b")
	add(chainHash(chainHash(0, a), a), "a a")
	add(chainHash(chainHash(0, b), a), "b a")
	add(chainHash(chainHash(0, a), b), "a b")
	c := slices.Clone(a)
	c[0] = 1 << 24 // the high byte of a token counts
	add(chainHash(0, c), "c")
	assert.Equal(t, chainHash(7, a), chainHash(7, slices.Clone(a)), "deterministic")
}
