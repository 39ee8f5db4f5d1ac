package ascend

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
)

// The host driver runs unmapped operations only with HostFallback, as a
// device does (over the same memory instead of copies).
func TestHostFallbackOnHostDriver(t *testing.T) {
	testHostFallback(t, OpenHost)
}

// testHostFallback runs an unmapped operation (the fused KDAStep) on a
// backend opened by open with HostFallback: bitwise the pure-Go backend's,
// with prepared (FRACTAL_NZ) weights among its operands. Without the
// option the call names the operation.
func testHostFallback(t *testing.T, open func(Options) (*Backend, error)) {
	b, err := open(Options{ArenaBytes: 8 << 20, HostFallback: true})
	require.NoError(t, err)
	defer b.Close()
	c := cpu.New(1)
	defer c.Close()
	rng := rand.New(rand.NewPCG(81, 82))
	const H, D, hidden, W, B = 2, 4, 8, 4, 2
	small := func(n int) []float32 {
		v := randF32(rng, n)
		for i := range v {
			v[i] *= 0.3
		}
		return v
	}
	shapes := [][]int{{3 * H * D, hidden}, {3 * H * D, W}, {D, hidden}, {H * D, D}, {H, hidden}, {D, hidden}, {H * D, D}, {D}, {hidden, H * D}, {H}, {H * D}}
	var wa, wc compute.KDAWeights
	fields := func(w *compute.KDAWeights) []*compute.Tensor {
		return []*compute.Tensor{&w.QKV, &w.Conv, &w.FA, &w.FB, &w.B, &w.GA, &w.GB, &w.ONorm, &w.OProj, &w.ALog, &w.DTBias}
	}
	fa, fc := fields(&wa), fields(&wc)
	for i, sh := range shapes {
		n := 1
		for _, d := range sh {
			n *= d
		}
		dt := compute.F32
		if len(sh) == 2 && i != 1 { // the projections in BF16, prepared in FRACTAL_NZ as a model loads them
			dt = compute.BF16
		}
		*fa[i], *fc[i] = both(t, b, c, dt, small(n), sh...)
		if dt == compute.BF16 {
			*fa[i], err = b.PrepareMatMul(*fa[i])
			require.NoError(t, err)
		}
	}
	for _, w := range []*compute.KDAWeights{&wa, &wc} {
		w.NumHeads, w.HeadDim, w.Gate, w.Eps = H, D, compute.GateSoftplus, 1e-5
	}
	xa, xc := both(t, b, c, compute.F32, randF32(rng, B*hidden), B, hidden)
	conv, state := small(B*(W-1)*3*H*D), small(B*H*D*D)
	ca, cc := both(t, b, c, compute.F32, conv, B, W-1, 3*H*D)
	sa, sc := both(t, b, c, compute.F32, state, B, H, D, D)
	step := func(be compute.Backend, w *compute.KDAWeights, x, conv, state compute.Tensor) [3][]float32 {
		y, err := be.Alloc(compute.F32, B, hidden)
		require.NoError(t, err)
		require.NoError(t, be.KDAStep(&compute.KDAStepArgs{W: w, X: x, Conv: conv, State: state, Y: y}))
		return [3][]float32{read(t, be, y), read(t, be, conv), read(t, be, state)}
	}
	want, got := step(c, &wc, xc, cc, sc), step(b, &wa, xa, ca, sa)
	for i, what := range []string{"output", "conv state", "recurrent state"} {
		require.Equal(t, want[i], got[i], what) // the same pure-Go arithmetic on the same bytes
	}

	// Without the option the same call names the operation.
	plain, err := open(Options{ArenaBytes: 4 << 20})
	require.NoError(t, err)
	defer plain.Close()
	err = plain.KDAStep(&compute.KDAStepArgs{})
	require.ErrorIs(t, err, compute.ErrUnsupported)
	assert.Contains(t, err.Error(), "KDAStep")
}
