package cpu

import (
	"cmp"
	"slices"
	"sort"
	"sync"
	"unsafe"
	"weak"

	"k3/compute"
)

var _ compute.HostReader = (*Backend)(nil)

// hostRefs records, weakly, the buffers FromHost made over the caller's
// bytes (buffer.aliased): a loader asks through ReadsHost whether the
// stored bytes of a weight still serve a live tensor, and a weak pointer
// lets the garbage collector be the judge of that, since Free is a no-op.
// A model's checkpoint may hold many thousands of tensors, so the records
// are kept sorted by address for the queries.
type hostRefs struct {
	mu    sync.Mutex
	refs  []hostRef
	maxHi []uintptr // maxHi[i] is the largest hi of refs[:i+1], when !dirty
	dirty bool      // refs gained records since they were sorted
	prune int       // add drops collected buffers' records from this length on
}

type hostRef struct {
	buf    weak.Pointer[buffer]
	lo, hi uintptr // the bytes' addresses, [lo, hi)
}

func (h *hostRefs) add(buf *buffer, data []byte) {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.refs) >= h.prune {
		// A backend that keeps making tensors over borrowed bytes keeps
		// only the live ones' records, in amortised constant time.
		h.dropCollected()
		h.prune = 2*len(h.refs) + 1024
	}
	h.refs = append(h.refs, hostRef{buf: weak.Make(buf), lo: lo, hi: lo + uintptr(len(data))})
	h.dirty = true
}

// dropCollected drops the records of buffers the collector has reclaimed.
func (h *hostRefs) dropCollected() {
	h.refs = slices.DeleteFunc(h.refs, func(r hostRef) bool { return r.buf.Value() == nil })
}

// ReadsHost implements compute.HostReader: whether a buffer made over bytes
// overlapping p is still alive.
func (b *Backend) ReadsHost(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	hi := lo + uintptr(len(p))
	h := &b.host
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dirty {
		h.dropCollected()
		slices.SortFunc(h.refs, func(a, b hostRef) int { return cmp.Compare(a.lo, b.lo) })
		h.maxHi = h.maxHi[:0]
		var m uintptr
		for _, r := range h.refs {
			m = max(m, r.hi)
			h.maxHi = append(h.maxHi, m)
		}
		h.dirty = false
	}
	// The records starting below hi, from the last such start down, while
	// one of them or an earlier one still reaches past lo.
	for j := sort.Search(len(h.refs), func(i int) bool { return h.refs[i].lo >= hi }) - 1; j >= 0 && h.maxHi[j] > lo; j-- {
		if r := h.refs[j]; r.hi > lo && r.buf.Value() != nil {
			return true
		}
	}
	return false
}
