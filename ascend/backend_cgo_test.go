//go:build ascend && cgo

package ascend

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/ascend/internal/acl"
	"k3/compute"
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
	fusedDrivers = append(fusedDrivers, struct {
		name string
		open func(Options) (*Backend, error)
	}{"acl-fake", func(o Options) (*Backend, error) {
		lib, err := acl.Load(acl.Options{LibDirs: []string{fakeDir}})
		if err != nil {
			return nil, err
		}
		loadedFake = true
		return openACL(lib, o)
	}})
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
	testHostFallback(t, func(o Options) (*Backend, error) { return openACL(lib, o) })
}
