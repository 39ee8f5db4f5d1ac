// Package jsonschema holds text, byte by byte, to a JSON value that a
// JSON Schema admits, so that a generation can be held to the schema:
// before each token, only tokens whose bytes keep the text a prefix of
// such a value may be drawn.
//
// Compile reads a schema into a tree of nodes; State reads text against
// it. The machine is deterministic: a value's first byte picks its kind,
// so anyOf, oneOf and type lists are merged per kind when compiled, and
// alternatives the first byte cannot tell apart are refused. A keyword
// that cannot be held exactly is refused (ErrUnsupported), never
// ignored. Every prefix the machine accepts can be completed: choices
// that admit no value are removed when compiled, and a schema that
// admits none is an error.
//
// The text is written in a subset of each value's encodings: keys and
// enum/const values compactly as encoding/json writes them (without HTML
// escapes), integers without fraction or exponent, bounded numbers without
// exponent (number.go), strings under a length
// bound as valid UTF-8 without \u escapes, strings under a pattern or a
// format without escapes at all (pattern.go), numbers below 10^308 in
// magnitude (maxMagnitude). White space outside strings
// and literals is allowed, at most MaxSpace bytes in a row.
package jsonschema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"math/bits"
	"slices"
	"strings"
	"unicode/utf8"
)

// MaxSpace is the longest run of white space allowed outside strings.
const MaxSpace = 32

// MaxProperties is the most properties one object schema may declare.
const MaxProperties = 64

// ErrUnsupported is wrapped by errors about schemas k3 cannot hold
// exactly (a keyword it does not read, alternatives it cannot tell apart).
var ErrUnsupported = errors.New("jsonschema: not supported")

// ErrInvalid is wrapped by errors about schemas that are not valid JSON
// Schema or admit no value.
var ErrInvalid = errors.New("jsonschema: invalid schema")

// kinds of value, as bits of node.kinds.
const (
	kNull uint8 = 1 << iota
	kBool
	kInteger // a number without fraction or exponent
	kNumber  // any number (includes kInteger)
	kString
	kArray
	kObject
)

var kindNames = map[string]uint8{
	"null": kNull, "boolean": kBool, "integer": kInteger, "number": kNumber | kInteger,
	"string": kString, "array": kArray, "object": kObject,
}

// node is one compiled schema: the kinds it admits and each kind's
// constraints, plus literal values (enum, const) admitted beside them.
type node struct {
	kinds uint8
	lits  []string // compact encodings, sorted; a literal's first byte is never one the kinds take

	minLen, maxLen int  // string code points; maxLen < 0: no bound
	pat            *dfa // with pattern or format: the strings admitted, length bounds included

	lo, hi         int64 // a number's bounds in units of 10^-digits (noLo, noHi: none; number.go)
	digits         uint8
	loOpen, hiOpen bool

	prefix             []*node // prefixItems: the first items' schemas
	items              *node   // the items after them; nil: none is admitted
	minItems, maxItems int     // maxItems < 0: no bound
	unique             bool    // uniqueItems: items is an enum or const of at most 64 values
	uniqueAt           string

	names      []string // property names, encoded without quotes, sorted
	props      []*node  // their schemas (nil: the property admits no value)
	required   uint64   // bits of names
	additional *node    // other properties' schema; nil: none admitted

	minProps, maxProps int // maxProps < 0: no bound; minProps counts declared properties only

	union    *union // anyOf/oneOf branches not merged yet
	building bool   // compile in progress (a $ref cycle reaches it)
	sat      bool   // admits at least one value
}

// union is an anyOf or oneOf waiting to be merged.
type union struct {
	alts      []*node
	oneOf     bool
	at        string
	resolving bool
	merged    *node // the result, for every node holding the union (a $ref's copy too)
}

// Schema is a compiled JSON Schema.
type Schema struct {
	root *node
}

// anyNode admits every JSON value.
func anyNode() *node {
	n := &node{kinds: kNull | kBool | kInteger | kNumber | kString | kArray | kObject, maxLen: -1, maxItems: -1, maxProps: -1, lo: noLo, hi: noHi}
	n.items, n.additional = n, n
	return n
}

// object admits every JSON object: JSON mode.
var object = func() *Schema {
	s, err := Compile([]byte(`{"type":"object"}`))
	if err != nil {
		panic(err)
	}
	return s
}()

// Object returns the schema of every JSON object (OpenAI's JSON mode).
func Object() *Schema { return object }

// Compile reads a JSON Schema document.
func Compile(doc []byte) (*Schema, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if d.More() {
		return nil, fmt.Errorf("%w: text after the schema", ErrInvalid)
	}
	c := &compiler{doc: v, refs: map[string]*node{}, any: anyNode()}
	root, err := c.compile(v, "#")
	if err != nil {
		return nil, err
	}
	for _, n := range slices.Clone(c.nodes) {
		if err := c.resolve(n); err != nil {
			return nil, err
		}
	}
	for _, n := range c.nodes {
		// uniqueItems is held where each item is one of a few literals:
		// the array's frame marks those written.
		if n.unique && (len(n.prefix) > 0 || n.items.kinds != 0 || len(n.items.lits) > 64) {
			return nil, fmt.Errorf("%w: %s: uniqueItems on items that are not an enum or const of at most 64 values (without prefixItems)", ErrUnsupported, n.uniqueAt)
		}
	}
	c.settle()
	if !root.sat {
		return nil, fmt.Errorf("%w: the schema admits no value", ErrInvalid)
	}
	return &Schema{root: root}, nil
}

type compiler struct {
	doc   any
	refs  map[string]*node
	any   *node
	nodes []*node
}

// annotations are keywords that do not constrain a value.
var annotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true, "$schema": true,
	"$id": true, "$comment": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"$defs": true, "definitions": true, "strict": true,
}

// read keywords, by the kind they constrain ("" for several).
var keywords = map[string]string{
	"type": "", "enum": "", "const": "", "anyOf": "", "oneOf": "", "allOf": "", "$ref": "",
	"properties": "object", "required": "object", "additionalProperties": "object", "minProperties": "object", "maxProperties": "object",
	"items": "array", "minItems": "array", "maxItems": "array", "prefixItems": "array", "additionalItems": "array", "uniqueItems": "array",
	"minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
	"minimum": "number", "maximum": "number", "exclusiveMinimum": "number", "exclusiveMaximum": "number",
}

func (c *compiler) newNode() *node {
	n := &node{maxLen: -1, maxItems: -1, maxProps: -1, lo: noLo, hi: noHi}
	c.nodes = append(c.nodes, n)
	return n
}

func (c *compiler) compile(v any, at string) (*node, error) {
	switch v := v.(type) {
	case bool:
		if v {
			return c.any, nil
		}
		return c.newNode(), nil
	case map[string]any:
		return c.object(v, at)
	}
	return nil, fmt.Errorf("%w: %s: a schema is an object or a boolean, not %s", ErrInvalid, at, jsonKind(v))
}

func (c *compiler) object(m map[string]any, at string) (*node, error) {
	var constraints []string
	for _, k := range slices.Sorted(maps.Keys(m)) { // the first unsupported keyword by name, every run
		if annotations[k] {
			continue
		}
		if _, ok := keywords[k]; !ok {
			return nil, fmt.Errorf("%w: %s: keyword %q", ErrUnsupported, at, k)
		}
		constraints = append(constraints, k)
	}
	alone := func(k string) error {
		if len(constraints) > 1 {
			return fmt.Errorf("%w: %s: %q beside %s", ErrUnsupported, at, k, strings.Join(slices.DeleteFunc(slices.Clone(constraints), func(s string) bool { return s == k }), ", "))
		}
		return nil
	}
	has := func(k string) bool { _, ok := m[k]; return ok }
	switch {
	case has("$ref"):
		if err := alone("$ref"); err != nil {
			return nil, err
		}
		return c.ref(m["$ref"], at+"/$ref")
	case has("allOf"):
		if err := alone("allOf"); err != nil {
			return nil, err
		}
		l, ok := m["allOf"].([]any)
		if !ok || len(l) == 0 {
			return nil, fmt.Errorf("%w: %s/allOf: want a non-empty array", ErrInvalid, at)
		}
		if len(l) > 1 {
			return nil, fmt.Errorf("%w: %s/allOf: %d schemas (one is read)", ErrUnsupported, at, len(l))
		}
		return c.compile(l[0], at+"/allOf/0")
	case has("anyOf") || has("oneOf"):
		k := "anyOf"
		if !has("anyOf") {
			k = "oneOf"
		}
		if err := alone(k); err != nil {
			return nil, err
		}
		l, ok := m[k].([]any)
		if !ok || len(l) == 0 {
			return nil, fmt.Errorf("%w: %s/%s: want a non-empty array", ErrInvalid, at, k)
		}
		// Merged once everything is compiled: a branch may be a
		// reference still being compiled (a recursive Optional).
		n := c.newNode()
		n.union = &union{oneOf: k == "oneOf", at: at + "/" + k}
		for i, s := range l {
			a, err := c.compile(s, fmt.Sprintf("%s/%s/%d", at, k, i))
			if err != nil {
				return nil, err
			}
			n.union.alts = append(n.union.alts, a)
		}
		return n, nil
	}

	n := c.newNode()
	n.kinds = kNull | kBool | kInteger | kNumber | kString | kArray | kObject
	if t, ok := m["type"]; ok {
		var err error
		if n.kinds, err = types(t, at+"/type"); err != nil {
			return nil, err
		}
	}
	_, hasEnum := m["enum"]
	_, hasConst := m["const"]
	if hasEnum || hasConst {
		for _, k := range constraints {
			if keywords[k] != "" {
				return nil, fmt.Errorf("%w: %s: %q beside enum or const", ErrUnsupported, at, k)
			}
		}
		var vals []any
		if hasConst {
			vals = []any{m["const"]}
		}
		if hasEnum {
			l, ok := m["enum"].([]any)
			if !ok {
				return nil, fmt.Errorf("%w: %s/enum: want an array", ErrInvalid, at)
			}
			if hasConst {
				l = slices.DeleteFunc(slices.Clone(l), func(v any) bool { return !equal(v, m["const"]) })
			}
			vals = l
		}
		for _, v := range vals {
			if kindOf(v)&n.kinds == 0 {
				continue // outside type
			}
			n.lits = append(n.lits, encode(v))
		}
		slices.Sort(n.lits)
		n.lits = slices.Compact(n.lits)
		n.kinds = 0
		return n, nil
	}
	if err := strs(n, m, at); err != nil {
		return nil, err
	}
	if err := c.bounds(n, m, at); err != nil {
		return nil, err
	}
	if err := c.arrays(n, m, at); err != nil {
		return nil, err
	}
	if err := c.objects(n, m, at); err != nil {
		return nil, err
	}
	return n, nil
}

func types(t any, at string) (uint8, error) {
	var l []any
	switch t := t.(type) {
	case string:
		l = []any{t}
	case []any:
		l = t
	default:
		return 0, fmt.Errorf("%w: %s: want a type name or a list of them", ErrInvalid, at)
	}
	var k uint8
	for _, s := range l {
		name, _ := s.(string)
		b, ok := kindNames[name]
		if !ok {
			return 0, fmt.Errorf("%w: %s: unknown type %v", ErrInvalid, at, s)
		}
		k |= b
	}
	return k, nil
}

// count reads a non-negative integer keyword.
func count(m map[string]any, k, at string) (int, bool, error) {
	v, ok := m[k]
	if !ok {
		return 0, false, nil
	}
	num, isNum := v.(json.Number)
	i, err := num.Int64()
	if !isNum || err != nil || i < 0 || i > 1<<30 {
		return 0, false, fmt.Errorf("%w: %s/%s = %v, want a non-negative integer", ErrInvalid, at, k, v)
	}
	return int(i), true, nil
}

// counts reads a pair of count keywords (minLength and maxLength,
// minItems and maxItems); a missing upper one is -1.
func counts(m map[string]any, minKey, maxKey, at string) (lo, hi int, err error) {
	if lo, _, err = count(m, minKey, at); err != nil {
		return 0, 0, err
	}
	hi, ok, err := count(m, maxKey, at)
	if !ok {
		hi = -1
	}
	return lo, hi, err
}

// strs reads a string's minLength, maxLength, pattern and format; with
// a pattern or a format, all of them become one automaton.
func strs(n *node, m map[string]any, at string) error {
	var err error
	if n.minLen, n.maxLen, err = counts(m, "minLength", "maxLength", at); err != nil {
		return err
	}
	var parts []*dfa
	if v, ok := m["pattern"]; ok {
		p, ok := v.(string)
		if !ok {
			return fmt.Errorf("%w: %s/pattern: want a string, not %s", ErrInvalid, at, jsonKind(v))
		}
		d, err := compilePattern(p)
		if err != nil {
			return fmt.Errorf("%w: %s/pattern %q: %v", ErrUnsupported, at, p, err)
		}
		parts = append(parts, d)
	}
	if v, ok := m["format"]; ok {
		f, _ := v.(string)
		d, ok := formatDFA(f)
		if !ok {
			return fmt.Errorf("%w: %s/format %v (held: date, date-time, duration, email, hostname, ipv4, ipv6, time, uuid)", ErrUnsupported, at, encode(v))
		}
		parts = append(parts, d)
	}
	if len(parts) == 0 {
		return nil
	}
	if n.minLen > 0 || n.maxLen >= 0 {
		d, err := counter(n.minLen, n.maxLen)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrUnsupported, at, err)
		}
		parts = append(parts, d)
	}
	n.pat = parts[0]
	for _, d := range parts[1:] {
		if n.pat, err = intersect(n.pat, d); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrUnsupported, at, err)
		}
	}
	return nil
}

// noLo and noHi mark an integer without a lower or upper bound; bounds
// are held inside ±maxBound, so that a value's digits are read in an
// int64 that saturates at maxBound, outside every bound.
const (
	noLo     = math.MinInt64
	noHi     = math.MaxInt64
	maxBound = 1 << 62
)

// bounds reads minimum, maximum and their exclusive forms. On an integer
// they become the integers admitted (closed); on a number that may have a
// fraction they are counted in units of its bounds' last fraction digit
// (at most maxDigits), exclusive ones open.
func (c *compiler) bounds(n *node, m map[string]any, at string) error {
	keys := []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}
	var vals [4]*big.Rat
	for i, k := range keys {
		v, ok := m[k]
		if !ok {
			continue
		}
		num, isNum := v.(json.Number)
		r, ok := new(big.Rat).SetString(string(num))
		if !isNum || !ok {
			return fmt.Errorf("%w: %s/%s = %v, want a number", ErrInvalid, at, k, v)
		}
		if r.Cmp(big.NewRat(maxBound, 1)) >= 0 || r.Cmp(big.NewRat(-maxBound, 1)) <= 0 {
			return fmt.Errorf("%w: %s/%s = %v: bounds from ±2^62 on", ErrUnsupported, at, k, v)
		}
		vals[i] = r
		if n.kinds&kNumber == 0 {
			continue
		}
		d := 0 // fraction digits: the denominator divides 10^d
		for new(big.Int).Rem(pow10Big(d), r.Denom()).Sign() != 0 {
			if d++; d > maxDigits {
				return fmt.Errorf("%w: %s/%s = %v: more than %d fraction digits", ErrUnsupported, at, k, v, maxDigits)
			}
		}
		n.digits = max(n.digits, uint8(d))
	}
	unit := big.NewRat(pow10[n.digits], 1)
	for i, r := range vals {
		if r == nil {
			continue
		}
		scaled := new(big.Rat).Mul(r, unit)
		if scaled.Cmp(big.NewRat(maxBound, 1)) >= 0 || scaled.Cmp(big.NewRat(-maxBound, 1)) <= 0 {
			return fmt.Errorf("%w: %s/%s = %v: bounds from ±2^62 units of 10^-%d on", ErrUnsupported, at, keys[i], r.RatString(), n.digits)
		}
		// Exact on a number (scaled is whole); on an integer the integers
		// admitted: ceil(minimum), floor(exclusiveMinimum)+1,
		// floor(maximum), ceil(exclusiveMaximum)-1.
		q, rem := new(big.Int).QuoRem(scaled.Num(), scaled.Denom(), new(big.Int))
		floor := q.Int64()
		if rem.Sign() < 0 {
			floor--
		}
		ceil := floor
		if rem.Sign() != 0 {
			ceil = floor + 1
		}
		exclusive := n.kinds&kNumber != 0
		switch keys[i] {
		case "minimum":
			n.setLo(ceil, false)
		case "exclusiveMinimum":
			if exclusive {
				n.setLo(floor, true)
			} else {
				n.setLo(floor+1, false)
			}
		case "maximum":
			n.setHi(floor, false)
		case "exclusiveMaximum":
			if exclusive {
				n.setHi(ceil, true)
			} else {
				n.setHi(ceil-1, false)
			}
		}
	}
	return nil
}

func pow10Big(d int) *big.Int { return new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(d)), nil) }

// setLo tightens the lower bound (at one value, open is the tighter).
func (n *node) setLo(v int64, open bool) {
	if v > n.lo || v == n.lo && open {
		n.lo, n.loOpen = v, open
	}
}

// setHi tightens the upper bound.
func (n *node) setHi(v int64, open bool) {
	if v < n.hi || v == n.hi && open {
		n.hi, n.hiOpen = v, open
	}
}

// numbers reports whether n's bounds admit a number.
func (n *node) numbers() bool {
	return n.lo < n.hi || n.lo == n.hi && !n.loOpen && !n.hiOpen
}

func (c *compiler) arrays(n *node, m map[string]any, at string) error {
	var err error
	if n.minItems, n.maxItems, err = counts(m, "minItems", "maxItems", at); err != nil {
		return err
	}
	n.items = c.any
	it, hasItems := m["items"]
	tuple, isTuple := it.([]any) // draft-07's tuple: items a list, additionalItems after it
	prefix, hasPrefix := m["prefixItems"]
	switch {
	case hasPrefix && isTuple:
		return fmt.Errorf("%w: %s: prefixItems beside a list of items", ErrInvalid, at)
	case hasPrefix:
		l, ok := prefix.([]any)
		if !ok {
			return fmt.Errorf("%w: %s/prefixItems: want an array of schemas", ErrInvalid, at)
		}
		if n.prefix, err = c.list(l, at+"/prefixItems"); err != nil {
			return err
		}
	case isTuple:
		if n.prefix, err = c.list(tuple, at+"/items"); err != nil {
			return err
		}
		hasItems = false
		if a, ok := m["additionalItems"]; ok {
			if n.items, err = c.compile(a, at+"/additionalItems"); err != nil {
				return err
			}
		}
	}
	if hasItems {
		if n.items, err = c.compile(it, at+"/items"); err != nil {
			return err
		}
	}
	if u, ok := m["uniqueItems"]; ok {
		b, isBool := u.(bool)
		if !isBool {
			return fmt.Errorf("%w: %s/uniqueItems = %v, want true or false", ErrInvalid, at, u)
		}
		n.unique, n.uniqueAt = b, at
	}
	return nil
}

// list compiles a list of schemas.
func (c *compiler) list(l []any, at string) ([]*node, error) {
	out := make([]*node, len(l))
	for i, s := range l {
		var err error
		if out[i], err = c.compile(s, fmt.Sprintf("%s/%d", at, i)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// item is the schema of item i (nil: none is admitted there).
func (n *node) item(i int) *node {
	if i < len(n.prefix) {
		return n.prefix[i]
	}
	return n.items
}

func (c *compiler) objects(n *node, m map[string]any, at string) error {
	var err error
	if n.minProps, n.maxProps, err = counts(m, "minProperties", "maxProperties", at); err != nil {
		return err
	}
	if n.minProps > 0 && m["additionalProperties"] != false {
		// Undeclared keys are not checked for repeats, which a decoder
		// folds into one: only declared properties can be counted.
		return fmt.Errorf("%w: %s: minProperties without \"additionalProperties\": false", ErrUnsupported, at)
	}
	n.additional = c.any
	if a, ok := m["additionalProperties"]; ok {
		var err error
		if n.additional, err = c.compile(a, at+"/additionalProperties"); err != nil {
			return err
		}
	}
	props := map[string]*node{}
	if p, ok := m["properties"]; ok {
		pm, ok := p.(map[string]any)
		if !ok {
			return fmt.Errorf("%w: %s/properties: want an object", ErrInvalid, at)
		}
		for name, s := range pm {
			pn, err := c.compile(s, at+"/properties/"+pointerEscape(name))
			if err != nil {
				return err
			}
			props[name] = pn
		}
	}
	var required []string
	if r, ok := m["required"]; ok {
		l, ok := r.([]any)
		if !ok {
			return fmt.Errorf("%w: %s/required: want an array of names", ErrInvalid, at)
		}
		for _, v := range l {
			s, ok := v.(string)
			if !ok {
				return fmt.Errorf("%w: %s/required: %v is not a name", ErrInvalid, at, v)
			}
			required = append(required, s)
			if _, ok := props[s]; !ok {
				props[s] = n.additional // a required name not declared takes the others' schema
			}
		}
	}
	if len(props) > MaxProperties {
		return fmt.Errorf("%w: %s: %d properties, at most %d", ErrUnsupported, at, len(props), MaxProperties)
	}
	type named struct {
		enc  string
		name string
	}
	var l []named
	for name := range props {
		e := encode(name)
		l = append(l, named{e[1 : len(e)-1], name})
	}
	slices.SortFunc(l, func(a, b named) int { return strings.Compare(a.enc, b.enc) })
	for i, p := range l {
		n.names = append(n.names, p.enc)
		n.props = append(n.props, props[p.name])
		if slices.Contains(required, p.name) {
			n.required |= 1 << i
		}
	}
	return nil
}

// ref resolves a local reference: "#", or a JSON pointer into the
// document ("#/$defs/Name").
func (c *compiler) ref(v any, at string) (*node, error) {
	r, ok := v.(string)
	if !ok || !strings.HasPrefix(r, "#") {
		return nil, fmt.Errorf("%w: %s = %v: only references inside the document (\"#...\")", ErrUnsupported, at, v)
	}
	if n, ok := c.refs[r]; ok {
		return n, nil
	}
	target := c.doc
	if p := r[1:]; p != "" {
		if !strings.HasPrefix(p, "/") {
			return nil, fmt.Errorf("%w: %s = %q: want a JSON pointer after '#'", ErrInvalid, at, r)
		}
		for _, tok := range strings.Split(p[1:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			var ok bool
			switch t := target.(type) {
			case map[string]any:
				target, ok = t[tok]
			}
			if !ok {
				return nil, fmt.Errorf("%w: %s = %q: nothing there", ErrInvalid, at, r)
			}
		}
	}
	// A placeholder first, so that a cycle through this reference ends
	// at it; its fields are the compiled target's.
	n := c.newNode()
	n.building = true
	c.refs[r] = n
	t, err := c.compile(target, r)
	if err != nil {
		return nil, err
	}
	if t.building {
		return nil, fmt.Errorf("%w: %s = %q: references that lead only to references", ErrInvalid, at, r)
	}
	*n = *t
	return n, nil
}

// resolve merges n's branches (first those of branches that are unions
// themselves) into n.
func (c *compiler) resolve(n *node) error {
	u := n.union
	if u == nil {
		return nil
	}
	if u.merged != nil {
		*n = *u.merged
		return nil
	}
	if u.resolving {
		return fmt.Errorf("%w: %s: a branch that is the union itself", ErrUnsupported, u.at)
	}
	u.resolving = true
	for _, a := range u.alts {
		if err := c.resolve(a); err != nil {
			return err
		}
	}
	m, err := c.merge(u.alts, u.oneOf, u.at)
	if err != nil {
		return err
	}
	u.merged = m
	*n = *m
	return nil
}

// merge makes one node of alternatives. Per kind, the alternatives that
// admit it must agree (or one of them admit every value of the kind);
// numbers and integers merge into numbers. With oneOf, a value two
// branches admit would break the schema, so overlaps are refused.
func (c *compiler) merge(alts []*node, one bool, at string) (*node, error) {
	n := c.newNode()
	groups := []struct {
		kinds uint8
		name  string
	}{{kNull, "null"}, {kBool, "boolean"}, {kInteger | kNumber, "number"}, {kString, "string"}, {kArray, "array"}, {kObject, "object"}}
	for _, g := range groups {
		var pick *node
		for i, a := range alts {
			if a.kinds&g.kinds == 0 {
				continue
			}
			switch {
			case pick == nil:
				pick = a
			case one:
				return nil, fmt.Errorf("%w: %s/%d: two branches admit a %s", ErrUnsupported, at, i, g.name)
			case sameKind(pick, a, g.kinds) || whole(a, g.kinds, c.any):
				if whole(a, g.kinds, c.any) {
					pick = a
				}
			case whole(pick, g.kinds, c.any):
			default:
				return nil, fmt.Errorf("%w: %s/%d: two branches admit different %s schemas", ErrUnsupported, at, i, g.name)
			}
		}
		if pick == nil {
			continue
		}
		n.kinds |= pick.kinds & g.kinds
		if g.kinds == kInteger|kNumber {
			for _, a := range alts {
				n.kinds |= a.kinds & g.kinds
			}
		}
		switch g.name {
		case "number":
			n.lo, n.hi, n.digits, n.loOpen, n.hiOpen = pick.lo, pick.hi, pick.digits, pick.loOpen, pick.hiOpen
		case "string":
			n.minLen, n.maxLen, n.pat = pick.minLen, pick.maxLen, pick.pat
		case "array":
			n.prefix, n.items, n.minItems, n.maxItems, n.unique = pick.prefix, pick.items, pick.minItems, pick.maxItems, pick.unique
		case "object":
			n.names, n.props, n.required, n.additional = pick.names, pick.props, pick.required, pick.additional
			n.minProps, n.maxProps = pick.minProps, pick.maxProps
		}
	}
	for i, a := range alts {
		for _, l := range a.lits {
			k := litKind(l)
			if n.kinds&group(k) == 0 {
				if one && slices.Contains(n.lits, l) {
					return nil, fmt.Errorf("%w: %s/%d: two branches admit %s", ErrUnsupported, at, i, l)
				}
				n.lits = append(n.lits, l)
				continue
			}
			if one {
				return nil, fmt.Errorf("%w: %s/%d: %s is also admitted by another branch's %s schema", ErrUnsupported, at, i, l, kindName(k))
			}
			if !c.admits(n, l) {
				return nil, fmt.Errorf("%w: %s/%d: the value %s beside another branch's %s schema", ErrUnsupported, at, i, l, kindName(k))
			}
		}
	}
	slices.Sort(n.lits)
	n.lits = slices.Compact(n.lits)
	// Literals whose kind the node takes by its first byte were checked
	// above; those left must not share a first byte with the kinds.
	return n, nil
}

// sameKind reports whether a and b constrain kind k alike.
func sameKind(a, b *node, k uint8) bool {
	switch k {
	case kNull, kBool:
		return true
	case kInteger | kNumber:
		return a.kinds&kNumber == b.kinds&kNumber && a.lo == b.lo && a.hi == b.hi && a.digits == b.digits && a.loOpen == b.loOpen && a.hiOpen == b.hiOpen
	case kString:
		return a.minLen == b.minLen && a.maxLen == b.maxLen && a.pat == b.pat
	case kArray:
		return a.items == b.items && slices.Equal(a.prefix, b.prefix) && a.minItems == b.minItems && a.maxItems == b.maxItems && a.unique == b.unique
	case kObject:
		return a.additional == b.additional && a.required == b.required && slices.Equal(a.names, b.names) && slices.Equal(a.props, b.props) &&
			a.minProps == b.minProps && a.maxProps == b.maxProps
	}
	return false
}

// whole reports whether a admits every value of kind k.
func whole(a *node, k uint8, anyN *node) bool {
	switch k {
	case kNull, kBool:
		return a.kinds&k != 0
	case kInteger | kNumber:
		return a.kinds&kNumber != 0 && a.lo == noLo && a.hi == noHi
	case kString:
		return a.kinds&kString != 0 && a.minLen == 0 && a.maxLen < 0 && a.pat == nil
	case kArray:
		return a.kinds&kArray != 0 && a.items == anyN && len(a.prefix) == 0 && a.minItems == 0 && a.maxItems < 0 && !a.unique
	case kObject:
		return a.kinds&kObject != 0 && len(a.names) == 0 && a.additional == anyN && a.minProps == 0 && a.maxProps < 0
	}
	return false
}

// admits reports whether n's kinds admit literal l by a check simple
// enough to be sure of (otherwise the merge is refused).
func (c *compiler) admits(n *node, l string) bool {
	k := litKind(l)
	switch k {
	case kNull, kBool:
		return true
	case kNumber:
		r, ok := new(big.Rat).SetString(l)
		if !ok || n.kinds&kNumber == 0 && !r.IsInt() {
			return false
		}
		r.Mul(r, big.NewRat(pow10[n.digits], 1))
		lo, hi := big.NewRat(n.lo, 1), big.NewRat(n.hi, 1)
		return (n.lo == noLo || r.Cmp(lo) > 0 || r.Cmp(lo) == 0 && !n.loOpen) && (n.hi == noHi || r.Cmp(hi) < 0 || r.Cmp(hi) == 0 && !n.hiOpen)
	case kString:
		var s string
		if json.Unmarshal([]byte(l), &s) != nil {
			return false
		}
		if n.pat != nil {
			return n.pat.matches(s) // lengths included
		}
		r := utf8.RuneCountInString(s)
		return r >= n.minLen && (n.maxLen < 0 || r <= n.maxLen)
	}
	return whole(n, k, c.any)
}

// settle marks every node satisfiable or not (the least fixed point, so
// that a required property leading back to its own object admits
// nothing), and removes the choices that admit nothing.
func (c *compiler) settle() {
	c.any.sat = true
	for changed := true; changed; {
		changed = false
		for _, n := range c.nodes {
			if !n.sat && n.satisfiable() {
				n.sat, changed = true, true
			}
		}
	}
	for _, n := range c.nodes {
		n.prune()
	}
}

func (n *node) satisfiable() bool {
	if len(n.lits) > 0 || n.kinds&(kNull|kBool) != 0 || n.kinds&(kInteger|kNumber) != 0 && n.numbers() {
		return true
	}
	if n.kinds&kString != 0 && n.strings() {
		return true
	}
	if n.kinds&kArray != 0 && (n.maxItems < 0 || n.minItems <= n.maxItems) && n.firstItemsSat() && (!n.unique || n.minItems <= len(n.items.lits)) {
		return true
	}
	return n.kinds&kObject != 0 && n.objects()
}

// objects reports whether n's object constraints admit an object: its
// required properties admit values, and minProperties and maxProperties
// leave room for them (minProperties counts declared properties).
func (n *node) objects() bool {
	sat := 0
	for i, p := range n.props {
		switch {
		case p != nil && p.sat:
			sat++
		case n.required&(1<<i) != 0:
			return false
		}
	}
	req := bits.OnesCount64(n.required)
	return sat >= n.minProps && (n.maxProps < 0 || max(req, n.minProps) <= n.maxProps)
}

// strings reports whether n's string constraints admit a string.
func (n *node) strings() bool {
	if n.pat != nil {
		return !n.pat.none
	}
	return n.maxLen < 0 || n.minLen <= n.maxLen
}

// firstItemsSat reports whether the first minItems items can be had.
func (n *node) firstItemsSat() bool {
	for i := range n.minItems {
		if it := n.item(i); it == nil || !it.sat {
			return false
		}
		if i >= len(n.prefix) {
			break // the rest share items' schema
		}
	}
	return true
}

func (n *node) prune() {
	if !n.numbers() {
		n.kinds &^= kInteger | kNumber
	}
	if n.kinds&kString != 0 && !n.strings() {
		n.kinds &^= kString
	}
	if n.kinds&kArray != 0 {
		// The first item that admits nothing ends every array there.
		for i, p := range n.prefix {
			if p == nil || !p.sat {
				n.prefix, n.items = n.prefix[:i:i], nil
				break
			}
		}
		if n.items != nil && !n.items.sat {
			n.items = nil
		}
		if n.items == nil && (n.maxItems < 0 || n.maxItems > len(n.prefix)) {
			n.maxItems = len(n.prefix)
		}
		if n.unique && n.items != nil && (n.maxItems < 0 || n.maxItems > len(n.items.lits)) {
			n.maxItems = len(n.items.lits) // each at most once
		}
		if n.maxItems >= 0 && n.minItems > n.maxItems {
			n.kinds &^= kArray
		}
	}
	if n.kinds&kObject != 0 && !n.objects() {
		n.kinds &^= kObject
	}
	if n.kinds&kObject != 0 {
		if n.additional != nil && !n.additional.sat {
			n.additional = nil
		}
		for i, p := range n.props {
			if p != nil && !p.sat {
				if n.required&(1<<i) != 0 {
					n.kinds &^= kObject
				}
				n.props[i] = nil
			}
		}
	}
}

// encode writes v compactly, as the machine expects literals and keys.
func encode(v any) string {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(canonical(v)); err != nil {
		panic(err) // decoded JSON always encodes
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// canonical rewrites numbers to their shortest form (1.0 -> 1, 1e2 ->
// 100), so that equal numbers have one encoding.
func canonical(v any) any {
	switch v := v.(type) {
	case json.Number:
		r, ok := new(big.Rat).SetString(string(v))
		if !ok {
			return v
		}
		if r.IsInt() {
			return json.Number(r.Num().String())
		}
		f, _ := r.Float64()
		return f
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = canonical(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = canonical(e)
		}
		return out
	}
	return v
}

func equal(a, b any) bool { return encode(a) == encode(b) }

func kindOf(v any) uint8 {
	switch v := v.(type) {
	case nil:
		return kNull
	case bool:
		return kBool
	case json.Number:
		if r, ok := new(big.Rat).SetString(string(v)); ok && r.IsInt() {
			return kInteger | kNumber
		}
		return kNumber
	case string:
		return kString
	case []any:
		return kArray
	}
	return kObject
}

// litKind is the kind a literal's first byte starts (kNumber for numbers).
func litKind(l string) uint8 {
	switch l[0] {
	case 'n':
		return kNull
	case 't', 'f':
		return kBool
	case '"':
		return kString
	case '[':
		return kArray
	case '{':
		return kObject
	}
	return kNumber
}

// group is the kinds sharing k's first bytes.
func group(k uint8) uint8 {
	if k&(kInteger|kNumber) != 0 {
		return kInteger | kNumber
	}
	return k
}

func kindName(k uint8) string {
	for name, b := range kindNames {
		if b == k {
			return name
		}
	}
	return "number"
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	}
	return fmt.Sprintf("%T", v)
}

func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// Objects returns the schema restricted to objects at the top level (a
// tool call's arguments), or an error if it admits none.
func (s *Schema) Objects() (*Schema, error) {
	r := *s.root
	r.kinds &= kObject
	r.lits = slices.DeleteFunc(slices.Clone(r.lits), func(l string) bool { return l[0] != '{' })
	if r.kinds == 0 && len(r.lits) == 0 {
		return nil, fmt.Errorf("%w: the schema admits no object", ErrInvalid)
	}
	return &Schema{root: &r}, nil
}
