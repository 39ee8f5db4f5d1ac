package ascend

import (
	"k3/compute"
)

// The stage ring carries the small host values the compositions pass to
// their operators (a rope table, a mask, a row's limits) without waiting
// for the stream: each value is copied into a pinned slot and the upload
// is queued, and a slot is written again only once the stream that read
// it has been waited for. put, in contrast, waits for its copy.
const (
	ringSlots     = 16
	ringSlotBytes = 64 << 10
)

type stageRing struct {
	slots []hostBuffer
	// busy[i] is the stream whose queued upload may still read slot i
	// (nil: free).
	busy []stream
	next int
}

// putAsync copies host values (as put takes them) to t's elements from
// its first, queued on b's stream; values larger than a slot, and any
// during a capture, go through put. b.mu is held.
func (b *Backend) putAsync(t compute.Tensor, src any) error {
	data, _, err := hostView(src)
	if err != nil {
		return err
	}
	if len(data) > ringSlotBytes || b.capture != nil {
		return b.put(t, src)
	}
	p, err := b.addr(t)
	if err != nil {
		return err
	}
	r := &b.ring
	if r.slots == nil {
		for range ringSlots {
			h, err := b.drv.mallocHost(ringSlotBytes)
			if err != nil {
				return b.put(t, src) // no pinned memory to spare: wait instead
			}
			r.slots = append(r.slots, h)
		}
		r.busy = make([]stream, ringSlots)
	}
	i := r.next
	r.next = (i + 1) % len(r.slots)
	if s := r.busy[i]; s != nil {
		b.waits++
		if err := s.Sync(); err != nil {
			return err
		}
		b.synced(s)
	}
	copy(r.slots[i].Bytes(), data)
	if err := b.s.upload(p, r.slots[i], 0, len(data)); err != nil {
		return err
	}
	r.busy[i] = b.s
	return nil
}

// synced records that every upload queued on s so far has run: the slots
// they read are free.
func (b *Backend) synced(s stream) {
	for i, bs := range b.ring.busy {
		if bs == s {
			b.ring.busy[i] = nil
		}
	}
}

// freeRing releases the ring's pinned slots; the streams have drained.
func (b *Backend) freeRing() error {
	var first error
	for _, h := range b.ring.slots {
		if err := h.Free(); err != nil && first == nil {
			first = err
		}
	}
	b.ring = stageRing{}
	return first
}
