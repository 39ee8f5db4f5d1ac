package cpu

import (
	"sync"

	"k3/compute"
	"k3/internal/kernel"
)

var _ compute.ExpertPreparer = (*Backend)(nil)

// gateUp is a narrow expert's w1 and w3 laid out as one k-major weight
// [w1; w3] (PrepareExperts): rows [0, n) are w1's, [n, 2n) w3's. The
// buffers of both tensors point at it; buffer.up says which half a
// tensor is.
type gateUp struct {
	packed []uint16 // kernel.PackKMajor of [w1; w3], [2n, k]
	n, k   int
}

// gateUpMinI is the fewest rows of w1 (and w3) that PrepareExperts lays
// out as one weight: a panel, so that the pair fills at least two panels
// whole (128 rows: three panels, 144 columns read for 128).
const gateUpMinI = kernel.KMajorPanel

// PrepareExperts implements compute.ExpertPreparer. Where the backend
// lays bf16 weights out k-major and the AMX tiles do not run, each
// expert whose w1 and w3 kept the stored layout (narrower than
// kernel.KMajorMinN) and are at least gateUpMinI rows has them laid out
// as one k-major weight [w1; w3], so that MoEExperts runs its gate and
// up products as one: the pair's 2I columns fill the 48-column panels
// where I columns alone waste much of the last one, and each x row is
// read once for both. The entries of w1 and w3 are replaced by tensors of
// the same shapes over the pair, which still answer MatMul and Read as
// the weights they were. Experts that do not qualify keep their weights;
// only lists of different lengths are refused.
func (b *Backend) PrepareExperts(w1, w3, w2 []compute.Tensor) error {
	if len(w1) != len(w3) || len(w1) != len(w2) {
		return shapeErr("experts: %d w1, %d w3, %d w2 tensors", len(w1), len(w3), len(w2))
	}
	if b.packing() != kMajor || kernel.AMXAvailable() {
		return nil
	}
	for e := range w1 {
		g, u := w1[e], w3[e]
		gs, us := storedBF16(g), storedBF16(u)
		if gs == nil || us == nil || g.Dims != u.Dims {
			continue
		}
		n, k := g.Dims[0], g.Dims[1]
		if n < gateUpMinI || n >= kernel.KMajorMinN {
			continue
		}
		both := make([]uint16, 2*n*k)
		copy(both, gs)
		copy(both[n*k:], us)
		pair := &gateUp{packed: make([]uint16, kernel.KMajorLen(2*n, k)), n: n, k: k}
		b.pool.PackKMajor(pair.packed, both, 2*n, k)
		w1[e] = compute.NewTensor(&buffer{gateUp: pair}, 0, compute.BF16, n, k)
		w3[e] = compute.NewTensor(&buffer{gateUp: pair, up: true}, 0, compute.BF16, n, k)
	}
	return nil
}

// storedBF16 returns the values of a whole bf16 matrix kept in the stored
// layout (no packing, no tile copy but a k-major one, which the pair
// replaces), or nil.
func storedBF16(w compute.Tensor) []uint16 {
	buf, ok := w.Mem.(*buffer)
	if !ok || w.DType != compute.BF16 || w.Rank != 2 || w.Off != 0 || buf.packed != nil || buf.gateUp != nil ||
		buf.tiles != nil && buf.tiles.form != kMajor {
		return nil
	}
	if len(buf.u16) != w.Dims[0]*w.Dims[1] {
		return nil
	}
	return buf.u16
}

// gateUpOf returns the pair w is a half of, and whether it is w3's.
func gateUpOf(w compute.Tensor) (*gateUp, bool) {
	buf, ok := w.Mem.(*buffer)
	if !ok || buf.gateUp == nil {
		return nil, false
	}
	return buf.gateUp, buf.up
}

// gateUpPair returns the pair w1 and w3 are the halves of, or nil.
func gateUpPair(w1, w3 compute.Tensor) *gateUp {
	g, up1 := gateUpOf(w1)
	u, up3 := gateUpOf(w3)
	if g == nil || g != u || up1 || !up3 {
		return nil
	}
	return g
}

// halfScratch is the pair products' whole outputs for halfMatMul.
var halfScratch = sync.Pool{New: func() any { return new([]float32) }}

// halfMatMul computes dst[m, n] = x · wᵀ for w a half of a pair: the
// pair's product (on pool, or on the calling goroutine with pool nil)
// into scratch, then the half's columns. MoEExperts runs the pair whole;
// this serves the other readers of an expert's weight.
func halfMatMul(pool *kernel.Pool, dst, x []float32, p *gateUp, up bool, m int) {
	s := halfScratch.Get().(*[]float32)
	defer halfScratch.Put(s)
	*s = grow(*s, m*2*p.n)
	whole := *s
	if pool == nil {
		kernel.MatMulKMajorSerial(whole, x, p.packed, m, 2*p.n, p.k)
	} else {
		pool.MatMulKMajor(whole, x, p.packed, m, 2*p.n, p.k)
	}
	c0 := 0
	if up {
		c0 = p.n
	}
	for r := range m {
		copy(dst[r*p.n:(r+1)*p.n], whole[r*2*p.n+c0:r*2*p.n+c0+p.n])
	}
}

// halfBits returns the rows of the pair that w is.
func halfBits(p *gateUp, up bool) []uint16 {
	both := make([]uint16, 2*p.n*p.k)
	kernel.UnpackKMajor(both, p.packed, 2*p.n, p.k)
	if up {
		return both[p.n*p.k:]
	}
	return both[:p.n*p.k]
}

// checkHalf refuses a view of a pair's half: only the whole half is a
// weight.
func checkHalf(w compute.Tensor, p *gateUp) error {
	if w.Off != 0 || w.Rank != 2 || w.Dims[0] != p.n || w.Dims[1] != p.k {
		return shapeErr("matmul weight %v is a view of an expert's [%d %d] weight", w, p.n, p.k)
	}
	return nil
}
