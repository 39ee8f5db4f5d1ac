package k3

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/internal/tiny"
)

// TestRandomGroups splits checkpoints of random shapes (randomConfig) by
// random layouts: TP, EP and CP of 1 to 4, 1 to 4 and 1 to 3 ranks, with
// and without Dispatch, SplitIndexer and Serial, and a random prefill
// chunk. LoadGroup either refuses the layout with ErrLayoutMismatch or
// the group's logits, over a prompt and greedy steps fed alike, stay
// within 1e-4 of the logit scale of one rank's, a copy saved and loaded
// after the prompt gives the same logits bitwise, and
// Generate streams the tokens asked for (and, where the group keeps
// replay logs, the same tokens speculating), and without CP a
// GroupBatcher's generations give those of Generate (groupBatched). K3_GROUPS=N runs N configurations instead of the
// default 16 (K3_GROUPS_SEED the first).
func TestRandomGroups(t *testing.T) {
	runSeeds(t, "K3_GROUPS", 16, randomGroup)
}

func randomGroup(t *testing.T, seed uint64) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 0x9e0))
	pick := func(xs ...int) int { return xs[r.IntN(len(xs))] }
	preset := []string{"k31pro", "k3", "kimi_linear"}[r.IntN(3)]
	dir := t.TempDir()
	var text string
	bf16 := r.IntN(2) == 0
	require.NoError(t, tiny.Write(dir, preset, tiny.Options{Seed: seed, BF16: bf16,
		Edit: func(m map[string]any) { randomConfig(r, m); text = fmt.Sprint(m) }}))
	var l Layout
	for {
		l = Layout{TP: pick(0, 1, 2, 3, 4), EP: pick(0, 1, 2, 3, 4), CP: pick(0, 1, 1, 2, 3),
			Dispatch: r.IntN(3) == 0, SplitIndexer: r.IntN(4) == 0, Serial: r.IntN(4) == 0}
		if l.Validate() == nil {
			break
		}
	}
	opts := []Option{WithPrefillChunk(1 + r.IntN(40))}
	desc := fmt.Sprintf("%s, bf16 %v, layout %v, %d ranks: %s", preset, bf16, l, l.Ranks(), text)

	one, err := Load(ctx, dir, opts...)
	require.NoError(t, err, desc)
	defer one.Close()
	prompt := randomPrompt(r, one, 1+r.IntN(60))
	s, err := one.NewSession()
	require.NoError(t, err, desc)
	want, toks := runAlone(t, s, prompt, 6)
	require.NoError(t, s.Close())

	// Half the groups without CP keep replay logs deeper than the steps
	// below, so that their truncations are cursor moves, bitwise exact.
	logged := l.norm().CP == 1 && r.IntN(2) == 0
	if logged {
		opts = append(opts, WithRollback(16))
		desc += ", rollback 16"
	}
	g, err := LoadGroup(ctx, dir, l, opts...)
	if err != nil {
		require.ErrorIs(t, err, ErrLayoutMismatch, desc)
		return
	}
	defer g.Close()
	gs, err := g.NewSession()
	require.NoError(t, err, desc)
	defer gs.Close()
	got, err := gs.Forward(ctx, prompt)
	require.NoError(t, err, desc)
	// A copy saved and loaded here continues bitwise alike.
	loaded, err := g.LoadSession(bytes.NewReader(saveGroup(t, gs)))
	require.NoError(t, err, desc)
	defer loaded.Close()
	// The one rank's greedy tokens, fed alike (the group's own argmax
	// may part from them at a near tie).
	for _, tok := range toks {
		row, err := gs.Forward(ctx, []int32{tok})
		require.NoError(t, err, desc)
		got = append(got, row...)
		again, err := loaded.Forward(ctx, []int32{tok})
		require.NoError(t, err, desc)
		require.Equal(t, bitsOf(row), bitsOf(again), "the loaded copy, %s", desc)
	}
	require.Len(t, got, len(want), desc)
	scale, worst := maxAbsF(want), 0.0
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
	}
	require.LessOrEqual(t, worst, 1e-4*scale, "the largest logit difference (logit scale %.3g), %s", scale, desc)
	groupEdits(t, r, g, gs, prompt, toks, got, logged, desc)

	gen, err := g.NewSession()
	require.NoError(t, err, desc)
	defer gen.Close()
	var ids []int32
	for tok, err := range gen.GenerateTokens(ctx, prompt, WithMaxTokens(4), WithTemperature(0), WithoutDefaultStops()) {
		require.NoError(t, err, desc)
		ids = append(ids, tok.ID)
	}
	require.Len(t, ids, 4, desc)
	if logged {
		// Speculating at a fixed depth, with drafts right but for the
		// last of each, the group gives the same tokens.
		spec, err := g.NewSession()
		require.NoError(t, err, desc)
		defer spec.Close()
		var got []int32
		d := oracle{append(slices.Clone(prompt), ids...)}
		for tok, err := range spec.GenerateTokens(ctx, prompt, WithMaxTokens(4), WithTemperature(0), WithoutDefaultStops(), WithSpeculation(d, 1+r.IntN(4))) {
			require.NoError(t, err, desc)
			got = append(got, tok.ID)
		}
		require.Equal(t, ids, got, "speculating, %s", desc)
	}
	if l.norm().CP == 1 {
		groupBatched(t, r, g, prompt, ids, logged, desc)
	}
}

// groupBatched runs two to four generations on a GroupBatcher of g at
// once, random prompts and sampling, the first speculating where g keeps
// replay logs: each gives the tokens and log-probabilities of the same
// generation in lockstep (GroupSession.GenerateTokens), bitwise.
func groupBatched(t *testing.T, r *rand.Rand, g *Group, prompt, ids []int32, logged bool, desc string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	m := g.Ranks()[0]
	gb, err := g.NewBatcher(1 + r.IntN(3))
	require.NoError(t, err, desc)
	require.NoError(t, gb.Start(ctx), desc)
	n := 2 + r.IntN(3)
	prompts := make([][]int32, n)
	opts := make([][]GenerateOption, n)
	for i := range n {
		prompts[i] = randomPrompt(r, m, 1+r.IntN(40))
		opts[i] = []GenerateOption{WithMaxTokens(1 + r.IntN(8)), WithoutDefaultStops(), WithLogprobs(0)}
		if r.IntN(2) == 0 {
			opts[i] = append(opts[i], WithTemperature(0))
		} else {
			opts[i] = append(opts[i], WithSeed(r.Uint64()), WithTopK(r.IntN(50)))
		}
	}
	if logged {
		prompts[0] = prompt
		opts[0] = []GenerateOption{WithMaxTokens(len(ids)), WithTemperature(0), WithoutDefaultStops(), WithLogprobs(0),
			WithSpeculation(oracle{append(slices.Clone(prompt), ids...)}, 1+r.IntN(4))}
	}
	want := make([][]Token, n)
	for i := range n {
		gs, err := g.NewSession()
		require.NoError(t, err, desc)
		want[i], err = genAll(gs.GenerateTokens(ctx, prompts[i], opts[i]...))
		require.NoError(t, err, desc)
		require.NoError(t, gs.Close(), desc)
	}
	got := make([][]Token, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		gs, err := g.NewSession()
		require.NoError(t, err, desc)
		defer gs.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = genAll(gb.GenerateTokens(ctx, gs, prompts[i], opts[i]...))
		}()
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i], "batched generation %d, %s", i, desc)
		require.Equal(t, want[i], got[i], "batched generation %d, %s", i, desc)
	}
}

// groupEdits checks a group session's Fork, Truncate and Reset: gs holds
// prompt and toks, fed one at a time after it, and rows their logits.
// A fork continues bitwise as gs does; cut back to a random length and
// fed the same tokens again, gs gives the same rows (bitwise where its
// replay logs restore the states, logged; else rebuilt by a prefill,
// within 1e-4 of the logit scale); reset and fed the prompt again, it
// gives the prompt's rows bitwise. (Under CP a cut always rebuilds.)
func groupEdits(t *testing.T, r *rand.Rand, g *Group, gs *GroupSession, prompt, toks []int32, rows []float32, logged bool, desc string) {
	ctx := context.Background()
	v := g.Ranks()[0].Config.VocabSize
	n := len(prompt) + len(toks)
	require.Equal(t, n, gs.Len(), desc)
	require.Equal(t, append(append([]int32(nil), prompt...), toks...), gs.Tokens(), desc)
	require.Equal(t, bitsOf(rows[(n-1)*v:]), bitsOf(gs.Logits()), desc)
	{
		f, err := gs.Fork()
		require.NoError(t, err, desc)
		defer f.Close()
		extra := toks[r.IntN(len(toks))]
		a, err := gs.Forward(ctx, []int32{extra})
		require.NoError(t, err, desc)
		b, err := f.Forward(ctx, []int32{extra})
		require.NoError(t, err, desc)
		require.Equal(t, bitsOf(a), bitsOf(b), "the fork, %s", desc)
		require.ErrorIs(t, gs.Truncate(ctx, n+2), ErrOutOfRange, desc)

		j := 1 + r.IntN(len(toks)) // the steps kept
		require.NoError(t, gs.Truncate(ctx, len(prompt)+j), desc)
		require.Equal(t, len(prompt)+j, gs.Len(), desc)
		same := func(want, got []float32, what string) {
			if logged {
				require.Equal(t, bitsOf(want), bitsOf(got), "%s, %s", what, desc)
				return
			}
			scale, worst := maxAbsF(want), 0.0
			for i := range want {
				worst = max(worst, math.Abs(float64(got[i]-want[i])))
			}
			require.LessOrEqual(t, worst, 1e-4*scale, "%s (logit scale %.3g), %s", what, scale, desc)
		}
		row := func(p int) []float32 { return rows[p*v : (p+1)*v] }
		same(row(len(prompt)+j-1), gs.Logits(), fmt.Sprintf("the logits after a cut to %d", len(prompt)+j))
		for i := j; i < len(toks); i++ {
			got, err := gs.Forward(ctx, toks[i:i+1])
			require.NoError(t, err, desc)
			same(row(len(prompt)+i), got, fmt.Sprintf("step %d after the cut", i))
		}
	}
	require.NoError(t, gs.Reset(), desc)
	require.Zero(t, gs.Len(), desc)
	require.Nil(t, gs.Logits(), desc)
	again, err := gs.Forward(ctx, prompt)
	require.NoError(t, err, desc)
	require.Equal(t, bitsOf(rows[:len(prompt)*v]), bitsOf(again), "the prompt after Reset, %s", desc)
}
