package ascend

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/cpu"
	"k3/internal/floatx"
)

// fusedDrivers open backends whose drivers have the fused DSA operators:
// the host driver, and (with -tags ascend) ACL over the fake CANN.
var fusedDrivers = []struct {
	name string
	open func(Options) (*Backend, error)
}{{"host", OpenHost}}

// eachFused runs f on a backend of every fused driver, opened with
// FusedAttention.
func eachFused(t *testing.T, f func(t *testing.T, a *Backend)) {
	for _, d := range fusedDrivers {
		t.Run(d.name, func(t *testing.T) {
			a, err := d.open(Options{ArenaBytes: 64 << 20, FusedAttention: true})
			require.NoError(t, err)
			defer func() { require.NoError(t, a.Close()) }()
			f(t, a)
		})
	}
}

// rounded is v rounded to bf16, as float32.
func rounded(v []float32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = floatx.FromBF16(floatx.BF16(x))
	}
	return out
}

// fusedPools applies the same writes to pools on the fused backend (the
// values as they are) and on the pure-Go reference (the values rounded to
// bf16, which is what the fused operators read).
type fusedPools struct {
	t     *testing.T
	a     *Backend
	c     compute.Backend
	pa    []compute.Tensor // per pool, on a
	pc    []compute.Tensor // and on c
	width []int
}

func newFusedPools(t *testing.T, a *Backend, c compute.Backend, rows int, shapes ...[]int) *fusedPools {
	p := &fusedPools{t: t, a: a, c: c}
	for _, s := range shapes {
		x, err := a.Alloc(compute.F32, append([]int{rows}, s...)...)
		require.NoError(t, err)
		y, err := c.Alloc(compute.F32, append([]int{rows}, s...)...)
		require.NoError(t, err)
		w := 1
		for _, d := range s {
			w *= d
		}
		p.pa, p.pc, p.width = append(p.pa, x), append(p.pc, y), append(p.width, w)
	}
	return p
}

// scatter writes rows of random values at slots of pool i.
func (p *fusedPools) scatter(rng *rand.Rand, i int, slots []int32) {
	t, w, n := p.t, p.width[i], len(slots)
	v := randF32(rng, n*w)
	sa, err := p.a.FromHost(compute.F32, compute.F32, f32bytes(v), n, w)
	require.NoError(t, err)
	sc, err := p.c.FromHost(compute.F32, compute.F32, f32bytes(rounded(v)), n, w)
	require.NoError(t, err)
	ia, ic := positions(t, p.a, slots), positions(t, p.c, slots)
	require.NoError(t, p.a.ScatterRows(p.pa[i].Reshape(-1, w), ia, sa))
	require.NoError(t, p.c.ScatterRows(p.pc[i].Reshape(-1, w), ic, sc))
}

// write writes random values into rows r0..r1 of pool i with Write.
func (p *fusedPools) write(rng *rand.Rand, i, r0, r1 int) {
	w := p.width[i]
	v := randF32(rng, (r1-r0)*w)
	require.NoError(p.t, p.a.Write(p.pa[i].Reshape(-1, w).Rows(r0, r1), v))
	require.NoError(p.t, p.c.Write(p.pc[i].Reshape(-1, w).Rows(r0, r1), rounded(v)))
}

// copyRows copies rows src..src+n of pool i over rows dst..dst+n.
func (p *fusedPools) copyRows(i, dst, src, n int) {
	w := p.width[i]
	for _, x := range []struct {
		b    compute.Backend
		pool compute.Tensor
	}{{p.a, p.pa[i]}, {p.c, p.pc[i]}} {
		m := x.pool.Reshape(-1, w)
		require.NoError(p.t, x.b.Copy(m.Rows(dst, dst+n), m.Rows(src, src+n)))
	}
}

// fill sets rows r0..r1 of pool i to v.
func (p *fusedPools) fill(i, r0, r1 int, v float32) {
	w := p.width[i]
	require.NoError(p.t, p.a.Fill(p.pa[i].Reshape(-1, w).Rows(r0, r1), v))
	require.NoError(p.t, p.c.Fill(p.pc[i].Reshape(-1, w).Rows(r0, r1), floatx.FromBF16(floatx.BF16(v))))
}

// slotsOf maps positions from..to-1 of a sequence to pool rows by its
// page table.
func slotsOf(table []int32, page, from, to int) []int32 {
	var s []int32
	for p := from; p < to; p++ {
		s = append(s, table[p/page]*int32(page)+int32(p%page))
	}
	return s
}

func seq(from, to int) []int32 {
	var s []int32
	for p := from; p < to; p++ {
		s = append(s, int32(p))
	}
	return s
}

// The fused Lightning Indexer (the host driver's aclnnLightningIndexer
// over the bf16 mirror of an index-key pool) selects what the pure-Go
// backend selects from the same keys, queries and weights rounded to
// bf16, in the same order, with −1 past the positions a row sees; the
// mirror follows every kind of write into the pool: ScatterRows, Copy,
// Fill and Write.
func TestFusedIndexer(t *testing.T) { eachFused(t, testFusedIndexer) }

func testFusedIndexer(t *testing.T, a *Backend) {
	c := cpu.New(1)
	defer c.Close()
	rng := rand.New(rand.NewPCG(41, 42))
	const page, pages, HI, DI, K = 64, 6, 4, 128, 16
	table := []int32{4, 1, 3}
	pools := newFusedPools(t, a, c, pages*page, []int{DI})
	ta, tc := positions(t, a, table), positions(t, c, table)
	check := func(qpos []int32, klen int) {
		t.Helper()
		T := len(qpos)
		q, w := randF32(rng, T*HI*DI), randF32(rng, T*HI)
		qa, qc := both(t, a, c, compute.F32, rounded(q), T, HI, DI)
		require.NoError(t, a.Write(qa, q)) // the fused route rounds them itself
		wa, wc := both(t, a, c, compute.F32, rounded(w), T, HI)
		require.NoError(t, a.Write(wa, w))
		ia, err := a.Alloc(compute.I32, T, K)
		require.NoError(t, err)
		ic, err := c.Alloc(compute.I32, T, K)
		require.NoError(t, err)
		sc, err := c.Alloc(compute.F32, T, klen)
		require.NoError(t, err)
		require.NoError(t, a.LightningIndexer(&compute.IndexerArgs{Q: qa, W: wa, KPool: pools.pa[0], PageTable: ta, PageSize: page,
			KLen: klen, QPos: positions(t, a, qpos), TopK: K, Indices: ia}))
		require.NoError(t, c.LightningIndexer(&compute.IndexerArgs{Q: qc, W: wc, KPool: pools.pc[0], PageTable: tc, PageSize: page,
			KLen: klen, QPos: positions(t, c, qpos), TopK: K, Indices: ic, Scores: sc}))
		got, want := make([]int32, T*K), make([]int32, T*K)
		require.NoError(t, a.Read(&got, ia))
		require.NoError(t, c.Read(&want, ic))
		scores := read(t, c, sc)
		for r := range T {
			for j := range K {
				g, w := got[r*K+j], want[r*K+j]
				if g == w {
					continue
				}
				// The float64 scores may order a float32 near-tie otherwise.
				require.True(t, g >= 0 && w >= 0, "row %d slot %d: %d, want %d", r, j, g, w)
				sg, sw := scores[r*klen+int(g)], scores[r*klen+int(w)]
				require.InDelta(t, sw, sg, 1e-5*(1+math.Abs(float64(sw))), "row %d slot %d: %d (score %g), want %d (score %g)", r, j, g, sg, w, sw)
			}
		}
	}
	pools.scatter(rng, 0, slotsOf(table, page, 0, 150))
	check([]int32{5}, 6) // fewer positions than K: −1 after them
	check([]int32{148, 149}, 150)
	pools.scatter(rng, 0, slotsOf(table, page, 150, 170))
	pools.write(rng, 0, 5*page, 6*page)
	pools.copyRows(0, 1*page, 5*page, page) // the sequence's second page
	pools.fill(0, 3*page+40, 3*page+50, 0)
	pools.fill(0, 3*page+10, 3*page+12, 0.75)
	check(seq(150, 170), 170) // the first rows must not see the last keys
	ix, at, mirrors := a.FusedCalls()
	require.Equal(t, [3]int64{3, 0, 1}, [3]int64{ix, at, mirrors})
}

// The fused sparse attention (the host driver's aclnnSparseFlashAttention
// in MLA-absorb mode over bf16 mirrors of the latent and rope pools)
// gives the pure-Go backend's output over the same operands rounded to
// bf16, within the bf16 rounding of the output, and its LSE; −1, an index
// past the cache and one past a row's position are skipped. Then a
// captured step (the new keys scattered, attention) replays with new
// positions, slots and keys: the key count comes from the positions on
// the device.
func TestFusedAttention(t *testing.T) { eachFused(t, testFusedAttention) }

func testFusedAttention(t *testing.T, a *Backend) {
	c := cpu.New(1)
	defer c.Close()
	rng := rand.New(rand.NewPCG(43, 44))
	const page, pages, N, Dc, Dr, Kn = 64, 4, 4, 32, 8, 12
	const scale = 0.3
	table := []int32{2, 0}
	pools := newFusedPools(t, a, c, pages*page, []int{1, Dc}, []int{Dr})
	ta, tc := positions(t, a, table), positions(t, c, table)
	type side struct {
		q, qr, idx, pos, out, lse compute.Tensor
	}
	alloc := func(be compute.Backend, T int) side {
		var s side
		var err error
		for _, x := range []struct {
			t     *compute.Tensor
			dt    compute.DType
			shape []int
		}{{&s.q, compute.F32, []int{T, N, Dc}}, {&s.qr, compute.F32, []int{T, N, Dr}}, {&s.idx, compute.I32, []int{T, 1, Kn}},
			{&s.pos, compute.I32, []int{T}}, {&s.out, compute.F32, []int{T, N, Dc}}, {&s.lse, compute.F32, []int{T, N}}} {
			*x.t, err = be.Alloc(x.dt, x.shape...)
			require.NoError(t, err)
		}
		return s
	}
	args := func(s side, pk, pr, tab compute.Tensor, klen int) *compute.AttnArgs {
		return &compute.AttnArgs{Q: s.q, QRope: s.qr, KPool: pk, KRopePool: pr, PageTable: tab, PageSize: page,
			Indices: s.idx, QPos: s.pos, KVLen: klen, Causal: true, Scale: scale, Out: s.out, LSE: s.lse}
	}
	// fill writes the queries, positions and index lists of one call to
	// both sides.
	fill := func(sa, sc side, qpos []int32, klen int) {
		T := len(qpos)
		q, qr := randF32(rng, T*N*Dc), randF32(rng, T*N*Dr)
		idx := make([]int32, T*Kn)
		for r := range T {
			perm := rng.Perm(klen) // distinct positions
			for j := range Kn {
				idx[r*Kn+j] = int32(perm[j])
			}
			idx[r*Kn] = -1
			idx[r*Kn+1] = qpos[r] + 1 // past the row's position: skipped, unless it is a later row's
			idx[r*Kn+2] = int32(klen + 3)
		}
		for _, x := range []struct {
			b compute.Backend
			s side
			r bool
		}{{a, sa, false}, {c, sc, true}} {
			qq, qqr := q, qr
			if x.r {
				qq, qqr = rounded(q), rounded(qr)
			}
			require.NoError(t, x.b.Write(x.s.q, qq))
			require.NoError(t, x.b.Write(x.s.qr, qqr))
			require.NoError(t, x.b.Write(x.s.idx, idx))
			require.NoError(t, x.b.Write(x.s.pos, qpos))
		}
	}
	compare := func(sa, sc side, what string) {
		t.Helper()
		want, got := read(t, c, sc.out), read(t, a, sa.out)
		var scaleOut float64
		for _, v := range want {
			scaleOut = max(scaleOut, math.Abs(float64(v)))
		}
		closeRel(t, want, got, 1e-6+scaleOut*0x1p-8, 0x1p-8, what, "out")
		closeRel(t, read(t, c, sc.lse), read(t, a, sa.lse), 1e-5, 1e-5, what, "lse")
	}
	pools.scatter(rng, 0, slotsOf(table, page, 0, 100))
	pools.scatter(rng, 1, slotsOf(table, page, 0, 100))
	sa, sc := alloc(a, 3), alloc(c, 3)
	fill(sa, sc, []int32{97, 98, 99}, 100)
	require.NoError(t, a.Attention(args(sa, pools.pa[0], pools.pa[1], ta, 100)))
	require.NoError(t, c.Attention(args(sc, pools.pc[0], pools.pc[1], tc, 100)))
	compare(sa, sc, "eager")

	// One decode row: its key scattered, then attention, captured.
	da, dc := alloc(a, 1), alloc(c, 1)
	slotA, err := a.Alloc(compute.I32, 1)
	require.NoError(t, err)
	kvNew, err := a.Alloc(compute.F32, 1, Dc)
	require.NoError(t, err)
	peNew, err := a.Alloc(compute.F32, 1, Dr)
	require.NoError(t, err)
	step := func() error {
		if err := a.ScatterRows(pools.pa[0].Reshape(-1, Dc), slotA, kvNew); err != nil {
			return err
		}
		if err := a.ScatterRows(pools.pa[1], slotA, peNew); err != nil {
			return err
		}
		// KVLen is only the host's bound here: the device counts the keys.
		return a.Attention(args(da, pools.pa[0], pools.pa[1], ta, page*len(table)))
	}
	decode := func(pos int32, run func() error) {
		t.Helper()
		fill(da, dc, []int32{pos}, int(pos)+1)
		kv, pe := randF32(rng, Dc), randF32(rng, Dr)
		slot := slotsOf(table, page, int(pos), int(pos)+1)
		require.NoError(t, a.Write(slotA, slot))
		require.NoError(t, a.Write(kvNew, kv))
		require.NoError(t, a.Write(peNew, pe))
		require.NoError(t, run())
		sl := positions(t, c, slot)
		kc, err := c.FromHost(compute.F32, compute.F32, f32bytes(rounded(kv)), 1, Dc)
		require.NoError(t, err)
		pc, err := c.FromHost(compute.F32, compute.F32, f32bytes(rounded(pe)), 1, Dr)
		require.NoError(t, err)
		require.NoError(t, c.ScatterRows(pools.pc[0].Reshape(-1, Dc), sl, kc))
		require.NoError(t, c.ScatterRows(pools.pc[1], sl, pc))
		require.NoError(t, c.Attention(args(dc, pools.pc[0], pools.pc[1], tc, int(pos)+1)))
		compare(da, dc, "decode")
	}
	decode(100, step) // eager, which makes the step's constants
	g, err := a.Capture(step)
	require.NoError(t, err)
	defer g.Close()
	for _, pos := range []int32{101, 102, 120} {
		decode(pos, g.Replay)
	}
	ix, at, mirrors := a.FusedCalls()
	require.Equal(t, [3]int64{0, 3, 2}, [3]int64{ix, at, mirrors}) // replays are not calls
}

// lacksFused is the host driver without the fused DSA operators, as a
// CANN installation without them.
type lacksFused struct{ *hostDriver }

func (lacksFused) hasOperator(name string) bool {
	return name != "aclnnLightningIndexer" && name != "aclnnSparseFlashAttention"
}

// Without the operators, a backend opened with FusedAttention runs the
// compositions: the same results, bitwise, as one opened without, and no
// mirrors.
func TestFusedFallback(t *testing.T) {
	open := func(o Options) (*Backend, error) { return newBackend(lacksFused{newHostDriver()}, o) }
	rng := rand.New(rand.NewPCG(45, 46))
	const page, HI, DI, K, T = 64, 2, 128, 8, 2
	q, w, keys := randF32(rng, T*HI*DI), randF32(rng, T*HI), randF32(rng, 2*page*DI)
	var results [2][]int32
	for i, fused := range []bool{false, true} {
		b, err := open(Options{ArenaBytes: 32 << 20, FusedAttention: fused})
		require.NoError(t, err)
		qa, err := b.FromHost(compute.F32, compute.F32, f32bytes(q), T, HI, DI)
		require.NoError(t, err)
		wa, err := b.FromHost(compute.F32, compute.F32, f32bytes(w), T, HI)
		require.NoError(t, err)
		pool, err := b.FromHost(compute.F32, compute.F32, f32bytes(keys), 2*page, DI)
		require.NoError(t, err)
		ix, err := b.Alloc(compute.I32, T, K)
		require.NoError(t, err)
		require.NoError(t, b.LightningIndexer(&compute.IndexerArgs{Q: qa, W: wa, KPool: pool, PageTable: positions(t, b, []int32{1, 0}),
			PageSize: page, KLen: 100, QPos: positions(t, b, []int32{98, 99}), TopK: K, Indices: ix}))
		results[i] = make([]int32, T*K)
		require.NoError(t, b.Read(&results[i], ix))
		n1, n2, m := b.FusedCalls()
		require.Zero(t, n1+n2+m)
		require.NoError(t, b.Close())
	}
	require.Equal(t, results[0], results[1])
}
