package k3

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/internal/tiny"
	"k3/specdec"
)

// TestRandomSpeculation speculates on checkpoints of random shapes
// (randomConfig) with every kind of drafter: a self-speculative early
// exit of random depth, a draft model on a second random checkpoint of
// the same vocabulary, the n-gram drafter, a DSpark module added to the
// checkpoint, and drafts of the plain run's own tokens with the last of
// each wrong. Depths are fixed or adaptive, the rollback depth, prefill
// chunk and prefix cache random, and decoding greedy or sampled with
// random processors. Alone and in a Batcher of random size beside a
// plain generation, each generation must give plain decoding's tokens
// and log-probabilities and leave its session with plain decoding's
// state (the logits of one more token), bitwise. With rejection sampling
// (exact in distribution, not token for token) each generation must give
// the same tokens for the same seed alone, again, and in the Batcher.
// A session saved after a speculating generation and loaded, or forked,
// must go on as the original does, bitwise. K3_SPECS=N runs N configurations instead of the default 12
// (K3_SPECS_SEED the first).
func TestRandomSpeculation(t *testing.T) {
	runSeeds(t, "K3_SPECS", 12, randomSpeculation)
}

// specRun is what a generation gave: its tokens and log-probabilities,
// and its session's logits after one more token.
type specRun struct {
	ids  []int32
	lps  []float32
	next []float32
}

func randomSpeculation(t *testing.T, seed uint64) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, 0x5bec))
	pick := func(xs ...int) int { return xs[r.IntN(len(xs))] }
	preset := []string{"k31pro", "k3", "kimi_linear"}[r.IntN(3)]
	dir, draftDir := t.TempDir(), t.TempDir()
	var text, draftText string
	bf16 := r.IntN(2) == 0
	require.NoError(t, tiny.Write(dir, preset, tiny.Options{Seed: seed, BF16: bf16,
		Edit: func(m map[string]any) { randomConfig(r, m); text = fmt.Sprint(m) }}))
	require.NoError(t, tiny.Write(draftDir, preset, tiny.Options{Seed: seed + 1<<32, BF16: r.IntN(2) == 0,
		Edit: func(m map[string]any) { randomConfig(r, m); draftText = fmt.Sprint(m) }}))

	rollback, chunk, cached := 1+r.IntN(9), 1+r.IntN(30), r.IntN(2) == 0
	opts := []Option{WithPrefillChunk(chunk), WithRollback(rollback)}
	if cached {
		opts = append(opts, WithPrefixCache(64<<20))
	}
	temp := float32(pick(0, 0, 1))
	gen := []GenerateOption{WithMaxTokens(5 + r.IntN(20)), WithSeed(seed), WithoutDefaultStops(), WithLogprobs(0), WithTemperature(temp)}
	if temp > 0 {
		if r.IntN(2) == 0 {
			gen = append(gen, WithTopK(1+r.IntN(50)))
		}
		if r.IntN(2) == 0 {
			gen = append(gen, WithTopP(0.5+0.5*r.Float32()))
		}
		if r.IntN(2) == 0 {
			gen = append(gen, WithMinP(0.05*r.Float32()))
		}
	}
	if r.IntN(3) == 0 {
		gen = append(gen, WithPresencePenalty(0.5), WithFrequencyPenalty(0.3))
	}
	const (
		selfDraft = iota
		draftModel
		ngram
		dspark
		wrongLast
	)
	kind := r.IntN(5)
	depth, rejection := 1+r.IntN(rollback), temp > 0 && r.IntN(3) == 0
	// The adaptive depth is chosen from costs measured per batch shape,
	// so with rejection sampling (whose draws depend on the depth) a lone
	// run and a batched one would draw differently.
	adaptive := !rejection && r.IntN(3) == 0
	desc := fmt.Sprintf("%s, bf16 %v, rollback %d, prefill chunk %d, prefix cache %v, drafter %d, depth %d, adaptive %v, rejection %v, temperature %v: %s; draft model: %s",
		preset, bf16, rollback, chunk, cached, kind, depth, adaptive, rejection, temp, text, draftText)

	m, err := Load(ctx, dir, opts...)
	require.NoError(t, err, desc)
	defer m.Close()
	prompt := func(n int) []int32 { return randomPrompt(r, m, n) }
	prompts := [][]int32{prompt(1 + r.IntN(30)), prompt(1 + r.IntN(30)), prompt(1 + r.IntN(60))}

	run := func(s *Session, seq func(func(Token, error) bool)) (specRun, error) {
		var g specRun
		for tok, err := range seq {
			if err != nil {
				return g, err
			}
			g.ids, g.lps = append(g.ids, tok.ID), append(g.lps, tok.Logprob)
		}
		if _, err := s.Forward(ctx, []int32{5}); err != nil {
			return g, err
		}
		g.next = slices.Clone(s.Logits())
		return g, nil
	}
	generate := func(target *Model, p []int32, o []GenerateOption) specRun {
		s, err := target.NewSession()
		require.NoError(t, err, desc)
		defer s.Close()
		g, err := run(s, s.GenerateTokens(ctx, p, o...))
		require.NoError(t, err, desc)
		return g
	}
	var plain []specRun
	for _, p := range prompts {
		plain = append(plain, generate(m, p, gen))
	}

	target := m
	var other *Model
	switch kind {
	case draftModel:
		other, err = Load(ctx, draftDir, WithRollback(ExactTokens-1))
		require.NoError(t, err, desc)
		defer other.Close()
	case dspark:
		// Its Markov head favours the plain run's bigrams, so that some
		// drafts are kept; the module leaves the target's weights as
		// they were, so the plain runs stand.
		target, err = Load(ctx, withDraftModule(t, dir, 1+r.IntN(8), append(slices.Clone(prompts[0]), plain[0].ids...)), opts...)
		require.NoError(t, err, desc)
		defer target.Close()
	}
	var closers []func() error
	defer func() {
		for _, c := range closers {
			require.NoError(t, c())
		}
	}()
	exit := 1 + r.IntN(max(len(target.layers)-1, 1))
	drafter := func(i int) specdec.Drafter {
		switch {
		case kind == selfDraft && len(target.layers) > 1:
			d, err := target.NewSelfDraft(exit)
			require.NoError(t, err, desc)
			closers = append(closers, d.Close)
			return d
		case kind == draftModel:
			d, err := target.NewDraftModel(other)
			require.NoError(t, err, desc)
			closers = append(closers, d.Close)
			return d
		case kind == dspark:
			d, err := target.NewDSpark()
			require.NoError(t, err, desc)
			closers = append(closers, d.Close)
			return d
		case kind == wrongLast:
			return oracle{append(slices.Clone(prompts[i]), plain[i].ids...)}
		}
		return specdec.NGram{}
	}
	speculate := func(i int) []GenerateOption {
		o := slices.Clone(gen)
		if adaptive {
			o = append(o, WithAdaptiveSpeculation(drafter(i), depth))
		} else {
			o = append(o, WithSpeculation(drafter(i), depth))
		}
		if rejection {
			o = append(o, WithRejectionSampling())
		}
		return o
	}

	want := plain
	if rejection {
		want = nil
		for i, p := range prompts {
			want = append(want, generate(target, p, speculate(i)))
		}
	}
	for i, p := range prompts {
		require.Equal(t, want[i], generate(target, p, speculate(i)), "prompt %d speculating alone, %s", i, desc)
	}

	// Saved after a speculating generation and loaded, or forked, a
	// session goes on as the original does: the same tokens,
	// log-probabilities and state (with rejection sampling, the same
	// draws, which follow the drafts).
	saved, err := target.NewSession()
	require.NoError(t, err, desc)
	defer saved.Close()
	_, err = run(saved, saved.GenerateTokens(ctx, prompts[0], speculate(0)...))
	require.NoError(t, err, desc)
	var file bytes.Buffer
	require.NoError(t, saved.Save(&file), desc)
	loaded, err := target.LoadSession(&file)
	require.NoError(t, err, desc)
	defer loaded.Close()
	fork, err := saved.Fork()
	require.NoError(t, err, desc)
	defer fork.Close()
	// Half the time no new prompt: the first draft then reads the rows
	// the original's last pass left (a pass over new tokens makes its own).
	more := prompt(r.IntN(2) * (1 + r.IntN(4)))
	a, err := run(saved, saved.GenerateTokens(ctx, more, speculate(0)...))
	require.NoError(t, err, desc)
	for what, s := range map[string]*Session{"a loaded session": loaded, "a fork": fork} {
		b, err := run(s, s.GenerateTokens(ctx, more, speculate(0)...))
		require.NoError(t, err, desc)
		require.Equal(t, a, b, "%s going on, %s", what, desc)
	}

	// In a Batcher, every prompt but the last speculating.
	bc, err := target.NewBatcher(1 + r.IntN(3))
	require.NoError(t, err, desc)
	bctx, stop := context.WithCancel(ctx)
	require.NoError(t, bc.Start(bctx), desc)
	got, errs := make([]specRun, len(prompts)), make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		o := gen
		if i < len(prompts)-1 {
			o = speculate(i)
		}
		s, err := target.NewSession()
		require.NoError(t, err, desc)
		defer s.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = run(s, bc.GenerateTokens(ctx, s, p, o...))
		}()
	}
	wg.Wait()
	stop()
	_ = bc.Wait()
	for i := range prompts {
		require.NoError(t, errs[i], "prompt %d in the Batcher, %s", i, desc)
		w := want[i]
		if i == len(prompts)-1 {
			w = plain[i]
		}
		require.Equal(t, w, got[i], "prompt %d in the Batcher, %s", i, desc)
	}
}
