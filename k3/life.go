package k3

import (
	"errors"
	"sync"
)

// ErrClosed is returned by every operation on a Model after Close, and by
// generations that Close interrupted.
var ErrClosed = errors.New("k3: model closed")

// life tracks the operations running on a model's backend so that Close
// can wait for them before it releases the backend: a kernel that ran on a
// closed worker pool would never finish.
type life struct {
	mu      sync.Mutex
	closed  bool
	active  int
	idle    sync.Cond     // signalled when active drops to zero after Close
	closing chan struct{} // closed by Close, for loops that wait (Batcher.Run)
}

func (l *life) init() {
	l.idle.L = &l.mu
	l.closing = make(chan struct{})
}

// enter admits one operation; it fails once Close has begun.
func (l *life) enter() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.active++
	return nil
}

// exit ends an operation that enter admitted.
func (l *life) exit() {
	l.mu.Lock()
	l.active--
	if l.active == 0 && l.closed {
		l.idle.Broadcast()
	}
	l.mu.Unlock()
}

// isClosed reports whether Close has begun, for long operations that check
// between their steps.
func (l *life) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// shut marks the model closed and waits for the admitted operations to
// end. It reports false if Close had already run.
func (l *life) shut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.closed = true
	close(l.closing)
	for l.active > 0 {
		l.idle.Wait()
	}
	return true
}
