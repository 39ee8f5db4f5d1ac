package jsonschema

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
)

// schemas the tests walk: each kind, unions, literals, bounds, recursion.
var schemas = map[string]string{
	"person": `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
		"email":{"anyOf":[{"type":"string","maxLength":12},{"type":"null"}],"default":null},
		"tags":{"type":"array","items":{"enum":["a","b","ab","c\"d"]},"maxItems":3}},
		"required":["name","age"],"additionalProperties":false,"title":"Person"}`,
	"open":    `{"type":"object","properties":{"id":{"type":"integer"},"i":{"const":1}},"required":["id"]}`,
	"scalars": `{"type":["number","boolean","null"]}`,
	"numlits": `{"enum":[1,12,-3,"x",null,[1,2],{"b":1,"a":[true]}]}`,
	"mixed":   `{"anyOf":[{"type":"integer"},{"enum":["on","off"]},{"type":"array","items":{"type":"number"},"minItems":2,"maxItems":4}]}`,
	"tree": `{"$defs":{"Node":{"type":"object","properties":{"v":{"type":"string","minLength":2,"maxLength":3},
		"kids":{"type":"array","items":{"$ref":"#/$defs/Node"}}},"required":["v"],"additionalProperties":false}},
		"$ref":"#/$defs/Node"}`,
	"oneof":  `{"oneOf":[{"type":"object","properties":{"kind":{"const":"circle"},"r":{"type":"number"}},"required":["kind","r"],"additionalProperties":false},{"type":"string","minLength":1}]}`,
	"extra":  `{"type":"object","additionalProperties":{"type":"boolean"},"properties":{"ab":{"type":"string"},"a":{"type":"null"}},"required":["a"]}`,
	"any":    `true`,
	"strict": `{"type":"object","properties":{"x":{"type":"string","minLength":3}},"required":["x"],"additionalProperties":false}`,
	"nokeys": `{"type":"object","properties":{"gone":false},"additionalProperties":false}`,
	"items0": `{"type":"array","items":false}`,
	"ranged": `{"type":"object","properties":{"rating":{"type":"integer","minimum":1,"maximum":5},
		"neg":{"type":"integer","exclusiveMaximum":-10,"minimum":-12.5},"big":{"type":"integer","minimum":1000},
		"z":{"type":"integer","maximum":0},"mid":{"type":"integer","minimum":50,"maximum":60},
		"x":{"anyOf":[{"type":"integer","minimum":-3,"exclusiveMaximum":3.5},{"type":"null"}]}},"required":["rating"]}`,
	"between": `{"type":"integer","minimum":-5,"maximum":120}`,
	"nonneg":  `{"type":"integer","minimum":0,"maximum":3}`,
	"refunion": `{"$defs":{"U":{"anyOf":[{"type":"string","maxLength":3},{"type":"null"}]}},"type":"object",
		"properties":{"a":{"$ref":"#/$defs/U"},"b":{"$ref":"#/$defs/U"}},"additionalProperties":false}`,
	"patterned": `{"type":"object","properties":{"day":{"type":"string","format":"date"},"id":{"type":"string","format":"uuid"},
		"code":{"type":"string","pattern":"^[A-Z]{2}-[0-9]+$","maxLength":6},"ip":{"anyOf":[{"type":"string","format":"ipv4"},{"type":"null"}]},
		"note":{"type":"string","pattern":"ab","minLength":3},"at":{"type":"string","format":"date-time"}},"required":["day","code"],"additionalProperties":false}`,
	"tuple": `{"type":"object","properties":{"pt":{"type":"array","prefixItems":[{"type":"integer","minimum":0,"maximum":9},{"enum":["a","b"]}],
		"items":{"type":"boolean"},"minItems":1,"maxItems":4},"old":{"type":"array","items":[{"type":"string","maxLength":2},{"type":"null"}],"additionalItems":false},
		"gone":{"type":"array","prefixItems":[{"type":"null"},false]}},"required":["pt","old"],"additionalProperties":false}`,
	"scores": `{"type":"object","properties":{"p":{"type":"number","minimum":0,"maximum":1},"t":{"type":"number","exclusiveMinimum":-2.5,"exclusiveMaximum":37.25},
		"q":{"type":"number","minimum":0.001},"n":{"type":"number","maximum":-0.5},"k":{"type":"integer","minimum":-3,"maximum":3},
		"x":{"minimum":10,"maximum":10},"e":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":0.01},
		"m":{"type":"number","exclusiveMinimum":-1,"maximum":-0.25},"w":{"type":"number","minimum":1,"exclusiveMinimum":1,"maximum":2},
		"v":{"type":"number","maximum":3,"exclusiveMaximum":3}},"required":["p"],"additionalProperties":false}`,
	"unique": `{"type":"object","properties":{"tags":{"type":"array","items":{"enum":["a","ab","abc","b",1,12,null,{"k":[1]}]},"uniqueItems":true,"minItems":1},
		"two":{"type":"array","items":{"enum":["x","y"]},"uniqueItems":true},"any":{"type":"array","uniqueItems":false}},"required":["tags"],"additionalProperties":false}`,
	"props": `{"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"},"c":{"type":"null"},"d":{"type":"null"}},
		"required":["a"],"minProperties":2,"maxProperties":3,"additionalProperties":false}`,
	"pair":   `{"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"},"c":{"type":"null"}},"required":["a"],"minProperties":2,"maxProperties":2,"additionalProperties":false}`,
	"capped": `{"type":"object","properties":{"r":{"type":"null"},"s":{"type":"null"}},"required":["r","s"],"maxProperties":3}`,
	"word":   `{"type":"string","minLength":2,"maxLength":6}`,
	// Magnitudes from 2^62 units of the bounds' last digit on, where the
	// digits read saturate: past every bound.
	"huge": `{"type":"object","properties":{"p":{"type":"number","minimum":0.000000001},"n":{"type":"array","items":{"type":"number","exclusiveMinimum":4611686018427387903},"minItems":1},
		"i":{"type":"integer","maximum":-4611686018427387903},"h":{"type":"number","minimum":0.5,"maximum":4611686018427387}},"additionalProperties":false}`,
	"code":   `{"type":"string","pattern":"^[a-c]+$"}`,
	"absorb": `{"anyOf":[{"type":"string","maxLength":2},{"type":"string"},{"type":"string","maxLength":1},{"type":"integer"},{"type":"number"},{"enum":["abc",7,"x\"y"]},{"type":"array","maxItems":1},{"type":"array"}]}`,
}

func compile(t *testing.T, src string) (*Schema, validator) {
	t.Helper()
	s, err := Compile([]byte(src))
	require.NoError(t, err)
	doc, err := decode(src)
	require.NoError(t, err)
	return s, validator{doc}
}

// TestInstances feeds written values, whole and byte by byte: those the
// schema admits (in the machine's encodings) are read whole, the others
// are refused at some byte or left incomplete.
func TestInstances(t *testing.T) {
	cases := []struct {
		schema string
		text   string
		ok     bool
		enc    bool // a value of the schema in an encoding the machine does not write
	}{
		{"person", `{"name":"Al","age":30}`, true, false},
		{"person", `{ "age" : -7 , "name" : "" , "email" : null, "tags": ["ab","c\"d"] }`, true, false},
		{"person", `{"name":"Al","age":30,"email":"twelve chars"}`, true, false},
		{"person", `{"name":"Al","age":30,"email":"thirteen char"}`, false, false},
		{"person", `{"name":"Al","age":3.5}`, false, false},
		{"person", `{"name":"Al"}`, false, false},
		{"person", `{"name":"Al","age":1,"x":1}`, false, false},
		{"person", `{"name":"Al","name":"B","age":1}`, false, false}, // the oracle keeps one

		{"person", `{"name":"Al","age":1,"tags":["a","b","c\"d","a"]}`, false, false},
		{"person", `{"name":"Al","age":1,"tags":["abc"]}`, false, false},
		{"person", `{"name":"Al","age":1,}`, false, false},
		{"open", `{"id":1,"zzz":[{}],"idx":"q","i":1}`, true, false},
		{"tuple", `{"pt":[3],"old":[]}`, true, false},
		{"tuple", `{"pt":[3,"b",true,false],"old":["ab",null],"gone":[null]}`, true, false},
		{"tuple", `{"pt":[],"old":[]}`, false, false},
		{"tuple", `{"pt":[10],"old":[]}`, false, false},
		{"tuple", `{"pt":[3,"c"],"old":[]}`, false, false},
		{"tuple", `{"pt":[3,"a",1],"old":[]}`, false, false},
		{"tuple", `{"pt":[3,"a",true,true,true],"old":[]}`, false, false},
		{"tuple", `{"pt":[3],"old":["abc"]}`, false, false},
		{"tuple", `{"pt":[3],"old":["a",null,null]}`, false, false},
		{"tuple", `{"pt":[3],"old":[],"gone":[null,null]}`, false, false},
		{"open", `{"i":1}`, false, false},
		{"open", `{"id":1,"i":2}`, false, false},
		{"open", `{"id":1,"id":2}`, false, false},
		{"scalars", `-0.5e+3`, true, false},
		{"scalars", `true`, true, false},
		// Numbers below 10^308 (float64's range): d integer digits and
		// exponent e with d+e at most 308.
		{"scalars", `9.99e307`, true, false},
		{"scalars", `-0.5e308`, true, false},
		{"scalars", `1e-99999`, true, false},
		{"scalars", strings.Repeat("9", 308) + `.5`, true, false},
		{"scalars", `1e308`, false, true},
		{"scalars", `-12e307`, false, true},
		{"scalars", `0e309`, false, true},
		{"scalars", `1` + strings.Repeat("0", 308), false, true},
		{"ranged", `{"rating":1,"big":1` + strings.Repeat("0", 307) + `}`, true, false},
		{"ranged", `{"rating":1,"big":1` + strings.Repeat("0", 308) + `}`, false, true},
		{"scalars", `"s"`, false, false},
		{"numlits", `12`, true, false},
		{"numlits", `1`, true, false},
		{"numlits", `{"a":[true],"b":1}`, true, false},
		{"numlits", `{"b":1,"a":[true]}`, false, true},
		{"numlits", `1.0`, false, true},
		{"numlits", `[1,2]`, true, false},
		{"numlits", `13`, false, false},
		{"mixed", `[1.5,2]`, true, false},
		{"mixed", `[1.5]`, false, false},
		{"mixed", `"off"`, true, false},
		{"mixed", `-12`, true, false},
		{"mixed", `1.5`, false, false},
		{"tree", `{"v":"ab","kids":[{"v":"€éx"},{"v":"xyz","kids":[]}]}`, true, false},
		{"tree", `{"v":"a"}`, false, false},
		{"tree", `{"v":"abcd"}`, false, false},
		{"tree", `{"v":"a\u00e9"}`, false, true}, // no \u escape under a length bound
		{"oneof", `{"kind":"circle","r":2}`, true, false},
		{"oneof", `"c"`, true, false},
		{"oneof", `""`, false, false},
		{"extra", `{"a":null,"ab":"s","abc":true,"":false}`, true, false},
		{"extra", `{"a":null,"abc":1}`, false, false},
		{"extra", `{"ab":"s"}`, false, false},
		{"extra", `{"a":null,"\u0061b":true}`, false, false}, // an escaped spelling of a declared name
		{"extra", `{"a":null,"\u0061c":true}`, false, true},  // an undeclared one: valid, but keys here take no escapes
		{"any", `[{"x":[1,"2",null]},-0.0,"\u1234"]`, true, false},
		{"strict", `{"x":"abc"}`, true, false},
		{"strict", `{"x":"ab"}`, false, false},
		{"nokeys", `{}`, true, false},
		{"nokeys", `{"gone":1}`, false, false},
		{"items0", `[]`, true, false},
		{"items0", `[1]`, false, false},
		{"ranged", `{"rating":5,"neg":-11,"big":123456789012,"z":-0,"mid":55,"x":3}`, true, false},
		{"ranged", `{"rating":1,"neg":-12,"z":0,"x":-3}`, true, false},
		{"ranged", `{"rating":6}`, false, false},
		{"ranged", `{"rating":0}`, false, false},
		{"ranged", `{"rating":15}`, false, false},
		{"ranged", `{"rating":1,"neg":-10}`, false, false},
		{"ranged", `{"rating":1,"neg":-13}`, false, false},
		{"ranged", `{"rating":1,"big":999}`, false, false},
		{"ranged", `{"rating":1,"z":1}`, false, false},
		{"ranged", `{"rating":1,"mid":7}`, false, false},
		{"ranged", `{"rating":1,"mid":61}`, false, false},
		{"ranged", `{"rating":1,"mid":5}`, false, false},
		{"ranged", `{"rating":1,"z":-5}`, true, false},
		{"nonneg", `-0`, true, false},
		{"nonneg", `-1`, false, false},
		{"nonneg", `3`, true, false},
		{"refunion", `{"a":null,"b":"xyz"}`, true, false},
		{"refunion", `{"a":"long"}`, false, false},
		{"ranged", `{"rating":1,"big":-1000}`, false, false},
		{"ranged", `{"rating":1,"x":4}`, false, false},
		{"ranged", `{"rating":1.0}`, false, true},
		{"between", `120`, true, false},
		{"between", `-5`, true, false},
		{"between", `1200`, false, false},
		{"between", `-6`, false, false},
		{"scores", `{"p":0}`, true, false},
		{"scores", `{"p":1.000,"t":-2.49,"q":0.001,"n":-0.5,"k":-3,"x":10.00,"e":0.0099999}`, true, false},
		{"scores", `{"p":0.5,"t":37.2499999,"q":0.00100001,"n":-1,"k":3,"x":"s","e":0.000001}`, true, false},
		{"scores", `{"p":-0.0,"q":5}`, true, false},
		{"scores", `{"p":1.0001}`, false, false},
		{"scores", `{"p":-0.1}`, false, false},
		{"scores", `{"p":1e0}`, false, true},
		{"scores", `{"p":0,"t":-2.5}`, false, false},
		{"scores", `{"p":0,"t":37.25}`, false, false},
		{"scores", `{"p":0,"t":37.250000001}`, false, false},
		{"scores", `{"p":0,"q":0.0009}`, false, false},
		{"scores", `{"p":0,"q":0.0009999999999}`, false, false},
		{"scores", `{"p":0,"n":-0.49}`, false, false},
		{"scores", `{"p":0,"n":0}`, false, false},
		{"scores", `{"p":0,"k":1.5}`, false, false},
		{"scores", `{"p":0,"x":10.001}`, false, false},
		{"scores", `{"p":0,"x":9.9999}`, false, false},
		{"scores", `{"p":0,"m":-0.25,"w":1.5}`, true, false},
		{"scores", `{"p":0,"m":-0.999,"w":2}`, true, false},
		{"scores", `{"p":0,"m":-1}`, false, false},
		{"scores", `{"p":0,"m":-0.24}`, false, false},
		{"scores", `{"p":0,"w":1}`, false, false},
		{"scores", `{"p":0,"v":2.99}`, true, false},
		{"scores", `{"p":0,"v":3}`, false, false},
		{"scores", `{"p":0,"e":0}`, false, false},
		{"scores", `{"p":0,"e":0.01}`, false, false},
		{"scores", `{"p":0,"e":0.0100000001}`, false, false},
		{"unique", `{"tags":["ab","a","abc",12,1,null,{"k":[1]},"b"],"two":["y","x"],"any":[1,1]}`, true, false},
		{"unique", `{"tags":["a","a"]}`, false, false},
		{"unique", `{"tags":["ab","ab"]}`, false, false},
		{"unique", `{"tags":[12,1,12]}`, false, false},
		{"unique", `{"tags":[1,1]}`, false, false},
		{"unique", `{"tags":[null,null]}`, false, false},
		{"unique", `{"tags":[{"k":[1]},{"k":[1]}]}`, false, false},
		{"unique", `{"tags":[]}`, false, false},
		{"unique", `{"tags":["a"],"two":["x","y","x"]}`, false, false},
		{"props", `{"a":null,"b":null}`, true, false},
		{"props", `{"d":null,"a":null,"c":null}`, true, false},
		{"props", `{"a":null}`, false, false},
		{"props", `{"b":null,"c":null}`, false, false},
		{"props", `{"b":null,"c":null,"d":null}`, false, false},
		{"props", `{"a":null,"b":null,"c":null,"d":null}`, false, false},
		{"pair", `{"b":null,"a":null}`, true, false},
		{"pair", `{"b":null,"c":null}`, false, false},
		{"capped", `{"r":null,"s":null,"x":1}`, true, false},
		{"capped", `{"x":1,"r":null,"s":null}`, true, false},
		{"capped", `{"x":1,"y":2,"r":null}`, false, false},
		{"capped", `{"r":null,"s":null,"x":1,"y":1}`, false, false},
		{"huge", `{"p":5000000000,"n":[4611686018427387904,99999999999999999999.5],"i":-4611686018427387904,"h":4611686018427387}`, true, false},
		{"huge", `{"p":0.000000001,"i":-99999999999999999999}`, true, false},
		{"huge", `{"p":0.0000000009}`, false, false},
		{"huge", `{"n":[4611686018427387903]}`, false, false},
		{"huge", `{"n":[-4611686018427387905]}`, false, false},
		{"huge", `{"i":-4611686018427387902}`, false, false},
		{"huge", `{"i":99999999999999999999}`, false, false},
		{"huge", `{"h":4611686018427387.1}`, false, false},
		{"huge", `{"h":99999999999999999999}`, false, false},
		{"absorb", `"abcd"`, true, false},
		{"absorb", `"x\"y"`, true, false},
		{"absorb", `1.5`, true, false},
		{"absorb", `[1,2]`, true, false},
	}
	for _, c := range cases {
		s, vd := compile(t, schemas[c.schema])
		doc, _ := decode(schemas[c.schema])
		if v, err := decode(c.text); err == nil && !repeatsKey(c.text) {
			// The oracle agrees with the table (a check on the table).
			require.Equal(t, c.ok || c.enc, vd.valid(doc, v), "%s: %s by the oracle", c.schema, c.text)
		} else {
			require.False(t, c.ok, "%s: %s is not JSON", c.schema, c.text)
		}
		st := s.Start()
		whole := st.Feed([]byte(c.text)) && st.Complete()
		st = s.Start()
		bytewise := true
		for i := 0; i < len(c.text) && bytewise; i++ {
			bytewise = st.Feed([]byte{c.text[i]})
		}
		bytewise = bytewise && st.Complete()
		require.Equal(t, c.ok, whole, "%s: %s whole", c.schema, c.text)
		require.Equal(t, c.ok, bytewise, "%s: %s byte by byte", c.schema, c.text)
	}
}

// pieces are multi-byte chunks the walks draw beside single bytes, as
// tokens would come.
var pieces = []string{`{"`, `":`, `",`, `"}`, `]}`, `},{`, `[[`, `null`, `true`, `12`, `-0.`, `e+`, `\"`, `ab`, `"a`, `€`, "\xe2\x82", "\xac", ` `, `, "`, `{}`, `[]`, `"name`, `age":`, `kind":"circle`, `"v":"`}

// finishers are the test schemas' keys, which walks past their budget
// prefer (a required key is seldom spelled at random).
var finishers = []string{`"name":`, `"age":`, `"id":`, `"a":`, `"v":`, `"kind":`, `"r":`, `"x":`, `"rating":`}

// followers returns the bytes that may follow the text st has read.
func followers(st *State) []byte {
	var ok []byte
	for c := range 256 {
		if st.Accepts([]byte{byte(c)}) {
			ok = append(ok, byte(c))
		}
	}
	return ok
}

// walk draws random accepted bytes and pieces from the start until the
// value is whole, checking at every step that something may follow. Past
// budget bytes it prefers closing bytes so that walks end.
func walk(t *testing.T, s *Schema, r *rand.Rand, budget int) (string, bool) {
	st := s.Start()
	var text []byte
	for steps := 0; steps < 8*budget; steps++ {
		if st.Done() || st.Complete() && r.IntN(8) == 0 {
			return string(text), true
		}
		ok := followers(&st)
		require.NotEmpty(t, ok, "dead end after %q", text)
		var b []byte
		switch {
		case len(text) > budget:
			// A closing byte if one may follow, else one of a few
			// short ways on (at random, so that a key is spelled).
			b = []byte{ok[r.IntN(len(ok))]}
			var short []byte
			inString := st.cur.mode == mString || st.cur.mode == mKeyString
			for _, want := range []byte(`"]}0n,:ab`) {
				if inString && (want == ']' || want == '}') {
					continue // in a string they only make it longer
				}
				if strings.IndexByte(string(ok), want) >= 0 {
					short = append(short, want)
				}
			}
			var keys [][]byte
			for _, k := range finishers {
				if st.Accepts([]byte(k)) {
					keys = append(keys, []byte(k))
				}
			}
			switch {
			case len(short) > 0 && (short[0] == ']' || short[0] == '}'):
				b = short[:1]
			case len(keys) > 0 && r.IntN(4) != 0:
				b = keys[r.IntN(len(keys))]
			case len(short) > 0 && (short[0] == ']' || short[0] == '}' || short[0] == '"' && r.IntN(2) == 0):
				b = short[:1]
			case len(short) > 0 && r.IntN(4) != 0: // else any byte: a fraction may need a nonzero digit
				b = []byte{short[r.IntN(len(short))]}
			}
		case r.IntN(3) == 0:
			b = []byte(pieces[r.IntN(len(pieces))])
			if !st.Accepts(b) {
				continue
			}
		default:
			b = []byte{ok[r.IntN(len(ok))]}
		}
		require.True(t, st.Feed(b))
		text = append(text, b...)
	}
	return string(text), false
}

// TestWalks: random texts the machine lets through are values the
// oracle validates, and the machine never reaches a dead end.
func TestWalks(t *testing.T) {
	for name, src := range schemas {
		s, vd := compile(t, src)
		r := rand.New(rand.NewPCG(1, uint64(len(name))))
		finished := 0
		const n = 300
		for range n {
			text, done := walk(t, s, r, 40+r.IntN(80))
			if !done {
				continue
			}
			finished++
			v, err := decode(text)
			require.NoError(t, err, "%s: %q", name, text)
			require.True(t, vd.valid(vd.doc, v), "%s: %q breaks the schema", name, text)
		}
		require.Greater(t, finished, n*9/10, name)
	}
}

// TestDeep: a value nested past the trial's fixed frames reads the same
// whole and in pieces.
func TestDeep(t *testing.T) {
	s, _ := compile(t, schemas["tree"])
	var b strings.Builder
	const depth = 30
	for range depth {
		b.WriteString(`{"v":"ab","kids":[`)
	}
	for range depth {
		b.WriteString(`]}`)
	}
	text := b.String()
	st := s.Start()
	require.True(t, st.Feed([]byte(text)))
	require.True(t, st.Done())
	for _, size := range []int{1, 3, 7, 19} {
		st := s.Start()
		for i := 0; i < len(text); i += size {
			require.True(t, st.Feed([]byte(text[i:min(i+size, len(text))])), "size %d at %d", size, i)
		}
		require.True(t, st.Done())
	}
	// One close too many is refused wherever the text was cut.
	st = s.Start()
	require.False(t, st.Feed([]byte(text[:len(text)-2]+"]}]")))
	require.True(t, st.Feed([]byte(text[:len(text)-2])))
	require.False(t, st.Accepts([]byte("]}]")))
}

// TestMask: Mask equals Accepts token by token along walks.
func TestMask(t *testing.T) {
	toks := [][]byte{nil}
	for c := range 256 {
		toks = append(toks, []byte{byte(c)})
	}
	for _, p := range pieces {
		toks = append(toks, []byte(p))
	}
	toks = append(toks, []byte("plain words"), []byte("with\"quote"), []byte(`abcdefghij`))
	toks = append(toks, maskEdges...)
	v := NewVocab(toks)
	dst := make([]bool, len(toks))
	r := rand.New(rand.NewPCG(3, 4))
	for name, src := range schemas {
		s, _ := compile(t, src)
		text, _ := walk(t, s, r, 60)
		st := s.Start()
		for i := 0; i <= len(text); i++ {
			st.Mask(dst, v)
			for id, tok := range toks {
				require.Equal(t, len(tok) > 0 && st.Accepts(tok), dst[id], "%s after %q: token %q", name, text[:i], tok)
			}
			if i < len(text) {
				require.True(t, st.Feed([]byte{text[i]}))
			}
		}
	}
}

// maskEdges are tokens that take every branch of Mask's walks: shared
// prefixes, a duplicate, prefixes of one another, plain bytes before a
// quote or backslash or control byte, cut and invalid UTF-8 (before a
// quote too), a character whose bytes are three tokens, long runs.
var maskEdges = [][]byte{
	[]byte(`ab`), []byte(`abc`), []byte(`abc`), []byte(`abcd"`), []byte(`abc",`), []byte(`ab":`), []byte(`ab\n`),
	[]byte(`a\u00e9`), []byte("ab\nc"), []byte(`2024-01-0`), []byte(`-01-01"`), []byte(`01","`), []byte(`AB-12"`),
	[]byte(`ab"}`), []byte(`"}`), []byte(`",`), []byte(`"`), []byte(`":"`), []byte(`,"`), []byte(`x"`),
	[]byte("é"), []byte("éé\""), []byte("中文"), []byte("中\xe6"), []byte("\xe6\x96"), []byte("\xe6\x96\""), []byte("\x87"), []byte("\xff"),
	[]byte("\xc0\x80"), []byte("\xed\xa0\x80"), []byte("\xf4\x90"), []byte("a\xffb"),
	[]byte(strings.Repeat("a", 40)), []byte(strings.Repeat(" ", 40)), []byte(strings.Repeat("é", 20) + `"`),
	[]byte(`true,`), []byte(`null]`), []byte(`12.5e`), []byte(`1]`), []byte(`}]`), []byte(" \n\t"),
	[]byte(`"}]}<e`), []byte(`"]}<end>`), []byte(`}]}<end>x`), []byte(`} `), []byte(`]}`), []byte(`"}` + "\n"), []byte(`1}]}<`),
}

// TestVocabMask: Mask equals Accepts, and MaskThen Span with the bytes
// after the value read by its function, over a vocabulary made as a
// byte-pair one is, at every position of walks through several schemas,
// with masks taken from several goroutines at once (the patterned
// strings' cached masks among them).
func TestVocabMask(t *testing.T) {
	toks := append(bpeVocab(3000), maskEdges...)
	toks = append(toks, nil, []byte{})
	v := NewVocab(toks)
	r := rand.New(rand.NewPCG(9, 10))
	type at struct {
		name string
		st   State
	}
	var states []at
	for _, name := range []string{"person", "patterned", "open", "scalars", "numlits", "tuple", "unique", "capped", "absorb", "word", "code"} {
		s, _ := compile(t, schemas[name])
		for range 2 {
			text, _ := walk(t, s, r, 40)
			st := s.Start()
			for i := 0; i <= len(text); i++ {
				states = append(states, at{fmt.Sprintf("%s after %q", name, text[:i]), st.Clone()})
				if i < len(text) {
					require.True(t, st.Feed([]byte{text[i]}))
				}
			}
		}
	}
	t.Logf("%d states, %d tokens", len(states), len(toks))
	// MaskThen's bytes after the value: a prefix of "]}<end>".
	const after = "]}<end>"
	then := func(rest []byte) bool { return strings.HasPrefix(after, string(rest)) }
	var g errgroup.Group
	for w := range 4 {
		g.Go(func() error {
			dst := make([]bool, len(toks))
			for k := w; k < len(states); k += 4 {
				st := &states[k].st
				st.Mask(dst, v)
				for id, tok := range toks {
					if want := len(tok) > 0 && st.Accepts(tok); dst[id] != want {
						return fmt.Errorf("%s: token %q: mask %v, Accepts %v", states[k].name, tok, dst[id], want)
					}
				}
				st.MaskThen(dst, v, then)
				for id, tok := range toks {
					n, done, ok := st.Span(tok)
					want := len(tok) > 0 && ok && (!done || then(tok[n:]))
					if dst[id] != want {
						return fmt.Errorf("%s: token %q: MaskThen %v, Span %d %v %v", states[k].name, tok, dst[id], n, done, ok)
					}
				}
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
}

// TestMaskWithoutQuotes: inside bounded and patterned strings, a
// vocabulary none of whose tokens holds a quote (the string cannot close
// within a token) still gets every token's answer from Accepts.
func TestMaskWithoutQuotes(t *testing.T) {
	toks := [][]byte{[]byte("a"), []byte("ab"), []byte(`\n`), []byte(`a\t`), []byte("\n"), []byte("é"), []byte("AB-1"), []byte("12")}
	v := NewVocab(toks)
	dst := make([]bool, len(toks))
	for _, c := range []struct{ schema, text string }{
		{"word", `"a`}, {"word", `"abcde`}, {"word", `"`}, {"code", `"ab`}, {"person", `{"name": "Al", "age": 3, "email": "x`},
	} {
		s, _ := compile(t, schemas[c.schema])
		st := s.Start()
		require.True(t, st.Feed([]byte(c.text)))
		st.Mask(dst, v)
		for id, tok := range toks {
			require.Equal(t, st.Accepts(tok), dst[id], "%s after %q: token %q", c.schema, c.text, tok)
		}
	}
}

// TestMaskCache: the patterned strings' masks and quote lists kept by
// automaton state are read back as made (the list a copy of the one
// stored), the oldest dropped once the cache is full.
func TestMaskCache(t *testing.T) {
	var c maskCache
	d := []*dfa{{}, {}}
	masks := make([][]bool, maskCacheSize+1)
	quotes := make([][]int32, len(masks))
	r := rand.New(rand.NewPCG(11, 12))
	for i := range masks {
		masks[i] = make([]bool, 130)
		for j := range masks[i] {
			masks[i][j] = r.IntN(2) == 0
		}
		quotes[i] = []int32{int32(i), int32(r.IntN(130))}
		c.store(masks[i], quotes[i], d[i%2], int32(i/2))
		quotes[i][0] = -1 // the caller's scratch, reused
	}
	got := make([]bool, 130)
	_, ok := c.load(got, d[0], 0)
	assert.False(t, ok, "the oldest is dropped")
	for i := 1; i < len(masks); i++ {
		q, ok := c.load(got, d[i%2], int32(i/2))
		require.True(t, ok, "mask %d", i)
		require.Equal(t, masks[i], got, "mask %d", i)
		require.Equal(t, []int32{int32(i), quotes[i][1]}, q, "mask %d's quote tokens", i)
	}
	_, ok = c.load(got, d[1], int32(len(masks)))
	assert.False(t, ok, "a state never kept")
	c.store(masks[0], nil, d[1], 1) // already kept: unchanged
	q, ok := c.load(got, d[1], 1)
	require.True(t, ok)
	require.Equal(t, masks[3], got)
	require.Equal(t, []int32{3, quotes[3][1]}, q)
}

func TestCompileErrors(t *testing.T) {
	cases := []struct {
		src  string
		err  error
		want string
	}{
		{`{"type":"string","pattern":"(?=a)"}`, ErrUnsupported, `#/pattern "(?=a)": `},
		{`{"properties":{"a/b":{"type":"string","format":"uri"}}}`, ErrUnsupported, `#/properties/a~1b/format "uri"`},
		{`{"type":"string","pattern":"\\bword"}`, ErrUnsupported, "word boundaries"},
		{`{"type":"string","pattern":"(?m)^a"}`, ErrUnsupported, "line anchors"},
		{`{"type":"string","pattern":"[\\S]"}`, ErrUnsupported, `\S inside`},
		{`{"type":"string","pattern":"[]a]"}`, ErrUnsupported, "empty character class"},
		{`{"type":"string","pattern":"[[:alpha:]]"}`, ErrUnsupported, "POSIX"},
		{`{"type":"string","pattern":"^(a|b)*a(a|b){12}$"}`, ErrUnsupported, "4096 automaton states"},
		{`{"type":"string","pattern":"^[a-z]*$","maxLength":5000}`, ErrUnsupported, "length bound of 5000"},
		{`{"type":"string","pattern":"^(?:.|..){500}$"}`, ErrUnsupported, "steps to build"},
		{`{"type":"string","pattern":"\\p{L}{40}"}`, ErrUnsupported, "automaton nodes"},
		{`{"type":"string","pattern":7}`, ErrInvalid, "pattern: want a string"},
		{`{"type":"string","pattern":"^\"$"}`, ErrInvalid, "admits no value"},
		{`{"type":"string","pattern":"^\n$"}`, ErrInvalid, "admits no value"},
		{`{"type":"string","format":"date","maxLength":9}`, ErrInvalid, "admits no value"},
		{`{"type":"integer","format":"int32"}`, ErrUnsupported, `format "int32"`},
		{`{"anyOf":[{"type":"object","properties":{"a":{}}},{"type":"object","properties":{"b":{}}}]}`, ErrUnsupported, "different object schemas"},
		{`{"oneOf":[{"type":"integer"},{"type":"number"}]}`, ErrUnsupported, "two branches admit a number"},
		{`{"anyOf":[{"type":"string","maxLength":2},{"const":"long"}]}`, ErrUnsupported, `"long"`},
		{`{"oneOf":[{"type":"string"},{"const":"x"}]}`, ErrUnsupported, `"x"`},
		{`{"allOf":[{"type":"string"},{"maxLength":2}]}`, ErrUnsupported, "allOf: 2 schemas"},
		{`{"$ref":"other.json#/a"}`, ErrUnsupported, "inside the document"},
		{`{"$ref":"#/$defs/missing"}`, ErrInvalid, "nothing there"},
		{`{"$ref":"#/$defs/A","$defs":{"A":{"$ref":"#/$defs/A"}}}`, ErrInvalid, "only to references"},
		{`{"anyOf":[{"$ref":"#"},{"type":"null"}]}`, ErrUnsupported, "the union itself"},
		{`{"type":"strin"}`, ErrInvalid, "unknown type"},
		{`{"type":"string","maxLength":-1}`, ErrInvalid, "maxLength = -1"},
		{`{"type":"array","items":[{"type":"string"}],"prefixItems":[]}`, ErrInvalid, "prefixItems beside a list of items"},
		{`{"type":"array","prefixItems":{"type":"string"}}`, ErrInvalid, "prefixItems: want an array"},
		{`{"type":"array","prefixItems":[{"type":"string"},false],"minItems":2}`, ErrInvalid, "admits no value"},
		{`{"type":"array","prefixItems":[{"type":"string"}],"items":false,"minItems":2}`, ErrInvalid, "admits no value"},
		{`{"type":"array","prefixItems":[{"foo":1}]}`, ErrUnsupported, `#/prefixItems/0: keyword "foo"`},
		{`{"anyOf":[{"type":"array","prefixItems":[{"type":"string"}]},{"type":"array","prefixItems":[{"type":"integer"}]}]}`, ErrUnsupported, "different array schemas"},
		{`{"type":"array","items":{"type":"string"},"uniqueItems":true}`, ErrUnsupported, "#: uniqueItems on items that are not an enum"},
		{`{"type":"array","uniqueItems":1}`, ErrInvalid, "uniqueItems = 1"},
		{`{"type":"object","minProperties":1}`, ErrUnsupported, `minProperties without "additionalProperties": false`},
		{`{"type":"object","required":["a","b"],"maxProperties":1}`, ErrInvalid, "admits no value"},
		{`{"type":"object","properties":{"a":{}},"minProperties":2,"additionalProperties":false}`, ErrInvalid, "admits no value"},
		{`{"type":"object","maxProperties":-1}`, ErrInvalid, "maxProperties = -1"},
		{`{"type":"array","items":{"enum":["a","b"]},"uniqueItems":true,"minItems":3}`, ErrInvalid, "admits no value"},
		{`{"type":"object","required":["a"],"additionalProperties":false}`, ErrInvalid, "admits no value"},
		{`{"type":"string","minLength":3,"maxLength":2}`, ErrInvalid, "admits no value"},
		{`{"$defs":{"L":{"type":"object","properties":{"next":{"$ref":"#/$defs/L"}},"required":["next"]}},"$ref":"#/$defs/L"}`, ErrInvalid, "admits no value"},
		{`{"enum":[]}`, ErrInvalid, "admits no value"},
		{`{"type":"integer","enum":["a"]}`, ErrInvalid, "admits no value"},
		{`{"type":"string","enum":["a"],"maxLength":3}`, ErrUnsupported, "beside enum"},
		{`{"type":"number","minimum":0.0000000001}`, ErrUnsupported, "more than 9 fraction digits"},
		{`{"type":"number","minimum":1,"exclusiveMaximum":1}`, ErrInvalid, "admits no value"},
		{`{"type":"number","exclusiveMinimum":0.5,"maximum":0.5}`, ErrInvalid, "admits no value"},
		{`{"type":"number","maximum":1e18,"minimum":0.5}`, ErrUnsupported, "units of 10^-1"},
		{`{"anyOf":[{"type":"integer","minimum":0,"maximum":5},{"type":"number","minimum":0,"maximum":5}]}`, ErrUnsupported, "different number schemas"},
		{`{"anyOf":[{"type":"number","maximum":1},{"const":2}]}`, ErrUnsupported, "2"},
		{`{"type":"integer","maximum":1e19}`, ErrUnsupported, "2^62"},
		{`{"type":"integer","exclusiveMinimum":true}`, ErrInvalid, "want a number"},
		{`{"type":"integer","minimum":3,"maximum":2.5}`, ErrInvalid, "admits no value"},
		{`{"type":"integer","exclusiveMinimum":2,"exclusiveMaximum":3}`, ErrInvalid, "admits no value"},
		{`{"anyOf":[{"type":"integer","minimum":1},{"type":"integer","maximum":9}]}`, ErrUnsupported, "different number schemas"},
		{`{"anyOf":[{"type":"integer","minimum":1},{"const":0}]}`, ErrUnsupported, "0"},
		{`[]`, ErrInvalid, "an array"},
		{`{"type":"string"} x`, ErrInvalid, "after the schema"},
		{`{`, ErrInvalid, ""},
	}
	for _, c := range cases {
		_, err := Compile([]byte(c.src))
		require.Error(t, err, c.src)
		require.True(t, errors.Is(err, c.err), "%s: %v", c.src, err)
		require.Contains(t, err.Error(), c.want, c.src)
	}
	// Unions the first byte tells apart, and ones that absorb, compile.
	for _, src := range []string{
		`{"anyOf":[{"type":"integer"},{"type":"number"},{"enum":[1,"a"]},{"type":"string"}]}`,
		`{"oneOf":[{"type":"object"},{"type":"array"},{"const":"x"}]}`,
		`{"anyOf":[{"type":"number","maximum":1},{"const":0.5},{"type":"number","maximum":1}]}`,
		`{"anyOf":[{"type":"number"},{"type":"integer","minimum":3}]}`,
		`{"anyOf":[{"$ref":"#/$defs/A"},{"type":"null"}],"$defs":{"A":{"type":"object","properties":{"a":{"anyOf":[{"$ref":"#/$defs/A"},{"type":"null"}]}}}}}`,
		`{"$defs":{"L":{"type":"object","properties":{"next":{"$ref":"#/$defs/L"}}}},"$ref":"#/$defs/L"}`,
	} {
		_, err := Compile([]byte(src))
		require.NoError(t, err, src)
	}
}

// TestObjects: restricted to objects, a schema reads objects as before
// and nothing else.
func TestObjects(t *testing.T) {
	for src, cases := range map[string]map[string]bool{
		`{"anyOf":[{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false},{"type":"string"}]}`: {
			`{"a":1}`: true, `{}`: true, `"x"`: false, `{"a":"x"}`: false, `{"b":1}`: false},
		`{"anyOf":[{"type":"string"},{"enum":[{"b":1},2]}]}`: {`{"b":1}`: true, `2`: false, `"x"`: false, `{}`: false},
	} {
		s, _ := compile(t, src)
		o, err := s.Objects()
		require.NoError(t, err)
		for text, ok := range cases {
			st := o.Start()
			require.Equal(t, ok, st.Feed([]byte(text)) && st.Done(), "%s: %s", src, text)
		}
	}
	s, _ := compile(t, `{"type":["string","null"]}`)
	_, err := s.Objects()
	require.ErrorIs(t, err, ErrInvalid)
}

// FuzzFeed: any text the machine reads whole is a value of the schema
// (by the oracle), and feeding it in pieces agrees with feeding it whole.
func FuzzFeed(f *testing.F) {
	f.Add(0, []byte(`{"name":"Al","age":30}`), 3)
	f.Add(5, []byte(`{"v":"ab","kids":[{"v":"xyz"}]}`), 1)
	f.Add(3, []byte(`[1.5,2]`), 2)
	names := []string{"person", "open", "scalars", "numlits", "mixed", "tree", "oneof", "extra", "any", "strict", "patterned", "tuple", "scores", "unique", "pair", "capped"}
	compiled := make([]*Schema, len(names))
	oracles := make([]validator, len(names))
	for i, n := range names {
		s, err := Compile([]byte(schemas[n]))
		if err != nil {
			f.Fatal(err)
		}
		doc, _ := decode(schemas[n])
		compiled[i], oracles[i] = s, validator{doc}
	}
	f.Fuzz(func(t *testing.T, which int, text []byte, size int) {
		i := (which%len(names) + len(names)) % len(names)
		size = size%7 + 1
		if size < 1 {
			size = 1
		}
		st := compiled[i].Start()
		whole := st.Feed(text)
		complete := whole && st.Complete()
		pst := compiled[i].Start()
		inPieces := true
		for j := 0; j < len(text) && inPieces; j += size {
			inPieces = pst.Feed(text[j:min(j+size, len(text))])
		}
		if whole != inPieces || whole && pst.Complete() != complete {
			t.Fatalf("%s: %q whole %v, in pieces of %d %v", names[i], text, whole, size, inPieces)
		}
		if complete {
			v, err := decode(string(text))
			if err != nil || !oracles[i].valid(oracles[i].doc, v) {
				t.Fatalf("%s: %q read whole but is not a value of the schema (%v)", names[i], text, err)
			}
		}
	})
}

// repeatsKey reports whether an object in text names a key twice (which
// the oracle, reading a map, cannot see).
func repeatsKey(text string) bool {
	d := json.NewDecoder(strings.NewReader(text))
	type level struct {
		keys  map[string]bool
		isKey bool
	}
	var stack []*level
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *level
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.keys != nil {
			if s, ok := tok.(string); ok && top.isKey {
				if top.keys[s] {
					return true
				}
				top.keys[s] = true
				top.isKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &level{keys: map[string]bool{}, isKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &level{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && stack[len(stack)-1].keys != nil {
			stack[len(stack)-1].isKey = true
		}
	}
}

// BenchmarkMask: one mask over 163,840 synthetic tokens of 1-8 printable
// bytes (Kimi's vocabulary size): JSON mode inside a string and after an
// item, and the person schema inside a free string, inside a bounded
// one, at a key, after an item.
func BenchmarkMask(b *testing.B) {
	for _, vocab := range []struct {
		name string
		toks [][]byte
	}{{"random", randVocab(163840)}, {"merged", bpeVocab(163840)}} {
		b.Run(vocab.name, func(b *testing.B) { benchmarkMask(b, vocab.toks) })
	}
}

// BenchmarkNewVocab: arranging 163,840 tokens for Mask, once a model.
func BenchmarkNewVocab(b *testing.B) {
	for _, vocab := range []struct {
		name string
		toks [][]byte
	}{{"random", randVocab(163840)}, {"merged", bpeVocab(163840)}} {
		b.Run(vocab.name, func(b *testing.B) {
			var v *Vocab
			for b.Loop() {
				v = NewVocab(vocab.toks)
			}
			b.ReportMetric(float64(len(v.all.c)), "nodes")
		})
	}
}

// randVocab is n tokens of 1-8 random printable bytes: little shared
// beyond the first two bytes.
func randVocab(n int) [][]byte {
	r := rand.New(rand.NewPCG(3, 4))
	toks := make([][]byte, n)
	for i := range toks {
		t := make([]byte, 1+r.IntN(8))
		for j := range t {
			t[j] = byte(' ' + r.IntN(95))
		}
		toks[i] = t
	}
	return toks
}

// bpeVocab is n tokens shaped as a byte-pair vocabulary's are: the 256
// bytes, then merges of two tokens of one class (the earlier ones
// likelier), the classes split as a pre-tokenizer splits text: words
// (some with a leading space or punctuation byte, a quote among them),
// punctuation runs (quotes and backslashes among them, some with a
// leading space or trailing newlines), runs of CJK characters (3,000,
// or n/50 when fewer), white space, digits. Up to 16 bytes a token.
func bpeVocab(n int) [][]byte {
	r := rand.New(rand.NewPCG(7, 8))
	seen := map[string]bool{}
	var toks [][]byte
	add := func(t []byte) bool {
		if len(t) > 16 || seen[string(t)] {
			return false
		}
		seen[string(t)] = true
		toks = append(toks, t)
		return true
	}
	for c := range 256 {
		add([]byte{byte(c)})
	}
	pools := make([][][]byte, 5)
	for k, base := range []string{"etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUMWFGYPBVKJXQZ", ".,:;!?()[]{}<>=+-*/_'\"\\&|%", "", "  \n\t", "0123456789"} {
		for _, c := range base {
			pools[k] = append(pools[k], []byte(string(c)))
		}
	}
	for i := range min(3000, n/50) {
		t := []byte(string(rune(0x4E00 + i)))
		add(t)
		pools[2] = append(pools[2], t)
	}
	pick := func(p [][]byte) []byte { return p[int(float64(len(p))*math.Pow(r.Float64(), 2))] }
	for len(toks) < n {
		var k int
		switch x := r.IntN(100); {
		case x < 50:
			k = 0
		case x < 62:
			k = 1
		case x < 95:
			k = 2
		case x < 98:
			k = 3
		default:
			k = 4
		}
		a, b := pick(pools[k]), pick(pools[k])
		t := append(a[:len(a):len(a)], b...)
		if k == 4 && len(t) > 3 {
			continue
		}
		if add(t) {
			pools[k] = append(pools[k], t)
		}
		switch x := r.IntN(10); {
		case k == 0 && x < 3:
			add(append([]byte{' '}, t...))
		case k == 0 && x < 4:
			add(append([]byte{".\"'(_$@#"[r.IntN(8)]}, t...))
		case k == 1 && x < 2:
			add(append([]byte{' '}, t...))
		case k == 1 && x < 4:
			add(append(t, []string{"\n", "\n\n", "\r\n"}[r.IntN(3)]...))
		}
	}
	return toks[:n]
}

func benchmarkMask(b *testing.B, toks [][]byte) {
	v := NewVocab(toks)
	person, err := Compile([]byte(schemas["person"]))
	if err != nil {
		b.Fatal(err)
	}
	patterned, err := Compile([]byte(schemas["patterned"]))
	if err != nil {
		b.Fatal(err)
	}
	for _, at := range []struct {
		name, text string
		s          *Schema
	}{
		{"pattern", `{"day": "2024-01-01", "note": "x`, patterned},
		{"date", `{"day": "2024-0`, patterned},
		{"object/string", `{"a": "text`, Object()},
		{"object/items", `{"a": [1, 2`, Object()},
		{"string", `{"name": "Al`, person},
		{"bounded", `{"name": "Al", "age": 3, "email": "x`, person},
		{"key", `{"name": "Al", "`, person},
		{"items", `{"name": "Al", "age": 3, "tags": ["a"`, person},
	} {
		b.Run(at.name, func(b *testing.B) {
			st := at.s.Start()
			if !st.Feed([]byte(at.text)) {
				b.Fatal(at.text)
			}
			mask := make([]bool, len(toks))
			for b.Loop() {
				st.Mask(mask, v)
			}
			n := 0
			for _, ok := range mask {
				if ok {
					n++
				}
			}
			b.ReportMetric(float64(n), "allowed")
		})
	}
}

// FuzzCompile: any document compiles or is refused without a panic, and
// a schema that compiles never leaves a walk without a next byte, and
// what a walk finishes is a value of the schema by the oracle.
func FuzzCompile(f *testing.F) {
	for _, src := range schemas {
		f.Add([]byte(src), uint64(1))
	}
	f.Add([]byte(`{"anyOf":[{"type":"string","minLength":2},{"enum":[1,"a",null]},{"type":"array","items":{"$ref":"#"},"maxItems":2}]}`), uint64(2))
	f.Add([]byte(`{"type":"array","items":{"type":"integer","minimum":-120,"exclusiveMaximum":7.5},"maxItems":3}`), uint64(4))
	f.Add([]byte(`{"type":"array","items":{"anyOf":[{"type":"string","pattern":"^[a-c]+x?$","maxLength":4},{"type":"null"}]},"maxItems":3}`), uint64(5))
	f.Add([]byte(`{"type":"object","properties":{"d":{"type":"string","format":"date-time"},"e":{"type":"string","format":"email","minLength":7}}}`), uint64(6))
	f.Add([]byte(`{"type":"array","prefixItems":[{"type":"integer"},{"anyOf":[{"type":"string"},{"type":"null"}]}],"items":false,"minItems":1}`), uint64(7))
	f.Add([]byte(`{"type":"array","items":[{"const":1},{"type":"array","items":[true,{"type":"boolean"}]}],"additionalItems":{"type":"null"},"maxItems":3}`), uint64(8))
	f.Add([]byte(`{"type":"array","items":{"type":"number","minimum":-1.25,"exclusiveMaximum":3},"maxItems":3}`), uint64(9))
	f.Add([]byte(`{"anyOf":[{"type":"number","exclusiveMinimum":0,"maximum":0.001},{"type":"null"}]}`), uint64(10))
	f.Add([]byte(`{"type":"array","items":{"enum":[1,12,"a","ab",[true],null]},"uniqueItems":true,"maxItems":4}`), uint64(11))
	f.Add([]byte(`{"type":"object","properties":{"a":{"type":"null"},"b":{"type":"integer"},"c":{}},"required":["b"],"minProperties":2,"maxProperties":2,"additionalProperties":false}`), uint64(12))
	f.Add([]byte(`{"type":"object","properties":{"r":{"type":"null"}},"required":["r"],"maxProperties":2,"additionalProperties":{"type":"boolean"}}`), uint64(13))
	f.Add([]byte(`{"type":"object","properties":{"a":false,"b":{"type":"array","minItems":1,"items":false}},"additionalProperties":{"type":"null"}}`), uint64(3))
	f.Fuzz(func(t *testing.T, doc []byte, seed uint64) {
		s, err := Compile(doc)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("%q: error %v wraps no sentinel", doc, err)
			}
			return
		}
		v, err := decode(string(doc))
		if err != nil {
			t.Fatalf("%q compiled but does not decode: %v", doc, err)
		}
		r := rand.New(rand.NewPCG(seed, 7))
		st := s.Start()
		var text []byte
		for range 300 {
			if st.Done() || st.Complete() && r.IntN(4) == 0 {
				break
			}
			ok := followers(&st)
			if len(ok) == 0 {
				t.Fatalf("%s: dead end after %q", doc, text)
			}
			c := ok[r.IntN(len(ok))]
			st.Feed([]byte{c})
			text = append(text, c)
		}
		if st.Complete() && utf8.Valid(text) {
			val, err := decode(string(text))
			if err != nil || !(validator{v}).valid(v, val) {
				t.Fatalf("%s: %q read whole but is not a value of the schema (%v)", doc, text, err)
			}
		}
	})
}

// FuzzMask: for any schema that compiles, at every position of a random
// walk through it, Mask gives each token of a small vocabulary (single
// bytes, pieces of JSON, tokens holding quotes, backslashes and cut
// characters after plain bytes) the answer of Accepts, and MaskThen that
// of Span with the bytes after the value read by its function.
func FuzzMask(f *testing.F) {
	for _, src := range schemas {
		f.Add([]byte(src), uint64(1))
	}
	f.Add([]byte(`{"type":"array","items":{"anyOf":[{"type":"string","pattern":"^[a-c]+x?$","maxLength":4},{"type":"null"}]},"maxItems":3}`), uint64(5))
	f.Add([]byte(`{"type":"object","properties":{"d":{"type":"string","format":"date-time"},"e":{"type":"string","format":"email","minLength":7}}}`), uint64(6))
	f.Add([]byte(`{"type":"array","items":{"type":"string","minLength":1,"maxLength":3},"maxItems":4}`), uint64(7))
	toks := [][]byte{nil}
	for c := range 256 {
		toks = append(toks, []byte{byte(c)})
	}
	for _, p := range pieces {
		toks = append(toks, []byte(p))
	}
	toks = append(toks, maskEdges...)
	for _, p := range []string{`a"`, `ab",`, `é"]`, `x"}`, `a\n"`, `\"a`, `ab\u00e9`, "a\"\n", `"]}<end>`, `12"`, `-"`, `  "`} {
		toks = append(toks, []byte(p))
	}
	v := NewVocab(toks)
	const after = "]}<end>"
	then := func(rest []byte) bool { return strings.HasPrefix(after, string(rest)) }
	f.Fuzz(func(t *testing.T, doc []byte, seed uint64) {
		s, err := Compile(doc)
		if err != nil {
			return
		}
		r := rand.New(rand.NewPCG(seed, 9))
		st := s.Start()
		dst := make([]bool, len(toks))
		var text []byte
		for range 60 {
			st.Mask(dst, v)
			for id, tok := range toks {
				if want := len(tok) > 0 && st.Accepts(tok); dst[id] != want {
					t.Fatalf("%s after %q: token %q: Mask %v, Accepts %v", doc, text, tok, dst[id], want)
				}
			}
			st.MaskThen(dst, v, then)
			for id, tok := range toks {
				n, done, ok := st.Span(tok)
				if want := len(tok) > 0 && ok && (!done || then(tok[n:])); dst[id] != want {
					t.Fatalf("%s after %q: token %q: MaskThen %v, Span %d %v %v", doc, text, tok, dst[id], n, done, ok)
				}
			}
			if st.Done() {
				return
			}
			ok := followers(&st)
			if len(ok) == 0 {
				return
			}
			c := ok[r.IntN(len(ok))]
			st.Feed([]byte{c})
			text = append(text, c)
		}
	})
}

// TestAdmits: Admits counts the tokens that Feed, one after another on a
// state of its own, takes before the first it refuses (an empty token
// ends the count), and leaves the state as it was.
func TestAdmits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pieces := []string{"{", "}", "[", "]", `"`, `"a`, `":`, ",", "1", "2.", "5", " ", "null", "tr", "ue", "x", `\`, "", `{"`, `"}`}
	for name, src := range schemas {
		s, _ := compile(t, src)
		for trial := range 200 {
			st := s.Start()
			// A prefix fed first, so Admits starts from inside a value.
			for range rng.IntN(4) {
				st.Feed([]byte(pieces[rng.IntN(len(pieces))]))
			}
			toks := make([][]byte, 1+rng.IntN(6))
			for i := range toks {
				toks[i] = []byte(pieces[rng.IntN(len(pieces))])
			}
			before := st.Complete()
			got := st.Admits(toks)
			want := 0
			ref := st.Clone()
			for _, tok := range toks {
				if len(tok) == 0 || !ref.Feed(tok) {
					break
				}
				want++
			}
			require.Equal(t, want, got, "%s, trial %d: %q", name, trial, toks)
			require.Equal(t, before, st.Complete(), "%s: Admits changed the state", name)
		}
	}
}

// TestVocabSelect: Select gives every token what the acceptor says of
// its bytes, for acceptors that never take what extends bytes they
// refused (a set of literals' prefixes, a bounded run of digits, none,
// all), asking about each prefix at most once and, where few tokens
// pass, about far fewer prefixes than the trie has nodes.
func TestVocabSelect(t *testing.T) {
	toks := append(bpeVocab(3000), nil, []byte("get_weather:12"), []byte("get"), []byte("_weather"), []byte(":"), []byte("12345"))
	v := NewVocab(toks)
	lits := []string{"get_weather:", "get_time:", "functions."}
	for name, alive := range map[string]func([]byte) bool{
		"literals": func(p []byte) bool {
			for _, l := range lits {
				if strings.HasPrefix(l, string(p)) {
					return true
				}
			}
			return false
		},
		"digits": func(p []byte) bool {
			for _, c := range p {
				if c < '0' || c > '9' {
					return false
				}
			}
			return len(p) <= 3
		},
		"none": func([]byte) bool { return false },
		"all":  func([]byte) bool { return true },
	} {
		asked := map[string]int{}
		dst := make([]bool, len(toks))
		for i := range dst {
			dst[i] = i%2 == 0 // overwritten
		}
		v.Select(dst, func(p []byte) bool {
			asked[string(p)]++
			return alive(p)
		})
		for id, tok := range toks {
			want := len(tok) > 0 && alive(tok)
			require.Equal(t, want, dst[id], "%s: token %d %q", name, id, tok)
		}
		for p, n := range asked {
			require.Equal(t, 1, n, "%s: prefix %q asked %d times", name, p, n)
		}
		if name == "literals" || name == "digits" {
			require.Less(t, len(asked), len(v.all.c)/10, "%s: the walk skips refused subtrees", name)
		}
	}
}
