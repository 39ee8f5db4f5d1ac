package k3

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
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
// after the prompt gives the same logits bitwise (without CP), and
// Generate streams the tokens asked for. K3_GROUPS=N runs N configurations instead of the
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
	// Without CP, a copy saved and loaded here continues bitwise alike.
	var loaded *GroupSession
	if l.norm().CP == 1 {
		loaded, err = g.LoadSession(bytes.NewReader(saveGroup(t, gs)))
		require.NoError(t, err, desc)
		defer loaded.Close()
	}
	// The one rank's greedy tokens, fed alike (the group's own argmax
	// may part from them at a near tie).
	for _, tok := range toks {
		row, err := gs.Forward(ctx, []int32{tok})
		require.NoError(t, err, desc)
		got = append(got, row...)
		if loaded != nil {
			again, err := loaded.Forward(ctx, []int32{tok})
			require.NoError(t, err, desc)
			require.Equal(t, bitsOf(row), bitsOf(again), "the loaded copy, %s", desc)
		}
	}
	require.Len(t, got, len(want), desc)
	scale, worst := maxAbsF(want), 0.0
	for i := range want {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
	}
	require.LessOrEqual(t, worst, 1e-4*scale, "the largest logit difference (logit scale %.3g), %s", scale, desc)

	gen, err := g.NewSession()
	require.NoError(t, err, desc)
	defer gen.Close()
	var ids []int32
	for tok, err := range gen.Generate(ctx, prompt, WithMaxTokens(4), WithTemperature(0), WithoutDefaultStops()) {
		require.NoError(t, err, desc)
		ids = append(ids, tok.ID)
	}
	require.Len(t, ids, 4, desc)
}
