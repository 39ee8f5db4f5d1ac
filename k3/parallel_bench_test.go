package k3

import (
	"context"
	"os"
	"testing"
)

// BenchmarkGroupDecode times decode steps of a model split over ranks
// (TP 2; TP 2 × EP 2 with each rank's shared experts beside its routed
// ones, overlap, or after them, serial; CP 2) against the same model on
// one rank. The model is
// $K3_PARALLEL_MODEL (a checkpoint directory) or tiny_k31pro.
//
//	go test ./k3 -run '^$' -bench GroupDecode -benchtime 64x
func BenchmarkGroupDecode(b *testing.B) {
	dir := os.Getenv("K3_PARALLEL_MODEL")
	if dir == "" {
		dir = "../testdata/model/tiny_k31pro"
	}
	ctx := context.Background()
	prompt := make([]int32, 64)
	for i := range prompt {
		prompt[i] = int32(i*37%200 + 3)
	}
	b.Run("one-rank", func(b *testing.B) {
		m, err := Load(ctx, dir)
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		s, err := m.NewSession()
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Forward(ctx, prompt); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := s.Forward(ctx, []int32{int32(i%200 + 3)}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e3, "ms/step")
	})
	for _, c := range []struct {
		name string
		l    Layout
	}{{"tp2", Layout{TP: 2}}, {"tp2ep2-serial", Layout{TP: 2, EP: 2, Serial: true}}, {"tp2ep2-overlap", Layout{TP: 2, EP: 2}}, {"cp2", Layout{CP: 2}}} {
		l := c.l
		b.Run(c.name, func(b *testing.B) {
			g, err := LoadGroup(ctx, dir, l)
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			gs, err := g.NewSession()
			if err != nil {
				b.Fatal(err)
			}
			defer gs.Close()
			if _, err := gs.Forward(ctx, prompt); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := gs.Forward(ctx, []int32{int32(i%200 + 3)}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N)*1e3, "ms/step")
		})
	}
}
