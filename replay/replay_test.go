package replay

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/internal/kernel"
)

// token is one KDA step's inputs for every head.
type token struct {
	k, a, q []float32 // [H*DK]: unit-norm key, decay factors, query
	v       []float32 // [H*DV]
	beta    []float32 // [H]
	x       []float32 // [C] conv input
}

func randToken(r *rand.Rand, s Shape) token {
	t := token{k: make([]float32, s.Heads*s.DK), a: make([]float32, s.Heads*s.DK), q: make([]float32, s.Heads*s.DK),
		v: make([]float32, s.Heads*s.DV), beta: make([]float32, s.Heads), x: make([]float32, s.ConvChannels)}
	for h := range s.Heads {
		var n float64
		k := t.k[h*s.DK : (h+1)*s.DK]
		for i := range k {
			k[i] = float32(r.NormFloat64())
			n += float64(k[i]) * float64(k[i])
		}
		for i := range k {
			k[i] = float32(float64(k[i]) / math.Sqrt(n))
		}
		t.beta[h] = float32(r.Float64())
	}
	for i := range t.a {
		t.a[i] = float32(math.Exp(-r.Float64())) // g in (-1, 0]
		t.q[i] = float32(r.NormFloat64())
	}
	for i := range t.v {
		t.v[i] = float32(r.NormFloat64())
	}
	for i := range t.x {
		t.x[i] = float32(r.NormFloat64())
	}
	return t
}

// step runs one decode step on a V-first state and conv window with the
// arithmetic of the decode kernel's Go twin (kernel.KDARows: u from the
// dot with the pre-decayed key, then RowUpdateDot), and returns the
// token's record and output.
func step(s Shape, state, conv []float32, t token) (Record, []float32) {
	rec := Record{K: t.k, A: t.a, U: make([]float32, s.Heads*s.DV), X: t.x}
	out := make([]float32, s.Heads*s.DV)
	ke := make([]float32, s.DK)
	for h := range s.Heads {
		k, a, q := t.k[h*s.DK:(h+1)*s.DK], t.a[h*s.DK:(h+1)*s.DK], t.q[h*s.DK:(h+1)*s.DK]
		for i := range ke {
			ke[i] = k[i] * a[i]
		}
		for v := range s.DV {
			row := state[(h*s.DV+v)*s.DK : (h*s.DV+v+1)*s.DK]
			u := t.beta[h] * (t.v[h*s.DV+v] - kernel.Dot(row, ke))
			rec.U[h*s.DV+v] = u
			out[h*s.DV+v] = kernel.RowUpdateDot(row, a, k, q, u)
		}
	}
	if w := s.ConvWidth - 1; w > 0 {
		c := s.ConvChannels
		copy(conv, conv[c:w*c])
		copy(conv[(w-1)*c:], t.x)
	}
	return rec, out
}

var shapes = []Shape{
	{Heads: 2, DK: 16, DV: 16, ConvChannels: 96, ConvWidth: 4},
	{Heads: 3, DK: 8, DV: 5, ConvChannels: 7, ConvWidth: 2},  // DV != DK, one-row window
	{Heads: 1, DK: 13, DV: 9, ConvChannels: 0, ConvWidth: 0}, // no conv; DK not a multiple of 8
}

// TestStateAtEqualsRecurrence: the state replayed to every position equals
// the state the decode steps produced, bitwise, across several moves of
// the checkpoint; and it matches an independent float64 recurrence of the
// equations (S = (I - β k kᵀ) Diag(α) S + β k vᵀ, K-first).
func TestStateAtEqualsRecurrence(t *testing.T) {
	for _, s := range shapes {
		r := rand.New(rand.NewPCG(1, uint64(s.DK)))
		l, err := NewLog(s, Config{Interval: 5, MaxSpeculative: 3})
		require.NoError(t, err)
		state, conv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
		ref := make([]float64, s.StateLen()) // [H, DK, DV]
		got, gotConv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
		for pos := 1; pos <= 23; pos++ {
			tok := randToken(r, s)
			rec, _ := step(s, state, conv, tok)
			require.NoError(t, l.Append(rec))
			require.NoError(t, l.Commit(1))
			require.Equal(t, pos, l.Pos())
			for p := l.Base(); p <= l.Pos(); p++ {
				require.NoError(t, l.StateAt(p, got, gotConv))
			}
			require.NoError(t, l.StateAt(pos, got, gotConv))
			require.Equal(t, state, got, "shape %+v position %d", s, pos)
			require.Equal(t, conv, gotConv, "conv window at %d", pos)

			// The equations in float64, K-first, from the inputs alone.
			for h := range s.Heads {
				S := ref[h*s.DK*s.DV : (h+1)*s.DK*s.DV]
				k, a := tok.k[h*s.DK:(h+1)*s.DK], tok.a[h*s.DK:(h+1)*s.DK]
				for i := range s.DK {
					for j := range s.DV {
						S[i*s.DV+j] *= float64(a[i])
					}
				}
				for j := range s.DV { // S += β k (v - Sᵀk)ᵀ
					var pred float64
					for i := range s.DK {
						pred += S[i*s.DV+j] * float64(k[i])
					}
					d := float64(tok.beta[h]) * (float64(tok.v[h*s.DV+j]) - pred)
					for i := range s.DK {
						S[i*s.DV+j] += float64(k[i]) * d
					}
				}
				for i := range s.DK {
					for j := range s.DV {
						assert.InDelta(t, S[i*s.DV+j], got[(h*s.DV+j)*s.DK+i], 1e-4, "position %d head %d [%d,%d]", pos, h, i, j)
					}
				}
			}
		}
		require.Greater(t, l.Base(), 0, "the checkpoint moved")
	}
}

// TestSpeculationLoop: 200 steps of random draft lengths and random
// acceptance give the same states as decoding the accepted tokens one by
// one; verification never writes the checkpoint; StateAt reads the
// speculative records too.
func TestSpeculationLoop(t *testing.T) {
	s := shapes[0]
	r := rand.New(rand.NewPCG(7, 7))
	const maxK = 7
	l, err := NewLog(s, Config{Interval: 16, MaxSpeculative: maxK + 1})
	require.NoError(t, err)
	base, baseConv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	spec, specConv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	got, gotConv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	flushes := 0
	for it := range 200 {
		k := r.IntN(maxK + 1)
		// A verification pass over k drafts plus the bonus position: it
		// starts from the committed state and appends k+1 records.
		require.NoError(t, l.StateAt(l.Pos(), spec, specConv))
		ck, ckConv, _ := l.Checkpoint()
		ckCopy, ckConvCopy := append([]float32(nil), ck...), append([]float32(nil), ckConv...)
		toks := make([]token, k+1)
		for i := range toks {
			toks[i] = randToken(r, s)
			rec, _ := step(s, spec, specConv, toks[i])
			require.NoError(t, l.Append(rec))
		}
		require.Equal(t, ckCopy, ck, "verification wrote the checkpoint (step %d)", it)
		require.Equal(t, ckConvCopy, ckConv)
		require.NoError(t, l.StateAt(l.Pos()+k+1, got, gotConv))
		require.Equal(t, spec, got, "state at the end of the speculative window")

		a := r.IntN(k + 2) // accept a of the k+1 positions
		before := l.Base()
		require.NoError(t, l.Commit(a))
		if l.Base() != before {
			flushes++
		}
		for _, tok := range toks[:a] {
			step(s, base, baseConv, tok)
		}
		require.NoError(t, l.StateAt(l.Pos(), got, gotConv))
		require.Equal(t, base, got, "step %d: k %d accepted %d", it, k, a)
		require.Equal(t, baseConv, gotConv)
		require.Zero(t, l.Speculative())
	}
	assert.Greater(t, flushes, 5)
}

// TestCorruptRecord: a wrong record changes the replayed state (the
// comparison above is not vacuous).
func TestCorruptRecord(t *testing.T) {
	s := shapes[0]
	r := rand.New(rand.NewPCG(3, 3))
	l, err := NewLog(s, Config{})
	require.NoError(t, err)
	state, conv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	for range 5 {
		rec, _ := step(s, state, conv, randToken(r, s))
		require.NoError(t, l.Append(rec))
	}
	require.NoError(t, l.Commit(5))
	l.record(2).U[3] += 1e-3
	got, gotConv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	require.NoError(t, l.StateAt(5, got, gotConv))
	assert.NotEqual(t, state, got)
}

// TestRewindThenReappend: rewinding and appending the same tokens again
// equals never having gone further; and errors name what is out of range.
func TestRewindThenReappend(t *testing.T) {
	s := shapes[1]
	r := rand.New(rand.NewPCG(5, 5))
	l, err := NewLog(s, Config{Interval: 8, MaxSpeculative: 2})
	require.NoError(t, err)
	state, conv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	var states [][]float32
	var toks []token
	for range 6 {
		tok := randToken(r, s)
		rec, _ := step(s, state, conv, tok)
		require.NoError(t, l.Append(rec))
		require.NoError(t, l.Commit(1))
		toks = append(toks, tok)
		states = append(states, append([]float32(nil), state...))
	}
	require.NoError(t, l.Rewind(3))
	assert.Equal(t, 3, l.Pos())
	st, cv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	require.NoError(t, l.StateAt(3, st, cv))
	for _, tok := range toks[3:] {
		rec, _ := step(s, st, cv, tok)
		require.NoError(t, l.Append(rec))
		require.NoError(t, l.Commit(1))
	}
	got, gotConv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	require.NoError(t, l.StateAt(6, got, gotConv))
	assert.Equal(t, states[5], got)
	assert.Equal(t, conv, gotConv)

	assert.ErrorIs(t, l.StateAt(7, got, gotConv), ErrRange)
	assert.ErrorIs(t, l.Rewind(-1), ErrRange)
	assert.ErrorIs(t, l.Commit(1), ErrRange, "nothing speculative")
	rec, _ := step(s, st, cv, randToken(r, s))
	require.NoError(t, l.Append(rec))
	require.NoError(t, l.Append(rec))
	assert.ErrorIs(t, l.Append(rec), ErrFull)
	assert.Error(t, l.Append(Record{K: rec.K}), "short record")
	_, err = NewLog(Shape{Heads: 0, DK: 1, DV: 1}, Config{})
	assert.Error(t, err)
	_, err = NewLog(s, Config{Interval: -1})
	assert.Error(t, err)

	l.Reset()
	assert.Equal(t, 0, l.Pos())
	require.NoError(t, l.StateAt(0, got, gotConv))
	assert.Equal(t, make([]float32, s.StateLen()), got)
}

// TestMemory: one checkpoint and a ring of Interval+K+1 records against a
// state copy per draft position, at the 100M preset's KDA shape and K = 7.
func TestMemory(t *testing.T) {
	s := Shape{Heads: 6, DK: 128, DV: 128, ConvChannels: 3 * 6 * 128, ConvWidth: 4}
	const k = 7
	l, err := NewLog(s, Config{Interval: 16, MaxSpeculative: k + 1})
	require.NoError(t, err)
	perCopy := 4 * int64(s.StateLen()+s.ConvLen())
	copies := (k + 1) * perCopy
	t.Logf("per layer: replay log %d bytes (checkpoint %d + ring of %d records x %d bytes); a copy per position at K=%d: %d bytes (%.2fx the log)",
		l.Bytes(), perCopy, 16+k+1, 4*s.RecordLen(), k, copies, float64(copies)/float64(l.Bytes()))
	assert.Less(t, l.Bytes(), copies)
}

func BenchmarkReplay16(b *testing.B) {
	s := Shape{Heads: 6, DK: 128, DV: 128, ConvChannels: 3 * 6 * 128, ConvWidth: 4}
	r := rand.New(rand.NewPCG(1, 1))
	l, _ := NewLog(s, Config{Interval: 17, MaxSpeculative: 1})
	state, conv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	for range 16 {
		rec, _ := step(s, state, conv, randToken(r, s))
		l.Append(rec)
		l.Commit(1)
	}
	b.SetBytes(4 * int64(s.StateLen()))
	b.ResetTimer()
	for range b.N {
		l.StateAt(16, state, conv)
	}
}

// TestKeep: with Keep, the newest Keep positions stay one replay away
// after every move of the checkpoint; Rebase and CopyFrom carry state.
func TestKeep(t *testing.T) {
	s := shapes[0]
	r := rand.New(rand.NewPCG(13, 13))
	const keep = 5
	l, err := NewLog(s, Config{Interval: 9, MaxSpeculative: 2, Keep: keep})
	require.NoError(t, err)
	state, conv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	states := [][]float32{append([]float32(nil), state...)}
	got, gotConv := make([]float32, s.StateLen()), make([]float32, s.ConvLen())
	for pos := 1; pos <= 40; pos++ {
		rec, _ := step(s, state, conv, randToken(r, s))
		flat := append(append(append(append([]float32(nil), rec.K...), rec.A...), rec.U...), rec.X...)
		require.NoError(t, l.AppendFlat(flat))
		require.NoError(t, l.Commit(1))
		states = append(states, append([]float32(nil), state...))
		require.LessOrEqual(t, l.Base(), max(pos-keep, 0), "position %d: base %d", pos, l.Base())
		for p := max(pos-keep, 0); p <= pos; p++ {
			require.NoError(t, l.StateAt(p, got, gotConv))
			require.Equal(t, states[p], got, "position %d, state at %d", pos, p)
		}
	}
	c, err := NewLog(s, Config{Interval: 9, MaxSpeculative: 2, Keep: keep})
	require.NoError(t, err)
	require.NoError(t, c.CopyFrom(l))
	require.NoError(t, c.StateAt(38, got, gotConv))
	assert.Equal(t, states[38], got)
	other, _ := NewLog(s, Config{})
	assert.Error(t, other.CopyFrom(l))

	require.NoError(t, l.Rebase(40, func(st, cv []float32) error { copy(st, state); copy(cv, conv); return nil }))
	assert.Equal(t, 40, l.Pos())
	require.NoError(t, l.StateAt(40, got, gotConv))
	assert.Equal(t, state, got)
	_, err = NewLog(s, Config{Interval: 4, Keep: 4})
	assert.Error(t, err, "keep must be below the interval")
}
