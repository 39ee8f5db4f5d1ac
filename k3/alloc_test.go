package k3

import (
	"context"
	"testing"
)

// TestDecodeAllocations checks that a decode step of a warm session, the
// hot path of generation, allocates nothing beyond the amortised growth of
// the session's token history (the race detector's instrumentation
// allocates, so it is skipped there), on the exact backend and on the fast
// bf16 one (whose products round x into buffers of their own).
func TestDecodeAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, backend := range []string{"go", "go-fastbf16"} {
		t.Run(backend, func(t *testing.T) {
			ctx := context.Background()
			m, err := LoadTiny(ctx, WithBackend(backend))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			s, err := m.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.run(ctx, []int32{1, 2, 3, 4}, false); err != nil {
				t.Fatal(err)
			}
			tok := []int32{5}
			allocs := testing.AllocsPerRun(200, func() {
				if _, err := s.run(ctx, tok, false); err != nil {
					t.Fatal(err)
				}
			})
			if allocs > 0 {
				t.Errorf("a decode step allocates %v times", allocs)
			}
		})
	}
}

// TestBatchStepAllocations checks the same for a batched decode step.
func TestBatchStepAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ctx := context.Background()
	m, err := LoadTiny(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	bt, err := m.NewBatch(3)
	if err != nil {
		t.Fatal(err)
	}
	var ss []*Session
	for i := 0; i < 3; i++ {
		s, err := m.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Forward(ctx, []int32{1, int32(2 + i)}); err != nil {
			t.Fatal(err)
		}
		ss = append(ss, s)
	}
	toks := []int32{5, 6, 7}
	// Warm up past the first page: the kernels' scratch comes from
	// sync.Pools (a cache per P, so the first steps make an object for
	// each P a goroutine runs a kernel on) and grows by doubling with the
	// positions a step reads. Those allocations are amortised, not a
	// step's own; under a loaded host the first 50 steps made up to about
	// 60 of them.
	for range 66 {
		if err := bt.Step(ctx, ss, toks); err != nil {
			t.Fatal(err)
		}
	}
	// Steps within the sessions' cache pages (positions 69 to 120 of
	// pages of 64) allocate nothing.
	allocs := testing.AllocsPerRun(50, func() {
		if err := bt.Step(ctx, ss, toks); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("a batched decode step allocates %v times", allocs)
	}
	// A step that fills a page takes a new one (a few allocations per
	// attention layer and session): 200 steps cross four pages each, and
	// allocate less than once a step on average.
	allocs = testing.AllocsPerRun(200, func() {
		if err := bt.Step(ctx, ss, toks); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0 {
		t.Errorf("200 batched decode steps, crossing pages, allocate %v times a step", allocs)
	}
}

// TestGroupBatchStepAllocations checks the same for a GroupBatcher's
// decode step, which runs on every rank of a group: the fan's goroutines,
// the budget vote (with a budget) and the MoE's split and dispatch paths
// allocate nothing per step (they once made 43 to 53 allocations a step).
func TestGroupBatchStepAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ctx := context.Background()
	for i, l := range []Layout{{TP: 2}, {TP: 2, EP: 2}, {TP: 2, EP: 2, Serial: true}, {EP: 2, Dispatch: true}, {TP: 2}} {
		var opts []Option
		if i == 4 {
			opts = append(opts, WithMemoryBudget(64<<20)) // the ranks vote in every pass
		}
		t.Run(l.String(), func(t *testing.T) {
			g, err := LoadGroup(ctx, groupTestDir, l, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			gb, err := g.NewBatcher(3)
			if err != nil {
				t.Fatal(err)
			}
			var ss []*Session
			for i := range 3 {
				gs, err := g.NewSession()
				if err != nil {
					t.Fatal(err)
				}
				defer gs.Close()
				if _, err := gs.Forward(ctx, []int32{1, int32(2 + i)}); err != nil {
					t.Fatal(err)
				}
				s, err := gb.lead(gs)
				if err != nil {
					t.Fatal(err)
				}
				ss = append(ss, s)
			}
			toks := []int32{5, 6, 7}
			step := func() {
				if err := gb.b.batch.Step(ctx, ss, toks); err != nil {
					t.Fatal(err)
				}
			}
			for range 66 { // past the first page, as above
				step()
			}
			if allocs := testing.AllocsPerRun(50, step); allocs > 0 {
				t.Errorf("a group's batch step allocates %v times", allocs)
			}
		})
	}
}
