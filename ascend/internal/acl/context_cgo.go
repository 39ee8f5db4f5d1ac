//go:build ascend && cgo

package acl

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Context is an ACL context on one device. Its methods may be called from
// any goroutine: each call makes the context current on the OS thread it
// runs on.
type Context struct {
	lib    *Lib
	c      unsafe.Pointer
	Device int
}

// NewContext creates a context on device dev.
func (l *Lib) NewContext(dev int) (*Context, error) {
	if err := l.init(); err != nil {
		return nil, err
	}
	var c unsafe.Pointer
	var e C.k3_err
	if C.k3_context_create(&c, C.int32_t(dev), &e) != 0 {
		return nil, errOf(&e)
	}
	return &Context{lib: l, c: c, Device: dev}, nil
}

// Close destroys the context. Streams, events and memory made in it must
// be released first.
func (c *Context) Close() error {
	if c.c == nil {
		return nil
	}
	var e C.k3_err
	if C.k3_context_destroy(c.c, &e) != 0 {
		return errOf(&e)
	}
	c.c = nil
	return nil
}

func ptr(p DevPtr) unsafe.Pointer { return p.p }

// Malloc allocates n bytes of device memory.
func (c *Context) Malloc(n int) (DevPtr, error) {
	if n <= 0 {
		return DevPtr{}, fmt.Errorf("%w: Malloc of %d bytes", ErrInvalidArgument, n)
	}
	var p unsafe.Pointer
	var e C.k3_err
	if C.k3_malloc(c.c, &p, C.size_t(n), &e) != 0 {
		return DevPtr{}, errOf(&e)
	}
	return DevPtr{p}, nil
}

// Free releases device memory at once; work still queued that uses it
// must have finished.
func (c *Context) Free(p DevPtr) error {
	var e C.k3_err
	if C.k3_free(c.c, ptr(p), &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// HostBuffer is pinned host memory from aclrtMallocHost: the only host
// memory a stream-ordered copy may use, since C must never keep a Go
// pointer past the call that received it.
type HostBuffer struct {
	ctx *Context
	p   unsafe.Pointer
	n   int
}

// MallocHost allocates n bytes of pinned host memory.
func (c *Context) MallocHost(n int) (*HostBuffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: MallocHost of %d bytes", ErrInvalidArgument, n)
	}
	var p unsafe.Pointer
	var e C.k3_err
	if C.k3_malloc_host(c.c, &p, C.size_t(n), &e) != 0 {
		return nil, errOf(&e)
	}
	return &HostBuffer{ctx: c, p: p, n: n}, nil
}

// Bytes is the buffer's memory. It is invalid after Free.
func (h *HostBuffer) Bytes() []byte { return unsafe.Slice((*byte)(h.p), h.n) }

// Free releases the buffer.
func (h *HostBuffer) Free() error {
	if h.p == nil {
		return nil
	}
	var e C.k3_err
	if C.k3_free_host(h.ctx.c, h.p, &e) != 0 {
		return errOf(&e)
	}
	h.p = nil
	return nil
}

// CopyToDevice copies src to device memory at dst and returns when done.
func (c *Context) CopyToDevice(dst DevPtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	var e C.k3_err
	if C.k3_memcpy(c.c, ptr(dst), C.size_t(len(src)), unsafe.Pointer(&src[0]), C.size_t(len(src)), memcpyHostToDevice, &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// CopyToHost copies len(dst) bytes of device memory at src to dst and
// returns when done.
func (c *Context) CopyToHost(dst []byte, src DevPtr) error {
	if len(dst) == 0 {
		return nil
	}
	var e C.k3_err
	if C.k3_memcpy(c.c, unsafe.Pointer(&dst[0]), C.size_t(len(dst)), ptr(src), C.size_t(len(dst)), memcpyDeviceToHost, &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// Stream is an ACL stream: work on it runs in order, asynchronously to
// the host.
type Stream struct {
	ctx *Context
	s   unsafe.Pointer
}

// NewStream creates a stream.
func (c *Context) NewStream() (*Stream, error) {
	var s unsafe.Pointer
	var e C.k3_err
	if C.k3_stream_create(c.c, &s, &e) != 0 {
		return nil, errOf(&e)
	}
	return &Stream{ctx: c, s: s}, nil
}

// Sync waits until the stream's queued work has run.
func (s *Stream) Sync() error {
	var e C.k3_err
	if C.k3_stream_sync(s.ctx.c, s.s, &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// Destroy releases the stream.
func (s *Stream) Destroy() error {
	if s.s == nil {
		return nil
	}
	var e C.k3_err
	if C.k3_stream_destroy(s.ctx.c, s.s, &e) != 0 {
		return errOf(&e)
	}
	s.s = nil
	return nil
}

func (s *Stream) memcpy(dst, src unsafe.Pointer, n int, kind C.int) error {
	if n <= 0 {
		return nil
	}
	var e C.k3_err
	if C.k3_memcpy_async(s.ctx.c, dst, C.size_t(n), src, C.size_t(n), kind, s.s, &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// Upload queues a copy of src.Bytes()[off:off+n] to dst.
func (s *Stream) Upload(dst DevPtr, src *HostBuffer, off, n int) error {
	if off < 0 || n < 0 || off+n > src.n {
		return fmt.Errorf("%w: Upload of [%d:%d] from a %d-byte host buffer", ErrInvalidArgument, off, off+n, src.n)
	}
	return s.memcpy(ptr(dst), unsafe.Add(src.p, off), n, memcpyHostToDevice)
}

// Download queues a copy of n bytes at src to dst.Bytes()[off:off+n].
func (s *Stream) Download(dst *HostBuffer, off int, src DevPtr, n int) error {
	if off < 0 || n < 0 || off+n > dst.n {
		return fmt.Errorf("%w: Download to [%d:%d] of a %d-byte host buffer", ErrInvalidArgument, off, off+n, dst.n)
	}
	return s.memcpy(unsafe.Add(dst.p, off), ptr(src), n, memcpyDeviceToHost)
}

// Memset queues setting n bytes at dst to the byte value.
func (s *Stream) Memset(dst DevPtr, value byte, n int) error {
	if n <= 0 {
		return nil
	}
	var e C.k3_err
	if C.k3_memset_async(s.ctx.c, ptr(dst), C.size_t(n), C.int32_t(value), C.size_t(n), s.s, &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// CopyDevice queues a device-to-device copy of n bytes (both addresses
// 64-byte aligned, as ACL requires of asynchronous device copies).
func (s *Stream) CopyDevice(dst, src DevPtr, n int) error {
	return s.memcpy(ptr(dst), ptr(src), n, memcpyDeviceToDevice)
}

// Record queues ev on the stream: it completes when the work queued
// before it has run.
func (s *Stream) Record(ev *Event) error {
	var e C.k3_err
	if C.k3_event_record(s.ctx.c, ev.ev, s.s, &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// Wait makes work queued on s after this call wait for ev.
func (s *Stream) Wait(ev *Event) error {
	var e C.k3_err
	if C.k3_stream_wait(s.ctx.c, s.s, ev.ev, &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// Event marks a point in a stream.
type Event struct {
	ctx *Context
	ev  unsafe.Pointer
}

// NewEvent creates an event.
func (c *Context) NewEvent() (*Event, error) {
	var ev unsafe.Pointer
	var e C.k3_err
	if C.k3_event_create(c.c, &ev, &e) != 0 {
		return nil, errOf(&e)
	}
	return &Event{ctx: c, ev: ev}, nil
}

// Sync waits for the event.
func (ev *Event) Sync() error {
	var e C.k3_err
	if C.k3_event_sync(ev.ctx.c, ev.ev, &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// Elapsed is the time in milliseconds from start to ev, both completed.
func (ev *Event) Elapsed(start *Event) (float32, error) {
	var ms C.float
	var e C.k3_err
	if C.k3_event_elapsed(ev.ctx.c, &ms, start.ev, ev.ev, &e) != 0 {
		return 0, errOf(&e)
	}
	return float32(ms), nil
}

// Destroy releases the event.
func (ev *Event) Destroy() error {
	if ev.ev == nil {
		return nil
	}
	var e C.k3_err
	if C.k3_event_destroy(ev.ctx.c, ev.ev, &e) != 0 {
		return errOf(&e)
	}
	ev.ev = nil
	return nil
}

// Graph is captured stream work (aclmdlRI) that can be replayed.
type Graph struct {
	ctx *Context
	g   unsafe.Pointer
}

// Capture records the work fn queues on s into a graph instead of running
// it. fn runs on the calling goroutine with its OS thread locked, since a
// capture belongs to the thread that began it; it must queue work only on
// s. Replays read and write the addresses fn used.
func (s *Stream) Capture(mode CaptureMode, fn func() error) (*Graph, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var e C.k3_err
	if C.k3_capture_begin(s.ctx.c, s.s, C.int(mode), &e) != 0 {
		return nil, errOf(&e)
	}
	ferr := fn()
	var g unsafe.Pointer
	if C.k3_capture_end(s.ctx.c, s.s, &g, &e) != 0 {
		if ferr != nil {
			return nil, ferr
		}
		return nil, errOf(&e)
	}
	gr := &Graph{ctx: s.ctx, g: g}
	if ferr != nil {
		gr.Destroy()
		return nil, ferr
	}
	return gr, nil
}

// Replay queues the captured work on s.
func (g *Graph) Replay(s *Stream) error {
	var e C.k3_err
	if C.k3_graph_replay(g.ctx.c, g.g, s.s, &e) != 0 {
		return errOf(&e)
	}
	return nil
}

// Destroy releases the graph.
func (g *Graph) Destroy() error {
	if g.g == nil {
		return nil
	}
	var e C.k3_err
	if C.k3_graph_destroy(g.ctx.c, g.g, &e) != 0 {
		return errOf(&e)
	}
	g.g = nil
	return nil
}
