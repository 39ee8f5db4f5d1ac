package tokenizer

import (
	"reflect"
	"strings"
	"testing"
)

func split(s string) []string {
	var out []string
	SplitKimi(s, func(p string) { out = append(out, p) })
	return out
}

func TestSplitKimi(t *testing.T) {
	cases := map[string][]string{
		"Hello world":          {"Hello", " world"},
		"Hello, world!":        {"Hello", ",", " world", "!"},
		"中文English混合":          {"中文", "English", "混合"},
		"汉字abc":                {"汉字", "abc"},
		"北京市 Pascal":           {"北京市", " Pascal"},
		"1234567890":           {"123", "456", "789", "0"},
		"I'm here, they'LL":    {"I'm", " here", ",", " they'LL"},
		"a  b":                 {"a", " ", " b"},
		"x \n\n y":             {"x", " \n\n", " y"},
		"end   ":               {"end", "   "},
		"CamelCase HTTPServer": {"Camel", "Case", " HTTPServer"},
		"emoji 👍🏽 ok":          {"emoji", " 👍🏽", " ok"},
		"Ünïcödé straße":       {"Ünïcödé", " straße"},
		"a\r\nb":               {"a", "\r\n", "b"},
		"...\n":                {"...\n"},
		"naïve ÉCOLE":          {"naïve", " ÉCOLE"},
		"12\xff345678":         {"12", "\xff", "345", "678"},
		"٣٤٥٦x":                {"٣٤٥", "٦", "x"},
	}
	for in, want := range cases {
		if got := split(in); !reflect.DeepEqual(got, want) {
			t.Errorf("%q: got %q want %q", in, got, want)
		}
	}
}

func TestSplitKeepsEveryByte(t *testing.T) {
	for _, s := range []string{"", "a\xffb\xc3", "日本語のテキスト、English and 123.", strings.Repeat("\xf0\x9f", 5)} {
		if got := strings.Join(split(s), ""); got != s {
			t.Errorf("%q rejoined as %q", s, got)
		}
	}
}

func FuzzSplitKimi(f *testing.F) {
	f.Add("Hello, 世界! 123 'll\r\n  x")
	f.Fuzz(func(t *testing.T, s string) {
		if got := strings.Join(split(s), ""); got != s {
			t.Fatalf("%q rejoined as %q", s, got)
		}
	})
}
