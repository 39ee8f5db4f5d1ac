package jsonschema

import (
	"encoding/binary"
	"fmt"
	"regexp/syntax"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// maxStates bounds one automaton's states, maxNFA the NFA it is built
// from (counted repetitions are spelled out).
// maxWork bounds the nodes visited while determinizing (a schema comes
// with a request: building its automaton must stay cheap).
const (
	maxStates = 4096
	maxNFA    = 1 << 16
	maxWork   = 1 << 24
)

// dfa reads the bytes of a string written without escapes (the decoded
// string's UTF-8): a deterministic automaton over byte classes whose
// every live state can still reach an accepting one.
type dfa struct {
	class  [256]uint8
	width  int     // classes
	next   []int32 // [state*width + class]: the next state; -1: the byte cannot follow
	accept []bool  // the string may close here
	none   bool    // the start cannot reach an accepting state: no string is admitted
	// special: some state takes a backslash or a control byte (a
	// pattern's never does: it admits unescaped text; a length
	// counter's alone does).
	special bool
}

func (d *dfa) step(s int32, c byte) int32 { return d.next[int(s)*d.width+int(d.class[c])] }

// run is the state after b from st, or -1 if b cannot follow.
func (d *dfa) run(st int32, b []byte) int32 {
	for _, c := range b {
		if st = d.step(st, c); st < 0 {
			break
		}
	}
	return st
}

// matches reports whether d admits the whole string s.
func (d *dfa) matches(s string) bool {
	if d.none {
		return false
	}
	st := d.run(0, []byte(s))
	return st >= 0 && d.accept[st]
}

// writable are the runes a string without escapes can hold raw: no
// control character, quote or backslash (surrogates are not encodable).
var writable = []rune{0x20, 0x21, 0x23, 0x5B, 0x5D, unicode.MaxRune}

// ecmaSpace is ECMA-262's \s (RE2's \s is ASCII only).
const ecmaSpace = `\t\n\v\f\r \x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}\x{feff}`

// ecma rewrites the parts of an ECMA-262 pattern whose meaning differs in
// RE2's syntax: '.' (ECMA leaves out four line terminators, RE2 only
// \n), \s and \S (ECMA's take Unicode spaces), \uXXXX (RE2 has none).
// What RE2 cannot read (lookaround, backreferences) fails to parse after.
func ecma(p string) (string, error) {
	var b strings.Builder
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			i++
			switch d := p[i]; {
			case d == 's' && inClass:
				b.WriteString(ecmaSpace)
			case d == 's':
				b.WriteString("[" + ecmaSpace + "]")
			case d == 'S' && inClass:
				return "", fmt.Errorf(`\S inside a character class`)
			case d == 'S':
				b.WriteString("[^" + ecmaSpace + "]")
			case d == 'u' && i+4 < len(p) && hex4(p[i+1:i+5]):
				b.WriteString(`\x{` + p[i+1:i+5] + `}`)
				i += 4
			default:
				b.WriteByte('\\')
				b.WriteByte(d)
			}
		case c == '[' && !inClass:
			inClass = true
			b.WriteByte(c)
			if i+1 < len(p) && p[i+1] == '^' {
				i++
				b.WriteByte('^')
			}
			if i+1 < len(p) && p[i+1] == ']' {
				return "", fmt.Errorf("an empty character class ([] or [^])")
			}
		case c == '[' && i+1 < len(p) && p[i+1] == ':':
			return "", fmt.Errorf("[: inside a character class (a POSIX class in RE2, two characters in ECMA-262)")
		case c == ']' && inClass:
			inClass = false
			b.WriteByte(c)
		case c == '.' && !inClass:
			b.WriteString(`[^\n\r\x{2028}\x{2029}]`)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func hex4(s string) bool {
	for i := 0; i < 4; i++ {
		if !hexDigit(s[i]) {
			return false
		}
	}
	return true
}

// compilePattern builds the automaton of the strings that contain a
// match of an ECMA-262 pattern (JSON Schema's "pattern" is a search: it
// is anchored only where it says ^ or $).
func compilePattern(p string) (*dfa, error) {
	src, err := ecma(p)
	if err != nil {
		return nil, err
	}
	re, err := syntax.Parse(src, syntax.Perl)
	if err != nil {
		return nil, err
	}
	var b nfaBuilder
	match := b.add(nnode{op: nMatch})
	tail := b.anyLoop(match)
	body := b.gen(re.Simplify(), tail)
	head := b.anyLoop(body)
	if b.err != nil {
		return nil, b.err
	}
	return b.determinize(head)
}

// nop is an NFA node's kind.
type nop uint8

const (
	nByte  nop = iota // a byte in lo..hi, then out
	nSplit            // out and out1 (out1 < 0: out only)
	nBegin            // only before the first byte, then out
	nEnd              // only after the last byte, then out
	nMatch
)

type nnode struct {
	op     nop
	lo, hi byte
	out    int32
	out1   int32
}

// nfaBuilder builds a byte-level Thompson NFA, each node given the node
// it leads to (so a regexp is built from its end).
type nfaBuilder struct {
	nodes []nnode
	err   error
	work  int // nodes visited by closures
}

func (b *nfaBuilder) add(n nnode) int32 {
	if len(b.nodes) >= maxNFA {
		if b.err == nil {
			b.err = fmt.Errorf("the pattern spells out to more than %d automaton nodes", maxNFA)
		}
		return 0
	}
	b.nodes = append(b.nodes, n)
	return int32(len(b.nodes) - 1)
}

func (b *nfaBuilder) split(out, out1 int32) int32 {
	return b.add(nnode{op: nSplit, out: out, out1: out1})
}

// anyLoop is any writable runes, then next.
func (b *nfaBuilder) anyLoop(next int32) int32 {
	s := b.split(-1, next)
	b.nodes[s].out = b.ranges(writable, s)
	return s
}

// gen is re, then next.
func (b *nfaBuilder) gen(re *syntax.Regexp, next int32) int32 {
	if b.err != nil {
		return 0
	}
	switch re.Op {
	case syntax.OpNoMatch:
		return b.ranges(nil, next)
	case syntax.OpEmptyMatch:
		return next
	case syntax.OpLiteral:
		for i := len(re.Rune) - 1; i >= 0; i-- {
			r := re.Rune[i]
			rs := []rune{r, r}
			if re.Flags&syntax.FoldCase != 0 {
				for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
					rs = append(rs, f, f)
				}
			}
			next = b.ranges(rs, next)
		}
		return next
	case syntax.OpCharClass:
		return b.ranges(re.Rune, next)
	case syntax.OpAnyCharNotNL:
		return b.ranges([]rune{0, '\n' - 1, '\n' + 1, unicode.MaxRune}, next)
	case syntax.OpAnyChar:
		return b.ranges([]rune{0, unicode.MaxRune}, next)
	case syntax.OpBeginText:
		return b.add(nnode{op: nBegin, out: next})
	case syntax.OpEndText:
		return b.add(nnode{op: nEnd, out: next})
	case syntax.OpCapture:
		return b.gen(re.Sub[0], next)
	case syntax.OpStar:
		s := b.split(-1, next)
		b.nodes[s].out = b.gen(re.Sub[0], s)
		return s
	case syntax.OpPlus:
		s := b.split(-1, next)
		body := b.gen(re.Sub[0], s)
		b.nodes[s].out = body
		return body
	case syntax.OpQuest:
		return b.split(b.gen(re.Sub[0], next), next)
	case syntax.OpConcat:
		for i := len(re.Sub) - 1; i >= 0; i-- {
			next = b.gen(re.Sub[i], next)
		}
		return next
	case syntax.OpAlternate:
		alt := b.gen(re.Sub[len(re.Sub)-1], next)
		for i := len(re.Sub) - 2; i >= 0; i-- {
			alt = b.split(b.gen(re.Sub[i], next), alt)
		}
		return alt
	}
	if b.err == nil {
		b.err = fmt.Errorf("%s (line anchors and word boundaries are not held)", re)
	}
	return 0
}

// ranges is one rune of the pairs rs (lo, hi, lo, hi, ...) that a string
// can hold raw, then next.
func (b *nfaBuilder) ranges(rs []rune, next int32) int32 {
	alt := int32(-1)
	either := func(n int32) {
		if alt < 0 {
			alt = n
		} else {
			alt = b.split(n, alt)
		}
	}
	for i := 0; i+1 < len(rs); i += 2 {
		for j := 0; j+1 < len(writable); j += 2 {
			lo, hi := max(rs[i], writable[j]), min(rs[i+1], writable[j+1])
			utf8Ranges(lo, hi, func(a, z []byte) {
				n := next
				for k := len(a) - 1; k >= 0; k-- {
					n = b.add(nnode{op: nByte, lo: a[k], hi: z[k], out: n})
				}
				either(n)
			})
		}
	}
	if alt < 0 { // no rune: a node that takes no byte
		return b.add(nnode{op: nSplit, out: -1, out1: -1})
	}
	return alt
}

// utf8Ranges calls f with byte ranges a[i]..z[i] whose sequences are
// exactly the UTF-8 encodings of the runes lo..hi (surrogates left out):
// the range is split where the encoding's length changes, then until
// each continuation byte runs over its whole range or the bytes before
// it are fixed.
func utf8Ranges(lo, hi rune, f func(a, z []byte)) {
	if lo > hi {
		return
	}
	if lo <= 0xDFFF && hi >= 0xD800 {
		utf8Ranges(lo, min(hi, 0xD7FF), f)
		utf8Ranges(max(lo, 0xE000), hi, f)
		return
	}
	for _, edge := range []rune{0x7F, 0x7FF, 0xFFFF} {
		if lo <= edge && hi > edge {
			utf8Ranges(lo, edge, f)
			utf8Ranges(edge+1, hi, f)
			return
		}
	}
	n := utf8.RuneLen(lo)
	for i := 1; i < n; i++ {
		m := rune(1)<<(6*i) - 1 // the bits of the last i bytes
		if lo&^m == hi&^m {
			continue
		}
		if lo&m != 0 {
			utf8Ranges(lo, lo|m, f)
			utf8Ranges((lo|m)+1, hi, f)
			return
		}
		if hi&m != m {
			utf8Ranges(lo, (hi&^m)-1, f)
			utf8Ranges(hi&^m, hi, f)
			return
		}
	}
	var a, z [utf8.UTFMax]byte
	utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(z[:], hi)
	f(a[:n], z[:n])
}

// closure is the byte nodes reached from roots without reading a byte
// (begin assertions pass at the start, end assertions at the end), and
// whether the match is among them.
func (b *nfaBuilder) closure(roots []int32, start, end bool, seen []bool, out []int32) ([]int32, bool) {
	clear(seen)
	stack := append([]int32(nil), roots...)
	match := false
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i < 0 || seen[i] {
			continue
		}
		seen[i] = true
		b.work++
		switch n := b.nodes[i]; n.op {
		case nByte:
			out = append(out, i)
		case nSplit:
			stack = append(stack, n.out1, n.out)
		case nBegin:
			if start {
				stack = append(stack, n.out)
			}
		case nEnd:
			if end {
				stack = append(stack, n.out)
			}
		case nMatch:
			match = true
		}
	}
	return out, match
}

// determinize builds the automaton from the NFA's entry by subsets over
// byte classes: a state is the set of byte nodes reached, with whether
// the match is reached once the text ends.
func (b *nfaBuilder) determinize(entry int32) (*dfa, error) {
	d := &dfa{}
	var edge [257]bool
	for _, n := range b.nodes {
		if n.op == nByte {
			edge[n.lo], edge[int(n.hi)+1] = true, true
		}
	}
	for c := 1; c < 256; c++ {
		d.class[c] = d.class[c-1]
		if edge[c] {
			d.class[c]++
		}
	}
	d.width = int(d.class[255]) + 1

	seen := make([]bool, len(b.nodes))
	state := func(roots []int32, start bool) string {
		set, _ := b.closure(roots, start, false, seen, nil)
		_, acc := b.closure(roots, start, true, seen, nil)
		slices.Sort(set)
		k := make([]byte, 1, 1+4*len(set))
		if acc {
			k[0] = 1
		}
		for _, i := range set {
			k = binary.LittleEndian.AppendUint32(k, uint32(i))
		}
		return string(k)
	}
	var roots []int32
	step := func(k string, c byte) (string, bool) {
		if b.work > maxWork {
			return "", false
		}
		roots = roots[:0]
		for j := 1; j < len(k); j += 4 {
			i := int32(binary.LittleEndian.Uint32([]byte(k[j : j+4])))
			b.work++
			if n := b.nodes[i]; n.lo <= c && c <= n.hi {
				roots = append(roots, n.out)
			}
		}
		if len(roots) == 0 {
			return "", false
		}
		return state(roots, false), true
	}
	err := explore(d, state([]int32{entry}, true), func(k string) bool { return k[0] == 1 }, step)
	switch {
	case b.work > maxWork:
		return nil, fmt.Errorf("the pattern's automaton takes more than %d steps to build", maxWork)
	case err != nil:
		return nil, fmt.Errorf("the pattern %w", err)
	}
	return d, nil
}

var errStates = fmt.Errorf("needs more than %d automaton states", maxStates)

// explore numbers the states reachable from start, in the order found,
// filling d's table and accept over its classes (set before): step is
// the state after a byte, false where there is none. Then it prunes d.
func explore[K comparable](d *dfa, start K, accept func(K) bool, step func(K, byte) (K, bool)) error {
	rep := make([]byte, d.width) // a byte of each class
	for c := 255; c >= 0; c-- {
		rep[d.class[c]] = byte(c)
	}
	ids := map[K]int32{start: 0}
	states := []K{start}
	d.accept = []bool{accept(start)}
	for s := 0; s < len(states); s++ {
		for k := range d.width {
			next := int32(-1)
			if t, ok := step(states[s], rep[k]); ok {
				id, found := ids[t]
				if !found {
					if len(states) == maxStates {
						return errStates
					}
					id = int32(len(states))
					ids[t] = id
					states = append(states, t)
					d.accept = append(d.accept, accept(t))
				}
				next = id
			}
			d.next = append(d.next, next)
		}
	}
	d.prune()
	return nil
}

// prune cuts the edges into states that cannot reach an accepting one,
// so that every byte taken leaves a completion.
func (d *dfa) prune() {
	n := len(d.accept)
	into := make([][]int32, n)
	for s := 0; s < n; s++ {
		for k := 0; k < d.width; k++ {
			if t := d.next[s*d.width+k]; t >= 0 {
				into[t] = append(into[t], int32(s))
			}
		}
	}
	live := make([]bool, n)
	var queue []int32
	for s, a := range d.accept {
		if a {
			live[s] = true
			queue = append(queue, int32(s))
		}
	}
	for len(queue) > 0 {
		t := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		for _, s := range into[t] {
			if !live[s] {
				live[s] = true
				queue = append(queue, s)
			}
		}
	}
	for i, t := range d.next {
		if t >= 0 && !live[t] {
			d.next[i] = -1
		}
	}
	d.none = !live[0]
	d.special = false
	for s := 0; s < n && !d.special; s++ {
		d.special = d.step(int32(s), '\\') >= 0
		for c := byte(0); c < 0x20 && !d.special; c++ {
			d.special = d.step(int32(s), c) >= 0
		}
	}
}

// intersect is the automaton of the strings both a and b admit.
func intersect(a, b *dfa) (*dfa, error) {
	d := &dfa{}
	classes := map[[2]uint8]uint8{}
	for c := 0; c < 256; c++ {
		p := [2]uint8{a.class[c], b.class[c]}
		k, ok := classes[p]
		if !ok {
			k = uint8(len(classes))
			classes[p] = k
		}
		d.class[c] = k
	}
	d.width = len(classes)
	type pair struct{ a, b int32 }
	step := func(p pair, c byte) (pair, bool) {
		x, y := a.step(p.a, c), b.step(p.b, c)
		return pair{x, y}, x >= 0 && y >= 0
	}
	accept := func(p pair) bool { return a.accept[p.a] && b.accept[p.b] }
	if err := explore(d, pair{}, accept, step); err != nil {
		return nil, fmt.Errorf("the string's constraints together %w", err)
	}
	return d, nil
}

// counter is the automaton of UTF-8 text of minLen..maxLen code points
// (maxLen < 0: no bound): a code point is counted at its first byte.
func counter(minLen, maxLen int) (*dfa, error) {
	top := maxLen
	if top < 0 {
		top = minLen // past minLen the count no longer matters
	}
	if top >= maxStates {
		return nil, fmt.Errorf("a length bound of %d beside a pattern or format (at most %d)", top, maxStates-1)
	}
	d := &dfa{width: 2}
	for c := 0x80; c <= 0xBF; c++ {
		d.class[c] = 1 // continuation bytes
	}
	for k := 0; k <= top; k++ {
		more := int32(k + 1)
		switch {
		case maxLen < 0 && k == top:
			more = int32(k)
		case maxLen >= 0 && k == maxLen:
			more = -1
		}
		d.next = append(d.next, more, int32(k))
		d.accept = append(d.accept, k >= minLen)
	}
	d.prune()
	return d, nil
}

// formatDate and friends are RFC 3339's full-date, full-time and
// date-time: days per month with leap years (a year divisible by 4, not
// by 100 unless by 400), no leap second, a fraction of 1-9 digits, T and
// Z in upper case.
const (
	leapYear   = `(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)`
	formatDate = `(?:[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)|02-(?:0[1-9]|1[0-9]|2[0-8]))|` + leapYear + `-02-29)`
	formatTime = `(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])`
	octet      = `(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])`
	atom       = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
	label      = `[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?`
	// A host name of at most 8 labels of at most 30 characters stays
	// within RFC 1123's 253 (8*31-1 = 247) without counting.
	hostLabel = `[A-Za-z0-9](?:[A-Za-z0-9-]{0,28}[A-Za-z0-9])?`
	hex16     = `[0-9a-fA-F]{1,4}`
	// RFC 4291's text forms, "::" compression included (no embedded
	// IPv4, no zone).
	formatIPv6 = `(?:(?:` + hex16 + `:){7}` + hex16 + `|(?:` + hex16 + `:){1,7}:|(?:` + hex16 + `:){1,6}:` + hex16 +
		`|(?:` + hex16 + `:){1,5}(?::` + hex16 + `){1,2}|(?:` + hex16 + `:){1,4}(?::` + hex16 + `){1,3}` +
		`|(?:` + hex16 + `:){1,3}(?::` + hex16 + `){1,4}|(?:` + hex16 + `:){1,2}(?::` + hex16 + `){1,5}` +
		`|` + hex16 + `:(?::` + hex16 + `){1,6}|:(?:(?::` + hex16 + `){1,7}|:))`
	// RFC 3339 appendix A's duration.
	durTime        = `T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)`
	formatDuration = `P(?:(?:[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)(?:` + durTime + `)?|` + durTime + `|[0-9]+W)`
)

// formats are the patterns "format" holds, each a subset of the format's
// strings.
var formats = map[string]string{
	"date":      `^` + formatDate + `$`,
	"time":      `^` + formatTime + `$`,
	"date-time": `^` + formatDate + `T` + formatTime + `$`,
	"uuid":      `^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`,
	"ipv4":      `^` + octet + `(?:\.` + octet + `){3}$`,
	"email":     `^` + atom + `(?:\.` + atom + `)*@` + label + `(?:\.` + label + `)+$`,
	"hostname":  `^` + hostLabel + `(?:\.` + hostLabel + `){0,7}$`,
	"ipv6":      `^` + formatIPv6 + `$`,
	"duration":  `^` + formatDuration + `$`,
}

var formatDFAs sync.Map // format name -> *dfa, built once

// formatDFA is the automaton of a format's strings.
func formatDFA(name string) (*dfa, bool) {
	if d, ok := formatDFAs.Load(name); ok {
		return d.(*dfa), true
	}
	p, ok := formats[name]
	if !ok {
		return nil, false
	}
	d, err := compilePattern(p)
	if err != nil {
		panic(fmt.Sprintf("format %s: %v", name, err)) // the patterns above are fixed
	}
	formatDFAs.Store(name, d)
	return d, true
}
