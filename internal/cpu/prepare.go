package cpu

import (
	"sync"

	"k3/compute"
	"k3/internal/kernel"
)

var _ compute.WeightPreparer = (*Backend)(nil)

// PrepareMatMul implements compute.WeightPreparer. A bf16 weight [N, K]
// is copied into the layout of the products that serve every product of
// it, whatever its row count, so that a row's result is the same alone, in
// a decode batch, in a scheduler's pass or in a prefill chunk:
//   - AMX tiles (kernel.PackAMX) where the CPU has AMX-BF16, K3_KERNEL=amx
//     asks for them (kernel.AMXPreferred) and w is at least amxMinK deep:
//     the activations split into three bf16 parts, products on the matrix
//     engine;
//   - on the fast-bf16 backend where its bf16 dot product pays and the
//     AMX tiles do not run, pair-interleaved panels (kernel.PackKPairs,
//     k even): x rounded to bf16, one VDPBF16PS chain per output;
//   - else k-major panels (kernel.PackKMajor) where the CPU runs the
//     512-bit k-major tiles (kernel.KMajorFast): one FMA chain per output.
//
// Narrower weights (kernel.KMajorMinN), other dtypes and other CPUs keep
// w.
//
// Where the CPU runs the AMX tiles (kernel.AMXAvailable) and a weight is
// at least amxMinK deep, its products of amxMinRows rows or more (prefill
// chunks, never a decode batch or a pass of at most compute.InvariantRows
// rows) run on the tiles with the tiles' bits (longOnTiles): a k-major
// weight through kernel.MatMulKMajorAMX, which repacks it a slab at a
// time, and a narrower weight of at least amxMinN rows, which keeps w,
// through a tile copy (tileCopy). The fast backend's products of
// kernel.PackedMinRows rows or more take the tiles' one-part product
// there (x rounded to bf16). On the fast backend's pair-interleaved path a
// narrower weight of at least pairsMinN rows and even k keeps w for its
// products of fewer than amxMinRows rows (the dot-form tiles, x exact) and
// runs the longer ones on a pair-interleaved copy (tileCopy), x rounded.
// Where weights are laid out k-major and a narrow one's long products do
// not take the tiles, they run on a k-major copy (kmajCopy), one FMA
// chain per output as the wide weights' products.
//
// A weight laid out anew keeps w's shape and answers Read; it is not a
// view other operations can read (F32 and U16 return nil for it).
func (b *Backend) PrepareMatMul(w compute.Tensor) (compute.Tensor, error) {
	how := b.packing()
	if how == 0 || w.DType != compute.BF16 || w.Rank != 2 {
		return w, nil
	}
	src := U16(w)
	if src == nil {
		return w, nil
	}
	n, k := w.Dims[0], w.Dims[1]
	if n < kernel.KMajorMinN {
		buf := w.Mem.(*buffer)
		whole := w.Off == 0 && len(buf.u16) == n*k
		switch {
		case longOnTiles(how, k) && n >= amxMinN && whole:
			buf.tiles = &tileCopy{n: n, k: k, form: amxTiles}
		case how == kPairs && n >= pairsMinN && k%2 == 0 && whole:
			buf.tiles = &tileCopy{n: n, k: k, form: kPairs}
		case how == kMajor && kmajCopy(n) && whole:
			buf.tiles = &tileCopy{n: n, k: k, form: kMajor}
		}
		return w, nil
	}
	if how == amxTiles && k < amxMinK && kernel.KMajorFast() {
		how = kMajor
	}
	if how == kPairs && k%2 != 0 {
		return w, nil
	}
	buf := &buffer{packing: how, packN: n, packK: k}
	switch how {
	case amxTiles:
		buf.packed = make([]uint16, kernel.AMXLen(n, k))
		b.pool.PackAMX(buf.packed, src, n, k)
	case kPairs:
		buf.packed = make([]uint16, kernel.KPairLen(n, k))
		b.pool.PackKPairs(buf.packed, src, n, k)
	default:
		buf.packed = make([]uint16, kernel.KMajorLen(n, k))
		b.pool.PackKMajor(buf.packed, src, n, k)
	}
	b.Free(w)
	return compute.NewTensor(buf, 0, compute.BF16, n, k), nil
}

// amxMinK is the depth from which a weight takes the AMX tiles where they
// are preferred: with fewer than four k-blocks of 32 the split and the tile
// loads outweigh the tile products, and the k-major product is faster (the
// 100M preset's 64-deep products, experts' w2 among them: 169 against 240
// GFLOP/s; docs/bench). The layout is per weight, so each laid-out
// weight's products keep one arithmetic whatever their row count.
const amxMinK = 128

// amxMinRows is the fewest rows of a product that runs on the AMX tiles
// whatever the weight's layout: more than compute.InvariantRows, which no
// exact pass exceeds, so only prefill chunks' products get the tiles' bits
// and the invariance contracts hold as with k-major weights. From 33 rows
// the tiles, repacking k-major weights, run 1.2-1.5x the k-major product
// (docs/bench).
const amxMinRows = compute.InvariantRows + 1

// longOnTiles reports whether the long products (amxMinRows rows or more)
// of a weight k deep laid out as how run on the AMX tiles: where
// the CPU runs them (kernel.AMXAvailable), for weights in AMX form or
// k-major (repacked a slab at a time, kernel.MatMulKMajorAMX) and narrow
// weights beside either (a tile copy), at least amxMinK deep.
func longOnTiles(how packing, k int) bool {
	return kernel.AMXAvailable() && (how == amxTiles || how == kMajor) && k >= amxMinK
}

// amxMinN is the fewest rows of a narrow weight whose long products take
// a tile copy: a pair of tile panels. Under it the padding to 32 columns
// outweighs the tiles (docs/bench).
const amxMinN = 2 * kernel.AMXPanel

// pairsMinN is the fewest rows of a narrow weight whose long products
// take a pair-interleaved copy on the fast backend: a panel's width.
const pairsMinN = kernel.KMajorPanel

// kmajCopy reports whether a narrow weight of n rows takes a k-major copy
// for its long products where weights are laid out k-major and its
// products stay on FMAs: where the copy's last panel runs on the edge
// tiles (n a multiple of 16) or its padding is under a third of the
// copy. Those products run 1.1-2.3x the dot-form tiles at 40 and 256
// rows from 16 weight rows up (docs/bench); the six to eight rows of a
// gate or an indexer's weights would be mostly padding.
func kmajCopy(n int) bool {
	return n >= 16 && (n%16 == 0 || n >= 2*kernel.KMajorPanel)
}

// tileCopy is the AMX form, the pair-interleaved form or the k-major form
// (form) of a narrow weight kept in its stored layout, made by the
// weight's first product of amxMinRows rows or more: only prefill
// products are that long, so weights read only by decode or by
// MoEExperts (the experts' products stay on the stored layout) never
// take the memory.
type tileCopy struct {
	once   sync.Once
	n, k   int
	form   packing
	packed []uint16
}

// tilesFor returns the tile copy of w, making it on first use, or nil when
// w has none or is a view of another shape.
func tilesFor(w compute.Tensor) []uint16 {
	buf, ok := w.Mem.(*buffer)
	if !ok || buf.tiles == nil {
		return nil
	}
	tc := buf.tiles
	if w.Off != 0 || w.Rank != 2 || w.Dims[0] != tc.n || w.Dims[1] != tc.k {
		return nil
	}
	tc.once.Do(func() {
		switch tc.form {
		case kPairs:
			tc.packed = make([]uint16, kernel.KPairLen(tc.n, tc.k))
			kernel.PackKPairs(tc.packed, buf.u16, tc.n, tc.k)
		case kMajor:
			tc.packed = make([]uint16, kernel.KMajorLen(tc.n, tc.k))
			kernel.PackKMajor(tc.packed, buf.u16, tc.n, tc.k)
		default:
			tc.packed = make([]uint16, kernel.AMXLen(tc.n, tc.k))
			kernel.PackAMX(tc.packed, buf.u16, tc.n, tc.k)
		}
	})
	return tc.packed
}

// copyForm returns the form of w's tile copy (0 for none).
func copyForm(w compute.Tensor) packing {
	buf, ok := w.Mem.(*buffer)
	if !ok || buf.tiles == nil {
		return 0
	}
	return buf.tiles.form
}

// packing is a prepared weight's layout.
type packing uint8

const (
	kMajor   packing = iota + 1 // kernel.PackKMajor
	amxTiles                    // kernel.PackAMX
	kPairs                      // kernel.PackKPairs (the fast backend)
)

// packing returns the layout PrepareMatMul gives bf16 weights here, or 0
// where they keep the stored one.
func (b *Backend) packing() packing {
	switch {
	case b.stored:
		return 0
	case kernel.AMXPreferred():
		return amxTiles
	case b.fastDot() && !kernel.AMXAvailable():
		// VDPBF16PS reads k pairs side by side; where the AMX tiles
		// run, their one-part product is several times faster.
		return kPairs
	case kernel.KMajorFast():
		return kMajor
	}
	return 0
}

// packedOf returns the packed form of a weight PrepareMatMul laid out and
// its layout (nil for any other tensor), and an error for a view of one
// with another shape or offset, which no product can read.
func packedOf(w compute.Tensor) ([]uint16, packing, error) {
	buf, ok := w.Mem.(*buffer)
	if !ok || buf.packed == nil {
		return nil, 0, nil
	}
	if w.Off != 0 || w.Rank != 2 || w.Dims[0] != buf.packN || w.Dims[1] != buf.packK {
		return nil, 0, shapeErr("matmul weight %v is a view of a prepared [%d %d] weight", w, buf.packN, buf.packK)
	}
	return buf.packed, buf.packing, nil
}
