// Package jsonprefix decides, byte by byte, whether text begins one JSON
// object (RFC 8259), so that a generation can be held to JSON: before
// each token, only tokens whose bytes keep the text such a prefix may be
// drawn.
//
// Strings take any byte but the quote, the backslash and controls below
// 0x20 (UTF-8 is not validated: a token may end inside a character).
// Outside strings at most MaxSpace white-space bytes may follow one
// another, so that a generation cannot run on in white space (deep
// indentation still fits).
package jsonprefix

// MaxSpace is the longest run of white space allowed outside strings.
const MaxSpace = 32

// mode is what the next byte may be.
type mode uint8

const (
	mStart      mode = iota // before the object: white space or '{'
	mKeyOrEnd               // after '{': a key or '}'
	mKey                    // after ',' in an object: a key
	mColon                  // after a key
	mValue                  // after ':' or ',' in an array
	mValueOrEnd             // after '[': a value or ']'
	mAfter                  // after a value in a container: ',' or its close
	mDone                   // the object closed: white space only
	mString                 // in a string
	mEscape                 // after a backslash in a string
	mHex                    // in a \u escape (hex digits left in n)
	mMinus                  // after a number's '-'
	mZero                   // a number's leading 0
	mInt                    // in a number's integer digits
	mFracStart              // after '.'
	mFrac                   // in the fraction's digits
	mExpStart               // after 'e' or 'E'
	mExpSign                // after the exponent's sign
	mExp                    // in the exponent's digits
	mLiteral                // in true, false or null (the rest in lit)
)

// State is the parse of the bytes fed so far. The zero value is the
// state before any byte.
type State struct {
	stack []byte // open containers, '{' or '['
	cur   cursor
}

// cursor is everything but the stack.
type cursor struct {
	mode mode
	key  bool   // the string being read is a key
	n    uint8  // mHex: hex digits left
	ws   uint8  // white-space bytes just taken outside strings
	lit  string // mLiteral: bytes left
}

// Done reports whether the bytes fed are one whole JSON object (and maybe
// white space after it).
func (s *State) Done() bool { return s.cur.mode == mDone }

// InString reports whether the bytes fed end inside a string (not in an
// escape), where any plain bytes may follow (Vocab.Plain).
func (s *State) InString() bool { return s.cur.mode == mString }

// Feed advances over b and reports whether the text is still a prefix of
// one JSON object; on false the state is unchanged.
func (s *State) Feed(b []byte) bool {
	sm, ok := s.trial(b)
	if ok {
		s.stack = append(append(s.stack[:sm.depth], sm.local[:sm.n]...), sm.spill...)
		s.cur = sm.cur
	}
	return ok
}

// Accepts reports whether b may follow the bytes fed so far.
func (s *State) Accepts(b []byte) bool {
	_, ok := s.trial(b)
	return ok
}

// trial runs b over the state without changing it.
func (s *State) trial(b []byte) (sim, bool) {
	sm := sim{cur: s.cur, base: s.stack, depth: len(s.stack)}
	for _, c := range b {
		if !sm.step(c) {
			return sm, false
		}
	}
	return sm, true
}

// sim runs bytes over a state without changing it: the stack is the
// first depth entries of base under the entries pushed since (local[:n],
// then spill), kept in the struct so that a trial allocates nothing.
type sim struct {
	cur   cursor
	base  []byte
	depth int
	local [16]byte
	n     int
	spill []byte
}

func (m *sim) top() byte {
	switch {
	case len(m.spill) > 0:
		return m.spill[len(m.spill)-1]
	case m.n > 0:
		return m.local[m.n-1]
	case m.depth > 0:
		return m.base[m.depth-1]
	}
	return 0
}

func (m *sim) push(c byte) {
	if m.n < len(m.local) && len(m.spill) == 0 {
		m.local[m.n] = c
		m.n++
	} else {
		m.spill = append(m.spill, c)
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

func (m *sim) empty() bool { return len(m.spill) == 0 && m.n == 0 && m.depth == 0 }

func space(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func digit(c byte) bool { return c >= '0' && c <= '9' }

// step takes one byte.
func (m *sim) step(c byte) bool {
	if md := m.cur.mode; space(c) && md != mString && md != mEscape && md != mHex {
		if m.cur.ws == MaxSpace {
			return false
		}
		m.cur.ws++
	} else {
		m.cur.ws = 0
	}
	return m.take(c)
}

// take is step without the white-space count.
func (m *sim) take(c byte) bool {
	cur := &m.cur
	switch cur.mode {
	case mStart:
		switch {
		case space(c):
			return true
		case c == '{':
			m.push('{')
			cur.mode = mKeyOrEnd
			return true
		}
		return false
	case mKeyOrEnd, mKey:
		switch {
		case space(c):
			return true
		case c == '"':
			cur.mode, cur.key = mString, true
			return true
		case c == '}' && cur.mode == mKeyOrEnd:
			return m.close('{')
		}
		return false
	case mColon:
		switch {
		case space(c):
			return true
		case c == ':':
			cur.mode = mValue
			return true
		}
		return false
	case mValue, mValueOrEnd:
		if space(c) {
			return true
		}
		if c == ']' && cur.mode == mValueOrEnd {
			return m.close('[')
		}
		return m.value(c)
	case mAfter:
		return m.after(c)
	case mDone:
		return space(c)
	case mString:
		switch {
		case c == '"':
			if cur.key {
				cur.mode, cur.key = mColon, false
			} else {
				cur.mode = mAfter
			}
			return true
		case c == '\\':
			cur.mode = mEscape
			return true
		}
		return c >= 0x20
	case mEscape:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			cur.mode = mString
			return true
		case 'u':
			cur.mode, cur.n = mHex, 4
			return true
		}
		return false
	case mHex:
		if !digit(c) && !(c >= 'a' && c <= 'f') && !(c >= 'A' && c <= 'F') {
			return false
		}
		if cur.n--; cur.n == 0 {
			cur.mode = mString
		}
		return true
	case mMinus:
		switch {
		case c == '0':
			cur.mode = mZero
			return true
		case digit(c):
			cur.mode = mInt
			return true
		}
		return false
	case mZero, mInt:
		switch {
		case digit(c) && cur.mode == mInt:
			return true
		case c == '.':
			cur.mode = mFracStart
			return true
		case c == 'e' || c == 'E':
			cur.mode = mExpStart
			return true
		}
		return m.after(c)
	case mFracStart:
		if digit(c) {
			cur.mode = mFrac
			return true
		}
		return false
	case mFrac:
		switch {
		case digit(c):
			return true
		case c == 'e' || c == 'E':
			cur.mode = mExpStart
			return true
		}
		return m.after(c)
	case mExpStart:
		switch {
		case c == '+' || c == '-':
			cur.mode = mExpSign
			return true
		case digit(c):
			cur.mode = mExp
			return true
		}
		return false
	case mExpSign:
		if digit(c) {
			cur.mode = mExp
			return true
		}
		return false
	case mExp:
		if digit(c) {
			return true
		}
		return m.after(c)
	case mLiteral:
		if c != cur.lit[0] {
			return false
		}
		if cur.lit = cur.lit[1:]; cur.lit == "" {
			cur.mode = mAfter
		}
		return true
	}
	return false
}

// value starts a value with c.
func (m *sim) value(c byte) bool {
	cur := &m.cur
	switch {
	case c == '{':
		m.push('{')
		cur.mode = mKeyOrEnd
	case c == '[':
		m.push('[')
		cur.mode = mValueOrEnd
	case c == '"':
		cur.mode, cur.key = mString, false
	case c == '-':
		cur.mode = mMinus
	case c == '0':
		cur.mode = mZero
	case digit(c):
		cur.mode = mInt
	case c == 't':
		cur.mode, cur.lit = mLiteral, "rue"
	case c == 'f':
		cur.mode, cur.lit = mLiteral, "alse"
	case c == 'n':
		cur.mode, cur.lit = mLiteral, "ull"
	default:
		return false
	}
	return true
}

// after takes c after a value inside a container.
func (m *sim) after(c byte) bool {
	cur := &m.cur
	switch {
	case space(c):
		cur.mode = mAfter
		return true
	case c == ',':
		if m.top() == '{' {
			cur.mode = mKey
		} else {
			cur.mode = mValue
		}
		return true
	case c == '}':
		return m.close('{')
	case c == ']':
		return m.close('[')
	}
	return false
}

// close ends the innermost container, which must be open.
func (m *sim) close(open byte) bool {
	if m.top() != open {
		return false
	}
	m.pop()
	if m.empty() {
		m.cur.mode = mDone
	} else {
		m.cur.mode = mAfter
	}
	return true
}

// Vocab is a tokenizer's tokens as bytes, with what Mask needs to decide
// most of them without running the parse.
type Vocab struct {
	toks  [][]byte
	plain []bool // no quote, backslash or control byte: stays inside a string
}

// NewVocab indexes toks (token id -> bytes; nil or empty for a token that
// may never be drawn).
func NewVocab(toks [][]byte) *Vocab {
	v := &Vocab{toks: toks, plain: make([]bool, len(toks))}
	for id, t := range toks {
		p := len(t) > 0
		for _, c := range t {
			if c == '"' || c == '\\' || c < 0x20 {
				p = false
				break
			}
		}
		v.plain[id] = p
	}
	return v
}

// Tokens returns the token bytes NewVocab indexed (not a copy).
func (v *Vocab) Tokens() [][]byte { return v.toks }

// Plain reports whether token id has no quote, backslash or control
// byte: inside a string it stays inside the string.
func (v *Vocab) Plain(id int) bool { return v.plain[id] }

// Mask sets dst[id] (len(dst) >= the vocabulary's size) to whether token
// id may follow the bytes fed so far. Inside a string a plain token is in
// at once; elsewhere a token whose first byte cannot follow is out at
// once; the rest run the parse.
func (s *State) Mask(dst []bool, v *Vocab) {
	var first [256]bool
	for c := range first {
		first[c] = s.Accepts([]byte{byte(c)})
	}
	inString := s.cur.mode == mString
	for id, t := range v.toks {
		switch {
		case len(t) == 0 || !first[t[0]]:
			dst[id] = false
		case inString && v.plain[id]:
			dst[id] = true
		default:
			dst[id] = s.Accepts(t)
		}
	}
}

// Span reports how many bytes of b the object takes: with closed, n is
// where it closes (the bytes after it are not its); else b leaves it open
// (n = len(b)). ok is false when b cannot follow. The state is unchanged.
func (s *State) Span(b []byte) (n int, closed, ok bool) {
	if s.cur.mode == mDone {
		return 0, true, true
	}
	sm := sim{cur: s.cur, base: s.stack, depth: len(s.stack)}
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
