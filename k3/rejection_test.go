package k3

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/sample"
	"k3/specdec"
)

// rejectionParams are the sampling settings of the rejection-sampling
// tests: a narrow top-k keeps the joint distribution of three tokens
// small enough to enumerate, and a presence penalty makes each position's
// distribution depend on the drafts before it.
var rejectionParams = sample.Params{Temperature: 1, TopK: 3, PresencePenalty: 0.7}

func rejectionOpts(p sample.Params, seed uint64) []GenerateOption {
	return []GenerateOption{WithMaxTokens(3), WithoutDefaultStops(), WithSeed(seed),
		WithTemperature(p.Temperature), WithTopK(p.TopK), WithPresencePenalty(p.PresencePenalty)}
}

// exactJoint is the distribution plain sampling gives the first three
// generated tokens after prompt, enumerated: P(t1) P(t2 | t1) P(t3 | t1 t2),
// each from a session fed the tokens before it and the sampler's
// processing.
func exactJoint(t *testing.T, m *Model, prompt []int32, params sample.Params) map[[3]int32]float64 {
	t.Helper()
	ctx := context.Background()
	v := m.VocabSize()
	probs := func(prefix []int32) []float64 {
		s, err := m.NewSession()
		require.NoError(t, err)
		defer s.Close()
		_, err = s.Forward(ctx, prefix)
		require.NoError(t, err)
		sm, err := sample.New(params, v)
		require.NoError(t, err)
		sm.Observe(prefix...)
		p := make([]float64, v)
		require.NoError(t, sm.Probs(s.Logits(), p))
		return p
	}
	joint := map[[3]int32]float64{}
	at := func(prefix []int32, tok int32) []int32 { return append(append([]int32(nil), prefix...), tok) }
	p1 := probs(prompt)
	for a, pa := range p1 {
		if pa == 0 {
			continue
		}
		pre1 := at(prompt, int32(a))
		p2 := probs(pre1)
		for b, pb := range p2 {
			if pb == 0 {
				continue
			}
			p3 := probs(at(pre1, int32(b)))
			for c, pc := range p3 {
				if pc > 0 {
					joint[[3]int32{int32(a), int32(b), int32(c)}] = pa * pb * pc
				}
			}
		}
	}
	return joint
}

// chiSquareCritical is the chi-square value that k degrees of freedom
// exceed with probability 1e-4 (Wilson-Hilferty; within 1% for k >= 3).
func chiSquareCritical(k int) float64 {
	const z = 3.7190 // the standard normal's 1 - 1e-4 quantile
	f := float64(k)
	c := 1 - 2/(9*f) + z*math.Sqrt(2/(9*f))
	return f * c * c * c
}

// TestRejectionSamplingDistribution: speculative sampling in rejection
// mode emits the first three tokens (one plain draw, then two drafts
// verified in one pass) distributed as plain sampling, enumerated from the
// model, for each drafter: a model and the self drafter (drafts drawn
// from their distributions), the n-gram drafter (fixed drafts) and
// DSpark. A chi-square at alpha 1e-4 holds, a sequence plain sampling
// cannot draw never comes out, drafts are kept, and the tokens are not
// always plain sampling's for the seed (it is not the coupled mode).
func TestRejectionSamplingDistribution(t *testing.T) {
	ctx := context.Background()
	runs := 2000
	if raceEnabled || puregoBuild || testing.Short() {
		runs = 60 // the loop's concurrency and the zero-probability rule, not the statistics
	}
	m, err := Load(ctx, tinyDir, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	// The testdata checkpoints are random and unrelated: one's top tokens
	// are not another's, so a smaller model of the same vocabulary would
	// never have a draft kept. The model drafter is the checkpoint itself,
	// loaded again: q equals p and every draft is kept.
	same, err := Load(ctx, tinyDir)
	require.NoError(t, err)
	defer same.Close()
	tiny, err := LoadTiny(ctx, WithRollback(8))
	require.NoError(t, err)
	defer tiny.Close()
	cases := []struct {
		name   string
		m      *Model
		prompt string
		make   func() (specdec.Drafter, func())
		params sample.Params
	}{
		{"model", m, "one two one two", func() (specdec.Drafter, func()) {
			d, err := m.NewDraftModel(same)
			require.NoError(t, err)
			return d, func() { d.Close() }
		}, rejectionParams},
		{"self", m, "one two one two", func() (specdec.Drafter, func()) {
			d, err := m.NewSelfDraft(1)
			require.NoError(t, err)
			return d, func() { d.Close() }
		}, rejectionParams},
		// No penalty here: it would keep the repeats the n-gram drafter
		// proposes out of the top-k.
		{"ngram", tiny, "1, 2, 1, 2, 1, 2,", func() (specdec.Drafter, func()) { return specdec.NGram{}, func() {} },
			sample.Params{Temperature: 1, TopK: 3}},
		{"dspark", tiny, "func main() {\n\tfmt.", func() (specdec.Drafter, func()) {
			d, err := tiny.NewDSpark()
			require.NoError(t, err)
			return d, func() { d.Close() }
		}, rejectionParams},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prompt := c.m.Encode(c.prompt)
			joint := exactJoint(t, c.m, prompt, c.params)
			d, done := c.make()
			defer done()
			counts := map[[3]int32]float64{}
			accepted, differ := 0, 0
			s, err := c.m.NewSession()
			require.NoError(t, err)
			defer s.Close()
			for seed := range runs {
				require.NoError(t, s.Reset())
				got, u := genIDs(t, s, prompt, append(rejectionOpts(c.params, uint64(seed)), WithSpeculation(d, 2), WithRejectionSampling())...)
				require.Len(t, got, 3)
				k := [3]int32{got[0], got[1], got[2]}
				require.Positive(t, joint[k], "seed %d: %v, which plain sampling never draws", seed, got)
				counts[k]++
				accepted += u.AcceptedTokens
				if seed < 30 {
					require.NoError(t, s.Reset())
					plain, _ := genIDs(t, s, prompt, rejectionOpts(c.params, uint64(seed))...)
					if !assert.ObjectsAreEqual(plain, got) {
						differ++
					}
				}
			}
			assert.Positive(t, accepted, "no draft was kept")
			if c.name == "model" {
				// q is p: min(1, p/q) keeps every draft.
				assert.Equal(t, 2*runs, accepted, "drafts from the target's own distribution were rejected")
			}
			assert.Positive(t, differ, "rejection sampling drew plain sampling's tokens for every seed: the coupled mode ran")
			if runs < 2000 {
				return
			}
			chi, dof := chiSquare(joint, counts, runs)
			assert.Less(t, chi, chiSquareCritical(dof), "chi-square %.1f with %d degrees of freedom over %d runs", chi, dof, runs)
			t.Logf("%s: %d sequences, chi-square %.1f (%d dof, critical %.1f), %.2f drafts kept per run", c.name, len(joint), chi, dof, chiSquareCritical(dof), float64(accepted)/float64(runs))
		})
	}
}

// chiSquare compares counts over runs with the distribution joint, with
// the cells expected fewer than 5 times pooled into one.
func chiSquare(joint, counts map[[3]int32]float64, runs int) (float64, int) {
	keys := make([][3]int32, 0, len(joint))
	for k := range joint {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return fmt.Sprint(keys[i]) < fmt.Sprint(keys[j]) })
	n := float64(runs)
	var chi, poolE, poolO float64
	cells := 0
	for _, k := range keys {
		e := joint[k] * n
		if e < 5 {
			poolE += e
			poolO += counts[k]
			continue
		}
		chi += (counts[k] - e) * (counts[k] - e) / e
		cells++
	}
	if poolE > 0 {
		chi += (poolO - poolE) * (poolO - poolE) / poolE
		cells++
	}
	return chi, cells - 1
}

// TestRejectionSamplingSeeded: rejection mode is deterministic for a seed,
// alone and in a Batcher beside other sequences at other depths, also
// where the prefill chunk is smaller than a verify run (the Batcher's
// default token budget once capped its verify runs at the chunk: drafted
// less, they drew other tokens).
func TestRejectionSamplingSeeded(t *testing.T) {
	for _, chunk := range []int{0, 2} {
		t.Run(fmt.Sprint("chunk ", chunk), func(t *testing.T) { rejectionSeeded(t, chunk) })
	}
}

func rejectionSeeded(t *testing.T, chunk int) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	load := []Option{WithRollback(8)}
	if chunk > 0 {
		load = append(load, WithPrefillChunk(chunk))
	}
	m, err := Load(ctx, tinyDir, load...)
	require.NoError(t, err)
	defer m.Close()
	prompts := []string{"one two one two", "abc abc abc", "the cat the cat the"}
	opts := func(i int) []GenerateOption {
		d, err := m.NewSelfDraft(1 + i%2)
		require.NoError(t, err)
		t.Cleanup(func() { d.Close() })
		return []GenerateOption{WithMaxTokens(24), WithoutDefaultStops(), WithSeed(uint64(i + 10)), WithTemperature(0.8),
			WithTopK(20), WithFrequencyPenalty(0.2), WithSpeculation(d, 2+2*i), WithRejectionSampling()}
	}
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		s, _ := m.NewSession()
		want[i], _ = genIDs(t, s, m.Encode(p), opts(i)...)
		s.Close()
		s, _ = m.NewSession()
		again, _ := genIDs(t, s, m.Encode(p), opts(i)...)
		s.Close()
		require.Equal(t, want[i], again, "prompt %d: the same seed twice", i)
	}
	br, err := m.NewBatcher(len(prompts))
	require.NoError(t, err)
	require.NoError(t, br.Start(ctx))
	got := make([][]int32, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		s, _ := m.NewSession()
		defer s.Close()
		o := opts(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tok, err := range br.GenerateTokens(ctx, s, m.Encode(p), o...) {
				if !assert.NoError(t, err) {
					return
				}
				got[i] = append(got[i], tok.ID)
			}
		}()
	}
	wg.Wait()
	for i := range prompts {
		assert.Equal(t, want[i], got[i], "prompt %d: in the Batcher", i)
	}
}

// TestRejectionSamplingOptions: the option needs a drafter.
func TestRejectionSamplingOptions(t *testing.T) {
	m, err := Load(context.Background(), tinyDir, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	s, _ := m.NewSession()
	defer s.Close()
	for _, err := range s.GenerateTokens(context.Background(), m.Encode("ab"), WithTemperature(1), WithRejectionSampling()) {
		require.ErrorIs(t, err, ErrInvalidOption)
		break
	}
}

// TestRejectionSamplingCancelled: a rejection-sampling generation
// cancelled with drafts in flight leaves the session holding exactly the
// tokens it yielded, with the logits and KDA states of a session fed them
// plainly, and it generates on like one.
func TestRejectionSamplingCancelled(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	d, err := m.NewSelfDraft(2)
	require.NoError(t, err)
	defer d.Close()
	prompt := m.Encode("one two one two one two")
	for _, stop := range []int{1, 2, 5} {
		cctx, cancel := context.WithCancel(ctx)
		s, _ := m.NewSession()
		var yielded []int32
		var gotErr error
		for tok, err := range s.GenerateTokens(cctx, prompt, WithMaxTokens(30), WithoutDefaultStops(), WithTemperature(1), WithSeed(uint64(stop)),
			WithSpeculation(d, 4), WithRejectionSampling()) {
			if err != nil {
				gotErr = err
				break
			}
			if yielded = append(yielded, tok.ID); len(yielded) == stop {
				cancel()
			}
		}
		cancel()
		require.ErrorIs(t, gotErr, context.Canceled, "stop %d", stop)
		require.Equal(t, append(append([]int32(nil), prompt...), yielded...), s.Tokens(), "stop %d", stop)
		r, _ := m.NewSession()
		_, err := r.Forward(ctx, prompt)
		require.NoError(t, err)
		for _, tok := range yielded {
			_, err := r.Forward(ctx, []int32{tok})
			require.NoError(t, err)
		}
		require.Equal(t, r.Logits(), s.Logits(), "stop %d", stop)
		require.Equal(t, kdaStates(t, r), kdaStates(t, s), "stop %d", stop)
		a, _ := genIDs(t, s, nil, WithMaxTokens(6), WithoutDefaultStops())
		b, _ := genIDs(t, r, nil, WithMaxTokens(6), WithoutDefaultStops())
		require.Equal(t, b, a, "stop %d", stop)
		s.Close()
		r.Close()
	}
}

// TestRejectionSamplingProbeRate: while the adaptive depth decodes
// plainly, a probe drawn from the drafter's distribution is scored by its
// exact acceptance probability Σ min(p, q). With q equal to p (the
// checkpoint drafting for itself) that is 1, so the generation soon
// speculates and keeps every draft; scored by whether the plain draw
// equalled the probe (mean Σ p², small at a high temperature) it would
// not speculate at all.
func TestRejectionSamplingProbeRate(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	pass := make([]float64, 9)
	for n := 1; n < len(pass); n++ {
		pass[n] = 1 + 0.05*float64(n-1)
	}
	// Fixed costs of a fast machine, and a step so long that drafting
	// counts for nothing: the choice rests on the acceptance estimate.
	m.specCosts = specdec.Costs{Pass: pass, Rollback: 0.2, Step: 1e3}
	same, err := Load(ctx, tinyDir)
	require.NoError(t, err)
	defer same.Close()
	d, err := m.NewDraftModel(same)
	require.NoError(t, err)
	defer d.Close()
	s, _ := m.NewSession()
	defer s.Close()
	_, u := genIDs(t, s, m.Encode("one two three"), WithMaxTokens(48), WithoutDefaultStops(), WithTemperature(1.5), WithSeed(5),
		WithAdaptiveSpeculation(d, 4), WithRejectionSampling())
	assert.Positive(t, u.AcceptedTokens, "never speculated")
	assert.Equal(t, u.DraftTokens, u.AcceptedTokens, "q is p: every draft is kept")
}
