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
	err = b.MoERoute(&compute.RouteArgs{})
	require.ErrorIs(t, err, compute.ErrUnsupported)
	assert.Contains(t, err.Error(), "MoERoute")
	_, err = Open(Options{LibDirs: []string{fakeDir}, Device: 7})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "device 7")
}

// With HostFallback an unmapped operation runs on the host over copies
// of its buffers: the router against the pure-Go backend's.
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
	const T, E, K = 5, 16, 4
	la, lc := both(t, b, c, compute.F32, randF32(rng, T*E), T, E)
	ba, bc := both(t, b, c, compute.F32, randF32(rng, E), E)
	route := func(be compute.Backend, logits, bias compute.Tensor) ([]int32, []float32) {
		idx, err := be.Alloc(compute.I32, T, K)
		require.NoError(t, err)
		w, err := be.Alloc(compute.F32, T, K)
		require.NoError(t, err)
		require.NoError(t, be.MoERoute(&compute.RouteArgs{Logits: logits, Bias: bias, TopK: K, NumGroups: 4, TopKGroup: 2,
			Renormalize: true, Scale: 2.5, Indices: idx, Weights: w}))
		gi := make([]int32, T*K)
		require.NoError(t, be.Read(&gi, idx))
		return gi, read(t, be, w)
	}
	ia, wa := route(b, la, ba)
	ic, wc := route(c, lc, bc)
	assert.Equal(t, ic, ia)
	assert.Equal(t, wc, wa)
}
