package k3

import (
	"context"
	"math"
	"slices"
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

// A Batcher on the Ascend backend over a model that keeps replay logs:
// several sequences decode in shared, captured passes whose records each
// layer keeps in rows of its own, and each sequence's tokens are those it
// generates alone.
func TestAscendBatcherRollbackLogs(t *testing.T) {
	ctx := context.Background()
	b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20})
	require.NoError(t, err)
	defer b.Close()
	m, err := Load(ctx, tinyDir, WithComputeBackend(b), WithRollback(8))
	require.NoError(t, err)
	defer m.Close()
	prompts := [][]int32{{1, 2, 3}, {4, 5, 6, 7, 8}, {9, 10}}
	opts := []GenerateOption{WithMaxTokens(8), WithoutDefaultStops()}
	var want [][]int32
	for _, p := range prompts {
		s, err := m.NewSession()
		require.NoError(t, err)
		var ids []int32
		for tok, err := range s.GenerateTokens(ctx, p, opts...) {
			require.NoError(t, err)
			ids = append(ids, tok.ID)
		}
		s.Close()
		want = append(want, ids)
	}
	br, err := m.NewBatcher(len(prompts))
	require.NoError(t, err)
	bctx, stop := context.WithCancel(ctx)
	defer func() { stop(); br.Wait() }()
	require.NoError(t, br.Start(bctx))
	got := make([][]int32, len(prompts))
	errs := make(chan error, len(prompts))
	sessions := make([]*Session, len(prompts))
	for i := range sessions {
		sessions[i], err = m.NewSession()
		require.NoError(t, err)
		defer sessions[i].Close()
	}
	for i, p := range prompts {
		go func() {
			s := sessions[i]
			for tok, err := range br.GenerateTokens(ctx, s, p, opts...) {
				if err != nil {
					errs <- err
					return
				}
				got[i] = append(got[i], tok.ID)
			}
			errs <- nil
		}()
	}
	for range prompts {
		require.NoError(t, <-errs)
	}
	require.Equal(t, want, got)
	require.Positive(t, m.GraphStats().StepsReplayed)
	// Each session's logs hold its own records: three tokens back and
	// forward again give the logits of the same tokens fed afresh.
	for i, s := range sessions {
		n := s.Len()
		toks := slices.Clone(s.tokens[:n])
		require.NoError(t, s.Truncate(ctx, n-3))
		ref, err := m.NewSession()
		require.NoError(t, err)
		defer ref.Close()
		_, err = ref.Forward(ctx, toks[:n-3])
		require.NoError(t, err)
		var got, wantL []float32
		for _, tk := range toks[n-3:] {
			got, err = s.Forward(ctx, []int32{tk})
			require.NoError(t, err)
			wantL, err = ref.Forward(ctx, []int32{tk})
			require.NoError(t, err)
		}
		scale := 0.0
		for _, v := range wantL {
			scale = max(scale, math.Abs(float64(v)))
		}
		for j := range wantL {
			require.InDelta(t, wantL[j], got[j], 1e-4*scale, "sequence %d, logit %d after its truncation", i, j)
		}
	}
}
