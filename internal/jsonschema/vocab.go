package jsonschema

import (
	"bytes"
	"slices"
	"sync"
)

// Kinds of token, as bits: which fast path of Mask a token can take.
const (
	tPlain   uint8 = 1 << iota // no quote, backslash or control byte
	tQuote                     // the first of those is a quote
	tEscape                    // a backslash
	tControl                   // a control byte
	tOther   = tQuote | tEscape | tControl
	tAny     = tPlain | tOther
)

// Vocab is a vocabulary arranged for Mask, made once a model and read
// by any number of generations at once.
//
// A loop that tries every token reads each token's bytes from the first
// even where a shared prefix already failed; Vocab sorts the tokens by
// their bytes into a trie, so that a walk takes a prefix's bytes once for
// every token under it and skips a prefix that cannot follow with
// everything under it in one jump.
type Vocab struct {
	toks  [][]byte
	plain []bool // the tokens without a quote, backslash or control byte
	all   trie   // every non-empty token
	// tOther tokens keyed by their bytes from the first quote, backslash
	// or control byte: inside a free string the plain bytes before it
	// leave the state as it was.
	rest trie
	// quote is rest's node of the keys that begin with a quote, -1 if
	// none does: inside a bounded or patterned string what follows a
	// closing quote is read from there (State.closedAfter).
	quote int32
	// The plain tokens that are valid UTF-8 from a character's start
	// (the last character may be cut) by their count of code points:
	// those of at most l are fit[:fitUpTo[l]] (l < len(fitUpTo)),
	// fitMask their set.
	fit     []int32
	fitUpTo []int32
	fitMask []bool
	// The same for the tQuote tokens by the code points before their
	// quote, where those bytes are valid UTF-8 from a character's start
	// and whole.
	quoteFit     []int32
	quoteFitUpTo []int32
	walkers      sync.Pool // *walker
	patterns     maskCache
}

// trie holds tokens sorted by a key, one node a distinct prefix of the
// keys, in depth-first order: node i's subtree is nodes i to skip[i]-1.
type trie struct {
	c        []byte  // the node's last byte
	depth    []int32 // its prefix's length (1 under the root)
	skip     []int32
	has      []uint8 // the kinds of the tokens in its subtree
	at       []int32 // the tokens whose key ends at node i: ids[at[i]:at[i+1]]
	ids      []int32
	kinds    []uint8 // kinds[j] is ids[j]'s kind
	maxDepth int
	suffix   bool // keys are the tokens from their first quote, backslash or control byte
}

// walker is one Mask's scratch: a trial state per depth of a trie.
type walker struct {
	sims   []sim
	counts []utf8Count
	dfas   []int32
	then   func([]byte) bool // MaskThen's
	toks   [][]byte
	prefix []byte // Select's: the node's prefix
	// closed[id] is whether what follows the first quote of token id may
	// follow a string's close (closedAfter's, once a mask: closedSet).
	closed    []bool
	closedSet bool
	// collect: walkString lists the tQuote tokens whose string may close
	// at their quote in quoteIDs instead of marking them.
	collect  bool
	quoteIDs []int32
}

// NewVocab arranges toks (toks[id] a token's bytes; empty: never drawn)
// for Mask. It keeps toks, which must not change.
func NewVocab(toks [][]byte) *Vocab {
	v := &Vocab{toks: toks, plain: make([]bool, len(toks))}
	kind := make([]uint8, len(toks)) // 0 for an empty token
	all, rest := make([]keyed, 0, len(toks)), []keyed(nil)
	chars := make([]int32, len(toks)) // a fit token's code points; -1: not fit
	maxChars := 0
	for id, t := range toks {
		chars[id] = -1
		if len(t) == 0 {
			continue
		}
		k := tokenKind(t)
		kind[id], v.plain[id] = k, k == tPlain
		all = append(all, keyed{int32(id), t})
		if k&tOther != 0 {
			rest = append(rest, keyed{int32(id), t[firstOther(t):]})
		}
		if k == tPlain {
			var u utf8Count
			for _, c := range t {
				if !u.take(c, -1) {
					u.chars = -1
					break
				}
			}
			chars[id] = int32(u.chars)
			maxChars = max(maxChars, u.chars)
		}
	}
	v.all = buildTrie(all, kind)
	v.rest = buildTrie(rest, kind)
	v.rest.suffix = true
	v.quote = -1
	for i := 0; i < len(v.rest.c); i = int(v.rest.skip[i]) {
		if v.rest.c[i] == '"' {
			v.quote = int32(i)
		}
	}

	v.fit, v.fitUpTo = byChars(chars, maxChars)
	v.fitMask = make([]bool, len(toks))
	for _, id := range v.fit {
		v.fitMask[id] = true
	}
	// The quote tokens' prefixes, counted as the plain tokens are.
	maxChars = 0
	for id, t := range toks {
		chars[id] = -1
		if kind[id] != tQuote {
			continue
		}
		var u utf8Count
		ok := true
		for _, c := range t[:firstOther(t)] {
			if ok = u.take(c, -1); !ok {
				break
			}
		}
		if ok && u.need == 0 {
			chars[id] = int32(u.chars)
			maxChars = max(maxChars, u.chars)
		}
	}
	v.quoteFit, v.quoteFitUpTo = byChars(chars, maxChars)

	depth := v.all.maxDepth + 1
	v.walkers.New = func() any {
		return &walker{sims: make([]sim, depth), counts: make([]utf8Count, depth), dfas: make([]int32, depth)}
	}
	return v
}

// byChars sorts the ids whose chars[id] >= 0 by it (a counting sort):
// those of at most l are ids[:upTo[l]].
func byChars(chars []int32, maxChars int) (ids, upTo []int32) {
	upTo = make([]int32, maxChars+1)
	for _, n := range chars {
		if n >= 0 {
			upTo[n]++
		}
	}
	for l := 1; l <= maxChars; l++ {
		upTo[l] += upTo[l-1]
	}
	ids = make([]int32, upTo[maxChars])
	next := make([]int32, maxChars+1)
	copy(next[1:], upTo[:maxChars])
	for id, n := range chars {
		if n >= 0 {
			ids[next[n]] = int32(id)
			next[n]++
		}
	}
	return ids, upTo
}

func tokenKind(t []byte) uint8 {
	i := firstOther(t)
	switch {
	case i == len(t):
		return tPlain
	case t[i] == '"':
		return tQuote
	case t[i] == '\\':
		return tEscape
	}
	return tControl
}

// firstOther is the index of t's first quote, backslash or control byte.
func firstOther(t []byte) int {
	for i, c := range t {
		if c == '"' || c == '\\' || c < 0x20 {
			return i
		}
	}
	return len(t)
}

type keyed struct {
	id  int32
	key []byte
}

func buildTrie(toks []keyed, kind []uint8) trie {
	slices.SortFunc(toks, func(a, b keyed) int {
		if c := bytes.Compare(a.key, b.key); c != 0 {
			return c
		}
		return int(a.id - b.id)
	})
	lcps := make([]int, len(toks)) // the bytes a key shares with the one before
	nodes := 0
	for i, tok := range toks {
		if i > 0 {
			prev := toks[i-1].key
			for lcps[i] < len(prev) && lcps[i] < len(tok.key) && prev[lcps[i]] == tok.key[lcps[i]] {
				lcps[i]++
			}
		}
		nodes += len(tok.key) - lcps[i]
	}
	t := trie{c: make([]byte, 0, nodes), depth: make([]int32, 0, nodes), skip: make([]int32, 0, nodes),
		has: make([]uint8, 0, nodes), at: make([]int32, 0, nodes+1), ids: make([]int32, 0, len(toks)), kinds: make([]uint8, 0, len(toks))}
	var path []int32 // the nodes of the previous key's prefixes
	for i, tok := range toks {
		lcp := lcps[i]
		// The nodes deeper than the shared prefix end here.
		for len(path) > lcp {
			t.skip[path[len(path)-1]] = int32(len(t.c))
			path = path[:len(path)-1]
		}
		for d := lcp; d < len(tok.key); d++ {
			path = append(path, int32(len(t.c)))
			t.c = append(t.c, tok.key[d])
			t.depth = append(t.depth, int32(d+1))
			t.skip = append(t.skip, 0)
			t.has = append(t.has, 0)
			t.at = append(t.at, int32(len(t.ids)))
		}
		t.ids = append(t.ids, tok.id)
		t.kinds = append(t.kinds, kind[tok.id])
		for _, n := range path {
			t.has[n] |= kind[tok.id]
		}
		t.maxDepth = max(t.maxDepth, len(tok.key))
	}
	for _, n := range path {
		t.skip[n] = int32(len(t.c))
	}
	t.at = append(t.at, int32(len(t.ids)))
	return t
}

// Mask sets dst[id] (len(dst) >= the vocabulary's size) to whether
// token id may follow the text read so far: whether its bytes are a
// prefix the machine takes (Accepts), found by walking the vocabulary's
// trie. Inside a string without a bound every plain token is in, and the
// others walk their bytes from the first quote, backslash or control
// byte, since the plain ones before it leave the state as it was. Inside
// a bounded string a plain token is in by its count of code points (if
// it is valid UTF-8), inside a patterned string by the automaton alone
// (its masks kept by state when most of the trie was walked); anywhere
// else, and from a quote, backslash or control byte on, the walk runs
// the machine.
func (s *State) Mask(dst []bool, v *Vocab) { s.MaskThen(dst, v, nil) }

// MaskThen is Mask with the bytes after the value read by then instead
// of the machine (which takes white space there): a token in which the
// value becomes whole after its first n bytes is in if then(token[n:])
// (a tool call's arguments followed by the call's end marker). With then
// nil it is Mask.
func (s *State) MaskThen(dst []bool, v *Vocab, then func(rest []byte) bool) {
	dst = dst[:len(v.toks)]
	if then != nil && s.Done() {
		for id, t := range v.toks {
			dst[id] = len(t) > 0 && then(t)
		}
		return
	}
	w := v.walkers.Get().(*walker)
	w.then, w.toks = then, v.toks
	w.closedSet = false
	defer func() {
		w.then, w.toks = nil, nil
		v.walkers.Put(w)
	}()
	cur := &s.cur
	switch {
	case cur.mode != mString:
		clear(dst)
		s.run(&w.sims[0], nil)
		v.all.walk(dst, 0, len(v.all.c), w)
	case !cur.bounded:
		copy(dst, v.plain)
		s.run(&w.sims[0], nil)
		v.rest.walk(dst, 0, len(v.rest.c), w)
	case cur.n.pat != nil:
		// Plain tokens depend on the automaton's state alone, and so
		// does which tokens' bytes before their first quote the
		// automaton takes to a state where the string may close: a
		// mask and list whose walk took longer than reading them back
		// are kept. The quote's tokens are then in where what follows
		// their quote may follow the string.
		quotes, ok := v.patterns.load(dst, cur.n.pat, cur.dfa)
		if !ok {
			clear(dst)
			w.quoteIDs, w.collect = w.quoteIDs[:0], true
			steps := s.walkString(dst, v, tPlain|tQuote, w)
			w.collect = false
			quotes = w.quoteIDs
			if steps > len(dst)/4 {
				v.patterns.store(dst, quotes, cur.n.pat, cur.dfa)
			}
		}
		if len(quotes) > 0 {
			closed := s.closedAfter(v, w)
			for _, id := range quotes {
				if closed[id] {
					dst[id] = true
				}
			}
		}
		if cur.n.pat.special {
			s.walkString(dst, v, tEscape|tControl, w)
		}
	case cur.need == 0:
		// A plain token is in if it is valid UTF-8 of at most the code
		// points left.
		room := len(v.fitUpTo) - 1
		if cur.n.maxLen >= 0 {
			room = min(room, cur.n.maxLen-cur.chars)
		}
		if upTo := v.fitUpTo[room]; int(upTo) > len(v.fit)/2 {
			copy(dst, v.fitMask)
			for _, id := range v.fit[upTo:] {
				dst[id] = false
			}
		} else {
			clear(dst)
			for _, id := range v.fit[:upTo] {
				dst[id] = true
			}
		}
		// A token whose first quote closes the string is in if the
		// code points before it fit and what follows may follow the
		// string; a backslash's escape walks the machine; a control
		// byte never fits.
		s.quotes(dst, v, w)
		s.walkString(dst, v, tEscape, w)
	default:
		clear(dst)
		s.walkString(dst, v, tAny, w)
	}
}

// walk sets dst for the tokens among nodes lo to hi-1 (a node and its
// subtree, or the whole trie) whose keys the machine takes from
// sims[depth[lo]-1], stepping one trial state a depth.
func (t *trie) walk(dst []bool, lo, hi int, w *walker) {
	sims := w.sims
	for i := lo; i < hi; {
		d := t.depth[i]
		m := &sims[d]
		m.set(&sims[d-1])
		if !m.step(t.c[i]) {
			i = int(t.skip[i])
			continue
		}
		if w.then != nil && m.cur.mode == mDone {
			t.finish(dst, i, int(d), w)
			i = int(t.skip[i])
			continue
		}
		t.mark(dst, i, tAny)
		i++
	}
}

// finish sets dst for the tokens under node i, in whose keys the value
// became whole at the node's byte (depth d): each is in if then takes
// the rest of its bytes.
func (t *trie) finish(dst []bool, i, d int, w *walker) {
	for _, id := range t.ids[t.at[i]:t.at[t.skip[i]]] {
		tok := w.toks[id]
		off := d
		if t.suffix {
			off += firstOther(tok)
		}
		dst[id] = w.then(tok[off:])
	}
}

// mark sets dst for node i's tokens of the kinds want.
func (t *trie) mark(dst []bool, i int, want uint8) {
	lo, hi := t.at[i], t.at[i+1]
	for j, id := range t.ids[lo:hi] {
		if t.kinds[int(lo)+j]&want != 0 {
			dst[id] = true
		}
	}
}

// Select sets dst[id] (len(dst) >= the vocabulary's size) to whether
// alive takes token id's bytes, for a reader of bytes in order that
// never takes what extends bytes it refused (a literal, a name from a
// list, a machine without going back): alive is asked about the
// prefixes of the tokens under prefixes it took, each once, in
// depth-first order, and a refused prefix's tokens are all out, so where
// few tokens may follow it costs a few of alive's runs per byte taken
// rather than a run over every token. Empty tokens are out. The prefix
// alive gets is valid only during its call.
func (v *Vocab) Select(dst []bool, alive func(prefix []byte) bool) {
	clear(dst[:len(v.toks)])
	t := &v.all
	w := v.walkers.Get().(*walker)
	defer v.walkers.Put(w)
	if len(w.prefix) < t.maxDepth {
		w.prefix = make([]byte, t.maxDepth)
	}
	p := w.prefix
	for i := 0; i < len(t.c); {
		d := int(t.depth[i])
		p[d-1] = t.c[i]
		if !alive(p[:d]) {
			i = int(t.skip[i])
			continue
		}
		t.mark(dst, i, tAny)
		i++
	}
}

// walkString sets dst for the tokens of the kinds want that may follow
// inside a bounded or patterned string and returns the plain nodes it
// stepped. A plain byte changes only the string's count (or automaton
// state), so plain prefixes walk on that alone. At a quote where the
// string may close, the tokens under it take closedAfter's answer (or,
// with w.collect, are listed in w.quoteIDs); at a backslash or control
// byte the state is made whole (the cursor with the prefix's count or
// automaton state) and the subtree walks the machine.
func (s *State) walkString(dst []bool, v *Vocab, want uint8, w *walker) (steps int) {
	t := &v.all
	n := s.cur.n
	pat := n.pat
	counts, dfas := w.counts, w.dfas
	counts[0], dfas[0] = s.cur.utf8Count, s.cur.dfa
	for i := 0; i < len(t.c); {
		if t.has[i]&want == 0 {
			i = int(t.skip[i])
			continue
		}
		d, c := t.depth[i], t.c[i]
		if c == '"' && want&tQuote != 0 {
			// The close leaves one state whatever the string held: the
			// tokens under every quote take what follows it from one
			// reading of those bytes, rather than the machine once a
			// prefix.
			closes := pat != nil && pat.accept[dfas[d-1]] || pat == nil && counts[d-1].need == 0 && counts[d-1].chars >= n.minLen
			switch {
			case closes && w.collect:
				w.quoteIDs = append(w.quoteIDs, t.ids[t.at[i]:t.at[t.skip[i]]]...)
			case closes:
				closed := s.closedAfter(v, w)
				for _, id := range t.ids[t.at[i]:t.at[t.skip[i]]] {
					if closed[id] {
						dst[id] = true
					}
				}
			}
			i = int(t.skip[i])
			continue
		}
		if c == '"' || c == '\\' || c < 0x20 {
			if want&tOther != 0 {
				m := &w.sims[d-1]
				s.run(m, nil)
				m.cur.utf8Count, m.cur.dfa = counts[d-1], dfas[d-1]
				t.walk(dst, i, int(t.skip[i]), w)
			}
			i = int(t.skip[i])
			continue
		}
		steps++
		if pat != nil {
			dfas[d] = pat.step(dfas[d-1], c)
			if dfas[d] < 0 {
				i = int(t.skip[i])
				continue
			}
		} else {
			counts[d] = counts[d-1]
			if !counts[d].take(c, n.maxLen) {
				i = int(t.skip[i])
				continue
			}
		}
		t.mark(dst, i, want)
		i++
	}
	return steps
}

// quotes sets dst for the tQuote tokens inside a counted string s is in
// with no character cut: those whose code points before the quote reach
// the string's minLength and fit its maxLength, and whose bytes after it
// closedAfter takes.
func (s *State) quotes(dst []bool, v *Vocab, w *walker) {
	n, chars := s.cur.n, s.cur.chars
	lo, hi := max(n.minLen-chars, 0), len(v.quoteFitUpTo)-1
	if n.maxLen >= 0 {
		hi = min(hi, n.maxLen-chars)
	}
	if lo > hi || len(v.quoteFit) == 0 {
		return
	}
	from := int32(0)
	if lo > 0 {
		from = v.quoteFitUpTo[lo-1]
	}
	closed := s.closedAfter(v, w)
	for _, id := range v.quoteFit[from:v.quoteFitUpTo[hi]] {
		if closed[id] {
			dst[id] = true
		}
	}
}

// closedAfter returns w.closed set, for the tokens whose first quote,
// backslash or control byte is a quote, to whether their bytes after it
// may follow the close of the bounded or patterned string s is in (the
// string's own checks at the close aside): the bytes from the quote on,
// keys of v.rest, are walked once from the state the close leaves.
func (s *State) closedAfter(v *Vocab, w *walker) []bool {
	if w.closedSet {
		return w.closed
	}
	w.closedSet = true
	if len(w.closed) < len(v.toks) {
		w.closed = make([]bool, len(v.toks))
	}
	t, r := &v.rest, int(v.quote)
	for _, id := range t.ids[t.at[r]:t.at[t.skip[r]]] {
		w.closed[id] = false
	}
	m := &w.sims[1]
	s.run(m, nil)
	m.valueEnd() // what the string's closing quote does
	if w.then != nil && m.cur.mode == mDone {
		t.finish(w.closed, r, 1, w)
		return w.closed
	}
	t.mark(w.closed, r, tAny)
	t.walk(w.closed, r+1, int(t.skip[r]), w)
	return w.closed
}

// maskCache holds the masks of the plain tokens inside patterned strings
// by automaton state, each with its list of the quote tokens whose
// string may close at their quote, the last maskCacheSize made: a generation inside
// such a string revisits few states, and a mask where most tokens are
// in takes the walk through most of the trie.
type maskCache struct {
	mu    sync.Mutex
	masks map[maskKey]maskEntry
	order [maskCacheSize]maskKey
	next  int
}

type maskEntry struct {
	bits   []uint64 // the plain tokens' mask, a bit a token
	quotes []int32  // the quote tokens whose string may close at their quote
}

const maskCacheSize = 64

type maskKey struct {
	pat *dfa
	st  int32
}

// load sets dst to the plain tokens' mask of pat's state st and returns
// its quote tokens, if they are held. The list is shared: read only.
func (c *maskCache) load(dst []bool, pat *dfa, st int32) ([]int32, bool) {
	c.mu.Lock()
	e, ok := c.masks[maskKey{pat, st}]
	c.mu.Unlock()
	if !ok {
		return nil, false
	}
	for i := range dst {
		dst[i] = e.bits[i/64]&(1<<(i%64)) != 0
	}
	return e.quotes, true
}

// store keeps dst and a copy of quotes as pat's state st's.
func (c *maskCache) store(dst []bool, quotes []int32, pat *dfa, st int32) {
	bits := make([]uint64, (len(dst)+63)/64)
	for i, in := range dst {
		if in {
			bits[i/64] |= 1 << (i % 64)
		}
	}
	k := maskKey{pat, st}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.masks == nil {
		c.masks = make(map[maskKey]maskEntry)
	}
	if _, ok := c.masks[k]; ok {
		return
	}
	delete(c.masks, c.order[c.next]) // the oldest, once full
	c.order[c.next] = k
	c.next = (c.next + 1) % maskCacheSize
	c.masks[k] = maskEntry{bits, slices.Clone(quotes)}
}
