package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGreedyAndPenalties(t *testing.T) {
	s, err := New(Params{}, 4)
	if err != nil {
		t.Fatal(err)
	}
	if got := must(s.Sample([]float32{1, 3, 3, 2})); got != 1 {
		t.Errorf("greedy picked %d, want 1 (tie to the lower id)", got)
	}
	s, _ = New(Params{RepetitionPenalty: 2}, 3)
	s.Observe(0)
	if got := must(s.Sample([]float32{3, 2, 0})); got != 1 {
		t.Errorf("repetition penalty: picked %d, want 1", got)
	}
	s, _ = New(Params{PresencePenalty: 0.5, FrequencyPenalty: 1}, 3)
	s.Observe(0, 0)
	if got := must(s.Sample([]float32{3, 0.6, 0})); got != 1 { // 3 - 0.5 - 2 = 0.5 < 0.6
		t.Errorf("presence/frequency penalty: picked %d, want 1", got)
	}
	s, _ = New(Params{LogitBias: map[int32]float32{2: 10}}, 3)
	if got := must(s.Sample([]float32{3, 2, 0})); got != 2 {
		t.Errorf("logit bias: picked %d, want 2", got)
	}
}

// TestDistribution draws many samples and checks the frequencies against
// the filtered softmax with a chi-square bound.
func TestDistribution(t *testing.T) {
	logits := []float32{2, 1.5, 1, 0.2, -1, -3}
	cases := []struct {
		p    Params
		want []float64
	}{
		{Params{Temperature: 1}, nil},
		{Params{Temperature: 0.7, TopK: 3}, nil},
		{Params{Temperature: 1, TopP: 0.6}, nil},
		{Params{Temperature: 1, MinP: 0.3}, nil},
	}
	for ci, c := range cases {
		// Expected distribution, computed directly.
		w := make([]float64, len(logits))
		for i, l := range logits {
			w[i] = math.Exp(float64(l) / float64(c.p.Temperature))
		}
		keep := make([]bool, len(w))
		for i := range keep {
			keep[i] = true
		}
		if c.p.TopK > 0 {
			for i := c.p.TopK; i < len(w); i++ {
				keep[i] = false
			}
		}
		if c.p.MinP > 0 {
			for i := range w {
				if w[i] < float64(c.p.MinP)*w[0] {
					keep[i] = false
				}
			}
		}
		if c.p.TopP > 0 {
			var total, acc float64
			for _, v := range w {
				total += v
			}
			for i := range w {
				if acc >= float64(c.p.TopP)*total {
					keep[i] = false
				}
				acc += w[i]
			}
		}
		var z float64
		for i := range w {
			if !keep[i] {
				w[i] = 0
			}
			z += w[i]
		}
		c.p.Seed = uint64(ci + 1)
		s, err := New(c.p, len(logits))
		if err != nil {
			t.Fatal(err)
		}
		const n = 40000
		counts := make([]float64, len(logits))
		for i := 0; i < n; i++ {
			counts[must(s.Sample(logits))]++
			s.Reset() // keep the distribution fixed
		}
		var chi float64
		dof := -1
		for i := range w {
			exp := w[i] / z * n
			if exp == 0 {
				if counts[i] != 0 {
					t.Errorf("case %d: token %d has probability 0 but was drawn %v times", ci, i, counts[i])
				}
				continue
			}
			chi += (counts[i] - exp) * (counts[i] - exp) / exp
			dof++
		}
		// 99.99th percentile of chi-square with <= 5 degrees of freedom is about 25.7.
		if chi > 25.7 {
			t.Errorf("case %d: chi-square %.1f over %d dof; counts %v, want proportions %v", ci, chi, dof, counts, w)
		}
	}
}

func TestSeedReproducible(t *testing.T) {
	logits := []float32{1, 1, 1, 1, 1}
	a, _ := New(Params{Temperature: 1, Seed: 42}, 5)
	b, _ := New(Params{Temperature: 1, Seed: 42}, 5)
	for i := 0; i < 50; i++ {
		if x, y := must(a.Sample(logits)), must(b.Sample(logits)); x != y {
			t.Fatalf("draw %d: %d != %d with the same seed", i, x, y)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Params{{Temperature: -1}, {TopP: 1.5}, {TopP: -0.1}, {MinP: 2}, {TopK: -1},
		{RepetitionPenalty: -1}, {LogitBias: map[int32]float32{99: 1}},
		{PresencePenalty: nan}, {PresencePenalty: inf}, {FrequencyPenalty: nan}, {FrequencyPenalty: -inf},
		{LogitBias: map[int32]float32{3: nan}}, {LogitBias: map[int32]float32{3: -inf}}, {LogitBias: map[int32]float32{3: inf}}} {
		if _, err := New(p, 10); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v accepted: %v", p, err)
		}
	}
	s, _ := New(Params{Temperature: 0.8, TopK: 2, Seed: 1}, 1000)
	logits := make([]float32, 1000)
	if n := testing.AllocsPerRun(20, func() { must(s.Sample(logits)) }); n != 0 && !raceEnabled {
		t.Errorf("Sample allocates %v times", n)
	}
}

// must unwraps Sample's result; a test whose sampling fails stops there.
func must(id int32, err error) int32 {
	if err != nil {
		panic(err)
	}
	return id
}

var (
	nan = float32(math.NaN())
	inf = float32(math.Inf(1))
)

// TestNoToken: biases that push every logit past float32's range leave
// nothing to sample; that is an error, not a silent id.
func TestNoToken(t *testing.T) {
	bias := map[int32]float32{}
	for id := range int32(4) {
		bias[id] = -math.MaxFloat32
	}
	for _, temp := range []float32{0, 1} {
		s, err := New(Params{Temperature: temp, LogitBias: bias}, 4)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Sample([]float32{-math.MaxFloat32, -3e38, -math.MaxFloat32, -math.MaxFloat32}); !errors.Is(err, ErrNoToken) || !errors.Is(err, ErrInvalid) {
			t.Errorf("temperature %v: every token masked: %v", temp, err)
		}
		// One token left finite is what gets picked.
		if id := must(s.Sample([]float32{-math.MaxFloat32, 1, -math.MaxFloat32, -math.MaxFloat32})); id != 1 {
			t.Errorf("temperature %v: picked %d, want the only finite token 1", temp, id)
		}
	}
}

// TestArgmax checks Argmax against the one-loop specification on random
// rows full of ties, NaNs, infinities and signed zeros, at lengths around
// its lane width and tail.
func TestArgmax(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	pool := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 2, 2, 3, -inf, inf, nan}
	for _, n := range []int{0, 1, 7, 63, 64, 65, 71, 72, 127, 1000} {
		for trial := range 500 {
			x := make([]float32, n)
			for i := range x {
				switch trial % 3 {
				case 0:
					x[i] = pool[r.IntN(len(pool))]
				case 1:
					x[i] = float32(r.NormFloat64())
				default:
					x[i] = pool[r.IntN(4)] // mostly ties
				}
			}
			require.Equal(t, argmaxScalar(x), Argmax(x), "n=%d trial %d: %v", n, trial, x)
		}
	}
}

// TestMask: a masked sampler draws only allowed tokens, greedy or not,
// and fails with ErrNoToken when none is allowed.
func TestMask(t *testing.T) {
	logits := []float32{5, 4, 3, 2, 1, 0}
	for _, temp := range []float32{0, 1, 3} {
		s, err := New(Params{Temperature: temp, Seed: 7}, len(logits))
		if err != nil {
			t.Fatal(err)
		}
		allowed := []bool{false, false, true, false, true, false}
		s.SetMask(allowed)
		for range 50 {
			tok, err := s.Sample(logits)
			if err != nil || !allowed[tok] {
				t.Fatalf("temperature %v: drew %d (%v)", temp, tok, err)
			}
		}
		s.SetMask(make([]bool, len(logits)))
		if _, err := s.Sample(logits); !errors.Is(err, ErrNoToken) {
			t.Fatalf("temperature %v: nothing allowed gave %v", temp, err)
		}
		s.SetMask(nil)
		if tok, err := s.Sample(logits); err != nil || temp == 0 && tok != 0 {
			t.Fatalf("temperature %v: unmasked drew %d (%v)", temp, tok, err)
		}
	}
}
