package k3

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/specdec"
)

// genAll collects a generation's tokens (ids and log-probabilities) and
// its error.
func genAll(seq func(func(Token, error) bool)) ([]Token, error) {
	var toks []Token
	for tok, err := range seq {
		if err != nil {
			return toks, err
		}
		if tok.ID >= 0 {
			toks = append(toks, Token{ID: tok.ID, Logprob: tok.Logprob, Finish: tok.Finish})
		}
	}
	return toks, nil
}

// groupPrompt is a prompt of n tokens that differs with seed.
func groupPrompt(n, seed int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*13+seed*31)%500 + 3)
	}
	return p
}

// TestGroupBatcher: generations of several GroupSessions sharing a
// GroupBatcher's passes (prompts prefilling in chunks beside the others'
// decode steps) give bitwise the tokens and log-probabilities each gives
// alone with GroupSession.GenerateTokens, greedy and sampled, and leave
// every rank's session holding the same sequence: a lockstep generation
// that continues one gives what continuing the lone one gives.
func TestGroupBatcher(t *testing.T) {
	for _, l := range []Layout{{TP: 2}, {EP: 2}, {TP: 2, EP: 2, Dispatch: true}, {TP: 3, SplitIndexer: true}} {
		t.Run(l.String(), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g, err := LoadGroup(ctx, groupTestDir, l, WithPrefillChunk(8))
			require.NoError(t, err)
			defer g.Close()
			gb, err := g.NewBatcher(3)
			require.NoError(t, err)
			require.NoError(t, gb.Start(ctx))
			require.NoError(t, gb.Warm(ctx))

			type job struct {
				prompt []int32
				opts   []GenerateOption
			}
			jobs := []job{
				{groupPrompt(21, 1), []GenerateOption{WithMaxTokens(9), WithTemperature(0), WithoutDefaultStops(), WithLogprobs(0)}},
				{groupPrompt(3, 2), []GenerateOption{WithMaxTokens(14), WithSeed(7), WithTemperature(0.9), WithoutDefaultStops(), WithLogprobs(0)}},
				{groupPrompt(30, 3), []GenerateOption{WithMaxTokens(5), WithSeed(3), WithTopK(20), WithoutDefaultStops()}},
				{groupPrompt(1, 4), []GenerateOption{WithMaxTokens(12), WithTemperature(0), WithoutDefaultStops()}},
				{groupPrompt(17, 5), []GenerateOption{WithMaxTokens(7), WithSeed(11), WithoutDefaultStops(), WithLogprobs(0)}},
			}
			alone := make([]*GroupSession, len(jobs))
			want := make([][]Token, len(jobs))
			for i, j := range jobs {
				alone[i], err = g.NewSession()
				require.NoError(t, err)
				defer alone[i].Close()
				want[i], err = genAll(alone[i].GenerateTokens(ctx, j.prompt, j.opts...))
				require.NoError(t, err)
			}

			shared := make([]*GroupSession, len(jobs))
			got := make([][]Token, len(jobs))
			errs := make([]error, len(jobs))
			var wg sync.WaitGroup
			for i, j := range jobs {
				shared[i], err = g.NewSession()
				require.NoError(t, err)
				defer shared[i].Close()
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[i], errs[i] = genAll(gb.GenerateTokens(ctx, shared[i], j.prompt, j.opts...))
				}()
			}
			wg.Wait()
			for i := range jobs {
				require.NoError(t, errs[i], "job %d", i)
				assert.Equal(t, want[i], got[i], "job %d: batched on the group against alone", i)
				assert.Equal(t, alone[i].Logits(), shared[i].Logits(), "job %d: the next logits", i)
			}

			// Every rank holds the sequence: a lockstep generation (each rank
			// samples from its own logits) continues it as the lone one.
			for i := range 2 {
				opts := []GenerateOption{WithMaxTokens(4), WithTemperature(0), WithoutDefaultStops()}
				a, err := genAll(alone[i].GenerateTokens(ctx, []int32{9}, opts...))
				require.NoError(t, err)
				b, err := genAll(shared[i].GenerateTokens(ctx, []int32{9}, opts...))
				require.NoError(t, err)
				assert.Equal(t, a, b, "job %d continued in lockstep", i)
			}
			assert.Equal(t, BatcherStats{}, gb.Stats())
		})
	}
}

// TestGroupBatcherRefusals: what a GroupBatcher refuses leaves the group
// running.
func TestGroupBatcherRefusals(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, err := LoadGroup(ctx, groupTestDir, Layout{TP: 2}, WithRollback(4))
	require.NoError(t, err)
	defer g.Close()
	gb, err := g.NewBatcher(2)
	require.NoError(t, err)
	gs := groupSession(t, g, []int32{4, 5})

	_, err = genAll(gb.GenerateTokens(ctx, gs, []int32{1}))
	assert.ErrorIs(t, err, ErrBatcherNotRunning)
	require.NoError(t, gb.Start(ctx))
	_, err = genAll(gb.GenerateTokens(ctx, gs, []int32{1}, WithAdaptiveSpeculation(specdec.NGram{}, 2)))
	assert.ErrorIs(t, err, compute.ErrUnsupported)
	_, err = genAll(gb.GenerateTokens(ctx, gs, []int32{1}, WithSpeculation(&DSpark{}, 2)))
	assert.ErrorIs(t, err, compute.ErrUnsupported)
	_, err = genAll(gb.GenerateTokens(ctx, nil, []int32{1}))
	assert.ErrorContains(t, err, "nil session")
	_, err = genAll(gb.GenerateTokens(ctx, gs, []int32{1, 600}))
	assert.ErrorIs(t, err, ErrBadToken)
	_, err = genAll(gb.GenerateTokens(ctx, gs, []int32{1}, WithTemperature(-1)))
	assert.ErrorIs(t, err, ErrInvalidOption)

	other, err := LoadGroup(ctx, groupTestDir, Layout{TP: 2})
	require.NoError(t, err)
	defer other.Close()
	_, err = genAll(gb.GenerateTokens(ctx, groupSession(t, other, []int32{3}), []int32{1}))
	assert.ErrorContains(t, err, "another group")

	closed := groupSession(t, g, []int32{3})
	require.NoError(t, closed.Close())
	_, err = genAll(gb.GenerateTokens(ctx, closed, []int32{1}))
	assert.ErrorIs(t, err, ErrSessionClosed)

	cp, err := LoadGroup(ctx, groupTestDir, Layout{CP: 2})
	require.NoError(t, err)
	defer cp.Close()
	_, err = cp.NewBatcher(2)
	assert.ErrorIs(t, err, compute.ErrUnsupported)

	// Prefill, then a generation from the prefilled state that the
	// caller stops after its first token: every rank holds what a lone
	// session fed the same tokens holds.
	n, err := gb.Prefill(ctx, gs, []int32{8, 9, 10})
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the tokens the session held")
	assert.Equal(t, []int32{4, 5, 8, 9, 10}, gs.Tokens())
	for _, err := range gb.GenerateTokens(ctx, gs, nil, WithTemperature(0), WithoutDefaultStops()) {
		require.NoError(t, err)
		break
	}
	lone := groupSession(t, g, gs.Tokens())
	assert.Equal(t, lone.Logits(), gs.Logits())
	opts := []GenerateOption{WithMaxTokens(5), WithTemperature(0), WithoutDefaultStops()}
	want, err := genAll(lone.GenerateTokens(ctx, nil, opts...))
	require.NoError(t, err)
	got, err := genAll(gs.GenerateTokens(ctx, nil, opts...))
	require.NoError(t, err)
	assert.Equal(t, want, got, "continued in lockstep")
}

// TestGroupBatcherMemoryBudget: a request that rank 0's budget holds and
// another rank's does not, beside what that rank's sessions hold (TP 3:
// it holds two KDA heads' states, rank 0 one), is not admitted: it waits
// for memory to come back, as on a lone model, and gives way with
// ErrMemoryBudget after stallLimit (before admission counted every rank,
// rank 0 admitted it and the other rank's refusal of a pass ended it).
// The group goes on serving.
func TestGroupBatcherMemoryBudget(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := Layout{TP: 3}
	long := groupPrompt(200, 9)
	free, err := LoadGroup(ctx, groupTestDir, l)
	require.NoError(t, err)
	gs := groupSession(t, free, []int32{3})
	var need []int64
	for r, s := range gs.ranks {
		need = append(need, free.ranks[r].mem.used+s.growth(len(long)))
	}
	require.NoError(t, free.Close())
	require.Less(t, need[0], need[2])
	budget := (need[0] + need[2]) / 2

	g, err := LoadGroup(ctx, groupTestDir, l, WithMemoryBudget(budget))
	require.NoError(t, err)
	defer g.Close()
	gb, err := g.NewBatcher(2)
	require.NoError(t, err)
	require.NoError(t, gb.Start(ctx))
	gs = groupSession(t, g, []int32{3})
	defer func(d time.Duration) { stallLimit = d }(stallLimit)
	stallLimit = 100 * time.Millisecond
	_, err = genAll(gb.GenerateTokens(ctx, gs, long, WithMaxTokens(1)))
	require.ErrorIs(t, err, ErrMemoryBudget)
	assert.ErrorContains(t, err, "gives way", "not admitted")

	short := groupSession(t, g, []int32{3})
	got, err := genAll(gb.GenerateTokens(ctx, short, []int32{4, 5}, WithMaxTokens(3), WithTemperature(0), WithoutDefaultStops()))
	require.NoError(t, err, "the group goes on")
	assert.Len(t, got, 3)
}

// TestGroupBatcherSpeculation: generations speculating at a fixed depth on
// a GroupBatcher, beside one that does not, with drafts partly right (so
// that every rank rolls back) and with a draft model outside the group,
// give the tokens of plain decoding bitwise; every rank then holds the
// sequence, so a lockstep continuation gives what a lone one does.
func TestGroupBatcherSpeculation(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, err := LoadGroup(ctx, groupTestDir, Layout{TP: 2, EP: 2}, WithRollback(4))
	require.NoError(t, err)
	defer g.Close()
	alone, err := Load(ctx, groupTestDir, WithRollback(4))
	require.NoError(t, err)
	defer alone.Close()
	gb, err := g.NewBatcher(3)
	require.NoError(t, err)
	require.NoError(t, gb.Start(ctx))

	prompts := [][]int32{groupPrompt(6, 1), groupPrompt(11, 2), groupPrompt(4, 3)}
	opts := func(i int) []GenerateOption {
		return []GenerateOption{WithMaxTokens(16), WithTemperature(0.9), WithSeed(uint64(i)), WithoutDefaultStops(), WithLogprobs(0)}
	}
	want := make([][]Token, len(prompts))
	plain := make([]*GroupSession, len(prompts))
	for i, p := range prompts {
		plain[i] = groupSession(t, g, []int32{2})
		want[i], err = genAll(plain[i].GenerateTokens(ctx, p, opts(i)...))
		require.NoError(t, err)
		require.Len(t, want[i], 16)
	}
	ids := func(toks []Token) []int32 {
		var out []int32
		for _, tok := range toks {
			out = append(out, tok.ID)
		}
		return out
	}
	dm, err := g.Ranks()[0].NewDraftModel(alone)
	require.NoError(t, err)
	defer dm.Close()
	drafters := []GenerateOption{
		WithSpeculation(oracle{append(append([]int32{2}, prompts[0]...), ids(want[0])...)}, 3), // partly right
		WithSpeculation(dm, 3),
		nil, // plain, in the same passes
	}
	shared := make([]*GroupSession, len(prompts))
	got := make([][]Token, len(prompts))
	usage := make([]Usage, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		shared[i] = groupSession(t, g, []int32{2})
		o := opts(i)
		if drafters[i] != nil {
			o = append(o, drafters[i])
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tok, err := range gb.GenerateTokens(ctx, shared[i], p, o...) {
				if err != nil {
					errs[i] = err
					return
				}
				got[i] = append(got[i], Token{ID: tok.ID, Logprob: tok.Logprob, Finish: tok.Finish})
				if tok.Usage != nil {
					usage[i] = *tok.Usage
				}
			}
		}()
	}
	wg.Wait()
	for i := range prompts {
		require.NoError(t, errs[i], "generation %d", i)
		assert.Equal(t, want[i], got[i], "generation %d", i)
	}
	assert.Positive(t, usage[0].AcceptedTokens, "drafts were kept")
	assert.Less(t, usage[0].AcceptedTokens, usage[0].DraftTokens, "drafts were rejected")
	assert.Positive(t, usage[1].AcceptedTokens, "a draft model's drafts were kept")

	for i := range 2 {
		assert.Equal(t, plain[i].Tokens(), shared[i].Tokens(), "generation %d: the tokens held", i)
		assert.Equal(t, plain[i].Logits(), shared[i].Logits(), "generation %d: the next logits", i)
		o := []GenerateOption{WithMaxTokens(5), WithTemperature(0), WithoutDefaultStops()}
		a, err := genAll(plain[i].GenerateTokens(ctx, nil, o...))
		require.NoError(t, err)
		b, err := genAll(shared[i].GenerateTokens(ctx, nil, o...))
		require.NoError(t, err)
		assert.Equal(t, a, b, "generation %d continued in lockstep", i)
	}
}

// TestGroupBatcherClosed: closing the group while a GroupBatcher
// generates ends the generation with an error, stops the batcher with
// ErrClosed and leaves no goroutine waiting; a batcher made on a closed
// group fails.
func TestGroupBatcherClosed(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g, err := LoadGroup(ctx, groupTestDir, Layout{TP: 2, EP: 2})
	require.NoError(t, err)
	gb, err := g.NewBatcher(2)
	require.NoError(t, err)
	require.NoError(t, gb.Start(ctx))
	gs, err := g.NewSession()
	require.NoError(t, err)
	n := 0
	var genErr error
	for _, err := range gb.GenerateTokens(ctx, gs, []int32{3, 4}, WithMaxTokens(400), WithoutDefaultStops()) {
		if err != nil {
			genErr = err
			break
		}
		if n++; n == 3 {
			go g.Close()
		}
	}
	require.Error(t, genErr, "the generation ended by the close")
	assert.Less(t, n, 400)
	assert.ErrorIs(t, gb.Wait(), ErrClosed)
	_, err = genAll(gb.GenerateTokens(ctx, gs, []int32{1}))
	assert.ErrorIs(t, err, ErrBatcherClosed)
	_, err = g.NewBatcher(2)
	assert.Error(t, err)
	assert.NoError(t, gs.Close())
}

// TestGroupBatcherAdmitsOnEveryRank: two requests that rank 0's budget
// holds together and another rank's holds one at a time (TP 3: that rank
// holds two KDA heads' states, rank 0 one) both finish, the second
// admitted once the first has closed its session: admission promises
// each rank's own growth. With rank 0's alone both were admitted and a
// pass the other rank could not hold failed them.
func TestGroupBatcherAdmitsOnEveryRank(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := Layout{TP: 3}
	prompt := groupPrompt(100, 7)
	const maxTokens = 28
	free, err := LoadGroup(ctx, groupTestDir, l)
	require.NoError(t, err)
	a, err := free.NewSession()
	require.NoError(t, err)
	_, err = free.NewSession() // the second request's
	require.NoError(t, err)
	var need []int64 // per rank: both sessions' state and both requests' growth
	for r, s := range a.ranks {
		need = append(need, free.ranks[r].mem.used+2*s.growth(len(prompt)+maxTokens))
	}
	want, err := genAll(a.GenerateTokens(ctx, prompt, WithMaxTokens(maxTokens), WithTemperature(0), WithoutDefaultStops()))
	require.NoError(t, err)
	require.NoError(t, free.Close())
	budget := slices.Max(need) - 1 // some rank cannot hold both at once
	require.LessOrEqual(t, need[0], budget, "rank 0 holds both")

	g, err := LoadGroup(ctx, groupTestDir, l, WithMemoryBudget(budget))
	require.NoError(t, err)
	defer g.Close()
	gb, err := g.NewBatcher(2)
	require.NoError(t, err)
	require.NoError(t, gb.Start(ctx))
	var sessions [2]*GroupSession
	for i := range sessions {
		sessions[i], err = g.NewSession()
		require.NoError(t, err)
	}
	var got [2][]Token
	var errs [2]error
	var wg sync.WaitGroup
	for i, gs := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = genAll(gb.GenerateTokens(ctx, gs, prompt, WithMaxTokens(maxTokens), WithTemperature(0), WithoutDefaultStops()))
			gs.Close() // its pages back, for the other request
		}()
	}
	wg.Wait()
	for i := range sessions {
		require.NoError(t, errs[i], "request %d", i)
		assert.Equal(t, want, got[i], "request %d", i)
	}
}
