package k3

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGroupMemoryBudget: a pass that one rank's budget refuses is refused
// by every rank before its collectives, and the group goes on. Under TP 3
// the ranks hold KDA states of unequal size (heads that do not divide), so
// a budget between their needs refuses on one rank alone; under TP 2 both
// refuse. The budget is set from the ranks' usage and growth measured on a
// group without one.
func TestGroupMemoryBudget(t *testing.T) {
	ctx := context.Background()
	prompt := []int32{5, 9, 17}
	long := make([]int32, 200)
	for i := range long {
		long[i] = int32(i*7%500 + 1)
	}
	for _, l := range []Layout{{TP: 3}, {TP: 2}, {TP: 2, EP: 2}} {
		t.Run(l.String(), func(t *testing.T) {
			free, err := LoadGroup(ctx, groupTestDir, l)
			require.NoError(t, err)
			gs := groupSession(t, free, prompt)
			fork, err := gs.Fork() // as below
			require.NoError(t, err)
			var lo, hi int64 // the least and most a rank needs for the long run
			for r, s := range gs.ranks {
				need := free.ranks[r].mem.used + s.growth(len(long))
				if r == 0 || need < lo {
					lo = need
				}
				hi = max(hi, need)
			}
			held := free.ranks[0].mem.used
			require.NoError(t, fork.Close())
			require.NoError(t, gs.Close())
			require.NoError(t, free.Close())
			budget := hi - 1 // every rank that needs hi refuses
			if l.TP == 3 {
				require.Less(t, lo, hi, "ranks of unequal shares")
				budget = (lo + hi) / 2 // some ranks fit, some do not
			}

			g, err := LoadGroup(ctx, groupTestDir, l, WithMemoryBudget(budget))
			require.NoError(t, err)
			defer g.Close()
			gs = groupSession(t, g, prompt)
			want, err := gs.Fork()
			require.NoError(t, err)
			defer want.Close()

			_, err = gs.Forward(ctx, long)
			require.ErrorIs(t, err, ErrMemoryBudget)
			assert.Contains(t, err.Error(), "the session's tokens", "the refusing rank's own error")
			assert.Equal(t, len(prompt), gs.Len(), "nothing fed")
			for r, m := range g.ranks {
				assert.LessOrEqual(t, m.mem.used, budget, "rank %d gave back what it took", r)
			}
			n := 0
			for _, err := range gs.GenerateTokens(ctx, long, WithMaxTokens(2)) {
				require.ErrorIs(t, err, ErrMemoryBudget)
				n++
			}
			assert.Equal(t, 1, n, "the generation refused at its prompt")

			// The group goes on: the same pass on a copy of the sequence
			// gives the same logits as on the sequence.
			got, err := gs.Forward(ctx, []int32{7, 8})
			require.NoError(t, err, "the group still runs")
			again, err := want.Forward(ctx, []int32{7, 8})
			require.NoError(t, err)
			assert.Equal(t, again, got)

			// A budget that holds the prompt refuses the decode step that
			// needs a new page, mid-generation; the tokens drawn stay.
			tight, err := LoadGroup(ctx, groupTestDir, l, WithMemoryBudget(held))
			require.NoError(t, err)
			defer tight.Close()
			gs = groupSession(t, tight, prompt)
			n, err = 0, nil
			for _, e := range gs.GenerateTokens(ctx, nil, WithMaxTokens(400), WithTemperature(0), WithoutDefaultStops()) {
				if e != nil {
					err = e
					break
				}
				n++
			}
			require.ErrorIs(t, err, ErrMemoryBudget)
			assert.Greater(t, n, 10, "tokens before the page")
			assert.Equal(t, len(prompt)+n, gs.Len())
			require.NoError(t, gs.Truncate(ctx, len(prompt)))
			got, err = gs.Forward(ctx, []int32{7, 8})
			require.NoError(t, err, "the group still runs")
			assert.Equal(t, again, got)
		})
	}
}
