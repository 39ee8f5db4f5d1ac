package sample

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkSample draws from a vocabulary of 163,840 (Kimi K3's) with
// logits of a peaked, language-model-like spread, per setting.
func BenchmarkSample(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 1))
	logits := make([]float32, 163840)
	for i := range logits {
		logits[i] = float32(3 * r.NormFloat64())
	}
	for _, c := range []struct {
		name string
		p    Params
	}{
		{"greedy", Params{}},
		{"temperature", Params{Temperature: 0.8}},
		{"top-k=50", Params{Temperature: 0.8, TopK: 50}},
		{"top-p=0.95", Params{Temperature: 0.8, TopP: 0.95}},
		{"min-p=0.05", Params{Temperature: 0.8, MinP: 0.05}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, err := New(c.p, len(logits))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Sample(logits); err != nil {
					b.Fatal(err)
				}
				s.Reset()
			}
		})
	}
}
