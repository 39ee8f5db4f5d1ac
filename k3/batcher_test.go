package k3

import (
	"context"
	"fmt"
	"iter"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBatcherNotRunning: Generate fails at once before the batcher starts
// and after it stops; it starts once.
func TestBatcherNotRunning(t *testing.T) {
	m := load(t)
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	s, err := m.NewSession()
	require.NoError(t, err)
	// No deadline: a Generate that waited for a loop would hang the test.
	for _, err := range br.Generate(context.Background(), s, "x") {
		require.ErrorIs(t, err, ErrBatcherNotRunning)
	}
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, br.Start(ctx))
	assert.Error(t, br.Start(ctx), "a second Start")
	assert.Error(t, br.Run(ctx), "Run after Start")
	assert.Len(t, collect(t, br.Generate(ctx, s, "x", WithMaxTokens(2), WithoutDefaultStops())), 2)
	cancel()
	assert.ErrorIs(t, br.Wait(), context.Canceled)
	for _, err := range br.Generate(context.Background(), s, "x") {
		require.ErrorIs(t, err, ErrBatcherClosed)
	}
}

// TestBatcherSlowConsumer: a consumer that stops reading (without
// abandoning its stream) holds up only its own sequence. The other
// generation runs to its end meanwhile; when the first consumer reads
// again it gets every token, and both equal their generations alone.
func TestBatcherSlowConsumer(t *testing.T) {
	m := load(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	const slowN, fastN = 3 * streamBuffer, 2 * streamBuffer
	wantSlow := collect(t, m.Generate(ctx, "slow", WithMaxTokens(slowN), WithoutDefaultStops()))
	wantFast := collect(t, m.Generate(ctx, "fast", WithMaxTokens(fastN), WithoutDefaultStops()))

	hold := make(chan struct{})
	first := make(chan struct{})
	slowDone := make(chan []int32, 1)
	go func() {
		s, _ := m.NewSession()
		var got []int32
		for tok, err := range br.Generate(ctx, s, "slow", WithMaxTokens(slowN), WithoutDefaultStops()) {
			if err != nil {
				break
			}
			got = append(got, tok.ID)
			if len(got) == 1 {
				close(first)
				<-hold // stop reading, keep the stream
			}
		}
		slowDone <- got
	}()
	<-first
	s, err := m.NewSession()
	require.NoError(t, err)
	fastDone := make(chan []int32, 1)
	go func() {
		fastDone <- collect(t, br.Generate(ctx, s, "fast", WithMaxTokens(fastN), WithoutDefaultStops()))
	}()
	select {
	case got := <-fastDone:
		assert.Equal(t, wantFast, got, "the other generation")
	case <-time.After(60 * time.Second):
		t.Fatal("a stalled consumer blocked the other generation")
	}
	close(hold)
	assert.Equal(t, wantSlow, <-slowDone, "the paused generation, once read again")

	// Abandoning a paused stream frees its sequence: the batcher goes on.
	before := runtime.NumGoroutine()
	func() {
		s, _ := m.NewSession()
		for range br.Generate(ctx, s, "gone", WithMaxTokens(slowN), WithoutDefaultStops()) {
			time.Sleep(20 * time.Millisecond) // let the stream fill
			break
		}
	}()
	s2, _ := m.NewSession()
	assert.Len(t, collect(t, br.Generate(ctx, s2, "x", WithMaxTokens(3), WithoutDefaultStops())), 3)
	// Polled here rather than with assert.Eventually, whose checks run in
	// goroutines of their own.
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines left, %d before an abandoned stream:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// TestSchedulerEqualsAlone: generations through the batcher, arriving in
// random orders beside each other, give bitwise the tokens and
// log-probabilities each gets from Session.Generate alone; their prompts
// span several chunks, so prefill chunks share passes with decode rows.
func TestSchedulerEqualsAlone(t *testing.T) {
	for _, dir := range []string{tinyDir, "../testdata/model/tiny_kimi_linear"} {
		m, err := Load(context.Background(), dir, WithPrefillChunk(24))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		br, err := m.NewBatcher(4)
		require.NoError(t, err)
		require.NoError(t, br.Start(ctx))
		r := rand.New(rand.NewPCG(31, 3))
		type req struct {
			prompt string
			opts   []GenerateOption
		}
		var reqs []req
		for i := range 7 {
			words := make([]string, 5+r.IntN(40))
			for j := range words {
				words[j] = fmt.Sprintf("w%d", r.IntN(1000))
			}
			opts := []GenerateOption{WithMaxTokens(4 + r.IntN(12)), WithoutDefaultStops(), WithLogprobs(2)}
			if i%2 == 1 {
				opts = append(opts, WithTemperature(0.9), WithSeed(uint64(i)))
			}
			reqs = append(reqs, req{strings.Join(words, " "), opts})
		}
		run := func(seq iter.Seq2[Token, error]) ([]Token, error) {
			var out []Token
			for tok, err := range seq {
				if err != nil {
					return out, err
				}
				out = append(out, tok)
			}
			return out, nil
		}
		want := make([][]Token, len(reqs))
		for i, q := range reqs {
			want[i], err = run(m.Generate(ctx, q.prompt, q.opts...))
			require.NoError(t, err)
		}
		for round := range 3 {
			got := make([][]Token, len(reqs))
			errs := make([]error, len(reqs))
			var wg sync.WaitGroup
			for _, i := range r.Perm(len(reqs)) {
				wg.Add(1)
				delay := time.Duration(r.IntN(3000)) * time.Microsecond
				go func() {
					defer wg.Done()
					time.Sleep(delay)
					s, err := m.NewSession()
					if err != nil {
						errs[i] = err
						return
					}
					defer s.Close()
					got[i], errs[i] = run(br.Generate(ctx, s, reqs[i].prompt, reqs[i].opts...))
				}()
			}
			wg.Wait()
			for i := range reqs {
				require.NoError(t, errs[i])
				require.Equal(t, want[i], got[i], "%s round %d request %d", filepath.Base(dir), round, i)
			}
		}
		cancel()
		br.Wait()
		m.Close()
	}
}

// TestLongPromptDoesNotStall: while a prompt of many chunks prefills, a
// running generation keeps getting a token every pass.
func TestLongPromptDoesNotStall(t *testing.T) {
	m, err := Load(context.Background(), tinyDir, WithPrefillChunk(20))
	require.NoError(t, err)
	defer m.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	var order atomic.Int64 // a global sequence number for every yielded token
	var streamTicks []int64
	first := make(chan struct{})
	streamDone := make(chan error, 1)
	go func() {
		s, _ := m.NewSession()
		for _, err := range br.Generate(ctx, s, "running", WithMaxTokens(400), WithoutDefaultStops()) {
			if err != nil {
				streamDone <- err
				return
			}
			streamTicks = append(streamTicks, order.Add(1))
			if len(streamTicks) == 1 {
				close(first)
			}
		}
		streamDone <- nil
	}()
	<-first
	long := strings.Repeat("a long prompt ", 120) // a few hundred tokens: many chunks of 20
	s, _ := m.NewSession()
	submitted := order.Load()
	var firstLong int64
	for _, err := range br.Generate(ctx, s, long, WithMaxTokens(1), WithoutDefaultStops()) {
		require.NoError(t, err)
		firstLong = order.Add(1)
	}
	require.NoError(t, <-streamDone)
	between := 0
	for _, tick := range streamTicks {
		if tick > submitted && tick < firstLong {
			between++
		}
	}
	// Ticks are taken where the tokens are read, not made: a consumer
	// the OS schedules late (a loaded CI machine) reads a few of the
	// stream's tokens after the long prompt's, so an eighth of the chunks
	// is left for that; a stream that stalls during prefill, or gets a
	// token only every other pass, still fails.
	chunks := (len(m.Encode(long)) + 19) / 20
	assert.GreaterOrEqual(t, between, chunks-chunks/8, "the running stream's tokens while %d prompt chunks prefilled", chunks)
}

// TestBatcherChurn: many concurrent streaming generations through one
// batcher, with random cancellations, abandoned streams and clones of
// finished sessions, leave no sequence behind: every session is usable
// afterwards, the memory ledger returns to the prefix cache's bytes, and
// the race detector sees nothing.
func TestBatcherChurn(t *testing.T) {
	m, err := Load(context.Background(), tinyDir, WithPrefillChunk(24), WithPrefixCache(64<<20), WithMemoryBudget(1<<30))
	require.NoError(t, err)
	defer m.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	br, err := m.NewBatcher(6)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 41))
			for i := range 6 {
				s, err := m.NewSession()
				if !assert.NoError(t, err) {
					return
				}
				rctx, rcancel := context.WithCancel(ctx)
				n := 0
				for _, err := range br.Generate(rctx, s, fmt.Sprintf("churn %d %d %s", g, i, strings.Repeat("x", r.IntN(80))),
					WithMaxTokens(5+r.IntN(20)), WithoutDefaultStops()) {
					if err != nil {
						assert.ErrorIs(t, err, context.Canceled)
						break
					}
					n++
					if r.IntN(12) == 0 {
						rcancel() // cancelled mid-stream
					}
					if r.IntN(15) == 0 {
						break // abandoned
					}
				}
				rcancel()
				if c, err := s.Clone(); assert.NoError(t, err, "a session after its generation") {
					_, err := c.Forward(ctx, []int32{7})
					assert.NoError(t, err)
					c.Close()
				}
				s.Close()
			}
		}()
	}
	wg.Wait()
	u := m.MemoryUsage()
	assert.Equal(t, u.PrefixCache+u.FreePages+u.FreeStates, u.Used, "every session's state came back")
}

// TestBatcherPrefillForks: a prompt prefilled once through the batcher and
// forked into several seeded generations gives each fork the tokens and
// log-probabilities of Session.Generate of the whole prompt alone, bitwise.
func TestBatcherPrefillForks(t *testing.T) {
	m := load(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	br, err := m.NewBatcher(4)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	prompt := m.Encode("func main() { fmt.Println(")
	opts := func(seed uint64) []GenerateOption {
		return []GenerateOption{WithMaxTokens(12), WithoutDefaultStops(), WithTemperature(0.9), WithSeed(seed), WithLogprobs(2)}
	}
	base, err := m.NewSession()
	require.NoError(t, err)
	defer base.Close()
	cached, err := br.Prefill(ctx, base, prompt)
	require.NoError(t, err)
	assert.Zero(t, cached)
	require.Equal(t, prompt, base.Tokens())

	var wg sync.WaitGroup
	got := make([][]Token, 3)
	for i := range got {
		f, err := base.Fork()
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer f.Close()
			for tok, err := range br.GenerateTokens(ctx, f, nil, opts(uint64(i))...) {
				if !assert.NoError(t, err) {
					return
				}
				tok.Usage = nil
				got[i] = append(got[i], tok)
			}
		}()
	}
	wg.Wait()
	for i := range got {
		s, err := m.NewSession()
		require.NoError(t, err)
		var want []Token
		for tok, err := range s.GenerateTokens(ctx, prompt, opts(uint64(i))...) {
			require.NoError(t, err)
			tok.Usage = nil
			want = append(want, tok)
		}
		require.NoError(t, s.Close())
		assert.Equal(t, want, got[i], "fork %d", i)
	}
	assert.NotEqual(t, got[0], got[1], "different seeds drew the same tokens")

	_, err = br.Prefill(ctx, base, nil)
	assert.ErrorIs(t, err, ErrEmptyPrompt)
	_, err = br.Prefill(ctx, base, []int32{int32(m.VocabSize())})
	assert.ErrorIs(t, err, ErrBadToken)
}

// TestBatcherStats: Stats counts the sequences in the passes and those
// held back, and both return to zero when the requests end.
func TestBatcherStats(t *testing.T) {
	m := load(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	br, err := m.NewBatcher(1)
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	assert.Equal(t, BatcherStats{}, br.Stats())

	first := make(chan struct{})
	release := make(chan struct{})
	done := make(chan struct{}, 2)
	for i := range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			s, _ := m.NewSession()
			defer s.Close()
			n := 0
			for _, err := range br.Generate(ctx, s, "x", WithMaxTokens(200), WithoutDefaultStops()) {
				if err != nil {
					return
				}
				if n++; n == 1 && i == 0 {
					close(first)
					<-release // hold the batcher's only slot
				}
			}
		}()
		if i == 0 {
			<-first
		}
	}
	require.Eventually(t, func() bool { return br.Stats() == BatcherStats{Running: 1, Waiting: 1} },
		10*time.Second, time.Millisecond, "stats %+v", br.Stats())
	close(release)
	<-done
	<-done
	require.Eventually(t, func() bool { return br.Stats() == BatcherStats{} }, 10*time.Second, time.Millisecond)
	// A generation that has ended is not counted running when its caller
	// looks next (the gateway's scrape after a response).
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	for _, err := range br.Generate(ctx, s, "x", WithMaxTokens(3), WithoutDefaultStops()) {
		require.NoError(t, err)
	}
	assert.Equal(t, BatcherStats{}, br.Stats())
}

// TestBatcherWarm: a warm-up runs a request through the passes and leaves
// no trace a client could see: the prefix cache neither looked up nor
// kept anything, the memory ledger holds what it held before (but free
// pages kept for reuse), and a generation afterwards gives bitwise what
// Session.Generate gives alone. A batcher not running refuses it.
func TestBatcherWarm(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithPrefillChunk(24), WithPrefixCache(64<<20))
	require.NoError(t, err)
	defer m.Close()
	br, err := m.NewBatcher(2)
	require.NoError(t, err)
	require.ErrorIs(t, br.Warm(ctx), ErrBatcherNotRunning)
	bctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); br.Wait() }()
	require.NoError(t, br.Start(bctx))
	before := m.MemoryUsage()
	require.NoError(t, br.Warm(ctx))
	assert.Equal(t, PrefixStats{}, m.PrefixCacheStats(), "the warm-up's prefix cache counters")
	after := m.MemoryUsage()
	assert.Equal(t, before.Used-before.FreePages, after.Used-after.FreePages, "sequence state after the warm-up")
	assert.Zero(t, after.PrefixCache, "the prefix cache after the warm-up")

	opts := []GenerateOption{WithMaxTokens(6), WithoutDefaultStops(), WithTemperature(0.8), WithSeed(3)}
	want := collect(t, m.Generate(ctx, "a prompt after the warm-up", opts...))
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	// Token ids only: the lone generation left its prompt in the cache,
	// so the usage differs.
	require.Equal(t, want, collect(t, br.Generate(ctx, s, "a prompt after the warm-up", opts...)))
}

// TestBatcherGauges holds Stats' packed counts to their fields: each moves
// alone, a decrement of sending borrows from no other, received moves one
// request from sending to waiting, and concurrent sends survive the loop's
// stores.
func TestBatcherGauges(t *testing.T) {
	var g gauges
	g.set(3, 5)
	for range 4 {
		g.send(1)
	}
	g.received()
	g.send(-1)
	r, w, s := g.load()
	assert.Equal(t, [3]int{3, 6, 2}, [3]int{r, w, s})
	g.set(gaugeMask, gaugeMask)
	r, w, s = g.load()
	assert.Equal(t, [3]int{gaugeMask, gaugeMask, 2}, [3]int{r, w, s})
	g.set(gaugeMask+5, 1<<30)
	r, w, s = g.load()
	assert.Equal(t, [3]int{gaugeMask, gaugeMask, 2}, [3]int{r, w, s}, "counts past their fields")
	g.send(-1)
	g.send(-1)
	g.set(0, 1)
	r, w, s = g.load()
	assert.Equal(t, [3]int{0, 1, 0}, [3]int{r, w, s})

	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				g.send(1)
			}
		}()
	}
	for i := range 4000 {
		g.set(i%7, i%5)
	}
	wg.Wait()
	for range 4000 {
		g.received()
	}
	r, w, s = g.load()
	assert.Equal(t, [3]int{3999 % 7, 3999%5 + 4000, 0}, [3]int{r, w, s})
}

// TestBatcherStopMidGeneration: generations running when the Batcher's
// context ends fail with ErrBatcherClosed, the stop falling between
// passes or just before one (where it came out as the pass's context
// error, which k3 serve answered as an internal error), and their
// sessions stay usable.
func TestBatcherStopMidGeneration(t *testing.T) {
	m := load(t)
	defer func() { testHookBeforePass = func() {} }()
	for round := range 8 {
		br, err := m.NewBatcher(2)
		require.NoError(t, err)
		ctx, stop := context.WithCancel(context.Background())
		passes := 0
		testHookBeforePass = func() {
			// Rounds 0-3 stop just before their first to fourth pass.
			if passes++; round < 4 && passes == round+1 {
				stop()
			}
		}
		require.NoError(t, br.Start(ctx))
		s, err := m.NewSession()
		require.NoError(t, err)
		n := 0
		var last error
		for _, err := range br.Generate(context.Background(), s, "func main() {", WithMaxTokens(500), WithoutDefaultStops()) {
			if err != nil {
				last = err
				break
			}
			if n++; round >= 4 && n == round-3 {
				stop() // from the consumer, between passes
			}
		}
		require.ErrorIs(t, last, ErrBatcherClosed, "round %d, after %d tokens", round, n)
		_ = br.Wait()
		_, err = s.Forward(context.Background(), []int32{5})
		require.NoError(t, err, "round %d: the session after the stop", round)
		require.NoError(t, s.Close())
	}
}
