// Package cpu is the pure-Go compute backend: the executable specification
// of every operation in the compute seam, and the backend k3 uses when no
// device is chosen. It needs no cgo. Kernels run on a fixed worker pool;
// weights may stay bfloat16 and are widened in registers.
package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"k3/compute"
	"k3/internal/floatx"
	"k3/internal/kernel"
)

// buffer is the storage behind a tensor: exactly one slice is set.
type buffer struct {
	f32 []float32
	u16 []uint16
	i32 []int32
	// packed is a bf16 weight PrepareMatMul laid out for the products
	// (k-major panels or AMX tiles, as packing says), of shape [packN,
	// packK].
	packed       []uint16
	packing      packing
	packN, packK int
	// tiles is set on a narrow bf16 weight kept in u16 whose long
	// products run on the AMX tiles (PrepareMatMul).
	tiles *tileCopy
	// heads is a per-head weight's k-major copy (headCopyOf), kept with
	// the weight.
	heads *headCopy
	// taps holds the transposed taps of the conv weights stored here
	// (convTaps), one entry per weight view. Write drops them and heads.
	taps []convTaps
	// gateUp is set on a narrow expert's w1 and w3 that PrepareExperts
	// laid out as one weight; up marks w3's.
	gateUp *gateUp
	up     bool
	// aliased is set when the storage is the caller's bytes (FromHost
	// without a copy, such as a mapped checkpoint): Write refuses it.
	aliased bool
}

// Backend is the pure-Go backend.
type Backend struct {
	pool *kernel.Pool

	tapsMu   sync.Mutex // guards the buffers' conv taps (convTaps) and head copies (headCopyOf)
	fastBF16 bool       // NewFastBF16
	bf16Idx  bool       // NewFastBF16Indexer
	stored   bool       // NewStoredLayout
	host     hostRefs   // tensors over the caller's bytes (ReadsHost)
}

var _ compute.Backend = (*Backend)(nil)

// New returns a backend running kernels on threads goroutines (0: GOMAXPROCS).
func New(threads int) *Backend { return &Backend{pool: kernel.NewPool(threads)} }

// NewFastBF16 is New with the fast bf16 products: where the CPU runs its
// bf16 dot product faster than the exact products' FMAs
// (kernel.FastBF16Pays) and has no AMX tiles, bf16 weights are laid out
// pair-interleaved (PrepareMatMul) and every product of them, decode
// included, rounds x to bfloat16 and runs kernel.MatMulKPairs on it; a
// row's result still does not depend on the other rows. It trades accuracy
// (about 2^-9 relative per element of x) for up to twice the exact
// products' rate. Where the CPU lacks the bf16 dot product or it does not
// pay, the products stay exact, except where the CPU runs the AMX tiles
// (kernel.AMXAvailable): there the long ones (prefill) round x to bf16 on
// the tiles and decode stays exact.
func NewFastBF16(threads int) *Backend {
	b := New(threads)
	b.fastBF16 = true
	return b
}

// NewFastBF16Indexer is NewFastBF16 that also runs DSA's two scorings in
// bf16 where the fast products take the bf16 dot product
// (kernel.FastBF16Pays): the Lightning Indexer where a decode row takes
// the bf16 rows tile (index heads and dimensions multiples of 16,
// kernel.IndexerRowsBF16Fast; kernel.IndexerRowsBF16,
// kernel.IndexerBlockBF16), and index-sparse attention's logits and
// values where 32 heads a kv head fill the logits tile
// (kernel.AttnLogitsBF16, kernel.MatAccumulatePairs; the softmax's
// maxima, rescales and sums stay float32, dense attention exact). Queries,
// keys, weights and values are rounded to bf16 as they are used; the
// caches stay float32. Near-tied keys may be picked otherwise than
// exactly, as with FP8 or bf16 indexers, and attention outputs move by
// bf16's rounding; a row's results still do not depend on the other rows
// of the call.
func NewFastBF16Indexer(threads int) *Backend {
	b := NewFastBF16(threads)
	b.bf16Idx = true
	return b
}

// NewStoredLayout is New with every weight kept in its stored layout
// (PrepareMatMul lays nothing out anew), so that every bf16 product runs
// the dot-form tiles or the packed GEMM, as on a CPU without the k-major
// tiles. It exists so that a benchmark can run both layouts side by side
// in one process (modelbench's TestProfileLayouts), where the machine's
// drift hits both alike.
func NewStoredLayout(threads int) *Backend {
	b := New(threads)
	b.stored = true
	return b
}

// Name returns "go", "go-fastbf16" for NewFastBF16, or "go-stored" for
// NewStoredLayout.
func (b *Backend) Name() string {
	switch {
	case b.fastBF16:
		return "go-fastbf16"
	case b.stored:
		return "go-stored"
	}
	return "go"
}

// fastDot reports whether the backend's long bf16-weight products round x
// to bf16 on the CPU's bf16 dot product: made so, and that pays here.
func (b *Backend) fastDot() bool { return b.fastBF16 && kernel.FastBF16Pays() }

// roundsX reports whether the backend's product of m rows on the AMX
// tiles rounds x to bf16: the fast backend's products of
// kernel.PackedMinRows rows or more (prefill chunks).
func (b *Backend) roundsX(m int) bool { return b.fastBF16 && m >= kernel.PackedMinRows }

// fastMinN is the fewest weight rows (output columns) a product of the
// fast backend takes the fast bf16 product for: below it the rounding of
// x and the tiles' rereads of x cost more than VDPBF16PS gains (at 256
// rows by k 768 on Zen 4, the fast product ran 0.95x the exact one at 384
// weight rows and 1.11x at 512; docs/bench), and the product stays exact.
const fastMinN = 512

// matMulBF16 is the bf16-weight product, fast where fastDot and the
// product is long and wide enough.
func (b *Backend) matMulBF16(dst, x []float32, w []uint16, m, n, k int) {
	if b.fastDot() && m >= kernel.PackedMinRows && n >= fastMinN {
		b.pool.MatMulBF16Fast(dst, x, w, m, n, k)
		return
	}
	b.pool.MatMulBF16(dst, x, w, m, n, k)
}

// Close stops the worker pool.
func (b *Backend) Close() error { b.pool.Close(); return nil }

// Pool exposes the worker pool to the layer packages' CPU kernels.
func (b *Backend) Pool() *kernel.Pool { return b.pool }

func shapeErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", compute.ErrShape, fmt.Sprintf(format, args...))
}

// Alloc returns a zeroed tensor.
func (b *Backend) Alloc(dt compute.DType, dims ...int) (compute.Tensor, error) {
	n := 1
	for _, d := range dims {
		if d < 0 {
			return compute.Tensor{}, shapeErr("negative dimension in %v", dims)
		}
		n *= d
	}
	if len(dims) > compute.MaxRank {
		return compute.Tensor{}, shapeErr("rank %d above %d", len(dims), compute.MaxRank)
	}
	buf := &buffer{}
	switch dt {
	case compute.F32:
		buf.f32 = make([]float32, n)
	case compute.BF16, compute.F16:
		buf.u16 = make([]uint16, n)
	case compute.I32:
		buf.i32 = make([]int32, n)
	default:
		return compute.Tensor{}, fmt.Errorf("cpu: alloc %v: %w", dt, compute.ErrUnsupported)
	}
	return compute.NewTensor(buf, 0, dt, dims...), nil
}

func aligned(p []byte, n uintptr) bool {
	return len(p) == 0 || uintptr(unsafe.Pointer(&p[0]))%n == 0
}

// FromHost makes a read-only tensor from host bytes. Same-dtype data that is
// suitably aligned is aliased, not copied (little-endian hosts only).
func (b *Backend) FromHost(dt, src compute.DType, data []byte, dims ...int) (compute.Tensor, error) {
	n := 1
	for _, d := range dims {
		n *= d
	}
	if src.Size() == 0 || len(data) != n*src.Size() {
		return compute.Tensor{}, shapeErr("%d bytes of %v for shape %v", len(data), src, dims)
	}
	buf := &buffer{}
	switch {
	case dt == compute.F32 && src == compute.F32:
		if aligned(data, 4) && n > 0 {
			buf.f32, buf.aliased = unsafe.Slice((*float32)(unsafe.Pointer(&data[0])), n), true
		} else {
			buf.f32 = make([]float32, n)
			for i := range buf.f32 {
				buf.f32[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
			}
		}
	case dt == compute.I32 && src == compute.I32:
		if aligned(data, 4) && n > 0 {
			buf.i32, buf.aliased = unsafe.Slice((*int32)(unsafe.Pointer(&data[0])), n), true
		} else {
			buf.i32 = make([]int32, n)
			for i := range buf.i32 {
				buf.i32[i] = int32(binary.LittleEndian.Uint32(data[4*i:]))
			}
		}
	case dt == src && (dt == compute.BF16 || dt == compute.F16):
		if aligned(data, 2) && n > 0 {
			buf.u16, buf.aliased = unsafe.Slice((*uint16)(unsafe.Pointer(&data[0])), n), true
		} else {
			buf.u16 = make([]uint16, n)
			for i := range buf.u16 {
				buf.u16[i] = binary.LittleEndian.Uint16(data[2*i:])
			}
		}
	case dt == compute.F32 && (src == compute.BF16 || src == compute.F16):
		buf.f32 = make([]float32, n)
		for i := range buf.f32 {
			h := binary.LittleEndian.Uint16(data[2*i:])
			if src == compute.BF16 {
				buf.f32[i] = floatx.FromBF16(h)
			} else {
				buf.f32[i] = floatx.FromF16(h)
			}
		}
	case dt == compute.BF16 && src == compute.F32:
		buf.u16 = make([]uint16, n)
		for i := range buf.u16 {
			buf.u16[i] = floatx.BF16(math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:])))
		}
	default:
		return compute.Tensor{}, fmt.Errorf("cpu: %v from %v: %w", dt, src, compute.ErrUnsupported)
	}
	if buf.aliased {
		b.host.add(buf, data)
	}
	return compute.NewTensor(buf, 0, dt, dims...), nil
}

// Free drops the backend's reference; the garbage collector reclaims memory.
func (b *Backend) Free(t compute.Tensor) {}

// F32 returns the float32 elements of t (a view of its storage).
func F32(t compute.Tensor) []float32 {
	buf, ok := t.Mem.(*buffer)
	if !ok || buf.f32 == nil {
		return nil
	}
	return buf.f32[t.Off : t.Off+t.Len()]
}

// U16 returns the 16-bit elements of a BF16 or F16 tensor.
func U16(t compute.Tensor) []uint16 {
	buf, ok := t.Mem.(*buffer)
	if !ok || buf.u16 == nil {
		return nil
	}
	return buf.u16[t.Off : t.Off+t.Len()]
}

// I32 returns the int32 elements of t.
func I32(t compute.Tensor) []int32 {
	buf, ok := t.Mem.(*buffer)
	if !ok || buf.i32 == nil {
		return nil
	}
	return buf.i32[t.Off : t.Off+t.Len()]
}

func f32Of(name string, t compute.Tensor) ([]float32, error) {
	if t.DType != compute.F32 {
		return nil, shapeErr("%s is %v, want f32", name, t)
	}
	v := F32(t)
	if v == nil {
		return nil, fmt.Errorf("cpu: %s is not a tensor of this backend", name)
	}
	return v, nil
}

// Write copies host values into dst: []float32 into F32, or into BF16
// and F16 rounded to nearest even; []int32 into I32; []uint16 (raw bits)
// into BF16 and F16.
func (b *Backend) Write(dst compute.Tensor, src any) error {
	buf, ok := dst.Mem.(*buffer)
	switch {
	case !ok:
		return fmt.Errorf("cpu: write into %v: not a tensor of this backend", dst)
	case buf.aliased:
		return fmt.Errorf("cpu: write into %v: its storage is the caller's bytes (FromHost), read only here: %w", dst, compute.ErrUnsupported)
	case buf.packed != nil || buf.tiles != nil:
		return shapeErr("write into %v: a prepared matmul weight", dst)
	}
	if buf.taps != nil || buf.heads != nil {
		// What was made from the old values: the conv taps transposed,
		// the heads' k-major copy.
		b.tapsMu.Lock()
		buf.taps, buf.heads = nil, nil
		b.tapsMu.Unlock()
	}
	switch s := src.(type) {
	case []float32:
		return writeF32(dst, s)
	case *[]float32:
		return writeF32(dst, *s)
	case []int32:
		return writeI32(dst, s)
	case *[]int32:
		return writeI32(dst, *s)
	case []uint16:
		return writeU16(dst, s)
	case *[]uint16:
		return writeU16(dst, *s)
	}
	return shapeErr("write from %T (want []float32, []int32 or []uint16)", src)
}

func writeF32(dst compute.Tensor, s []float32) error {
	if len(s) != dst.Len() {
		return shapeErr("writing %d values into %v", len(s), dst)
	}
	switch dst.DType {
	case compute.F32:
		copy(F32(dst), s)
	case compute.BF16:
		d := U16(dst)
		for i, v := range s {
			d[i] = floatx.BF16(v)
		}
	case compute.F16:
		d := U16(dst)
		for i, v := range s {
			d[i] = floatx.F16(v)
		}
	default:
		return shapeErr("writing float32s into %v", dst)
	}
	return nil
}

func writeI32(dst compute.Tensor, s []int32) error {
	d := I32(dst)
	if dst.DType != compute.I32 || d == nil || len(s) != len(d) {
		return shapeErr("writing %d int32s into %v", len(s), dst)
	}
	copy(d, s)
	return nil
}

func writeU16(dst compute.Tensor, s []uint16) error {
	d := U16(dst)
	if (dst.DType != compute.BF16 && dst.DType != compute.F16) || d == nil || len(s) != len(d) {
		return shapeErr("writing %d 16-bit values into %v", len(s), dst)
	}
	copy(d, s)
	return nil
}

// Read copies src to host memory: F32, BF16 and F16 into []float32; I32
// into []int32; BF16 and F16 into []uint16 (raw bits).
func (b *Backend) Read(dst any, src compute.Tensor) error {
	switch d := dst.(type) {
	case []float32:
		return readF32(d, src)
	case *[]float32:
		return readF32(*d, src)
	case []int32:
		return readI32(d, src)
	case *[]int32:
		return readI32(*d, src)
	case []uint16:
		return readU16(d, src)
	case *[]uint16:
		return readU16(*d, src)
	}
	return shapeErr("read into %T (want []float32, []int32 or []uint16)", dst)
}

func readF32(d []float32, src compute.Tensor) error {
	if len(d) != src.Len() {
		return shapeErr("reading %v into %d values", src, len(d))
	}
	switch src.DType {
	case compute.F32:
		copy(d, F32(src))
	case compute.BF16:
		w, err := bf16Bits(src)
		if err != nil {
			return err
		}
		floatx.BF16ToF32(d, w)
	case compute.F16:
		floatx.F16ToF32(d, U16(src))
	default:
		return shapeErr("reading %v as float32", src)
	}
	return nil
}

func readU16(d []uint16, src compute.Tensor) error {
	if len(d) != src.Len() || (src.DType != compute.BF16 && src.DType != compute.F16) {
		return shapeErr("reading %v into %d 16-bit values", src, len(d))
	}
	if src.DType == compute.F16 {
		copy(d, U16(src))
		return nil
	}
	w, err := bf16Bits(src)
	copy(d, w)
	return err
}

// bf16Bits returns a bf16 tensor's values in row-major order: its storage,
// or a prepared weight's unpacked into a new slice.
func bf16Bits(src compute.Tensor) ([]uint16, error) {
	if p, up := gateUpOf(src); p != nil {
		if err := checkHalf(src, p); err != nil {
			return nil, err
		}
		return halfBits(p, up), nil
	}
	wp, how, err := packedOf(src)
	if wp == nil || err != nil {
		return U16(src), err
	}
	w := make([]uint16, src.Len())
	switch how {
	case amxTiles:
		kernel.UnpackAMX(w, wp, src.Dims[0], src.Dims[1])
	case kPairs:
		kernel.UnpackKPairs(w, wp, src.Dims[0], src.Dims[1])
	default:
		kernel.UnpackKMajor(w, wp, src.Dims[0], src.Dims[1])
	}
	return w, nil
}

func readI32(d []int32, src compute.Tensor) error {
	s := I32(src)
	if s == nil || len(d) != len(s) {
		return shapeErr("reading %v into %d int32s", src, len(d))
	}
	copy(d, s)
	return nil
}
