package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
)

// TestCausalConvRows: CausalConv over packed sequences, whichever of its
// paths takes each row and channel (the four-tap vector kernel for rows
// whose taps all fall in x, the general path for the rest and for other
// widths), gives the bits of the general path run over everything, and
// leaves the same states.
func TestCausalConvRows(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(31, 32))
	for _, c := range []struct {
		ch, w int
		lens  []int32
	}{{2312, 4, []int32{1, 3, 4, 5, 40}}, {64, 4, []int32{256}}, {40, 3, []int32{7, 2}}, {48, 4, []int32{2, 9}}} {
		total := 0
		cu := []int32{0}
		for _, l := range c.lens {
			total += int(l)
			cu = append(cu, int32(total))
		}
		n := len(c.lens)
		xv, wv := randSlice(r, total*c.ch, 3), randSlice(r, c.ch*c.w, 1)
		sv := randSlice(r, n*(c.w-1)*c.ch, 3)
		x, _ := b.Alloc(compute.F32, total, c.ch)
		wt, _ := b.Alloc(compute.F32, c.ch, c.w)
		st, _ := b.Alloc(compute.F32, n, c.w-1, c.ch)
		out, _ := b.Alloc(compute.F32, total, c.ch)
		require.NoError(t, b.Write(x, xv))
		require.NoError(t, b.Write(wt, wv))
		require.NoError(t, b.Write(st, sv))
		require.NoError(t, b.CausalConv(&compute.ConvArgs{X: x, Weight: wt, State: st, Out: out, CuSeqlens: cu}))

		// The general path alone, sequence by sequence.
		taps := make([]float32, c.w*c.ch)
		for ch := 0; ch < c.ch; ch++ {
			for tap := 0; tap < c.w; tap++ {
				taps[tap*c.ch+ch] = wv[ch*c.w+tap]
			}
		}
		want := make([]float32, total*c.ch)
		wantState := append([]float32(nil), sv...)
		for s := 0; s < n; s++ {
			t0, t1 := int(cu[s]), int(cu[s+1])
			j := &convJob{out: want[t0*c.ch : t1*c.ch], x: xv[t0*c.ch : t1*c.ch], wT: taps,
				state: wantState[s*(c.w-1)*c.ch : (s+1)*(c.w-1)*c.ch], t: t1 - t0, ch: c.ch, w: c.w}
			convRows(j, 0, c.ch, 0, j.t)
			convState(j, 0, c.ch)
		}
		got := make([]float32, total*c.ch)
		require.NoError(t, b.Read(got, out))
		gotState := make([]float32, len(sv))
		require.NoError(t, b.Read(gotState, st))
		for i := range want {
			require.Equal(t, math.Float32bits(want[i]), math.Float32bits(got[i]), "ch %d width %d: output %d", c.ch, c.w, i)
		}
		require.Equal(t, wantState, gotState, "ch %d width %d: states", c.ch, c.w)
	}
}

// TestConvTapsFollowWeights: the transposed taps CausalConv keeps with a
// conv weight's storage are the weight's own: two views of one buffer
// (different offsets) each get theirs, and writing new values into a
// weight drops them, so the next call convolves with the new values.
func TestConvTapsFollowWeights(t *testing.T) {
	b := New(1)
	defer b.Close()
	const ch, w, n = 32, 4, 5
	r := rand.New(rand.NewPCG(33, 34))
	both, _ := b.Alloc(compute.F32, 2, ch, w)
	xv := randSlice(r, n*ch, 1)
	x, _ := b.Alloc(compute.F32, n, ch)
	require.NoError(t, b.Write(x, xv))
	conv := func(wt compute.Tensor) []float32 {
		st, _ := b.Alloc(compute.F32, 1, w-1, ch)
		out, _ := b.Alloc(compute.F32, n, ch)
		require.NoError(t, b.CausalConv(&compute.ConvArgs{X: x, Weight: wt, State: st, Out: out}))
		got := make([]float32, n*ch)
		require.NoError(t, b.Read(got, out))
		return got
	}
	// want convolves x (zero state) with weights wv, as convSeq's general
	// path does.
	want := func(wv []float32) []float32 {
		taps := make([]float32, w*ch)
		for c := range ch {
			for tap := range w {
				taps[tap*ch+c] = wv[c*w+tap]
			}
		}
		out := make([]float32, n*ch)
		j := &convJob{out: out, x: xv, wT: taps, state: make([]float32, (w-1)*ch), t: n, ch: ch, w: w}
		convRows(j, 0, ch, 0, n)
		return out
	}
	first, second := both.Rows(0, 1).Reshape(ch, w), both.Rows(1, 2).Reshape(ch, w)
	var cur []float32 // both's values
	for round := range 3 {
		wv := randSlice(r, 2*ch*w, 1)
		if round < 2 {
			require.NoError(t, b.Write(both, wv))
			cur = wv
		} else {
			// A view's write drops the buffer's taps.
			require.NoError(t, b.Write(second, wv[ch*w:]))
			copy(cur[ch*w:], wv[ch*w:])
		}
		require.Equal(t, want(cur[:ch*w]), conv(first), "round %d: the first view", round)
		require.Equal(t, want(cur[ch*w:]), conv(second), "round %d: the second view", round)
	}
}

// BenchmarkCausalConv times the 100M preset's short conv over a 256-token
// prefill chunk (q|k|v, 2304 channels, four taps).
func BenchmarkCausalConv(b *testing.B) {
	be := New(0)
	defer be.Close()
	const t, ch, w = 256, 2304, 4
	r := rand.New(rand.NewPCG(1, 2))
	x, _ := be.Alloc(compute.F32, t, ch)
	wt, _ := be.Alloc(compute.F32, ch, w)
	st, _ := be.Alloc(compute.F32, 1, w-1, ch)
	out, _ := be.Alloc(compute.F32, t, ch)
	require.NoError(b, be.Write(x, randSlice(r, t*ch, 1)))
	require.NoError(b, be.Write(wt, randSlice(r, ch*w, 1)))
	a := &compute.ConvArgs{X: x, Weight: wt, State: st, Out: out}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := be.CausalConv(a); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(t*ch)*float64(b.N)/b.Elapsed().Seconds()/1e9, "Goutputs/s")
}
