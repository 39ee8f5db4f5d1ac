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

// linear costs: a pass of n tokens costs 1 + c·(n-1) steps.
func linear(c float64) Costs {
	p := make([]float64, 17)
	for n := 1; n < len(p); n++ {
		p[n] = 1 + c*float64(n-1)
	}
	return Costs{Pass: p, Rollback: 0.2}
}

func TestBestDepth(t *testing.T) {
	// Cheap passes and good drafts: deep; poor drafts or costly passes: none.
	assert.Equal(t, 15, BestDepth(0.99, 15, linear(0.01)))
	assert.Equal(t, 7, BestDepth(0.99, 7, linear(0.01)), "capped by max")
	assert.Equal(t, 0, BestDepth(0.1, 15, linear(0.1)))
	assert.Equal(t, 0, BestDepth(0.9, 15, linear(1)), "a pass costs as many steps as tokens: never worth it")
	assert.Equal(t, 0, BestDepth(0.9, 0, linear(0.01)))
	// Depths beyond the measured costs are not considered.
	assert.Equal(t, 2, BestDepth(0.99, 15, Costs{Pass: []float64{0, 1, 1.01, 1.02}}))
	// A drafter that costs a decode step per token never pays; a cheap
	// one leaves the choice where it was.
	assert.Equal(t, 0, BestDepth(0.9, 15, withDraft(linear(0.01), 1)))
	assert.Equal(t, BestDepth(0.8, 15, linear(0.05)), BestDepth(0.8, 15, withDraft(linear(0.05), 1e-6)))
	assert.Less(t, BestDepth(0.95, 15, withDraft(linear(0.01), 0.2)), BestDepth(0.95, 15, linear(0.01)), "costly drafts go less deep")
	// A block's drafting cost is paid at any depth: at alpha 0.5 a pass
	// of one draft yields 1.5 tokens for 1.01 + 0.1 steps and half a
	// rollback (1.24x), but with a block of 7 drafts at 0.1 each it costs
	// 1.01 + 0.7 and the rollback (0.83x), and no depth pays.
	assert.Equal(t, 1, BestDepth(0.5, 1, withDraft(linear(0.01), 0.1)))
	block := linear(0.01)
	block.Block = 7 * 0.1
	assert.Equal(t, 0, BestDepth(0.5, 7, block))
	assert.Equal(t, 7, BestDepth(0.99, 7, block), "a block that is nearly always right pays for itself")
	// The choice maximises the expected rate: check against brute force.
	for _, a := range []float64{0.3, 0.5, 0.7, 0.8, 0.9, 0.95} {
		for _, c := range []float64{0.05, 0.15, 0.3} {
			costs := linear(c)
			k := BestDepth(a, 15, costs)
			rate := func(k int) float64 {
				if k == 0 {
					return 1
				}
				tok := (1 - math.Pow(a, float64(k+1))) / (1 - a)
				return tok / (costs.Pass[k+1] + costs.Rollback*(1-math.Pow(a, float64(k))))
			}
			for j := 1; j <= 15; j++ {
				if rate(j) > MinGain {
					assert.GreaterOrEqual(t, rate(k)+1e-12, rate(j), "alpha %.2f c %.2f: depth %d beats the chosen %d", a, c, j, k)
				}
			}
			if k > 0 {
				assert.Greater(t, rate(k), MinGain)
			}
		}
	}
}

func TestAcceptance(t *testing.T) {
	var a Acceptance
	assert.Zero(t, a.Rate())
	for range 100 {
		a.Observe(true)
	}
	assert.InDelta(t, 1, a.Rate(), 1e-4)
	for range 100 {
		a.Observe(false)
	}
	assert.InDelta(t, 0, a.Rate(), 1e-4)
	r := rand.New(rand.NewPCG(3, 4))
	var sum float64
	for i := range 20000 {
		a.Observe(r.Float64() < 0.7)
		if i >= 100 {
			sum += a.Rate()
		}
	}
	assert.InDelta(t, 0.7, sum/19900, 0.01)
	// Lower is the rate less one standard deviation of the average.
	var c Acceptance
	for range 200 {
		c.Observe(true)
	}
	assert.InDelta(t, 1, c.Lower(), 1e-4, "no noise at 1")
	c.rate = 0.5
	assert.InDelta(t, 0.5-math.Sqrt(0.25*0.1/1.9), c.Lower(), 1e-12)
	var zero Acceptance
	assert.Zero(t, zero.Lower())
	// Known rates move the estimate as outcomes of that mean do, clamped
	// to [0, 1].
	var b Acceptance
	for range 100 {
		b.ObserveRate(0.8)
	}
	assert.InDelta(t, 0.8, b.Rate(), 1e-4)
	for range 100 {
		b.ObserveRate(1.5)
	}
	assert.InDelta(t, 1, b.Rate(), 1e-4)
}

func withDraft(c Costs, d float64) Costs {
	c.Draft = d
	return c
}

func TestBestPrefix(t *testing.T) {
	c := linear(0.05)
	assert.Equal(t, 0, BestPrefix(nil, c))
	assert.Equal(t, 0, BestPrefix([]float32{0.01, 0.9, 0.9}, c), "an unlikely first draft: a plain step")
	assert.Equal(t, 3, BestPrefix([]float32{0.99, 0.99, 0.99}, c), "the whole block")
	assert.Equal(t, 2, BestPrefix([]float32{0.95, 0.95, 0.02, 0.99}, c), "cut before the unlikely one")
	// Constant confidences give the constant-acceptance choice.
	for _, a := range []float32{0.5, 0.8, 0.95} {
		conf := []float32{a, a, a, a, a, a, a}
		assert.Equal(t, BestDepth(float64(a), 7, c), BestPrefix(conf, c), "alpha %v", a)
	}
}
