// Package acl is k3's driver for Ascend NPUs: Go types over the C API of
// CANN's runtime (ACL), operator libraries (aclnn) and collectives
// (HCCL), reached through a cgo shim that loads the libraries at run time
// with dlopen, so that no build needs CANN.
//
// The shim is compiled only with -tags ascend and cgo; other builds get a
// Load that fails with ErrNotBuilt. Every call takes its Context and makes
// it current on the calling OS thread first, because ACL contexts are per
// thread and a goroutine may move between threads.
package acl

import "unsafe"

// DataType is aclDataType.
type DataType int32

const (
	Float   DataType = 0
	Float16 DataType = 1
	Int8    DataType = 2
	Int32   DataType = 3
	Uint8   DataType = 4
	Int64   DataType = 9
	Bool    DataType = 12
	BF16    DataType = 27
)

// Size is the element size in bytes (0 for types the driver does not use).
func (d DataType) Size() int {
	switch d {
	case Float, Int32:
		return 4
	case Float16, BF16:
		return 2
	case Int8, Uint8, Bool:
		return 1
	case Int64:
		return 8
	}
	return 0
}

// Format is aclFormat.
type Format int32

const (
	FormatNCHW      Format = 0
	FormatND        Format = 2
	FormatFractalNZ Format = 29
)

// CaptureMode is aclmdlRICaptureMode: which other threads' ACL calls the
// capture tolerates.
type CaptureMode int32

const (
	CaptureGlobal      CaptureMode = 0
	CaptureThreadLocal CaptureMode = 1
	CaptureRelaxed     CaptureMode = 2
)

// memcpy kinds (aclrtMemcpyKind) and the allocation policy the driver uses.
const (
	memcpyHostToHost     = 0
	memcpyHostToDevice   = 1
	memcpyDeviceToHost   = 2
	memcpyDeviceToDevice = 3

	mallocHugeFirst = 0
)

// DevPtr is a device address. Go never dereferences it; it is kept as
// an unsafe.Pointer (which the garbage collector ignores, as it points
// outside the Go heap) so that it reaches C without a uintptr conversion.
type DevPtr struct{ p unsafe.Pointer }

// Add offsets p by n bytes.
func (p DevPtr) Add(n int) DevPtr { return DevPtr{unsafe.Add(p.p, n)} }

// IsNil reports whether p is the zero address.
func (p DevPtr) IsNil() bool { return p.p == nil }

// HostDevPtr is the "device" address of host memory, for a driver whose
// device memory is the host's (the host driver). b must stay referenced
// while the address is used.
func HostDevPtr(b []byte) DevPtr { return DevPtr{unsafe.Pointer(unsafe.SliceData(b))} }

// Sub is the byte distance p - q.
func (p DevPtr) Sub(q DevPtr) int { return int(uintptr(p.p) - uintptr(q.p)) }

// Options says where to find CANN's libraries.
type Options struct {
	// LibDirs are searched, in order, before the dynamic loader's own
	// path (LD_LIBRARY_PATH, as set by CANN's set_env.sh).
	LibDirs []string
}

// The libraries Load opens, in order. The operator libraries are tried
// custom first; a missing one of them is fine as long as each operator
// resolves somewhere.
var (
	runtimeLibs  = []string{"libascendcl.so", "libnnopbase.so"}
	operatorLibs = []string{"libcust_opapi.so", "libopapi.so", "libopapi_math.so", "libopapi_nn.so", "libopapi_transformer.so", "libaclnn_ops_infer.so"}
)

// hint is what every load failure tells the user to do.
const hint = "source the CANN toolkit's set_env.sh (it sets LD_LIBRARY_PATH), or pass the directory holding the library in Options.LibDirs"

// RootInfo is HCCL's bootstrap blob (HcclRootInfo): one rank makes it,
// the others receive its bytes out of band, and every rank passes it to
// NewComm.
type RootInfo [4108]byte

// TensorDesc describes a tensor in device memory for aclnn. Strides are
// in elements; nil means contiguous row-major. StorageDims nil means the
// storage is Dims (ND); an NZ tensor gives its fractal storage shape.
type TensorDesc struct {
	DType       DataType
	Format      Format
	Dims        []int64
	Strides     []int64
	Offset      int64
	StorageDims []int64
	Data        DevPtr
}
