package jsonschema

import (
	"math/bits"
	"slices"
)

// mode is what the next byte may be.
type mode uint8

const (
	mValue      mode = iota // a value of cur.n (white space first)
	mValueOrEnd             // after '[': an item or ']'
	mKeyOrEnd               // after '{': a key or '}'
	mKey                    // after ',' in an object: a key
	mKeyString              // in a key (candidates names[lo:hi], off bytes matched; free: an undeclared key may follow)
	mColon                  // after a key (its value's schema in cur.n)
	mAfter                  // after a value in a container: ',' or its close
	mDone                   // the value is whole: white space only
	mString                 // in a string of cur.n
	mEscape                 // after a backslash in a string
	mHex                    // in a \u escape (hex digits left in hex)
	mMinus                  // after a number's '-'
	mZero                   // a number's leading 0
	mInt                    // in a number's integer digits
	mFracStart              // after '.'
	mFrac                   // in the fraction's digits
	mExpStart               // after 'e' or 'E'
	mExpSign                // after the exponent's sign
	mExp                    // in the exponent's digits
	mWord                   // in true, false or null (the rest in word)
	mLiteral                // in an enum/const literal (candidates cur.n.lits[lo:hi], off bytes matched)
)

// frame is an open container.
type frame struct {
	n     *node
	obj   bool
	used  uint64 // an object's properties taken (bits of n.names); a unique array's literals
	count int    // an array's items begun
	keys  int    // an object's properties taken, declared or not
}

// utf8Count is a bounded string's length so far and the UTF-8 character in
// progress.
type utf8Count struct {
	chars int   // code points
	need  uint8 // continuation bytes the character still needs
	u8lo  byte  // the next continuation byte's range
	u8hi  byte
}

// take reads byte c, not a quote, of a string of at most maxLen code
// points (-1: any) written as valid UTF-8 (a backslash counts as the
// code point its escape writes).
func (k *utf8Count) take(c byte, maxLen int) bool {
	if k.need > 0 {
		if c < k.u8lo || c > k.u8hi {
			return false
		}
		k.need--
		k.u8lo, k.u8hi = 0x80, 0xBF
		return true
	}
	if c < 0x20 || maxLen >= 0 && k.chars == maxLen {
		return false
	}
	k.u8lo, k.u8hi = 0x80, 0xBF
	switch {
	case c < 0x80:
	case c >= 0xC2 && c <= 0xDF:
		k.need = 1
	case c == 0xE0:
		k.need, k.u8lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC, c == 0xEE, c == 0xEF:
		k.need = 2
	case c == 0xED:
		k.need, k.u8hi = 2, 0x9F
	case c == 0xF0:
		k.need, k.u8lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		k.need = 3
	case c == 0xF4:
		k.need, k.u8hi = 3, 0x8F
	default:
		return false
	}
	k.chars++
	return true
}

// cursor is everything but the stack.
type cursor struct {
	mode      mode
	n         *node
	lo, hi    int
	off       int
	free      bool
	utf8Count // a bounded string's
	hex       uint8
	ws        uint8 // white-space bytes just taken outside strings
	word      string
	bounded   bool  // the string has a length bound, a pattern or a format
	inKey     bool  // mEscape, mHex: the escape is in a key
	neg       bool  // a bounded number's sign
	val       int64 // its integer digits so far (saturating at maxBound)
	digits    int16 // a number's integer digits (none for a leading 0), at most maxMagnitude
	exp       int16 // its exponent so far while not negative (-1 once it is)
	frac      int64 // its first fraction digits (as many as its bounds have)
	fd        uint8 // fraction digits read, at most one more than those
	extra     bool  // a nonzero fraction digit past those
	dfa       int32 // a patterned string's automaton state
	uniq      bool  // the value is an item of an array under uniqueItems
}

// State is the text read so far against a schema. A copy shares the
// original's stack: either may be read (Accepts, Span, Mask), but once
// one is fed the other must not be used.
type State struct {
	stack []frame
	cur   cursor
}

// Start returns the state before any byte.
func (s *Schema) Start() State {
	return State{cur: cursor{mode: mValue, n: s.root}}
}

// Done reports whether the text is one whole value and nothing but white
// space may follow.
func (s *State) Done() bool { return s.cur.mode == mDone }

// Complete reports whether the text is one whole value, though more may
// follow (a number's digits).
func (s *State) Complete() bool {
	if s.cur.mode == mDone {
		return true
	}
	if len(s.stack) != 0 {
		return false
	}
	switch s.cur.mode {
	case mZero, mInt, mFrac:
		return s.cur.within()
	case mExp:
		return true
	case mLiteral:
		return s.cur.exact() >= 0
	}
	return false
}

// InFreeString reports whether the text ends inside a string that takes
// any plain bytes (no length bound, not a key or a literal).
func (s *State) InFreeString() bool { return s.cur.mode == mString && !s.cur.bounded }

// Feed advances over b and reports whether the text is still a prefix of
// a value the schema admits; on false the state is unchanged.
func (s *State) Feed(b []byte) bool {
	var sm sim
	if !s.run(&sm, b) {
		return false
	}
	s.stack = append(append(s.stack[:sm.depth], sm.local[:sm.n]...), sm.spill...)
	s.cur = sm.cur
	return true
}

// Accepts reports whether b may follow the text read so far.
func (s *State) Accepts(b []byte) bool {
	var sm sim
	return s.run(&sm, b)
}

// run sets m to the state (reusing its spill) and takes b over it.
func (s *State) run(m *sim, b []byte) bool {
	m.cur, m.base, m.depth, m.n, m.spill = s.cur, s.stack, len(s.stack), 0, m.spill[:0]
	for _, c := range b {
		if !m.step(c) {
			return false
		}
	}
	return true
}

// Clone returns a copy of s that can be fed without touching s.
func (s *State) Clone() State { return State{stack: slices.Clone(s.stack), cur: s.cur} }

// Admits reports how many of toks, one after another, may follow the
// text read so far: the count of those before the first whose bytes
// cannot (an empty one counts as one that cannot). The state is
// unchanged.
func (s *State) Admits(toks [][]byte) int {
	var sm sim
	s.run(&sm, nil)
	for i, t := range toks {
		if len(t) == 0 {
			return i
		}
		for _, c := range t {
			if !sm.step(c) {
				return i
			}
		}
	}
	return len(toks)
}

// Span reports how many bytes of b the value takes: with done, n is where
// it becomes whole with nothing more to read (the bytes after it are not
// its); else b leaves it open (n = len(b)). ok is false when b cannot
// follow. The state is unchanged.
func (s *State) Span(b []byte) (n int, done, ok bool) {
	if s.cur.mode == mDone {
		return 0, true, true
	}
	var sm sim
	s.run(&sm, nil)
	for i, c := range b {
		if !sm.step(c) {
			return i, false, false
		}
		if sm.cur.mode == mDone {
			return i + 1, true, true
		}
	}
	return len(b), false, true
}

// sim runs bytes over a state without changing it: the stack is the
// first depth frames of base under the frames pushed (or copied to be
// changed) since, local[:n] then spill, so that a trial allocates
// nothing unless it opens many containers.
type sim struct {
	cur   cursor
	base  []frame
	depth int
	local [16]frame
	n     int
	spill []frame
}

// set makes m a copy of src that can be stepped without changing it.
func (m *sim) set(src *sim) {
	m.cur, m.base, m.depth, m.n = src.cur, src.base, src.depth, src.n
	copy(m.local[:src.n], src.local[:src.n])
	m.spill = append(m.spill[:0], src.spill...)
}

func (m *sim) empty() bool { return len(m.spill) == 0 && m.n == 0 && m.depth == 0 }

// top is the innermost open container, which the caller may change.
func (m *sim) top() *frame {
	switch {
	case len(m.spill) > 0:
		return &m.spill[len(m.spill)-1]
	case m.n > 0:
		return &m.local[m.n-1]
	}
	m.depth--
	m.push(m.base[m.depth]) // copied before it is changed
	return m.top()
}

func (m *sim) push(f frame) {
	if m.n < len(m.local) && len(m.spill) == 0 {
		m.local[m.n] = f
		m.n++
	} else {
		m.spill = append(m.spill, f)
	}
}

func (m *sim) pop() {
	switch {
	case len(m.spill) > 0:
		m.spill = m.spill[:len(m.spill)-1]
	case m.n > 0:
		m.n--
	default:
		m.depth--
	}
}

func space(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func digit(c byte) bool { return c >= '0' && c <= '9' }

func hexDigit(c byte) bool { return digit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// outside reports whether the mode reads white space as such.
func outside(md mode) bool {
	switch md {
	case mString, mEscape, mHex, mKeyString, mLiteral:
		return false
	}
	return true
}

func (m *sim) step(c byte) bool {
	if space(c) && outside(m.cur.mode) {
		if m.cur.ws == MaxSpace {
			return false
		}
		m.cur.ws++
	} else {
		m.cur.ws = 0
	}
	return m.take(c)
}

func (m *sim) take(c byte) bool {
	cur := &m.cur
	switch cur.mode {
	case mValue:
		return space(c) || m.value(c)
	case mValueOrEnd:
		f := m.top()
		switch {
		case space(c):
			return true
		case c == ']':
			return f.count >= f.n.minItems && m.close()
		}
		if !f.roomForItem() {
			return false
		}
		cur.n, cur.uniq = f.n.item(f.count), f.n.unique
		f.count++
		return m.value(c)
	case mKeyOrEnd, mKey:
		f := m.top()
		switch {
		case space(c):
			return true
		case c == '}' && cur.mode == mKeyOrEnd:
			return f.closable() && m.close()
		case c == '"' && f.roomForKey():
			cur.mode, cur.lo, cur.hi, cur.off, cur.free = mKeyString, 0, len(f.n.names), 0, f.n.additional != nil && !f.tight()
			cur.bounded = false
			return true
		}
		return false
	case mKeyString:
		return m.key(c)
	case mColon:
		switch {
		case space(c):
			return true
		case c == ':':
			cur.mode, cur.uniq = mValue, false
			return true
		}
		return false
	case mAfter:
		return m.after(c)
	case mDone:
		return space(c)
	case mString:
		return m.str(c)
	case mEscape:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			cur.mode = cur.escaped()
			return true
		case 'u':
			if cur.bounded {
				return false // a \u pair would count as two code points
			}
			cur.mode, cur.hex = mHex, 4
			return true
		}
		return false
	case mHex:
		if !hexDigit(c) {
			return false
		}
		if cur.hex--; cur.hex == 0 {
			cur.mode = cur.escaped()
		}
		return true
	case mMinus:
		switch {
		case c == '0':
			cur.mode = mZero
			return cur.fits()
		case digit(c):
			cur.mode, cur.val, cur.digits = mInt, int64(c-'0'), 1
			return cur.fits()
		}
		return false
	case mZero, mInt:
		fraction := cur.n.kinds&kNumber != 0
		switch {
		case digit(c) && cur.mode == mInt:
			if cur.digits >= maxMagnitude {
				return false
			}
			cur.val, cur.digits = appendDigit(cur.val, c), cur.digits+1
			return cur.fits()
		case c == '.' && fraction:
			cur.mode, cur.frac, cur.fd, cur.extra = mFracStart, 0, 0, false
			return cur.fits()
		case (c == 'e' || c == 'E') && fraction && !cur.ranged(): // a bounded number is written without exponent
			cur.mode = mExpStart
			return true
		}
		return m.ended(c)
	case mFracStart:
		if digit(c) {
			cur.mode = mFrac
			cur.fracDigit(c)
			return cur.fits()
		}
		return false
	case mFrac:
		switch {
		case digit(c):
			cur.fracDigit(c)
			return cur.fits()
		case (c == 'e' || c == 'E') && !cur.ranged():
			cur.mode = mExpStart
			return true
		}
		return m.ended(c)
	case mExpStart:
		switch {
		case c == '+' || c == '-':
			cur.mode, cur.exp = mExpSign, 0
			if c == '-' {
				cur.exp = -1
			}
			return true
		case digit(c):
			cur.mode, cur.exp = mExp, 0
			return cur.expDigit(c)
		}
		return false
	case mExpSign:
		if digit(c) {
			cur.mode = mExp
			return cur.expDigit(c)
		}
		return false
	case mExp:
		if digit(c) {
			return cur.expDigit(c)
		}
		return m.ended(c)
	case mWord:
		if c != cur.word[0] {
			return false
		}
		if cur.word = cur.word[1:]; cur.word == "" {
			m.valueEnd()
		}
		return true
	case mLiteral:
		return m.literal(c)
	}
	return false
}

// maxMagnitude bounds the numbers written: below 10^maxMagnitude, within
// float64's range (I-JSON, RFC 7493: a number beyond it is valid JSON
// that many readers refuse, Go's encoding/json among them). A number of
// d integer digits (none for a leading 0) and exponent e is below
// 10^(d+e): its integer digits and positive exponent keep d+e at most
// maxMagnitude.
const maxMagnitude = 308

// expDigit takes an exponent's digit: a negative exponent any, a positive
// one while the number stays below 10^maxMagnitude.
func (cur *cursor) expDigit(c byte) bool {
	if cur.exp < 0 {
		return true
	}
	e := cur.exp*10 + int16(c-'0')
	if cur.digits+e > maxMagnitude {
		return false
	}
	cur.exp = e
	return true
}

// escaped is the mode an escape returns to.
func (cur *cursor) escaped() mode {
	if cur.inKey {
		return mKeyString
	}
	return mString
}

// roomForItem reports whether an array may take another item.
func (f *frame) roomForItem() bool {
	return f.n.item(f.count) != nil && (f.n.maxItems < 0 || f.count < f.n.maxItems) &&
		(!f.n.unique || bits.OnesCount64(f.used) < len(f.n.items.lits))
}

// roomForKey reports whether an object may take another property.
func (f *frame) roomForKey() bool {
	if f.n.maxProps >= 0 && f.keys >= f.n.maxProps {
		return false
	}
	if f.n.additional != nil && !f.tight() {
		return true
	}
	for i, p := range f.n.props {
		if p != nil && f.used&(1<<i) == 0 && f.allowed(i) {
			return true
		}
	}
	return false
}

// closable reports whether an object may close: its required properties
// and minProperties are there.
func (f *frame) closable() bool {
	return f.used&f.n.required == f.n.required && bits.OnesCount64(f.used) >= f.n.minProps
}

// owed is what the object still needs of its declared properties: the
// missing required ones, and how many more minProperties asks for.
func (f *frame) owed() (missing, more int) {
	missing = bits.OnesCount64(f.n.required &^ f.used)
	return missing, f.n.minProps - bits.OnesCount64(f.used)
}

// tight reports whether maxProperties leaves room only for what the
// object still needs: then each key must lower it.
func (f *frame) tight() bool {
	if f.n.maxProps < 0 {
		return false
	}
	missing, more := f.owed()
	return f.n.maxProps-f.keys <= max(missing, more)
}

// allowed reports whether unused declared property i may be the next
// key: any, or when the room is tight one that lowers what is owed (a
// missing required one, or any while minProperties asks for more than
// the required ones).
func (f *frame) allowed(i int) bool {
	if !f.tight() {
		return true
	}
	missing, more := f.owed()
	return f.n.required&(1<<i) != 0 || more > missing
}

// value starts a value of cur.n with c.
func (m *sim) value(c byte) bool {
	cur := &m.cur
	n := cur.n
	if lo, hi := litRange(n.lits, 0, len(n.lits), 0, c); lo < hi && m.free(lo, hi) {
		cur.mode, cur.lo, cur.hi, cur.off = mLiteral, lo, hi, 1
		m.literalTaken()
		return true
	}
	switch {
	case c == '{' && n.kinds&kObject != 0:
		m.push(frame{n: n, obj: true})
		cur.mode = mKeyOrEnd
	case c == '[' && n.kinds&kArray != 0:
		m.push(frame{n: n})
		cur.mode = mValueOrEnd
	case c == '"' && n.kinds&kString != 0:
		cur.mode, cur.chars, cur.need, cur.inKey, cur.dfa = mString, 0, 0, false, 0
		cur.bounded = n.minLen > 0 || n.maxLen >= 0 || n.pat != nil
	case c == '-' && n.kinds&(kInteger|kNumber) != 0:
		cur.mode, cur.neg, cur.val, cur.digits = mMinus, true, 0, 0
		return cur.fits()
	case c == '0' && n.kinds&(kInteger|kNumber) != 0:
		cur.mode, cur.neg, cur.val, cur.digits = mZero, false, 0, 0
		return cur.fits()
	case digit(c) && n.kinds&(kInteger|kNumber) != 0:
		cur.mode, cur.neg, cur.val, cur.digits = mInt, false, int64(c-'0'), 1
		return cur.fits()
	case c == 't' && n.kinds&kBool != 0:
		cur.mode, cur.word = mWord, "rue"
	case c == 'f' && n.kinds&kBool != 0:
		cur.mode, cur.word = mWord, "alse"
	case c == 'n' && n.kinds&kNull != 0:
		cur.mode, cur.word = mWord, "ull"
	default:
		return false
	}
	return true
}

// litRange narrows the sorted candidates l[lo:hi], which agree on their
// first off bytes, to those whose next byte is c.
func litRange(l []string, lo, hi, off int, c byte) (int, int) {
	a := lo
	for a < hi && (len(l[a]) <= off || l[a][off] < c) {
		a++
	}
	b := a
	for b < hi && len(l[b]) > off && l[b][off] == c {
		b++
	}
	return a, b
}

// exact is the literal candidate matched whole, or -1.
func (cur *cursor) exact() int {
	if cur.mode == mLiteral && cur.lo < cur.hi && len(cur.n.lits[cur.lo]) == cur.off {
		return cur.lo // sorted: a whole match sorts first
	}
	return -1
}

// literalTaken ends the literal once no candidate is longer than the
// bytes matched.
func (m *sim) literalTaken() {
	cur := &m.cur
	if e := cur.exact(); e >= 0 && !m.longer() && m.mark(e) {
		m.valueEnd()
	}
}

// The literals of an array under uniqueItems are its items' enum or
// const (compile.go): the array's frame marks those written, which its
// items may not write again.

// free reports whether a candidate in lits[lo:hi] may still be written.
func (m *sim) free(lo, hi int) bool {
	if !m.cur.uniq {
		return true
	}
	used := m.top().used
	for i := lo; i < hi; i++ {
		if used&(1<<i) == 0 {
			return true
		}
	}
	return false
}

// longer reports whether a candidate longer than the bytes matched may
// still be written.
func (m *sim) longer() bool {
	cur := &m.cur
	if !cur.uniq {
		return len(cur.n.lits[cur.hi-1]) > cur.off // sorted: the longest is last
	}
	used := m.top().used
	for i := cur.lo; i < cur.hi; i++ {
		if len(cur.n.lits[i]) > cur.off && used&(1<<i) == 0 {
			return true
		}
	}
	return false
}

// mark marks literal e written, if it may be.
func (m *sim) mark(e int) bool {
	if !m.cur.uniq {
		return true
	}
	f := m.top()
	if f.used&(1<<e) != 0 {
		return false
	}
	f.used |= 1 << e
	return true
}

func (m *sim) literal(c byte) bool {
	cur := &m.cur
	if lo, hi := litRange(cur.n.lits, cur.lo, cur.hi, cur.off, c); lo < hi && m.free(lo, hi) {
		cur.lo, cur.hi, cur.off = lo, hi, cur.off+1
		m.literalTaken()
		return true
	}
	if e := cur.exact(); e < 0 || !m.mark(e) {
		return false
	}
	return m.ended(c) // a number literal another one extends ("1" of 1 and 12)
}

// key takes c in a key.
func (m *sim) key(c byte) bool {
	cur := &m.cur
	f := m.top()
	n := f.n
	if c == '"' {
		for i := cur.lo; i < cur.hi; i++ {
			if len(n.names[i]) == cur.off {
				if f.used&(1<<i) != 0 || n.props[i] == nil || !f.allowed(i) {
					return false // taken, admits no value, or no room for it
				}
				f.used |= 1 << i
				f.keys++
				cur.mode, cur.n = mColon, n.props[i]
				return true
			}
		}
		if !cur.free {
			return false
		}
		f.keys++
		cur.mode, cur.n = mColon, n.additional
		return true
	}
	if c == '\\' && cur.free && len(n.names) == 0 {
		// Escapes only where no declared name can be spelled another
		// way (an escaped key would escape its declared schema).
		cur.mode, cur.inKey = mEscape, true
		return true
	}
	lo, hi := litRange(n.names, cur.lo, cur.hi, cur.off, c)
	open := false
	for i := lo; i < hi; i++ {
		if f.used&(1<<i) == 0 && n.props[i] != nil && f.allowed(i) {
			open = true
			break
		}
	}
	free := cur.free && c >= 0x20 && c != '\\'
	if !open && !free {
		return false
	}
	cur.lo, cur.hi, cur.off, cur.free = lo, hi, cur.off+1, free
	return true
}

// str takes c in a value string.
func (m *sim) str(c byte) bool {
	cur := &m.cur
	if !cur.bounded {
		switch {
		case c == '"':
			m.valueEnd()
		case c == '\\':
			cur.mode = mEscape
		}
		return c >= 0x20
	}
	n := cur.n
	if n.pat != nil {
		if c == '"' {
			if !n.pat.accept[cur.dfa] {
				return false
			}
			m.valueEnd()
			return true
		}
		next := n.pat.step(cur.dfa, c)
		cur.dfa = next
		return next >= 0
	}
	if c == '"' {
		if cur.need > 0 || cur.chars < n.minLen {
			return false
		}
		m.valueEnd()
		return true
	}
	if !cur.take(c, n.maxLen) {
		return false
	}
	if c == '\\' {
		cur.mode = mEscape
	}
	return true
}

// valueEnd follows a value's last byte.
func (m *sim) valueEnd() {
	if m.empty() {
		m.cur.mode = mDone
	} else {
		m.cur.mode = mAfter
	}
}

// ended takes c after a value that ended without a closing byte (a
// number).
func (m *sim) ended(c byte) bool {
	if !m.cur.within() {
		return false
	}
	m.valueEnd()
	if m.cur.mode == mDone {
		return space(c)
	}
	return m.after(c)
}

// after takes c after a value inside a container.
func (m *sim) after(c byte) bool {
	cur := &m.cur
	if space(c) {
		return true
	}
	f := m.top()
	switch {
	case f.obj && c == ',' && f.roomForKey():
		cur.mode = mKey
		return true
	case f.obj && c == '}':
		return f.closable() && m.close()
	case !f.obj && c == ',' && f.roomForItem():
		cur.mode, cur.n, cur.uniq = mValue, f.n.item(f.count), f.n.unique
		f.count++
		return true
	case !f.obj && c == ']':
		return f.count >= f.n.minItems && m.close()
	}
	return false
}

// close ends the innermost container.
func (m *sim) close() bool {
	m.pop()
	m.valueEnd()
	return true
}
