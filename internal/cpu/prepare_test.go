package cpu

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/floatx"
	"k3/internal/kernel"
)

// bf16Weight uploads a random bf16 weight [n, k] and returns it with its
// values.
func bf16Weight(t *testing.T, b *Backend, r *rand.Rand, n, k int) (compute.Tensor, []float32) {
	t.Helper()
	data := make([]byte, 2*n*k)
	vals := make([]float32, n*k)
	for i := range vals {
		h := floatx.BF16(float32(r.NormFloat64()))
		vals[i] = floatx.FromBF16(h)
		data[2*i], data[2*i+1] = byte(h), byte(h>>8)
	}
	w, err := b.FromHost(compute.BF16, compute.BF16, data, n, k)
	require.NoError(t, err)
	return w, vals
}

// TestPrepareMatMul: a prepared bf16 weight reads back as the weight,
// its products agree with the stored layout's within float32 summation
// error and give every row of up to 100 its result alone, bit for bit; a
// view of it is refused; narrow and f32 weights and the fast-bf16 backend
// keep theirs.
func TestPrepareMatMul(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(7, 8))
	const n = kernel.KMajorMinN + 17
	if b.packing() == 0 {
		w, _ := bf16Weight(t, b, r, n, 96)
		p, err := b.PrepareMatMul(w)
		require.NoError(t, err)
		assert.Equal(t, w, p, "without the k-major or AMX tiles the weight stays as stored")
		t.Skip("neither the k-major nor the AMX tiles run on this path")
	}
	// Under AMX, a weight of three k-blocks (96 columns) is laid out
	// k-major, one of five (160) for the tiles.
	for _, k := range []int{96, 160} {
		want := b.packing()
		if want == amxTiles && k == 96 {
			want = kMajor
		}
		t.Run(fmt.Sprint(k), func(t *testing.T) { testPrepared(t, b, r, n, k, want) })
	}
	for _, k := range []int{96, 160} {
		t.Run(fmt.Sprint("others/", k), func(t *testing.T) { testPreparedOthers(t, b, r, n, k) })
	}
}

// testPrepared checks a prepared weight [n, k] and that its layout is
// layout.
func testPrepared(t *testing.T, b *Backend, r *rand.Rand, n, k int, layout packing) {
	w, vals := bf16Weight(t, b, r, n, k)
	p, err := b.PrepareMatMul(w)
	require.NoError(t, err)
	_, how, err := packedOf(p)
	require.NoError(t, err)
	require.Equal(t, layout, how, "the layout of a [%d %d] weight", n, k)
	require.Equal(t, w.Dims, p.Dims)
	back := make([]float32, n*k)
	require.NoError(t, b.Read(back, p))
	require.Equal(t, vals, back)

	const most = 100
	xs := make([]float32, most*k)
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
	}
	x, err := b.Alloc(compute.F32, most, k)
	require.NoError(t, err)
	require.NoError(t, b.Write(x, xs))
	stored, err := b.Alloc(compute.F32, most, n)
	require.NoError(t, err)
	prepared, err := b.Alloc(compute.F32, most, n)
	require.NoError(t, err)
	require.NoError(t, b.MatMul(stored, x, w))
	require.NoError(t, b.MatMul(prepared, x, p))
	got, want := F32(prepared), F32(stored)
	for i := range want {
		var mag float64
		for q := 0; q < k; q++ {
			mag += math.Abs(float64(xs[i/n*k+q] * vals[i%n*k+q]))
		}
		require.InDelta(t, want[i], got[i], float64(k)*0x1p-23*mag, "element %d", i)
	}
	one, err := b.Alloc(compute.F32, 1, n)
	require.NoError(t, err)
	for i := 0; i < most; i++ {
		require.NoError(t, b.MatMul(one, x.Rows(i, i+1), p))
		require.Equal(t, got[i*n:(i+1)*n], F32(one), "row %d alone", i)
	}

	wide, err := b.Alloc(compute.F32, 2, 2*n)
	require.NoError(t, err)
	err = b.MatMul(wide, x.Rows(0, 1).Reshape(2, k/2), p.Reshape(2*n, k/2))
	require.Error(t, err)
	assert.True(t, errors.Is(err, compute.ErrShape), "%v", err)
}

// testPreparedOthers checks that narrow and f32 weights keep their layout
// and what the fast-bf16 backend does with one of [n, k].
func testPreparedOthers(t *testing.T, b *Backend, r *rand.Rand, n, k int) {
	const most = 100
	xs := make([]float32, most*k)
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
	}
	narrow, _ := bf16Weight(t, b, r, kernel.KMajorMinN-1, k)
	pn, err := b.PrepareMatMul(narrow)
	require.NoError(t, err)
	assert.Equal(t, narrow, pn, "a weight narrower than KMajorMinN stays as stored")

	f, err := b.Alloc(compute.F32, n, k)
	require.NoError(t, err)
	pf, err := b.PrepareMatMul(f)
	require.NoError(t, err)
	assert.Equal(t, f, pf)
	fast := NewFastBF16(1)
	defer fast.Close()
	wf, fv := bf16Weight(t, fast, r, n, k)
	pw, err := fast.PrepareMatMul(wf)
	require.NoError(t, err)
	if fast.packing() == 0 {
		assert.Equal(t, wf, pw, "the fast backend keeps the stored layout for the bf16 dot product")
		return
	}
	// With AMX tiles the fast backend packs too, and the long products of
	// a weight on the tiles round x to bf16 (2^-8 of the magnitude), its
	// short ones stay exact. A weight it lays out k-major (too shallow for
	// the tiles, or where the bf16 dot product does not pay) has every
	// product exact.
	_, how, err := packedOf(pw)
	require.NoError(t, err)
	roundsX := how == amxTiles
	for _, rows := range []int{most, 1} {
		xf, err := fast.Alloc(compute.F32, rows, k)
		require.NoError(t, err)
		require.NoError(t, fast.Write(xf, xs[:rows*k]))
		yf, err := fast.Alloc(compute.F32, rows, n)
		require.NoError(t, err)
		require.NoError(t, fast.MatMul(yf, xf, pw))
		for i, v := range F32(yf) {
			var want, mag float64
			for q := 0; q < k; q++ {
				want += float64(xs[i/n*k+q]) * float64(fv[i%n*k+q])
				mag += math.Abs(float64(xs[i/n*k+q] * fv[i%n*k+q]))
			}
			tol := float64(k) * 0x1p-23 * mag
			if roundsX && rows >= kernel.PackedMinRows {
				tol = 0x1p-8 * mag
			}
			require.InDelta(t, want, v, tol, "fast backend, %d rows, element %d", rows, i)
		}
	}
}
