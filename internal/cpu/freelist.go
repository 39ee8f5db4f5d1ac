package cpu

import "sync"

// freeList keeps scratch objects for reuse. Unlike a sync.Pool it loses
// none to the garbage collector and parks none in another P's private
// slot, where a goroutine that has moved cannot take it back: a decode
// step that takes and returns its scratch allocates nothing once warm.
// An object whose buffers outgrew maxScratchBytes, or the list's own
// limit where it sets one (a long prefill's), is dropped instead of
// kept, and at most maxFree objects are kept.
type freeList[T any] struct {
	mu    sync.Mutex
	free  []*T
	limit int // bytes; 0: maxScratchBytes
}

// maxFree bounds the objects a free list keeps: a batch's calls and the
// workers' scratch at once.
const maxFree = 256

// maxScratchBytes is the largest scratch a free list keeps.
const maxScratchBytes = 4 << 20

func (l *freeList[T]) get() *T {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.free); n > 0 {
		t := l.free[n-1]
		l.free[n-1] = nil
		l.free = l.free[:n-1]
		return t
	}
	return new(T)
}

// put returns t, whose buffers hold bytes bytes, to the list.
func (l *freeList[T]) put(t *T, bytes int) {
	limit := l.limit
	if limit == 0 {
		limit = maxScratchBytes
	}
	if bytes > limit {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.free) < maxFree {
		l.free = append(l.free, t)
	}
}

// capBytes is the bytes the float32 slices hold.
func capBytes(s ...[]float32) int {
	n := 0
	for _, v := range s {
		n += 4 * cap(v)
	}
	return n
}
