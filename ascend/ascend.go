// Package ascend is the compute backend for Huawei Ascend NPUs: cgo into
// ACL, aclnn and HCCL, with the vendor libraries loaded at run time (dlopen)
// so that no build ever needs CANN installed.
//
// Status: not implemented. Open always fails with ErrNotBuilt; the backend,
// its FRACTAL_NZ weight packing and the HCCL communicator are future work
// (see docs/ARCHITECTURE.md). The package exists so that the command line
// and the SDK can already name it.
package ascend

import (
	"errors"

	"k3/compute"
)

// ErrNotBuilt is returned by Open while the Ascend backend is not implemented.
var ErrNotBuilt = errors.New("ascend: backend not implemented in this build of k3")

// Options configures Open.
type Options struct {
	// LibDirs are searched for libascendcl.so and friends before the
	// default loader path.
	LibDirs []string
	// Device is the NPU index.
	Device int
}

// Open would load the Ascend runtime and return a backend for one device.
func Open(opts Options) (compute.Backend, error) { return nil, ErrNotBuilt }
