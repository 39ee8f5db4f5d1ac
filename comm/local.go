package comm

import (
	"context"
	"fmt"
	"sync"

	"k3/compute"
)

// Local is one rank of a group whose ranks are goroutines of one process,
// each computing on its own backend. A collective copies each rank's
// tensor to host memory the group shares, meets the other ranks there,
// and writes the rank's result back: two rendezvous per collective, no
// allocation once the buffers have grown to the largest tensor.
//
// A rank calls one collective at a time (as a device rank issues them on
// one stream). A cancelled context or a mismatched call inside a
// collective aborts the group: every waiting and later call fails with
// ErrAborted, since the other ranks could never complete theirs.
type Local struct {
	g    *group
	rank int
	b    compute.Backend
	dep  []float32 // what this rank deposits for the others to read
	res  []float32 // this rank's result before it goes to the backend
	wake chan struct{}

	statsMu sync.Mutex
	stats   Stats
}

// group is the state the ranks of a Local group share.
type group struct {
	n       int
	ranks   []*Local
	mu      sync.Mutex
	arrived int
	slots   []slot
	err     error              // why the group aborted
	aborted chan struct{}      // closed on abort
	mail    [][]chan []float32 // [from][to]: Send's buffers in flight
	free    [][]chan []float32 // [from][to]: buffers Recv gave back
}

// slot is what a rank brought to the current collective.
type slot struct {
	op    Op
	n     int       // elements of its tensor (src)
	out   int       // elements of its result tensor
	buf   []float32 // its deposited elements
	count []int     // AllToAllV: send counts, then recv counts
}

// NewLocal makes a group of len(backends) ranks; rank i computes on
// backends[i] (one backend may serve several ranks).
func NewLocal(backends []compute.Backend) ([]*Local, error) {
	n := len(backends)
	if n == 0 {
		return nil, fmt.Errorf("comm: a group needs at least one rank")
	}
	g := &group{n: n, slots: make([]slot, n), aborted: make(chan struct{})}
	g.mail, g.free = make([][]chan []float32, n), make([][]chan []float32, n)
	for i := range n {
		if backends[i] == nil {
			return nil, fmt.Errorf("comm: rank %d has no backend", i)
		}
		g.mail[i], g.free[i] = make([]chan []float32, n), make([]chan []float32, n)
		for j := range n {
			g.mail[i][j], g.free[i][j] = make(chan []float32, 1), make(chan []float32, 1)
		}
		g.ranks = append(g.ranks, &Local{g: g, rank: i, b: backends[i], wake: make(chan struct{}, 1)})
	}
	return g.ranks, nil
}

// Rank is this rank's index.
func (l *Local) Rank() int { return l.rank }

// Size is the group's number of ranks.
func (l *Local) Size() int { return l.g.n }

// Stats reports this rank's collectives so far.
func (l *Local) Stats() Stats {
	l.statsMu.Lock()
	defer l.statsMu.Unlock()
	return l.stats
}

func (l *Local) count(op Op, bytes int64) {
	l.statsMu.Lock()
	l.stats.Calls[op]++
	l.stats.Bytes[op] += bytes
	l.statsMu.Unlock()
}

// Abort fails every rank's current and later collectives with ErrAborted
// wrapping err: for a rank that stops calling collectives for a reason
// of its own, so that the others do not wait for it.
func (l *Local) Abort(err error) { l.g.abort(err) }

func (g *group) abort(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.abortLocked(err)
}

func (g *group) abortLocked(err error) {
	if g.err != nil {
		return
	}
	g.err = fmt.Errorf("%w: %w", ErrAborted, err)
	close(g.aborted)
}

// meet waits until every rank has arrived; the last to arrive runs check
// (under the group's lock) and wakes the others. A failed check or a
// cancelled wait aborts the group.
func (l *Local) meet(ctx context.Context, check func() error) error {
	g := l.g
	g.mu.Lock()
	if g.err != nil {
		err := g.err
		g.mu.Unlock()
		return err
	}
	g.arrived++
	if g.arrived == g.n {
		g.arrived = 0
		if check != nil {
			if err := check(); err != nil {
				g.abortLocked(err)
			}
		}
		err := g.err
		for _, r := range g.ranks {
			if r != l {
				r.wake <- struct{}{}
			}
		}
		g.mu.Unlock()
		return err
	}
	g.mu.Unlock()
	select {
	case <-l.wake:
		g.mu.Lock()
		err := g.err
		g.mu.Unlock()
		return err
	case <-g.aborted:
		return g.abortErr()
	case <-ctx.Done():
		g.abort(fmt.Errorf("rank %d: %w", l.rank, ctx.Err()))
		return g.abortErr()
	}
}

func (g *group) abortErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// deposit copies t to the rank's shared buffer and records the call.
func (l *Local) deposit(op Op, t compute.Tensor, out int, counts ...[]int) error {
	if err := checkF32(op, t); err != nil {
		return err
	}
	n := 0
	if !t.IsZero() {
		n = t.Len()
	}
	l.dep = grow(l.dep, n)
	if n > 0 {
		if err := l.b.Read(&l.dep, t); err != nil {
			return fmt.Errorf("comm: %v: rank %d: %w", op, l.rank, err)
		}
	}
	s := &l.g.slots[l.rank]
	s.op, s.n, s.out, s.buf = op, n, out, l.dep
	s.count = s.count[:0]
	for _, c := range counts {
		s.count = append(s.count, c...)
	}
	return nil
}

// finish writes the rank's result into t (a view of its first len(l.res)
// elements) and waits until every rank has read the deposits.
func (l *Local) finish(ctx context.Context, op Op, t compute.Tensor) error {
	var werr error
	if len(l.res) > 0 {
		v := t.Reshape(t.Len()).Rows(0, len(l.res))
		werr = l.b.Write(v, &l.res)
	}
	// Meet even after a failed write: the others wait for this rank.
	if err := l.meet(ctx, nil); err != nil {
		return err
	}
	if werr != nil {
		return fmt.Errorf("comm: %v: rank %d: %w", op, l.rank, werr)
	}
	return nil
}

func checkF32(op Op, t compute.Tensor) error {
	if !t.IsZero() && t.DType != compute.F32 {
		return fmt.Errorf("comm: %v of %v: %w: want F32", op, t, compute.ErrUnsupported)
	}
	return nil
}

func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// sameOp checks that every rank called op; with equalN, on tensors of
// one size.
func (g *group) sameOp(op Op, equalN bool) error {
	for i, s := range g.slots {
		if s.op != g.slots[0].op {
			return fmt.Errorf("%w: rank 0 called %v, rank %d %v", ErrMismatch, g.slots[0].op, i, s.op)
		}
		if equalN && s.n != g.slots[0].n {
			return fmt.Errorf("%w: %v of %d elements on rank 0, %d on rank %d", ErrMismatch, op, g.slots[0].n, s.n, i)
		}
	}
	return nil
}

// AllReduce sums t over the ranks, adding in rank order on every rank.
func (l *Local) AllReduce(ctx context.Context, t compute.Tensor) error {
	if err := l.deposit(OpAllReduce, t, t.Len()); err != nil {
		return err
	}
	g := l.g
	if err := l.meet(ctx, func() error { return g.sameOp(OpAllReduce, true) }); err != nil {
		return err
	}
	n := len(l.dep)
	l.res = grow(l.res, n)
	copy(l.res, g.slots[0].buf)
	for _, s := range g.slots[1:] {
		for i, v := range s.buf[:n] {
			l.res[i] += v
		}
	}
	l.count(OpAllReduce, int64(4*2*(g.n-1)*n/g.n))
	return l.finish(ctx, OpAllReduce, t)
}

// AllGather concatenates every rank's src into dst in rank order.
func (l *Local) AllGather(ctx context.Context, dst, src compute.Tensor) error {
	if err := l.deposit(OpAllGather, src, dst.Len()); err != nil {
		return err
	}
	g := l.g
	check := func() error {
		if err := g.sameOp(OpAllGather, true); err != nil {
			return err
		}
		for i, s := range g.slots {
			if s.out != g.n*s.n {
				return fmt.Errorf("%w: all-gather into %d elements on rank %d, want %d×%d", ErrMismatch, s.out, i, g.n, s.n)
			}
		}
		return nil
	}
	if err := l.meet(ctx, check); err != nil {
		return err
	}
	n := len(l.dep)
	l.res = grow(l.res, g.n*n)
	for i, s := range g.slots {
		copy(l.res[i*n:], s.buf[:n])
	}
	l.count(OpAllGather, int64(4*(g.n-1)*n))
	return l.finish(ctx, OpAllGather, dst)
}

// ReduceScatter gives rank r block r of the sum of every rank's src.
func (l *Local) ReduceScatter(ctx context.Context, dst, src compute.Tensor) error {
	if err := l.deposit(OpReduceScatter, src, dst.Len()); err != nil {
		return err
	}
	g := l.g
	check := func() error {
		if err := g.sameOp(OpReduceScatter, true); err != nil {
			return err
		}
		for i, s := range g.slots {
			if s.n != g.n*s.out {
				return fmt.Errorf("%w: reduce-scatter of %d elements into %d on rank %d, want %d×%d", ErrMismatch, s.n, s.out, i, g.n, s.out)
			}
		}
		return nil
	}
	if err := l.meet(ctx, check); err != nil {
		return err
	}
	m := len(l.dep) / g.n
	lo := l.rank * m
	l.res = grow(l.res, m)
	copy(l.res, g.slots[0].buf[lo:lo+m])
	for _, s := range g.slots[1:] {
		for i, v := range s.buf[lo : lo+m] {
			l.res[i] += v
		}
	}
	l.count(OpReduceScatter, int64(4*(g.n-1)*m))
	return l.finish(ctx, OpReduceScatter, dst)
}

// AllToAllV exchanges blocks of src and dst between every pair of ranks.
func (l *Local) AllToAllV(ctx context.Context, dst compute.Tensor, recv []int, src compute.Tensor, send []int) error {
	g := l.g
	if len(send) != g.n || len(recv) != g.n {
		err := fmt.Errorf("%w: all-to-all-v with %d send and %d recv counts on rank %d of %d", ErrMismatch, len(send), len(recv), l.rank, g.n)
		g.abort(err)
		return err
	}
	var ns, nr int
	for j := range g.n {
		if send[j] < 0 || recv[j] < 0 {
			err := fmt.Errorf("%w: negative all-to-all-v count on rank %d", ErrMismatch, l.rank)
			g.abort(err)
			return err
		}
		ns += send[j]
		nr += recv[j]
	}
	srcLen, dstLen := 0, 0
	if !src.IsZero() {
		srcLen = src.Len()
	}
	if !dst.IsZero() {
		dstLen = dst.Len()
	}
	if ns > srcLen || nr > dstLen {
		err := fmt.Errorf("%w: all-to-all-v sends %d of %d elements and receives %d into %d on rank %d", ErrMismatch, ns, srcLen, nr, dstLen, l.rank)
		g.abort(err)
		return err
	}
	if ns < srcLen && ns > 0 {
		src = src.Reshape(srcLen).Rows(0, ns)
	} else if ns == 0 {
		src = compute.Tensor{}
	}
	if err := l.deposit(OpAllToAllV, src, nr, send, recv); err != nil {
		return err
	}
	check := func() error {
		if err := g.sameOp(OpAllToAllV, false); err != nil {
			return err
		}
		for i, s := range g.slots {
			for j, o := range g.slots {
				if s.count[j] != o.count[g.n+i] {
					return fmt.Errorf("%w: all-to-all-v: rank %d sends %d elements to rank %d, which expects %d", ErrMismatch, i, s.count[j], j, o.count[g.n+i])
				}
			}
		}
		return nil
	}
	if err := l.meet(ctx, check); err != nil {
		return err
	}
	l.res = grow(l.res, nr)
	at := 0
	for _, s := range g.slots {
		off := 0
		for k := range l.rank {
			off += s.count[k]
		}
		at += copy(l.res[at:], s.buf[off:off+s.count[l.rank]])
	}
	l.count(OpAllToAllV, int64(4*(ns-send[l.rank])))
	return l.finish(ctx, OpAllToAllV, dst)
}

// Send hands t's elements to rank to; it returns once they are copied
// out of t (a rank may send to itself, for a uniform loop, before it
// receives).
func (l *Local) Send(ctx context.Context, t compute.Tensor, to int) error {
	g := l.g
	if to < 0 || to >= g.n {
		return fmt.Errorf("comm: send to rank %d of a group of %d", to, g.n)
	}
	if err := checkF32(OpSend, t); err != nil {
		return err
	}
	var buf []float32
	select {
	case buf = <-g.free[l.rank][to]:
	default:
	}
	buf = grow(buf, t.Len())
	if err := l.b.Read(&buf, t); err != nil {
		return fmt.Errorf("comm: send: rank %d: %w", l.rank, err)
	}
	select {
	case g.mail[l.rank][to] <- buf:
	case <-g.aborted:
		return g.abortErr()
	case <-ctx.Done():
		g.abort(fmt.Errorf("rank %d: send: %w", l.rank, ctx.Err()))
		return g.abortErr()
	}
	l.count(OpSend, int64(4*t.Len()))
	return nil
}

// Recv takes what rank from sent, which must be t's size.
func (l *Local) Recv(ctx context.Context, t compute.Tensor, from int) error {
	g := l.g
	if from < 0 || from >= g.n {
		return fmt.Errorf("comm: recv from rank %d of a group of %d", from, g.n)
	}
	if err := checkF32(OpRecv, t); err != nil {
		return err
	}
	var buf []float32
	select {
	case buf = <-g.mail[from][l.rank]:
	case <-g.aborted:
		return g.abortErr()
	case <-ctx.Done():
		g.abort(fmt.Errorf("rank %d: recv: %w", l.rank, ctx.Err()))
		return g.abortErr()
	}
	if len(buf) != t.Len() {
		err := fmt.Errorf("%w: rank %d sent %d elements, rank %d receives %d", ErrMismatch, from, len(buf), l.rank, t.Len())
		g.abort(err)
		return err
	}
	err := l.b.Write(t, &buf)
	select {
	case g.free[from][l.rank] <- buf:
	default:
	}
	if err != nil {
		return fmt.Errorf("comm: recv: rank %d: %w", l.rank, err)
	}
	l.count(OpRecv, 0)
	return nil
}

// Barrier waits for every rank.
func (l *Local) Barrier(ctx context.Context) error {
	l.g.slots[l.rank].op = OpBarrier
	g := l.g
	if err := l.meet(ctx, func() error { return g.sameOp(OpBarrier, false) }); err != nil {
		return err
	}
	l.count(OpBarrier, 0)
	return nil
}

var _ Communicator = (*Local)(nil)
