package ascend

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"unsafe"

	"k3/ascend/internal/acl"
	"k3/ascend/internal/nz"
	"k3/internal/floatx"
)

// hostDriver runs the backend's orchestration on the host, so that it is
// exercised in every build: device memory is Go memory, a stream queues
// its work and runs it only when something waits for it, and the aclnn
// operators the backend maps are computed in Go with aclnn's semantics
// (descriptors with strides and offsets, broadcasting, two phases with a
// workspace). It checks what ACL checks: device addresses against its
// allocations, host copies only from its pinned buffers, workspaces of
// the size phase 1 asked for. Operations the backend has not mapped to
// aclnn run on the pure-Go backend over the same memory (Backend.onHost).
type hostDriver struct {
	mu     sync.Mutex
	allocs [][]byte // device allocations
	pinned map[*hostPinned]bool
}

func newHostDriver() *hostDriver { return &hostDriver{pinned: map[*hostPinned]bool{}} }

func hostErr(lib acl.Library, code int, api, format string, args ...any) error {
	return &acl.Error{API: api, Lib: lib, Code: code, Msg: fmt.Sprintf(format, args...)}
}

func (d *hostDriver) malloc(n int) (acl.DevPtr, error) {
	if n <= 0 {
		return acl.DevPtr{}, hostErr(acl.ACL, 100000, "aclrtMalloc", "size %d", n)
	}
	// 512 spare bytes let the start be 512-byte aligned, as ACL's is.
	raw := make([]byte, n+512)
	pad := (512 - int(uintptr(unsafe.Pointer(unsafe.SliceData(raw))))%512) % 512
	b := raw[pad : pad+n : pad+n]
	d.mu.Lock()
	d.allocs = append(d.allocs, b)
	d.mu.Unlock()
	return acl.HostDevPtr(b), nil
}

func (d *hostDriver) free(p acl.DevPtr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, b := range d.allocs {
		if acl.HostDevPtr(b) == p {
			d.allocs = append(d.allocs[:i], d.allocs[i+1:]...)
			return nil
		}
	}
	return hostErr(acl.ACL, 100000, "aclrtFree", "not device memory from aclrtMalloc")
}

// mem is the device memory [p, p+n), or an error naming api.
func (d *hostDriver) mem(p acl.DevPtr, n int, api string) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, b := range d.allocs {
		off := p.Sub(acl.HostDevPtr(b))
		if off >= 0 && off+n <= len(b) && n >= 0 {
			return b[off : off+n], nil
		}
	}
	return nil, hostErr(acl.ACL, 100000, api, "%d bytes at %v are not device memory", n, p)
}

type hostPinned struct {
	d *hostDriver
	b []byte
}

func (h *hostPinned) Bytes() []byte { return h.b }

func (h *hostPinned) Free() error {
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	if !h.d.pinned[h] {
		return hostErr(acl.ACL, 100000, "aclrtFreeHost", "not from aclrtMallocHost")
	}
	delete(h.d.pinned, h)
	return nil
}

func (d *hostDriver) mallocHost(n int) (hostBuffer, error) {
	h := &hostPinned{d: d, b: make([]byte, n)}
	d.mu.Lock()
	d.pinned[h] = true
	d.mu.Unlock()
	return h, nil
}

func (d *hostDriver) close() error { return nil }

// hostStream queues work until a synchronisation.
type hostStream struct {
	d         *hostDriver
	q         []func() error
	capturing *hostGraph
}

func (d *hostDriver) newStream() (stream, error) { return &hostStream{d: d}, nil }

func (s *hostStream) enqueue(f func() error) {
	if g := s.capturing; g != nil {
		if j := g.joined[s]; j != nil && j.returned {
			j.after++ // an error when the capture ends, as in ACL
		}
		g.tasks = append(g.tasks, f)
		return
	}
	s.q = append(s.q, f)
}

func (s *hostStream) Sync() error {
	if s.capturing != nil {
		return hostErr(acl.ACL, 100000, "aclrtSynchronizeStream", "the stream is capturing")
	}
	var first error
	for len(s.q) > 0 {
		f := s.q[0]
		s.q = s.q[1:]
		if err := f(); err != nil && first == nil {
			first = err
		}
	}
	s.q = nil
	return first
}

func (s *hostStream) Destroy() error { return s.Sync() }

// hostEvent is an event of the host driver. Each record is a generation
// (recorded counts them); a wait waits for the generation recorded when
// the wait was queued, as ACL's do, so that a later record of the same
// event (the next layer's Fork) neither completes nor delays it. done is
// the newest generation whose record task has run; src is the stream of
// the newest record, graph the capture it was captured into.
type hostEvent struct {
	recorded, done int
	dead           bool
	src            *hostStream
	graph          *hostGraph
}

func (d *hostDriver) newEvent() (event, error) { return &hostEvent{}, nil }

func (e *hostEvent) Destroy() error { e.dead = true; return nil }

func liveEvent(e event, api string) (*hostEvent, error) {
	ev, ok := e.(*hostEvent)
	if !ok || ev.dead {
		return nil, hostErr(acl.ACL, 100000, api, "not a live event")
	}
	return ev, nil
}

func (s *hostStream) record(e event) error {
	ev, err := liveEvent(e, "aclrtRecordEvent")
	if err != nil {
		return err
	}
	ev.recorded++
	gen := ev.recorded
	ev.src, ev.graph = s, s.capturing
	s.enqueue(func() error { ev.done = max(ev.done, gen); return nil })
	return nil
}

// wait queues a task that runs the recording stream's queue up to the
// event's record (the host driver's streams run only when waited for).
// Inside a capture it follows ACL's cross-stream capture: a stream that
// waits for an event recorded in the capture joins it (its later work is
// captured too), and a joined stream returns when the capturing stream
// waits for an event recorded on it, and joins again when it waits for
// another event of the capturing stream. A captured graph holds the tasks of
// every stream in the order they were issued, which keeps each event's
// record before its waits.
func (s *hostStream) wait(e event) error {
	ev, err := liveEvent(e, "aclrtStreamWaitEvent")
	if err != nil {
		return err
	}
	if g := ev.graph; g != nil && g.active {
		switch {
		case s.capturing == nil:
			s.capturing = g
			g.joined[s] = &joinState{}
		case s.capturing != g:
			return hostErr(acl.ACL, 100000, "aclrtStreamWaitEvent", "the stream is capturing another graph")
		case s == g.origin:
			if j := g.joined[ev.src]; j != nil {
				j.returned = true
			}
		case ev.src == g.origin:
			// A returned stream forked again (the next layer's side work)
			// is in the capture again until it returns once more.
			if j := g.joined[s]; j != nil {
				j.returned = false
			}
		}
		s.enqueue(func() error { return nil }) // the record precedes it in the graph
		return nil
	}
	if s.capturing != nil {
		return hostErr(acl.ACL, 100000, "aclrtStreamWaitEvent", "the event was not recorded in the capture")
	}
	want, src := ev.recorded, ev.src
	s.enqueue(func() error {
		for ev.done < want {
			if len(src.q) == 0 {
				return hostErr(acl.ACL, 507015, "aclrtStreamWaitEvent", "the event's record is not queued")
			}
			f := src.q[0]
			src.q = src.q[1:]
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	})
	return nil
}

func (s *hostStream) pinned(h hostBuffer, off, n int, api string) ([]byte, error) {
	p, ok := h.(*hostPinned)
	s.d.mu.Lock()
	ok = ok && s.d.pinned[p]
	s.d.mu.Unlock()
	if !ok || off < 0 || off+n > len(p.b) {
		return nil, hostErr(acl.ACL, 100000, api, "the host side is not [%d:%d] of pinned memory from aclrtMallocHost", off, off+n)
	}
	return p.b[off : off+n], nil
}

// copyLater queues copy(to, from) once both sides are checked.
func (s *hostStream) copyLater(to []byte, errTo error, from []byte, errFrom error) error {
	if errTo != nil {
		return errTo
	}
	if errFrom != nil {
		return errFrom
	}
	s.enqueue(func() error { copy(to, from); return nil })
	return nil
}

func (s *hostStream) upload(dst acl.DevPtr, src hostBuffer, off, n int) error {
	to, errTo := s.d.mem(dst, n, "aclrtMemcpyAsync")
	from, errFrom := s.pinned(src, off, n, "aclrtMemcpyAsync")
	return s.copyLater(to, errTo, from, errFrom)
}

func (s *hostStream) download(dst hostBuffer, off int, src acl.DevPtr, n int) error {
	to, errTo := s.pinned(dst, off, n, "aclrtMemcpyAsync")
	from, errFrom := s.d.mem(src, n, "aclrtMemcpyAsync")
	return s.copyLater(to, errTo, from, errFrom)
}

func (s *hostStream) Memset(dst acl.DevPtr, value byte, n int) error {
	to, err := s.d.mem(dst, n, "aclrtMemsetAsync")
	if err != nil {
		return err
	}
	s.enqueue(func() error {
		for i := range to {
			to[i] = value
		}
		return nil
	})
	return nil
}

func (s *hostStream) CopyDevice(dst, src acl.DevPtr, n int) error {
	to, errTo := s.d.mem(dst, n, "aclrtMemcpyAsync")
	from, errFrom := s.d.mem(src, n, "aclrtMemcpyAsync")
	return s.copyLater(to, errTo, from, errFrom)
}

type hostGraph struct {
	tasks  []func() error
	origin *hostStream
	active bool
	// joined are the streams that joined the capture by an event.
	joined map[*hostStream]*joinState
}

type joinState struct {
	returned bool
	after    int // tasks issued after returning
}

func (s *hostStream) capture(fn func() error) (graph, error) {
	g := &hostGraph{origin: s, active: true, joined: map[*hostStream]*joinState{}}
	s.capturing = g
	err := fn()
	s.capturing, g.active = nil, false
	for js, j := range g.joined {
		js.capturing = nil
		switch {
		case err != nil:
		case !j.returned:
			err = hostErr(acl.ACL, 100000, "aclmdlRICaptureEnd", "a stream joined the capture by an event and did not return to the capturing stream")
		case j.after > 0:
			err = hostErr(acl.ACL, 100000, "aclmdlRICaptureEnd", "%d tasks were issued on a joined stream after it returned", j.after)
		}
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (g *hostGraph) replay(s stream) error {
	hs := s.(*hostStream)
	for _, t := range g.tasks {
		hs.enqueue(t)
	}
	return nil
}

func (g *hostGraph) Destroy() error { g.tasks = nil; return nil }

// hostTensor is a descriptor: a strided view over device memory.
type hostTensor struct {
	dt      acl.DataType
	dims    []int64
	strides []int64
	offset  int64
	data    []byte // the whole storage
	dead    bool
	// nz is set for a FRACTAL_NZ tensor [..., R, C] (contiguous view,
	// offset 0): element i of the view is stored at nzAt(i).
	nz *nz.Layout
}

func (t *hostTensor) Destroy() error { t.dead = true; return nil }

func (d *hostDriver) newTensor(td acl.TensorDesc) (tensorDesc, error) {
	api := "aclCreateTensor"
	if td.Format == acl.FormatFractalNZ {
		return d.newNZ(td)
	}
	if len(td.Dims) == 0 || td.DType.Size() == 0 || (td.Format != acl.FormatND && td.Format != 0) {
		return nil, hostErr(acl.ACLNN, 161002, api, "%d dimensions, data type %d, format %d", len(td.Dims), td.DType, td.Format)
	}
	strides := td.Strides
	if strides == nil {
		strides = make([]int64, len(td.Dims))
		s := int64(1)
		for i := len(td.Dims) - 1; i >= 0; i-- {
			strides[i] = s
			s *= td.Dims[i]
		}
	}
	storage := td.StorageDims
	if storage == nil {
		storage = td.Dims
	}
	n, reach := int64(1), td.Offset
	for _, s := range storage {
		n *= s
	}
	for i, dim := range td.Dims {
		if dim <= 0 || strides[i] < 0 {
			return nil, hostErr(acl.ACLNN, 161002, api, "dimension %d is %d with stride %d", i, dim, strides[i])
		}
		reach += (dim - 1) * strides[i]
	}
	if reach >= n {
		return nil, hostErr(acl.ACLNN, 161002, api, "the view reaches element %d of a storage of %d", reach, n)
	}
	data, err := d.mem(td.Data, int(n)*td.DType.Size(), api)
	if err != nil {
		return nil, err
	}
	return &hostTensor{dt: td.DType, dims: td.Dims, strides: strides, offset: td.Offset, data: data}, nil
}

// newNZ describes a FRACTAL_NZ tensor: a 16-bit [..., R, C] view,
// contiguous from offset 0, over a storage [..., ⌈C/16⌉, ⌈R/16⌉, 16, 16].
func (d *hostDriver) newNZ(td acl.TensorDesc) (tensorDesc, error) {
	api := "aclCreateTensor"
	nd := len(td.Dims)
	if nd < 2 || td.DType.Size() != 2 || td.Offset != 0 {
		return nil, hostErr(acl.ACLNN, 161002, api, "FRACTAL_NZ view %v of data type %d at offset %d: a 16-bit matrix from offset 0 expected", td.Dims, td.DType, td.Offset)
	}
	dims := make([]int, nd)
	strides := make([]int64, nd)
	s := int64(1)
	for i := nd - 1; i >= 0; i-- {
		dims[i], strides[i] = int(td.Dims[i]), s
		s *= td.Dims[i]
	}
	l, err := nz.NewLayout(dims, nz.C0(2))
	if err != nil {
		return nil, hostErr(acl.ACLNN, 161002, api, "FRACTAL_NZ view %v: %v", td.Dims, err)
	}
	want := l.StorageDims(dims[:nd-2])
	if (td.Strides != nil && !slices.Equal(td.Strides, strides)) || len(td.StorageDims) != len(want) {
		return nil, hostErr(acl.ACLNN, 161002, api, "FRACTAL_NZ view %v strides %v storage %v, want contiguous over %v", td.Dims, td.Strides, td.StorageDims, want)
	}
	for i, s := range want {
		if td.StorageDims[i] != int64(s) {
			return nil, hostErr(acl.ACLNN, 161002, api, "FRACTAL_NZ storage %v for view %v, want %v", td.StorageDims, td.Dims, want)
		}
	}
	data, err := d.mem(td.Data, l.Len()*2, api)
	if err != nil {
		return nil, err
	}
	return &hostTensor{dt: td.DType, dims: td.Dims, strides: strides, data: data, nz: &l}, nil
}

// nzAt is where element i of an NZ tensor's contiguous view is stored.
func (t *hostTensor) nzAt(i int64) int64 {
	l := t.nz
	rc := int64(l.R * l.C)
	return int64(l.Offset(int(i/rc), int(i%rc)/l.C, int(i%int64(l.C))))
}

func (t *hostTensor) get(i int64) float64 {
	if t.nz != nil {
		i = t.nzAt(i)
	}
	switch t.dt {
	case acl.Float:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(t.data[4*i:])))
	case acl.BF16:
		return float64(floatx.FromBF16(binary.LittleEndian.Uint16(t.data[2*i:])))
	case acl.Float16:
		return float64(floatx.FromF16(binary.LittleEndian.Uint16(t.data[2*i:])))
	case acl.Int32:
		return float64(int32(binary.LittleEndian.Uint32(t.data[4*i:])))
	case acl.Int64:
		return float64(int64(binary.LittleEndian.Uint64(t.data[8*i:])))
	}
	return math.NaN()
}

func (t *hostTensor) put(i int64, v float64) {
	if t.nz != nil {
		i = t.nzAt(i)
	}
	switch t.dt {
	case acl.Float:
		binary.LittleEndian.PutUint32(t.data[4*i:], math.Float32bits(float32(v)))
	case acl.BF16:
		binary.LittleEndian.PutUint16(t.data[2*i:], floatx.BF16(float32(v)))
	case acl.Float16:
		binary.LittleEndian.PutUint16(t.data[2*i:], floatx.F16(float32(v)))
	case acl.Int32:
		binary.LittleEndian.PutUint32(t.data[4*i:], uint32(int32(v)))
	case acl.Int64:
		binary.LittleEndian.PutUint64(t.data[8*i:], uint64(int64(v)))
	}
}

func (t *hostTensor) count() int64 {
	n := int64(1)
	for _, d := range t.dims {
		n *= d
	}
	return n
}

type hostScalar struct{ v float64 }

func (*hostScalar) Destroy() error { return nil }

func (d *hostDriver) newScalar(v float32) (scalar, error) { return &hostScalar{float64(v)}, nil }

// hostOp is a prepared operator: its workspace size and its computation.
type hostOp struct {
	d          *hostDriver
	api        string
	ws         int
	run        func(ws []byte) error
	used       bool
	repeatable bool
}

func (o *hostOp) workspace() int { return o.ws }

func (o *hostOp) repeat() error {
	if o.used {
		return hostErr(acl.ACLNN, 161002, "aclSetAclOpExecutorRepeatable", "not a live executor")
	}
	o.repeatable = true
	return nil
}

func (o *hostOp) destroy() error {
	o.used, o.repeatable = true, false
	return nil
}

func (o *hostOp) launch(s stream, ws acl.DevPtr) error {
	if o.used && !o.repeatable {
		return hostErr(acl.ACLNN, 161002, o.api, "the executor was consumed by an earlier launch")
	}
	o.used = true
	var w []byte
	if o.ws > 0 {
		var err error
		if w, err = o.d.mem(ws, o.ws, o.api); err != nil {
			return hostErr(acl.ACLNN, 161002, o.api, "workspace: %v", err)
		}
	}
	s.(*hostStream).enqueue(func() error { return o.run(w) })
	return nil
}

// operands checks that every descriptor is live.
func operands(api string, ts ...tensorDesc) ([]*hostTensor, error) {
	out := make([]*hostTensor, len(ts))
	for i, t := range ts {
		h, ok := t.(*hostTensor)
		if !ok || h.dead {
			return nil, hostErr(acl.ACLNN, 161001, api, "operand %d is not a live tensor", i)
		}
		out[i] = h
	}
	return out, nil
}

func (d *hostDriver) matmul(name string, x, w, out tensorDesc, cubeMath int8) (prepared, error) {
	api := name + "GetWorkspaceSize"
	ts, err := operands(api, x, w, out)
	if err != nil {
		return nil, err
	}
	a, b, o := ts[0], ts[1], ts[2]
	nd := 2
	if name == "aclnnBatchMatMul" {
		nd = 3
	}
	k := nd - 2 // index of the row dimension
	if len(a.dims) != nd || len(b.dims) != nd || len(o.dims) != nd || a.dims[k+1] != b.dims[k] ||
		o.dims[k] != a.dims[k] || o.dims[k+1] != b.dims[k+1] || (nd == 3 && (b.dims[0] != a.dims[0] || o.dims[0] != a.dims[0])) {
		return nil, hostErr(acl.ACLNN, 161002, api, "shapes %v x %v -> %v do not chain", a.dims, b.dims, o.dims)
	}
	batch := int64(1)
	if nd == 3 {
		batch = a.dims[0]
	}
	M, K, N := a.dims[k], a.dims[k+1], b.dims[k+1]
	run := func(ws []byte) error {
		acc := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(ws))), N) // one output row, in the workspace
		for bi := int64(0); bi < batch; bi++ {
			var ab, bb, ob int64
			if nd == 3 {
				ab, bb, ob = bi*a.strides[0], bi*b.strides[0], bi*o.strides[0]
			}
			for m := int64(0); m < M; m++ {
				for n := int64(0); n < N; n++ {
					var s float64
					for kk := int64(0); kk < K; kk++ {
						s += a.get(a.offset+ab+m*a.strides[k]+kk*a.strides[k+1]) * b.get(b.offset+bb+kk*b.strides[k]+n*b.strides[k+1])
					}
					acc[n] = float32(s)
				}
				for n := int64(0); n < N; n++ {
					o.put(o.offset+ob+m*o.strides[k]+n*o.strides[k+1], float64(acc[n]))
				}
			}
		}
		return nil
	}
	return &hostOp{d: d, api: name, ws: int(N) * 4, run: run}, nil
}

func (d *hostDriver) rmsNorm(x, gamma tensorDesc, eps float64, y, rstd tensorDesc) (prepared, error) {
	api := "aclnnRmsNormGetWorkspaceSize"
	ts, err := operands(api, x, gamma, y, rstd)
	if err != nil {
		return nil, err
	}
	a, g, o, r := ts[0], ts[1], ts[2], ts[3]
	D := a.dims[len(a.dims)-1]
	rows := a.count() / D
	if o.count() != a.count() || g.count() != D || r.count() != rows || !(eps > 0) {
		return nil, hostErr(acl.ACLNN, 161002, api, "x %v, gamma %v, y %v, rstd %v, eps %g do not match", a.dims, g.dims, o.dims, r.dims, eps)
	}
	run := func([]byte) error {
		for i := int64(0); i < rows; i++ {
			var ss float64
			for j := int64(0); j < D; j++ {
				v := a.get(a.offset + i*D + j)
				ss += v * v
			}
			rs := 1 / math.Sqrt(ss/float64(D)+eps)
			for j := int64(0); j < D; j++ {
				o.put(o.offset+i*D+j, a.get(a.offset+i*D+j)*rs*g.get(g.offset+j))
			}
			r.put(r.offset+i, rs)
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnRmsNorm", run: run}, nil
}

func (d *hostDriver) layerNorm(x, w, b tensorDesc, eps float64, out, mean, rstd tensorDesc, dim int) (prepared, error) {
	api := "aclnnLayerNormGetWorkspaceSize"
	ts, err := operands(api, x, w, b, out, mean, rstd)
	if err != nil {
		return nil, err
	}
	a, g, bi, o, mu, r := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5]
	D := a.dims[len(a.dims)-1]
	rows := a.count() / D
	if int64(dim) != D || o.count() != a.count() || g.count() != D || bi.count() != D || mu.count() != rows || r.count() != rows || !(eps > 0) {
		return nil, hostErr(acl.ACLNN, 161002, api, "x %v, normalizedShape [%d], out %v, mean %v, rstd %v, eps %g do not match", a.dims, dim, o.dims, mu.dims, r.dims, eps)
	}
	run := func([]byte) error {
		for i := int64(0); i < rows; i++ {
			var m, v float64
			for j := int64(0); j < D; j++ {
				m += a.get(a.offset + i*D + j)
			}
			m /= float64(D)
			for j := int64(0); j < D; j++ {
				c := a.get(a.offset+i*D+j) - m
				v += c * c
			}
			rs := 1 / math.Sqrt(v/float64(D)+eps)
			for j := int64(0); j < D; j++ {
				o.put(o.offset+i*D+j, (a.get(a.offset+i*D+j)-m)*rs*g.get(g.offset+j)+bi.get(bi.offset+j))
			}
			mu.put(mu.offset+i, m)
			r.put(r.offset+i, rs)
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnLayerNorm", run: run}, nil
}

// elementwise prepares out[i] = f(a[i], b[i]) with numpy broadcasting of
// a and b (b may be nil) to out's shape.
func (d *hostDriver) elementwise(name string, f func(x, y float64) float64, ts ...tensorDesc) (prepared, error) {
	api := name + "GetWorkspaceSize"
	hs, err := operands(api, ts...)
	if err != nil {
		return nil, err
	}
	o := hs[len(hs)-1]
	in := hs[:len(hs)-1]
	for _, t := range in {
		if !broadcastsTo(t.dims, o.dims) {
			return nil, hostErr(acl.ACLNN, 161002, api, "%v does not broadcast to %v", t.dims, o.dims)
		}
	}
	run := func([]byte) error {
		idx := make([]int64, len(o.dims))
		for n := o.count(); n > 0; n-- {
			var x, y float64
			x = in[0].get(boffset(in[0], o, idx))
			if len(in) > 1 {
				y = in[1].get(boffset(in[1], o, idx))
			}
			o.put(boffset(o, o, idx), f(x, y))
			for i := len(idx) - 1; i >= 0; i-- {
				if idx[i]++; idx[i] < o.dims[i] {
					break
				}
				idx[i] = 0
			}
		}
		return nil
	}
	return &hostOp{d: d, api: name, run: run}, nil
}

func broadcastsTo(dims, out []int64) bool {
	if len(dims) > len(out) {
		return false
	}
	for i, d := range dims {
		if od := out[len(out)-len(dims)+i]; d != 1 && d != od {
			return false
		}
	}
	return true
}

// boffset is the element of t that output index idx reads.
func boffset(t, o *hostTensor, idx []int64) int64 {
	off := t.offset
	for i, d := range t.dims {
		if d != 1 {
			off += idx[len(o.dims)-len(t.dims)+i] * t.strides[i]
		}
	}
	return off
}

func (d *hostDriver) unary(name string, x, out tensorDesc) (prepared, error) {
	switch name {
	case "aclnnSilu":
		return d.elementwise(name, func(x, _ float64) float64 { return x / (1 + math.Exp(-x)) }, x, out)
	case "aclnnSigmoid":
		return d.elementwise(name, func(x, _ float64) float64 { return 1 / (1 + math.Exp(-x)) }, x, out)
	case "aclnnExp":
		return d.elementwise(name, func(x, _ float64) float64 { return math.Exp(x) }, x, out)
	case "aclnnTanh":
		return d.elementwise(name, func(x, _ float64) float64 { return math.Tanh(x) }, x, out)
	case "aclnnRelu":
		return d.elementwise(name, func(x, _ float64) float64 { return max(x, 0) }, x, out)
	case "aclnnLog":
		return d.elementwise(name, func(x, _ float64) float64 { return math.Log(x) }, x, out)
	}
	return nil, hostErr(acl.ACLNN, 561003, name, "operator %s not in the host driver", name)
}

func (d *hostDriver) binary(name string, a, b, out tensorDesc) (prepared, error) {
	switch name {
	case "aclnnMul":
		return d.elementwise(name, func(x, y float64) float64 { return x * y }, a, b, out)
	case "aclnnMaximum":
		return d.elementwise(name, math.Max, a, b, out)
	case "aclnnDiv":
		return d.elementwise(name, func(x, y float64) float64 { return x / y }, a, b, out)
	case "aclnnEmbedding":
		return d.embedding(a, b, out)
	}
	return nil, hostErr(acl.ACLNN, 561003, name, "operator %s not in the host driver", name)
}

func (d *hostDriver) add(a, b tensorDesc, alpha scalar, out tensorDesc) (prepared, error) {
	al := alpha.(*hostScalar).v
	return d.elementwise("aclnnAdd", func(x, y float64) float64 { return x + al*y }, a, b, out)
}

func (d *hostDriver) softplus(x tensorDesc, beta, threshold scalar, out tensorDesc) (prepared, error) {
	b, th := beta.(*hostScalar).v, threshold.(*hostScalar).v
	if b == 0 {
		return nil, hostErr(acl.ACLNN, 161002, "aclnnSoftplusGetWorkspaceSize", "beta 0")
	}
	return d.elementwise("aclnnSoftplus", func(x, _ float64) float64 {
		if b*x > th {
			return x
		}
		return math.Log1p(math.Exp(b*x)) / b
	}, x, out)
}

func (d *hostDriver) cast(x tensorDesc, dt acl.DataType, out tensorDesc) (prepared, error) {
	if o, ok := out.(*hostTensor); ok && o.dt != dt {
		return nil, hostErr(acl.ACLNN, 161002, "aclnnCastGetWorkspaceSize", "out has data type %d, cast to %d", o.dt, dt)
	}
	return d.elementwise("aclnnCast", func(x, _ float64) float64 { return x }, x, out)
}

func (d *hostDriver) fill(x tensorDesc, v scalar) (prepared, error) {
	val := v.(*hostScalar).v
	return d.elementwise("aclnnInplaceFillScalar", func(float64, float64) float64 { return val }, x, x)
}

func (d *hostDriver) embedding(weight, indices, out tensorDesc) (prepared, error) {
	api := "aclnnEmbeddingGetWorkspaceSize"
	ts, err := operands(api, weight, indices, out)
	if err != nil {
		return nil, err
	}
	w, ids, o := ts[0], ts[1], ts[2]
	if len(w.dims) != 2 || len(ids.dims) != 1 || ids.dt != acl.Int32 || len(o.dims) != 2 || o.dims[0] != ids.dims[0] ||
		o.dims[1] != w.dims[1] || o.dt != w.dt {
		return nil, hostErr(acl.ACLNN, 161002, api, "weight %v, indices %v, out %v", w.dims, ids.dims, o.dims)
	}
	V, D := w.dims[0], w.dims[1]
	run := func([]byte) error {
		for t := int64(0); t < ids.dims[0]; t++ {
			id := int64(ids.get(ids.offset + t*ids.strides[0]))
			if id < 0 || id >= V {
				return hostErr(acl.ACL, 507015, "aclnnEmbedding", "index %d outside [0, %d)", id, V)
			}
			for j := int64(0); j < D; j++ {
				o.put(o.offset+t*o.strides[0]+j*o.strides[1], w.get(w.offset+id*w.strides[0]+j*w.strides[1]))
			}
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnEmbedding", run: run}, nil
}

func (d *hostDriver) muls(x tensorDesc, v scalar, out tensorDesc) (prepared, error) {
	m := v.(*hostScalar).v
	return d.elementwise("aclnnMuls", func(x, _ float64) float64 { return x * m }, x, out)
}

func (d *hostDriver) inplaceCopy(dst, src tensorDesc) (prepared, error) {
	return d.elementwise("aclnnInplaceCopy", func(x, _ float64) float64 { return x }, src, dst)
}

// at3 is element [i, j, k] of a rank-3 view.
func (t *hostTensor) at3(i, j, k int64) float64 {
	return t.get(t.offset + i*t.strides[0] + j*t.strides[1] + k*t.strides[2])
}

func (d *hostDriver) rgdr(q, k, v, beta, state, seqLens, stateIdx, g, gk tensorDesc, scale float32, out tensorDesc) (prepared, error) {
	api := "aclnnRecurrentGatedDeltaRuleGetWorkspaceSize"
	all := []tensorDesc{q, k, v, beta, state, seqLens, stateIdx, gk, out}
	if g != nil {
		all = append(all, g)
	}
	ts, err := operands(api, all...)
	if err != nil {
		return nil, err
	}
	tq, tk, tv, tb, st, lens, idx, tgk, o := ts[0], ts[1], ts[2], ts[3], ts[4], ts[5], ts[6], ts[7], ts[8]
	var tg *hostTensor
	if g != nil {
		tg = ts[9]
	}
	T := tq.dims[0]
	ok := len(tq.dims) == 3 && len(tk.dims) == 3 && len(tv.dims) == 3 && len(o.dims) == 3 && len(tb.dims) == 2 &&
		len(st.dims) == 4 && len(lens.dims) == 1 && len(idx.dims) == 1 && lens.dt == acl.Int32 && idx.dt == acl.Int32 &&
		idx.dims[0] == T && tk.dims[0] == T && tv.dims[0] == T && o.dims[0] == T && tb.dims[0] == T &&
		tk.dims[1] == tq.dims[1] && tk.dims[2] == tq.dims[2] && tv.dims[1]%tq.dims[1] == 0 && tb.dims[1] == tv.dims[1] &&
		o.dims[1] == tv.dims[1] && o.dims[2] == tv.dims[2] && st.dims[1] == tv.dims[1] && st.dims[2] == tv.dims[2] &&
		st.dims[3] == tq.dims[2] && len(tgk.dims) == 3 && tgk.dims[0] == T && tgk.dims[1] == tv.dims[1] && tgk.dims[2] == tq.dims[2] &&
		(tg == nil || (len(tg.dims) == 2 && tg.dims[0] == T && tg.dims[1] == tv.dims[1]))
	if !ok {
		return nil, hostErr(acl.ACLNN, 161002, api, "q %v, k %v, v %v, beta %v, state %v, lengths %v, indices %v, gk %v, out %v do not match",
			tq.dims, tk.dims, tv.dims, tb.dims, st.dims, lens.dims, idx.dims, tgk.dims, o.dims)
	}
	B, Nk, Dk, Nv, Dv := lens.dims[0], tq.dims[1], tq.dims[2], tv.dims[1], tv.dims[2]
	run := func([]byte) error {
		S, u := make([]float64, Dv*Dk), make([]float64, Dv)
		var t0 int64
		for b := int64(0); b < B; b++ {
			n := int64(lens.get(lens.offset + b*lens.strides[0]))
			if n < 1 || n > 8 || t0+n > T {
				return hostErr(acl.ACL, 507015, "aclnnRecurrentGatedDeltaRule", "sequence %d has %d tokens (1 to 8, %d in all)", b, n, T)
			}
			for h := int64(0); h < Nv; h++ {
				hk := h / (Nv / Nk)
				slot := int64(idx.get(idx.offset + t0*idx.strides[0]))
				for a := range S {
					S[a] = st.get(st.offset + (slot*Nv+h)*Dv*Dk + int64(a))
				}
				for i := int64(0); i < n; i++ {
					t := t0 + i
					var gh float64
					if tg != nil {
						gh = tg.get(tg.offset + t*tg.strides[0] + h*tg.strides[1])
					}
					for c := int64(0); c < Dk; c++ {
						dc := math.Exp(gh + tgk.at3(t, h, c))
						for r := int64(0); r < Dv; r++ {
							S[r*Dk+c] *= dc
						}
					}
					bt := tb.get(tb.offset + t*tb.strides[0] + h*tb.strides[1])
					for r := int64(0); r < Dv; r++ {
						var sk float64
						for c := int64(0); c < Dk; c++ {
							sk += S[r*Dk+c] * tk.at3(t, hk, c)
						}
						u[r] = bt * (tv.at3(t, h, r) - sk)
					}
					for r := int64(0); r < Dv; r++ {
						for c := int64(0); c < Dk; c++ {
							S[r*Dk+c] += u[r] * tk.at3(t, hk, c)
						}
					}
					for r := int64(0); r < Dv; r++ {
						var sq float64
						for c := int64(0); c < Dk; c++ {
							sq += S[r*Dk+c] * tq.at3(t, hk, c)
						}
						o.put(o.offset+t*o.strides[0]+h*o.strides[1]+r*o.strides[2], float64(scale)*sq)
					}
					to := int64(idx.get(idx.offset + t*idx.strides[0]))
					for a := range S {
						st.put(st.offset+(to*Nv+h)*Dv*Dk+int64(a), S[a])
					}
				}
			}
			t0 += n
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnRecurrentGatedDeltaRule", run: run}, nil
}

// contiguousRows reports whether t is a contiguous [rows, ...] view, and
// its row width in elements.
func (t *hostTensor) contiguousRows() (int64, bool) {
	s := int64(1)
	for i := len(t.dims) - 1; i >= 0; i-- {
		if t.strides[i] != s {
			return 0, false
		}
		s *= t.dims[i]
	}
	return t.count() / t.dims[0], true
}

func (d *hostDriver) indexSelect(x tensorDesc, dim int, index, out tensorDesc) (prepared, error) {
	api := "aclnnIndexSelectGetWorkspaceSize"
	ts, err := operands(api, x, index, out)
	if err != nil {
		return nil, err
	}
	a, idx, o := ts[0], ts[1], ts[2]
	w, ok1 := a.contiguousRows()
	_, ok2 := o.contiguousRows()
	if dim != 0 || !ok1 || !ok2 || len(idx.dims) != 1 || idx.dt != acl.Int32 || o.dims[0] != idx.dims[0] || o.count() != idx.dims[0]*w {
		return nil, hostErr(acl.ACLNN, 161002, api, "dim %d, x %v, index %v, out %v: dim 0 of contiguous operands expected", dim, a.dims, idx.dims, o.dims)
	}
	run := func([]byte) error {
		for i := int64(0); i < idx.dims[0]; i++ {
			r := int64(idx.get(idx.offset + i*idx.strides[0]))
			if r < 0 || r >= a.dims[0] {
				return hostErr(acl.ACL, 507015, "aclnnIndexSelect", "index %d outside [0, %d)", r, a.dims[0])
			}
			for j := int64(0); j < w; j++ {
				o.put(o.offset+i*w+j, a.get(a.offset+r*w+j))
			}
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnIndexSelect", run: run}, nil
}

func (d *hostDriver) indexCopy(x tensorDesc, dim int, index, source tensorDesc) (prepared, error) {
	api := "aclnnInplaceIndexCopyGetWorkspaceSize"
	ts, err := operands(api, x, index, source)
	if err != nil {
		return nil, err
	}
	a, idx, src := ts[0], ts[1], ts[2]
	w, ok1 := a.contiguousRows()
	_, ok2 := src.contiguousRows()
	if dim != 0 || !ok1 || !ok2 || len(idx.dims) != 1 || idx.dt != acl.Int32 || src.dt != a.dt ||
		src.dims[0] != idx.dims[0] || src.count() != idx.dims[0]*w {
		return nil, hostErr(acl.ACLNN, 161002, api, "dim %d, x %v, index %v, source %v: dim 0 of contiguous operands expected", dim, a.dims, idx.dims, src.dims)
	}
	run := func([]byte) error {
		for i := int64(0); i < idx.dims[0]; i++ {
			r := int64(idx.get(idx.offset + i*idx.strides[0]))
			if r < 0 || r >= a.dims[0] {
				return hostErr(acl.ACL, 507015, "aclnnInplaceIndexCopy", "index %d outside [0, %d)", r, a.dims[0])
			}
			for j := int64(0); j < w; j++ {
				a.put(a.offset+r*w+j, src.get(src.offset+i*w+j))
			}
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnInplaceIndexCopy", run: run}, nil
}

func (d *hostDriver) indexAdd(x tensorDesc, dim int, index, source tensorDesc, alpha scalar, out tensorDesc) (prepared, error) {
	api := "aclnnIndexAddGetWorkspaceSize"
	ts, err := operands(api, x, index, source, out)
	if err != nil {
		return nil, err
	}
	a, idx, src, o := ts[0], ts[1], ts[2], ts[3]
	w, ok1 := a.contiguousRows()
	_, ok2 := src.contiguousRows()
	_, ok3 := o.contiguousRows()
	if dim != 0 || !ok1 || !ok2 || !ok3 || len(idx.dims) != 1 || idx.dt != acl.Int32 || o.count() != a.count() ||
		src.dims[0] != idx.dims[0] || src.count() != idx.dims[0]*w {
		return nil, hostErr(acl.ACLNN, 161002, api, "dim %d, x %v, index %v, source %v, out %v: dim 0 of contiguous operands expected", dim, a.dims, idx.dims, src.dims, o.dims)
	}
	al := alpha.(*hostScalar).v
	run := func([]byte) error {
		for j := int64(0); j < a.count(); j++ {
			o.put(o.offset+j, a.get(a.offset+j))
		}
		for i := int64(0); i < idx.dims[0]; i++ {
			r := int64(idx.get(idx.offset + i*idx.strides[0]))
			if r < 0 || r >= a.dims[0] {
				return hostErr(acl.ACL, 507015, "aclnnIndexAdd", "index %d outside [0, %d)", r, a.dims[0])
			}
			for j := int64(0); j < w; j++ {
				o.put(o.offset+r*w+j, o.get(o.offset+r*w+j)+al*src.get(src.offset+i*w+j))
			}
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnIndexAdd", run: run}, nil
}

// hostBetter ranks a at ia before b at ib: larger first, ties to the
// lower index.
func hostBetter(a float32, ia int, b float32, ib int) bool { return a > b || (a == b && ia < ib) }

// hostTopK writes the indices of the k best unmasked entries of x to out.
func hostTopK(x []float32, masked []bool, k int, out []int) {
	taken := make([]bool, len(x))
	for j := range k {
		best := -1
		for i, v := range x {
			if taken[i] || (masked != nil && masked[i]) {
				continue
			}
			if best < 0 || hostBetter(v, i, x[best], best) {
				best = i
			}
		}
		out[j] = best
		if best >= 0 {
			taken[best] = true
		}
	}
}

func (d *hostDriver) moeGating(x, bias tensorDesc, k, kGroup, groups int, renorm bool, scale float64, y, idx tensorDesc) (prepared, error) {
	api := "aclnnMoeGatingTopKGetWorkspaceSize"
	all := []tensorDesc{x, y, idx}
	if bias != nil {
		all = append(all, bias)
	}
	ts, err := operands(api, all...)
	if err != nil {
		return nil, err
	}
	tx, ty, ti := ts[0], ts[1], ts[2]
	var tb *hostTensor
	if bias != nil {
		tb = ts[3]
	}
	G, KG := max(groups, 1), max(kGroup, 1)
	if len(tx.dims) != 2 || len(ty.dims) != 2 || len(ti.dims) != 2 || ti.dt != acl.Int32 {
		return nil, hostErr(acl.ACLNN, 161002, api, "x %v, y %v, expertIdx %v", tx.dims, ty.dims, ti.dims)
	}
	T, E := int(tx.dims[0]), int(tx.dims[1])
	if int(ty.dims[0]) != T || int(ti.dims[0]) != T || int(ty.dims[1]) != k || int(ti.dims[1]) != k || k < 1 || k > E ||
		E%G != 0 || KG > G || (G > 1 && E/G < 2) || k > KG*(E/G) || (tb != nil && (len(tb.dims) != 1 || int(tb.dims[0]) != E)) {
		return nil, hostErr(acl.ACLNN, 161002, api, "x %v, k %d, %d groups keeping %d", tx.dims, k, G, KG)
	}
	run := func([]byte) error {
		score, sel, gs := make([]float32, E), make([]float32, E), make([]float32, G)
		masked, pick, two := make([]bool, E), make([]int, max(E, G)), make([]int, 2)
		for t := range T {
			for i := range E {
				l := tx.get(tx.offset + int64(t)*tx.strides[0] + int64(i)*tx.strides[1])
				score[i] = float32(1 / (1 + math.Exp(-l)))
				sel[i] = score[i]
				if tb != nil {
					sel[i] += float32(tb.get(tb.offset + int64(i)*tb.strides[0]))
				}
			}
			clear(masked)
			if G > 1 {
				per := E / G
				for g := range G {
					hostTopK(sel[g*per:(g+1)*per], nil, 2, two)
					gs[g] = sel[g*per+two[0]] + sel[g*per+two[1]]
				}
				hostTopK(gs, nil, KG, pick)
				for g := range G {
					keep := false
					for _, p := range pick[:KG] {
						keep = keep || p == g
					}
					if !keep {
						for i := g * per; i < (g+1)*per; i++ {
							masked[i] = true
						}
					}
				}
			}
			hostTopK(sel, masked, k, pick)
			var total float64
			for _, p := range pick[:k] {
				total += float64(score[p])
			}
			sc := scale
			if renorm {
				sc /= total + 1e-20
			}
			for j, p := range pick[:k] {
				ti.put(ti.offset+int64(t)*ti.strides[0]+int64(j)*ti.strides[1], float64(p))
				ty.put(ty.offset+int64(t)*ty.strides[0]+int64(j)*ty.strides[1], float64(score[p])*sc)
			}
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnMoeGatingTopK", run: run}, nil
}

func (d *hostDriver) amax(x, out tensorDesc) (prepared, error) {
	api := "aclnnAmaxGetWorkspaceSize"
	ts, err := operands(api, x, out)
	if err != nil {
		return nil, err
	}
	a, o := ts[0], ts[1]
	if len(a.dims) != 2 || len(o.dims) != 2 || o.dims[0] != a.dims[0] || o.dims[1] != 1 || a.dims[1] < 1 {
		return nil, hostErr(acl.ACLNN, 161002, api, "x %v, out %v: want [rows, n] into [rows, 1]", a.dims, o.dims)
	}
	run := func([]byte) error {
		for r := int64(0); r < a.dims[0]; r++ {
			m := math.Inf(-1)
			for i := int64(0); i < a.dims[1]; i++ {
				if v := a.get(a.offset + r*a.strides[0] + i*a.strides[1]); v > m || math.IsNaN(v) {
					m = v
				}
			}
			o.put(o.offset+r*o.strides[0], m)
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnAmax", run: run}, nil
}

func (d *hostDriver) topk(x tensorDesc, k, dim int, values, indices tensorDesc) (prepared, error) {
	api := "aclnnTopkGetWorkspaceSize"
	ts, err := operands(api, x, values, indices)
	if err != nil {
		return nil, err
	}
	a, v, ix := ts[0], ts[1], ts[2]
	if len(a.dims) != 2 || (dim != 1 && dim != -1) || ix.dt != acl.Int64 || len(v.dims) != 2 || len(ix.dims) != 2 ||
		v.dims[0] != a.dims[0] || ix.dims[0] != a.dims[0] || int(v.dims[1]) != k || int(ix.dims[1]) != k || k < 1 || int64(k) > a.dims[1] {
		return nil, hostErr(acl.ACLNN, 161002, api, "x %v, k %d, dim %d, values %v, int64 indices %v", a.dims, k, dim, v.dims, ix.dims)
	}
	run := func([]byte) error {
		R, N := a.dims[0], a.dims[1]
		taken := make([]bool, N)
		for r := int64(0); r < R; r++ {
			clear(taken)
			for j := int64(0); j < int64(k); j++ {
				best, bv := int64(-1), 0.0
				for i := int64(0); i < N; i++ {
					if taken[i] {
						continue
					}
					if xi := a.get(a.offset + r*a.strides[0] + i*a.strides[1]); best < 0 || xi > bv {
						best, bv = i, xi
					}
				}
				taken[best] = true
				v.put(v.offset+r*v.strides[0]+j*v.strides[1], bv)
				ix.put(ix.offset+r*ix.strides[0]+j*ix.strides[1], float64(best))
			}
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnTopk", run: run}, nil
}

func (d *hostDriver) moeInitRouting(x, idx tensorDesc, experts int, expandedX, rowIdx, cumsum tensorDesc) (prepared, error) {
	api := "aclnnMoeInitRoutingV2GetWorkspaceSize"
	ts, err := operands(api, x, idx, expandedX, rowIdx, cumsum)
	if err != nil {
		return nil, err
	}
	a, ix, ex, ri, cs := ts[0], ts[1], ts[2], ts[3], ts[4]
	if len(a.dims) != 2 || len(ix.dims) != 2 || ix.dt != acl.Int32 || ix.dims[0] != a.dims[0] || len(ex.dims) != 2 ||
		ex.dims[0] != ix.dims[0]*ix.dims[1] || ex.dims[1] != a.dims[1] || ex.dt != a.dt || len(ri.dims) != 1 ||
		ri.dt != acl.Int32 || ri.dims[0] != ex.dims[0] || len(cs.dims) != 1 || cs.dt != acl.Int32 || cs.dims[0] != int64(experts) || experts <= 0 {
		return nil, hostErr(acl.ACLNN, 161002, api, "x %v, expertIdx %v, expandedX %v, expandedRowIdx %v, cumsum %v for %d experts",
			a.dims, ix.dims, ex.dims, ri.dims, cs.dims, experts)
	}
	T, K, H, E := ix.dims[0], ix.dims[1], a.dims[1], int64(experts)
	expert := func(p int64) int64 { return int64(ix.get(ix.offset + p/K*ix.strides[0] + p%K*ix.strides[1])) }
	run := func([]byte) error {
		next := make([]int64, E+1)
		for p := range T * K {
			v := expert(p)
			if v < 0 || v >= E {
				return hostErr(acl.ACL, 507015, "aclnnMoeInitRoutingV2", "expert %d outside [0, %d)", v, E)
			}
			next[v+1]++
		}
		for v := range E {
			next[v+1] += next[v]
			cs.put(cs.offset+v*cs.strides[0], float64(next[v+1]))
		}
		for p := range T * K {
			v := expert(p)
			i := next[v]
			next[v]++
			ri.put(ri.offset+p*ri.strides[0], float64(i))
			for h := range H {
				ex.put(ex.offset+i*ex.strides[0]+h*ex.strides[1], a.get(a.offset+p/K*a.strides[0]+h*a.strides[1]))
			}
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnMoeInitRoutingV2", run: run}, nil
}

func (d *hostDriver) groupedMatmul(x, w, groupList, out tensorDesc) (prepared, error) {
	api := "aclnnGroupedMatmulV4GetWorkspaceSize"
	ts, err := operands(api, x, w, groupList, out)
	if err != nil {
		return nil, err
	}
	a, b, gl, o := ts[0], ts[1], ts[2], ts[3]
	if len(a.dims) != 2 || len(b.dims) != 3 || len(o.dims) != 2 || a.dims[1] != b.dims[1] || o.dims[0] != a.dims[0] ||
		o.dims[1] != b.dims[2] || len(gl.dims) != 1 || gl.dt != acl.Int64 || gl.dims[0] != b.dims[0] || b.dims[0] > 1024 ||
		a.nz != nil || o.nz != nil || o.dt != a.dt {
		return nil, hostErr(acl.ACLNN, 161002, api, "x %v, weight %v, groupList %v, out %v: x [M, K], weight [G, K, N], out [M, N], int64 groupList [G ≤ 1024] expected",
			a.dims, b.dims, gl.dims, o.dims)
	}
	M, K, G, N := a.dims[0], a.dims[1], b.dims[0], b.dims[2]
	run := func(ws []byte) error {
		acc := unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(ws))), N)
		lo := int64(0)
		for g := range G {
			hi := int64(gl.get(gl.offset + g*gl.strides[0]))
			if hi < lo || hi > M {
				return hostErr(acl.ACL, 507015, "aclnnGroupedMatmulV4", "group %d ends at row %d after %d (x has %d rows)", g, hi, lo, M)
			}
			for m := lo; m < hi; m++ {
				for n := range N {
					var s float64
					for k := range K {
						s += a.get(a.offset+m*a.strides[0]+k*a.strides[1]) * b.get(b.offset+g*b.strides[0]+k*b.strides[1]+n*b.strides[2])
					}
					acc[n] = float32(s)
				}
				for n := range N {
					o.put(o.offset+m*o.strides[0]+n*o.strides[1], float64(acc[n]))
				}
			}
			lo = hi
		}
		if lo != M {
			return hostErr(acl.ACL, 507015, "aclnnGroupedMatmulV4", "the groups cover %d of x's %d rows", lo, M)
		}
		return nil
	}
	return &hostOp{d: d, api: "aclnnGroupedMatmulV4", ws: int(N) * 4, run: run}, nil
}
