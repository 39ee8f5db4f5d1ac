package tokenizer

import (
	"fmt"
	"io/fs"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/internal/tinymodel"
)

// goBPE loads the embedded model's tokenizer: 4,096 ranks trained on Go
// source.
func goBPE(t testing.TB) *BPE {
	t.Helper()
	fsys := tinymodel.Default()
	f, err := fsys.Open("tiktoken.model")
	require.NoError(t, err)
	defer f.Close()
	ranks, err := ReadRanks(f, "tiktoken.model")
	require.NoError(t, err)
	tok, err := NewBPE(ranks, nil)
	require.NoError(t, err)
	return tok
}

// runRanks is a vocabulary of runs and alternations of two letters up to
// eight bytes, so that long pieces of those letters merge in many
// overlapping ways, with ties of one rank at many places.
func runRanks() map[string]int32 {
	ranks := testRanks()
	next := int32(len(ranks))
	add := func(s string) {
		if _, ok := ranks[s]; !ok {
			ranks[s] = next
			next++
		}
	}
	for n := 2; n <= 8; n++ {
		for mask := range 1 << n {
			var b strings.Builder
			for i := range n {
				b.WriteByte("ab"[mask>>i&1])
			}
			if mask%3 != 1 { // leave some out, so that merges dead-end
				add(b.String())
			}
		}
		add(strings.Repeat(" ", n))
	}
	return ranks
}

// TestMergeHeapMatchesScan checks that the heap's merges give the tokens
// of the pair-by-pair scan (tiktoken's algorithm) on pieces of every
// length up to a few hundred bytes, over the embedded vocabulary and one
// built for ties and dead ends.
func TestMergeHeapMatchesScan(t *testing.T) {
	runs, err := NewBPE(runRanks(), nil)
	require.NoError(t, err)
	src, err := fs.ReadFile(tinymodel.Default(), "tokenizer_config.json")
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(3, 4))
	for _, tok := range []*BPE{goBPE(t), runs} {
		for trial := range 2000 {
			n := 2 + r.IntN(300)
			var b strings.Builder
			switch trial % 4 {
			case 0: // two letters
				for range n {
					b.WriteByte("ab"[r.IntN(2)])
				}
			case 1: // runs of one byte
				c := " a\tx0"[r.IntN(5)]
				b.WriteString(strings.Repeat(string(c), n))
			case 2: // a stretch of real text, whole
				at := r.IntN(len(src))
				b.Write(src[at:min(len(src), at+n)])
			default: // any bytes
				for range n {
					b.WriteByte(byte(r.IntN(256)))
				}
			}
			piece := b.String()
			want := tok.mergeScan(nil, piece)
			got := tok.mergeHeap(nil, piece)
			require.Equal(t, want, got, "piece %q", piece)
		}
	}
}

// FuzzMergeHeap: any piece merges to the scan's tokens.
func FuzzMergeHeap(f *testing.F) {
	tok := goBPE(f)
	runs, err := NewBPE(runRanks(), nil)
	require.NoError(f, err)
	for _, s := range []string{"aaaa", "abab ab", "    \t\t", "func main() {", "\xff\xfe\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, piece string) {
		if piece == "" {
			return
		}
		for _, bpe := range []*BPE{tok, runs} {
			require.Equal(t, bpe.mergeScan(nil, piece), bpe.mergeHeap(nil, piece), "piece %q", piece)
		}
	})
}

// BenchmarkEncodeLongPiece encodes text that the pre-tokenizer leaves as
// one piece (a run of spaces or of letters): the merges' work per byte
// should not grow with the run's length.
func BenchmarkEncodeLongPiece(b *testing.B) {
	tok := goBPE(b)
	for _, n := range []int{1 << 10, 1 << 14, 1 << 17} {
		for _, c := range []string{" ", "a"} {
			text := strings.Repeat(c, n)
			b.Run(fmt.Sprintf("%q/%d", c, n), func(b *testing.B) {
				for range b.N {
					tok.Encode(text, false)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/byte")
			})
		}
	}
}

// splitByIndex is specials.split as a search for each name's next
// occurrence: the leftmost, then the longest there.
func splitByIndex(s *specials, text string) []string {
	var parts []string
	for len(text) > 0 {
		at, name := -1, ""
		for _, n := range s.names {
			if i := strings.Index(text, n); i >= 0 && (at < 0 || i < at || i == at && len(n) > len(name)) {
				at, name = i, n
			}
		}
		if at < 0 {
			return append(parts, "plain:"+text)
		}
		if at > 0 {
			parts = append(parts, "plain:"+text[:at])
		}
		parts = append(parts, "special:"+name)
		text = text[at+len(name):]
	}
	return parts
}

// TestSpecialSplit checks the trie's split against a search for each
// name on texts dense with names that share prefixes, contain each other
// or overlap.
func TestSpecialSplit(t *testing.T) {
	names := []string{"<|im_end|>", "<|im_end|>x", "<|im", "|><|", "[BOS]", "[", "<|reserved_1|>", "<|reserved_12|>", "\xff\xfe"}
	m := map[string]int32{}
	for i, n := range names {
		m[n] = int32(1000 + i)
	}
	s := newSpecials(m)
	r := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		var b strings.Builder
		for range r.IntN(12) {
			switch r.IntN(3) {
			case 0:
				n := names[r.IntN(len(names))]
				b.WriteString(n[:1+r.IntN(len(n))]) // a name or a prefix of one
			case 1:
				b.WriteString(names[r.IntN(len(names))])
			default:
				b.WriteString([]string{"a", "<", "|", ">", "x", " ", "\xff"}[r.IntN(7)])
			}
		}
		text := b.String()
		var got []string
		s.split(text, func(p string) { got = append(got, "plain:"+p) }, func(id int32) { got = append(got, "special:"+names[id-1000]) })
		require.Equal(t, splitByIndex(&s, text), got, "text %q", text)
	}
}
