package k3

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/ascend"
)

// kdaGraphs counts the model's KDA mixer graphs: captured and kept, and
// replays of any.
func (m *Model) kdaGraphs() (kept int, replays int) {
	m.graphs.mu.Lock()
	defer m.graphs.mu.Unlock()
	for el := m.graphs.lru.Front(); el != nil; el = el.Next() {
		e := el.Value.(*graphEntry)
		if e.key.part == graphKDA && e.g != nil {
			kept++
			replays += e.calls
		}
	}
	return kept, replays
}

// On a capturing backend sessions' KDA states are slots of one slab, and
// a decode batch's KDA mixers read them through the slots written before
// the pass: when a session of the batch closes and a new one takes its
// slot, and when the batch's order changes, the KDA graphs captured for
// the first sessions serve the new ones (no new KDA graph), with logits
// bitwise those of the model run eagerly (WithoutGraphs, states apart).
func TestSlabsServeNewSessions(t *testing.T) {
	configs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	require.NotEmpty(t, configs)
	ctx := context.Background()
	for _, cfg := range configs {
		dir := filepath.Dir(cfg)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			type result struct {
				logits         [][]float32
				before, after  int // KDA graphs kept before and after the swap
				replaysBefore  int
				replaysAfter   int
				slots, newSlot []int
				freeSlots      int64
				perSession     int64
			}
			run := func(graphs bool) result {
				b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20})
				require.NoError(t, err)
				defer b.Close()
				opts := []Option{WithComputeBackend(b)}
				if !graphs {
					opts = append(opts, WithoutGraphs())
				}
				m, err := Load(ctx, dir, opts...)
				require.NoError(t, err)
				defer m.Close()
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
			eager, graphed := run(false), run(true)
			require.Equal(t, len(eager.logits), len(graphed.logits))
			for i := range eager.logits {
				require.True(t, slices.Equal(eager.logits[i], graphed.logits[i]), "logits %d of %d differ", i, len(eager.logits))
			}
			require.Positive(t, graphed.before, "KDA graphs were captured")
			require.Equal(t, graphed.before, graphed.after, "the new session and order took no new KDA graph")
			require.Greater(t, graphed.replaysAfter, graphed.replaysBefore, "the KDA graphs were replayed for them")
			require.Equal(t, graphed.slots[1], graphed.newSlot[1], "the new session took the freed slot")
			require.Equal(t, int64(slabSize-3)*graphed.perSession, graphed.freeSlots)
			t.Logf("%d KDA graphs; replays %d, then %d; slots %v then %v", graphed.after, graphed.replaysBefore, graphed.replaysAfter, graphed.slots, graphed.newSlot)
		})
	}
}
