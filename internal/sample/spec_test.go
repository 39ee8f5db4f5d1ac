package sample

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// reference is the distribution Params give after logits when the tokens
// in seen have been observed, computed directly in float64: the
// penalties, then softmax(x/T) over the top-k, cut by min-p and top-p.
func reference(logits []float32, p Params, seen []int32) []float64 {
	x := make([]float64, len(logits))
	for i, l := range logits {
		x[i] = float64(l)
	}
	counts := map[int32]int{}
	for _, id := range seen {
		counts[id]++
	}
	for id, n := range counts {
		v := x[id]
		if rp := float64(p.RepetitionPenalty); rp != 0 && rp != 1 {
			if v > 0 {
				v /= rp
			} else {
				v *= rp
			}
		}
		x[id] = v - float64(p.PresencePenalty) - float64(p.FrequencyPenalty)*float64(n)
	}
	// Tokens by descending logit, ties to the lower id (a stable sort of
	// the ids).
	order := make([]int, len(x))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return x[order[a]] > x[order[b]] })
	if p.TopK > 0 && p.TopK < len(order) {
		order = order[:p.TopK]
	}
	w := make([]float64, len(x))
	var total float64
	for _, i := range order {
		w[i] = math.Exp((x[i] - x[order[0]]) / float64(p.Temperature))
		total += w[i]
	}
	n := len(order)
	for p.MinP > 0 && n > 1 && w[order[n-1]] < float64(p.MinP) {
		n--
	}
	if p.TopP > 0 && p.TopP < 1 {
		var acc float64
		for k, i := range order[:n] {
			if acc += w[i]; acc >= float64(p.TopP)*total {
				n = k + 1
				break
			}
		}
	}
	out := make([]float64, len(x))
	var kept float64
	for _, i := range order[:n] {
		kept += w[i]
	}
	for _, i := range order[:n] {
		out[i] = w[i] / kept
	}
	return out
}

var specCases = []struct {
	name   string
	p      Params
	seen   []int32
	target []float32 // the target's logits
	draft  []float32 // the drafter's
}{
	{"temperature", Params{Temperature: 1}, nil,
		[]float32{2, 1.5, 1, 0.2, -1, -3}, []float32{-1, 0, 2, 1, 0.5, 0}},
	{"top-k supports differ", Params{Temperature: 0.7, TopK: 3}, nil,
		[]float32{2, 1.5, 1, 0.2, -1, -3, 0, 0}, []float32{0, 1, 2, 3, 0, 0, 2.5, 0}},
	{"top-p and min-p", Params{Temperature: 1.2, TopP: 0.8, MinP: 0.05}, nil,
		[]float32{0.1, 1.5, 1, 0.2, -1, 2, 0.4}, []float32{1, 1, 1, 1, 1, 1, 1}},
	{"min-p alone", Params{Temperature: 0.8, MinP: 0.2}, nil,
		[]float32{0.1, 1.5, 1, 0.2, -1, 2, 0.4}, []float32{2, 1, 0, 1, 1, 1, 0}},
	{"penalties", Params{Temperature: 0.9, RepetitionPenalty: 1.3, PresencePenalty: 0.4, FrequencyPenalty: 0.3}, []int32{0, 0, 2, 5},
		[]float32{2, 1.5, 1, 0.2, -1, 1.8}, []float32{2, 0, 1, 0, 0, 2}},
}

// TestProbs: Probs gives the reference distribution, and greedy sampling
// puts everything on the argmax.
func TestProbs(t *testing.T) {
	for _, c := range specCases {
		s, err := New(c.p, len(c.target))
		require.NoError(t, err)
		s.Observe(c.seen...)
		got := make([]float64, len(c.target))
		require.NoError(t, s.Probs(c.target, got))
		assert.InDeltaSlice(t, reference(c.target, c.p, c.seen), got, 1e-6, c.name)
	}
	s, _ := New(Params{}, 3)
	got := make([]float64, 3)
	require.NoError(t, s.Probs([]float32{1, 3, 3}, got))
	assert.Equal(t, []float64{0, 1, 0}, got)
}

// chiSquare1e4[k] is the chi-square critical value at alpha 1e-4 for k
// degrees of freedom.
var chiSquare1e4 = []float64{0, 15.137, 18.421, 21.108, 23.513, 25.745, 27.856, 29.878, 31.828, 33.720}

// TestVerifyDistribution: a draft drawn by Draft from the drafter's
// distribution and checked by Verify against the target's comes out
// distributed as the target's (Sample's) distribution, whatever the
// drafter's, with and without the drafter's distribution (nil: a fixed
// draft). Over 100k draws a chi-square at alpha 1e-4 holds, the distance
// to the target shrinks as the draws grow while the distance to the
// drafter's stays, and a token of zero target probability never comes out.
func TestVerifyDistribution(t *testing.T) {
	for _, c := range specCases {
		for _, mode := range []int{0, 1, 2} {
			fixed, masked := mode == 1, mode == 2
			name := c.name
			if fixed {
				name += ", a fixed draft"
			}
			p := c.p
			p.Seed = 7
			s, err := New(p, len(c.target))
			require.NoError(t, err)
			s.Observe(c.seen...)
			target := c.target
			var mask []bool
			if masked {
				// A constrained generation: the mask bars the target's
				// favourite and its least likely token at the verified
				// position;
				// the drafts are drawn without it (k3 lifts it for the
				// drafter). The reference is the target with those
				// logits at -Inf.
				name += ", masked"
				mask = make([]bool, len(c.target))
				target = slices.Clone(c.target)
				for i := range mask {
					mask[i] = i != Argmax(c.target) && i != slices.Index(c.target, slices.Min(c.target))
					if !mask[i] {
						target[i] = float32(math.Inf(-1))
					}
				}
			}
			want := reference(target, c.p, c.seen)
			qWant := reference(c.draft, c.p, c.seen)
			q := make([]float64, len(c.target))
			counts := make([]float64, len(c.target))
			var dists []float64
			drawn := 0
			kept := 0
			for _, n := range []int{1000, 10000, 100000} {
				for ; drawn < n; drawn++ {
					var d int32
					var qq []float64
					if fixed {
						d = int32(Argmax(c.draft))
					} else {
						s.SetMask(nil)
						d, err = s.Draft(c.draft, q)
						require.NoError(t, err)
						s.Forget(d) // the block was drafted
						qq = q
					}
					s.SetMask(mask)
					tok, err := s.Verify(c.target, qq, d)
					require.NoError(t, err)
					s.Forget(tok) // keep the penalties where they were
					counts[tok]++
					if tok == d {
						kept++
					}
				}
				var tv float64
				for i := range want {
					tv += math.Abs(counts[i]/float64(n) - want[i])
				}
				dists = append(dists, tv/2)
			}
			n := float64(drawn)
			var chi, tvq float64
			dof := -1
			for i, pi := range want {
				tvq += math.Abs(counts[i]/n - qWant[i])
				if pi == 0 {
					require.Zero(t, counts[i], "%s: token %d has target probability 0 but came out", name, i)
					continue
				}
				dof++
				e := pi * n
				chi += (counts[i] - e) * (counts[i] - e) / e
			}
			assert.Less(t, chi, chiSquare1e4[dof], "%s: chi-square %.1f with %d degrees of freedom", name, chi, dof)
			assert.Less(t, dists[2], dists[0]/3, "%s: distance to the target over 1k..100k draws: %v", name, dists)
			assert.Greater(t, tvq/2, 10*dists[2], "%s: the output is as close to the drafter's distribution as to the target's", name)
			// Speculation keeps a draft with probability Σ min(p, q)
			// (q one-hot for a fixed draft).
			var accept float64
			for i := range want {
				if fixed {
					if int32(i) == int32(Argmax(c.draft)) {
						accept = want[i]
					}
				} else {
					accept += min(want[i], qWant[i])
				}
			}
			assert.InDelta(t, accept, float64(kept)/n, 0.01, "%s: acceptance rate", name)
		}
	}
}

// TestDraftObserves: a draft counts for the next draft's penalties, and
// Forget takes it back out.
func TestDraftObserves(t *testing.T) {
	p := Params{Temperature: 1, PresencePenalty: 2, Seed: 3}
	s, err := New(p, 4)
	require.NoError(t, err)
	logits := []float32{0, 1, 0.5, 0}
	before := make([]float64, 4)
	require.NoError(t, s.Probs(logits, before))
	q := make([]float64, 4)
	d, err := s.Draft(logits, q)
	require.NoError(t, err)
	assert.Equal(t, before, q, "the first draft's distribution")
	after := make([]float64, 4)
	require.NoError(t, s.Probs(logits, after))
	assert.InDeltaSlice(t, reference(logits, p, []int32{d}), after, 1e-6, "the next position sees the draft")
	s.Forget(d)
	require.NoError(t, s.Probs(logits, after))
	assert.Equal(t, before, after, "Forget undoes the draft")
}

// TestVerifyGreedyAndErrors: greedy verification is the argmax whatever
// the draft; a draft outside the vocabulary is an error.
func TestVerifyGreedyAndErrors(t *testing.T) {
	s, _ := New(Params{}, 3)
	tok, err := s.Verify([]float32{0, 2, 1}, nil, 2)
	require.NoError(t, err)
	assert.Equal(t, int32(1), tok)
	s, _ = New(Params{Temperature: 1}, 3)
	_, err = s.Verify([]float32{0, 2, 1}, nil, 3)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = s.Verify([]float32{0, 2, 1}, nil, -1)
	require.ErrorIs(t, err, ErrInvalid)
}

// TestLargeVocabulary: over a vocabulary of 5,000 (where the nucleus of
// top-p needs the ranked prefix to grow past its first 64 entries), Probs
// gives the reference distribution for every filter, and Sample draws only
// tokens of non-zero reference probability, the likeliest about as often
// as it should come out.
func TestLargeVocabulary(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	logits := make([]float32, 5000)
	for i := range logits {
		logits[i] = float32(r.NormFloat64())
	}
	for _, p := range []Params{
		{Temperature: 1},
		{Temperature: 0.7, TopP: 0.9},
		{Temperature: 1, TopP: 0.5, MinP: 0.2},
		{Temperature: 1.3, TopP: 0.99},
		{Temperature: 1, TopK: 100, TopP: 0.8},
		{Temperature: 0.5, MinP: 0.05},
		{Temperature: 1, TopK: 500, MinP: 0.01},
	} {
		name := fmt.Sprintf("%+v", p)
		want := reference(logits, p, nil)
		p.Seed = 1
		s, err := New(p, len(logits))
		require.NoError(t, err)
		got := make([]float64, len(logits))
		require.NoError(t, s.Probs(logits, got))
		assert.InDeltaSlice(t, want, got, 1e-7, name) // the weights are float32
		const n = 1000
		best, hits := Argmax(logits), 0
		for range n {
			tok := must(s.Sample(logits))
			s.Reset()
			require.Positive(t, want[tok], "%s: drew token %d of probability 0", name, tok)
			if int(tok) == best {
				hits++
			}
		}
		sd := math.Sqrt(want[best] * (1 - want[best]) / n)
		assert.InDelta(t, want[best], float64(hits)/n, 5*sd+1e-9, "%s: the likeliest token's share", name)
	}
}
