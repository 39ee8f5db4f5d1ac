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
//
// A call of at most compute.InvariantRows rows computes the projections of
// both kinds in one product each (Layer.mixed); a longer one keeps them
// apart; both are checked.
func TestForwardPacked(t *testing.T) {
	for _, lens := range [][]int{
		{1, 5, 2, 40, 3, 19}, // 70 rows
		{1, 5, 2, 12, 3, 7},  // 30 rows: one product per weight
	} {
		t.Run(fmt.Sprint(lens), func(t *testing.T) { testForwardPacked(t, lens) })
	}
}

func testForwardPacked(t *testing.T, lens []int) {
	b := cpu.New(2)
	defer b.Close()
	const hidden = 40
	cfg := Config{Hidden: hidden, NumHeads: 2, HeadDim: 16, ConvKernel: 4, LowerBound: -5, Eps: 1e-5, ChunkSize: 16}
	r := rand.New(rand.NewPCG(3, 3))
	kw := randomWeights(t, b, cfg, r)
	const exact = 3 // the first three sequences are exact runs
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

// TestStepGivenProjections: the fused step fed its projections
// (KDAStepArgs.QKVIn and the rest) and asked for its core gives, after
// o_proj, the bits and states of the step that computes them itself;
// projections or a core of the wrong shape are errors.
func TestStepGivenProjections(t *testing.T) {
	b := cpu.New(2)
	defer b.Close()
	const hidden, n = 40, 6
	cfg := Config{Hidden: hidden, NumHeads: 2, HeadDim: 16, ConvKernel: 4, LowerBound: -5, Eps: 1e-5, ChunkSize: 16}
	r := rand.New(rand.NewPCG(9, 9))
	kw := randomWeights(t, b, cfg, r)
	l, err := NewLayer(b, cfg, kw, n)
	require.NoError(t, err)
	hd := cfg.NumHeads * cfg.HeadDim
	x := upload(t, b, randn(r, n*hidden, 1), n, hidden)
	cu := []int32{0, 2, 3, 6}
	states := func() []*State {
		var sts []*State
		for range 3 {
			st, err := NewState(b, cfg, 1)
			require.NoError(t, err)
			sts = append(sts, st)
		}
		return sts
	}
	args := func(sts []*State) compute.KDAStepArgs {
		a := compute.KDAStepArgs{W: kw, X: x, CuSeqlens: cu}
		for _, st := range sts {
			a.Convs = append(a.Convs, st.Conv.Reshape(st.Conv.Dims[1], st.Conv.Dims[2]))
			a.States = append(a.States, st.S.Reshape(st.S.Dims[1], st.S.Dims[2], st.S.Dims[3]))
		}
		return a
	}
	plain, given := states(), states()
	for step := range 3 {
		a := args(plain)
		a.Y, _ = b.Alloc(compute.F32, n, hidden)
		require.NoError(t, b.KDAStep(&a))

		require.NoError(t, l.project(x, n))
		g := args(given)
		g.QKVIn, g.GIn, g.BetaIn, g.GateIn = l.raw.Rows(0, n), l.graw.Rows(0, n), l.beta.Rows(0, n), l.gate.Rows(0, n)
		g.Core, _ = b.Alloc(compute.F32, n, hd)
		require.NoError(t, b.KDAStep(&g))
		y, _ := b.Alloc(compute.F32, n, hidden)
		require.NoError(t, b.MatMul(y, g.Core, kw.OProj))
		require.Equal(t, read(t, b, a.Y), read(t, b, y), "step %d output", step)
		for i := range plain {
			require.Equal(t, read(t, b, plain[i].S), read(t, b, given[i].S), "step %d, sequence %d state", step, i)
			require.Equal(t, read(t, b, plain[i].Conv), read(t, b, given[i].Conv), "step %d, sequence %d conv window", step, i)
		}
	}

	before := read(t, b, given[0].S)
	short, _ := b.Alloc(compute.F32, n-1, 3*hd)
	g := args(given)
	g.QKVIn, g.GIn, g.BetaIn, g.GateIn = short, l.graw.Rows(0, n), l.beta.Rows(0, n), l.gate.Rows(0, n)
	g.Core, _ = b.Alloc(compute.F32, n, hd)
	assert.ErrorContains(t, b.KDAStep(&g), "q|k|v in")
	g.QKVIn = l.raw.Rows(0, n)
	g.Core, _ = b.Alloc(compute.F32, n, hd+1)
	assert.ErrorContains(t, b.KDAStep(&g), "kda step core")
	require.Equal(t, before, read(t, b, given[0].S), "a refused call changed a state")
}
