package kernel

import (
	"math"
	"slices"
	"sync"
)

// better reports whether score a at index ia ranks before score b at ib:
// larger first, exact ties (IEEE ==, so -0 == +0) to the lower index, NaN
// after every number.
func better(a float32, ia int32, b float32, ib int32) bool {
	switch {
	case a > b:
		return true
	case a < b:
		return false
	case a == b:
		return ia < ib
	}
	// At least one NaN.
	if a != a && b != b {
		return ia < ib
	}
	return b != b
}

// TopK writes to idx (capacity k) the indices of the k best scores in
// ranked order (see better) and returns how many it wrote, min(k, len(x)).
// vals, if not nil, receives the scores. A few best ones come from a
// k-entry heap (O(len(x) log k)); more (the Lightning Indexer's hundreds)
// from a radix selection of the k-th score (two passes over x, two over
// the candidates it leaves) and a sort of the k picked, with scratch from
// a pool: once warm, TopK allocates nothing.
func TopK(idx []int32, vals []float32, x []float32, k int) int {
	k = min(k, len(x), len(idx))
	if k <= 0 {
		return 0
	}
	if k > topKHeapMax {
		topKRadix(idx[:k], x)
	} else {
		topKHeap(idx[:k], x)
	}
	if vals != nil {
		for i, j := range idx[:k] {
			vals[i] = x[j]
		}
	}
	return k
}

// topKHeapMax bounds the k that the heap takes: above, topKRadix is
// cheaper.
const topKHeapMax = 32

// rankKey maps a score to an integer of the same rank under better, ties
// aside: larger scores get larger keys, -0 and +0 the same one (adding +0
// turns -0 into +0), and NaN the smallest of all.
func rankKey(f float32) uint32 {
	if f != f {
		return 0
	}
	b := math.Float32bits(f + 0)
	return b ^ (uint32(int32(b)>>31) | 1<<31) // negatives: ^b; the rest: b with the sign bit set
}

type topKScratch struct {
	keys []uint32
	cand []int32
	sort []uint64
}

var topKPool = sync.Pool{New: func() any { return new(topKScratch) }}

// topKRadix is TopK for len(idx) = k > topKHeapMax: it finds the k-th
// largest key eleven, eleven and ten bits at a time (the first pass over
// every score, the next two over the candidates left), takes every score
// above it and the lowest-indexed ones equal to it, and sorts those by
// key, then index.
func topKRadix(idx []int32, x []float32) {
	sc := topKPool.Get().(*topKScratch)
	defer topKPool.Put(sc)
	k := len(idx)
	if cap(sc.keys) < len(x) {
		sc.keys = make([]uint32, len(x), 2*len(x))
	}
	keys := sc.keys[:len(x)]
	// Two histograms, even and odd scores, so that runs of one bin do
	// not wait on their own increments.
	var h [2][1 << 11]int32
	i := 0
	for ; i+1 < len(x); i += 2 {
		a, b := rankKey(x[i]), rankKey(x[i+1])
		keys[i], keys[i+1] = a, b
		h[0][a>>21]++
		h[1][b>>21]++
	}
	if i < len(x) {
		keys[i] = rankKey(x[i])
		h[0][keys[i]>>21]++
	}
	need := k // how many of the keys under the prefix to take
	bin := 1<<11 - 1
	for ; bin > 0 && int(h[0][bin]+h[1][bin]) < need; bin-- {
		need -= int(h[0][bin] + h[1][bin])
	}
	prefix := uint32(bin) << 21
	cand := sc.cand[:0]
	for i, key := range keys {
		if key>>21 == uint32(bin) {
			cand = append(cand, int32(i))
		}
	}
	for _, pass := range [2]struct{ shift, bits uint }{{10, 11}, {0, 10}} {
		hist := &h[0]
		clear(hist[:])
		mask := uint32(1)<<pass.bits - 1
		for _, i := range cand {
			hist[keys[i]>>pass.shift&mask]++
		}
		bin := int(mask)
		for ; bin > 0 && int(hist[bin]) < need; bin-- {
			need -= int(hist[bin])
		}
		prefix |= uint32(bin) << pass.shift
		kept := cand[:0]
		for _, i := range cand {
			if keys[i]>>pass.shift&mask == uint32(bin) {
				kept = append(kept, i)
			}
		}
		cand = kept
	}
	// cand now holds the scores with the k-th key, in index order, and
	// need how many of them to take. Key descending, then index
	// ascending, is one integer order.
	s := sc.sort[:0]
	for i, key := range keys {
		if key > prefix {
			s = append(s, uint64(key)<<32|uint64(^uint32(i)))
		}
	}
	for _, i := range cand[:need] {
		s = append(s, uint64(prefix)<<32|uint64(^uint32(i)))
	}
	slices.Sort(s)
	for i := range s {
		idx[i] = int32(^uint32(s[len(s)-1-i]))
	}
	sc.cand, sc.sort = cand, s
}

// topKHeap is TopK for len(idx) = k by a k-entry heap.
func topKHeap(idx []int32, x []float32) {
	k := len(idx)
	h := idx[:0]
	// Min-heap on "better": the root is the worst kept entry.
	worse := func(i, j int) bool { return better(x[h[j]], h[j], x[h[i]], h[i]) }
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= len(h) {
				return
			}
			c := l
			if r := l + 1; r < len(h) && worse(r, l) {
				c = r
			}
			if !worse(c, i) {
				return
			}
			h[i], h[c] = h[c], h[i]
			i = c
		}
	}
	for i := range x {
		if len(h) < k {
			h = append(h, int32(i))
			for j := len(h) - 1; j > 0; {
				p := (j - 1) / 2
				if !worse(j, p) {
					break
				}
				h[j], h[p] = h[p], h[j]
				j = p
			}
			continue
		}
		if better(x[i], int32(i), x[h[0]], h[0]) {
			h[0] = int32(i)
			down(0)
		}
	}
	// Heap-sort in place: repeatedly move the worst to the end.
	for n := len(h) - 1; n > 0; n-- {
		h[0], h[n] = h[n], h[0]
		h = h[:n]
		down(0)
	}
}
