//go:build ascend && cgo

package ascend

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/ascend/internal/acl"
	"k3/compute"
	"k3/internal/cpu"
)

var fakeDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fakecann")
	if err != nil {
		panic(err)
	}
	if err := acl.BuildFake(dir, filepath.Join("internal", "acl", "testdata", "fakecann")); err != nil {
		panic(err)
	}
	fakeDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func init() {
	drivers = append(drivers, struct {
		name string
		open func(t *testing.T, arena int) *Backend
	}{"acl-fake", fakeBackend})
}

// fakeBackend is the backend on the fake CANN. TestOpenWithoutCANN runs
// before any test that loads it.
func fakeBackend(t *testing.T, arena int) *Backend {
	t.Helper()
	lib, err := acl.Load(acl.Options{LibDirs: []string{fakeDir}})
	require.NoError(t, err)
	loadedFake = true
	b, err := openACL(lib, Options{ArenaBytes: arena})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, b.Close()) })
	return b
}

// Open loads CANN and opens the device; an operation not mapped yet says
// so by name.
func TestOpenFake(t *testing.T) {
	b, err := Open(Options{LibDirs: []string{fakeDir}, Device: 1, ArenaBytes: 4 << 20})
	loadedFake = true
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, "ascend", b.Name())
	err = b.KDAStep(&compute.KDAStepArgs{})
	require.ErrorIs(t, err, compute.ErrUnsupported)
	assert.Contains(t, err.Error(), "KDAStep")
	_, err = Open(Options{LibDirs: []string{fakeDir}, Device: 7})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "device 7")
}

// With HostFallback an unmapped operation runs on the host over copies
// of its buffers: a fused KDA decode step against the pure-Go backend's,
// its output and the conv and recurrent states it updates in place, with
// its projections prepared in FRACTAL_NZ (read back unpacked, never
// written back).
func TestHostFallback(t *testing.T) {
	lib, err := acl.Load(acl.Options{LibDirs: []string{fakeDir}})
	require.NoError(t, err)
	loadedFake = true
	b, err := openACL(lib, Options{ArenaBytes: 8 << 20, HostFallback: true})
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
	plain, err := openACL(lib, Options{ArenaBytes: 4 << 20})
	require.NoError(t, err)
	defer plain.Close()
	err = plain.KDAStep(&compute.KDAStepArgs{})
	require.ErrorIs(t, err, compute.ErrUnsupported)
	assert.Contains(t, err.Error(), "KDAStep")
}
