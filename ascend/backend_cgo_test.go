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
	err = b.Attention(&compute.AttnArgs{})
	require.ErrorIs(t, err, compute.ErrUnsupported)
	assert.Contains(t, err.Error(), "Attention")
	_, err = Open(Options{LibDirs: []string{fakeDir}, Device: 7})
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.Contains(t, err.Error(), "device 7")
}

// With HostFallback an unmapped operation runs on the host over copies
// of its buffers: dense causal attention against the pure-Go backend's.
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
	const T, Hq, Hkv, D, L = 3, 2, 1, 8, 4
	qa, qc := both(t, b, c, compute.F32, randF32(rng, T*Hq*D), T, Hq, D)
	ka, kc := both(t, b, c, compute.F32, randF32(rng, L*Hkv*D), L, Hkv, D)
	va, vc := both(t, b, c, compute.F32, randF32(rng, L*Hkv*D), L, Hkv, D)
	attend := func(be compute.Backend, q, k, v compute.Tensor) []float32 {
		out, err := be.Alloc(compute.F32, T, Hq, D)
		require.NoError(t, err)
		require.NoError(t, be.Attention(&compute.AttnArgs{Q: q, K: k, V: v, QPos: []int32{1, 2, 3}, KVLen: L, Causal: true, Scale: 0.35, Out: out}))
		return read(t, be, out)
	}
	closeRel(t, attend(c, qc, kc, vc), attend(b, qa, ka, va), 1e-6, 1e-5, "attention")

	// Without the option the same call names the operation.
	plain, err := openACL(lib, Options{ArenaBytes: 4 << 20})
	require.NoError(t, err)
	defer plain.Close()
	err = plain.Attention(&compute.AttnArgs{})
	require.ErrorIs(t, err, compute.ErrUnsupported)
	assert.Contains(t, err.Error(), "Attention")
}
