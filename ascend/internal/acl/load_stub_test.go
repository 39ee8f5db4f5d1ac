//go:build !(ascend && cgo)

package acl

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLoadNotBuilt(t *testing.T) {
	_, err := Load(Options{})
	assert.ErrorIs(t, err, ErrNotBuilt)
	assert.Contains(t, err.Error(), "-tags ascend")
}
