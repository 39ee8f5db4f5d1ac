package kernel

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
// vals, if not nil, receives the scores. It keeps a k-entry heap, so the
// cost is O(len(x) log k) and it allocates nothing.
func TopK(idx []int32, vals []float32, x []float32, k int) int {
	k = min(k, len(x), len(idx))
	if k <= 0 {
		return 0
	}
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
	h = idx[:k]
	if vals != nil {
		for i, j := range h {
			vals[i] = x[j]
		}
	}
	return k
}
