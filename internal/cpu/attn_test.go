package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/kernel"
)

// attnCase is one attention problem: t query rows at the last t of l
// positions; k > 0 gives every (row, kv head) an index list of k entries
// (unsorted, some -1, some in the future), k == 0 dense causal attention;
// mqa makes keys and values one tensor (MLA's MQA form, dk == dv).
type attnCase struct {
	t, l, hq, hkv, dk, dr, dv, k int
	mqa                          bool
	// causal: every list entry a distinct visible position (at most the
	// row's), as a model's indexer selects; else one in ten is -1 and
	// the rest fall anywhere in the cache, future ones included.
	causal bool
}

// runAttn runs the case's attention and returns the output and lse.
func runAttn(tb testing.TB, b *Backend, c attnCase, seed uint64) ([]float32, []float32) {
	a := attnArgs(tb, b, c, seed)
	if err := b.Attention(a); err != nil {
		tb.Fatal(err)
	}
	out, lse := make([]float32, c.t*c.hq*c.dv), make([]float32, c.t*c.hq)
	must(0, b.Read(out, a.Out))
	must(0, b.Read(lse, a.LSE))
	return out, lse
}

func attnArgs(tb testing.TB, b *Backend, c attnCase, seed uint64) *compute.AttnArgs {
	r := rand.New(rand.NewPCG(seed, 7))
	rnd := func(n int) []float32 { return normals(r, n) }
	up := func(v []float32, dims ...int) compute.Tensor { return upload(b, v, dims...) }
	pos := make([]int32, c.t)
	for i := range pos {
		pos[i] = int32(c.l - c.t + i)
	}
	k := up(rnd(c.l*c.hkv*c.dk), c.l, c.hkv, c.dk)
	v := k
	if !c.mqa {
		v = up(rnd(c.l*c.hkv*c.dv), c.l, c.hkv, c.dv)
	}
	a := compute.AttnArgs{
		Q: up(rnd(c.t*c.hq*c.dk), c.t, c.hq, c.dk), K: k, V: v, QPos: uploadI32(b, pos), KVLen: c.l, Causal: true, Scale: 0.125,
		Out: must(b.Alloc(compute.F32, c.t, c.hq, c.dv)), LSE: must(b.Alloc(compute.F32, c.t, c.hq)),
	}
	if c.dr > 0 {
		a.QRope, a.KRope = up(rnd(c.t*c.hq*c.dr), c.t, c.hq, c.dr), up(rnd(c.l*c.dr), c.l, c.dr)
	}
	if c.k > 0 {
		idx := make([]int32, c.t*c.hkv*c.k)
		for l := 0; l < c.t*c.hkv; l++ { // distinct entries within a list
			seen := map[int32]bool{}
			span := c.l
			if c.causal {
				span = int(pos[l/c.hkv]) + 1
			}
			for i := l * c.k; i < (l+1)*c.k; i++ {
				if !c.causal && r.IntN(10) == 0 || len(seen) == span {
					idx[i] = -1
					continue
				}
				for idx[i] = int32(r.IntN(span)); seen[idx[i]]; idx[i] = int32(r.IntN(span)) {
				}
				seen[idx[i]] = true
			}
		}
		a.Indices = must(b.Alloc(compute.I32, c.t, c.hkv, c.k))
		must(0, b.Write(a.Indices, idx))
	}
	return &a
}

// assertClose fails unless got matches want within 1e-5 abs + 1e-5 rel.
func assertClose(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if got[i] == want[i] || math.IsNaN(float64(want[i])) && math.IsNaN(float64(got[i])) {
			continue // equal infinities among them
		}
		// Negated, so that a NaN where a number is due fails.
		if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-5+1e-5*math.Abs(float64(want[i]))) {
			t.Fatalf("%s[%d] = %g, want %g", what, i, got[i], want[i])
		}
	}
}

// TestAttnDenseBlocked compares the blocked dense paths, the per-head one
// (row blocks, matrix logits, rank updates) and the grouped one (blocks of
// rows times heads, matrix logits and values), each forced, with the
// row-by-row path on shapes that cover partial row and key blocks, grouped
// heads and rope parts.
func TestAttnDenseBlocked(t *testing.T) {
	b := New(2)
	defer b.Close()
	defer func(v int) { attnDenseMin = v }(attnDenseMin)
	defer func(f func(int) bool) { attnDenseGrouped = f }(attnDenseGrouped)
	for i, c := range []attnCase{
		{t: 8, l: 8, hq: 1, hkv: 1, dk: 16, dv: 16},
		{t: 13, l: 13, hq: 4, hkv: 2, dk: 24, dv: 16},
		{t: 70, l: 150, hq: 6, hkv: 6, dk: 64, dr: 32, dv: 64},
		{t: 33, l: 200, hq: 4, hkv: 1, dk: 40, dr: 8, dv: 40},
		{t: 130, l: 130, hq: 2, hkv: 2, dk: 128, dv: 130},
		// The grouped path (attnDenseGroupRange): MLA's MQA form with rope
		// parts, GQA with values apart (8 heads a kv head: blocks of 6
		// rows), 64 heads a kv head (a row a block), 130 value dims.
		{t: 100, l: 300, hq: 6, hkv: 1, dk: 64, dr: 32, dv: 64, mqa: true},
		{t: 40, l: 90, hq: 16, hkv: 2, dk: 24, dr: 8, dv: 40},
		{t: 9, l: 70, hq: 64, hkv: 1, dk: 16, dv: 16},
		{t: 20, l: 20, hq: 4, hkv: 1, dk: 130, dv: 130, mqa: true},
	} {
		attnDenseMin = math.MaxInt
		want, wantL := runAttn(t, b, c, uint64(i))
		for _, grouped := range []bool{false, true} {
			attnDenseMin = denseRows
			attnDenseGrouped = func(int) bool { return grouped }
			got, gotL := runAttn(t, b, c, uint64(i))
			assertClose(t, fmt.Sprintf("case %+v grouped %v: out (row path as want)", c, grouped), got, want)
			assertClose(t, fmt.Sprintf("case %+v grouped %v: lse (row path as want)", c, grouped), gotL, wantL)
		}
	}
}

// TestAttnMaskedRowBlocks: one goroutine runs every item of a masked
// grouped pass, kv head by kv head, each head's row blocks in turn: each
// claim builds its row block's mask over the one its scratch held, from
// lists shared by the kv heads ([T, 1, K]) or a list per kv head, and
// reuses the key blocks its key cache holds for the head. Both match the
// sparse path.
func TestAttnMaskedRowBlocks(t *testing.T) {
	b := New(1)
	defer b.Close()
	defer func(v float64) { attnMaskedRatio = v }(attnMaskedRatio)
	defer func(f func(int) bool) { attnDenseGrouped = f }(attnDenseGrouped)
	attnDenseGrouped = func(int) bool { return true }
	for ci, shared := range []bool{true, false} {
		c := attnCase{t: 150, l: 200, hq: 6, hkv: 3, dk: 16, dr: 8, dv: 16, k: 120, causal: true}
		a := attnArgs(t, b, c, uint64(50+ci))
		if shared {
			shareLists(b, c, a)
		}
		run := func(ratio float64) []float32 {
			attnMaskedRatio = ratio
			sc := attnScratches.get()
			require.NoError(t, b.attnSetup(sc, a))
			masked := sc.job.masked
			putAttnScratch(sc)
			require.Equal(t, ratio > 0, masked, "shared %v: masked", shared)
			return attnWithRatio(t, b, c, a, ratio)
		}
		want := run(0)
		assertClose(t, fmt.Sprintf("shared lists %v", shared), run(math.Inf(1)), want)
	}
}

// shareLists replaces a's index lists, one per kv head, by the first kv
// head's for all of them ([T, 1, K]).
func shareLists(b *Backend, c attnCase, a *compute.AttnArgs) {
	idx := make([]int32, c.t*c.hkv*c.k)
	must(0, b.Read(idx, a.Indices))
	one := make([]int32, c.t*c.k)
	for r := range c.t {
		copy(one[r*c.k:(r+1)*c.k], idx[r*c.hkv*c.k:])
	}
	a.Indices = must(b.Alloc(compute.I32, c.t, 1, c.k))
	must(0, b.Write(a.Indices, one))
}

// attnWithRatio runs a with attnMaskedRatio set to ratio (0: the sparse
// path; +Inf: masked wherever the lists allow) and returns its output,
// written over NaNs.
func attnWithRatio(t *testing.T, b *Backend, c attnCase, a *compute.AttnArgs, ratio float64) []float32 {
	t.Helper()
	attnMaskedRatio = ratio
	out := make([]float32, c.t*c.hq*c.dv)
	for i := range out {
		out[i] = float32(math.NaN()) // a row the call leaves unwritten shows
	}
	must(0, b.Write(a.Out, out))
	require.NoError(t, b.Attention(a))
	must(0, b.Read(out, a.Out))
	return out
}

// TestAttnMaskedCallsApart: a worker's scratch keeps its row block's mask
// from one claim to the next, and a later call with other lists (same
// shapes, so the same row blocks) must not take it for its own.
func TestAttnMaskedCallsApart(t *testing.T) {
	b := New(2)
	defer b.Close()
	defer func(v float64) { attnMaskedRatio = v }(attnMaskedRatio)
	defer func(f func(int) bool) { attnDenseGrouped = f }(attnDenseGrouped)
	attnDenseGrouped = func(int) bool { return true }
	// One row block (48 rows of one head a kv head), lists shared by the
	// kv heads: every claim of the second call would find the first's.
	c := attnCase{t: 40, l: 200, hq: 6, hkv: 6, dk: 16, dr: 8, dv: 16, k: 120, causal: true}
	shared := func(seed uint64) *compute.AttnArgs {
		a := attnArgs(t, b, c, seed)
		shareLists(b, c, a)
		return a
	}
	first, second := shared(70), shared(71)
	want := attnWithRatio(t, b, c, second, 0)
	attnWithRatio(t, b, c, first, math.Inf(1))
	assertClose(t, "the second call's masks", attnWithRatio(t, b, c, second, math.Inf(1)), want)
}

// TestAttnMaskedRowsAlike: two row blocks at the same positions (rows of
// two drafts of one sequence, say) with other lists span the same
// positions; a mask kept for one must not serve the other.
func TestAttnMaskedRowsAlike(t *testing.T) {
	b := New(1)
	defer b.Close()
	defer func(v float64) { attnMaskedRatio = v }(attnMaskedRatio)
	defer func(f func(int) bool) { attnDenseGrouped = f }(attnDenseGrouped)
	const half, l, k = 48, 200, 100
	c := attnCase{t: 2 * half, l: l, hq: 6, hkv: 6, dk: 16, dr: 8, dv: 16, causal: true}
	a := attnArgs(t, b, c, 80)
	pos := make([]int32, c.t)
	idx := make([]int32, c.t*k)
	for r := range c.t {
		pos[r] = int32(l - half + r%half)
		// The first half's lists take the even positions, the second's
		// the odd ones, from the row's own down.
		list := idx[r*k : (r+1)*k]
		n, p := 0, int(pos[r])-(int(pos[r])+r/half)%2
		for ; n < k && p >= 0; n, p = n+1, p-2 {
			list[n] = int32(p)
		}
		for ; n < k; n++ {
			list[n] = -1
		}
	}
	a.QPos = uploadI32(b, pos)
	a.Indices = must(b.Alloc(compute.I32, c.t, 1, k))
	must(0, b.Write(a.Indices, idx))
	for _, grouped := range []bool{true, false} {
		attnDenseGrouped = func(int) bool { return grouped }
		want := attnWithRatio(t, b, c, a, 0)
		assertClose(t, fmt.Sprintf("grouped %v", grouped), attnWithRatio(t, b, c, a, math.Inf(1)), want)
	}
}

// TestAttnMaskedDense compares index-sparse passes on the dense blocked
// path with masks (attnMaskedPays) with the sparse path: causal lists as
// an indexer makes them, lists with -1 pads and entries past a row's
// position or the cache, lists per kv head and shared, MLA's MQA form
// with rope parts, and rows whose lists hold none of their positions
// (output 0, lse -Inf, as the sparse path gives them), on the per-head and
// the grouped dense path each. A pass whose lists repeat a position stays
// on the sparse path.
func TestAttnMaskedDense(t *testing.T) {
	b := New(2)
	defer b.Close()
	defer func(v float64) { attnMaskedRatio = v }(attnMaskedRatio)
	defer func(f func(int) bool) { attnDenseGrouped = f }(attnDenseGrouped)
	cases := []attnCase{
		{t: 40, l: 100, hq: 6, hkv: 1, dk: 32, dr: 8, dv: 32, k: 30, mqa: true, causal: true},
		{t: 70, l: 150, hq: 6, hkv: 1, dk: 64, dr: 32, dv: 64, k: 80, mqa: true},
		{t: 33, l: 200, hq: 4, hkv: 2, dk: 24, dv: 16, k: 50},
		{t: 50, l: 60, hq: 8, hkv: 2, dk: 16, dr: 4, dv: 24, k: 200, causal: true},
		{t: 40, l: 120, hq: 4, hkv: 2, dk: 24, dv: 16, k: 40, causal: true},
	}
	for i, c := range cases {
		a := attnArgs(t, b, c, uint64(i))
		if i == 2 {
			// Lists shared by the kv heads ([t, 1, K]), the first row's all
			// -1 and the second's all in its future.
			idx := make([]int32, c.t*c.k)
			r := rand.New(rand.NewPCG(9, uint64(i)))
			for row := range c.t {
				perm := r.Perm(c.l)
				for e := range c.k {
					idx[row*c.k+e] = int32(perm[e])
				}
			}
			for e := range c.k {
				idx[e], idx[c.k+e] = -1, int32(c.l-c.t+2+e%(c.t-2))
			}
			a.Indices = must(b.Alloc(compute.I32, c.t, 1, c.k))
			must(0, b.Write(a.Indices, idx))
		}
		run := func(ratio float64) ([]float32, []float32, bool) {
			attnMaskedRatio = ratio
			sc := attnScratches.get()
			defer putAttnScratch(sc)
			require.NoError(t, b.attnSetup(sc, a))
			masked := sc.job.masked
			require.NoError(t, b.Attention(a))
			out, lse := make([]float32, c.t*c.hq*c.dv), make([]float32, c.t*c.hq)
			must(0, b.Read(out, a.Out))
			must(0, b.Read(lse, a.LSE))
			return out, lse, masked
		}
		want, wantL, sparse := run(0)
		require.Falsef(t, sparse, "case %d: masked at ratio 0", i)
		for _, grouped := range []bool{false, true} {
			attnDenseGrouped = func(int) bool { return grouped }
			got, gotL, masked := run(math.Inf(1))
			require.Truef(t, masked, "case %d: not masked", i)
			what := fmt.Sprintf("case %d %+v grouped %v", i, c, grouped)
			assertClose(t, what+": out (sparse as want)", got, want)
			assertClose(t, what+": lse (sparse as want)", gotL, wantL)
			if i == 2 {
				for h := range c.hq {
					require.True(t, math.IsInf(float64(gotL[h]), -1), "%s: empty row's lse", what)
					require.True(t, math.IsInf(float64(gotL[c.hq+h]), -1), "%s: future-only row's lse", what)
				}
				for x := range 2 * c.hq * c.dv {
					require.Zero(t, got[x], "%s: empty rows' output", what)
				}
			}
		}
	}
	// At the default ratio: rows that see 1.35 times the positions their
	// lists hold run masked; rows that see 12.7 times run sparse, and so
	// do rows whose lists' pads and future entries leave them seeing
	// about 2.5 times what the lists hold.
	attnMaskedRatio = 2
	for _, rc := range []struct {
		c      attnCase
		masked bool
	}{
		{attnCase{t: 40, l: 60, hq: 6, hkv: 1, dk: 16, dv: 16, k: 30, mqa: true, causal: true}, true},
		{attnCase{t: 40, l: 400, hq: 6, hkv: 1, dk: 16, dv: 16, k: 30, mqa: true, causal: true}, false},
		{attnCase{t: 40, l: 100, hq: 6, hkv: 1, dk: 16, dv: 16, k: 45, mqa: true}, false},
	} {
		sc := attnScratches.get()
		require.NoError(t, b.attnSetup(sc, attnArgs(t, b, rc.c, 5)))
		require.Equal(t, rc.masked, sc.job.masked, "%+v", rc.c)
		putAttnScratch(sc)
	}
	// A repeated position keeps the sparse path.
	c := cases[0]
	a := attnArgs(t, b, c, 0)
	idx := make([]int32, c.t*c.hkv*c.k)
	must(0, b.Read(idx, a.Indices))
	require.GreaterOrEqual(t, idx[5*c.k], int32(0))
	idx[5*c.k+1] = idx[5*c.k]
	must(0, b.Write(a.Indices, idx))
	attnMaskedRatio = math.Inf(1)
	sc := attnScratches.get()
	defer putAttnScratch(sc)
	require.NoError(t, b.attnSetup(sc, a))
	require.False(t, sc.job.masked, "a list with a repeated position ran masked")
}

// BenchmarkAttnDense times dense prefill passes, a 512-token MHA-form
// pass (6 heads, 64+32 key dims, 64 value dims) and a 256-token pass in
// MLA's absorbed MQA form at the 100M preset's shape (6 heads on one
// latent head of 256 plus 32 rope dims), and a 512-token MHA-form pass at
// K3.1 Pro's (96 heads, 128+64 key dims, 128 value dims), on the grouped
// blocked path, the per-head one and the row path.
func BenchmarkAttnDense(b *testing.B) {
	be := New(0)
	defer be.Close()
	defer func(v int) { attnDenseMin = v }(attnDenseMin)
	defer func(f func(int) bool) { attnDenseGrouped = f }(attnDenseGrouped)
	for _, c := range []struct {
		name string
		attnCase
	}{
		{"mha", attnCase{t: 512, l: 512, hq: 6, hkv: 6, dk: 64, dr: 32, dv: 64}},
		{"mqa", attnCase{t: 256, l: 256, hq: 6, hkv: 1, dk: 256, dr: 32, dv: 256, mqa: true}},
		{"k3mha", attnCase{t: 512, l: 512, hq: 96, hkv: 96, dk: 128, dr: 64, dv: 128}},
	} {
		flops := 0.0
		for r := 0; r < c.t; r++ {
			flops += 2 * float64((r+1)*c.hq*(c.dk+c.dr+c.dv))
		}
		for _, path := range []struct {
			name    string
			min     int
			grouped bool
		}{{"grouped", denseRows, true}, {"heads", denseRows, false}, {"rows", math.MaxInt, false}} {
			b.Run(c.name+"/"+path.name, func(b *testing.B) {
				attnDenseMin = path.min
				attnDenseGrouped = func(int) bool { return path.grouped }
				a := attnArgs(b, be, c.attnCase, 1)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := be.Attention(a); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkAttnSparse times an index-sparse MLA prefill chunk in the
// absorbed form at the 100M preset's shape (256 rows at positions
// 256-511, 6 heads on one latent head of 256 plus 32 rope dims, top-256
// lists of visible positions, as the model's indexer gives them), with
// few heads' logits scored as the keys' product with the
// queries (attnSwapHeads) and as the queries' product with the keys, the
// two alternating call by call; it reports the queries-first time over
// the keys-first one.
func BenchmarkAttnSparse(b *testing.B) {
	be := New(0)
	defer be.Close()
	defer func(v int) { attnSwapHeads = v }(attnSwapHeads)
	c := attnCase{t: 256, l: 512, hq: 6, hkv: 1, dk: 256, dr: 32, dv: 256, k: 256, mqa: true, causal: true}
	a := attnArgs(b, be, c, 1)
	var took [2]time.Duration
	b.ResetTimer()
	for range b.N {
		for i, heads := range []int{8, 0} {
			attnSwapHeads = heads
			start := time.Now()
			if err := be.Attention(a); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
		}
	}
	b.ReportMetric(float64(took[0].Microseconds())/float64(b.N), "keys_first_us")
	b.ReportMetric(float64(took[1])/float64(took[0]), "queries_first/keys_first")
}

// BenchmarkAttnSparseK3 times index-sparse MLA attention in the absorbed
// form at K3.1 Pro's shape (96 heads on one latent head of 512 plus 64
// rope dims, 2,048 positions a row): a 64-row prefill chunk at the end of
// 16,384 positions and a decode row at the end of 65,536. Each row's list
// holds its 512 latest positions and random earlier ones, in no order (as
// an indexer gives them, by score). It reports GFLOP/s (the logits' and
// the values' products) and their share of the FMA peak the backend's
// pool probes in the same run (the 512-bit one where the CPU has it).
func BenchmarkAttnSparseK3(b *testing.B) {
	be := New(0)
	defer be.Close()
	peak := be.Pool().PeakKernelFLOPS()
	for _, c := range []attnCase{
		{t: 64, l: 16384, hq: 96, hkv: 1, dk: 512, dr: 64, dv: 512, k: 2048, mqa: true, causal: true},
		{t: 1, l: 65536, hq: 96, hkv: 1, dk: 512, dr: 64, dv: 512, k: 2048, mqa: true, causal: true},
	} {
		a := attnArgs(b, be, c, 1)
		r := rand.New(rand.NewPCG(3, 4))
		idx := make([]int32, c.t*c.k)
		for row := range c.t {
			qpos := c.l - c.t + row
			list := idx[row*c.k : (row+1)*c.k]
			seen := map[int32]bool{}
			for i := range list {
				p := int32(qpos - i)
				if i >= 512 {
					for p = int32(r.IntN(qpos + 1)); seen[p]; p = int32(r.IntN(qpos + 1)) {
					}
				}
				list[i], seen[p] = p, true
			}
			r.Shuffle(len(list), func(x, y int) { list[x], list[y] = list[y], list[x] })
		}
		must(0, be.Write(a.Indices, idx))
		flops := 2 * float64(c.t*c.hq*c.k*(c.dk+c.dr+c.dv))
		b.Run(fmt.Sprintf("rows=%d/positions=%d", c.t, c.l), func(b *testing.B) {
			for range b.N {
				if err := be.Attention(a); err != nil {
					b.Fatal(err)
				}
			}
			rate := flops * float64(b.N) / b.Elapsed().Seconds()
			b.ReportMetric(rate/1e9, "GFLOP/s")
			if peak > 0 {
				b.ReportMetric(rate/peak, "of_peak")
			}
		})
	}
}

// BenchmarkAttnMasked times index-sparse MLA prefill chunks in the
// absorbed form at the 100M preset's shape (256 rows, 6 heads on one
// latent head of 256 plus 32 rope dims, top-256 lists of visible
// positions) at the end of contexts of 512 to 1,536 positions, on the
// dense blocked path with masks and on the sparse path, the two
// alternating call by call. It reports the positions the rows see over
// those their lists hold (what attnMaskedPays compares with
// attnMaskedRatio) and the masked time over the sparse one.
func BenchmarkAttnMasked(b *testing.B) {
	be := New(0)
	defer be.Close()
	defer func(v float64) { attnMaskedRatio = v }(attnMaskedRatio)
	for _, l := range []int{512, 768, 1024, 1536} {
		b.Run(fmt.Sprintf("context=%d", l), func(b *testing.B) {
			c := attnCase{t: 256, l: l, hq: 6, hkv: 1, dk: 256, dr: 32, dv: 256, k: 256, mqa: true, causal: true}
			a := attnArgs(b, be, c, 1)
			seen := 0
			for r := range c.t {
				seen += l - c.t + r + 1
			}
			var took [2]time.Duration
			b.ResetTimer()
			for range b.N {
				for i, ratio := range []float64{math.Inf(1), 0} {
					attnMaskedRatio = ratio
					start := time.Now()
					if err := be.Attention(a); err != nil {
						b.Fatal(err)
					}
					took[i] += time.Since(start)
				}
			}
			b.ReportMetric(float64(seen)/float64(c.t*c.k), "seen/listed")
			b.ReportMetric(float64(took[0].Microseconds())/float64(b.N), "masked_us")
			b.ReportMetric(float64(took[1].Microseconds())/float64(b.N), "sparse_us")
			b.ReportMetric(float64(took[0])/float64(took[1]), "masked/sparse")
		})
	}
}

// TestAttnGroupedHeads compares the grouped-head path (a gathered key block
// scored for all heads of a kv head at once) with the key-by-key path on
// index-sparse attention: unsorted lists with -1 padding, future entries,
// MLA's MQA form (keys and values one tensor) with rope parts, and GQA.
func TestAttnGroupedHeads(t *testing.T) {
	b := New(2)
	defer b.Close()
	defer func(v int) { attnGroupMin = v }(attnGroupMin)
	for ci, c := range []attnCase{
		{t: 1, l: 150, hq: 8, hkv: 1, dk: 32, dr: 8, dv: 32, mqa: true}, // dense: contiguous blocks read in place
		{t: 3, l: 70, hq: 8, hkv: 2, dk: 16, dv: 24},
		{t: 3, l: 300, hq: 16, hkv: 1, dk: 64, dr: 16, dv: 64, k: 100, mqa: true},
		{t: 2, l: 90, hq: 8, hkv: 2, dk: 24, dv: 16, k: 70},
		{t: 5, l: 40, hq: 4, hkv: 1, dk: 33, dr: 5, dv: 33, k: 16, mqa: true},
		// 6 heads (the 100M preset's): scored as the keys' product with
		// the queries (attnSwapHeads), a last block of fewer than 8 keys
		// as the queries' product with the keys.
		{t: 4, l: 300, hq: 6, hkv: 1, dk: 64, dr: 32, dv: 64, k: 140, mqa: true},
		// 13 heads: two full six-head tiles and one of one in the values
		// product; 130 value dims: two 64-wide vector parts and a tail.
		{t: 2, l: 200, hq: 13, hkv: 1, dk: 130, dr: 8, dv: 130, k: 64, mqa: true},
		// 32 and 64 heads a kv head: the logits tile with the heads in
		// the lanes (kernel.AttnLogits, where the 512-bit kernels run),
		// over gathered blocks with a last tile of fewer than 8 keys, and
		// over blocks read in place (dense).
		{t: 2, l: 300, hq: 32, hkv: 1, dk: 64, dr: 16, dv: 64, k: 100, mqa: true},
		{t: 3, l: 150, hq: 64, hkv: 2, dk: 24, dv: 16, k: 70},
		{t: 1, l: 141, hq: 32, hkv: 1, dk: 40, dr: 8, dv: 40, mqa: true},
	} {
		attnGroupMin = 4
		got, gotL := runAttn(t, b, c, uint64(ci))
		attnGroupMin = math.MaxInt
		want, wantL := runAttn(t, b, c, uint64(ci))
		assertClose(t, fmt.Sprintf("case %d: out (key-by-key as want)", ci), got, want)
		assertClose(t, fmt.Sprintf("case %d: lse (key-by-key as want)", ci), gotL, wantL)
	}
}

// TestAttentionRowsAlone checks the compute.InvariantRows contract for
// attention: each row of a pass of up to that many rows gets, bit for bit,
// the result of a call with that row alone over the positions up to its
// own, as a decode step computes it; dense and index-sparse, with and
// without rope parts, with fewer kv heads than workers and with more.
//
// It runs on the exact backend and on NewFastBF16Indexer, whose
// index-sparse calls with 32 heads a kv head take the bf16 logits where
// they run.
func TestAttentionRowsAlone(t *testing.T) {
	for _, b := range []*Backend{New(2), NewFastBF16Indexer(2)} {
		t.Run(b.Name(), func(t *testing.T) {
			defer b.Close()
			testAttentionRowsAlone(t, b)
		})
	}
}

func testAttentionRowsAlone(t *testing.T, b *Backend) {
	for ci, c := range []attnCase{
		{t: 2, l: 40, hq: 6, hkv: 1, dk: 32, dr: 8, dv: 32, mqa: true},
		{t: 9, l: 90, hq: 6, hkv: 1, dk: 32, dr: 8, dv: 32, mqa: true},
		{t: 16, l: 300, hq: 6, hkv: 1, dk: 64, dr: 16, dv: 64, k: 100, mqa: true},
		{t: compute.InvariantRows, l: 200, hq: 8, hkv: 1, dk: 40, dr: 8, dv: 40, k: 64, mqa: true},
		{t: 7, l: 60, hq: 4, hkv: 2, dk: 24, dv: 16},
		{t: 12, l: 120, hq: 6, hkv: 6, dk: 16, dr: 4, dv: 16, k: 50},
		{t: compute.InvariantRows, l: compute.InvariantRows, hq: 2, hkv: 1, dk: 16, dv: 16},
		{t: 9, l: 150, hq: 32, hkv: 1, dk: 32, dr: 8, dv: 32, k: 60, mqa: true},
		{t: 5, l: 77, hq: 64, hkv: 2, dk: 16, dv: 16},
	} {
		a := attnArgs(t, b, c, uint64(ci))
		require.NoError(t, b.Attention(a))
		out, lse := make([]float32, c.t*c.hq*c.dv), make([]float32, c.t*c.hq)
		must(0, b.Read(out, a.Out))
		must(0, b.Read(lse, a.LSE))
		for r := range c.t {
			one := *a
			one.Q, one.QPos, one.KVLen = a.Q.Rows(r, r+1), a.QPos.Rows(r, r+1), int(I32(a.QPos)[r])+1
			if c.dr > 0 {
				one.QRope = a.QRope.Rows(r, r+1)
			}
			if c.k > 0 {
				one.Indices = a.Indices.Rows(r, r+1)
			}
			one.Out, one.LSE = must(b.Alloc(compute.F32, 1, c.hq, c.dv)), must(b.Alloc(compute.F32, 1, c.hq))
			require.NoError(t, b.Attention(&one))
			o, l := make([]float32, c.hq*c.dv), make([]float32, c.hq)
			must(0, b.Read(o, one.Out))
			must(0, b.Read(l, one.LSE))
			for i := range o {
				require.Equalf(t, math.Float32bits(o[i]), math.Float32bits(out[r*c.hq*c.dv+i]), "case %d %+v: row %d output %d: %g alone, %g in the pass", ci, c, r, i, o[i], out[r*c.hq*c.dv+i])
			}
			for i := range l {
				require.Equalf(t, math.Float32bits(l[i]), math.Float32bits(lse[r*c.hq+i]), "case %d: row %d lse %d", ci, r, i)
			}
		}
	}
}

// TestDecodeScoringAllocs: a decode row's indexer call scored from the
// keys as stored (64 heads) and its attention with the heads in the
// lanes (32 heads a kv head) allocate nothing once their scratch is warm,
// on the exact backend and with the bf16 indexer (NewFastBF16Indexer).
func TestDecodeScoringAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, b := range []*Backend{New(2), NewFastBF16Indexer(2)} {
		t.Run(b.Name(), func(t *testing.T) {
			defer b.Close()
			testDecodeScoringAllocs(t, b)
		})
	}
}

func testDecodeScoringAllocs(t *testing.T, b *Backend) {
	r := rand.New(rand.NewPCG(7, 7))
	const hi, di, l, topK = 64, 128, 1000, 256
	up := func(v []float32, dims ...int) compute.Tensor { return upload(b, v, dims...) }
	ix := compute.IndexerArgs{Q: up(normals(r, hi*di), 1, hi, di), K: up(normals(r, l*di), l, di), W: up(normals(r, hi), 1, hi),
		QPos: uploadI32(b, []int32{l - 1}), TopK: topK, Indices: must(b.Alloc(compute.I32, 1, topK))}
	at := attnArgs(t, b, attnCase{t: 1, l: 300, hq: 32, hkv: 1, dk: 64, dr: 16, dv: 64, k: 100, mqa: true}, 3)
	for name, call := range map[string]func() error{
		"indexer":   func() error { return b.LightningIndexer(&ix) },
		"attention": func() error { return b.Attention(at) },
	} {
		require.NoError(t, call())
		allocs := testing.AllocsPerRun(20, func() {
			if err := call(); err != nil {
				t.Fatal(err)
			}
		})
		require.Zero(t, allocs, name)
	}
}

// TestAttentionBF16 checks NewFastBF16Indexer's index-sparse attention
// against a float64 reference whose logits take q and k (and their rope
// parts) rounded as kernel.RoundBF16DAZ rounds them and whose values and
// weights stay exact. Where the bf16 scorings run (32 heads a kv head, the
// CPU paying for VDPBF16PS), the weights and values are rounded too, each
// within 2^-9 of itself, so an output lies within 2^-8·Σ e_s|v_s|/Σ e_s
// (+2e-5) of the reference, and somewhere beyond 2e-5 of it (the values'
// bf16 path ran); elsewhere, and for the dense call, the reference is the
// exact one, within 2e-5.
func TestAttentionBF16(t *testing.T) {
	b := NewFastBF16Indexer(2)
	defer b.Close()
	round := func(v float32) float64 {
		var h [1]uint16
		kernel.RoundBF16DAZ(h[:], []float32{v})
		return float64(math.Float32frombits(uint32(h[0]) << 16))
	}
	exact := func(v float32) float64 { return float64(v) }
	for ci, c := range []attnCase{
		{t: 3, l: 300, hq: 32, hkv: 1, dk: 64, dr: 16, dv: 64, k: 100, mqa: true},
		{t: 2, l: 200, hq: 64, hkv: 2, dk: 24, dv: 16, k: 70},
		{t: 2, l: 90, hq: 32, hkv: 1, dk: 32, dr: 8, dv: 32, mqa: true},       // dense: exact
		{t: 2, l: 90, hq: 8, hkv: 1, dk: 32, dr: 8, dv: 32, k: 40, mqa: true}, // 8 heads: exact
	} {
		a := attnArgs(t, b, c, uint64(ci+40))
		require.NoError(t, b.Attention(a))
		read := func(x compute.Tensor, n int) []float32 {
			v := make([]float32, n)
			must(0, b.Read(v, x))
			return v
		}
		out := read(a.Out, c.t*c.hq*c.dv)
		q, k, v := read(a.Q, c.t*c.hq*c.dk), read(a.K, c.l*c.hkv*c.dk), read(a.V, c.l*c.hkv*c.dv)
		var qr, kr []float32
		if c.dr > 0 {
			qr, kr = read(a.QRope, c.t*c.hq*c.dr), read(a.KRope, c.l*c.dr)
		}
		var idx []int32
		if c.k > 0 {
			idx = make([]int32, c.t*c.hkv*c.k)
			must(0, b.Read(idx, a.Indices))
		}
		rnd, bf16 := exact, c.k > 0 && c.hq/c.hkv%32 == 0 && b.fastDot()
		if bf16 {
			rnd = round
		}
		var far float64
		hg := c.hq / c.hkv
		for row := range c.t {
			pos := c.l - c.t + row
			for h := range c.hq {
				g := h / hg
				var keys []int
				if c.k > 0 {
					for _, s := range idx[(row*c.hkv+g)*c.k : (row*c.hkv+g+1)*c.k] {
						if s >= 0 && int(s) <= pos {
							keys = append(keys, int(s))
						}
					}
				} else {
					for s := 0; s <= pos; s++ {
						keys = append(keys, s)
					}
				}
				z := make([]float64, len(keys))
				zmax := math.Inf(-1)
				for i, s := range keys {
					for d := range c.dk {
						z[i] += rnd(q[(row*c.hq+h)*c.dk+d]) * rnd(k[(s*c.hkv+g)*c.dk+d])
					}
					for d := range c.dr {
						z[i] += rnd(qr[(row*c.hq+h)*c.dr+d]) * rnd(kr[s*c.dr+d])
					}
					z[i] *= 0.125
					zmax = math.Max(zmax, z[i])
				}
				var sum float64
				want, mag := make([]float64, c.dv), make([]float64, c.dv)
				for i, s := range keys {
					e := math.Exp(z[i] - zmax)
					sum += e
					for d := range c.dv {
						x := float64(v[(s*c.hkv+g)*c.dv+d])
						want[d] += e * x
						mag[d] += e * math.Abs(x)
					}
				}
				for d := range c.dv {
					got := float64(out[(row*c.hq+h)*c.dv+d])
					tol := 2e-5
					if bf16 {
						tol += mag[d] / sum / 256
					}
					require.InDelta(t, want[d]/sum, got, tol, "case %d %+v: row %d head %d dim %d", ci, c, row, h, d)
					far = math.Max(far, math.Abs(got-want[d]/sum))
				}
			}
		}
		if bf16 {
			require.Greater(t, far, 2e-5, "case %d: the values' bf16 path did not run", ci)
		}
	}
}
