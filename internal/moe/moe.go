// Package moe implements the feed-forward sublayers of the Kimi and
// DeepSeek models on the compute seam: the dense gated MLP (SwiGLU or
// SiTU), and the mixture of experts with the sigmoid "noaux_tc" router,
// shared experts and Kimi K3's latent experts.
package moe

import (
	"fmt"

	"k3/compute"
)

// MLP is a gated feed-forward: down(act(gate(x)) * up(x)).
type MLP struct {
	Gate, Up, Down compute.Tensor // [I, D], [I, D], [D, I]
	Act            compute.Activation
}

// buffers are per-call scratch tensors sized for up to maxT tokens.
type buffers struct {
	maxT int
	b    compute.Backend
	list []compute.Tensor
	err  error
}

func (bf *buffers) alloc(dt compute.DType, dims ...int) compute.Tensor {
	if bf.err != nil {
		return compute.Tensor{}
	}
	t, err := bf.b.Alloc(dt, dims...)
	bf.err = err
	bf.list = append(bf.list, t)
	return t
}

// MLPRunner runs an MLP with preallocated intermediates.
type MLPRunner struct {
	m        *MLP
	b        compute.Backend
	gate, up compute.Tensor // [maxT, I]
}

// NewMLPRunner allocates intermediates for up to maxT tokens.
func NewMLPRunner(b compute.Backend, m *MLP, maxT int) (*MLPRunner, error) {
	if m.Gate.Rank != 2 || m.Up.Dims != m.Gate.Dims || m.Down.Rank != 2 || m.Down.Dims[1] != m.Gate.Dims[0] || m.Down.Dims[0] != m.Gate.Dims[1] {
		return nil, fmt.Errorf("moe: MLP weights gate %v up %v down %v disagree", m.Gate, m.Up, m.Down)
	}
	bf := buffers{b: b, maxT: maxT}
	r := &MLPRunner{m: m, b: b, gate: bf.alloc(compute.F32, maxT, m.Gate.Dims[0]), up: bf.alloc(compute.F32, maxT, m.Gate.Dims[0])}
	return r, bf.err
}

// Forward writes the MLP of x [T, D] to out [T, D].
func (r *MLPRunner) Forward(x, out compute.Tensor) error {
	t := x.Dim(0)
	if t > r.gate.Dims[0] {
		return fmt.Errorf("moe: %d tokens, runner sized for %d", t, r.gate.Dims[0])
	}
	g, u := r.gate.Rows(0, t), r.up.Rows(0, t)
	if err := r.b.MatMul(g, x, r.m.Gate); err != nil {
		return fmt.Errorf("moe: gate_proj: %w", err)
	}
	if err := r.b.MatMul(u, x, r.m.Up); err != nil {
		return fmt.Errorf("moe: up_proj: %w", err)
	}
	if err := r.b.GatedAct(r.m.Act, g, g, u); err != nil {
		return err
	}
	if err := r.b.MatMul(out, g, r.m.Down); err != nil {
		return fmt.Errorf("moe: down_proj: %w", err)
	}
	return nil
}

// Router holds the router configuration.
type Router struct {
	TopK, NumGroups, TopKGroup int
	Renormalize                bool
	Scale                      float32
}

// Weights are one MoE layer's tensors.
type Weights struct {
	Gate, Bias compute.Tensor   // [E, D], [E]
	W1, W3, W2 []compute.Tensor // per expert: [I, Din], [I, Din], [Din, I]
	Shared     *MLP             // nil: no shared experts
	// Latent MoE (K3): experts work at width Dlat between these projections.
	LatentDown, LatentNorm, LatentUp compute.Tensor // [Dlat, D], [Dlat] (may be zero), [D, Dlat]
	Act                              compute.Activation
	Eps                              float32 // of the latent norm
	// First is the router index of W1[0]: under expert parallelism W1, W3
	// and W2 hold the rank's experts [First, First+len(W1)) of the E the
	// router scores (0 and all E otherwise).
	First int
}

// Split makes a layer one rank of a parallel layout (see SetSplit).
type Split struct {
	// Reduce sums a tensor over every rank of the layout, in place, with
	// bitwise the same result on each.
	Reduce func(t compute.Tensor) error
	// Overlap runs the shared experts on a goroutine of their own beside
	// the routed part and its wait for the other ranks.
	Overlap bool
	// Dispatch, when set, moves tokens to experts instead (see Dispatch);
	// the layer then holds whole experts and whole shared experts.
	Dispatch *Dispatch
}

// Layer runs one MoE feed-forward with preallocated intermediates.
type Layer struct {
	w      *Weights
	r      Router
	b      compute.Backend
	shared *MLPRunner
	// side is the backend's side stream 1 (compute.Side), which runs the
	// shared experts on a device; b itself elsewhere.
	side   compute.Backend
	logits compute.Tensor // [maxT, E]
	idx    compute.Tensor // [maxT, k] I32
	wts    compute.Tensor // [maxT, k]
	lat    compute.Tensor // [maxT, Dlat]
	routed compute.Tensor // [maxT, Din]
	sh     compute.Tensor // [maxT, D]
	route  compute.RouteArgs
	exp    compute.ExpertArgs

	split   *Split
	disp    dispatchState
	lidx    compute.Tensor // [maxT, k] I32: the rank's expert of each slot, -1 elsewhere
	idxHost []int32
	idxView []int32 // idxHost's rows of a pass, passed by pointer (no allocation)
	// With Overlap, the shared experts' goroutine: its function, made
	// once, the pass's input and output, its result and its end.
	overlap     func()
	overlapX    compute.Tensor
	overlapOut  compute.Tensor
	overlapErr  error
	overlapDone chan struct{}
}

// NewLayer checks the weights and allocates intermediates for maxT tokens.
func NewLayer(b compute.Backend, w *Weights, r Router, maxT int) (*Layer, error) {
	if w.Gate.Rank != 2 {
		return nil, fmt.Errorf("moe: router gate %v is not [E, D]", w.Gate)
	}
	e, d := w.Gate.Dims[0], w.Gate.Dims[1]
	if r.TopK <= 0 || r.TopK > e {
		return nil, fmt.Errorf("moe: num_experts_per_token %d outside 1..%d", r.TopK, e)
	}
	if n := len(w.W1); w.First < 0 || w.First+n > e || len(w.W3) != n || len(w.W2) != n {
		return nil, fmt.Errorf("moe: %d experts in the router, %d/%d/%d expert weights from expert %d", e, len(w.W1), len(w.W3), len(w.W2), w.First)
	}
	din := d
	if !w.LatentDown.IsZero() {
		if w.LatentDown.Rank != 2 || w.LatentDown.Dims[1] != d || w.LatentUp.Rank != 2 || w.LatentUp.Dims[0] != d || w.LatentUp.Dims[1] != w.LatentDown.Dims[0] {
			return nil, fmt.Errorf("moe: latent projections down %v up %v for hidden %d", w.LatentDown, w.LatentUp, d)
		}
		din = w.LatentDown.Dims[0]
	}
	for i := range w.W1 {
		if w.W1[i].Rank != 2 || w.W1[i].Dims[1] != din {
			return nil, fmt.Errorf("moe: expert %d w1 %v does not take width %d", i, w.W1[i], din)
		}
	}
	l := &Layer{w: w, r: r, b: b}
	bf := buffers{b: b, maxT: maxT}
	l.logits = bf.alloc(compute.F32, maxT, e)
	l.idx = bf.alloc(compute.I32, maxT, r.TopK)
	l.wts = bf.alloc(compute.F32, maxT, r.TopK)
	l.routed = bf.alloc(compute.F32, maxT, din)
	l.sh = bf.alloc(compute.F32, maxT, d)
	// Latent projections are learned matrices, applied at any width, even
	// the hidden one; lat is the latent path's flag.
	if !w.LatentDown.IsZero() {
		l.lat = bf.alloc(compute.F32, maxT, din)
	}
	if bf.err != nil {
		return nil, bf.err
	}
	if w.Shared != nil {
		var err error
		if l.side, err = compute.Side(b, 1); err != nil {
			return nil, fmt.Errorf("moe: shared experts' stream: %w", err)
		}
		if l.shared, err = NewMLPRunner(l.side, w.Shared, maxT); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Routing returns the last Forward's expert indices [T, k] and weights.
func (l *Layer) Routing(t int) (idx, wts compute.Tensor) { return l.idx.Rows(0, t), l.wts.Rows(0, t) }

// Forward writes the MoE of x [T, D] to out [T, D]; routedOut and
// sharedOut, when not zero, receive the two parts (tests, conformance).
func (l *Layer) Forward(x, out, routedOut, sharedOut compute.Tensor) error {
	t := x.Dim(0)
	if t > l.logits.Dims[0] {
		return fmt.Errorf("moe: %d tokens, layer sized for %d", t, l.logits.Dims[0])
	}
	logits, idx, wts := l.logits.Rows(0, t), l.idx.Rows(0, t), l.wts.Rows(0, t)
	// On a backend with side streams the shared experts, which read x
	// alone, are queued first on their own stream and joined before their
	// sum: they run beside the router and the routed experts (whose host
	// read of the routing then waits for the main stream only).
	sharedAside := l.shared != nil && l.side != l.b && (l.split == nil || l.split.Dispatch == nil)
	if sharedAside {
		if err := l.forkShared(x, t); err != nil {
			return err
		}
	}
	if err := l.b.MatMul(logits, x, l.w.Gate); err != nil {
		return fmt.Errorf("moe: router gate: %w", err)
	}
	l.route = compute.RouteArgs{Logits: logits, Bias: l.w.Bias, TopK: l.r.TopK, NumGroups: l.r.NumGroups, TopKGroup: l.r.TopKGroup,
		Renormalize: l.r.Renormalize, Scale: l.r.Scale, Indices: idx, Weights: wts}
	if err := l.b.MoERoute(&l.route); err != nil {
		return fmt.Errorf("moe: router: %w", err)
	}
	if l.split != nil {
		if !routedOut.IsZero() || !sharedOut.IsZero() {
			return fmt.Errorf("moe: a split layer's routed and shared parts are partial sums: %w", compute.ErrUnsupported)
		}
		return l.forwardSplit(x, out, t, sharedAside)
	}
	if len(l.w.W1) != l.logits.Dims[1] {
		return fmt.Errorf("moe: %d of %d experts loaded, and the layer is not split", len(l.w.W1), l.logits.Dims[1])
	}
	in, routed := x, l.routed.Rows(0, t)
	if !l.lat.IsZero() {
		in = l.lat.Rows(0, t)
		if err := l.b.MatMul(in, x, l.w.LatentDown); err != nil {
			return fmt.Errorf("moe: routed_expert_down_proj: %w", err)
		}
	}
	l.exp = compute.ExpertArgs{X: in, Indices: idx, Weights: wts, W1: l.w.W1, W3: l.w.W3, W2: l.w.W2, Act: l.w.Act, Out: routed}
	if err := l.b.MoEExperts(&l.exp); err != nil {
		return fmt.Errorf("moe: experts: %w", err)
	}
	if !l.lat.IsZero() {
		if !l.w.LatentNorm.IsZero() {
			if err := l.b.RMSNorm(routed, routed, l.w.LatentNorm, l.w.Eps); err != nil {
				return fmt.Errorf("moe: routed_expert_norm: %w", err)
			}
		}
		if err := l.b.MatMul(out, routed, l.w.LatentUp); err != nil {
			return fmt.Errorf("moe: routed_expert_up_proj: %w", err)
		}
	} else if err := l.b.Copy(out, routed); err != nil {
		return err
	}
	if !routedOut.IsZero() {
		if err := l.b.Copy(routedOut, out); err != nil {
			return err
		}
	}
	if l.shared == nil {
		return nil
	}
	sh := l.sh.Rows(0, t)
	if sharedAside {
		if err := compute.Join(l.b, l.side); err != nil {
			return fmt.Errorf("moe: shared experts' stream: %w", err)
		}
	} else if err := l.shared.Forward(x, sh); err != nil {
		return fmt.Errorf("moe: shared experts: %w", err)
	}
	if !sharedOut.IsZero() {
		if err := l.b.Copy(sharedOut, sh); err != nil {
			return err
		}
	}
	return l.b.Binary(compute.Add, out, out, sh)
}

// forkShared queues the shared experts of x's t rows into l.sh on the
// side stream, after the work queued on the backend so far.
func (l *Layer) forkShared(x compute.Tensor, t int) error {
	if err := compute.Fork(l.b, l.side); err != nil {
		return fmt.Errorf("moe: shared experts' stream: %w", err)
	}
	if err := l.shared.Forward(x, l.sh.Rows(0, t)); err != nil {
		return fmt.Errorf("moe: shared experts: %w", err)
	}
	return nil
}

// Share returns a runner for the MLP m (of r's shape) that uses r's
// intermediates: the layers of one session run one after another.
func (r *MLPRunner) Share(m *MLP) *MLPRunner {
	c := *r
	c.m = m
	return &c
}

// Share returns a layer with weights w (of l's shape and router) that uses
// l's intermediates.
func (l *Layer) Share(w *Weights) *Layer {
	c := *l
	c.w = w
	if c.shared != nil && w.Shared != nil {
		c.shared = c.shared.Share(w.Shared)
	}
	if c.overlap != nil {
		c.makeOverlap() // the copy's own: l's reads l's fields
	}
	return &c
}

// makeOverlap makes the function that runs l's shared experts on a
// goroutine of their own (Overlap).
func (l *Layer) makeOverlap() {
	l.overlapDone = make(chan struct{}, 1)
	l.overlap = func() {
		l.overlapErr = l.sharedForward(l.overlapX, l.overlapOut)
		l.overlapDone <- struct{}{}
	}
}

// SetSplit makes the layer one rank of a tensor- and expert-parallel
// layout (nil: none). Every rank routes every token; a rank computes the
// slots that go to its experts and its shard of the shared experts, and
// the layout's reduction adds the ranks' parts. Kimi K3's latent MoE
// normalises the routed sum, so there the routed rows are reduced at
// latent width before the norm, and the shared part after.
func (l *Layer) SetSplit(s *Split) error {
	l.split = s
	if s == nil {
		return nil
	}
	if s.Reduce == nil {
		return fmt.Errorf("moe: a split layer needs a reduction")
	}
	if len(l.w.W1) == 0 {
		return fmt.Errorf("moe: a split layer's rank holds no experts")
	}
	maxT, k := l.logits.Dims[0], l.r.TopK
	var err error
	if l.lidx, err = l.b.Alloc(compute.I32, maxT, k); err != nil {
		return err
	}
	l.idxHost = make([]int32, maxT*k)
	if s.Overlap && l.shared != nil {
		l.makeOverlap()
	}
	return nil
}

// Dispatch returns the dispatch of the layer's split (nil without one),
// shared by every layer made from it with Share; a caller whose rows'
// holders change between passes sets its Holders.
func (l *Layer) Dispatch() *Dispatch {
	if l.split == nil {
		return nil
	}
	return l.split.Dispatch
}

// forwardSplit is Forward's split half; with aside the shared experts
// are already queued on the side stream (forkShared) and only joined.
func (l *Layer) forwardSplit(x, out compute.Tensor, t int, aside bool) error {
	if l.split.Dispatch != nil {
		return l.forwardDispatch(x, out, t)
	}
	sp, b := l.split, l.b
	sh := l.sh.Rows(0, t)
	// The shared experts depend on x alone: with Overlap they run beside
	// the routed part, including its wait for the other ranks in the
	// latent sum. Collectives stay in one goroutine and in one order.
	var err error
	switch {
	case l.shared == nil:
		err = l.routedSplit(x, out, t)
	case aside:
		if err = l.routedSplit(x, out, t); err == nil {
			err = compute.Join(l.b, l.side)
		}
	case l.overlap != nil:
		l.overlapX, l.overlapOut = x, sh
		go l.overlap()
		err = l.routedSplit(x, out, t)
		<-l.overlapDone
		if err == nil {
			err = l.overlapErr
		}
	default:
		if err = l.routedSplit(x, out, t); err == nil {
			err = l.sharedForward(x, sh)
		}
	}
	if err != nil {
		return err
	}
	if !l.lat.IsZero() {
		if l.shared == nil {
			return nil
		}
		if err := sp.Reduce(sh); err != nil {
			return fmt.Errorf("moe: shared sum: %w", err)
		}
		return b.Binary(compute.Add, out, out, sh)
	}
	if l.shared != nil {
		if err := b.Binary(compute.Add, out, out, sh); err != nil {
			return err
		}
	}
	if err := sp.Reduce(out); err != nil {
		return fmt.Errorf("moe: expert sum: %w", err)
	}
	return nil
}

// sharedForward runs the shared experts of x into sh.
func (l *Layer) sharedForward(x, sh compute.Tensor) error {
	if err := l.shared.Forward(x, sh); err != nil {
		return fmt.Errorf("moe: shared experts: %w", err)
	}
	return nil
}

// routedSplit writes the rank's routed part to out: for a latent layer
// the whole routed output (reduced at latent width, normalised, projected
// up), otherwise the rank's partial sum, which the caller reduces.
func (l *Layer) routedSplit(x, out compute.Tensor, t int) error {
	sp, b := l.split, l.b
	routed := l.routed.Rows(0, t)
	idx := l.idx.Rows(0, t)
	l.idxView = l.idxHost[:idx.Len()]
	host := l.idxView
	if err := b.Read(&l.idxView, idx); err != nil {
		return err
	}
	lo, hi := int32(l.w.First), int32(l.w.First+len(l.w.W1))
	for i, e := range host {
		if e >= lo && e < hi {
			host[i] = e - lo
		} else {
			host[i] = -1
		}
	}
	lidx := l.lidx.Rows(0, t)
	if err := b.Write(lidx, &l.idxView); err != nil {
		return err
	}
	in := x
	if !l.lat.IsZero() {
		in = l.lat.Rows(0, t)
		if err := b.MatMul(in, x, l.w.LatentDown); err != nil {
			return fmt.Errorf("moe: routed_expert_down_proj: %w", err)
		}
	}
	l.exp = compute.ExpertArgs{X: in, Indices: lidx, Weights: l.wts.Rows(0, t), W1: l.w.W1, W3: l.w.W3, W2: l.w.W2, Act: l.w.Act, Out: routed}
	if err := b.MoEExperts(&l.exp); err != nil {
		return fmt.Errorf("moe: experts: %w", err)
	}
	if l.lat.IsZero() {
		return b.Copy(out, routed)
	}
	if err := sp.Reduce(routed); err != nil {
		return fmt.Errorf("moe: routed sum: %w", err)
	}
	if !l.w.LatentNorm.IsZero() {
		if err := b.RMSNorm(routed, routed, l.w.LatentNorm, l.w.Eps); err != nil {
			return fmt.Errorf("moe: routed_expert_norm: %w", err)
		}
	}
	if err := b.MatMul(out, routed, l.w.LatentUp); err != nil {
		return fmt.Errorf("moe: routed_expert_up_proj: %w", err)
	}
	return nil
}
