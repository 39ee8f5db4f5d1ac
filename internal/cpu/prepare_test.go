package cpu

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/compute"
	"k3/internal/floatx"
	"k3/internal/kernel"
)

// bf16Weight uploads a random bf16 weight [n, k] and returns it with its
// values.
func bf16Weight(t testing.TB, b *Backend, r *rand.Rand, n, k int) (compute.Tensor, []float32) {
	t.Helper()
	data := make([]byte, 2*n*k)
	vals := make([]float32, n*k)
	for i := range vals {
		h := floatx.BF16(float32(r.NormFloat64()))
		vals[i] = floatx.FromBF16(h)
		data[2*i], data[2*i+1] = byte(h), byte(h>>8)
	}
	w, err := b.FromHost(compute.BF16, compute.BF16, data, n, k)
	require.NoError(t, err)
	return w, vals
}

// TestPrepareMatMul: a prepared bf16 weight reads back as the weight,
// its products agree with the stored layout's within float32 summation
// error and give every row of up to 100 its result alone, bit for bit; a
// view of it is refused; narrow and f32 weights and the fast-bf16 backend
// keep theirs.
func TestPrepareMatMul(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(7, 8))
	const n = kernel.KMajorMinN + 17
	if b.packing() == 0 {
		w, _ := bf16Weight(t, b, r, n, 96)
		p, err := b.PrepareMatMul(w)
		require.NoError(t, err)
		assert.Equal(t, w, p, "without the k-major or AMX tiles the weight stays as stored")
		t.Skip("neither the k-major nor the AMX tiles run on this path")
	}
	// Under AMX, a weight of three k-blocks (96 columns) is laid out
	// k-major, one of five (160) for the tiles.
	for _, k := range []int{96, 160} {
		want := b.packing()
		if want == amxTiles && k == 96 {
			want = kMajor
		}
		t.Run(fmt.Sprint(k), func(t *testing.T) { testPrepared(t, b, r, n, k, want) })
	}
	for _, k := range []int{96, 160} {
		t.Run(fmt.Sprint("others/", k), func(t *testing.T) { testPreparedOthers(t, b, r, n, k) })
	}
}

// testPrepared checks a prepared weight [n, k] and that its layout is
// layout.
func testPrepared(t *testing.T, b *Backend, r *rand.Rand, n, k int, layout packing) {
	w, vals := bf16Weight(t, b, r, n, k)
	p, err := b.PrepareMatMul(w)
	require.NoError(t, err)
	_, how, err := packedOf(p)
	require.NoError(t, err)
	require.Equal(t, layout, how, "the layout of a [%d %d] weight", n, k)
	require.Equal(t, w.Dims, p.Dims)
	back := make([]float32, n*k)
	require.NoError(t, b.Read(back, p))
	require.Equal(t, vals, back)

	const most = 100
	xs := make([]float32, most*k)
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
	}
	x, err := b.Alloc(compute.F32, most, k)
	require.NoError(t, err)
	require.NoError(t, b.Write(x, xs))
	stored, err := b.Alloc(compute.F32, most, n)
	require.NoError(t, err)
	prepared, err := b.Alloc(compute.F32, most, n)
	require.NoError(t, err)
	require.NoError(t, b.MatMul(stored, x, w))
	require.NoError(t, b.MatMul(prepared, x, p))
	got, want := F32(prepared), F32(stored)
	for i := range want {
		var mag float64
		for q := 0; q < k; q++ {
			mag += math.Abs(float64(xs[i/n*k+q] * vals[i%n*k+q]))
		}
		require.InDelta(t, want[i], got[i], float64(k)*0x1p-23*mag, "element %d", i)
	}
	// A row alone gets what it gets among compute.InvariantRows rows, and
	// among any number where the long products keep the layout's
	// arithmetic; on the AMX tiles they get the tiles' bits.
	short, err := b.Alloc(compute.F32, compute.InvariantRows, n)
	require.NoError(t, err)
	require.NoError(t, b.MatMul(short, x.Rows(0, compute.InvariantRows), p))
	if layout == kMajor && longOnTiles(layout, k) {
		wb, err := bf16Bits(p)
		require.NoError(t, err)
		packed := make([]uint16, kernel.AMXLen(n, k))
		kernel.PackAMX(packed, wb, n, k)
		tiles := make([]float32, most*n)
		b.pool.MatMulAMX(tiles, xs, packed, most, n, k)
		require.Equal(t, tiles, got, "the long product on the tiles")
	} else {
		require.Equal(t, got[:compute.InvariantRows*n], F32(short), "%d rows among %d", compute.InvariantRows, most)
	}
	one, err := b.Alloc(compute.F32, 1, n)
	require.NoError(t, err)
	for i := 0; i < compute.InvariantRows; i++ {
		require.NoError(t, b.MatMul(one, x.Rows(i, i+1), p))
		require.Equal(t, F32(short)[i*n:(i+1)*n], F32(one), "row %d alone", i)
	}

	wide, err := b.Alloc(compute.F32, 2, 2*n)
	require.NoError(t, err)
	err = b.MatMul(wide, x.Rows(0, 1).Reshape(2, k/2), p.Reshape(2*n, k/2))
	require.Error(t, err)
	assert.True(t, errors.Is(err, compute.ErrShape), "%v", err)
}

// testPreparedOthers checks that narrow and f32 weights keep their layout
// and what the fast-bf16 backend does with one of [n, k].
func testPreparedOthers(t *testing.T, b *Backend, r *rand.Rand, n, k int) {
	const most = 100
	xs := make([]float32, most*k)
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
	}
	narrow, _ := bf16Weight(t, b, r, kernel.KMajorMinN-1, k)
	pn, err := b.PrepareMatMul(narrow)
	require.NoError(t, err)
	assert.Equal(t, narrow, pn, "a weight narrower than KMajorMinN stays as stored")

	f, err := b.Alloc(compute.F32, n, k)
	require.NoError(t, err)
	pf, err := b.PrepareMatMul(f)
	require.NoError(t, err)
	assert.Equal(t, f, pf)
	fast := NewFastBF16(1)
	defer fast.Close()
	wf, fv := bf16Weight(t, fast, r, n, k)
	pw, err := fast.PrepareMatMul(wf)
	require.NoError(t, err)
	if fast.packing() == 0 {
		assert.Equal(t, wf, pw, "the fast backend keeps the stored layout for the bf16 dot product")
		return
	}
	// Where the bf16 dot product pays (and the AMX tiles do not run) the
	// fast backend lays the weight's k pairs side by side and every
	// product rounds x to bf16 (2^-8 of the magnitude), a row's result the
	// same bits alone as among others. Elsewhere it packs as the exact
	// backend does, and the long products of a weight on the AMX tiles (in
	// their layout, or k-major where the CPU runs them) round x, its short
	// ones stay exact. A weight too shallow for the tiles, or on a CPU
	// without them, has every product exact there.
	_, how, err := packedOf(pw)
	require.NoError(t, err)
	require.Equal(t, fast.fastDot() && !kernel.AMXAvailable(), how == kPairs, "pair-interleaved where VDPBF16PS pays and no AMX")
	if how == kPairs {
		odd, _ := bf16Weight(t, fast, r, n, k+1)
		po, err := fast.PrepareMatMul(odd)
		require.NoError(t, err)
		assert.Equal(t, odd, po, "a weight of odd k keeps the stored layout on the fast backend")
	}
	roundsX := longOnTiles(how, k)
	var firstRow []float32
	for _, rows := range []int{most, 1} {
		xf, err := fast.Alloc(compute.F32, rows, k)
		require.NoError(t, err)
		require.NoError(t, fast.Write(xf, xs[:rows*k]))
		yf, err := fast.Alloc(compute.F32, rows, n)
		require.NoError(t, err)
		require.NoError(t, fast.MatMul(yf, xf, pw))
		requireProduct(t, F32(yf), xs, fv, n, k, how == kPairs || roundsX && rows >= kernel.PackedMinRows, fmt.Sprintf("fast backend, %d rows", rows))
		if how == kPairs && rows == 1 {
			require.Equal(t, firstRow, F32(yf), "fast backend: row 0 alone and among %d", most)
		}
		firstRow = slices.Clone(F32(yf)[:n])
	}
}

// requireProduct checks got, rows of x [., k] times wᵀ (w [n, k]), against
// the float64 product within float32 summation error over k of the
// products' magnitude, or 2^-8 of it where roundsX (x rounded to bf16).
func requireProduct(t *testing.T, got, x, w []float32, n, k int, roundsX bool, what string) {
	t.Helper()
	for i, v := range got {
		var want, mag float64
		for q := 0; q < k; q++ {
			want += float64(x[i/n*k+q]) * float64(w[i%n*k+q])
			mag += math.Abs(float64(x[i/n*k+q] * w[i%n*k+q]))
		}
		tol := float64(k) * 0x1p-23 * mag
		if roundsX {
			tol = 0x1p-8 * mag
		}
		require.InDelta(t, want, v, tol, "%s, element %d", what, i)
	}
}

// TestPrepareMatMulNarrowTiles: where the AMX tiles run (or the fast
// backend lays weights out pair-interleaved, or the exact one k-major), a
// narrow weight keeps its stored layout for products of fewer than
// amxMinRows rows (bit for bit those of an unprepared copy) and
// runs longer ones on a tile copy of its values (bit for bit the tile
// product of the weight, within float32 summation error of the float64
// product); a view of another shape, the experts' serial products and
// weights too narrow or too shallow keep the stored layout, and Write is
// refused.
func TestPrepareMatMulNarrowTiles(t *testing.T) {
	ran := false
	for _, fast := range []bool{false, true} {
		b := New(2)
		if fast {
			b = NewFastBF16(2)
		}
		defer b.Close()
		r := rand.New(rand.NewPCG(9, 10))
		const n, k = 64, 160
		w, vals := bf16Weight(t, b, r, n, k)
		p, err := b.PrepareMatMul(w)
		require.NoError(t, err)
		require.Equal(t, w, p, "a narrow weight stays a view of its stored bits")
		tiles := w.Mem.(*buffer).tiles
		// The fast backend's pair-interleaved copy where it lays weights
		// out so (VDPBF16PS pays, no AMX).
		pairs := b.packing() == kPairs
		form := amxTiles
		switch {
		case pairs:
			form = kPairs
		case !longOnTiles(b.packing(), k) && b.packing() == kMajor:
			form = kMajor
		case !longOnTiles(b.packing(), k):
			require.Nil(t, tiles, "no tile copy where weights keep their stored layout")
			continue
		}
		ran = true
		require.NotNil(t, tiles)
		require.Equal(t, form, tiles.form)
		none := [][2]int{{amxMinN - 1, k}}
		switch form {
		case kPairs:
			none = [][2]int{{pairsMinN - 1, k}, {n, k + 1}}
		case kMajor:
			// Too few rows, or a last panel mostly padding.
			none = [][2]int{{15, k}, {8, k}, {40, k}, {95, k}}
		}
		for _, nk := range none {
			o, _ := bf16Weight(t, b, r, nk[0], nk[1])
			_, err := b.PrepareMatMul(o)
			require.NoError(t, err)
			require.Nil(t, o.Mem.(*buffer).tiles, "a [%d %d] weight takes no tile copy", nk[0], nk[1])
		}
		if form == amxTiles {
			// Too shallow for the tiles: a k-major copy where the wide
			// weights are laid out k-major, none where they take the
			// tiles' layout (K3_KERNEL=amx).
			o, _ := bf16Weight(t, b, r, n, amxMinK-32)
			_, err := b.PrepareMatMul(o)
			require.NoError(t, err)
			if b.packing() == kMajor {
				require.NotNil(t, o.Mem.(*buffer).tiles, "a [%d %d] weight takes a k-major copy", n, amxMinK-32)
				require.Equal(t, kMajor, o.Mem.(*buffer).tiles.form)
			} else {
				require.Nil(t, o.Mem.(*buffer).tiles, "a [%d %d] weight takes no tile copy", n, amxMinK-32)
			}
		}

		// An unprepared copy of the same bits: a tensor over another buffer.
		raw := make([]byte, 2*n*k)
		for i, v := range vals {
			h := floatx.BF16(v)
			raw[2*i], raw[2*i+1] = byte(h), byte(h>>8)
		}
		plain, err := b.FromHost(compute.BF16, compute.BF16, raw, n, k)
		require.NoError(t, err)
		wb := make([]uint16, n*k)
		for i, v := range vals {
			wb[i] = floatx.BF16(v)
		}
		var packed []uint16
		switch form {
		case kPairs:
			packed = make([]uint16, kernel.KPairLen(n, k))
			kernel.PackKPairs(packed, wb, n, k)
		case kMajor:
			packed = make([]uint16, kernel.KMajorLen(n, k))
			kernel.PackKMajor(packed, wb, n, k)
		default:
			packed = make([]uint16, kernel.AMXLen(n, k))
			kernel.PackAMX(packed, wb, n, k)
		}

		const most = 150
		xs := make([]float32, most*k)
		for i := range xs {
			xs[i] = float32(r.NormFloat64())
		}
		// The experts' serial product makes no tile copy.
		y := make([]float32, most*n)
		require.NoError(t, serialMatMul(y, xs, nil, p, most, true))
		require.Nil(t, tiles.packed, "a serial (expert) product made the tile copy")

		for _, rows := range []int{1, 8, amxMinRows - 1, amxMinRows, kernel.PackedMinRows - 1, kernel.PackedMinRows, most} {
			x := upload(b, xs[:rows*k], rows, k)
			got, ref := product(t, b, x, p), product(t, b, x, plain)
			if rows < amxMinRows {
				require.Equal(t, ref, got, "%d rows: the stored layout's product", rows)
				continue
			}
			require.NotNil(t, tiles.packed, "%d rows: no tile copy made", rows)
			// The fast backend rounds x only in products of
			// kernel.PackedMinRows rows or more.
			rounds := fast && rows >= kernel.PackedMinRows
			want := make([]float32, rows*n)
			if pairs {
				// Every long product on the pair copy rounds x.
				rounds = true
				b.pool.MatMulKPairs(want, xs, packed, rows, n, k)
			} else if form == kMajor {
				b.pool.MatMulKMajor(want, xs, packed, rows, n, k)
			} else if rounds {
				b.pool.MatMulAMXFast(want, xs, packed, rows, n, k)
			} else {
				b.pool.MatMulAMX(want, xs, packed, rows, n, k)
			}
			require.Equal(t, want, got, "%d rows: the tile product", rows)
			requireProduct(t, got, xs, vals, n, k, rounds, fmt.Sprintf("%d rows", rows))
		}

		// A view of another shape reads the stored bits.
		x := upload(b, xs[:most*k/2], most, k/2)
		require.Equal(t, product(t, b, x, plain.Reshape(2*n, k/2)), product(t, b, x, p.Reshape(2*n, k/2)), "a reshaped view")

		err = b.Write(p, make([]uint16, n*k))
		require.Error(t, err, "a write into a weight with a tile copy")
		back := make([]float32, n*k)
		require.NoError(t, b.Read(back, p))
		require.Equal(t, vals, back)
	}
	if !ran {
		t.Skip("no AMX tiles, pair or k-major copies for long products here")
	}
}

// product returns x · wᵀ computed by b's MatMul.
func product(t *testing.T, b *Backend, x, w compute.Tensor) []float32 {
	t.Helper()
	y, err := b.Alloc(compute.F32, x.Len()/x.Dim(-1), w.Dim(0))
	require.NoError(t, err)
	require.NoError(t, b.MatMul(y, x, w))
	return F32(y)
}

// TestStoredLayout: NewStoredLayout keeps a wide bf16 weight as stored on
// every path, and its product is the stored layout's kernel's, bit for
// bit.
func TestStoredLayout(t *testing.T) {
	b := NewStoredLayout(2)
	defer b.Close()
	require.Equal(t, "go-stored", b.Name())
	r := rand.New(rand.NewPCG(9, 10))
	const m, n, k = 3, kernel.KMajorMinN + 17, 96
	w, _ := bf16Weight(t, b, r, n, k)
	p, err := b.PrepareMatMul(w)
	require.NoError(t, err)
	require.Equal(t, w, p, "the weight stays as stored")
	x, err := b.Alloc(compute.F32, m, k)
	require.NoError(t, err)
	xs := F32(x)
	for i := range xs {
		xs[i] = float32(r.NormFloat64())
	}
	y, err := b.Alloc(compute.F32, m, n)
	require.NoError(t, err)
	require.NoError(t, b.MatMul(y, x, p))
	want := make([]float32, m*n)
	b.pool.MatMulBF16(want, xs, U16(w), m, n, k)
	require.Equal(t, want, F32(y))
}

// TestFastBF16Width: where the fast backend takes the bf16 dot product
// over the stored layout, a long product of at least fastMinN weight rows
// gets kernel.MatMulBF16Fast's bits and a narrower one the exact
// product's.
func TestFastBF16Width(t *testing.T) {
	b := NewFastBF16(2)
	defer b.Close()
	if !b.fastDot() || b.packing() != 0 {
		t.Skip("the fast backend does not take the bf16 dot product over the stored layout here")
	}
	r := rand.New(rand.NewPCG(11, 12))
	const m, k = kernel.PackedMinRows, 96
	for _, n := range []int{fastMinN - 1, fastMinN} {
		w, _ := bf16Weight(t, b, r, n, k)
		x, err := b.Alloc(compute.F32, m, k)
		require.NoError(t, err)
		for i := range F32(x) {
			F32(x)[i] = float32(r.NormFloat64())
		}
		y, err := b.Alloc(compute.F32, m, n)
		require.NoError(t, err)
		require.NoError(t, b.MatMul(y, x, w))
		exact, fast := make([]float32, m*n), make([]float32, m*n)
		b.pool.MatMulBF16(exact, F32(x), U16(w), m, n, k)
		b.pool.MatMulBF16Fast(fast, F32(x), U16(w), m, n, k)
		require.NotEqual(t, exact, fast, "n %d: the two products must differ for the test to tell them apart", n)
		want := exact
		if n >= fastMinN {
			want = fast
		}
		require.Equal(t, want, F32(y), "n %d", n)
	}
}

// TestHeadMatMulKMajor: HeadMatMul with bf16 head weights keeps the
// stored layout's products for calls of fewer than amxMinRows rows (bit
// for bit) and runs longer calls, where weights are laid out k-major and
// the heads are wide enough, on a k-major copy of each head (bit for bit
// that head's k-major product, each row as it would be alone); every
// result is within float32 summation error of the float64 product.
// TestHeadCopyFollowsWrites: a long HeadMatMul after new values were
// written into its weight uses them (the k-major copy made from the old
// ones is dropped), bit for bit what a weight holding them from the start
// gives.
func TestHeadCopyFollowsWrites(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(13, 14))
	const h, n, k, rows = 2, 64, 48, 40
	bf16s := func() []uint16 {
		v := make([]uint16, h*n*k)
		for i := range v {
			v[i] = floatx.BF16(float32(r.NormFloat64()))
		}
		return v
	}
	x := upload(b, normals(r, rows*h*k), rows, h, k)
	product := func(w compute.Tensor) []float32 {
		d := must(b.Alloc(compute.F32, rows, h, n))
		require.NoError(t, b.HeadMatMul(d, x, w))
		return slices.Clone(F32(d))
	}
	w := must(b.Alloc(compute.BF16, h, n, k))
	require.NoError(t, b.Write(w, bf16s()))
	product(w) // makes the copy where the backend lays weights out k-major
	next := bf16s()
	require.NoError(t, b.Write(w, next))
	fresh := must(b.Alloc(compute.BF16, h, n, k))
	require.NoError(t, b.Write(fresh, next))
	require.Equal(t, product(fresh), product(w))
}

func TestHeadMatMulKMajor(t *testing.T) {
	b := New(2)
	defer b.Close()
	r := rand.New(rand.NewPCG(11, 12))
	const h = 3
	for _, nk := range [][2]int{{256, 64}, {64, 256}, {40, 64}} {
		n, k := nk[0], nk[1]
		data := make([]byte, 2*h*n*k)
		wb := make([]uint16, h*n*k)
		for i := range wb {
			wb[i] = floatx.BF16(float32(r.NormFloat64()))
			data[2*i], data[2*i+1] = byte(wb[i]), byte(wb[i]>>8)
		}
		w, err := b.FromHost(compute.BF16, compute.BF16, data, h, n, k)
		require.NoError(t, err)
		copied := b.packing() == kMajor && kmajCopy(n)
		for _, rows := range []int{8, amxMinRows - 1, amxMinRows, 150} {
			xs := make([]float32, rows*h*k)
			for i := range xs {
				xs[i] = float32(r.NormFloat64())
			}
			x := upload(b, xs, rows, h, k)
			d := must(b.Alloc(compute.F32, rows, h, n))
			require.NoError(t, b.HeadMatMul(d, x, w))
			got := F32(d)
			name := fmt.Sprintf("[%d %d %d] weight, %d rows", h, n, k, rows)
			for hh := range h {
				wh := wb[hh*n*k : (hh+1)*n*k]
				xh := make([]float32, rows*k)
				for row := range rows {
					copy(xh[row*k:(row+1)*k], xs[(row*h+hh)*k:])
				}
				want := make([]float32, rows*n)
				if copied && rows >= amxMinRows {
					packed := make([]uint16, kernel.KMajorLen(n, k))
					kernel.PackKMajor(packed, wh, n, k)
					for row := range rows { // each row's bits alone
						kernel.MatMulKMajorSerial(want[row*n:(row+1)*n], xh[row*k:(row+1)*k], packed, 1, n, k)
					}
				} else {
					kernel.MatMulBF16Serial(want, xh, wh, rows, n, k)
				}
				checkHead(t, name, got, want, xh, wh, rows, h, hh, n, k)
			}
		}
		// A view of the last two heads (not the whole storage) keeps
		// the stored weight even in a long call.
		const rows = 40
		xs := make([]float32, rows*2*k)
		for i := range xs {
			xs[i] = float32(r.NormFloat64())
		}
		d := must(b.Alloc(compute.F32, rows, 2, n))
		require.NoError(t, b.HeadMatMul(d, upload(b, xs, rows, 2, k), w.Rows(1, 3)))
		for hh := range 2 {
			wh := wb[(hh+1)*n*k : (hh+2)*n*k]
			xh := make([]float32, rows*k)
			for row := range rows {
				copy(xh[row*k:(row+1)*k], xs[(row*2+hh)*k:])
			}
			want := make([]float32, rows*n)
			kernel.MatMulBF16Serial(want, xh, wh, rows, n, k)
			checkHead(t, fmt.Sprintf("[%d %d] heads 1-2 of [%d %d %d]", n, k, h, n, k), F32(d), want, xh, wh, rows, 2, hh, n, k)
		}
	}
}

// checkHead compares head hh of HeadMatMul's output got ([rows, h, n]) with
// want ([rows, n]) bit for bit and with the float64 product of xh and wh.
func checkHead(t *testing.T, name string, got, want, xh []float32, wh []uint16, rows, h, hh, n, k int) {
	t.Helper()
	for row := range rows {
		for c := range n {
			g := got[(row*h+hh)*n+c]
			require.Equal(t, math.Float32bits(want[row*n+c]), math.Float32bits(g), "%s: head %d row %d column %d", name, hh, row, c)
			var ref float64
			for i := range k {
				ref += float64(xh[row*k+i]) * float64(floatx.FromBF16(wh[c*k+i]))
			}
			require.InDelta(t, ref, float64(g), 1e-4*(1+math.Sqrt(float64(k))), "%s: against float64", name)
		}
	}
}
