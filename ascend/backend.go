package ascend

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"k3/ascend/internal/acl"
	"k3/ascend/internal/nz"
	"k3/compute"
	"k3/internal/floatx"
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
// comes from one arena (fixed addresses). Side streams (Side, Fork,
// Join) are views of the backend over streams of their own. Operations
// not mapped to aclnn return an error wrapping compute.ErrUnsupported
// that names them.
type Backend struct {
	*core
	s  stream  // this view's stream
	ws *devBuf // this view's operator workspace
	// side is 0 for the backend itself and i for side stream i, whose
	// Fork and Join record fork and join.
	side       int
	fork, join event
	// captured is set while a side stream has joined the running capture
	// (Fork during Capture) and has not returned to it (Join).
	captured bool
}

// core is what a backend and its side streams share.
type core struct {
	mu      sync.Mutex
	drv     driver
	base    acl.DevPtr
	arena   *arena
	stage   hostBuffer
	consts  map[constKey]compute.Tensor
	ropes   map[ropeKey]*ropeTab // RoPE's tables of angles by position
	ar      compute.Tensor       // 0, 1, 2, ... (iota)
	scalars map[float32]scalar
	// host is the pure-Go backend of a backend over the host driver; with
	// Options.HostFallback (hostOps) it runs the operations not mapped to
	// aclnn (onHost) over the same memory.
	host    compute.Backend
	hostOps bool
	// fallback, on a device opened with Options.HostFallback, runs the
	// unmapped operations on the host over copies (onHost).
	fallback compute.Backend
	wraps    map[wrapKey]compute.Tensor // host twins of buffers, dropped when freed
	// capture, while a Capture runs, collects the spans freed meanwhile:
	// the captured work uses them on every replay.
	capture *Graph
	// captureTID is the thread a running capture is locked to; work from
	// any other thread waits on captureEnd until the capture ends, since
	// the capture would record it.
	captureTID int
	captureEnd sync.Cond
	main       *Backend
	sides      map[int]*Backend
	execs      execCache
	ints       intConsts
	ring       stageRing
	waits      int64 // times the host waited for a stream (Waits)
	// launched counts the operators launched outside captures (Launches).
	launched int64
	// fuse is the fused DSA operators taken (Options.FusedAttention);
	// fusedIndexer, fusedAttention and mirrors count their calls and the
	// bf16 mirrors made (FusedCalls).
	fuse                                  fusedOps
	fusedIndexer, fusedAttention, mirrors int64
}

// devBuf is a Tensor's storage: a span of the arena.
type devBuf struct {
	off, n int
	freed  bool
	// nz is set for a matmul weight stored in FRACTAL_NZ
	// (PrepareMatMul): the layout of its transpose [K, N], Batch of them
	// in a stack of experts.
	nz *nz.Layout
	// experts is the number of experts' weights stacked in the buffer
	// (PrepareExperts), 0 for any other buffer.
	experts int
	// mirror is the bf16 copy of a float32 buffer the fused DSA
	// operators read (fused.go).
	mirror *devBuf
}

// streamSync is the fence of a span freed on the backend's stream: the
// stream itself, waited for whole.
type streamSync struct{ s stream }

func (f streamSync) wait() error { return f.s.Sync() }

// newBackend makes a backend over drv with an arena of o.ArenaBytes; it
// closes drv if it fails.
func newBackend(drv driver, o Options) (_ *Backend, err error) {
	size := o.ArenaBytes
	if size == 0 {
		size = defaultArena
	}
	b := &Backend{core: &core{drv: drv, consts: map[constKey]compute.Tensor{}}}
	b.main = b
	defer func() {
		if err != nil {
			b.release()
		}
	}()
	if b.s, err = drv.newStream(); err != nil {
		return nil, err
	}
	if b.base, err = drv.malloc(size); err != nil {
		return nil, fmt.Errorf("ascend: the device arena of %d bytes (Options.ArenaBytes): %w", size, err)
	}
	b.arena = newArena(size)
	if b.stage, err = drv.mallocHost(stageBytes); err != nil {
		return nil, err
	}
	if o.FusedAttention {
		b.fuse = fusedOps{indexer: drv.hasOperator("aclnnLightningIndexer"), attention: drv.hasOperator("aclnnSparseFlashAttention")}
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
	for _, sd := range b.sides {
		keep(sd.s.Sync())
		keep(sd.s.Destroy())
		keep(sd.fork.Destroy())
		keep(sd.join.Destroy())
	}
	b.sides = nil
	b.dropExecs()
	keep(b.freeRing())
	for _, sc := range b.scalars {
		keep(sc.Destroy())
	}
	if b.stage != nil {
		keep(b.stage.Free())
	}
	if !b.base.IsNil() {
		keep(b.drv.free(b.base))
		b.base = acl.DevPtr{}
	}
	if b.s != nil {
		keep(b.s.Destroy())
	}
	if b.drv != nil {
		keep(b.drv.close())
	}
	if b.host != nil {
		keep(b.host.Close())
	}
	if b.fallback != nil {
		keep(b.fallback.Close())
	}
	return first
}

// Graph is backend work captured once and replayed: a decode step of
// static shapes, whose inputs are written into the same tensors before
// each replay.
type Graph struct {
	b    *Backend
	g    graph
	keep []*devBuf // spans the captured work uses, freed with the graph
	// events are the fork and join events of the side streams inside the
	// capture, the graph's own: a replay's records must not complete the
	// events of eager Forks and Joins queued around it.
	events []event
}

// Capture records the operations fn runs on the backend into a graph
// instead of running them. The backend must not be used by anything else
// meanwhile. Operations that wait for the stream (Write, Read, FromHost)
// fail with ErrCapturing inside fn. Every replay reads and writes the
// tensors fn used, at their addresses; buffers fn frees stay allocated
// until the graph is closed. Side streams take part through Fork and Join
// (compute.Streams), as ACL's cross-stream capture does: a side stream's
// work between them is captured into the same graph.
func (b *Backend) Capture(fn func() error) (compute.Graph, error) {
	// Everything fn issues runs on this thread; what other goroutines
	// issue meanwhile waits (lock), or the graph would hold it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.lock()
	if b.capture != nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: a capture is already running", ErrInvalidArgument)
	}
	gr := &Graph{b: b}
	b.capture, b.captureTID = gr, threadID()
	b.mu.Unlock()
	g, err := b.s.capture(fn)
	b.lock()
	defer b.mu.Unlock()
	b.capture = nil
	b.captureEnd.Broadcast()
	for _, sd := range b.sides {
		sd.captured = false
	}
	if err != nil {
		gr.release()
		return nil, err
	}
	gr.g = g
	return gr, nil
}

// lock takes the backend's lock. While a capture runs, a caller on
// another thread than the capture's waits for it to end: the capture
// would record its work into the graph (a session written by one
// goroutine while another's decode step is captured).
func (c *core) lock() {
	c.mu.Lock()
	if c.capture == nil {
		return
	}
	if c.captureEnd.L == nil {
		c.captureEnd.L = &c.mu
	}
	for c.capture != nil && c.captureTID != threadID() {
		c.captureEnd.Wait()
	}
}

// Replay queues the captured work; the next Read waits for it.
func (g *Graph) Replay() error {
	g.b.lock()
	defer g.b.mu.Unlock()
	if g.g == nil {
		return fmt.Errorf("%w: replay of a closed graph", ErrInvalidArgument)
	}
	return g.g.replay(g.b.s)
}

// Bytes implements compute.Graph: the arena spans the graph keeps.
func (g *Graph) Bytes() int64 {
	g.b.lock()
	defer g.b.mu.Unlock()
	var n int64
	for _, d := range g.keep {
		n += int64(d.n)
	}
	return n
}

// Close destroys the graph and frees the buffers it kept, after queued
// replays.
func (g *Graph) Close() error {
	g.b.lock()
	defer g.b.mu.Unlock()
	var err error
	if g.g != nil {
		err = g.g.Destroy()
		g.g = nil
	}
	g.release()
	return err
}

func (g *Graph) release() {
	for _, d := range g.keep {
		g.b.arena.free(d.off, d.n, g.b.s, streamSync{g.b.s})
	}
	g.keep = nil
	for _, e := range g.events {
		e.Destroy()
	}
	g.events = nil
}

// Name implements compute.Backend: "ascend", or "ascend-host" over the
// host driver.
func (b *Backend) Name() string {
	if b.host != nil {
		return "ascend-host"
	}
	return "ascend"
}

// Close waits for queued work and releases the device.
func (b *Backend) Close() error {
	if b.side != 0 {
		return nil // a side stream is closed with its backend
	}
	b.lock()
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
	if d.mirror != nil {
		b.freeBuf(d.mirror)
	}
	for _, dt := range []compute.DType{compute.F32, compute.BF16, compute.F16, compute.I32} {
		delete(b.wraps, wrapKey{d, dt})
	}
	if b.capture != nil {
		b.capture.keep = append(b.capture.keep, d)
		return
	}
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
	if d.nz != nil {
		return acl.DevPtr{}, errNZ(t)
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
	b.lock()
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
	b.lock()
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

// ReadsHost implements compute.HostReader: FromHost has copied the bytes
// to the device before it returns, so no tensor reads host bytes, and a
// loader releases a mapped checkpoint's pages once the model is on the
// device.
func (b *Backend) ReadsHost([]byte) bool { return false }

var _ compute.HostReader = (*Backend)(nil)

// ErrCapturing is returned by the operations that wait for the stream
// (Write, Read, FromHost, unaligned Copy) while a Capture runs.
var ErrCapturing = errors.New("ascend: the operation waits for the stream, which a capture forbids")

// upload copies host bytes to p through the pinned stage, a chunk at a
// time; it returns when the copies have run.
func (b *Backend) upload(p acl.DevPtr, data []byte) error {
	if b.capture != nil {
		return ErrCapturing
	}
	stage := b.stage.Bytes()
	for off := 0; off < len(data); off += len(stage) {
		n := copy(stage, data[off:])
		if err := b.s.upload(p.Add(off), b.stage, 0, n); err != nil {
			return err
		}
		b.waits++
		if err := b.s.Sync(); err != nil {
			return err
		}
		b.synced(b.s)
	}
	return nil
}

// download is upload's inverse.
func (b *Backend) download(data []byte, p acl.DevPtr) error {
	if b.capture != nil {
		return ErrCapturing
	}
	stage := b.stage.Bytes()
	for off := 0; off < len(data); off += len(stage) {
		n := min(len(stage), len(data)-off)
		if err := b.s.download(b.stage, 0, p.Add(off), n); err != nil {
			return err
		}
		b.waits++
		if err := b.s.Sync(); err != nil {
			return err
		}
		b.synced(b.s)
		copy(data[off:off+n], stage)
	}
	return nil
}

// hostView returns the bytes of a []float32, []int32 or []uint16 (or a
// pointer to one) and the dtypes they may fill as they are: F32, I32, or
// BF16 and F16 (raw bits).
func hostView(v any) ([]byte, []compute.DType, error) {
	switch s := v.(type) {
	case *[]float32:
		return hostView(*s)
	case *[]int32:
		return hostView(*s)
	case *[]uint16:
		return hostView(*s)
	case []float32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s)), f32Only, nil
	case []int32:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 4*len(s)), i32Only, nil
	case []uint16:
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), 2*len(s)), halves, nil
	}
	return nil, nil, fmt.Errorf("%w: host values of type %T (want []float32, []int32 or []uint16)", compute.ErrShape, v)
}

var (
	f32Only = []compute.DType{compute.F32}
	i32Only = []compute.DType{compute.I32}
	halves  = []compute.DType{compute.BF16, compute.F16}
)

// Write implements compute.Backend: []float32 into F32, or into BF16 and
// F16 rounded to nearest even on the host; []int32 into I32; []uint16
// (raw bits) into BF16 and F16. The values are copied before it returns
// and reach the tensor in stream order, up to 64 KiB without a wait
// (putAsync), larger ones with one.
func (b *Backend) Write(dst compute.Tensor, src any) error {
	data, dts, err := hostView(src)
	if err != nil {
		return err
	}
	if f, ok := src.([]float32); ok && slices.Contains(halves, dst.DType) {
		src, dts, data = narrow(f, dst.DType), halves, data[:2*len(f)]
	} else if p, ok := src.(*[]float32); ok && slices.Contains(halves, dst.DType) {
		src, dts, data = narrow(*p, dst.DType), halves, data[:2*len(*p)]
	}
	if !slices.Contains(dts, dst.DType) || len(data) != dims(dst)*dst.DType.Size() {
		return fmt.Errorf("%w: Write of %T (%d bytes) into %v", compute.ErrShape, src, len(data), dst)
	}
	b.lock()
	defer b.mu.Unlock()
	// Through the stage ring: a small write (a pass's token ids, a run's
	// positions) is queued on the stream without a wait, ordered after the
	// work that read the tensor before.
	if err := b.putAsync(dst, src); err != nil {
		return err
	}
	return b.mirrorWrite(dst)
}

// narrow rounds float32 values to dt (BF16 or F16) bits.
func narrow(v []float32, dt compute.DType) []uint16 {
	h := make([]uint16, len(v))
	for i, f := range v {
		if dt == compute.BF16 {
			h[i] = floatx.BF16(f)
		} else {
			h[i] = floatx.F16(f)
		}
	}
	return h
}

// put copies host values (a []float32, []int32 or []uint16, or a pointer
// to one) to t's elements from its first as they are and waits for the
// copy; b.mu is held.
func (b *Backend) put(t compute.Tensor, src any) error {
	data, _, err := hostView(src)
	if err != nil {
		return err
	}
	p, err := b.addr(t)
	if err != nil {
		return err
	}
	return b.upload(p, data)
}

// get is put's inverse.
func (b *Backend) get(dst any, t compute.Tensor) error {
	data, _, err := hostView(dst)
	if err != nil {
		return err
	}
	p, err := b.addr(t)
	if err != nil {
		return err
	}
	return b.download(data, p)
}

// Read implements compute.Backend: F32, BF16 and F16 into []float32
// (widened on the host); I32 into []int32; BF16 and F16 into []uint16
// (raw bits). A weight prepared in FRACTAL_NZ reads in row-major order.
func (b *Backend) Read(dst any, src compute.Tensor) error {
	data, dts, err := hostView(dst)
	if err != nil {
		return err
	}
	var wide []float32 // a []float32 destination of a 16-bit tensor
	if f, ok := dst.([]float32); ok && slices.Contains(halves, src.DType) {
		wide, dts, data = f, halves, data[:2*len(f)]
	} else if p, ok := dst.(*[]float32); ok && slices.Contains(halves, src.DType) {
		wide, dts, data = *p, halves, data[:2*len(*p)]
	}
	if !slices.Contains(dts, src.DType) || len(data) != dims(src)*src.DType.Size() {
		return fmt.Errorf("%w: Read of %v into %T (%d bytes)", compute.ErrShape, src, dst, len(data))
	}
	b.lock()
	defer b.mu.Unlock()
	var bits []uint16 // the 16-bit values a []float32 destination widens
	if wide != nil {
		bits = make([]uint16, len(wide))
		dst, data = bits, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(bits))), 2*len(bits))
	}
	if d, _ := bufOf(src); d != nil && d.nz != nil {
		err = b.readNZ(data, src, d)
	} else {
		err = b.get(dst, src)
	}
	if err != nil || wide == nil {
		return err
	}
	if src.DType == compute.BF16 {
		floatx.BF16ToF32(wide, bits)
	} else {
		floatx.F16ToF32(wide, bits)
	}
	return nil
}

// readNZ copies the row-major bytes of src, a view of the FRACTAL_NZ
// weight (or stack of them) d, into data; b.mu is held.
func (b *Backend) readNZ(data []byte, src compute.Tensor, d *devBuf) error {
	storage := make([]byte, d.n)
	if err := b.download(storage, b.base.Add(d.off)); err != nil {
		return err
	}
	rows, err := unpackNZ(d.nz, storage)
	if err != nil {
		return err
	}
	off := 2 * src.Off
	if off+len(data) > len(rows) {
		return fmt.Errorf("%w: Read of %v past its FRACTAL_NZ weight", compute.ErrShape, src)
	}
	copy(data, rows[off:])
	return nil
}

// Free implements compute.Backend. The span returns to the arena ordered
// after the work already queued; freeing a buffer twice (or through a
// view of it) is a no-op.
func (b *Backend) Free(t compute.Tensor) {
	d, ok := t.Mem.(*devBuf)
	if !ok {
		return
	}
	b.lock()
	defer b.mu.Unlock()
	b.freeBuf(d)
}

// Copy implements compute.Backend.
func (b *Backend) Copy(dst, src compute.Tensor) error {
	if dst.DType != src.DType || dims(dst) != dims(src) {
		return fmt.Errorf("%w: Copy of %v into %v", compute.ErrShape, src, dst)
	}
	b.lock()
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
		if err := b.s.CopyDevice(pd, ps, n); err != nil {
			return err
		}
		return b.mirrorWrite(dst)
	}
	// Asynchronous device copies need 64-byte aligned addresses; a view
	// at another offset (a cache row appended at any position) is copied
	// by aclnnInplaceCopy, queued like any operator and so captured too.
	flat := []int64{int64(dims(src))}
	if err := b.runAs("aclnnInplaceCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) },
		operand{t: dst, view: flat}, operand{t: src, view: flat}); err != nil {
		return err
	}
	return b.mirrorWrite(dst)
}

// ScatterRows implements compute.Backend: aclnnInplaceIndexCopy along
// the first dimension, the indices read on the device (an index out of
// range is the device's fault, not checked on the host).
func (b *Backend) ScatterRows(dst, idx, src compute.Tensor) error {
	if dst.Rank == 0 || src.Rank == 0 || dst.DType != src.DType || idx.DType != compute.I32 || dims(idx) != src.Dims[0] ||
		dims(dst)/max(dst.Dims[0], 1) != dims(src)/max(src.Dims[0], 1) {
		return fmt.Errorf("%w: scatter rows of %v by %v into %v", compute.ErrShape, src, idx, dst)
	}
	w := dims(src) / max(src.Dims[0], 1)
	b.lock()
	defer b.mu.Unlock()
	if err := b.runAs("aclnnInplaceIndexCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.indexCopy(ts[0], 0, ts[1], ts[2]) },
		operand{t: dst, view: i64(dst.Dims[0], w)}, operand{t: idx, view: i64(src.Dims[0])}, operand{t: src, view: i64(src.Dims[0], w)}); err != nil {
		return err
	}
	return b.mirrorScatter(dst, idx, src, w)
}

// Fill implements compute.Backend: zero is a memset, other values
// aclnnInplaceFillScalar (f32 and bf16 tensors; others are not mapped).
func (b *Backend) Fill(dst compute.Tensor, v float32) error {
	if v != 0 && dst.DType != compute.F32 && dst.DType != compute.BF16 {
		type args struct{ Dst compute.Tensor }
		return b.onHost("Fill", &args{dst}, func(c compute.Backend, a any) error { return c.Fill(a.(*args).Dst, v) })
	}
	b.lock()
	defer b.mu.Unlock()
	p, err := b.addr(dst)
	if err != nil {
		return err
	}
	if v == 0 {
		if err := b.s.Memset(p, 0, dims(dst)*dst.DType.Size()); err != nil {
			return err
		}
		return b.mirrorWrite(dst)
	}
	sc, err := b.scalar(v)
	if err != nil {
		return err
	}
	if err := b.runAs("aclnnInplaceFillScalar "+attr(v), func(ts []tensorDesc) (prepared, error) { return b.drv.fill(ts[0], sc) },
		operand{t: dst, view: []int64{int64(dims(dst))}}); err != nil {
		return err
	}
	return b.mirrorWrite(dst)
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
func (b *Backend) desc(t compute.Tensor, view, strides []int64) (tensorDesc, error) {
	d, err := bufOf(t)
	if err != nil {
		return nil, err
	}
	if d.nz != nil {
		return nil, errNZ(t)
	}
	return b.drv.newTensor(acl.TensorDesc{
		DType:       aclType(t.DType),
		Format:      acl.FormatND,
		Dims:        view,
		Strides:     strides,
		Offset:      int64(t.Off),
		StorageDims: []int64{int64(d.n / t.DType.Size())},
		Data:        b.base.Add(d.off),
	})
}

// desc64 is desc for int64 data stored in an I32 tensor.
func (b *Backend) desc64(t compute.Tensor, view, strides []int64) (tensorDesc, error) {
	d, err := bufOf(t)
	if err != nil {
		return nil, err
	}
	if d.nz != nil {
		return nil, errNZ(t)
	}
	return b.drv.newTensor(acl.TensorDesc{
		DType: acl.Int64, Format: acl.FormatND, Dims: view, Strides: strides, Offset: int64(t.Off),
		StorageDims: []int64{int64(d.n / 8)}, Data: b.base.Add(d.off),
	})
}

// launch runs a prepared operator on the stream with the shared
// workspace, growing it first if needed (during a capture, with its own).
func (b *Backend) launch(op prepared) error {
	if b.capture != nil && b.capture.b != b && !b.captured {
		return fmt.Errorf("%w: an operation on a side stream that has not joined the capture (Fork) or has returned (Join)", ErrCapturing)
	}
	var ws acl.DevPtr
	if op.workspace() > 0 && b.capture != nil {
		// A captured operator owns its workspace: the shared one may be
		// regrown and reused between replays.
		d, err := b.alloc(op.workspace())
		if err != nil {
			return err
		}
		b.freeBuf(d) // kept by the graph
		ws = b.base.Add(d.off)
	} else if op.workspace() > 0 {
		if b.ws == nil || b.ws.n < op.workspace() {
			if b.ws != nil {
				b.freeBuf(b.ws) // the stream is in order: the next op may reuse it
			}
			grown := op.workspace()
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
	if b.capture == nil {
		b.launched++
	}
	return op.launch(b.s, ws)
}

func destroy(ts ...tensorDesc) {
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
	b.lock()
	defer b.mu.Unlock()
	return b.matmul(dst, x, w)
}

// matmul is MatMul on checked operands; b.mu is held. A weight prepared
// in FRACTAL_NZ is passed as its NZ descriptor.
func (b *Backend) matmul(dst, x, w compute.Tensor) error {
	N, K := w.Dims[0], w.Dims[1]
	mm := func(ts []tensorDesc) (prepared, error) { return b.drv.matmul("aclnnMatmul", ts[0], ts[1], ts[2], 0) }
	if d, ok := w.Mem.(*devBuf); ok && d.nz != nil && !d.freed {
		return b.runAs("aclnnMatmul", mm, flat(x, K), operand{t: w, nz: true}, flat(dst, N))
	}
	return b.runAs("aclnnMatmul", mm,
		flat(x, K), operand{t: w, view: i64(K, N), strides: i64(1, K)}, flat(dst, N))
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
	b.lock()
	defer b.mu.Unlock()
	if w.IsZero() {
		var err error
		if w, err = b.constOf(D, 1); err != nil {
			return err
		}
	}
	rstd, err := b.allocTensor(compute.F32, rows)
	if err != nil {
		return err
	}
	defer b.freeBuf(rstd.Mem.(*devBuf))
	return b.runAs("aclnnRmsNorm "+attr(eps), func(ts []tensorDesc) (prepared, error) {
		return b.drv.rmsNorm(ts[0], ts[1], float64(eps), ts[2], ts[3])
	},
		flat(x, D), operand{t: w, view: []int64{int64(D)}}, flat(dst, D), flat(rstd, 1))
}

// constKey names a cached constant vector.
type constKey struct {
	n int
	v float32
}

// constOf is a cached vector of n copies of v (RMSNorm's weight of ones,
// or of 1/√D for an L2 norm): a view of n elements of a constant sized by
// the next power of two, so that callers whose n follows the cache length
// make one constant per doubling, not an upload and a buffer per length.
func (b *Backend) constOf(n int, v float32) (compute.Tensor, error) {
	size := 1 << bits.Len(uint(max(n, 1)-1))
	if t, ok := b.consts[constKey{size, v}]; ok {
		return part(t, 0, n), nil
	}
	t, err := b.allocTensor(compute.F32, size)
	if err != nil {
		return t, err
	}
	vs := make([]float32, size)
	for i := range vs {
		vs[i] = v
	}
	if err := b.put(t, vs); err != nil {
		return t, err
	}
	b.consts[constKey{size, v}] = t
	return part(t, 0, n), nil
}

func unmapped(op string) error {
	return fmt.Errorf("%w: ascend: %s is not mapped to aclnn yet (docs/ASCEND.md)", compute.ErrUnsupported, op)
}

// run prepares an operator with prepare and launches it; the
// descriptors of ts are destroyed afterwards (aclnn has copied them).
func (b *Backend) run(prepare func(ts []tensorDesc) (prepared, error), operands ...operand) error {
	ts, err := b.describe(operands)
	if err != nil {
		return err
	}
	defer destroy(ts...)
	op, err := prepare(ts)
	if err != nil {
		return err
	}
	return b.launch(op)
}

// describe makes the descriptors of operands; on failure it destroys
// those it made.
func (b *Backend) describe(operands []operand) ([]tensorDesc, error) {
	ts := make([]tensorDesc, len(operands))
	for i, o := range operands {
		var err error
		if ts[i], err = b.descOf(o); err != nil {
			destroy(ts...)
			return nil, err
		}
	}
	return ts, nil
}

// operand is a tensor as one operator sees it.
type operand struct {
	t             compute.Tensor
	view, strides []int64
	// i64 reads the storage as int64 (aclnnTopk's indices), which the
	// seam has no dtype for: t is then an I32 tensor of twice the
	// elements, and t.Off counts int64 elements.
	i64 bool
	// nz is a matmul weight in FRACTAL_NZ, described whole (descNZ).
	nz bool
	// stack is expert 0 of a stack of experts' weights [N, K], described
	// as aclnnGroupedMatmulV4's weight [E, K, N] (descStack).
	stack bool
}

// descOf describes o.
func (b *Backend) descOf(o operand) (tensorDesc, error) {
	switch {
	case o.nz:
		return b.descNZ(o.t)
	case o.stack:
		return b.descStack(o.t)
	case o.i64:
		return b.desc64(o.t, o.view, o.strides)
	}
	return b.desc(o.t, o.view, o.strides)
}

// flat is t as a contiguous [rows, cols] matrix.
func flat(t compute.Tensor, cols int) operand {
	return operand{t: t, view: []int64{int64(dims(t) / max(cols, 1)), int64(cols)}}
}

// scalar returns a cached Float scalar.
func (b *Backend) scalar(v float32) (scalar, error) {
	if s, ok := b.scalars[v]; ok {
		return s, nil
	}
	s, err := b.drv.newScalar(v)
	if err != nil {
		return nil, err
	}
	if b.scalars == nil {
		b.scalars = map[float32]scalar{}
	}
	b.scalars[v] = s
	return s, nil
}

// Unary implements compute.Backend with aclnnSilu, aclnnSigmoid, aclnnExp
// and aclnnSoftplus (beta 1, threshold 20: above it softplus(x) and x
// differ by under 1e-8 relative).
func (b *Backend) Unary(op compute.UnaryOp, dst, x compute.Tensor) error {
	if x.DType != compute.F32 || dst.DType != compute.F32 || dims(dst) != dims(x) || x.Rank == 0 {
		return fmt.Errorf("%w: Unary %v -> %v", compute.ErrShape, x, dst)
	}
	b.lock()
	defer b.mu.Unlock()
	D := x.Dim(-1)
	switch op {
	case compute.SiLU, compute.Sigmoid, compute.Exp:
		name := map[compute.UnaryOp]string{compute.SiLU: "aclnnSilu", compute.Sigmoid: "aclnnSigmoid", compute.Exp: "aclnnExp"}[op]
		return b.runAs(name, func(ts []tensorDesc) (prepared, error) { return b.drv.unary(name, ts[0], ts[1]) }, flat(x, D), flat(dst, D))
	case compute.Softplus:
		return b.softplus(flat(x, D), flat(dst, D))
	}
	return fmt.Errorf("ascend: unary op %d: %w", op, compute.ErrUnsupported)
}

// units are the scalars 1 and -1 (Add's alpha for a sum and a
// difference).
// Operator helpers for the compositions, over operands and without a
// cached executor (b.run); b.mu is held.

func (b *Backend) opUnary(name string, x, out operand) error {
	return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.unary(name, ts[0], ts[1]) }, x, out)
}

func (b *Backend) opBinary(name string, x, y, out operand) error {
	return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.binary(name, ts[0], ts[1], ts[2]) }, x, y, out)
}

// opAdd is out = x + alpha·y.
func (b *Backend) opAdd(x, y, out operand, alpha float32) error {
	al, err := b.scalar(alpha)
	if err != nil {
		return err
	}
	return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], al, ts[2]) }, x, y, out)
}

func (b *Backend) opMuls(x operand, v float32, out operand) error {
	s, err := b.scalar(v)
	if err != nil {
		return err
	}
	return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.muls(ts[0], s, ts[1]) }, x, out)
}

func (b *Backend) opCast(x operand, dt compute.DType, out operand) error {
	return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.cast(ts[0], aclType(dt), ts[1]) }, x, out)
}

func (b *Backend) units() (one, minus scalar, err error) {
	if one, err = b.scalar(1); err != nil {
		return nil, nil, err
	}
	minus, err = b.scalar(-1)
	return one, minus, err
}

// softplus is aclnnSoftplus with beta 1 and threshold 20.
func (b *Backend) softplus(x, out operand) error {
	beta, err := b.scalar(1)
	if err != nil {
		return err
	}
	threshold, err := b.scalar(20)
	if err != nil {
		return err
	}
	return b.runAs("aclnnSoftplus 1 20", func(ts []tensorDesc) (prepared, error) { return b.drv.softplus(ts[0], beta, threshold, ts[1]) }, x, out)
}

// Binary implements compute.Backend with aclnnAdd (alpha 1, or -1 for
// Sub), aclnnMul, aclnnMaximum and aclnnDiv; a one-row b broadcasts over
// a's rows and a column [T, 1] over each row, by aclnn's broadcasting.
func (b *Backend) Binary(op compute.BinaryOp, dst, x, y compute.Tensor) error {
	column := compute.IsColumn(x, y)
	if x.Rank == 0 || x.DType != compute.F32 || y.DType != compute.F32 || dst.DType != compute.F32 || dims(dst) != dims(x) ||
		(dims(y) != dims(x) && dims(y) != x.Dim(-1) && !column) {
		return fmt.Errorf("%w: Binary a %v, b %v, dst %v", compute.ErrShape, x, y, dst)
	}
	b.lock()
	defer b.mu.Unlock()
	D := x.Dim(-1)
	ob := flat(y, D)
	if column {
		ob = flat(y, 1)
	}
	add := func(alpha float32) error {
		al, err := b.scalar(alpha)
		if err != nil {
			return err
		}
		return b.runAs("aclnnAdd "+attr(alpha), func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], al, ts[2]) },
			flat(x, D), ob, flat(dst, D))
	}
	binary := func(name string) error {
		return b.runAs(name, func(ts []tensorDesc) (prepared, error) { return b.drv.binary(name, ts[0], ts[1], ts[2]) },
			flat(x, D), ob, flat(dst, D))
	}
	switch op {
	case compute.Add:
		return add(1)
	case compute.Sub:
		return add(-1)
	case compute.Mul:
		return binary("aclnnMul")
	case compute.Max:
		return binary("aclnnMaximum")
	case compute.Div:
		return binary("aclnnDiv")
	}
	return fmt.Errorf("ascend: binary op %d: %w", op, compute.ErrUnsupported)
}

// GatedAct implements compute.Backend: SwiGLU as aclnnSilu into a scratch
// span, then aclnnMul (aclnnSwiGlu wants gate and up concatenated in one
// tensor, which the seam does not promise); SigmoidGate as aclnnSigmoid
// into the scratch, then aclnnMul; SiTU from Muls, Tanh, Sigmoid and Mul.
func (b *Backend) GatedAct(act compute.Activation, dst, gate, up compute.Tensor) error {
	if act.Kind != compute.SwiGLU && act.Kind != compute.SiTU && act.Kind != compute.SigmoidGate {
		return fmt.Errorf("ascend: activation %d: %w", act.Kind, compute.ErrUnsupported)
	}
	if act.Kind == compute.SiTU && !(act.Beta > 0) {
		return fmt.Errorf("%w: SiTU beta %g", compute.ErrShape, act.Beta)
	}
	if gate.Rank == 0 || gate.DType != compute.F32 || up.DType != compute.F32 || dst.DType != compute.F32 ||
		dims(up) != dims(gate) || dims(dst) != dims(gate) {
		return fmt.Errorf("%w: GatedAct gate %v, up %v, dst %v", compute.ErrShape, gate, up, dst)
	}
	b.lock()
	defer b.mu.Unlock()
	return b.gatedAct(act, dst, gate, up)
}

// gatedAct is GatedAct on checked operands; b.mu is held.
func (b *Backend) gatedAct(act compute.Activation, dst, gate, up compute.Tensor) error {
	D := gate.Dim(-1)
	rows := dims(gate) / D
	n := 1
	if act.Kind == compute.SiTU {
		n = 3
	}
	tmp, err := b.allocTensor(compute.F32, n*rows*D)
	if err != nil {
		return err
	}
	defer b.freeBuf(tmp.Mem.(*devBuf))
	t0 := flat(part(tmp, 0, rows*D), D)
	unary := func(name string, x, out operand) error {
		return b.runAs(name, func(ts []tensorDesc) (prepared, error) { return b.drv.unary(name, ts[0], ts[1]) }, x, out)
	}
	mul := func(x, y, out operand) error {
		return b.runAs("aclnnMul", func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) }, x, y, out)
	}
	switch act.Kind {
	case compute.SwiGLU:
		if err := unary("aclnnSilu", flat(gate, D), t0); err != nil {
			return err
		}
		return mul(t0, flat(up, D), flat(dst, D))
	case compute.SigmoidGate:
		if err := unary("aclnnSigmoid", flat(gate, D), t0); err != nil {
			return err
		}
		return mul(t0, flat(up, D), flat(dst, D))
	}
	// SiTU: β·tanh(g/β)·sigmoid(g) · (β'·tanh(u/β'), or u when β' is 0).
	t1, t2 := flat(part(tmp, rows*D, rows*D), D), flat(part(tmp, 2*rows*D, rows*D), D)
	clip := func(x, out operand, beta float32) error {
		for _, f := range []func() error{
			func() error { return b.mulsOp(x, out, 1/beta) },
			func() error { return unary("aclnnTanh", out, out) },
			func() error { return b.mulsOp(out, out, beta) },
		} {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := clip(flat(gate, D), t0, act.Beta); err != nil {
		return err
	}
	if err := unary("aclnnSigmoid", flat(gate, D), t1); err != nil {
		return err
	}
	if err := mul(t0, t1, t0); err != nil {
		return err
	}
	u := flat(up, D)
	if act.LinearBeta != 0 {
		if err := clip(u, t2, act.LinearBeta); err != nil {
			return err
		}
		u = t2
	}
	return mul(t0, u, flat(dst, D))
}

// mulsOp is out = x · v.
func (b *Backend) mulsOp(x, out operand, v float32) error {
	sc, err := b.scalar(v)
	if err != nil {
		return err
	}
	return b.runAs("aclnnMuls "+attr(v), func(ts []tensorDesc) (prepared, error) { return b.drv.muls(ts[0], sc, ts[1]) }, x, out)
}

// Embedding implements compute.Backend with aclnnEmbedding; a bf16 table
// gathers into a bf16 scratch span that aclnnCast widens. Ids outside
// the table fault on the device, found at the next synchronisation (the
// pure-Go backend checks them on the host).
func (b *Backend) Embedding(dst, table, ids compute.Tensor) error {
	if table.Rank != 2 || ids.DType != compute.I32 || dst.DType != compute.F32 || dims(dst) != dims(ids)*table.Dims[1] ||
		(table.DType != compute.F32 && table.DType != compute.BF16) {
		return fmt.Errorf("%w: Embedding of ids %v from %v into %v", compute.ErrShape, ids, table, dst)
	}
	b.lock()
	defer b.mu.Unlock()
	T, D := dims(ids), table.Dims[1]
	tids := operand{t: ids, view: []int64{int64(T)}}
	gather := func(out compute.Tensor) error {
		return b.runAs("aclnnEmbedding", func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnEmbedding", ts[0], ts[1], ts[2]) },
			flat(table, D), tids, flat(out, D))
	}
	if table.DType == compute.F32 {
		return gather(dst)
	}
	tmp, err := b.allocTensor(compute.BF16, T, D)
	if err != nil {
		return err
	}
	defer b.freeBuf(tmp.Mem.(*devBuf))
	if err := gather(tmp); err != nil {
		return err
	}
	return b.runAs("aclnnCast f32", func(ts []tensorDesc) (prepared, error) { return b.drv.cast(ts[0], acl.Float, ts[1]) }, flat(tmp, D), flat(dst, D))
}

// HeadMatMul implements compute.Backend with aclnnBatchMatMul over the
// heads: x [T, H, K] is read as [H, T, K], w [H, N, K] as [H, K, N] and
// dst [T, H, N] written as [H, T, N], all through strides.
func (b *Backend) HeadMatMul(dst, x, w compute.Tensor) error {
	if x.Rank != 3 || w.Rank != 3 || dst.Rank != 3 || x.DType != compute.F32 || dst.DType != compute.F32 ||
		(w.DType != compute.F32 && w.DType != compute.BF16) {
		return fmt.Errorf("%w: HeadMatMul %v · %v -> %v", compute.ErrShape, x, w, dst)
	}
	T, H, K := x.Dims[0], x.Dims[1], x.Dims[2]
	N := w.Dims[1]
	if w.Dims[0] != H || w.Dims[2] != K || dst.Dims[0] != T || dst.Dims[1] != H || dst.Dims[2] != N {
		return fmt.Errorf("%w: HeadMatMul %v · %v -> %v", compute.ErrShape, x, w, dst)
	}
	b.lock()
	defer b.mu.Unlock()
	i := func(v ...int) []int64 {
		out := make([]int64, len(v))
		for j, x := range v {
			out[j] = int64(x)
		}
		return out
	}
	return b.runAs("aclnnBatchMatMul", func(ts []tensorDesc) (prepared, error) {
		return b.drv.matmul("aclnnBatchMatMul", ts[0], ts[1], ts[2], 0)
	},
		operand{t: x, view: i(H, T, K), strides: i(K, H*K, 1)},
		operand{t: w, view: i(H, K, N), strides: i(N*K, 1, K)},
		operand{t: dst, view: i(H, T, N), strides: i(N, H*N, 1)})
}

// The operations below are not mapped to aclnn yet: on a device they
// return the unmapped error, over the host driver they run on the
// pure-Go backend.

// LayerNorm implements compute.Backend with aclnnLayerNorm (normalized
// over the last dimension); the per-row mean and reciprocal root it also
// returns go to scratch spans.
func (b *Backend) LayerNorm(dst, x, w, bias compute.Tensor, eps float32) error {
	if x.Rank == 0 || x.DType != compute.F32 || dst.DType != compute.F32 || dims(dst) != dims(x) ||
		w.DType != compute.F32 || bias.DType != compute.F32 || dims(w) != x.Dim(-1) || dims(bias) != x.Dim(-1) {
		return fmt.Errorf("%w: LayerNorm x %v dst %v w %v b %v", compute.ErrShape, x, dst, w, bias)
	}
	b.lock()
	defer b.mu.Unlock()
	D := x.Dim(-1)
	rows := dims(x) / max(D, 1)
	stats, err := b.allocTensor(compute.F32, 2, rows)
	if err != nil {
		return err
	}
	defer b.freeBuf(stats.Mem.(*devBuf))
	vec := []int64{int64(D)}
	return b.runAs("aclnnLayerNorm "+attr(eps), func(ts []tensorDesc) (prepared, error) {
		return b.drv.layerNorm(ts[0], ts[1], ts[2], float64(eps), ts[3], ts[4], ts[5], D)
	}, flat(x, D), operand{t: w, view: vec}, operand{t: bias, view: vec}, flat(dst, D), flat(stats.Rows(0, 1), 1), flat(stats.Rows(1, 2), 1))
}

func (b *Backend) KDAStep(a *compute.KDAStepArgs) error {
	return b.onHost("KDAStep", a, func(c compute.Backend, h any) error { return c.KDAStep(h.(*compute.KDAStepArgs)) })
}

var _ compute.Backend = (*Backend)(nil)
