//go:build ascend && cgo

package acl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

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

// Tensor is an aclTensor descriptor. It must outlive the operators
// prepared with it.
type Tensor struct {
	ctx *Context
	t   unsafe.Pointer
}

// NewTensor creates a descriptor.
func (c *Context) NewTensor(d TensorDesc) (*Tensor, error) {
	if len(d.Dims) == 0 {
		return nil, fmt.Errorf("%w: tensor with no dimensions", ErrInvalidArgument)
	}
	strides := d.Strides
	if strides == nil {
		strides = make([]int64, len(d.Dims))
		s := int64(1)
		for i := len(d.Dims) - 1; i >= 0; i-- {
			strides[i] = s
			s *= d.Dims[i]
		}
	}
	if len(strides) != len(d.Dims) {
		return nil, fmt.Errorf("%w: %d strides for %d dimensions", ErrInvalidArgument, len(strides), len(d.Dims))
	}
	storage := d.StorageDims
	if storage == nil {
		storage = d.Dims
	}
	format := d.Format
	if format == 0 && d.StorageDims == nil {
		format = FormatND
	}
	var e C.k3_err
	t := C.k3_tensor_create(c.c, (*C.int64_t)(unsafe.Pointer(&d.Dims[0])), C.uint64_t(len(d.Dims)), C.int(d.DType),
		(*C.int64_t)(unsafe.Pointer(&strides[0])), C.int64_t(d.Offset), C.int(format),
		(*C.int64_t)(unsafe.Pointer(&storage[0])), C.uint64_t(len(storage)), ptr(d.Data), &e)
	if t == nil {
		return nil, errOf(&e)
	}
	return &Tensor{ctx: c, t: t}, nil
}

// Destroy releases the descriptor (not the memory it describes).
func (t *Tensor) Destroy() error {
	if t.t == nil {
		return nil
	}
	var e C.k3_err
	if C.k3_tensor_destroy(t.ctx.c, t.t, &e) != 0 {
		return errOf(&e)
	}
	t.t = nil
	return nil
}

// Op is an operator after phase 1 of aclnn's two-phase protocol: its
// executor and the workspace size phase 2 needs.
type Op struct {
	ctx           *Context
	api           string
	launch        unsafe.Pointer
	exec          unsafe.Pointer
	WorkspaceSize int
	repeatable    bool
}

// Launch queues phase 2 on s with a workspace of at least WorkspaceSize
// bytes, which must stay allocated until the stream has run it. An
// executor that is not repeatable is consumed by its launch.
func (o *Op) Launch(s *Stream, ws DevPtr) error {
	if o.exec == nil {
		return fmt.Errorf("%w: %s launched after its executor was consumed or destroyed", ErrInvalidArgument, o.api)
	}
	if o.WorkspaceSize > 0 && ws.IsNil() {
		return fmt.Errorf("%w: %s needs a %d-byte workspace", ErrInvalidArgument, o.api, o.WorkspaceSize)
	}
	capi := C.CString(o.api)
	defer C.free(unsafe.Pointer(capi))
	var e C.k3_err
	rc := C.k3_op_launch(o.ctx.c, o.launch, capi, ptr(ws), C.uint64_t(o.WorkspaceSize), o.exec, s.s, &e)
	if !o.repeatable {
		o.exec = nil
	}
	if rc != 0 {
		return errOf(&e)
	}
	return nil
}

// SetRepeatable lets the executor be launched any number of times, for
// static shapes such as a captured decode step; Destroy then frees it.
func (o *Op) SetRepeatable() error {
	var e C.k3_err
	if C.k3_executor_repeatable(o.ctx.c, o.exec, &e) != 0 {
		return errOf(&e)
	}
	o.repeatable = true
	return nil
}

// Destroy frees a repeatable executor; for others it does nothing after
// their launch.
func (o *Op) Destroy() error {
	if o.exec == nil || !o.repeatable {
		return nil
	}
	var e C.k3_err
	if C.k3_executor_destroy(o.ctx.c, o.exec, &e) != 0 {
		return errOf(&e)
	}
	o.exec = nil
	return nil
}

func (c *Context) newOp(api string, launch, exec unsafe.Pointer, ws C.uint64_t) *Op {
	return &Op{ctx: c, api: api, launch: launch, exec: exec, WorkspaceSize: int(ws)}
}

// Matmul prepares out = x · w (aclnnMatmul; w may be a transposed view
// given by strides). cubeMath is aclnn's cubeMathType (0: keep the
// inputs' precision).
func (c *Context) Matmul(x, w, out *Tensor, cubeMath int8) (*Op, error) {
	prep, launch, api, err := c.lib.operator("aclnnMatmul", "")
	if err != nil {
		return nil, err
	}
	var ws C.uint64_t
	var exec unsafe.Pointer
	var e C.k3_err
	if C.k3_matmul_prepare(c.c, prep, x.t, w.t, out.t, C.int8_t(cubeMath), &ws, &exec, &e) != 0 {
		return nil, errOf(&e)
	}
	return c.newOp(api, launch, exec, ws), nil
}

// RMSNorm prepares y = x / sqrt(mean(x²) + eps) · gamma over the last
// dimension, with the reciprocal roots in rstd (aclnnRmsNorm).
func (c *Context) RMSNorm(x, gamma *Tensor, eps float64, y, rstd *Tensor) (*Op, error) {
	prep, launch, api, err := c.lib.operator("aclnnRmsNorm", "")
	if err != nil {
		return nil, err
	}
	var ws C.uint64_t
	var exec unsafe.Pointer
	var e C.k3_err
	if C.k3_rmsnorm_prepare(c.c, prep, x.t, gamma.t, C.double(eps), y.t, rstd.t, &ws, &exec, &e) != 0 {
		return nil, errOf(&e)
	}
	return c.newOp(api, launch, exec, ws), nil
}
