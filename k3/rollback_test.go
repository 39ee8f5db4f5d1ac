package k3

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func kdaStates(t *testing.T, s *Session) [][]float32 {
	t.Helper()
	var out [][]float32
	for _, st := range s.kdaSt {
		if st == nil {
			continue
		}
		v := make([]float32, st.S.Len()+st.Conv.Len())
		require.NoError(t, s.m.b.Read(v[:st.S.Len()], st.S))
		require.NoError(t, s.m.b.Read(v[st.S.Len():], st.Conv))
		out = append(out, v)
	}
	return out
}

// TestSpeculativeLoop: 200 rounds of drafting a random number of tokens,
// verifying them in one exact pass and keeping a random prefix (Truncate
// within the rollback depth) leave logits and KDA states bitwise equal to
// feeding the kept tokens one at a time, on every testdata model.
func TestSpeculativeLoop(t *testing.T) {
	dirs := testModels(t)
	ctx := context.Background()
	for _, cfgPath := range dirs {
		dir := filepath.Dir(cfgPath)
		m, err := Load(ctx, dir, WithRollback(ExactTokens))
		require.NoError(t, err)
		r := rand.New(rand.NewPCG(21, uint64(len(dir))))
		v := int32(m.VocabSize())
		prompt := make([]int32, 24)
		for i := range prompt {
			prompt[i] = r.Int32N(v)
		}
		spec, err := m.NewSession()
		require.NoError(t, err)
		base, err := m.NewSession()
		require.NoError(t, err)
		_, err = spec.Forward(ctx, prompt)
		require.NoError(t, err)
		_, err = base.Forward(ctx, prompt)
		require.NoError(t, err)
		fast := 0
		rounds := 200
		if testing.Short() {
			rounds = 40
		}
		for round := range rounds {
			if spec.Len()+8 > m.ContextLength() {
				break
			}
			k := 1 + r.IntN(7)
			drafts := make([]int32, k)
			for i := range drafts {
				drafts[i] = r.Int32N(v)
			}
			p := spec.Len()
			_, err := spec.Forward(ctx, drafts)
			require.NoError(t, err)
			a := r.IntN(k + 1)
			require.NoError(t, spec.Truncate(ctx, p+a))
			if minBase(spec) < p+a {
				fast++
			}
			for _, d := range drafts[:a] {
				_, err := base.Forward(ctx, []int32{d})
				require.NoError(t, err)
			}
			if a == 0 { // nothing kept: the baseline's logits are from before the drafts
				require.Equal(t, base.Len(), spec.Len())
			}
			require.Equal(t, base.Tokens(), spec.Tokens(), "round %d", round)
			require.Equal(t, base.Logits(), spec.Logits(), "%s round %d: k %d kept %d", filepath.Base(dir), round, k, a)
			if round%25 == 0 {
				require.Equal(t, kdaStates(t, base), kdaStates(t, spec), "round %d states", round)
			}
		}
		if hasKDA, _, _ := kinds(m.Config); hasKDA { // the logs are KDA's
			assert.Greater(t, fast, 10, "%s: rollbacks that replayed from the logs", filepath.Base(dir))
		}
		m.Close()
	}
}

// minBase is the oldest checkpoint of the session's logs (its position
// when there are none): a Truncate that replays leaves it below the
// truncation point, a rebuild moves it up to it.
func minBase(s *Session) int {
	b := s.Len()
	for _, lg := range s.logs {
		if lg != nil {
			b = min(b, lg.Base())
		}
	}
	return b
}

// TestTruncateDepth: within the rollback depth Truncate replays, beyond it
// it rebuilds; both give what never going further gives; WithRollback(0)
// keeps no logs and still truncates correctly.
func TestTruncateDepth(t *testing.T) {
	ctx := context.Background()
	for _, depth := range []int{0, 4, ExactTokens, 40} {
		m, err := Load(ctx, tinyDir, WithRollback(depth))
		require.NoError(t, err)
		prompt := m.Encode("func main() {")
		full, _ := m.NewSession()
		gen := collect(t, full.GenerateTokens(ctx, prompt, WithMaxTokens(50), WithoutDefaultStops()))
		require.Len(t, gen, 50)
		for _, back := range []int{1, 3, depth, depth + 1, 30} {
			if back < 1 || back > 45 {
				continue
			}
			s, err := full.Clone()
			require.NoError(t, err)
			n := s.Len() - back
			require.NoError(t, s.Truncate(ctx, n))
			ref, _ := m.NewSession()
			_, err = ref.Forward(ctx, s.Tokens())
			require.NoError(t, err)
			// A chunked prefill of the kept tokens may differ in rounding:
			// compare it within the tolerance, and the rollback against
			// token-by-token feeding exactly.
			one, _ := m.NewSession()
			_, err = one.Forward(ctx, prompt)
			require.NoError(t, err)
			for _, tok := range s.Tokens()[len(prompt):] {
				_, err := one.Forward(ctx, []int32{tok})
				require.NoError(t, err)
			}
			assert.Equal(t, n, s.Len())
			replayed := minBase(s) < n
			if depth > 0 && back <= depth {
				assert.True(t, replayed, "depth %d back %d: expected a replay", depth, back)
			}
			if replayed {
				assert.Equal(t, one.Logits(), s.Logits(), "depth %d back %d", depth, back)
			}
			closeLogits(t, "truncated against a fresh prefill", ref.Logits(), s.Logits())
		}
		assert.ErrorIs(t, full.Truncate(ctx, full.Len()+1), ErrOutOfRange)
		m.Close()
	}
	_, err := Load(ctx, tinyDir, WithRollback(-1))
	assert.Error(t, err)
}

// TestSnapshots: with snapshots every 16 tokens (the newest 4 kept) and no
// replay logs, Truncate restores the newest snapshot before the cut and
// reruns at most an interval; bitwise what decoding the kept tokens one by
// one gives when the rerun fits one exact pass, and a rebuild (within the
// prefill tolerance) when the cut is older than every snapshot kept.
func TestSnapshots(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithSnapshots(16, 4))
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode("0123456789")
	decoded := func() *Session { // the prompt, then 100 tokens one step at a time
		s, _ := m.NewSession()
		gen := collect(t, s.GenerateTokens(ctx, prompt, WithMaxTokens(100), WithoutDefaultStops()))
		require.Len(t, gen, 100)
		return s
	}
	s := decoded()
	var pos []int
	for _, sn := range s.snaps {
		pos = append(pos, sn.pos)
	}
	require.Equal(t, []int{48, 64, 80, 96}, pos, "snapshot positions (the last pass ends at 110)")
	plain, _ := m.NewSession()
	assert.Greater(t, s.StateBytes(), plain.StateBytes(), "snapshots count in the state")

	reference := func(n int) *Session {
		r, _ := m.NewSession()
		_, err := r.Forward(ctx, prompt)
		require.NoError(t, err)
		for _, tok := range s.Tokens()[len(prompt):n] {
			_, err := r.Forward(ctx, []int32{tok})
			require.NoError(t, err)
		}
		return r
	}
	for _, n := range []int{105, 90, 81} { // snapshots at 96, 80, 80: reruns of 9, 10 and 1
		c := decoded()
		require.NoError(t, c.Truncate(ctx, n))
		assert.Equal(t, reference(n).Logits(), c.Logits(), "truncate to %d", n)
	}
	// Older than every snapshot kept: a rebuild.
	require.NoError(t, s.Truncate(ctx, 30))
	closeLogits(t, "rebuilt", reference(30).Logits(), s.Logits())
	_, err = Load(ctx, tinyDir, WithSnapshots(16, 0))
	assert.Error(t, err)
}

// TestSnapshotsWithLogs: a snapshot restore rebases the replay logs, and
// rollbacks within their depth work from there.
func TestSnapshotsWithLogs(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithSnapshots(16, 4), WithRollback(4))
	require.NoError(t, err)
	defer m.Close()
	prompt := m.Encode("0123456789")
	s, _ := m.NewSession()
	collect(t, s.GenerateTokens(ctx, prompt, WithMaxTokens(100), WithoutDefaultStops()))
	toks := s.Tokens()
	require.NoError(t, s.Truncate(ctx, 90)) // logs reach 4 back: the snapshot at 80
	require.NoError(t, s.Truncate(ctx, 88)) // within the logs again
	r, _ := m.NewSession()
	_, err = r.Forward(ctx, prompt)
	require.NoError(t, err)
	for _, tok := range toks[len(prompt):88] {
		_, err := r.Forward(ctx, []int32{tok})
		require.NoError(t, err)
	}
	assert.Equal(t, r.Logits(), s.Logits())
	assert.Equal(t, kdaStates(t, r), kdaStates(t, s))
}

// TestRollbackDropsLaterSnapshots: a snapshot taken after the position a
// rollback within the logs returns to holds tokens the session no longer
// has; a later Truncate beyond the logs must not restore it.
func TestRollbackDropsLaterSnapshots(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithSnapshots(8, 8), WithRollback(16))
	require.NoError(t, err)
	defer m.Close()
	s, _ := m.NewSession()
	first := m.Encode("abcdefghijklmnopqrst") // 20 tokens: snapshots at 8 and 16
	for _, tok := range first {
		_, err := s.Forward(ctx, []int32{tok})
		require.NoError(t, err)
	}
	require.NoError(t, s.Truncate(ctx, 12)) // within the logs: the snapshot at 16 is stale now
	second := m.Encode("ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEFGHIJKLMNOPQRSTUVWXYZ")
	for _, tok := range second {
		_, err := s.Forward(ctx, []int32{tok})
		require.NoError(t, err)
	}
	want := s.Tokens()[:18]
	require.NoError(t, s.Truncate(ctx, 18)) // beyond the logs: restores a snapshot at or before 17
	r, _ := m.NewSession()
	_, err = r.Forward(ctx, want)
	require.NoError(t, err)
	assert.Equal(t, want, s.Tokens())
	assert.InDeltaSlice(t, r.Logits(), s.Logits(), 1e-4)
}

// TestRecorderRows: a session's workspace records replay rows for the
// exact runs it can run (ExactTokens), not for its prefill chunk, and a
// batch sized for fewer exact rows than a pass brings refuses the pass
// before it runs, with an error naming both.
func TestRecorderRows(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, tinyDir, WithRollback(4))
	require.NoError(t, err)
	defer m.Close()
	ws, err := m.newWorkspace()
	require.NoError(t, err)
	require.Equal(t, ExactTokens, ws.bt.rec.max)
	require.Equal(t, ExactTokens, ws.bt.rec.dev.Dim(0)/max(1, blocksOf(ws.bt.rec)))

	bt, err := m.newBatchExact(32, 4)
	require.NoError(t, err)
	s, err := m.NewSession()
	require.NoError(t, err)
	defer s.Close()
	_, err = bt.Forward(ctx, []*Session{s}, [][]int32{{1, 2, 3, 4}})
	require.NoError(t, err)
	_, err = bt.Forward(ctx, []*Session{s}, [][]int32{{5, 6, 7, 8, 9}})
	require.ErrorContains(t, err, "5 exact rows")
	require.ErrorContains(t, err, "records 4")
	// Refused before the pass ran: the session goes on.
	require.Equal(t, 4, s.Len())
	_, err = s.Forward(ctx, []int32{5})
	require.NoError(t, err)
}

// blocksOf is the number of layers' row blocks a recorder holds.
func blocksOf(r *recorder) int {
	if !r.perLayer {
		return 1
	}
	n := 0
	for _, s := range r.slot {
		if s >= 0 {
			n++
		}
	}
	return n
}
