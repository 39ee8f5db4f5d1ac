package k3

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// cutStopScan is the stop-string cut as a search: the text before the
// first stop string, or what may be released and the longest suffix that
// begins some stop string, each prefix of each string tried at the end.
func cutStopScan(text string, stops []string) (out, held string, stop bool) {
	if first := indexAny(text, stops); first >= 0 {
		return text[:first], "", true
	}
	keep := 0
	for _, s := range stops {
		for k := min(len(s)-1, len(text)); k > keep; k-- {
			if strings.HasSuffix(text, s[:k]) {
				keep = k
				break
			}
		}
	}
	return text[:len(text)-keep], text[len(text)-keep:], false
}

// TestStopMatcher feeds random pieces to a generation's stop matcher and
// to the search, side by side, over stop strings of a three-letter
// alphabet that overlap, repeat and contain one another, and checks that
// both release, hold and cut the same text at every piece.
func TestStopMatcher(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte("abc"[r.IntN(3)])
		}
		return b.String()
	}
	for trial := range 3000 {
		stops := make([]string, 1+r.IntN(4))
		for i := range stops {
			switch r.IntN(4) {
			case 0:
				stops[i] = strings.Repeat(word(1+r.IntN(3)), 1+r.IntN(6)) // periodic
			case 1:
				stops[i] = word(40 + r.IntN(80)) // longer than the pieces
			default:
				stops[i] = word(1 + r.IntN(8))
			}
		}
		g := &generation{o: &genOptions{stopStrings: stops}, stops: newStopMatcher(stops)}
		held := ""
		for step := range 200 {
			piece := word(r.IntN(6))
			wantOut, wantHeld, wantStop := cutStopScan(held+piece, stops)
			out, gHeld, stop := g.cutStop(g.held+piece, piece)
			g.held = gHeld
			require.Equal(t, wantStop, stop, "trial %d step %d: stops %q", trial, step, stops)
			require.Equal(t, wantOut, out, "trial %d step %d: stops %q", trial, step, stops)
			require.Equal(t, wantHeld, gHeld, "trial %d step %d: stops %q", trial, step, stops)
			held = wantHeld
			if stop {
				break
			}
		}
	}
}
