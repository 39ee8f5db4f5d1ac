package kda

import (
	"fmt"
	"math"
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
		shapes := map[string][]int{
			"q_proj.weight": {hd, hidden}, "k_proj.weight": {hd, hidden}, "v_proj.weight": {hd, hidden},
			"q_conv1d.weight": {hd, 1, w}, "k_conv1d.weight": {hd, 1, w}, "v_conv1d.weight": {hd, 1, w},
			"f_a_proj.weight": {d, hidden}, "f_b_proj.weight": {hd, d}, "b_proj.weight": {h, hidden},
			"g_proj.weight": {hd, hidden}, "g_a_proj.weight": {d, hidden}, "g_b_proj.weight": {hd, d},
			"o_norm.weight": {d}, "o_proj.weight": {hidden, hd}, "A_log": {h}, "dt_bias": {hd},
		}
		src := func(name string) (compute.DType, []int, []byte, error) {
			shape, ok := shapes[name]
			if !ok {
				return 0, nil, nil, fmt.Errorf("missing tensor %s", name)
			}
			n := 1
			for _, s := range shape {
				n *= s
			}
			data := make([]byte, 4*n)
			for i, v := range randn(r, n, 0.2) {
				u := math.Float32bits(v)
				data[4*i], data[4*i+1], data[4*i+2], data[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
			}
			return compute.F32, shape, data, nil
		}
		kw, err := LoadWeights(b, cfg, src)
		require.NoError(t, err)
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
		require.NoError(t, l.Prefill(x, nil, st, y))
		require.NoError(t, l.Prefill(x, nil, plain, y))
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
			require.NoError(t, l.DecodeBatch(xt, []*State{st}, nil, recT, y1))
			require.NoError(t, l.Decode(xt, plain, y2))
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
			require.NoError(t, l.DecodeBatch(upload(t, b, xs, T, hidden), []*State{many}, []int32{0, int32(T)}, recs, ys))
			var wantY, wantRec []float32
			for i := range T {
				require.NoError(t, l.DecodeBatch(upload(t, b, xs[i*hidden:(i+1)*hidden], 1, hidden), []*State{st}, nil, recT, y1))
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
