package ascend

import (
	"fmt"

	"k3/compute"
)

// maxSides bounds the side streams of a backend.
const maxSides = 8

// Side implements compute.Streams: a view of the backend whose
// operations queue on side stream i (1 to 8), created on first use. It
// shares the backend's arena, constants and lock; its Close does nothing.
func (b *Backend) Side(i int) (compute.Backend, error) {
	if i < 1 || i > maxSides {
		return nil, fmt.Errorf("%w: side stream %d (1 to %d)", ErrInvalidArgument, i, maxSides)
	}
	b.lock()
	defer b.mu.Unlock()
	if sd, ok := b.sides[i]; ok {
		return sd, nil
	}
	if b.capture != nil {
		return nil, fmt.Errorf("%w: a new side stream", ErrCapturing)
	}
	sd := &Backend{core: b.core, side: i}
	var err error
	if sd.s, err = b.drv.newStream(); err != nil {
		return nil, err
	}
	if sd.fork, err = b.drv.newEvent(); err == nil {
		sd.join, err = b.drv.newEvent()
	}
	if err != nil {
		if sd.fork != nil {
			sd.fork.Destroy()
		}
		sd.s.Destroy()
		return nil, err
	}
	if b.sides == nil {
		b.sides = map[int]*Backend{}
	}
	b.sides[i] = sd
	return sd, nil
}

// sideOf checks that side is a side stream of b's backend.
func (b *Backend) sideOf(side compute.Backend) (*Backend, error) {
	sd, ok := side.(*Backend)
	if !ok || sd.core != b.core || sd.side == 0 || sd == b {
		return nil, fmt.Errorf("%w: a %T that is not another side stream of this backend", ErrInvalidArgument, side)
	}
	if b.capture != nil && b.capture.b != b {
		return nil, fmt.Errorf("%w: Fork or Join from a side stream", ErrCapturing)
	}
	return sd, nil
}

// Fork implements compute.Streams: side's later work waits for the work
// queued on b so far (side's fork event, recorded on b's stream). During
// a Capture the side stream's work from Fork to Join is captured into the
// same graph; a capture ends in an error if a forked side stream was not
// joined.
func (b *Backend) Fork(side compute.Backend) error {
	b.lock()
	defer b.mu.Unlock()
	sd, err := b.sideOf(side)
	if err != nil {
		return err
	}
	fork, err := b.eventFor(sd.fork)
	if err != nil {
		return err
	}
	if err := b.s.record(fork); err != nil {
		return err
	}
	if err := sd.s.wait(fork); err != nil {
		return err
	}
	// Inside a capture the wait makes the side stream join it (ACL's
	// cross-stream capture): its work until Join is captured too.
	sd.captured = b.capture != nil
	return nil
}

// Join implements compute.Streams: b's later work waits for the work
// queued on side so far (side's join event).
func (b *Backend) Join(side compute.Backend) error {
	b.lock()
	defer b.mu.Unlock()
	sd, err := b.sideOf(side)
	if err != nil {
		return err
	}
	join, err := b.eventFor(sd.join)
	if err != nil {
		return err
	}
	if err := sd.s.record(join); err != nil {
		return err
	}
	if err := b.s.wait(join); err != nil {
		return err
	}
	sd.captured = false // returned to the capturing stream
	return nil
}

// eventFor returns e, or inside a capture a new event the graph owns: the
// graph's replays record it, and a record of e replayed later than an
// eager record of e would complete that eager Fork or Join early. b.mu is
// held.
func (b *Backend) eventFor(e event) (event, error) {
	if b.capture == nil {
		return e, nil
	}
	ev, err := b.drv.newEvent()
	if err != nil {
		return nil, err
	}
	b.capture.events = append(b.capture.events, ev)
	return ev, nil
}

// syncAll waits for the backend's stream and every side stream; b.mu is
// held.
func (b *Backend) syncAll() error {
	b.waits++
	err := b.main.s.Sync()
	if err == nil {
		b.synced(b.main.s)
	}
	for _, sd := range b.sides {
		serr := sd.s.Sync()
		if serr == nil {
			b.synced(sd.s)
		} else if err == nil {
			err = serr
		}
	}
	return err
}

var _ compute.Streams = (*Backend)(nil)
