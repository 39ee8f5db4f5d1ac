//go:build ascend && cgo

package acl

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// NewRootInfo makes the bootstrap blob of a new HCCL group (on the rank
// that creates it).
func (c *Context) NewRootInfo() (RootInfo, error) {
	var r RootInfo
	if c.lib.hcclErr != nil {
		return r, c.lib.hcclErr
	}
	var e C.k3_err
	if C.k3_hccl_root_info(c.c, unsafe.Pointer(&r[0]), &e) != 0 {
		return r, errOf(&e)
	}
	return r, nil
}

// Comm is one rank's HCCL communicator. Collectives move float32 and
// sum; they are queued on a stream like any other work.
type Comm struct {
	ctx        *Context
	c          unsafe.Pointer
	Rank, Size int
}

// NewComm joins rank of a group of size ranks bootstrapped from root.
func (c *Context) NewComm(size, rank int, root *RootInfo) (*Comm, error) {
	if c.lib.hcclErr != nil {
		return nil, c.lib.hcclErr
	}
	if size <= 0 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("%w: rank %d of %d", ErrInvalidArgument, rank, size)
	}
	var m unsafe.Pointer
	var e C.k3_err
	if C.k3_hccl_init(c.c, C.uint32_t(size), unsafe.Pointer(&root[0]), C.uint32_t(rank), &m, &e) != 0 {
		return nil, errOf(&e)
	}
	return &Comm{ctx: c, c: m, Rank: rank, Size: size}, nil
}

// Destroy releases the communicator.
func (m *Comm) Destroy() error {
	if m.c == nil {
		return nil
	}
	var e C.k3_err
	if C.k3_hccl_destroy(m.ctx.c, m.c, &e) != 0 {
		return errOf(&e)
	}
	m.c = nil
	return nil
}

func (m *Comm) check(rc C.int, e *C.k3_err) error {
	if rc != 0 {
		return errOf(e)
	}
	return nil
}

// AllReduce queues recv = the sum over ranks of send (count elements).
func (m *Comm) AllReduce(s *Stream, send, recv DevPtr, count int) error {
	var e C.k3_err
	return m.check(C.k3_hccl_all_reduce(m.ctx.c, ptr(send), ptr(recv), C.uint64_t(count), m.c, s.s, &e), &e)
}

// AllGather queues recv = every rank's send (count elements each),
// rank-major.
func (m *Comm) AllGather(s *Stream, send, recv DevPtr, count int) error {
	var e C.k3_err
	return m.check(C.k3_hccl_all_gather(m.ctx.c, ptr(send), ptr(recv), C.uint64_t(count), m.c, s.s, &e), &e)
}

// ReduceScatter queues recv = this rank's block of recvCount elements of
// the sum over ranks of send.
func (m *Comm) ReduceScatter(s *Stream, send, recv DevPtr, recvCount int) error {
	var e C.k3_err
	return m.check(C.k3_hccl_reduce_scatter(m.ctx.c, ptr(send), ptr(recv), C.uint64_t(recvCount), m.c, s.s, &e), &e)
}

// AllToAllV queues the exchange: sendCounts[j] elements at sdispls[j] of
// send go to rank j, recvCounts[j] elements from rank j land at
// rdispls[j] of recv. The arrays are read during the call.
func (m *Comm) AllToAllV(s *Stream, send DevPtr, sendCounts, sdispls []uint64, recv DevPtr, recvCounts, rdispls []uint64) error {
	for _, a := range [][]uint64{sendCounts, sdispls, recvCounts, rdispls} {
		if len(a) != m.Size {
			return fmt.Errorf("%w: AllToAllV count array of %d for %d ranks", ErrInvalidArgument, len(a), m.Size)
		}
	}
	var e C.k3_err
	u := func(a []uint64) *C.uint64_t { return (*C.uint64_t)(unsafe.Pointer(&a[0])) }
	return m.check(C.k3_hccl_all_to_all_v(m.ctx.c, ptr(send), u(sendCounts), u(sdispls), ptr(recv), u(recvCounts), u(rdispls), m.c, s.s, &e), &e)
}

// Send queues count elements of buf to rank to.
func (m *Comm) Send(s *Stream, buf DevPtr, count, to int) error {
	var e C.k3_err
	return m.check(C.k3_hccl_send(m.ctx.c, ptr(buf), C.uint64_t(count), C.uint32_t(to), m.c, s.s, &e), &e)
}

// Recv queues receiving count elements from rank from into buf.
func (m *Comm) Recv(s *Stream, buf DevPtr, count, from int) error {
	var e C.k3_err
	return m.check(C.k3_hccl_recv(m.ctx.c, ptr(buf), C.uint64_t(count), C.uint32_t(from), m.c, s.s, &e), &e)
}

// Barrier queues a point every rank's stream must reach.
func (m *Comm) Barrier(s *Stream) error {
	var e C.k3_err
	return m.check(C.k3_hccl_barrier(m.ctx.c, m.c, s.s, &e), &e)
}
