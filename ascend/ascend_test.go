package ascend

import (
	"testing"

	"k3/ascend/internal/acl"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadedFake is set once a test of this process has loaded the fake
// CANN: Load is once per process, so later Opens get it whatever LibDirs
// they pass.
var loadedFake bool

// Without the ascend tag Open says how to build; with it, on a machine
// without CANN, it names the library it could not load and the fix.
func TestOpenWithoutCANN(t *testing.T) {
	if loadedFake {
		t.Skip("the fake CANN is loaded in this process (-count or -shuffle)")
	}
	b, err := Open(Options{LibDirs: []string{t.TempDir()}})
	require.Error(t, err)
	assert.Nil(t, b)
	if !acl.Built {
		require.ErrorIs(t, err, ErrNotBuilt)
		assert.Contains(t, err.Error(), "-tags ascend")
		return
	}
	require.ErrorIs(t, err, ErrLibrary)
	assert.Contains(t, err.Error(), "libascendcl.so")
	assert.Contains(t, err.Error(), "set_env.sh")
}
