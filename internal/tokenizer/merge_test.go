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

// tinyBPE loads the embedded model's tokenizer: 4,096 ranks trained on
// Go source, with the chat format's special tokens.
func tinyBPE(t testing.TB) *BPE {
	t.Helper()
	tok, err := LoadFS(tinymodel.Default(), "embedded", 1<<20)
	require.NoError(t, err)
	return tok.(*BPE)
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
	for _, tok := range []*BPE{tinyBPE(t), runs} {
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
	tok := tinyBPE(f)
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
	tok := tinyBPE(b)
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
