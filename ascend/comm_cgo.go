//go:build ascend && cgo

package ascend

import (
	"context"
	"fmt"
	"sync"

	"k3/ascend/internal/acl"
	"k3/comm"
	"k3/compute"
)

// RootInfo bootstraps an HCCL group: NewRootInfo makes it on one rank, and
// its bytes reach the other ranks out of band (the same process, or any
// channel between processes).
type RootInfo = acl.RootInfo

// NewRootInfo makes the bootstrap blob of a new group on b's device.
func NewRootInfo(b *Backend) (RootInfo, error) {
	b.lock()
	defer b.mu.Unlock()
	ctx, _, err := b.aclParts()
	if err != nil {
		return RootInfo{}, err
	}
	return ctx.NewRootInfo()
}

// Comm is comm.Communicator over HCCL, for a rank computing on an Ascend
// Backend. Each collective is queued on the backend's stream after the
// work before it and the call returns once it has run. A collective
// cannot be abandoned half way: ctx is checked before it is queued.
type Comm struct {
	b *Backend
	m *acl.Comm
	s *acl.Stream // b's

	mu    sync.Mutex
	stats comm.Stats
}

var _ comm.Communicator = (*Comm)(nil)

// NewComm joins b as rank of a group of size ranks. Every rank calls it
// with the same root; like HCCL's own initialisation it may wait for the
// others.
func NewComm(b *Backend, size, rank int, root RootInfo) (*Comm, error) {
	b.lock()
	defer b.mu.Unlock()
	ctx, s, err := b.aclParts()
	if err != nil {
		return nil, err
	}
	m, err := ctx.NewComm(size, rank, &root)
	if err != nil {
		return nil, err
	}
	return &Comm{b: b, m: m, s: s}, nil
}

// Close releases the communicator.
func (c *Comm) Close() error {
	c.b.lock()
	defer c.b.mu.Unlock()
	return c.m.Destroy()
}

// Rank implements comm.Communicator.
func (c *Comm) Rank() int { return c.m.Rank }

// Size implements comm.Communicator.
func (c *Comm) Size() int { return c.m.Size }

// Stats implements comm.Communicator, with comm.Local's accounting (the
// bytes a ring algorithm sends).
func (c *Comm) Stats() comm.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

func (c *Comm) count(op comm.Op, bytes int) {
	c.mu.Lock()
	c.stats.Calls[op]++
	c.stats.Bytes[op] += int64(bytes)
	c.mu.Unlock()
}

// do queues one collective through queue, with the addresses of ts, and
// waits for the stream.
func (c *Comm) do(ctx context.Context, op comm.Op, queue func(ps []acl.DevPtr) error, ts ...compute.Tensor) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("ascend: %v: %w", op, err)
	}
	c.b.lock()
	defer c.b.mu.Unlock()
	ps := make([]acl.DevPtr, len(ts))
	for i, t := range ts {
		if t.DType != compute.F32 {
			return fmt.Errorf("%w: %v of %v (collectives move f32)", compute.ErrShape, op, t)
		}
		var err error
		if ps[i], err = c.b.addr(t); err != nil {
			return err
		}
	}
	if err := queue(ps); err != nil {
		return fmt.Errorf("ascend: %v: %w", op, err)
	}
	if err := c.b.s.Sync(); err != nil {
		return fmt.Errorf("ascend: %v: %w", op, err)
	}
	return nil
}

// AllReduce implements comm.Communicator, in place.
func (c *Comm) AllReduce(ctx context.Context, t compute.Tensor) error {
	n := t.Len()
	err := c.do(ctx, comm.OpAllReduce, func(p []acl.DevPtr) error { return c.m.AllReduce(c.s, p[0], p[0], n) }, t)
	if err == nil {
		c.count(comm.OpAllReduce, 4*2*(c.Size()-1)*n/c.Size())
	}
	return err
}

// AllGather implements comm.Communicator.
func (c *Comm) AllGather(ctx context.Context, dst, src compute.Tensor) error {
	n := src.Len()
	if dst.Len() != c.Size()*n {
		return fmt.Errorf("%w: all-gather of %v into %v over %d ranks", compute.ErrShape, src, dst, c.Size())
	}
	err := c.do(ctx, comm.OpAllGather, func(p []acl.DevPtr) error { return c.m.AllGather(c.s, p[0], p[1], n) }, src, dst)
	if err == nil {
		c.count(comm.OpAllGather, 4*(c.Size()-1)*n)
	}
	return err
}

// ReduceScatter implements comm.Communicator.
func (c *Comm) ReduceScatter(ctx context.Context, dst, src compute.Tensor) error {
	m := dst.Len()
	if src.Len() != c.Size()*m {
		return fmt.Errorf("%w: reduce-scatter of %v into %v over %d ranks", compute.ErrShape, src, dst, c.Size())
	}
	err := c.do(ctx, comm.OpReduceScatter, func(p []acl.DevPtr) error { return c.m.ReduceScatter(c.s, p[0], p[1], m) }, src, dst)
	if err == nil {
		c.count(comm.OpReduceScatter, 4*(c.Size()-1)*m)
	}
	return err
}

// displs turns counts into HCCL's count and displacement arrays, checking
// they fit in n elements.
func displs(counts []int, n, size int, what string) (cs, ds []uint64, total int, err error) {
	if len(counts) != size {
		return nil, nil, 0, fmt.Errorf("%w: %d %s counts for %d ranks", compute.ErrShape, len(counts), what, size)
	}
	cs, ds = make([]uint64, size), make([]uint64, size)
	for j, k := range counts {
		if k < 0 {
			return nil, nil, 0, fmt.Errorf("%w: %s count %d for rank %d", compute.ErrShape, what, k, j)
		}
		cs[j], ds[j] = uint64(k), uint64(total)
		total += k
	}
	if total > n {
		return nil, nil, 0, fmt.Errorf("%w: %s counts total %d, the tensor holds %d", compute.ErrShape, what, total, n)
	}
	return cs, ds, total, nil
}

// AllToAllV implements comm.Communicator.
func (c *Comm) AllToAllV(ctx context.Context, dst compute.Tensor, recv []int, src compute.Tensor, send []int) error {
	sc, sd, ns, err := displs(send, src.Len(), c.Size(), "send")
	if err != nil {
		return err
	}
	rc, rd, _, err := displs(recv, dst.Len(), c.Size(), "recv")
	if err != nil {
		return err
	}
	err = c.do(ctx, comm.OpAllToAllV, func(p []acl.DevPtr) error { return c.m.AllToAllV(c.s, p[0], sc, sd, p[1], rc, rd) }, src, dst)
	if err == nil {
		c.count(comm.OpAllToAllV, 4*(ns-send[c.Rank()]))
	}
	return err
}

// Send implements comm.Communicator.
func (c *Comm) Send(ctx context.Context, t compute.Tensor, to int) error {
	if to < 0 || to >= c.Size() || to == c.Rank() {
		return fmt.Errorf("%w: send from rank %d to %d of %d", compute.ErrShape, c.Rank(), to, c.Size())
	}
	err := c.do(ctx, comm.OpSend, func(p []acl.DevPtr) error { return c.m.Send(c.s, p[0], t.Len(), to) }, t)
	if err == nil {
		c.count(comm.OpSend, 4*t.Len())
	}
	return err
}

// Recv implements comm.Communicator.
func (c *Comm) Recv(ctx context.Context, t compute.Tensor, from int) error {
	if from < 0 || from >= c.Size() || from == c.Rank() {
		return fmt.Errorf("%w: recv at rank %d from %d of %d", compute.ErrShape, c.Rank(), from, c.Size())
	}
	err := c.do(ctx, comm.OpRecv, func(p []acl.DevPtr) error { return c.m.Recv(c.s, p[0], t.Len(), from) }, t)
	if err == nil {
		c.count(comm.OpRecv, 0)
	}
	return err
}

// Barrier implements comm.Communicator.
func (c *Comm) Barrier(ctx context.Context) error {
	err := c.do(ctx, comm.OpBarrier, func([]acl.DevPtr) error { return c.m.Barrier(c.s) })
	if err == nil {
		c.count(comm.OpBarrier, 0)
	}
	return err
}
