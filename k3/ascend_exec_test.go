package k3_test

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/ascend"
	"k3/k3"
)

// On the Ascend backend a decode step of static shapes launches its simple
// operations' executors again instead of preparing them (aclnn phase 1):
// after the first steps, most of a step's cached operations are reused.
// Without graphs, which would replay the feed-forward's instead.
func TestAscendDecodeReusesExecutors(t *testing.T) {
	configs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	require.NotEmpty(t, configs)
	for _, cfg := range configs {
		dir := filepath.Dir(cfg)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20})
			require.NoError(t, err)
			defer b.Close()
			m, err := k3.Load(context.Background(), dir, k3.WithComputeBackend(b), k3.WithoutGraphs())
			require.NoError(t, err)
			defer m.Close()
			s, err := m.NewSession()
			require.NoError(t, err)
			defer s.Close()
			_, err = s.Forward(context.Background(), []int32{1, 2, 3, 4, 5})
			require.NoError(t, err)
			var prepared, reused int64
			for step := range 6 {
				p0, r0 := b.Executors()
				w0, l0 := b.Waits(), b.Launches()
				_, err = s.Forward(context.Background(), []int32{int32(6 + step)})
				require.NoError(t, err)
				p1, r1 := b.Executors()
				prepared, reused = p1-p0, r1-r0
				t.Logf("decode step %d: %d operators launched, %d executors prepared, %d launched again; %d waits for the stream",
					step, b.Launches()-l0, prepared, reused, b.Waits()-w0)
			}
			require.Greater(t, reused, 3*prepared, "the last step reuses most of its executors")
		})
	}
}

// On a backend that captures graphs decode passes are captured whole and
// replayed: the logits of every step are bitwise those of
// the same model run eagerly (WithoutGraphs), for one session, for a
// batch of three, for a session whose positions cross into a new page
// and for runs of uneven lengths, and within the conformance tolerance of
// the pure-Go backend's. Nothing reads the
// device between the layers here (the conformance cases' traces do), so
// a missing ordering between the streams shows as wrong logits.
func TestAscendDecodeGraphs(t *testing.T) {
	configs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	ctx := context.Background()
	for _, cfg := range configs {
		dir := filepath.Dir(cfg)
		if k3.RaceEnabled && filepath.Base(dir) != "tiny_k31pro" {
			continue // the streams' ordering is the same code for every layout; K3.1 Pro has every layer kind
		}
		t.Run(filepath.Base(dir), func(t *testing.T) {
			run := func(opts ...k3.Option) ([][]float32, k3.GraphStats) {
				m, err := k3.Load(ctx, dir, opts...)
				require.NoError(t, err)
				defer m.Close()
				var out [][]float32
				s, err := m.NewSession()
				require.NoError(t, err)
				defer s.Close()
				l, err := s.Forward(ctx, []int32{1, 2, 3, 4, 5})
				require.NoError(t, err)
				out = append(out, l)
				for step := range 4 {
					l, err := s.Forward(ctx, []int32{int32(6 + step)})
					require.NoError(t, err)
					out = append(out, l)
				}
				bt, err := m.NewBatch(4) // three rows run as a bucket of four
				require.NoError(t, err)
				var ss []*k3.Session
				for i := range 3 {
					s, err := m.NewSession()
					require.NoError(t, err)
					defer s.Close()
					_, err = s.Forward(ctx, []int32{int32(7 + i), 3})
					require.NoError(t, err)
					ss = append(ss, s)
				}
				for step := range 4 {
					require.NoError(t, bt.Step(ctx, ss, []int32{int32(20 + step), int32(30 + step), int32(40 + step)}))
					for _, s := range ss {
						out = append(out, s.Logits())
					}
				}
				// A session crossing from its first page of cached positions
				// into its second: an attention graph per set of pages.
				long, err := m.NewSession()
				require.NoError(t, err)
				defer long.Close()
				prompt := make([]int32, 60)
				for i := range prompt {
					prompt[i] = int32(1 + i%13)
				}
				_, err = long.Forward(ctx, prompt)
				require.NoError(t, err)
				for step := range 8 {
					l, err := long.Forward(ctx, []int32{int32(3 + step)})
					require.NoError(t, err)
					out = append(out, l)
				}
				// Runs of uneven lengths over the same sessions: the same
				// rows and states, other row offsets, so another graph.
				for step := range 4 {
					runs := [][]int32{{int32(50 + step)}, {int32(60 + step), int32(70 + step)}}
					if step%2 == 1 {
						runs[0], runs[1] = runs[1], runs[0]
					}
					l, err := bt.Forward(ctx, ss[:2], runs)
					require.NoError(t, err)
					out = append(out, l)
				}
				return out, m.GraphStats()
			}
			onHost := func(opts ...k3.Option) ([][]float32, k3.GraphStats) {
				b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20})
				require.NoError(t, err)
				defer b.Close()
				return run(append(opts, k3.WithComputeBackend(b))...)
			}
			ref, _ := run()
			eager, es := onHost(k3.WithoutGraphs())
			graphed, gs := onHost()
			for i := range ref {
				scale := 0.0
				for _, v := range ref[i] {
					scale = math.Max(scale, math.Abs(float64(v)))
				}
				for j, v := range ref[i] {
					require.InDelta(t, v, eager[i][j], 1e-4*scale, "logits %d[%d] on ascend-host against the Go backend", i, j)
				}
			}
			require.Equal(t, k3.GraphStats{}, es)
			require.Equal(t, len(eager), len(graphed))
			for i := range eager {
				require.True(t, slices.Equal(eager[i], graphed[i]), "logits %d of %d differ (%+v)", i, len(eager), gs)
			}
			// The decode steps are captured whole (pieces apart are the
			// internal tests' TestSlabsServeNewSessions and
			// TestPageBucketsKeepGraphs).
			require.Positive(t, gs.StepsCaptured, "%+v", gs)
			require.Positive(t, gs.StepsReplayed, "%+v", gs)
			// Counted while the model was open: the graphs kept and their memory.
			require.Positive(t, gs.Kept, "%+v", gs)
			require.LessOrEqual(t, int64(gs.Kept), gs.Captured, "%+v", gs)
			require.Positive(t, gs.Bytes, "%+v", gs)
			t.Logf("%+v", gs)
		})
	}
}

// On the Ascend backend, which has no fused KDA step, a model loaded with
// WithRollback records its decode steps through the composition
// (KDAChunk's replay records) on the device, with no host fallback: a
// truncation replays them, and decoding the same tokens again gives the
// logits the first decode gave, within rounding.
func TestAscendRollbackRecords(t *testing.T) {
	configs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	ctx := context.Background()
	for _, cfg := range configs {
		dir := filepath.Dir(cfg)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20})
			require.NoError(t, err)
			defer b.Close()
			m, err := k3.Load(ctx, dir, k3.WithComputeBackend(b), k3.WithRollback(8))
			require.NoError(t, err)
			defer m.Close()
			toks := []int32{9, 7, 11, 6, 13, 8}
			out := decodeTruncated(t, m, toks, 2)
			first, again := out[:len(toks)], out[len(toks):]
			for i, l := range again {
				want := first[2+i]
				scale := 0.0
				for _, v := range want {
					scale = max(scale, math.Abs(float64(v)))
				}
				for j, v := range l {
					require.InDelta(t, want[j], v, 1e-4*scale, "step %d after the truncation, logit %d", i, j)
				}
			}
		})
	}
}

// With WithRollback, the decode steps that write replay records are
// captured into graphs too (each KDA layer's records in rows of their
// own, taken by the logs after the step): over decode steps, a truncation
// and the same tokens again, the logits are bitwise those of the model
// run eagerly, and steps were replayed.
func TestAscendRollbackGraphs(t *testing.T) {
	configs, err := filepath.Glob("../testdata/model/*/config.json")
	require.NoError(t, err)
	ctx := context.Background()
	for _, cfg := range configs {
		dir := filepath.Dir(cfg)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			run := func(opts ...k3.Option) ([][]float32, k3.GraphStats) {
				b, err := ascend.OpenHost(ascend.Options{ArenaBytes: 256 << 20})
				require.NoError(t, err)
				defer b.Close()
				m, err := k3.Load(ctx, dir, append(opts, k3.WithComputeBackend(b), k3.WithRollback(8))...)
				require.NoError(t, err)
				defer m.Close()
				return decodeTruncated(t, m, []int32{9, 7, 11, 6, 13, 8, 10}, 3), m.GraphStats()
			}
			eager, _ := run(k3.WithoutGraphs())
			graphed, gs := run()
			require.Equal(t, len(eager), len(graphed))
			for i := range eager {
				require.True(t, slices.Equal(eager[i], graphed[i]), "logits %d of %d differ (%+v)", i, len(eager), gs)
			}
			require.Positive(t, gs.StepsReplayed, "%+v", gs)
		})
	}
}

// decodeTruncated prefills five tokens on a new session of m, decodes toks
// one at a time, truncates back to the first kept of them and decodes
// toks[kept:] again; it returns the logits of every decode step, the
// first run's then the second's.
func decodeTruncated(t *testing.T, m *k3.Model, toks []int32, kept int) [][]float32 {
	t.Helper()
	ctx := context.Background()
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	_, err = s.Forward(ctx, []int32{1, 2, 3, 4, 5})
	require.NoError(t, err)
	var out [][]float32
	step := func(tok int32) {
		l, err := s.Forward(ctx, []int32{tok})
		require.NoError(t, err)
		out = append(out, slices.Clone(l))
	}
	for _, tok := range toks {
		step(tok)
	}
	require.NoError(t, s.Truncate(ctx, 5+kept))
	for _, tok := range toks[kept:] {
		step(tok)
	}
	return out
}
