package ascend

import (
	"fmt"
	"slices"
)

// arenaAlign is the granularity of arena spans: a multiple of the 32
// bytes aclnn wants of tensor data and the 64 bytes asynchronous device
// copies want.
const arenaAlign = 512

// fence completes when the device has finished the work queued before
// it: an event recorded on a stream.
type fence interface {
	wait() error
}

// arena hands out spans of one device allocation, so that every buffer
// keeps a fixed address for as long as it lives (a captured graph
// replays with the addresses of its capture) and allocation never calls
// the runtime.
//
// Frees are stream-ordered: a span freed by work queued on a stream goes
// back with that stream and a fence recorded after the work. Work queued
// later on the same stream runs after it, so the span is reusable there at
// once; any other stream gets it only after its fence has completed.
type arena struct {
	size  int
	spans []span // sorted by offset, covering the free bytes
	used  int
}

type span struct {
	off, n int
	// stream and done are set for a span freed on a stream whose fence
	// has not been waited for; nil stream means idle everywhere.
	stream any
	done   fence
}

func newArena(size int) *arena {
	size -= size % arenaAlign
	return &arena{size: size, spans: []span{{off: 0, n: size}}}
}

// alloc returns the offset of n bytes usable by work on stream (nil: by
// the host, which may use only idle spans).
func (a *arena) alloc(n int, stream any) (int, error) {
	if n <= 0 {
		return 0, fmt.Errorf("%w: allocation of %d bytes", ErrInvalidArgument, n)
	}
	n = (n + arenaAlign - 1) / arenaAlign * arenaAlign
	if off, ok := a.take(n, stream); ok {
		return off, nil
	}
	// Wait for the pending frees, oldest fences first, and retry once
	// everything is idle.
	for i := range a.spans {
		if s := &a.spans[i]; s.stream != nil {
			if err := s.done.wait(); err != nil {
				return 0, err
			}
			s.stream, s.done = nil, nil
		}
	}
	a.coalesce()
	if off, ok := a.take(n, stream); ok {
		return off, nil
	}
	return 0, fmt.Errorf("%w: device arena of %d bytes has %d in use and no free span of %d (largest %d)",
		ErrOutOfMemory, a.size, a.used, n, a.largest())
}

// take is first fit among the spans stream may use.
func (a *arena) take(n int, stream any) (int, bool) {
	for i := range a.spans {
		s := &a.spans[i]
		if s.n < n || (s.stream != nil && s.stream != stream) {
			continue
		}
		off := s.off
		if s.n == n {
			a.spans = slices.Delete(a.spans, i, i+1)
		} else {
			s.off += n
			s.n -= n
		}
		a.used += n
		return off, true
	}
	return 0, false
}

// free returns the span at off of n bytes (as passed to alloc). With a
// stream, done is a fence recorded on it after the last work using the
// span; without, the span is idle now.
func (a *arena) free(off, n int, stream any, done fence) {
	n = (n + arenaAlign - 1) / arenaAlign * arenaAlign
	if stream == nil {
		done = nil
	}
	i, _ := slices.BinarySearchFunc(a.spans, off, func(s span, off int) int { return s.off - off })
	a.spans = slices.Insert(a.spans, i, span{off: off, n: n, stream: stream, done: done})
	a.used -= n
	a.coalesce()
}

// coalesce merges neighbouring spans in the same state.
func (a *arena) coalesce() {
	out := a.spans[:0]
	for _, s := range a.spans {
		if k := len(out) - 1; k >= 0 && out[k].off+out[k].n == s.off && out[k].stream == nil && s.stream == nil {
			out[k].n += s.n
			continue
		}
		out = append(out, s)
	}
	a.spans = out
}

func (a *arena) largest() int {
	m := 0
	for _, s := range a.spans {
		m = max(m, s.n)
	}
	return m
}
