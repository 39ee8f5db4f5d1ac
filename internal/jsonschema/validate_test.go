package jsonschema

import (
	"bytes"
	"encoding/json"
	"math/big"
	"net/mail"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// validator is JSON Schema's meaning of the keywords the package reads,
// written over decoded values (encoding/json with UseNumber) and sharing
// nothing with the machine: the tests' oracle.
type validator struct{ doc any }

func decode(t string) (any, error) {
	d := json.NewDecoder(strings.NewReader(t))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, errTrailing
	}
	return v, nil
}

var errTrailing = jsonError("text after the value")

type jsonError string

func (e jsonError) Error() string { return string(e) }

func (vd validator) valid(s, v any) bool {
	switch s := s.(type) {
	case bool:
		return s
	case map[string]any:
		return vd.validObject(s, v)
	}
	panic("schema not an object")
}

func (vd validator) validObject(s map[string]any, v any) bool {
	if r, ok := s["$ref"].(string); ok {
		t := vd.doc
		if p := strings.TrimPrefix(r, "#"); p != "" {
			for _, tok := range strings.Split(p[1:], "/") {
				tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
				t = t.(map[string]any)[tok]
			}
		}
		if !vd.valid(t, v) {
			return false
		}
	}
	if l, ok := s["allOf"].([]any); ok {
		for _, a := range l {
			if !vd.valid(a, v) {
				return false
			}
		}
	}
	if l, ok := s["anyOf"].([]any); ok {
		any := false
		for _, a := range l {
			any = any || vd.valid(a, v)
		}
		if !any {
			return false
		}
	}
	if l, ok := s["oneOf"].([]any); ok {
		n := 0
		for _, a := range l {
			if vd.valid(a, v) {
				n++
			}
		}
		if n != 1 {
			return false
		}
	}
	if t, ok := s["type"]; ok {
		names, _ := t.([]any)
		if name, ok := t.(string); ok {
			names = []any{name}
		}
		match := false
		for _, n := range names {
			match = match || hasType(n.(string), v)
		}
		if !match {
			return false
		}
	}
	if c, ok := s["const"]; ok && !same(c, v) {
		return false
	}
	if l, ok := s["enum"].([]any); ok {
		in := false
		for _, e := range l {
			in = in || same(e, v)
		}
		if !in {
			return false
		}
	}
	switch v := v.(type) {
	case json.Number:
		x := rat(v)
		for k, cmp := range map[string]func(int) bool{
			"minimum": func(c int) bool { return c >= 0 }, "exclusiveMinimum": func(c int) bool { return c > 0 },
			"maximum": func(c int) bool { return c <= 0 }, "exclusiveMaximum": func(c int) bool { return c < 0 },
		} {
			if b, ok := s[k].(json.Number); ok {
				y := rat(b)
				if !cmp(x.Cmp(y)) {
					return false
				}
			}
		}
	case string:
		n := utf8.RuneCountInString(v)
		if mn, ok := num(s, "minLength"); ok && n < mn {
			return false
		}
		if mx, ok := num(s, "maxLength"); ok && n > mx {
			return false
		}
		if p, ok := s["pattern"].(string); ok {
			// ECMA-262's classes spelled in RE2's syntax; the search is
			// package regexp's.
			src, err := ecma(p)
			if err != nil || !regexp.MustCompile(src).MatchString(v) {
				return false
			}
		}
		if f, ok := s["format"].(string); ok && !validFormat(f, v) {
			return false
		}
	case []any:
		if mn, ok := num(s, "minItems"); ok && len(v) < mn {
			return false
		}
		if mx, ok := num(s, "maxItems"); ok && len(v) > mx {
			return false
		}
		if u, _ := s["uniqueItems"].(bool); u {
			for i := range v {
				for j := range i {
					if same(v[i], v[j]) {
						return false
					}
				}
			}
		}
		// 2020-12's prefixItems then items; draft-07's list of items then
		// additionalItems.
		prefix, _ := s["prefixItems"].([]any)
		rest, hasRest := s["items"]
		if l, ok := rest.([]any); ok {
			prefix = l
			rest, hasRest = s["additionalItems"]
		}
		for i, e := range v {
			switch {
			case i < len(prefix):
				if !vd.valid(prefix[i], e) {
					return false
				}
			case hasRest:
				if !vd.valid(rest, e) {
					return false
				}
			}
		}
	case map[string]any:
		if mn, ok := num(s, "minProperties"); ok && len(v) < mn {
			return false
		}
		if mx, ok := num(s, "maxProperties"); ok && len(v) > mx {
			return false
		}
		props, _ := s["properties"].(map[string]any)
		if r, ok := s["required"].([]any); ok {
			for _, name := range r {
				if _, ok := v[name.(string)]; !ok {
					return false
				}
			}
		}
		for k, e := range v {
			if ps, ok := props[k]; ok {
				if !vd.valid(ps, e) {
					return false
				}
			} else if a, ok := s["additionalProperties"]; ok && !vd.valid(a, e) {
				return false
			}
		}
	}
	return true
}

// validFormat checks a format by the standard library's parsers.
func validFormat(f, v string) bool {
	switch f {
	case "date":
		_, err := time.Parse(time.DateOnly, v)
		return err == nil
	case "time":
		_, err := time.Parse("15:04:05Z07:00", v)
		return err == nil
	case "date-time":
		_, err := time.Parse(time.RFC3339Nano, v)
		return err == nil
	case "ipv4":
		a, err := netip.ParseAddr(v)
		return err == nil && a.Is4()
	case "email":
		a, err := mail.ParseAddress(v)
		return err == nil && a.Name == "" && a.Address == v
	case "ipv6":
		a, err := netip.ParseAddr(v)
		return err == nil && a.Is6() && a.Zone() == ""
	case "hostname": // RFC 1123: dot-separated labels of 1-63 letters, digits, '-', not at either end; 253 at most
		if len(v) > 253 {
			return false
		}
		for _, l := range strings.Split(v, ".") {
			if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' ||
				strings.Trim(l, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-") != "" {
				return false
			}
		}
		return true
	case "duration":
		return validDuration(v)
	case "uuid":
		if len(v) != 36 {
			return false
		}
		for i, c := range v {
			switch {
			case i == 8 || i == 13 || i == 18 || i == 23:
				if c != '-' {
					return false
				}
			case !strings.ContainsRune("0123456789abcdefABCDEF", c):
				return false
			}
		}
		return true
	}
	panic("format " + f)
}

// validDuration reads RFC 3339 appendix A's duration by its ABNF, one
// production at a time: "P" then date [time], time, or weeks.
func validDuration(v string) bool {
	rest, ok := strings.CutPrefix(v, "P")
	if !ok {
		return false
	}
	// unit reads 1*DIGIT then the designator, if there.
	unit := func(s string, d byte) (string, bool) {
		i := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == 0 || i == len(s) || s[i] != d {
			return s, false
		}
		return s[i+1:], true
	}
	// chain reads units in order, each optional only after the first
	// read: Y [M [D]], or starting later in the chain.
	chain := func(s string, ds string) (string, bool) {
		for k := 0; k < len(ds); k++ {
			if r, ok := unit(s, ds[k]); ok {
				for k++; k < len(ds); k++ {
					r2, ok := unit(r, ds[k])
					if !ok {
						break
					}
					r = r2
				}
				return r, true
			}
		}
		return s, false
	}
	if r, ok := unit(rest, 'W'); ok {
		return r == ""
	}
	timePart := func(s string) bool {
		s, ok := strings.CutPrefix(s, "T")
		if !ok {
			return false
		}
		r, ok := chain(s, "HMS")
		return ok && r == ""
	}
	if strings.HasPrefix(rest, "T") {
		return timePart(rest)
	}
	r, ok := chain(rest, "YMD")
	if !ok {
		return false
	}
	return r == "" || timePart(r)
}

// rat is a JSON number's value. An exponent past ±1000 is taken as ±1000
// (big.Rat refuses the huge ones a random walk writes): with the walks'
// short mantissas that keeps the value's sign, whether it is an integer
// and its order against any bound a schema here has.
func rat(n json.Number) *big.Rat {
	s := string(n)
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.ParseInt(s[i+1:], 10, 64)
		if err != nil { // beyond int64: its sign is enough
			e = 1001
			if s[i+1] == '-' {
				e = -1001
			}
		}
		s = s[:i] + "e" + strconv.FormatInt(max(min(e, 1000), -1000), 10)
	}
	x, ok := new(big.Rat).SetString(s)
	if !ok {
		panic("not a number: " + string(n))
	}
	return x
}

func num(s map[string]any, k string) (int, bool) {
	n, ok := s[k].(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return int(i), err == nil
}

func hasType(name string, v any) bool {
	switch v := v.(type) {
	case nil:
		return name == "null"
	case bool:
		return name == "boolean"
	case json.Number:
		if name == "number" {
			return true
		}
		return name == "integer" && rat(v).IsInt()
	case string:
		return name == "string"
	case []any:
		return name == "array"
	case map[string]any:
		return name == "object"
	}
	return false
}

// same is JSON equality (numbers by value).
func same(a, b any) bool {
	switch a := a.(type) {
	case json.Number:
		bn, ok := b.(json.Number)
		if !ok {
			return false
		}
		return rat(a).Cmp(rat(bn)) == 0
	case []any:
		bl, ok := b.([]any)
		if !ok || len(a) != len(bl) {
			return false
		}
		for i := range a {
			if !same(a[i], bl[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		bm, ok := b.(map[string]any)
		if !ok || len(a) != len(bm) {
			return false
		}
		for k, e := range a {
			f, ok := bm[k]
			if !ok || !same(e, f) {
				return false
			}
		}
		return true
	}
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
