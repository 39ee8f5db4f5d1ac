package backends

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/ascend"
)

func TestOpenWith(t *testing.T) {
	b, err := OpenWith("go", Options{Device: 3})
	require.NoError(t, err)
	assert.Equal(t, "go", b.Name())
	require.NoError(t, b.Close())

	_, err = OpenWith("go", Options{Device: -1})
	assert.ErrorContains(t, err, "device -1")

	// The options reach the Ascend backend: its error names the library
	// directory it was given (with the driver built) or the build tag.
	dir := t.TempDir()
	_, err = OpenWith("ascend", Options{LibDirs: []string{dir}})
	require.Error(t, err)
	if errors.Is(err, ascend.ErrNotBuilt) {
		assert.ErrorContains(t, err, "-tags ascend")
	} else {
		require.ErrorIs(t, err, ascend.ErrLibrary)
		assert.ErrorContains(t, err, dir)
	}

	_, err = OpenWith("tpu", Options{})
	assert.ErrorContains(t, err, `unknown backend "tpu"`)
}
