package tokenizer

import "sync"

// scanMax is the longest piece whose merges encodePiece finds by
// scanning every adjacent pair per merge (tiktoken's way: work that grows
// as the square of the piece's length or faster); longer pieces, such as
// a run of spaces or a base64 blob that the pre-tokenizer leaves whole,
// go through mergeHeap, whose work grows as n log n. At 12 random letters
// the two cost about the same, at 24 the scan 2.8x the heap
// (docs/bench).
const scanMax = 16

// mergeScan appends to out the tokens of piece: it merges the adjacent
// pair of lowest rank, the leftmost of equal ones, until no pair is a
// token.
func (t *BPE) mergeScan(out []int32, piece string) []int32 {
	var buf [scanMax + 1]int
	parts := buf[:0] // parts[i] is the byte offset where part i starts
	if len(piece) > scanMax {
		parts = make([]int, 0, len(piece)+1)
	}
	for i := 0; i <= len(piece); i++ {
		parts = append(parts, i)
	}
	for len(parts) > 2 {
		best, at := int32(-1), -1
		for i := 0; i+2 < len(parts); i++ {
			if r, ok := t.ranks[piece[parts[i]:parts[i+2]]]; ok && (best < 0 || r < best) {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		parts = append(parts[:at+1], parts[at+2:]...)
	}
	for i := 0; i+1 < len(parts); i++ {
		out = append(out, t.ranks[piece[parts[i]:parts[i+1]]])
	}
	return out
}

// mergeHeap is mergeScan with the candidate pairs in a heap ordered by
// rank, then start: the same merges in the same order. Parts are a
// linked list over the piece's bytes, part i starting at byte i; merging
// a pair keeps its left part and pushes the two pairs it now forms. An
// entry whose parts have changed since it was pushed (its right part's
// end has moved, or either part has been absorbed) is dropped when it
// comes to the top.
func (t *BPE) mergeHeap(out []int32, piece string) []int32 {
	m := mergePool.Get().(*merger)
	defer mergePool.Put(m)
	n := len(piece)
	m.reset(n)
	next, prev, end := m.next, m.prev, m.end
	push := func(i int) { // the pair of part i and the part after it
		if i < 0 || next[i] >= n {
			return
		}
		e := end[next[i]]
		if r, ok := t.ranks[piece[i:e]]; ok {
			m.push(pair{rank: r, start: int32(i), end: int32(e)})
		}
	}
	for i := 0; i+1 < n; i++ {
		push(i)
	}
	for len(m.heap) > 0 {
		p := m.pop()
		i := int(p.start)
		j := next[i]
		if end[i] < 0 || j >= n || end[j] != int(p.end) {
			continue // stale: i was absorbed, or i or j has grown since
		}
		// i absorbs j.
		end[i], end[j] = end[j], -1
		next[i] = next[j]
		if next[i] < n {
			prev[next[i]] = i
		}
		push(prev[i])
		push(i)
	}
	for i := 0; i < n; i = next[i] {
		out = append(out, t.ranks[piece[i:end[i]]])
	}
	return out
}

// pair is a candidate merge: the parts starting at byte start and ending
// at byte end, whose bytes are the token of rank rank.
type pair struct {
	rank       int32
	start, end int32
}

func (a pair) less(b pair) bool {
	return a.rank < b.rank || a.rank == b.rank && a.start < b.start
}

// merger is mergeHeap's scratch: the parts' links and ends (end[i] < 0
// once part i is absorbed), and the heap.
type merger struct {
	next, prev, end []int
	heap            []pair
}

var mergePool = sync.Pool{New: func() any { return new(merger) }}

func (m *merger) reset(n int) {
	if cap(m.next) < n {
		m.next, m.prev, m.end = make([]int, n), make([]int, n), make([]int, n)
	}
	m.next, m.prev, m.end = m.next[:n], m.prev[:n], m.end[:n]
	for i := range n {
		m.next[i], m.prev[i], m.end[i] = i+1, i-1, i+1
	}
	m.heap = m.heap[:0]
}

func (m *merger) push(p pair) {
	h := append(m.heap, p)
	for c := len(h) - 1; c > 0; {
		up := (c - 1) / 2
		if !h[c].less(h[up]) {
			break
		}
		h[c], h[up] = h[up], h[c]
		c = up
	}
	m.heap = h
}

func (m *merger) pop() pair {
	h := m.heap
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for c := 0; ; {
		l := 2*c + 1
		if l >= len(h) {
			break
		}
		s := l
		if r := l + 1; r < len(h) && h[r].less(h[l]) {
			s = r
		}
		if !h[s].less(h[c]) {
			break
		}
		h[c], h[s] = h[s], h[c]
		c = s
	}
	m.heap = h
	return top
}
