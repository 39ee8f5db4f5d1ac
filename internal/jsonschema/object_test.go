package jsonschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func randomValue(r *rand.Rand, depth int) any {
	switch k := r.IntN(8); {
	case depth > 3 || k == 0:
		return r.IntN(2000) - 1000
	case k == 1:
		return r.Float64() * 1e6 * float64(r.IntN(3)-1)
	case k == 2:
		return []string{"", "a\"b", "\\", "é漢", "\n\t\u0001", "</x>"}[r.IntN(6)]
	case k == 3:
		return []any{true, false, nil}[r.IntN(3)]
	case k == 4:
		a := make([]any, r.IntN(4))
		for i := range a {
			a[i] = randomValue(r, depth+1)
		}
		return a
	default:
		o := map[string]any{}
		for i := range r.IntN(4) {
			o[fmt.Sprintf("k%d\"", i)] = randomValue(r, depth+1)
		}
		return o
	}
}

// TestValidObjects: every prefix of a JSON object is accepted, the whole
// one is done (and stays done through trailing white space), and Accepts
// agrees with Feed without changing the state.
func TestValidObjects(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		o := map[string]any{"v": randomValue(r, 0)}
		if i%3 == 0 {
			o = map[string]any{}
		}
		var doc []byte
		var err error
		if i%2 == 0 {
			doc, err = json.Marshal(o)
		} else {
			doc, err = json.MarshalIndent(o, " ", "\t")
			doc = append([]byte("\n "), doc...)
		}
		require.NoError(t, err)
		doc = append(doc, " \n"...)
		s := Object().Start()
		for j := 0; j < len(doc); {
			piece := doc[j:min(j+1+r.IntN(5), len(doc))]
			before := s
			require.True(t, s.Accepts(piece), "%q: %q at %d", doc, piece, j)
			require.Equal(t, before.cur, s.cur, "Accepts changed the state")
			require.True(t, s.Feed(piece), "%q: %q at %d", doc, piece, j)
			j += len(piece)
		}
		require.True(t, s.Done(), "%q", doc)
	}
}

func TestInvalid(t *testing.T) {
	for _, tc := range []struct{ ok, bad string }{
		{`{"a":0`, `1`},
		{`{"a"`, ` 1`},
		{`{`, `,`},
		{``, `[`},
		{` `, `"a"`},
		{`{"a":tru`, `}`},
		{`{"a":"`, "\x01"},
		{`{"a":1,`, `}`},
		{`{"a":[1,`, `]`},
		{`{"a":[1`, `}`},
		{`{"a":{}`, `]`},
		{`{"a":1.`, `e`},
		{`{"a":-`, `.`},
		{`{"a":1e`, `}`},
		{`{"a":"\`, `x`},
		{`{"a":"\u12`, `g`},
		{`{}`, `x`},
		{`{"a":1}`, `{`},
		{`{"a":01`, ``}, // 0 then 1: rejected at the 1 (TestValidObjects covers 0 alone)
	} {
		s := Object().Start()
		if tc.ok == `{"a":01` {
			require.False(t, s.Feed([]byte(tc.ok)), "%q", tc.ok)
			continue
		}
		require.True(t, s.Feed([]byte(tc.ok)), "%q", tc.ok)
		assert.False(t, s.Accepts([]byte(tc.bad)), "%q then %q", tc.ok, tc.bad)
		before := s
		assert.False(t, s.Feed([]byte(tc.bad)), "%q then %q", tc.ok, tc.bad)
		assert.Equal(t, before, s, "a refused Feed changed the state")
	}
}

// FuzzAgainstEncodingJSON: bytes fed whole are done only when
// encoding/json finds them one valid JSON object whose numbers are
// finite float64s, and done when it does and they are all well inside
// that range (below 10^300, with exponents within ±300; maxMagnitude).
func FuzzAgainstEncodingJSON(f *testing.F) {
	for _, seed := range []string{`{}`, `{"a":[1,2.5e-3,{"b":null}],"c":"\u00e9\n"}`, `{"a":01}`, ` {"x":true} `, `[1]`, `{"a":1,}`, `{"a":1e400}`, `{"a":[0.1e308]}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if longSpace(b) {
			return // refused on purpose (MaxSpace), though valid
		}
		s := Object().Start()
		fed := s.Feed(b)
		trimmed := bytes.TrimLeft(b, " \t\r\n")
		valid := json.Valid(b) && len(trimmed) > 0 && trimmed[0] == '{'
		finite, small := true, true
		if valid {
			finite, small = numberRange(b)
		}
		if got := fed && s.Done(); got && !(valid && finite) || !got && valid && small {
			t.Fatalf("%q: done %v, encoding/json says %v (numbers finite %v, well inside float64's range %v)", b, got, valid, finite, small)
		}
		// Byte by byte gives the same answer as all at once.
		one := Object().Start()
		ok := true
		for i := range b {
			if !one.Feed(b[i : i+1]) {
				ok = false
				break
			}
		}
		if ok != fed {
			t.Fatalf("%q: fed whole %v, byte by byte %v", b, fed, ok)
		}
	})
}

// numberRange reports whether the numbers of the JSON value b are all
// finite float64s, and all below 10^300 with exponents within ±300.
func numberRange(b []byte) (finite, small bool) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		panic(err)
	}
	finite, small = true, true
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case json.Number:
			x, err := strconv.ParseFloat(string(v), 64)
			finite = finite && err == nil
			if i := strings.IndexAny(string(v), "eE"); i >= 0 {
				e, err := strconv.Atoi(string(v)[i+1:])
				small = small && err == nil && e >= -300 && e <= 300
			}
			small = small && err == nil && math.Abs(x) < 1e300
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			for _, e := range v {
				walk(e)
			}
		}
	}
	walk(v)
	return finite, small
}

func longSpace(b []byte) bool {
	run := 0
	for _, c := range b {
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			if run++; run > MaxSpace {
				return true
			}
		} else {
			run = 0
		}
	}
	return false
}

func TestMaxSpace(t *testing.T) {
	s := Object().Start()
	require.True(t, s.Feed([]byte("{"+strings.Repeat(" ", MaxSpace))))
	assert.False(t, s.Accepts([]byte(" ")))
	assert.True(t, s.Accepts([]byte(`"`+strings.Repeat(" ", 100))), "spaces in a string are not limited")
	assert.True(t, s.Feed([]byte(`"a":`+strings.Repeat(" ", MaxSpace)+"1}")))
	assert.True(t, s.Done())
}

// TestObjectMask: in JSON mode Mask gives what Accepts gives, token by
// token, from states in every mode.
func TestObjectMask(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const alphabet = "{}[]:,\" \\nu0123456789abcdeftrulsnE.-+\t\n\x01\xc3\xa9"
	vocab := [][]byte{nil, {}}
	for range 3000 {
		t := make([]byte, 1+r.IntN(6))
		for j := range t {
			t[j] = alphabet[r.IntN(len(alphabet))]
		}
		vocab = append(vocab, t)
	}
	v := NewVocab(vocab)
	mask := make([]bool, len(vocab))
	for _, at := range []string{"", " ", `{`, `{"k`, `{"k\`, `{"k\u0`, `{"k"`, `{"k":`, `{"k":[`, `{"k":-`, `{"k":0`, `{"k":12`,
		`{"k":1.`, `{"k":1.5`, `{"k":1e`, `{"k":1e+`, `{"k":1e5`, `{"k":t`, `{"k":[1`, `{"k":[1,`, `{"k":{}`, `{"k":1,`, `{}`} {
		s := Object().Start()
		require.True(t, s.Feed([]byte(at)), at)
		s.Mask(mask, v)
		for id, tok := range vocab {
			want := len(tok) > 0 && s.Accepts(tok)
			require.Equal(t, want, mask[id], "after %q, token %q", at, tok)
		}
	}
}

// TestObjectDeep: nesting past the trial's fixed stack space, in one call
// and byte by byte, and back out.
func TestObjectDeep(t *testing.T) {
	doc := `{"a":` + strings.Repeat(`[{"b":`, 30) + "1" + strings.Repeat("}]", 30) + "}"
	require.True(t, json.Valid([]byte(doc)))
	whole, bytewise := Object().Start(), Object().Start()
	require.True(t, whole.Accepts([]byte(doc)))
	require.True(t, whole.Feed([]byte(doc[:len(doc)/2])))
	require.True(t, whole.Accepts([]byte(doc[len(doc)/2:])))
	assert.False(t, whole.Accepts([]byte(doc[len(doc)/2:len(doc)-1]+"]")), "a bracket closing a brace")
	require.True(t, whole.Feed([]byte(doc[len(doc)/2:])))
	assert.True(t, whole.Done())
	for i := range len(doc) {
		require.True(t, bytewise.Feed([]byte{doc[i]}), "byte %d", i)
	}
	assert.True(t, bytewise.Done())
}

// TestMaskAllocates: a mask allocates nothing (one per generated token),
// unless a token opens more than 16 containers.
func TestMaskAllocates(t *testing.T) {
	toks := [][]byte{[]byte(`"a"`), []byte(`1,`), []byte(`{"b":[[[[[[[[`), []byte("xyz")}
	v := NewVocab(toks)
	s := Object().Start()
	require.True(t, s.Feed([]byte(`{"a":[1,{"c":`)))
	mask := make([]bool, 4)
	if n := testing.AllocsPerRun(100, func() { s.Mask(mask, v) }); !raceEnabled {
		assert.Zero(t, n)
	}
	assert.Equal(t, []bool{true, true, true, false}, mask)
}

func TestSpan(t *testing.T) {
	s := Object().Start()
	require.True(t, s.Feed([]byte(`{"a":[1`)))
	for _, tc := range []struct {
		b          string
		n          int
		closed, ok bool
	}{{`]}<|x`, 2, true, true}, {`]}`, 2, true, true}, {`,2`, 2, false, true}, {`]]`, 1, false, false}, {`} `, 0, false, false}, {``, 0, false, true}} {
		n, closed, ok := s.Span([]byte(tc.b))
		assert.Equal(t, tc.n, n, "%q", tc.b)
		assert.Equal(t, tc.closed, closed, "%q", tc.b)
		assert.Equal(t, tc.ok, ok, "%q", tc.b)
	}
	done := Object().Start()
	require.True(t, done.Feed([]byte(`{}`)))
	n, closed, ok := done.Span([]byte("x"))
	assert.Equal(t, 0, n)
	assert.True(t, closed && ok)
}
