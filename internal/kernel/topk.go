package kernel

import (
	"math"
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
// the candidates it leaves) and a radix sort of the k picked, with
// scratch from a pool: once warm, TopK allocates nothing.
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
	keys      []uint32
	cand      []int32
	sort, tmp []uint64
}

var topKPool = sync.Pool{New: func() any { return new(topKScratch) }}

// topKRadix is TopK for len(idx) = k > topKHeapMax: it finds the k-th
// largest key eleven, eleven and ten bits at a time (the first pass over
// every score, the next two over the candidates left), takes every score
// above it and the lowest-indexed ones equal to it, and sorts those by
// key, then index (radixDesc). Where a branch on the scores would
// mispredict, its loops take none: a row's scores are new to the branch
// predictor, and a comparison sort and branching filters over them took
// 11-17 µs a row of 300 to 2,048 scores where this takes 3-8
// (docs/bench). Where k is every score, it only sorts them.
func topKRadix(idx []int32, x []float32) {
	sc := topKPool.Get().(*topKScratch)
	defer topKPool.Put(sc)
	k := len(idx)
	if k == len(x) {
		// Every score is kept (an indexer's row that sees no more
		// positions than its list holds): no threshold to find, only the
		// order, which a stable sort of them all in index order gives.
		s := sc.entries(k)
		for i, v := range x {
			s[i] = uint64(rankKey(v))<<32 | uint64(uint32(i))
		}
		sc.sortInto(idx, s)
		return
	}
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
	bin, need := binOf(h[0][:], &h[1], k) // need: how many of the keys under the prefix to take
	prefix := uint32(bin) << 21
	// The filters write one entry past the last they keep.
	inBin := int(h[0][bin])
	if cap(sc.cand) < inBin+1 {
		sc.cand = make([]int32, inBin+1, 2*inBin+2) // room for a decode's growing context
	}
	cand := sc.cand[:inBin+1]
	c := 0
	if rare(inBin, len(x)) {
		for i, key := range keys {
			if key>>21 == uint32(bin) {
				cand[c] = int32(i)
				c++
			}
		}
	} else {
		for i, key := range keys {
			cand[c] = int32(i)
			c += b2i(key>>21 == uint32(bin))
		}
	}
	cand = cand[:c]
	for _, pass := range [2]struct{ shift, bits uint }{{10, 11}, {0, 10}} {
		hist := h[0][:1<<pass.bits]
		clear(hist)
		mask := uint32(1)<<pass.bits - 1
		for _, i := range cand {
			hist[keys[i]>>pass.shift&mask]++
		}
		var bin int
		bin, need = binOf(hist, nil, need)
		prefix |= uint32(bin) << pass.shift
		c := 0
		for _, i := range cand {
			cand[c] = i
			c += b2i(keys[i]>>pass.shift&mask == uint32(bin))
		}
		cand = cand[:c]
	}
	// cand now holds the scores with the k-th key, in index order, and
	// need how many of them to take. The greater keys go into s in index
	// order, then the first need of those: a stable sort by key ranks
	// them, ties by index.
	s := sc.entries(k + 1)
	n := 0
	if rare(k, len(x)) {
		for i, key := range keys {
			if key > prefix {
				s[n] = uint64(key)<<32 | uint64(uint32(i))
				n++
			}
		}
	} else {
		for i, key := range keys {
			s[n] = uint64(key)<<32 | uint64(uint32(i))
			n += b2i(key > prefix)
		}
	}
	for _, i := range cand[:need] {
		s[n] = uint64(prefix)<<32 | uint64(uint32(i))
		n++
	}
	sc.sortInto(idx, s[:n])
}

// entries returns the scratch for n sort entries (key<<32 | index).
func (sc *topKScratch) entries(n int) []uint64 {
	if cap(sc.sort) < n {
		sc.sort = make([]uint64, n, 2*n)
		sc.tmp = make([]uint64, n, 2*n)
	}
	return sc.sort[:n]
}

// sortInto sorts s (radixDesc, with the scratch's other buffer) and
// writes its indices, best first, to idx.
func (sc *topKScratch) sortInto(idx []int32, s []uint64) {
	for i, v := range radixDesc(s, sc.tmp[:len(s)]) {
		idx[i] = int32(uint32(v))
	}
}

// radixDesc sorts s, entries key<<32 | index in index order but for a
// last run of equal keys below all others, by key descending and keeps
// the order of equal keys (so ties stay in index order): a least-
// significant-digit radix sort over the key's four bytes, one pass
// skipped where every entry has the same byte. It returns whichever of
// s and tmp (as long) holds the result.
func radixDesc(s, tmp []uint64) []uint64 {
	if len(s) == 0 {
		return s
	}
	// Every pass's counts in one sweep, each byte in its bin from the top.
	var count [4][256]int32
	for _, v := range s {
		count[0][255-byte(v>>32)]++
		count[1][255-byte(v>>40)]++
		count[2][255-byte(v>>48)]++
		count[3][255-byte(v>>56)]++
	}
	for d, shift := 0, uint(32); shift < 64; d, shift = d+1, shift+8 {
		at := &count[d]
		if int(at[255-byte(s[0]>>shift)]) == len(s) {
			continue
		}
		sum := int32(0)
		for b, c := range at {
			at[b] = sum
			sum += c
		}
		for _, v := range s {
			b := 255 - byte(v>>shift)
			tmp[at[b]] = v
			at[b]++
		}
		s, tmp = tmp, s
	}
	return s
}

// rare reports whether a filter keeping about m of n entries keeps few
// enough that its branch predicts well: a branch-free filter stores
// every entry, a cost that pays where the branch would mispredict.
func rare(m, n int) bool { return 8*m < n }

// binOf returns the highest bin of hist (plus odd's, where not nil)
// whose count and those of the bins above it reach need (bin 0 if none
// do), and need less the counts above it. It sums runs of bins before
// it looks at one bin, so that the many empty bins over concentrated
// scores cost no branch each.
func binOf(hist []int32, odd *[1 << 11]int32, need int) (int, int) {
	run := len(hist) / 64
	c := 63
	for ; c > 0; c-- {
		var sum int32
		for _, v := range hist[c*run : (c+1)*run] {
			sum += v
		}
		if odd != nil {
			for _, v := range odd[c*run : (c+1)*run] {
				sum += v
			}
		}
		if int(sum) >= need {
			break
		}
		need -= int(sum)
	}
	if odd != nil {
		for b := c * run; b < (c+1)*run; b++ {
			hist[b] += odd[b]
		}
	}
	bin := (c+1)*run - 1
	for ; bin > c*run && int(hist[bin]) < need; bin-- {
		need -= int(hist[bin])
	}
	return bin, need
}

// b2i is 1 for true and 0 for false; the compiler sets it from the
// comparison's flags (SETcc), without a branch.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
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
