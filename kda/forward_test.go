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
)

// randomWeights loads a layer of cfg with N(0, 0.2) f32 weights.
func randomWeights(t testing.TB, b compute.Backend, cfg Config, r *rand.Rand) *compute.KDAWeights {
	h, d, hidden, w := cfg.NumHeads, cfg.HeadDim, cfg.Hidden, cfg.ConvKernel
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
	return kw
}

// TestForwardPacked: one Forward over exact runs and prefill chunks of
// several sequences gives each sequence what it gets alone: the exact ones
// bitwise, the chunks within the conformance tolerance, states included.
func TestForwardPacked(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	const hidden = 40
	cfg := Config{Hidden: hidden, NumHeads: 2, HeadDim: 16, ConvKernel: 4, LowerBound: -5, Eps: 1e-5, ChunkSize: 16}
	r := rand.New(rand.NewPCG(3, 3))
	kw := randomWeights(t, b, cfg, r)
	lens := []int{1, 5, 2, 40, 3, 19} // the first three exact
	const exact = 3
	total := 0
	cu := []int32{0}
	for _, n := range lens {
		total += n
		cu = append(cu, int32(total))
	}
	l, err := NewLayer(b, cfg, kw, total)
	require.NoError(t, err)
	xs := randn(r, total*hidden, 1)

	// Every sequence starts from a state a prefill of its own left.
	warm := func() []*State {
		var sts []*State
		for i := range lens {
			st, err := NewState(b, cfg, 1)
			require.NoError(t, err)
			n := 3 + i
			y, _ := b.Alloc(compute.F32, n, hidden)
			require.NoError(t, l.Forward(upload(t, b, randn(rand.New(rand.NewPCG(uint64(i), 7)), n*hidden, 1), n, hidden),
				&Seqs{Cu: []int32{0, int32(n)}, States: []*State{st}}, y))
			sts = append(sts, st)
		}
		return sts
	}
	together, alone := warm(), warm()
	y, _ := b.Alloc(compute.F32, total, hidden)
	require.NoError(t, l.Forward(upload(t, b, xs, total, hidden), &Seqs{Cu: cu, States: together, Exact: exact}, y))
	got := read(t, b, y)
	for i, n := range lens {
		r0, r1 := int(cu[i]), int(cu[i+1])
		yi, _ := b.Alloc(compute.F32, n, hidden)
		one := &Seqs{Cu: []int32{0, int32(n)}, States: alone[i : i+1]}
		if i < exact {
			one.Exact = 1
		}
		require.NoError(t, l.Forward(upload(t, b, xs[r0*hidden:r1*hidden], n, hidden), one, yi))
		want := read(t, b, yi)
		if i < exact {
			require.Equal(t, want, got[r0*hidden:r1*hidden], "exact sequence %d output", i)
			require.Equal(t, read(t, b, alone[i].S), read(t, b, together[i].S), "exact sequence %d state", i)
			require.Equal(t, read(t, b, alone[i].Conv), read(t, b, together[i].Conv), "exact sequence %d conv", i)
			continue
		}
		assert.InDeltaSlice(t, want, got[r0*hidden:r1*hidden], 1e-4, "chunk %d output", i)
		assert.InDeltaSlice(t, read(t, b, alone[i].S), read(t, b, together[i].S), 1e-4, "chunk %d state", i)
		assert.Equal(t, read(t, b, alone[i].Conv), read(t, b, together[i].Conv), "chunk %d conv window", i)
	}

	// Bad descriptions are errors, not panics, and change no state.
	before := read(t, b, together[0].S)
	x1 := upload(t, b, xs[:2*hidden], 2, hidden)
	y1, _ := b.Alloc(compute.F32, 2, hidden)
	many, _ := NewState(b, cfg, 2)
	for _, bad := range []*Seqs{
		{Cu: []int32{0, 2}},
		{Cu: []int32{0, 1}, States: together[:1]},
		{Cu: []int32{1, 2}, States: together[:1]},
		{Cu: []int32{0, 2}, States: together[:1], Exact: 2},
		{Cu: []int32{0, 0, 2}, States: together[:2]},
		{Cu: []int32{0, 2}, States: []*State{nil}},
		{Cu: []int32{0, 2}, States: []*State{many}},
	} {
		assert.Error(t, l.Forward(x1, bad, y1), "Forward accepted %+v", *bad)
	}
	require.Equal(t, before, read(t, b, together[0].S), "a refused call changed a state")
	small, err := NewLayer(b, cfg, kw, 1)
	require.NoError(t, err)
	assert.Error(t, small.Forward(x1, &Seqs{Cu: []int32{0, 2}, States: together[:1]}, y1), "2 prefill rows for a layer sized for 1")
	require.NoError(t, small.Forward(x1, &Seqs{Cu: []int32{0, 2}, States: together[:1], Exact: 1}, y1), "exact rows need no scratch")
}
