//go:build !(ascend && cgo)

package ascend

import (
	"k3/ascend/internal/acl"
	"k3/compute"
)

// openDevice is unreachable without the shim: Load has failed already.
func openDevice(*acl.Lib, Options) (compute.Backend, error) { return nil, ErrNotBuilt }
