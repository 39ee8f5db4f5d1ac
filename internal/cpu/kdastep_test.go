package cpu

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStepSplit checks that KDAStep's parts cover every item once, in
// order, and share the tokens about evenly whatever the counts.
func TestStepSplit(t *testing.T) {
	cases := [][]int32{
		{0, 1, 2, 3, 4, 5, 6, 7, 8},        // a decode batch
		{0, 1, 2, 3, 4, 5, 6, 7, 8, 20},    // eight decode rows and a 12-token run
		{0, 16},                            // one sequence
		{0, 9, 10, 11, 12, 13, 14, 15, 16}, // a long run first
	}
	for _, cu := range cases {
		for _, per := range []int{1, 3, 6} {
			for _, parts := range []int{1, 2, 3, 4} {
				j := &stepJob{cu: cu}
				j.split(per, parts)
				n := (len(cu) - 1) * per
				require.Len(t, j.bounds, parts+1)
				require.Equal(t, 0, j.bounds[0])
				require.Equal(t, n, j.bounds[parts])
				maxItem, total := 0, int(cu[len(cu)-1])*per
				for i := range n {
					maxItem = max(maxItem, j.tokens(i/per))
				}
				for p := range parts {
					require.LessOrEqual(t, j.bounds[p], j.bounds[p+1], "cu %v per %d parts %d: %v", cu, per, parts, j.bounds)
					cost := 0
					for i := j.bounds[p]; i < j.bounds[p+1]; i++ {
						cost += j.tokens(i / per)
					}
					// A part is off its share by at most one item.
					require.InDelta(t, float64(total)/float64(parts), float64(cost), float64(maxItem),
						"cu %v per %d parts %d: bounds %v", cu, per, parts, j.bounds)
				}
			}
		}
	}
}
