package acl

import (
	"errors"
	"fmt"
)

// Library names the part of CANN an error came from.
type Library uint8

const (
	ACL   Library = iota + 1 // the runtime, libascendcl (aclError codes)
	ACLNN                    // the operator libraries (aclnnStatus codes)
	HCCL                     // the collective library (HcclResult codes)
)

func (l Library) String() string {
	switch l {
	case ACL:
		return "ACL"
	case ACLNN:
		return "aclnn"
	case HCCL:
		return "HCCL"
	}
	return fmt.Sprintf("Library(%d)", uint8(l))
}

// Error classes, for errors.Is. An *Error matches the class of its code.
var (
	ErrInvalidArgument = errors.New("ascend: invalid argument")
	ErrOutOfMemory     = errors.New("ascend: out of device memory")
	ErrKernelMissing   = errors.New("ascend: operator kernel missing (is the ops package installed?)")
	ErrDevice          = errors.New("ascend: device or runtime fault")
)

// ErrLibrary wraps failures to load CANN's libraries or their symbols.
var ErrLibrary = errors.New("ascend: CANN library not loadable")

// ErrNotBuilt is returned by Load in a build without the cgo shim.
var ErrNotBuilt = errors.New("ascend: this build of k3 has no Ascend driver (build with -tags ascend and CGO_ENABLED=1)")

// Error is a failed call into CANN. Msg is aclGetRecentErrMsg (or
// HcclGetErrorString) as read inside the failing call.
type Error struct {
	API  string // the C function, e.g. "aclrtMalloc"
	Lib  Library
	Code int
	Msg  string
}

func (e *Error) Error() string {
	s := fmt.Sprintf("ascend: %s: %v error %d", e.API, e.Lib, e.Code)
	if c := e.class(); c != nil {
		s += " (" + classNames[c] + ")"
	}
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	return s
}

var classNames = map[error]string{
	ErrInvalidArgument: "invalid argument",
	ErrOutOfMemory:     "out of memory",
	ErrKernelMissing:   "kernel missing",
	ErrDevice:          "device fault",
}

// Is reports whether target is the class of e's code.
func (e *Error) Is(target error) bool { return target != nil && e.class() == target }

// class sorts a code into its class, following the documented ranges:
// ACL 1000xx usage, 2000xx resource, 107xxx/207xxx/507xxx runtime;
// aclnn 161xxx parameters, 361xxx runtime, 561xxx inner (561003: the
// kernel was not found); HCCL 1 (parameter) and 2 (null pointer) invalid
// arguments, 3 (memory) and 24 out of memory, 15, 16 and 18 (runtime,
// driver, AI core) device faults.
func (e *Error) class() error {
	c := e.Code
	switch e.Lib {
	case ACL:
		switch {
		case c == 200000 || c == 207001:
			return ErrOutOfMemory
		case c >= 100000 && c < 101000:
			return ErrInvalidArgument
		case c/1000 == 107 || c/1000 == 207 || c/1000 == 507:
			return ErrDevice
		}
	case ACLNN:
		switch {
		case c == 561003:
			return ErrKernelMissing
		case c == 161001 || c == 161002:
			return ErrInvalidArgument
		case c/1000 == 361:
			return ErrDevice
		}
	case HCCL:
		switch c {
		case 3, 24:
			return ErrOutOfMemory
		case 1, 2:
			return ErrInvalidArgument
		case 15, 16, 18:
			return ErrDevice
		}
	}
	return nil
}
