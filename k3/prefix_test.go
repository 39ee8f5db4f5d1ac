package k3

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/config"
	"k3/dsa"
)

// genTokens runs a generation and returns its tokens.
func genTokens(t *testing.T, m *Model, prompt string, opts ...GenerateOption) []Token {
	t.Helper()
	var out []Token
	for tok, err := range m.Generate(context.Background(), prompt, opts...) {
		require.NoError(t, err)
		out = append(out, tok)
	}
	return out
}

// sameGeneration checks two generations give the same tokens, with
// log-probabilities within the conformance tolerance (bitwise with exact).
func sameGeneration(t *testing.T, want, got []Token, exact bool, msg string) {
	t.Helper()
	require.Equal(t, len(want), len(got), "%s: generated %d tokens, want %d", msg, len(got), len(want))
	for i := range want {
		require.Equal(t, want[i].ID, got[i].ID, "%s: token %d", msg, i)
		if exact {
			require.Equal(t, want[i].Logprob, got[i].Logprob, "%s: token %d log-probability", msg, i)
		} else {
			require.InDelta(t, want[i].Logprob, got[i].Logprob, 1e-4, "%s: token %d log-probability", msg, i)
		}
	}
}

func words(n int, tag string) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", tag, (i*7919)%997)
	}
	return strings.Join(w, " ")
}

// TestPrefixHitEqualsCold: the second run of a prompt resumes from the
// cache, and its tokens and log-probabilities equal the cold run's
// bitwise (the snapshot sits where the cold run cut), and those of a model
// without the cache within the tolerance.
func TestPrefixHitEqualsCold(t *testing.T) {
	dirs := testModels(t)
	ctx := context.Background()
	for _, cfg := range dirs {
		dir := filepath.Dir(cfg)
		plain, err := Load(ctx, dir, WithPrefillChunk(32))
		require.NoError(t, err)
		cached, err := Load(ctx, dir, WithPrefillChunk(32), WithPrefixCache(256<<20))
		require.NoError(t, err)
		for _, n := range []int{3, 20, 70} { // byte-level prompts of about 15, 100 and 350 tokens
			prompt := words(n, fmt.Sprintf("p%d-", n))
			opts := []GenerateOption{WithMaxTokens(8), WithoutDefaultStops(), WithLogprobs(1)}
			if n%2 == 0 {
				opts = append(opts, WithTemperature(0.8), WithSeed(uint64(n)))
			}
			want := genTokens(t, plain, prompt, opts...)
			before := cached.PrefixCacheStats()
			cold := genTokens(t, cached, prompt, opts...)
			hit := genTokens(t, cached, prompt, opts...)
			after := cached.PrefixCacheStats()
			name := fmt.Sprintf("%s, %d words", filepath.Base(dir), n)
			sameGeneration(t, cold, hit, true, name+": hit against the cold run")
			sameGeneration(t, want, cold, false, name+": cached model against the plain one")
			l := len(cached.Encode(prompt))
			if l > PrefixBlock {
				assert.Equal(t, before.Hits+1, after.Hits, "%s: one hit", name)
				assert.Equal(t, int64((l-1)/PrefixBlock*PrefixBlock), after.ReusedTokens-before.ReusedTokens, "%s: reused tokens", name)
				assert.Equal(t, (l-1)/PrefixBlock*PrefixBlock, hit[len(hit)-1].Usage.CachedTokens, "%s: usage", name)
			}
		}
		plain.Close()
		cached.Close()
	}
}

// TestPrefixSilentMisses reproduces the cases in which hybrid prefix
// caches are reported to miss silently, and shows a hit wherever one is
// possible.
func TestPrefixSilentMisses(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithPrefillChunk(32), WithPrefixCache(256<<20))
	require.NoError(t, err)
	defer m.Close()
	opts := []GenerateOption{WithMaxTokens(2), WithoutDefaultStops()}
	delta := func(f func()) PrefixStats {
		a := m.PrefixCacheStats()
		f()
		b := m.PrefixCacheStats()
		return PrefixStats{Lookups: b.Lookups - a.Lookups, Hits: b.Hits - a.Hits, ReusedTokens: b.ReusedTokens - a.ReusedTokens}
	}

	// A prompt shorter than a block cannot hit, and the counters say so.
	short := "tiny"
	genTokens(t, m, short, opts...)
	d := delta(func() { genTokens(t, m, short, opts...) })
	assert.Equal(t, PrefixStats{Lookups: 1}, d, "a prompt shorter than a block")
	// Identical prompts hit at their last block end.
	same := words(8, "s") // about 40 tokens
	genTokens(t, m, same, opts...)
	d = delta(func() { genTokens(t, m, same, opts...) })
	l := len(m.Encode(same))
	assert.Equal(t, PrefixStats{Lookups: 1, Hits: 1, ReusedTokens: int64((l - 1) / PrefixBlock * PrefixBlock)}, d, "identical prompts")

	// The only snapshot of the first prompt lies in its own tokens: the
	// second, sharing a 100-token head, misses, but leaves a snapshot where
	// the two part, so the third hits there.
	head := words(20, "h")
	tail := " and a tail of its own, long enough to hold blocks of its own"
	genTokens(t, m, head+" first"+tail, opts...)
	d = delta(func() { genTokens(t, m, head+" second"+tail, opts...) })
	assert.Equal(t, int64(0), d.Hits, "the second prompt: no snapshot in the shared head yet")
	d = delta(func() { genTokens(t, m, head+" third"+tail, opts...) })
	shared := sharedBlocks(m.Encode(head+" second"+tail), m.Encode(head+" third"+tail))
	assert.Equal(t, PrefixStats{Lookups: 1, Hits: 1, ReusedTokens: int64(shared)}, d, "the third prompt hits where the first two parted")

	// A long shared head (a system prompt) leaves interior snapshots: the
	// second prompt already hits.
	system := words(130, "sys") // about 650 tokens
	genTokens(t, m, system+" alpha beta gamma delta epsilon zeta eta theta", opts...)
	d = delta(func() { genTokens(t, m, system+" omega psi chi phi upsilon tau sigma rho", opts...) })
	assert.Equal(t, int64(1), d.Hits, "a long shared head")
	assert.Equal(t, int64(prefixInterior), d.ReusedTokens, "resumed at the interior snapshot")
}

// sharedBlocks is the whole blocks two token lists share from the start.
func sharedBlocks(a, b []int32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n / PrefixBlock * PrefixBlock
}

// TestPrefixChatTurns: the second turn of a conversation, sent as a new
// prompt holding the first turn and its answer, resumes at the last block
// end of the first generation, and matches a cold run within tolerance.
func TestPrefixChatTurns(t *testing.T) {
	ctx := context.Background()
	plain, err := Load(ctx, tinyDir)
	require.NoError(t, err)
	defer plain.Close()
	m, err := Load(ctx, tinyDir, WithPrefixCache(256<<20))
	require.NoError(t, err)
	defer m.Close()
	opts := []GenerateOption{WithMaxTokens(40), WithoutDefaultStops(), WithLogprobs(1)}
	// The second turn is built from token ids, as a server keeps a
	// conversation: re-encoding generated text need not give its ids back.
	gen := func(m *Model, prompt []int32) []Token {
		s, err := m.NewSession()
		require.NoError(t, err)
		defer s.Close()
		var out []Token
		for tok, err := range s.GenerateTokens(ctx, prompt, opts...) {
			require.NoError(t, err)
			out = append(out, tok)
		}
		return out
	}
	turn1 := m.Encode(words(30, "q"))
	var turn2 []int32
	turn2 = append(turn2, turn1...)
	for _, tok := range gen(m, turn1) {
		turn2 = append(turn2, tok.ID)
	}
	first := len(turn2)
	turn2 = append(turn2, m.Encode(" and then?")...)
	want := gen(plain, turn2)
	d0 := m.PrefixCacheStats()
	got := gen(m, turn2)
	d1 := m.PrefixCacheStats()
	sameGeneration(t, want, got, false, "the second turn")
	require.Equal(t, d0.Hits+1, d1.Hits)
	reused := int(d1.ReusedTokens - d0.ReusedTokens)
	t.Logf("first turn %d tokens, resumed at %d", first, reused)
	assert.GreaterOrEqual(t, reused, first-PrefixBlock, "resumed near the end of the first turn (%d tokens)", first)
	assert.LessOrEqual(t, reused, first)
}

// TestPrefixEviction: the cache stays within its budget, dropping the
// least recently used blocks, and a dropped prompt misses.
func TestPrefixEviction(t *testing.T) {
	ctx := context.Background()
	probe, err := Load(ctx, tinyDir, WithPrefixCache(1<<30))
	require.NoError(t, err)
	genTokens(t, probe, words(20, "a"), WithMaxTokens(1), WithoutDefaultStops())
	one := probe.PrefixCacheStats().Bytes // one prompt's blocks and snapshot
	probe.Close()
	require.Positive(t, one)
	m, err := Load(ctx, tinyDir, WithPrefixCache(3*one))
	require.NoError(t, err)
	defer m.Close()
	for i := range 6 {
		genTokens(t, m, words(20, fmt.Sprintf("x%d-", i)), WithMaxTokens(1), WithoutDefaultStops())
		assert.LessOrEqual(t, m.PrefixCacheStats().Bytes, 3*one, "after prompt %d", i)
	}
	a := m.PrefixCacheStats()
	genTokens(t, m, words(20, "x5-"), WithMaxTokens(1), WithoutDefaultStops()) // the newest: kept
	genTokens(t, m, words(20, "x0-"), WithMaxTokens(1), WithoutDefaultStops()) // the oldest: gone
	b := m.PrefixCacheStats()
	assert.Equal(t, a.Hits+1, b.Hits, "the newest prompt hits, the oldest misses")
	_, err = Load(ctx, tinyDir, WithPrefixCache(-1))
	assert.ErrorContains(t, err, "prefix cache")
}

// TestPrefixSpareSnapshots: the buffers of snapshots the cache evicts
// are kept (at most maxSpareSnapshots, counted in FreeStates) and a new
// snapshot is copied into one; a hit on that snapshot gives the cold
// run's tokens bitwise; the budget's eviction keeps none, and
// Model.spare gives them back.
func TestPrefixSpareSnapshots(t *testing.T) {
	probe := load(t, WithPrefixCache(1<<30))
	genTokens(t, probe, words(20, "a"), WithMaxTokens(1), WithoutDefaultStops())
	one := probe.PrefixCacheStats().Bytes // one prompt's blocks and snapshot

	m := load(t, WithPrefixCache(2*one))
	c := m.prefix
	opts := []GenerateOption{WithMaxTokens(4), WithoutDefaultStops(), WithLogprobs(1)}
	for i := range 8 {
		genTokens(t, m, words(20, fmt.Sprintf("s%d-", i)), opts...)
	}
	snapBytes := m.snapshotBytes()
	require.NotEmpty(t, c.spare, "evicted snapshots' buffers are kept")
	assert.LessOrEqual(t, len(c.spare), maxSpareSnapshots)
	assert.Equal(t, int64(len(c.spare))*snapBytes, c.spareBytes())
	u := m.MemoryUsage()
	assert.Equal(t, m.free.spare()+c.spareBytes(), u.FreeStates, "the spares are reported with the kept states")
	assert.Equal(t, u.PrefixCache+u.FreePages+u.FreeStates, u.Used, "and counted in the ledger")

	l := slices.IndexFunc(m.layers, func(ly *layer) bool { return ly.kind == config.KDA })
	require.GreaterOrEqual(t, l, 0)
	spares := map[*float32]bool{}
	for _, snap := range c.spare {
		spares[&snap[l][0]] = true
	}
	prompt := words(20, "reused-")
	want := genTokens(t, m, prompt, opts...)
	reused := false
	var walk func(n *prefixNode)
	walk = func(n *prefixNode) {
		for _, k := range n.kids {
			if k.snap != nil && spares[&k.snap[l][0]] {
				reused = true
			}
			walk(k)
		}
	}
	c.mu.Lock()
	walk(&c.root)
	c.mu.Unlock()
	assert.True(t, reused, "a new snapshot was copied into a kept buffer")
	hits := m.PrefixCacheStats().Hits
	got := genTokens(t, m, prompt, opts...)
	require.Equal(t, hits+1, m.PrefixCacheStats().Hits, "the prompt hits its snapshot")
	sameGeneration(t, want, got, true, "a hit on a snapshot in a reused buffer against the cold run")

	before := m.MemoryUsage()
	m.spare(1)
	assert.Zero(t, len(c.spare), "Model.spare gives the spares back")
	assert.Zero(t, c.spareBytes())
	u = m.MemoryUsage()
	assert.Equal(t, u.PrefixCache+u.FreePages+u.FreeStates, u.Used)
	assert.Less(t, u.Used, before.Used)

	// Eviction for the model's budget keeps none.
	require.Positive(t, m.PrefixCacheStats().Snapshots)
	for c.evictOne() {
	}
	assert.Zero(t, m.PrefixCacheStats().Snapshots)
	assert.Zero(t, len(c.spare), "the budget's eviction keeps no spares")
	u = m.MemoryUsage()
	assert.Equal(t, u.FreePages+u.FreeStates, u.Used)
}

// TestPrefixHitEvictedBeforeRestore: a hit the cache evicts between its
// lookup and its restore (the memory its session reserves in between can
// empty the cache) is a miss: the session prefills, with the cold run's
// tokens.
func TestPrefixHitEvictedBeforeRestore(t *testing.T) {
	ctx := context.Background()
	m := load(t, WithPrefixCache(64<<20))
	c := m.prefix
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(3 + i*7%50)
	}
	gen := func(s *Session) []Token {
		var out []Token
		for tok, err := range s.GenerateTokens(ctx, prompt, WithMaxTokens(3), WithoutDefaultStops(), WithLogprobs(1)) {
			require.NoError(t, err)
			out = append(out, tok)
		}
		return out
	}
	first, err := m.NewSession()
	require.NoError(t, err)
	want := gen(first)
	require.NoError(t, first.Close())

	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	hit, _ := c.lookup(prompt)
	require.NotNil(t, hit, "the prompt is cached")
	for c.evictOne() {
	}
	hits := m.PrefixCacheStats().Hits
	ok, err := c.restore(s, hit)
	require.NoError(t, err)
	assert.False(t, ok, "an evicted hit is not restored")
	assert.Zero(t, s.Len())
	assert.Equal(t, hits, m.PrefixCacheStats().Hits)
	sameGeneration(t, want, gen(s), true, "the session prefilled instead")
}

// TestPrefixRecencyList: the recency list holds every cached block, and
// its oldest is the least recently used leaf a walk of the tree finds,
// and the footprint kept as blocks come and go is the one a walk counts,
// after random prompts with shared heads, hits and evictions.
func TestPrefixRecencyList(t *testing.T) {
	ctx := context.Background()
	m := load(t, WithPrefixCache(2<<20))
	c := m.prefix
	walkLRU := func() (lru *prefixNode, n int) {
		var walk func(x *prefixNode)
		walk = func(x *prefixNode) {
			for _, k := range x.kids {
				n++
				if len(k.kids) == 0 && (lru == nil || k.used < lru.used) {
					lru = k
				}
				walk(k)
			}
		}
		walk(&c.root)
		return lru, n
	}
	walkFootprint := func() (all, alone int64) {
		held := map[int]map[*dsa.Page]int{}
		var walk func(x *prefixNode)
		walk = func(x *prefixNode) {
			for _, k := range x.kids {
				all += floats(k.snap)
				for l, pg := range k.pages {
					if pg != nil {
						if held[l] == nil {
							held[l] = map[*dsa.Page]int{}
						}
						held[l][pg]++
					}
				}
				walk(k)
			}
		}
		walk(&c.root)
		alone = all
		for l, h := range held {
			pool := m.layers[l].pages
			all += int64(len(h)) * pool.PageBytes()
			alone += int64(pool.HeldOnly(h)) * pool.PageBytes()
		}
		return all, alone
	}
	check := func(when string) {
		t.Helper()
		c.mu.Lock()
		wantAll, wantAlone := walkFootprint()
		c.mu.Unlock()
		all, alone := c.footprint()
		require.Equal(t, wantAll, all, "%s: the cache's footprint", when)
		require.Equal(t, wantAlone, alone, "%s: what the cache alone holds", when)
		c.mu.Lock()
		defer c.mu.Unlock()
		lru, n := walkLRU()
		listed := 0
		for x := c.newest; x != nil; x = x.older {
			listed++
			require.LessOrEqual(t, listed, n, "%s: the list is longer than the tree", when)
			if x.older != nil {
				require.GreaterOrEqual(t, x.used, x.older.used, "%s: the list is in order of use", when)
			}
		}
		require.Equal(t, n, listed, "%s: every cached block is listed", when)
		require.Equal(t, c.stats.Blocks, n, when)
		require.Same(t, lru, c.oldest, "%s: the oldest listed block is the least recently used leaf", when)
	}
	r := rand.New(rand.NewPCG(7, 11))
	heads := make([][]int32, 4)
	for i := range heads {
		heads[i] = make([]int32, 16*(1+r.IntN(4)))
		for j := range heads[i] {
			heads[i][j] = int32(3 + r.IntN(60))
		}
	}
	for i := range 60 {
		prompt := slices.Clone(heads[r.IntN(len(heads))])
		for range 1 + r.IntN(40) {
			prompt = append(prompt, int32(3+r.IntN(60)))
		}
		s, err := m.NewSession()
		require.NoError(t, err)
		for _, err := range s.GenerateTokens(ctx, prompt, WithMaxTokens(1+r.IntN(20)), WithoutDefaultStops()) {
			require.NoError(t, err)
		}
		check(fmt.Sprintf("prompt %d, its session open", i))
		require.NoError(t, s.Close())
		check(fmt.Sprintf("after prompt %d", i))
	}
	st := m.PrefixCacheStats()
	require.Positive(t, st.Hits, "some prompts hit")
	require.Positive(t, st.Blocks)
	for c.stats.Blocks > 0 {
		c.mu.Lock()
		c.evictTo(c.stats.Bytes-1, true)
		c.mu.Unlock()
		check(fmt.Sprintf("with %d blocks left", c.stats.Blocks))
	}
	assert.Nil(t, c.newest)
	assert.Nil(t, c.oldest)
}

// TestBatcherPrefixHit: the batcher resumes prompts from the prefix cache
// too, with the tokens Generate gets from the same hit.
func TestBatcherPrefixHit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m, err := Load(ctx, tinyDir, WithPrefillChunk(32), WithPrefixCache(256<<20))
	require.NoError(t, err)
	defer m.Close()
	br, err := m.NewBatcher(3)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	opts := []GenerateOption{WithMaxTokens(6), WithoutDefaultStops(), WithLogprobs(1)}
	prompt := words(40, "b")
	genTokens(t, m, prompt, opts...)         // cold: fills the cache
	want := genTokens(t, m, prompt, opts...) // a hit
	before := m.PrefixCacheStats()
	s, err := m.NewSession()
	require.NoError(t, err)
	var got []Token
	for tok, err := range br.Generate(ctx, s, prompt, opts...) {
		require.NoError(t, err)
		got = append(got, tok)
	}
	assert.Equal(t, before.Hits+1, m.PrefixCacheStats().Hits, "the batcher's lookup hit")
	sameGeneration(t, want, got, true, "the batcher against Generate, both resumed")
	assert.Equal(t, want[len(want)-1].Usage, got[len(got)-1].Usage)
}

// TestPrefixPages: MemoryUsage.PrefixPages is what a prefix cache filled
// by long prompts holds (within 5%), a snapshot is a session's KDA
// states, and the figure follows the smaller budget and is 0 without a
// cache.
func TestPrefixPages(t *testing.T) {
	ctx := context.Background()
	m, err := LoadTiny(ctx, WithPrefixCache(8<<20), WithMemoryBudget(64<<20))
	require.NoError(t, err)
	defer m.Close()
	s, err := m.NewSession()
	require.NoError(t, err)
	require.Equal(t, s.KDAStateBytes(), m.snapshotBytes())
	require.NoError(t, s.Close())

	for i := range 5 {
		genTokens(t, m, words(1000, fmt.Sprintf("p%dq", i)), WithMaxTokens(1))
	}
	u, st := m.MemoryUsage(), m.PrefixCacheStats()
	held := float64(st.Blocks*PrefixBlock) / float64(u.PageTokens)
	t.Logf("held %.1f pages' worth in %d blocks and %d snapshots (%d bytes); PrefixPages %d", held, st.Blocks, st.Snapshots, st.Bytes, u.PrefixPages)
	require.Positive(t, u.PrefixPages)
	require.InEpsilon(t, float64(u.PrefixPages), held, 0.05)

	small, err := LoadTiny(ctx, WithPrefixCache(8<<20), WithMemoryBudget(4<<20))
	require.NoError(t, err)
	defer small.Close()
	require.InDelta(t, float64(u.PrefixPages)/2, float64(small.MemoryUsage().PrefixPages), 1, "a 4 MiB budget holds half an 8 MiB cache")

	none, err := LoadTiny(ctx, WithMemoryBudget(64<<20))
	require.NoError(t, err)
	defer none.Close()
	require.Zero(t, none.MemoryUsage().PrefixPages)
}

// TestPrefixAlone: MemoryUsage.PrefixAlone is the whole cache while no
// session holds its pages, and leaves out the full pages a session that
// resumed from it shares with it.
func TestPrefixAlone(t *testing.T) {
	ctx := context.Background()
	m, err := LoadTiny(ctx, WithPrefixCache(8<<20), WithMemoryBudget(64<<20))
	require.NoError(t, err)
	defer m.Close()
	prompt := words(150, "alone")
	genTokens(t, m, prompt, WithMaxTokens(1))
	u := m.MemoryUsage()
	require.Positive(t, u.PrefixCache)
	require.Equal(t, u.PrefixCache, u.PrefixAlone, "no session holds the cache's pages")

	s, err := m.NewSession()
	require.NoError(t, err)
	before := m.PrefixCacheStats().ReusedTokens
	for _, err := range s.Generate(ctx, prompt, WithMaxTokens(1)) {
		require.NoError(t, err)
	}
	hit := m.PrefixCacheStats().ReusedTokens - before
	require.Greater(t, hit, int64(2*u.PageTokens), "the prompt resumed from the cache")
	u = m.MemoryUsage()
	assert.Equal(t, hit/int64(u.PageTokens)*u.PageBytes, u.PrefixCache-u.PrefixAlone, "the full pages of the %d tokens resumed are shared", hit)

	require.NoError(t, s.Close())
	u = m.MemoryUsage()
	require.Equal(t, u.PrefixCache, u.PrefixAlone)
}
