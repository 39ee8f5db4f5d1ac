package k3

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/ascend"
)

// Speculative decoding with the DSpark module of the embedded model on
// the Ascend backend: the verification passes write replay records and
// the module's taps, and are captured into graphs like decode steps; the
// tokens are plain decoding's, the same with graphs and without, and
// steps were replayed.
func TestAscendDSparkGraphs(t *testing.T) {
	if raceEnabled {
		t.Skip("minutes under the race detector (the host driver's operators); the ragged and record-keeping captures run under it in TestAscendRollbackGraphs")
	}
	ctx := context.Background()
	run := func(opts ...Option) ([]int32, GraphStats) {
		b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20})
		require.NoError(t, err)
		defer b.Close()
		m, err := LoadTiny(ctx, append(opts, WithComputeBackend(b), WithRollback(8))...)
		require.NoError(t, err)
		defer m.Close()
		ds, err := m.NewDSpark()
		require.NoError(t, err)
		s, err := m.NewSession()
		require.NoError(t, err)
		defer s.Close()
		var ids []int32
		for tok, err := range s.GenerateTokens(ctx, m.Encode("func add(a, b int) int {\n"), WithMaxTokens(10), WithoutDefaultStops(), WithSpeculation(ds, 4)) {
			require.NoError(t, err)
			ids = append(ids, tok.ID)
		}
		plain, err := m.NewSession()
		require.NoError(t, err)
		defer plain.Close()
		var want []int32
		for tok, err := range plain.GenerateTokens(ctx, m.Encode("func add(a, b int) int {\n"), WithMaxTokens(10), WithoutDefaultStops()) {
			require.NoError(t, err)
			want = append(want, tok.ID)
		}
		require.Equal(t, want, ids, "speculation against plain decoding")
		return ids, m.GraphStats()
	}
	eager, _ := run(WithoutGraphs())
	graphed, gs := run()
	require.Equal(t, eager, graphed)
	require.Positive(t, gs.StepsReplayed, "%+v", gs)
}
