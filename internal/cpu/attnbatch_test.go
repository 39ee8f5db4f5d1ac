package cpu

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
)

// TestAttentionBatch: calls run as one batch give every output and lse
// bitwise what each call gives alone, on every path (rows split over the
// workers, grouped heads with and without the heads-in-lanes logits,
// key by key, index-sparse, dense blocked prefill) and over contiguous,
// paged and pooled caches; the batch's error names its call.
func TestAttentionBatch(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(9, 9))
	defer func(v int) { attnDenseMin = v }(attnDenseMin)
	attnDenseMin = 40
	cases := []attnCase{
		{t: 1, l: 37, hq: 6, hkv: 1, dk: 32, dr: 8, dv: 32, mqa: true},         // a decode row, MQA, split over the workers
		{t: 1, l: 300, hq: 6, hkv: 1, dk: 32, dr: 8, dv: 32, mqa: true},        // a longer one
		{t: 1, l: 150, hq: 32, hkv: 1, dk: 40, dr: 8, dv: 40, mqa: true},       // heads in the lanes
		{t: 1, l: 90, hq: 4, hkv: 4, dk: 16, dv: 12},                           // key by key
		{t: 8, l: 260, hq: 8, hkv: 1, dk: 16, dr: 4, dv: 16, k: 40, mqa: true}, // a verify pass, sparse
		{t: 3, l: 120, hq: 8, hkv: 2, dk: 24, dv: 16, k: 30},                   // GQA, per-head lists
		{t: 48, l: 48, hq: 4, hkv: 2, dk: 16, dr: 8, dv: 16},                   // dense blocked prefill
		{t: 1, l: 5, hq: 6, hkv: 1, dk: 32, dr: 8, dv: 32, mqa: true},          // fewer positions than workers
	}
	var calls []*compute.AttnArgs
	var want, wantLSE [][]float32
	for i, c := range cases {
		a := attnArgs(t, b, c, uint64(20+i))
		if i%3 == 1 { // paged, as the DSA cache keeps it
			p := *a
			p.KPages, p.PageSize = pagesFrom(t, b, a.K, 64, r), 64
			if !c.mqa {
				p.VPages = pagesFrom(t, b, a.V, 64, r)
			}
			if c.dr > 0 {
				p.KRopePages = pagesFrom(t, b, a.KRope, 64, r)
			}
			p.K, p.V, p.KRope = compute.Tensor{}, compute.Tensor{}, compute.Tensor{}
			a = &p
		}
		require.NoError(t, b.Attention(a))
		out, lse := make([]float32, a.Out.Len()), make([]float32, a.LSE.Len())
		must(0, b.Read(out, a.Out))
		must(0, b.Read(lse, a.LSE))
		want, wantLSE = append(want, out), append(wantLSE, lse)
		p := *a
		p.Out, p.LSE = must(b.Alloc(compute.F32, a.Out.Dims[:3]...)), must(b.Alloc(compute.F32, a.LSE.Dims[:2]...))
		calls = append(calls, &p)
	}
	check := func(name string, run func([]*compute.AttnArgs) error) {
		for _, a := range calls {
			require.NoError(t, b.Fill(a.Out, 7))
			require.NoError(t, b.Fill(a.LSE, 7))
		}
		require.NoError(t, run(calls), name)
		for i, a := range calls {
			got, gotLSE := make([]float32, a.Out.Len()), make([]float32, a.LSE.Len())
			must(0, b.Read(got, a.Out))
			must(0, b.Read(gotLSE, a.LSE))
			require.Equal(t, want[i], got, "%s: call %d %+v: output", name, i, cases[i])
			require.Equal(t, wantLSE[i], gotLSE, "%s: call %d %+v: lse", name, i, cases[i])
		}
	}
	check("AttentionBatch", b.AttentionBatch)
	check("compute.AttentionBatch", func(c []*compute.AttnArgs) error { return compute.AttentionBatch(b, c) })
	check("one after another", func(c []*compute.AttnArgs) error { return compute.AttentionBatch(plainBackend{b}, c) })
	check("a batch of one", func(c []*compute.AttnArgs) error {
		for _, a := range c {
			if err := b.AttentionBatch([]*compute.AttnArgs{a}); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, b.AttentionBatch(nil))

	// A bad call is named, and nothing is written for a batch that fails
	// its checks.
	bad := *calls[2]
	bad.KVLen = 1 << 20
	for _, a := range calls {
		require.NoError(t, b.Fill(a.Out, 7))
	}
	err := b.AttentionBatch([]*compute.AttnArgs{calls[0], calls[1], &bad, calls[3]})
	require.ErrorContains(t, err, "attention call 2 of 4")
	require.ErrorContains(t, err, "kv length")
	err = compute.AttentionBatch(plainBackend{b}, []*compute.AttnArgs{calls[0], &bad})
	require.ErrorContains(t, err, "attention call 1 of 2")
	bad = *calls[0]
	bad.Out = must(b.Alloc(compute.F32, 2, 2))
	err = b.AttentionBatch([]*compute.AttnArgs{calls[1], &bad})
	require.True(t, errors.Is(err, compute.ErrShape), "%v", err)
	got := make([]float32, calls[1].Out.Len())
	must(0, b.Read(got, calls[1].Out))
	for _, v := range got {
		require.Equal(t, float32(7), v, "a batch that failed its checks wrote an output")
	}
}

// plainBackend hides AttentionBatch and LightningIndexerBatch (methods of
// other signatures shadow them), so compute.AttentionBatch and
// LightningIndexerBatch run the calls one after another.
type plainBackend struct{ *Backend }

func (p plainBackend) AttentionBatch()        {}
func (p plainBackend) LightningIndexerBatch() {}
