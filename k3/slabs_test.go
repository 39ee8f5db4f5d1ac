package k3

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/ascend"
)

// partGraphs counts the model's graphs of one part: captured and kept,
// and calls of those.
func (m *Model) partGraphs(part graphPart) (kept int, calls int) {
	m.graphs.mu.Lock()
	defer m.graphs.mu.Unlock()
	for el := m.graphs.lru.Front(); el != nil; el = el.Next() {
		e := el.Value.(*graphEntry)
		if e.key.part == part && e.g != nil {
			kept++
			calls += e.calls
		}
	}
	return kept, calls
}

func (m *Model) kdaGraphs() (kept int, calls int) { return m.partGraphs(graphKDA) }

// eachTiny runs f on every tiny checkpoint of testdata/model, as a
// subtest named for it; under the race detector it skips (these tests run
// one goroutine for minutes there, and the plain run covers them).
func eachTiny(t *testing.T, f func(t *testing.T, dir string)) {
	t.Helper()
	if raceEnabled {
		t.Skip("one goroutine, and minutes under the race detector: the plain run covers it")
	}
	configs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	require.NotEmpty(t, configs)
	for _, cfg := range configs {
		dir := filepath.Dir(cfg)
		t.Run(filepath.Base(dir), func(t *testing.T) { f(t, dir) })
	}
}

// onHost loads the checkpoint in dir on an ascend-host backend of its
// own, with graphs (whole steps, or pieces only) or without; both close
// with the test.
func onHost(t *testing.T, dir string, graphs, steps bool) *Model {
	t.Helper()
	b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20})
	require.NoError(t, err)
	opts := []Option{WithComputeBackend(b)}
	if !graphs {
		opts = append(opts, WithoutGraphs())
	}
	m, err := Load(context.Background(), dir, opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		m.Close()
		b.Close()
	})
	if graphs {
		m.graphs.piecesOnly = !steps
	}
	return m
}

// On a capturing backend sessions' KDA states are slots of one slab and
// their attention pages pages of one page slab, and a decode batch's KDA
// mixers and attention read them through the slots and page tables
// written before the pass: when a session of the batch closes and a new
// one takes its slot, and when the batch's order changes, the KDA graphs
// captured for the first sessions serve the new ones (no new KDA graph),
// and so do the attention graphs and the whole steps, with logits bitwise
// those of the model run eagerly (WithoutGraphs, states and pages apart).
func TestSlabsServeNewSessions(t *testing.T) {
	eachTiny(t, func(t *testing.T, dir string) {
		ctx := context.Background()
		type result struct {
			logits         [][]float32
			before, after  int // KDA graphs kept before and after the swap
			attnBefore     int // attention graphs, likewise
			attnAfter      int
			stepsBefore    int // whole steps, likewise
			stepsAfter     int
			stepCalls      int
			replaysBefore  int
			replaysAfter   int
			slots, newSlot []int
			freeSlots      int64
			perSession     int64
		}
		run := func(graphs, steps bool) result {
			m := onHost(t, dir, graphs, steps)
			var r result
			bt, err := m.NewBatch(4)
			require.NoError(t, err)
			prompt := func(i int) *Session {
				s, err := m.NewSession()
				require.NoError(t, err)
				_, err = s.Forward(ctx, []int32{int32(7 + i), 3})
				require.NoError(t, err)
				return s
			}
			ss := []*Session{prompt(0), prompt(1), prompt(2)}
			step := func(n int, tok int32) {
				for i := range n {
					toks := make([]int32, len(ss))
					for j := range toks {
						toks[j] = tok + int32(10*j+i)
					}
					require.NoError(t, bt.Step(ctx, ss, toks))
					for _, s := range ss {
						r.logits = append(r.logits, s.Logits())
					}
				}
			}
			step(4, 20)
			if graphs {
				r.before, r.replaysBefore = m.kdaGraphs()
				r.attnBefore, _ = m.partGraphs(graphAttnAttend)
				r.stepsBefore, _ = m.partGraphs(graphStep)
				for _, s := range ss {
					r.slots = append(r.slots, s.slot)
				}
			}
			// The second session leaves; a new one takes its place, and
			// the batch runs in another order.
			require.NoError(t, ss[1].Close())
			d := prompt(3)
			ss[1] = d
			step(3, 40)
			ss[0], ss[2] = ss[2], ss[0]
			step(3, 60)
			if graphs {
				r.after, r.replaysAfter = m.kdaGraphs()
				r.attnAfter, _ = m.partGraphs(graphAttnAttend)
				r.stepsAfter, r.stepCalls = m.partGraphs(graphStep)
				for _, s := range ss {
					r.newSlot = append(r.newSlot, s.slot)
				}
				r.freeSlots = m.MemoryUsage().FreeSlots
				r.perSession = d.KDAStateBytes()
				for _, s := range ss {
					require.Same(t, ss[0].slab, s.slab, "one slab holds the batch")
				}
			} else {
				require.Nil(t, d.slab, "without graphs no slabs")
			}
			for _, s := range ss {
				require.NoError(t, s.Close())
			}
			return r
		}
		eager, graphed, stepped := run(false, false), run(true, false), run(true, true)
		require.Equal(t, len(eager.logits), len(graphed.logits))
		for i := range eager.logits {
			require.True(t, slices.Equal(eager.logits[i], graphed.logits[i]), "logits %d of %d differ (pieces)", i, len(eager.logits))
			require.True(t, slices.Equal(eager.logits[i], stepped.logits[i]), "logits %d of %d differ (whole steps)", i, len(eager.logits))
		}
		// Pieces alone.
		require.Positive(t, graphed.before, "KDA graphs were captured")
		require.Equal(t, graphed.before, graphed.after, "the new session and order took no new KDA graph")
		require.Greater(t, graphed.replaysAfter, graphed.replaysBefore, "the KDA graphs were replayed for them")
		require.Equal(t, graphed.slots[1], graphed.newSlot[1], "the new session took the freed slot")
		require.Positive(t, graphed.attnBefore, "attention graphs were captured")
		require.Equal(t, int64(slabSize-3)*graphed.perSession, graphed.freeSlots)
		// Whole steps.
		require.Positive(t, stepped.stepsBefore, "whole steps were captured")
		require.Zero(t, stepped.before+stepped.attnBefore, "no piece was captured apart")
		// The new session's rows pass DSA's TopK later than the others':
		// on a capturing backend exact rows always attend through their
		// selection (StaticTopK), so that changes no graph either.
		require.Equal(t, graphed.attnBefore, graphed.attnAfter, "the new session and order took no new attention graph")
		require.Equal(t, stepped.stepsBefore, stepped.stepsAfter, "the new session and order took no new step graph")
		t.Logf("pieces: %d KDA graphs, calls %d then %d, slots %v then %v, attention graphs %d then %d; whole steps: %d then %d graphs, %d calls",
			graphed.after, graphed.replaysBefore, graphed.replaysAfter, graphed.slots, graphed.newSlot, graphed.attnBefore, graphed.attnAfter,
			stepped.stepsBefore, stepped.stepsAfter, stepped.stepCalls)
	})
}

// A session decoding from its third page of cached positions into its
// fourth replays the attention graphs (or the whole steps) it captured on
// the third: the page tables are padded to a power of two. Logits are
// bitwise those without graphs.
func TestPageBucketsKeepGraphs(t *testing.T) {
	eachTiny(t, func(t *testing.T, dir string) {
		ctx := context.Background()
		run := func(graphs bool, part graphPart) (logits [][]float32, before, after int) {
			m := onHost(t, dir, graphs, part == graphStep)
			s, err := m.NewSession()
			require.NoError(t, err)
			defer s.Close()
			prompt := make([]int32, 180)
			for i := range prompt {
				prompt[i] = int32(1 + i%17)
			}
			_, err = s.Forward(ctx, prompt)
			require.NoError(t, err)
			for step := range 20 { // positions 180 to 199: page 4 from 192
				l, err := s.Forward(ctx, []int32{int32(2 + step%11)})
				require.NoError(t, err)
				logits = append(logits, l)
				if graphs && step == 11 {
					before, _ = m.partGraphs(part)
				}
			}
			if graphs {
				after, _ = m.partGraphs(part)
			}
			return logits, before, after
		}
		eager, _, _ := run(false, 0)
		for _, part := range []graphPart{graphAttnAttend, graphStep} {
			graphed, before, after := run(true, part)
			for i := range eager {
				require.True(t, slices.Equal(eager[i], graphed[i]), "logits %d differ (part %d)", i, part)
			}
			require.Positive(t, before, "part %d", part)
			require.Equal(t, before, after, "entering the fourth page took no new graph (part %d)", part)
		}
	})
}

// stepGraphsOver counts the whole-step graphs kept over rows rows, and
// the calls of their keys.
func (m *Model) stepGraphsOver(rows int) (kept, calls int) {
	m.graphs.mu.Lock()
	defer m.graphs.mu.Unlock()
	for el := m.graphs.lru.Front(); el != nil; el = el.Next() {
		e := el.Value.(*graphEntry)
		if e.key.part == graphStep && e.key.rows == rows && e.g != nil {
			kept++
			calls += e.calls
		}
	}
	return kept, calls
}

// A batch's decode steps are padded to a bucket of rows: three sessions
// and four share one whole-step graph, and so do five to eight, with the
// real sessions' logits bitwise those without graphs.
func TestRowBuckets(t *testing.T) {
	eachTiny(t, func(t *testing.T, dir string) {
		ctx := context.Background()
		type phase struct{ kept, calls int }
		run := func(graphs bool) (logits [][]float32, phases []phase) {
			m := onHost(t, dir, graphs, true)
			bt, err := m.NewBatch(8)
			require.NoError(t, err)
			var ss []*Session
			for n, rows := range []int{0, 0, 4, 4, 8, 8, 8, 8} { // sessions 1..8; rows: the bucket
				s, err := m.NewSession()
				require.NoError(t, err)
				defer s.Close()
				_, err = s.Forward(ctx, []int32{int32(3 + n), 2})
				require.NoError(t, err)
				ss = append(ss, s)
				if rows == 0 {
					continue
				}
				for step := range 3 {
					toks := make([]int32, len(ss))
					for j := range toks {
						toks[j] = int32(5 + j + step)
					}
					require.NoError(t, bt.Step(ctx, ss, toks))
					for _, s := range ss {
						logits = append(logits, s.Logits())
					}
				}
				if graphs {
					k, c := m.stepGraphsOver(rows)
					phases = append(phases, phase{k, c})
				}
			}
			if graphs {
				require.NotEmpty(t, m.pads, "steps were padded")
				for _, pad := range m.pads {
					for _, c := range pad.caches {
						if c != nil {
							require.LessOrEqual(t, c.Len, 1, "a padding session keeps one position")
						}
					}
				}
			}
			return logits, phases
		}
		eager, _ := run(false)
		graphed, phases := run(true)
		require.Equal(t, len(eager), len(graphed))
		for i := range eager {
			require.True(t, slices.Equal(eager[i], graphed[i]), "logits %d differ", i)
		}
		// 3 then 4 sessions over 4 rows; 5, 6, 7 and 8 over 8 rows.
		require.Len(t, phases, 6)
		for i, p := range phases {
			require.Equal(t, 1, p.kept, "phase %d: one step graph for its bucket", i)
		}
		require.Equal(t, 3, phases[1].calls-phases[0].calls, "4 sessions replayed the graph of 3")
		for i := 3; i < 6; i++ {
			require.Equal(t, 3, phases[i].calls-phases[i-1].calls, "phase %d replayed the bucket's graph", i)
		}
	})
}
