package k3

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/config"
	"k3/dsa"
)

// baseBytes is a fresh session's state on the tiny model.
func baseBytes(t *testing.T) int64 {
	m := load(t)
	s, err := m.NewSession()
	require.NoError(t, err)
	assert.Equal(t, s.StateBytes(), m.MemoryUsage().Used, "the ledger counts a new session")
	return s.StateBytes()
}

// TestMemoryBudget: sessions are refused past the budget with
// ErrMemoryBudget, a refused pass changes nothing, closing gives the
// memory back, and the ledger returns to zero after many sessions.
func TestMemoryBudget(t *testing.T) {
	ctx := context.Background()
	base := baseBytes(t)
	m := load(t, WithMemoryBudget(base*5/2))
	a, err := m.NewSession()
	require.NoError(t, err)
	b, err := m.NewSession()
	require.NoError(t, err)
	_, err = m.NewSession()
	require.ErrorIs(t, err, ErrMemoryBudget, "a third session")
	assert.Equal(t, 2*base, m.MemoryUsage().Used)
	assert.InDelta(t, 0.8, m.MemoryUsage().Fraction(), 1e-9)
	require.NoError(t, b.Close())
	u := m.MemoryUsage()
	assert.Equal(t, base, u.Used-u.FreeStates, "closing gives the state back")
	assert.Positive(t, u.FreeStates, "the closed session's KDA states are kept for the next one")
	assert.LessOrEqual(t, u.FreeStates, base)
	c, err := m.NewSession()
	require.NoError(t, err, "a session takes the kept states")
	u = m.MemoryUsage()
	assert.Equal(t, 2*base, u.Used)
	assert.Zero(t, u.FreeStates)
	require.NoError(t, c.Close())

	// A prompt that grows the caches past the budget fails before it
	// changes anything; a shorter one then runs.
	_, err = a.Forward(ctx, []int32{1, 2, 3})
	require.NoError(t, err)
	want := a.Logits()
	long := make([]int32, 2000)
	for i := range long {
		long[i] = int32(1 + i%50)
	}
	_, err = a.Forward(ctx, long)
	require.ErrorIs(t, err, ErrMemoryBudget, "a prompt whose caches do not fit")
	assert.Equal(t, 3, a.Len(), "the refused prompt left the session as it was")
	assert.Equal(t, want, a.Logits())
	_, err = a.Forward(ctx, []int32{4})
	require.NoError(t, err, "the session goes on")
	assert.Equal(t, a.StateBytes(), m.MemoryUsage().Used)
	require.NoError(t, a.Close())
	u = m.MemoryUsage()
	assert.Equal(t, u.FreePages+u.FreeStates, u.Used, "only free pages and kept states are left")

	// Many sessions, forks and closes from several goroutines: the ledger
	// comes back to zero.
	free := load(t, WithMemoryBudget(1<<40))
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 250 {
				s, err := free.NewSession()
				if !assert.NoError(t, err) {
					return
				}
				s.Forward(ctx, []int32{int32(1 + g), int32(2 + i%7)})
				c, err := s.Clone()
				if assert.NoError(t, err) {
					c.Forward(ctx, []int32{5})
					c.Close()
				}
				s.Close()
			}
		}()
	}
	wg.Wait()
	u = free.MemoryUsage()
	assert.Equal(t, u.FreePages+u.FreeStates, u.Used, "1,000 sessions and their clones opened and closed")
	assert.LessOrEqual(t, u.FreeStates, maxFreeStates*base)
	for _, ly := range free.layers {
		if ly.pages != nil {
			live, n := ly.pages.Pages()
			assert.Zero(t, live, "pages held after every session closed")
			assert.LessOrEqual(t, n, dsa.MaxFree)
		}
	}
}

// TestMemoryBudgetPrefixYields: the prefix cache gives up blocks when a
// session needs the memory.
func TestMemoryBudgetPrefixYields(t *testing.T) {
	base := baseBytes(t)
	m := load(t, WithMemoryBudget(64*base), WithPrefixCache(1<<30))
	for i := range 3 {
		genTokens(t, m, words(60, string(rune('a'+i))), WithMaxTokens(2), WithoutDefaultStops())
	}
	filled := m.PrefixCacheStats().Bytes
	require.Positive(t, filled)
	u := m.MemoryUsage()
	require.Equal(t, u.PrefixCache+u.FreePages+u.FreeStates, u.Used, "only the cache, free pages and kept states hold memory")
	// Sessions until the budget is used up: the cache makes room for them.
	var held []*Session
	for int64(len(held)+1)*base <= 64*base {
		s, err := m.NewSession()
		require.NoError(t, err, "the cache should make room for session %d", len(held))
		held = append(held, s)
	}
	assert.Less(t, m.PrefixCacheStats().Bytes, filled, "the cache gave up blocks")
	assert.LessOrEqual(t, m.MemoryUsage().Used, 64*base)
	_, err := m.NewSession()
	assert.ErrorIs(t, err, ErrMemoryBudget, "past the budget with the cache empty")
	for _, s := range held {
		s.Close()
	}
	u = m.MemoryUsage()
	assert.Equal(t, u.PrefixCache+u.FreePages+u.FreeStates, u.Used, "what is left is the cache's, free pages and kept states")
}

// TestBatcherMemoryBudget: under a budget that holds one long request's
// growth beside the sessions, requests wait for memory instead of failing
// and every generation completes as it would alone.
func TestBatcherMemoryBudget(t *testing.T) {
	base := baseBytes(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	plain := load(t)
	prompts := []string{words(90, "m"), words(5, "n"), words(60, "o"), words(30, "p")}
	opts := []GenerateOption{WithMaxTokens(30), WithoutDefaultStops()}
	// Room for every session's base state and one long prompt's caches.
	probe, err := plain.NewSession()
	require.NoError(t, err)
	for range probe.Generate(ctx, prompts[0], opts...) {
	}
	budget := 4*base + (probe.StateBytes() - base)
	m := load(t, WithMemoryBudget(budget), WithPrefillChunk(64))
	br, err := m.NewBatcher(4)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	var wg sync.WaitGroup
	got := make([][]int32, len(prompts))
	errs := make([]error, len(prompts))
	for i, p := range prompts {
		s, err := m.NewSession()
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer s.Close()
			for tok, err := range br.Generate(ctx, s, p, opts...) {
				if err != nil {
					errs[i] = err
					return
				}
				got[i] = append(got[i], tok.ID)
			}
		}()
	}
	wg.Wait()
	for i, p := range prompts {
		require.NoError(t, errs[i], "request %d waits for memory instead of failing", i)
		var want []int32
		for _, tok := range genTokens(t, plain, p, opts...) {
			want = append(want, tok.ID)
		}
		assert.Equal(t, want, got[i], "request %d", i)
	}
	assert.LessOrEqual(t, m.MemoryUsage().Used, budget)
	// A request that could never fit fails at once.
	s, err := m.NewSession()
	require.NoError(t, err)
	for _, err := range br.Generate(ctx, s, words(90, "m"), WithMaxTokens(4000), WithoutDefaultStops()) {
		require.ErrorIs(t, err, ErrMemoryBudget)
	}
}

// TestBatcherWaitingGiveWay: when the sessions of the requests waiting
// hold the memory the oldest needs, and nothing running or outside the
// queue could give it back, the newest waiting request fails with
// ErrMemoryBudget instead of every one waiting on the others for ever;
// once its session is closed the others run, each as it would alone.
// Before that, while a session outside the queue could still give the
// memory back, none fails.
func TestBatcherWaitingGiveWay(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a hang fails, it does not stall the run
	defer cancel()
	plain := load(t)
	opts := []GenerateOption{WithMaxTokens(12), WithoutDefaultStops()}
	// Each session holds attention pages before it joins the queue (an
	// earlier turn), which the ledger counts in their pools, not in the
	// session's charge.
	turn := plain.Encode(words(30, "v"))
	prompt := plain.Encode(words(150, "w"))
	probe, err := plain.NewSession()
	require.NoError(t, err)
	_, err = probe.Forward(ctx, turn)
	require.NoError(t, err)
	state := probe.StateBytes()
	growth := probe.growth(len(prompt) + 12) // what the Batcher reserves for one request
	require.Positive(t, growth)
	// Two sessions and one request's growth fit; three sessions and one
	// request's growth do not.
	budget := 2*state + growth + state/2
	m := load(t, WithMemoryBudget(budget))
	br, err := m.NewBatcher(3)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	var sessions []*Session
	for range 3 {
		s, err := m.NewSession()
		require.NoError(t, err, "three sessions fit the budget")
		_, err = s.Forward(ctx, turn)
		require.NoError(t, err, "three sessions fit the budget")
		require.Equal(t, state, s.StateBytes())
		sessions = append(sessions, s)
	}
	require.Less(t, sessions[0].charged, state, "the ledger counts the pages apart")
	require.Greater(t, 3*state+growth, budget)

	type result struct {
		ids []int32
		err error
	}
	results := make([]result, len(sessions))
	run := func(i int) {
		defer sessions[i].Close() // as a server's handler does, on success or failure
		for tok, err := range br.GenerateTokens(ctx, sessions[i], prompt, opts...) {
			if err != nil {
				results[i].err = err
				return
			}
			results[i].ids = append(results[i].ids, tok.ID)
		}
	}
	// Two requests wait while the third session, outside the queue,
	// could still be closed: neither fails.
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); run(i) }()
	}
	require.Eventually(t, func() bool { return br.Stats().Waiting == 2 }, 10*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond) // ten of the loop's looks at its queue
	assert.Equal(t, BatcherStats{Waiting: 2}, br.Stats(), "both wait for the session outside the queue")
	// The third joins them: the three wait on each other, and the newest
	// gives way.
	wg.Add(1)
	go func() { defer wg.Done(); run(2) }()
	wg.Wait()
	want := collect(t, probe.GenerateTokens(ctx, prompt, opts...))
	require.Len(t, want, 12)
	for i, r := range results[:2] {
		require.NoError(t, r.err, "request %d", i)
		assert.Equal(t, want, r.ids, "request %d against its lone run", i)
	}
	require.ErrorIs(t, results[2].err, ErrMemoryBudget, "the newest request gives way")
	assert.Empty(t, results[2].ids)
	assert.Zero(t, m.MemoryUsage().Used-m.MemoryUsage().FreePages-m.MemoryUsage().FreeStates, "every session closed")
}

// TestBatcherStallLimit: a request that waits for memory a session
// outside the queue holds, while nothing runs, fails with
// ErrMemoryBudget once stallLimit has passed, rather than waiting for
// ever; once that session is closed, the same request runs.
func TestBatcherStallLimit(t *testing.T) {
	defer func(d time.Duration) { stallLimit = d }(stallLimit)
	stallLimit = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plain := load(t)
	prompt := plain.Encode(words(150, "w"))
	opts := []GenerateOption{WithMaxTokens(12), WithoutDefaultStops()}
	probe, err := plain.NewSession()
	require.NoError(t, err)
	state := probe.StateBytes()
	growth := probe.growth(len(prompt) + 12)
	m := load(t, WithMemoryBudget(state+growth+state/2)) // one request's session and growth, not a second session beside them
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	outside, err := m.NewSession()
	require.NoError(t, err)
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	start := time.Now()
	var last error
	for _, err := range br.GenerateTokens(ctx, s, prompt, opts...) {
		last = err
	}
	require.ErrorIs(t, last, ErrMemoryBudget)
	assert.GreaterOrEqual(t, time.Since(start), stallLimit, "it waited first")
	require.NoError(t, outside.Close())
	assert.Equal(t, collect(t, probe.GenerateTokens(ctx, prompt, opts...)), collect(t, br.GenerateTokens(ctx, s, prompt, opts...)))
}

// TestFreeStates: a closed session's KDA states serve the next new
// session, zeroed (its logits are a fresh session's, bit for bit); at most
// maxFreeStates sets are kept, counted in the ledger; the budget takes
// them back before it refuses a pass.
func TestFreeStates(t *testing.T) {
	ctx := context.Background()
	base := baseBytes(t)
	prompt := []int32{3, 1, 4, 1, 5, 9, 2, 6}

	m := load(t)
	fresh, err := m.NewSession()
	require.NoError(t, err)
	want, err := fresh.Forward(ctx, prompt)
	require.NoError(t, err)
	require.NoError(t, fresh.Close())
	kept := m.MemoryUsage().FreeStates
	require.Positive(t, kept)
	assert.LessOrEqual(t, kept, base)

	used, err := m.NewSession()
	require.NoError(t, err)
	l := slices.IndexFunc(m.layers, func(ly *layer) bool { return ly.kind == config.KDA })
	require.GreaterOrEqual(t, l, 0)
	assert.Same(t, fresh.kdaSt[l].S.Mem, used.kdaSt[l].S.Mem, "the new session took the closed one's states")
	assert.Zero(t, m.MemoryUsage().FreeStates)
	got, err := used.Forward(ctx, prompt)
	require.NoError(t, err)
	assert.Equal(t, want, got, "states reused from a session that ran are zeroed")

	var many []*Session
	for range maxFreeStates + 3 {
		s, err := m.NewSession()
		require.NoError(t, err)
		many = append(many, s)
	}
	for _, s := range many {
		require.NoError(t, s.Close())
	}
	assert.Equal(t, maxFreeStates*kept, m.MemoryUsage().FreeStates, "at most maxFreeStates sets are kept")

	// Under a budget, kept states give way to a session's pages.
	small := load(t, WithMemoryBudget(base*5/2))
	a, err := small.NewSession()
	require.NoError(t, err)
	b, err := small.NewSession()
	require.NoError(t, err)
	require.NoError(t, b.Close())
	u := small.MemoryUsage()
	require.Equal(t, kept, u.FreeStates)
	n := u.PageTokens * int(base/u.PageBytes+1) // pages of about a session's states
	require.Greater(t, int64(n/u.PageTokens)*u.PageBytes+base+kept, u.Budget, "the pages fit only if the kept states go")
	_, err = a.Forward(ctx, make([]int32, n))
	require.NoError(t, err, "the kept states gave way")
	assert.Zero(t, small.MemoryUsage().FreeStates)
	require.NoError(t, a.Close())
	require.NoError(t, small.Close())
	assert.Zero(t, small.free.spare(), "Close frees the kept states")
}

// TestBatcherKeepsItsPromise: the room a Batcher keeps for what an
// admitted request may still grow by is not taken by sessions made
// outside it while the request runs: those fail with ErrMemoryBudget, and
// the request completes as it would alone. Without the promise the
// outside sessions took the room and the request's next pass failed
// (found by a randomised run of k3 serve under a 3 MiB budget).
func TestBatcherKeepsItsPromise(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plain := load(t)
	prompt := plain.Encode(words(10, "k"))
	opts := []GenerateOption{WithMaxTokens(150), WithoutDefaultStops()}
	probe, err := plain.NewSession()
	require.NoError(t, err)
	state := probe.StateBytes()
	growth := probe.growth(len(prompt) + 150)
	want := collect(t, probe.GenerateTokens(ctx, prompt, opts...))
	require.NoError(t, probe.Close())
	require.Greater(t, growth, state, "the request grows by more than a session's state")

	// The request's session, its growth, and four more sessions.
	budget := 5*state + growth
	m := load(t, WithMemoryBudget(budget))
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	var got []int32
	var outside []*Session
	defer func() {
		for _, o := range outside {
			o.Close()
		}
	}()
	for tok, err := range br.GenerateTokens(ctx, s, prompt, opts...) {
		require.NoError(t, err, "after %d tokens, beside %d sessions made outside", len(got), len(outside))
		got = append(got, tok.ID)
		if len(got) == 1 {
			// Sessions outside the Batcher until the budget refuses one.
			for len(outside) < 20 {
				o, err := m.NewSession()
				if err != nil {
					require.ErrorIs(t, err, ErrMemoryBudget)
					break
				}
				outside = append(outside, o)
			}
			assert.Less(t, len(outside), 5, "the promised room was given to sessions outside")
			assert.Positive(t, m.MemoryUsage().Promised)
		}
	}
	assert.Equal(t, want, got)
	require.Eventually(t, func() bool { return m.MemoryUsage().Promised == 0 }, 10*time.Second, time.Millisecond, "the promise outlived its request")
}
