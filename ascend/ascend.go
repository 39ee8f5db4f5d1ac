// Package ascend is the compute backend for Huawei Ascend NPUs: cgo into
// ACL, aclnn and HCCL, with the vendor libraries loaded at run time
// (dlopen) so that no build ever needs CANN installed.
//
// Status: the driver (ascend/internal/acl: loading, contexts, memory,
// streams, events, graph capture, aclnn's two-phase operators, HCCL) is
// built and proven against a fake CANN in the tests; the backend maps
// part of the seam to aclnn, and the operations not mapped yet fail with
// an error wrapping compute.ErrUnsupported that names them. OpenHost runs
// the same backend with the host as its device. Nothing has run on an
// NPU yet: docs/ASCEND.md says what runs where.
package ascend

import (
	"k3/ascend/internal/acl"
	"k3/compute"
)

// Errors of the driver, for errors.Is. A failed CANN call is an *Error,
// which matches the class of its code.
var (
	// ErrNotBuilt: the binary was built without -tags ascend or cgo.
	ErrNotBuilt = acl.ErrNotBuilt
	// ErrLibrary: a CANN library or symbol could not be loaded.
	ErrLibrary         = acl.ErrLibrary
	ErrInvalidArgument = acl.ErrInvalidArgument
	ErrOutOfMemory     = acl.ErrOutOfMemory
	ErrKernelMissing   = acl.ErrKernelMissing
	ErrDevice          = acl.ErrDevice
)

// Error is a failed call into CANN: the C function, its library, its
// code and the runtime's message.
type Error = acl.Error

// Options configures Open.
type Options struct {
	// LibDirs are searched for libascendcl.so and friends before the
	// dynamic loader's path.
	LibDirs []string
	// Device is the NPU index.
	Device int
	// ArenaBytes is the device memory the backend takes at open, from
	// which every tensor is allocated (0: 1 GiB).
	ArenaBytes int
	// HostFallback runs the operations not yet mapped to aclnn on the
	// host: their buffers are downloaded, computed by the pure-Go backend
	// and uploaded back. Slow; without it they fail with
	// compute.ErrUnsupported naming them.
	HostFallback bool
	// FusedAttention lets DSA layers run aclnnLightningIndexer and
	// aclnnSparseFlashAttention (where the operator libraries have them)
	// over bf16 mirrors of the caches, instead of the float32
	// compositions. Opt-in: bf16 operands move the indexer's scores by
	// about 2⁻⁹ relative, so near-ties may change the top-K, and the
	// attention output is rounded to bf16.
	FusedAttention bool
}

// Open loads CANN and returns the backend for device opts.Device.
// Without the ascend build tag it fails with ErrNotBuilt; without CANN,
// with ErrLibrary naming the missing library and how to fix it.
func Open(opts Options) (compute.Backend, error) {
	lib, err := acl.Load(acl.Options{LibDirs: opts.LibDirs})
	if err != nil {
		return nil, err
	}
	return openDevice(lib, opts)
}
