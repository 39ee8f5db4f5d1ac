package kda

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
	"k3/replay"
)

// TestDecodeRecordsReplay: the records a layer's decode steps emit, fed to
// a ReplaySSM log, give back the layer's recurrent state and conv window
// at every position, bitwise; recording changes nothing of the step.
func TestDecodeRecordsReplay(t *testing.T) {
	for _, fullRank := range []bool{true, false} {
		b := cpu.New(2)
		const hidden, h, d, w = 48, 3, 16, 4
		cfg := Config{Hidden: hidden, NumHeads: h, HeadDim: d, ConvKernel: w, LowerBound: -5, FullRankGate: fullRank, Eps: 1e-5}
		r := rand.New(rand.NewPCG(9, 9))
		hd := h * d
		kw := randomWeights(t, b, cfg, r)
		l, err := NewLayer(b, cfg, kw, 8)
		require.NoError(t, err)
		plain, err := NewState(b, cfg, 1) // decoded without records
		require.NoError(t, err)
		st, err := NewState(b, cfg, 1)
		require.NoError(t, err)

		// A prefill, then decode steps; the log's checkpoint is the state
		// after the prefill.
		x := upload(t, b, randn(r, 5*hidden, 1), 5, hidden)
		y, _ := b.Alloc(compute.F32, 5, hidden)
		chunk := func(st *State) *Seqs { return &Seqs{Cu: []int32{0, 5}, States: []*State{st}} }
		exact := func(st *State, n int, rec compute.Tensor) *Seqs {
			return &Seqs{Cu: []int32{0, int32(n)}, States: []*State{st}, Exact: 1, Records: rec}
		}
		require.NoError(t, l.Forward(x, chunk(st), y))
		require.NoError(t, l.Forward(x, chunk(plain), y))
		shape := replay.Shape{Heads: h, DK: d, DV: d, ConvChannels: 3 * hd, ConvWidth: w}
		log, err := replay.NewLog(shape, replay.Config{Interval: 4, MaxSpeculative: 1})
		require.NoError(t, err)
		require.NoError(t, log.SetCheckpoint(5, read(t, b, st.S), read(t, b, st.Conv)))

		recT, _ := b.Alloc(compute.F32, 1, RecordLen(cfg))
		y1, _ := b.Alloc(compute.F32, 1, hidden)
		y2, _ := b.Alloc(compute.F32, 1, hidden)
		gotS, gotConv := make([]float32, shape.StateLen()), make([]float32, shape.ConvLen())
		for step := range 11 {
			xt := upload(t, b, randn(r, hidden, 1), 1, hidden)
			require.NoError(t, l.Forward(xt, exact(st, 1, recT), y1))
			require.NoError(t, l.Forward(xt, exact(plain, 1, compute.Tensor{}), y2))
			require.Equal(t, read(t, b, y2), read(t, b, y1), "recording changed the output (step %d)", step)
			rec := read(t, b, recT)
			require.NoError(t, log.Append(replay.Record{K: rec[:hd], A: rec[hd : 2*hd], U: rec[2*hd : 3*hd], X: rec[3*hd:]}))
			require.NoError(t, log.Commit(1))
			require.NoError(t, log.StateAt(log.Pos(), gotS, gotConv))
			require.Equal(t, read(t, b, st.S), gotS, "state after decode step %d", step)
			require.Equal(t, read(t, b, st.Conv), gotConv, "conv window after decode step %d", step)
		}
		assert.Greater(t, log.Base(), 5, "the checkpoint moved forward")

		// T tokens in one call equal T single steps, bitwise, records too.
		for _, T := range []int{2, 7, 16} {
			xs := randn(r, T*hidden, 1)
			many, err := NewState(b, cfg, 1)
			require.NoError(t, err)
			require.NoError(t, b.Copy(many.S, st.S))
			require.NoError(t, b.Copy(many.Conv, st.Conv))
			recs, _ := b.Alloc(compute.F32, T, RecordLen(cfg))
			ys, _ := b.Alloc(compute.F32, T, hidden)
			require.NoError(t, l.Forward(upload(t, b, xs, T, hidden), exact(many, T, recs), ys))
			var wantY, wantRec []float32
			for i := range T {
				require.NoError(t, l.Forward(upload(t, b, xs[i*hidden:(i+1)*hidden], 1, hidden), exact(st, 1, recT), y1))
				wantY = append(wantY, read(t, b, y1)...)
				wantRec = append(wantRec, read(t, b, recT)...)
			}
			require.Equal(t, wantY, read(t, b, ys), "T=%d outputs", T)
			require.Equal(t, wantRec, read(t, b, recs), "T=%d records", T)
			require.Equal(t, read(t, b, st.S), read(t, b, many.S), "T=%d state", T)
			require.Equal(t, read(t, b, st.Conv), read(t, b, many.Conv), "T=%d conv window", T)
		}
		b.Close()
	}
}

// noStep is a backend without the fused decode step: the layer composes
// it from smaller operations.
type noStep struct{ compute.Backend }

func (noStep) KDAStep(*compute.KDAStepArgs) error { return compute.ErrUnsupported }

// TestComposedRecordsReplay: where the backend lacks the fused step, the
// composition writes the replay records (KDAChunk's Records): fed to a
// ReplaySSM log they give back its state and conv window bitwise, they
// match the fused step's records within rounding, and T tokens in one
// call record what T single steps do, bitwise.
func TestComposedRecordsReplay(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	const hidden, h, d, w = 48, 3, 16, 4
	cfg := Config{Hidden: hidden, NumHeads: h, HeadDim: d, ConvKernel: w, LowerBound: -5, Eps: 1e-5}
	r := rand.New(rand.NewPCG(10, 10))
	hd := h * d
	kw := randomWeights(t, b, cfg, r)
	composed, err := NewLayer(noStep{b}, cfg, kw, 16)
	require.NoError(t, err)
	fused, err := NewLayer(b, cfg, kw, 16)
	require.NoError(t, err)
	st, err := NewState(b, cfg, 1)
	require.NoError(t, err)
	ref, err := NewState(b, cfg, 1) // the fused step's
	require.NoError(t, err)
	exact := func(st *State, n int, rec compute.Tensor) *Seqs {
		return &Seqs{Cu: []int32{0, int32(n)}, States: []*State{st}, Exact: 1, Records: rec}
	}
	x := upload(t, b, randn(r, 5*hidden, 1), 5, hidden)
	y, _ := b.Alloc(compute.F32, 5, hidden)
	for _, s := range []*State{st, ref} {
		require.NoError(t, fused.Forward(x, &Seqs{Cu: []int32{0, 5}, States: []*State{s}}, y))
	}
	shape := replay.Shape{Heads: h, DK: d, DV: d, ConvChannels: 3 * hd, ConvWidth: w}
	log, err := replay.NewLog(shape, replay.Config{Interval: 4, MaxSpeculative: 1})
	require.NoError(t, err)
	require.NoError(t, log.SetCheckpoint(5, read(t, b, st.S), read(t, b, st.Conv)))
	recT, _ := b.Alloc(compute.F32, 1, RecordLen(cfg))
	refT, _ := b.Alloc(compute.F32, 1, RecordLen(cfg))
	y1, _ := b.Alloc(compute.F32, 1, hidden)
	gotS, gotConv := make([]float32, shape.StateLen()), make([]float32, shape.ConvLen())
	for step := range 9 {
		xt := upload(t, b, randn(r, hidden, 1), 1, hidden)
		require.NoError(t, composed.Forward(xt, exact(st, 1, recT), y1))
		require.True(t, composed.Composes(), "the layer composes the step")
		require.NoError(t, fused.Forward(xt, exact(ref, 1, refT), y1))
		rec := read(t, b, recT)
		require.InDeltaSlice(t, read(t, b, refT), rec, 1e-5, "records against the fused step's (step %d)", step)
		require.NoError(t, log.Append(replay.Record{K: rec[:hd], A: rec[hd : 2*hd], U: rec[2*hd : 3*hd], X: rec[3*hd:]}))
		require.NoError(t, log.Commit(1))
		require.NoError(t, log.StateAt(log.Pos(), gotS, gotConv))
		require.Equal(t, read(t, b, st.S), gotS, "state after step %d", step)
		require.Equal(t, read(t, b, st.Conv), gotConv, "conv window after step %d", step)
	}
	for _, T := range []int{2, 9, 16} {
		xs := randn(r, T*hidden, 1)
		many, err := NewState(b, cfg, 1)
		require.NoError(t, err)
		require.NoError(t, b.Copy(many.S, st.S))
		require.NoError(t, b.Copy(many.Conv, st.Conv))
		recs, _ := b.Alloc(compute.F32, T, RecordLen(cfg))
		ys, _ := b.Alloc(compute.F32, T, hidden)
		require.NoError(t, composed.Forward(upload(t, b, xs, T, hidden), exact(many, T, recs), ys))
		var wantRec []float32
		for i := range T {
			require.NoError(t, composed.Forward(upload(t, b, xs[i*hidden:(i+1)*hidden], 1, hidden), exact(st, 1, recT), y1))
			wantRec = append(wantRec, read(t, b, recT)...)
		}
		require.Equal(t, wantRec, read(t, b, recs), "T=%d records", T)
		require.Equal(t, read(t, b, st.S), read(t, b, many.S), "T=%d state", T)
	}
}
