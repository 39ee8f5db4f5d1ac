package k3

import (
	"context"
	"fmt"
	"iter"
	"os"
	"sync"
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

// BenchmarkGroupBatcher times four generations of 16 tokens at once on a
// model split over TP 2: through a GroupBatcher, which runs the four in
// one pass a step, against four GroupSession generations side by side,
// which the group runs one pass at a time; and the same two ways on one
// rank (a Batcher, and four Sessions, which run their passes at once).
// The model is $K3_PARALLEL_MODEL or tiny_k31pro.
//
//	go test ./k3 -run '^$' -bench GroupBatcher -benchtime 4x
func BenchmarkGroupBatcher(b *testing.B) {
	dir := os.Getenv("K3_PARALLEL_MODEL")
	if dir == "" {
		dir = "../testdata/model/tiny_k31pro"
	}
	const streams, tokens = 4, 16
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := func(i int) []GenerateOption {
		return []GenerateOption{WithMaxTokens(tokens), WithTemperature(0), WithoutDefaultStops()}
	}
	prompt := func(i int) []int32 { return []int32{int32(3 + i), 40, 41} }
	// round runs one generation per stream at once and fails the
	// benchmark on an error or a short generation.
	round := func(b *testing.B, gen func(i int) iter.Seq2[Token, error]) {
		var wg sync.WaitGroup
		errs := make([]error, streams)
		for i := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := 0
				for _, err := range gen(i) {
					if err != nil {
						errs[i] = err
						return
					}
					n++
				}
				if n != tokens {
					errs[i] = fmt.Errorf("stream %d: %d tokens", i, n)
				}
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	report := func(b *testing.B) {
		b.ReportMetric(float64(b.N*streams*tokens)/b.Elapsed().Seconds(), "tokens/s")
	}
	for _, batched := range []bool{false, true} {
		name := map[bool]string{false: "tp2-lockstep", true: "tp2-batcher"}[batched]
		b.Run(name, func(b *testing.B) {
			g, err := LoadGroup(ctx, dir, Layout{TP: 2})
			if err != nil {
				b.Fatal(err)
			}
			defer g.Close()
			gb, err := g.NewBatcher(streams)
			if err != nil {
				b.Fatal(err)
			}
			if err := gb.Start(ctx); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				var sessions []*GroupSession
				for range streams {
					gs, err := g.NewSession()
					if err != nil {
						b.Fatal(err)
					}
					sessions = append(sessions, gs)
				}
				round(b, func(i int) iter.Seq2[Token, error] {
					if batched {
						return gb.GenerateTokens(ctx, sessions[i], prompt(i), opts(i)...)
					}
					return sessions[i].GenerateTokens(ctx, prompt(i), opts(i)...)
				})
				for _, gs := range sessions {
					gs.Close()
				}
			}
			report(b)
		})
	}
	for _, batched := range []bool{false, true} {
		name := map[bool]string{false: "one-rank-sessions", true: "one-rank-batcher"}[batched]
		b.Run(name, func(b *testing.B) {
			m, err := Load(ctx, dir)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			bat, err := m.NewBatcher(streams)
			if err != nil {
				b.Fatal(err)
			}
			if err := bat.Start(ctx); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				var sessions []*Session
				for range streams {
					s, err := m.NewSession()
					if err != nil {
						b.Fatal(err)
					}
					sessions = append(sessions, s)
				}
				round(b, func(i int) iter.Seq2[Token, error] {
					if batched {
						return bat.GenerateTokens(ctx, sessions[i], prompt(i), opts(i)...)
					}
					return sessions[i].GenerateTokens(ctx, prompt(i), opts(i)...)
				})
				for _, s := range sessions {
					s.Close()
				}
			}
			report(b)
		})
	}
}
