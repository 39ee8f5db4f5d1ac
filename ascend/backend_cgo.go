//go:build ascend && cgo

package ascend

import (
	"fmt"
	"sync"
	"unsafe"

	"k3/ascend/internal/acl"
	"k3/compute"
)

// defaultArena is the device memory a backend takes when Options.ArenaBytes
// is zero.
const defaultArena = 1 << 30

// stageBytes is the size of the pinned buffer that host data passes
// through.
const stageBytes = 1 << 20

// Backend runs k3's operations on one NPU. Every operation is queued on
// one stream in call order, so operations need no synchronisation among
// themselves; Write, Read and FromHost wait for the stream. Device memory
// comes from one arena (fixed addresses). Operations not mapped to aclnn
// yet return an error wrapping compute.ErrUnsupported that names them.
type Backend struct {
	mu    sync.Mutex
	ctx   *acl.Context
	s     *acl.Stream
	base  acl.DevPtr
	arena *arena
	ws    *devBuf
	stage *acl.HostBuffer
	ones  map[int]compute.Tensor
}

// devBuf is a Tensor's storage: a span of the arena.
type devBuf struct {
	off, n int
	freed  bool
}

// streamSync is the fence of a span freed on the backend's stream: the
// stream itself, waited for whole.
type streamSync struct{ s *acl.Stream }

func (f streamSync) wait() error { return f.s.Sync() }

// newBackend opens device dev of lib with an arena of arenaBytes.
func newBackend(lib *acl.Lib, o Options) (_ *Backend, err error) {
	size := o.ArenaBytes
	if size == 0 {
		size = defaultArena
	}
	b := &Backend{ones: map[int]compute.Tensor{}}
	if b.ctx, err = lib.NewContext(o.Device); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			b.release()
		}
	}()
	if b.s, err = b.ctx.NewStream(); err != nil {
		return nil, err
	}
	if b.base, err = b.ctx.Malloc(size); err != nil {
		return nil, fmt.Errorf("ascend: the device arena of %d bytes (Options.ArenaBytes): %w", size, err)
	}
	b.arena = newArena(size)
	if b.stage, err = b.ctx.MallocHost(stageBytes); err != nil {
		return nil, err
	}
	return b, nil
}

// release frees what newBackend made, in reverse order.
func (b *Backend) release() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	if b.s != nil {
		keep(b.s.Sync())
	}
	if b.stage != nil {
		keep(b.stage.Free())
	}
	if !b.base.IsNil() {
		keep(b.ctx.Free(b.base))
		b.base = acl.DevPtr{}
	}
	if b.s != nil {
		keep(b.s.Destroy())
	}
	if b.ctx != nil {
		keep(b.ctx.Close())
	}
	return first
}

// Name implements compute.Backend.
func (b *Backend) Name() string { return "ascend" }

// Close waits for queued work and releases the device.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.release()
}

func (b *Backend) alloc(n int) (*devBuf, error) {
	off, err := b.arena.alloc(n, b.s)
	if err != nil {
		return nil, err
	}
	return &devBuf{off: off, n: n}, nil
}

func (b *Backend) freeBuf(d *devBuf) {
	if d.freed {
		return
	}
	d.freed = true
	b.arena.free(d.off, d.n, b.s, streamSync{b.s})
}

func bufOf(t compute.Tensor) (*devBuf, error) {
	d, ok := t.Mem.(*devBuf)
	if !ok || d.freed {
		return nil, fmt.Errorf("%w: %v is not a live tensor of the ascend backend", compute.ErrShape, t)
	}
	return d, nil
}

// addr is the device address of t's first element.
func (b *Backend) addr(t compute.Tensor) (acl.DevPtr, error) {
	d, err := bufOf(t)
	if err != nil {
		return acl.DevPtr{}, err
	}
	return b.base.Add(d.off + t.Off*t.DType.Size()), nil
}

func dims(t compute.Tensor) int {
	n := 1
	for _, d := range t.Dims[:t.Rank] {
		n *= d
	}
	return n
}

// Alloc implements compute.Backend: a span of the arena, zeroed on the
// device.
func (b *Backend) Alloc(dt compute.DType, shape ...int) (compute.Tensor, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.allocTensor(dt, shape...)
}

func (b *Backend) allocTensor(dt compute.DType, shape ...int) (compute.Tensor, error) {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return compute.Tensor{}, fmt.Errorf("%w: Alloc of shape %v", compute.ErrShape, shape)
		}
		n *= d
	}
	if dt.Size() == 0 || len(shape) > compute.MaxRank {
		return compute.Tensor{}, fmt.Errorf("%w: Alloc of %v%v", compute.ErrShape, dt, shape)
	}
	d, err := b.alloc(max(n*dt.Size(), 1))
	if err != nil {
		return compute.Tensor{}, err
	}
	if err := b.s.Memset(b.base.Add(d.off), 0, n*dt.Size()); err != nil {
		b.freeBuf(d)
		return compute.Tensor{}, err
	}
	return compute.NewTensor(d, 0, dt, shape...), nil
}

// FromHost implements compute.Backend: the data is converted on the host
// and copied to the device (never aliased).
func (b *Backend) FromHost(dt, src compute.DType, data []byte, shape ...int) (compute.Tensor, error) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	conv, err := hostBytes(dt, src, data, n)
	if err != nil {
		return compute.Tensor{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, err := b.allocTensor(dt, shape...)
	if err != nil {
		return compute.Tensor{}, err
	}
	p, _ := b.addr(t)
	if err := b.upload(p, conv); err != nil {
		b.freeBuf(t.Mem.(*devBuf))
		return compute.Tensor{}, err
	}
	return t, nil
}

// upload copies host bytes to p through the pinned stage, a chunk at a
// time; it returns when the copies have run.
func (b *Backend) upload(p acl.DevPtr, data []byte) error {
	stage := b.stage.Bytes()
	for off := 0; off < len(data); off += len(stage) {
		n := copy(stage, data[off:])
		if err := b.s.Upload(p.Add(off), b.stage, 0, n); err != nil {
			return err
		}
		if err := b.s.Sync(); err != nil {
			return err
		}
	}
	return nil
}

// download is upload's inverse.
func (b *Backend) download(data []byte, p acl.DevPtr) error {
	stage := b.stage.Bytes()
	for off := 0; off < len(data); off += len(stage) {
		n := min(len(stage), len(data)-off)
		if err := b.s.Download(b.stage, 0, p.Add(off), n); err != nil {
			return err
		}
		if err := b.s.Sync(); err != nil {
			return err
		}
		copy(data[off:off+n], stage)
	}
	return nil
}

// hostView returns the bytes of a []float32 or []int32 (or a pointer to
// one) and the dtype they hold.
func hostView(v any) ([]byte, compute.DType, error) {
	switch s := v.(type) {
	case *[]float32:
		return hostView(*s)
	case *[]int32:
		return hostView(*s)
	case []float32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s)), compute.F32, nil
	case []int32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s)), compute.I32, nil
	}
	return nil, 0, fmt.Errorf("%w: host values of type %T (want []float32 or []int32)", compute.ErrShape, v)
}

// Write implements compute.Backend.
func (b *Backend) Write(dst compute.Tensor, src any) error {
	data, dt, err := hostView(src)
	if err != nil {
		return err
	}
	if dt != dst.DType || len(data) != dims(dst)*4 {
		return fmt.Errorf("%w: Write of %d %v values into %v", compute.ErrShape, len(data)/4, dt, dst)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	p, err := b.addr(dst)
	if err != nil {
		return err
	}
	return b.upload(p, data)
}

// Read implements compute.Backend.
func (b *Backend) Read(dst any, src compute.Tensor) error {
	data, dt, err := hostView(dst)
	if err != nil {
		return err
	}
	if dt != src.DType || len(data) != dims(src)*4 {
		return fmt.Errorf("%w: Read of %v into %d %v values", compute.ErrShape, src, len(data)/4, dt)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	p, err := b.addr(src)
	if err != nil {
		return err
	}
	return b.download(data, p)
}

// Free implements compute.Backend. The span returns to the arena ordered
// after the work already queued; freeing a buffer twice (or through a
// view of it) is a no-op.
func (b *Backend) Free(t compute.Tensor) {
	d, ok := t.Mem.(*devBuf)
	if !ok {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.freeBuf(d)
}

// Copy implements compute.Backend.
func (b *Backend) Copy(dst, src compute.Tensor) error {
	if dst.DType != src.DType || dims(dst) != dims(src) {
		return fmt.Errorf("%w: Copy of %v into %v", compute.ErrShape, src, dst)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	pd, err := b.addr(dst)
	if err != nil {
		return err
	}
	ps, err := b.addr(src)
	if err != nil {
		return err
	}
	n := dims(src) * src.DType.Size()
	if (dst.Off*dst.DType.Size())%64 == 0 && (src.Off*src.DType.Size())%64 == 0 {
		return b.s.CopyDevice(pd, ps, n)
	}
	// Asynchronous device copies need 64-byte aligned addresses; views at
	// other offsets go through the host until a copy operator is mapped.
	tmp := make([]byte, n)
	if err := b.download(tmp, ps); err != nil {
		return err
	}
	return b.upload(pd, tmp)
}

// aclType maps a seam dtype to aclDataType.
func aclType(dt compute.DType) acl.DataType {
	switch dt {
	case compute.F32:
		return acl.Float
	case compute.BF16:
		return acl.BF16
	case compute.F16:
		return acl.Float16
	case compute.I32:
		return acl.Int32
	}
	return -1
}

// desc describes t to aclnn as the given view. The data address is the
// buffer's start (aclnn wants it 32-byte aligned) and the view's offset
// goes in the descriptor, over a storage of the whole buffer.
func (b *Backend) desc(t compute.Tensor, view, strides []int64) (*acl.Tensor, error) {
	d, err := bufOf(t)
	if err != nil {
		return nil, err
	}
	return b.ctx.NewTensor(acl.TensorDesc{
		DType:       aclType(t.DType),
		Format:      acl.FormatND,
		Dims:        view,
		Strides:     strides,
		Offset:      int64(t.Off),
		StorageDims: []int64{int64(d.n / t.DType.Size())},
		Data:        b.base.Add(d.off),
	})
}

// launch runs a prepared operator on the stream with the shared
// workspace, growing it first if needed.
func (b *Backend) launch(op *acl.Op) error {
	var ws acl.DevPtr
	if op.WorkspaceSize > 0 {
		if b.ws == nil || b.ws.n < op.WorkspaceSize {
			if b.ws != nil {
				b.freeBuf(b.ws) // the stream is in order: the next op may reuse it
			}
			grown := op.WorkspaceSize
			if b.ws != nil {
				grown = max(grown, 2*b.ws.n)
			}
			d, err := b.alloc(grown)
			if err != nil {
				return err
			}
			b.ws = d
		}
		ws = b.base.Add(b.ws.off)
	}
	return op.Launch(b.s, ws)
}

func destroy(ts ...*acl.Tensor) {
	for _, t := range ts {
		if t != nil {
			t.Destroy()
		}
	}
}

// MatMul implements compute.Backend with aclnnMatmul: w [N, K] is passed
// as its transpose [K, N] through strides.
func (b *Backend) MatMul(dst, x, w compute.Tensor) error {
	if w.Rank != 2 || x.Rank == 0 || dst.Rank == 0 {
		return fmt.Errorf("%w: MatMul %v · %vᵀ -> %v", compute.ErrShape, x, w, dst)
	}
	N, K := w.Dims[0], w.Dims[1]
	M := dims(x) / max(K, 1)
	if x.DType != compute.F32 || dst.DType != compute.F32 || (w.DType != compute.F32 && w.DType != compute.BF16) ||
		x.Dim(-1) != K || dst.Dim(-1) != N || dims(dst) != M*N {
		return fmt.Errorf("%w: MatMul %v · %vᵀ -> %v", compute.ErrShape, x, w, dst)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	tx, err := b.desc(x, []int64{int64(M), int64(K)}, nil)
	if err != nil {
		return err
	}
	tw, err := b.desc(w, []int64{int64(K), int64(N)}, []int64{1, int64(K)})
	if err != nil {
		destroy(tx)
		return err
	}
	to, err := b.desc(dst, []int64{int64(M), int64(N)}, nil)
	if err != nil {
		destroy(tx, tw)
		return err
	}
	defer destroy(tx, tw, to)
	op, err := b.ctx.Matmul(tx, tw, to, 0)
	if err != nil {
		return err
	}
	return b.launch(op)
}

// RMSNorm implements compute.Backend with aclnnRmsNorm; the reciprocal
// roots it also returns go to a scratch span.
func (b *Backend) RMSNorm(dst, x, w compute.Tensor, eps float32) error {
	if x.Rank == 0 || x.DType != compute.F32 || dst.DType != compute.F32 || dims(dst) != dims(x) {
		return fmt.Errorf("%w: RMSNorm %v -> %v", compute.ErrShape, x, dst)
	}
	D := x.Dim(-1)
	rows := dims(x) / max(D, 1)
	if !w.IsZero() && (w.DType != compute.F32 || dims(w) != D) {
		return fmt.Errorf("%w: RMSNorm weight %v for rows of %d", compute.ErrShape, w, D)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.IsZero() {
		var err error
		if w, err = b.onesOf(D); err != nil {
			return err
		}
	}
	rstd, err := b.allocTensor(compute.F32, rows)
	if err != nil {
		return err
	}
	defer b.freeBuf(rstd.Mem.(*devBuf))
	view := []int64{int64(rows), int64(D)}
	var ts [4]*acl.Tensor
	defer func() { destroy(ts[:]...) }()
	for i, c := range []struct {
		t    compute.Tensor
		view []int64
	}{{x, view}, {w, []int64{int64(D)}}, {dst, view}, {rstd, []int64{int64(rows), 1}}} {
		if ts[i], err = b.desc(c.t, c.view, nil); err != nil {
			return err
		}
	}
	op, err := b.ctx.RMSNorm(ts[0], ts[1], float64(eps), ts[2], ts[3])
	if err != nil {
		return err
	}
	return b.launch(op)
}

// onesOf is a cached vector of D ones: RMSNorm without a weight.
func (b *Backend) onesOf(D int) (compute.Tensor, error) {
	if t, ok := b.ones[D]; ok {
		return t, nil
	}
	t, err := b.allocTensor(compute.F32, D)
	if err != nil {
		return t, err
	}
	ones := make([]float32, D)
	for i := range ones {
		ones[i] = 1
	}
	p, _ := b.addr(t)
	data, _, _ := hostView(ones)
	if err := b.upload(p, data); err != nil {
		return t, err
	}
	b.ones[D] = t
	return t, nil
}

func unmapped(op string) error {
	return fmt.Errorf("%w: ascend: %s is not mapped to aclnn yet (docs/ASCEND.md)", compute.ErrUnsupported, op)
}

// The operations below are not mapped yet.

func (b *Backend) HeadMatMul(dst, x, w compute.Tensor) error { return unmapped("HeadMatMul") }
func (b *Backend) LayerNorm(dst, x, w, bias compute.Tensor, eps float32) error {
	return unmapped("LayerNorm")
}
func (b *Backend) Unary(op compute.UnaryOp, dst, x compute.Tensor) error { return unmapped("Unary") }
func (b *Backend) Binary(op compute.BinaryOp, dst, x, y compute.Tensor) error {
	return unmapped("Binary")
}
func (b *Backend) GatedAct(act compute.Activation, dst, gate, up compute.Tensor) error {
	return unmapped("GatedAct")
}
func (b *Backend) RoPE(a *compute.RopeArgs) error                 { return unmapped("RoPE") }
func (b *Backend) Embedding(dst, table, ids compute.Tensor) error { return unmapped("Embedding") }
func (b *Backend) KDAChunk(a *compute.KDAArgs) error              { return unmapped("KDAChunk") }
func (b *Backend) KDAStep(a *compute.KDAStepArgs) error           { return unmapped("KDAStep") }
func (b *Backend) CausalConv(a *compute.ConvArgs) error           { return unmapped("CausalConv") }
func (b *Backend) LightningIndexer(a *compute.IndexerArgs) error  { return unmapped("LightningIndexer") }
func (b *Backend) Attention(a *compute.AttnArgs) error            { return unmapped("Attention") }
func (b *Backend) AttnResPrepare(a *compute.AttnResPrepareArgs) error {
	return unmapped("AttnResPrepare")
}
func (b *Backend) AttnResUpdate(a *compute.AttnResUpdateArgs) error { return unmapped("AttnResUpdate") }
func (b *Backend) MoERoute(a *compute.RouteArgs) error              { return unmapped("MoERoute") }
func (b *Backend) MoEExperts(a *compute.ExpertArgs) error           { return unmapped("MoEExperts") }

var _ compute.Backend = (*Backend)(nil)
