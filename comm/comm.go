// Package comm defines the collective operations that split one model
// over several ranks (tensor, expert and context parallelism), and Local,
// an implementation for ranks that are goroutines of one process.
//
// A Communicator is one rank's handle on its group. Every rank of a group
// calls the same collectives in the same order, each on tensors of its own
// backend; a call returns when the rank's part of the collective is done.
// The operations and their argument conventions are HCCL's (element
// counts, rank-major layouts), so that a device implementation is a thin
// binding.
package comm

import (
	"context"
	"errors"
	"fmt"

	"k3/compute"
)

// Communicator is one rank's view of a group of ranks. Tensors are F32
// and contiguous, on the backend the rank computes with.
type Communicator interface {
	// Rank is this rank's index in the group, in [0, Size).
	Rank() int
	// Size is the number of ranks in the group.
	Size() int

	// AllReduce replaces t on every rank by the elementwise sum of every
	// rank's t. Every rank gets bitwise the same sum.
	AllReduce(ctx context.Context, t compute.Tensor) error
	// AllGather writes every rank's src into dst, rank-major: dst holds
	// Size() times src's elements, rank r's at [r·n, (r+1)·n).
	AllGather(ctx context.Context, dst, src compute.Tensor) error
	// ReduceScatter sums every rank's src (Size() times dst's elements)
	// and gives rank r the block [r·n, (r+1)·n) of the sum in dst.
	ReduceScatter(ctx context.Context, dst, src compute.Tensor) error
	// AllToAllV sends send[j] elements of src, starting after the blocks
	// for ranks before j, to rank j, and receives recv[j] elements from
	// rank j into dst, packed in rank order. Counts are in elements; rank
	// j's send count for this rank must equal this rank's recv[j].
	AllToAllV(ctx context.Context, dst compute.Tensor, recv []int, src compute.Tensor, send []int) error
	// Send gives t's elements to rank to, which takes them with Recv.
	Send(ctx context.Context, t compute.Tensor, to int) error
	// Recv fills t with the elements rank from sent.
	Recv(ctx context.Context, t compute.Tensor, from int) error
	// Barrier returns once every rank has called it.
	Barrier(ctx context.Context) error

	// Stats reports what this rank's collectives moved so far.
	Stats() Stats
}

// Op names a collective, for Stats.
type Op int

// The collectives.
const (
	OpAllReduce Op = iota
	OpAllGather
	OpReduceScatter
	OpAllToAllV
	OpSend
	OpRecv
	OpBarrier
	numOps
)

var opNames = [numOps]string{"all-reduce", "all-gather", "reduce-scatter", "all-to-all-v", "send", "recv", "barrier"}

func (o Op) String() string {
	if o >= 0 && o < numOps {
		return opNames[o]
	}
	return fmt.Sprintf("comm.Op(%d)", int(o))
}

// Stats counts one rank's collectives and the bytes it sent in them, by
// the algorithm a device library runs for each (the figures a link
// carries, independent of how Local moves memory): a ring all-reduce sends
// 2(n-1)/n of the tensor, a ring all-gather (n-1) times the rank's part, a
// ring reduce-scatter (n-1) times the part it keeps, all-to-all-v and send
// what leaves the rank, recv and barrier nothing.
type Stats struct {
	Calls [numOps]int64
	Bytes [numOps]int64
}

// TotalBytes is the bytes sent over every collective.
func (s Stats) TotalBytes() int64 {
	var n int64
	for _, b := range s.Bytes {
		n += b
	}
	return n
}

// Sub returns s minus an earlier reading t.
func (s Stats) Sub(t Stats) Stats {
	for i := range s.Calls {
		s.Calls[i] -= t.Calls[i]
		s.Bytes[i] -= t.Bytes[i]
	}
	return s
}

// Add returns the sum of two readings (for instance of every rank).
func (s Stats) Add(t Stats) Stats {
	for i := range s.Calls {
		s.Calls[i] += t.Calls[i]
		s.Bytes[i] += t.Bytes[i]
	}
	return s
}

// ErrAborted is wrapped by the error of every collective on a group after
// one of its ranks failed inside a collective (a cancelled context, a
// mismatched call): the other ranks would otherwise wait forever.
var ErrAborted = errors.New("comm: group aborted")

// ErrMismatch is wrapped when the ranks of a group called different
// collectives, or the same one with sizes that do not fit together.
var ErrMismatch = errors.New("comm: ranks disagree")
