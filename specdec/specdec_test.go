package specdec

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNGram(t *testing.T) {
	for _, c := range []struct {
		name    string
		g       NGram
		history []int32
		n       int
		want    []int32
	}{
		{"longest suffix first", NGram{1, 3}, []int32{1, 2, 3, 4, 9, 2, 3, 5, 1, 2, 3}, 4, []int32{4, 9, 2, 3}},
		{"most recent of equal length", NGram{1, 1}, []int32{7, 1, 7, 2, 7}, 3, []int32{2, 7}},
		{"n caps the draft", NGram{1, 3}, []int32{1, 2, 3, 4, 5, 1, 2}, 2, []int32{3, 4}},
		{"a repeat runs into the suffix", NGram{2, 2}, []int32{5, 6, 5, 6}, 4, []int32{5, 6}},
		{"no match", NGram{1, 3}, []int32{1, 2, 3, 4}, 3, nil},
		{"shorter than Min", NGram{3, 4}, []int32{1, 2, 1, 2}, 3, nil},
		{"one token", NGram{}, []int32{1}, 3, nil},
		{"empty", NGram{}, nil, 3, nil},
		{"zero value is 1..3", NGram{}, []int32{8, 1, 2, 3, 4, 1, 2, 3}, 1, []int32{4}},
	} {
		t.Run(c.name, func(t *testing.T) {
			hist := append([]int32(nil), c.history...)
			got := c.g.Draft(hist, c.n, nil)
			assert.Equal(t, c.want, got)
			assert.Equal(t, c.history, hist, "history changed")
		})
	}
	// dst is extended, not replaced.
	assert.Equal(t, []int32{42, 3}, NGram{}.Draft([]int32{1, 3, 1}, 1, []int32{42}))
}

// speculate draws one token the way exact speculative sampling does: a
// draft from q, kept by Accept, else a replacement from Residual.
func speculate(r *rand.Rand, p, q, res []float64) int {
	d := draw(r, q)
	if Accept(p[d], q[d], r.Float64()) {
		return d
	}
	Residual(res, p, q)
	return draw(r, res)
}

func draw(r *rand.Rand, p []float64) int {
	u := r.Float64()
	for i, v := range p {
		if u -= v; u < 0 {
			return i
		}
	}
	return len(p) - 1
}

func TestResidual(t *testing.T) {
	res := make([]float64, 3)
	Residual(res, []float64{.6, .3, .1}, []float64{.1, .2, .7})
	assert.InDeltaSlice(t, []float64{5.0 / 6, 1.0 / 6, 0}, res, 1e-12)
	// p == q: nothing left over, the residual is p.
	Residual(res, []float64{.2, .3, .5}, []float64{.2, .3, .5})
	assert.Equal(t, []float64{.2, .3, .5}, res)
}

// TestRejectionSamplingDistribution: tokens from speculate are distributed
// as p whatever q is (vLLM's rejection-sampler test shape: a small
// vocabulary, a chi-square at alpha 1e-4 over 100k draws, and the distance
// to p shrinking with the draws while the distance to q does not), and a
// token p gives no probability never comes out.
func TestRejectionSamplingDistribution(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := []struct{ p, q []float64 }{
		{[]float64{.6, .3, .1}, []float64{.1, .2, .7}},
		{[]float64{.5, .5, 0}, []float64{.2, .2, .6}},
		{[]float64{.05, .05, .1, .1, .2, .2, .1, .1, .05, .05}, []float64{.3, 0, .1, .1, .1, .1, .1, .1, .1, 0}},
	}
	for ci, c := range cases {
		res := make([]float64, len(c.p))
		var dists []float64
		for _, n := range []int{100, 1000, 10000, 100000} {
			counts := make([]float64, len(c.p))
			for range n {
				counts[speculate(r, c.p, c.q, res)]++
			}
			var chi, tv float64
			dof := -1
			for i, pi := range c.p {
				if pi == 0 {
					require.Zero(t, counts[i], "case %d: token %d has probability 0 but was emitted", ci, i)
					continue
				}
				dof++
				e := pi * float64(n)
				chi += (counts[i] - e) * (counts[i] - e) / e
				tv += math.Abs(counts[i]/float64(n) - pi)
			}
			dists = append(dists, tv/2)
			if n == 100000 {
				assert.Less(t, chi, chiSquare1e4[dof], "case %d: chi-square %.1f with %d degrees of freedom", ci, chi, dof)
				var tvq float64
				for i := range c.q {
					tvq += math.Abs(counts[i]/float64(n) - c.q[i])
				}
				assert.Greater(t, tvq/2, 20*tv/2, "case %d: the draws are as close to q as to p", ci)
			}
		}
		assert.Less(t, dists[3], dists[0]/5, "case %d: distance to p over 100..100k draws: %v", ci, dists)
	}
}

// chiSquare1e4[k] is the chi-square critical value at alpha 1e-4 for k
// degrees of freedom.
var chiSquare1e4 = map[int]float64{1: 15.137, 2: 18.421, 7: 29.878, 9: 33.720}
