package cpu

import (
	"fmt"
	"math"
	"slices"
	"sync"

	"k3/compute"
	"k3/internal/kernel"
)

// MoERoute selects experts by biased sigmoid score, group-limited, and
// weights them by the unbiased scores.
func (b *Backend) MoERoute(a *compute.RouteArgs) error {
	logits, err := f32Of("router logits", a.Logits)
	if err != nil {
		return err
	}
	if a.Logits.Rank != 2 {
		return shapeErr("router logits %v, want [T, E]", a.Logits)
	}
	t, e := a.Logits.Dims[0], a.Logits.Dims[1]
	k := a.TopK
	g, kg, err := a.CheckGroups(e)
	if err != nil {
		return fmt.Errorf("cpu: %w", err)
	}
	var bias []float32
	if !a.Bias.IsZero() {
		if bias, err = f32Of("router bias", a.Bias); err != nil {
			return err
		}
		if len(bias) != e {
			return shapeErr("router bias %v for %d experts", a.Bias, e)
		}
	}
	idx, wts := I32(a.Indices), F32(a.Weights)
	if a.Indices.DType != compute.I32 || len(idx) != t*k || len(wts) != t*k {
		return shapeErr("router outputs indices %v weights %v, want [%d, %d]", a.Indices, a.Weights, t, k)
	}
	j := routeJobPool.Get().(*routeJob)
	defer routeJobPool.Put(j)
	*j = routeJob{a: a, logits: logits, bias: bias, idx: idx, wts: wts, e: e, g: g, kg: kg}
	if t < moeSplitMin {
		j.route(0, t)
		return nil
	}
	b.pool.Run(routeRange, kernel.Args{Job: j}, t, 8)
	return nil
}

// routeJob is one MoERoute call's tokens; each token's selection is its
// own, so they route on the caller or split over the workers alike.
type routeJob struct {
	a            *compute.RouteArgs
	logits, bias []float32
	idx          []int32
	wts          []float32
	e, g, kg     int
}

var routeJobPool = sync.Pool{New: func() any { return new(routeJob) }}

func routeRange(a *kernel.Args, lo, hi int) { a.Job.(*routeJob).route(lo, hi) }

// route selects the experts of tokens [lo, hi).
func (j *routeJob) route(lo, hi int) {
	a, logits, bias, idx, wts, e, g, kg := j.a, j.logits, j.bias, j.idx, j.wts, j.e, j.g, j.kg
	k := a.TopK
	sc := moeScratchPool.Get().(*moeScratch)
	defer moeScratchPool.Put(sc)
	sc.x = grow(sc.x, 2*e+2*g)
	scratch := sc.x
	if cap(sc.rows) < g {
		sc.rows = make([]int32, g)
	}
	gidx := sc.rows[:g]
	for tok := lo; tok < hi; tok++ {
		scores, sel := scratch[:e], scratch[e:2*e]
		copy(scores, logits[tok*e:(tok+1)*e])
		kernel.SigmoidSlice(scores) // Sigmoid's bits, sixteen or eight at a time
		if bias != nil {
			kernel.Add(sel, scores, bias)
		} else {
			copy(sel, scores)
		}
		if g > 1 {
			gs := scratch[2*e : 2*e+g]
			per := e / g
			var top2 [2]int32
			for gi := 0; gi < g; gi++ {
				kernel.TopK(top2[:], nil, sel[gi*per:(gi+1)*per], 2)
				gs[gi] = sel[gi*per+int(top2[0])] + sel[gi*per+int(top2[1])]
			}
			kernel.TopK(gidx, nil, gs, kg)
			keep := scratch[2*e+g : 2*e+2*g]
			clear(keep)
			for _, gi := range gidx[:kg] {
				keep[gi] = 1
			}
			for gi := 0; gi < g; gi++ {
				if keep[gi] == 0 {
					for i := gi * per; i < (gi+1)*per; i++ {
						sel[i] = float32(math.Inf(-1))
					}
				}
			}
		}
		ti, tw := idx[tok*k:(tok+1)*k], wts[tok*k:(tok+1)*k]
		kernel.TopK(ti, nil, sel, k)
		var total float32
		for i, ex := range ti {
			tw[i] = scores[ex]
			total += tw[i]
		}
		scale := a.Scale
		if a.Renormalize {
			scale /= total
		}
		kernel.Scale(tw, scale)
	}
}

// moeScratch holds one MoEExperts call's grouping and intermediates.
type moeScratch struct {
	// Per (expert, token) row: the gathered input and the hidden (the
	// passes only; whole experts use their goroutine's expertScratch), the
	// output.
	x, h, out []float32
	xb        []uint16  // per row: a product's x rounded to bf16 (kPairs weights; the passes only)
	rows      []int32   // token of each grouped row
	w         []float32 // routing weight of each grouped row
	start     []int32   // first grouped row of each expert (E+1)
	cur       []int32   // placement cursor per expert
	pos       []int32   // grouped row of each (token, slot) of a long call
	combine   combineJob
	active    []int32 // experts with rows
	items     []int32 // a pass's work items, expertItem each
	job       expertJob
}

var moeScratchPool = sync.Pool{New: func() any { return new(moeScratch) }}

// expertJob is one MoEExperts call's work on the workers.
type expertJob struct {
	a          *compute.ExpertArgs
	sc         *moeScratch
	din, inter int
	long       bool // amxMinRows tokens or more: a prefill chunk's (serialMatMul)
	pairs      bool // the products round x to bf16 (kPairs weights)
	down       bool // the passes' products: the down products' (else gate and up)
	err        error
	errMu      sync.Mutex
}

// MoEExperts runs each selected expert once over all tokens routed to it.
// Tokens are grouped by expert on the caller; then either every worker
// takes whole experts (gather, gate and up products, activation, down
// product), so that small experts cost no dispatch of their own, or,
// where whole experts would leave workers idle (expertPasses), the call
// runs as passes (gather; gate and up products; activation; down
// products) whose products are cut into ranges of a laid-out weight's
// panels, so that every worker streams a share of every expert. Either
// way each active expert's weights are read once per call, and a token's
// outputs have the same bits: a panel's outputs do not depend on the
// panels computed beside them. In a call of amxMinRows tokens or more
// (a prefill chunk) the products of k-major experts that longOnTiles
// admits run on the AMX tiles, as such a chunk's projections do.
func (b *Backend) MoEExperts(a *compute.ExpertArgs) error {
	x, err := f32Of("expert input", a.X)
	if err != nil {
		return err
	}
	out, err := f32Of("expert output", a.Out)
	if err != nil {
		return err
	}
	if a.X.Rank != 2 {
		return shapeErr("expert input %v, want [T, D]", a.X)
	}
	t, din := a.X.Dims[0], a.X.Dims[1]
	idx, wts := I32(a.Indices), F32(a.Weights)
	if a.Indices.DType != compute.I32 || a.Indices.Rank != 2 || a.Indices.Dims[0] != t || len(wts) != len(idx) || len(out) != t*din {
		return shapeErr("experts: x %v indices %v weights %v out %v", a.X, a.Indices, a.Weights, a.Out)
	}
	ne := len(a.W1)
	if len(a.W3) != ne || len(a.W2) != ne || ne == 0 {
		return shapeErr("experts: %d w1, %d w3, %d w2 tensors", len(a.W1), len(a.W3), len(a.W2))
	}
	inter := a.W1[0].Dim(0)
	k := a.Indices.Dims[1]
	sc := moeScratchPool.Get().(*moeScratch)
	defer moeScratchPool.Put(sc)
	// Counting sort of the (token, slot) pairs by expert.
	sc.start = grow(sc.start, ne+1)
	clear(sc.start)
	for _, ex := range idx {
		if ex == -1 {
			continue // an expert another rank holds
		}
		if ex < 0 || int(ex) >= ne {
			return fmt.Errorf("cpu: experts: expert index %d outside 0..%d", ex, ne-1)
		}
		sc.start[ex+1]++
	}
	sc.active = sc.active[:0]
	for e := 0; e < ne; e++ {
		if sc.start[e+1] > 0 {
			sc.active = append(sc.active, int32(e))
			w1, w3, w2 := a.W1[e], a.W3[e], a.W2[e]
			if w1.Rank != 2 || w1.Dims[1] != din || w1.Dims[0] != inter || w3.Dims != w1.Dims || w2.Rank != 2 || w2.Dims[0] != din || w2.Dims[1] != inter {
				return shapeErr("expert %d: w1 %v w3 %v w2 %v for input width %d", e, w1, w3, w2, din)
			}
		}
		sc.start[e+1] += sc.start[e]
	}
	n := int(sc.start[ne])
	sc.rows, sc.w = grow(sc.rows, n), grow(sc.w, n)
	// Place the pairs in expert order, token order within an expert.
	sc.cur = grow(sc.cur, ne)
	copy(sc.cur, sc.start[:ne])
	for i, ex := range idx {
		if ex < 0 {
			continue
		}
		p := sc.cur[ex]
		sc.cur[ex]++
		sc.rows[p] = int32(i / k)
		sc.w[p] = wts[i]
	}
	sc.out = grow(sc.out, n*din)
	sc.xb = sc.xb[:0]
	sc.job = expertJob{a: a, sc: sc, din: din, inter: inter, long: t >= amxMinRows, pairs: b.packing() == kPairs}
	switch {
	case sc.job.laidOut() && expertPasses(len(sc.active), b.pool.Size()):
		sc.x, sc.h = grow(sc.x, n*din), grow(sc.h, 2*n*inter)
		if sc.job.pairs {
			sc.xb = grow(sc.xb, n*max(din, inter))
		}
		sc.job.passes(b, x)
	case t >= moeSplitMin:
		// A long call's experts differ in rows several times over: the
		// goroutines take them one at a time, so that the last to finish
		// waits for one expert, not a range of them.
		b.pool.RunEach(expertRange, kernel.Args{Job: &sc.job, X: x}, len(sc.active), 1)
	default:
		b.pool.Run(expertRange, kernel.Args{Job: &sc.job, X: x}, len(sc.active), 1)
	}
	if sc.job.err != nil {
		return sc.job.err
	}
	// Each token's output adds its slots' expert outputs in grouped order
	// (expert by expert), whether the call adds them in one sweep or
	// token by token on the workers.
	if t < moeSplitMin {
		clear(out)
		for p := 0; p < n; p++ {
			r := int(sc.rows[p])
			kernel.Axpy(out[r*din:(r+1)*din], sc.w[p], sc.out[p*din:(p+1)*din])
		}
		return nil
	}
	sc.pos = grow(sc.pos, t*k)
	for i := range sc.pos {
		sc.pos[i] = -1
	}
	copy(sc.cur, sc.start[:ne])
	for i, ex := range idx {
		if ex >= 0 {
			sc.pos[i] = sc.cur[ex]
			sc.cur[ex]++
		}
	}
	sc.combine = combineJob{out: out, pos: sc.pos, sc: sc, din: din, k: k}
	b.pool.Run(combineRange, kernel.Args{Job: &sc.combine}, t, 8)
	return nil
}

// passes runs the call as passes over the active experts: gather; gate
// and up products cut into panel ranges; activation; down products.
func (j *expertJob) passes(b *Backend, x []float32) {
	sc, a := j.sc, j.a
	args := kernel.Args{Job: j, X: x}
	b.pool.Run(expertGather, args, len(sc.active), 1)
	sc.items = j.split(sc.items[:0], a.W1, a.W3)
	b.pool.Run(expertProducts, args, len(sc.items)/expertItem, 1)
	if j.err == nil {
		b.pool.Run(expertAct, args, len(sc.active), 1)
	}
	if j.err == nil {
		j.down = true
		sc.items = j.split(sc.items[:0], a.W2, nil)
		b.pool.Run(expertProducts, args, len(sc.items)/expertItem, 1)
	}
}

// moeSplitMin is the fewest tokens from which MoERoute routes, and
// MoEExperts adds the experts' outputs, token by token on the workers
// (a prefill chunk's call); fewer go on the caller in one sweep.
const moeSplitMin = 64

// combineJob adds a long call's expert outputs per token.
type combineJob struct {
	out []float32
	pos []int32 // grouped row of each (token, slot), -1 for none
	sc  *moeScratch
	din int
	k   int
}

// combineRange writes tokens [lo, hi): each token's slots in grouped
// order (ascending grouped rows), the order of MoEExperts' one sweep, so
// the bits are the same.
func combineRange(a *kernel.Args, lo, hi int) {
	j := a.Job.(*combineJob)
	var buf [16]int32
	order := buf[:0]
	if j.k > len(buf) {
		order = make([]int32, 0, j.k)
	}
	for r := lo; r < hi; r++ {
		o := j.out[r*j.din : (r+1)*j.din]
		clear(o)
		rows := order[:0]
		for _, p := range j.pos[r*j.k : (r+1)*j.k] {
			if p >= 0 {
				rows = append(rows, p)
			}
		}
		slices.Sort(rows)
		for _, p := range rows {
			kernel.Axpy(o, j.sc.w[p], j.sc.out[int(p)*j.din:(int(p)+1)*j.din])
		}
	}
}

// expertItem is the length of one work item of the products' passes:
// the expert's index in active, which of its weights (0: the first list,
// 1: the second, itemPair: both as one), and the range of the weight's
// panels [p0, p1), or p1 = -1 for the whole weight.
const expertItem = 4

// itemPair is the weight an item names for an expert's gate and up
// weights laid out as one (gateUp).
const itemPair = 2

// expertPanels is how many k-major panels one work item of an expert's
// product takes: the four streams kmajFew reads.
const expertPanels = 4

// split lists the work items of a pass over the active experts' weights
// ws (and vs, when given): a laid-out weight's product in ranges of
// expertPanels panels, any other whole.
func (j *expertJob) split(items []int32, ws, vs []compute.Tensor) []int32 {
	for i, e := range j.sc.active {
		for which, list := range [2][]compute.Tensor{ws, vs} {
			if list == nil {
				continue
			}
			w := list[e]
			if vs != nil {
				if p := gateUpPair(ws[e], vs[e]); p != nil {
					if which == 0 {
						panels := (2*p.n + kernel.KMajorPanel - 1) / kernel.KMajorPanel
						for q := 0; q < panels; q += expertPanels {
							items = append(items, int32(i), itemPair, int32(q), int32(min(panels, q+expertPanels)))
						}
					}
					continue
				}
			}
			panels := j.panelsOf(w)
			if panels == 0 {
				items = append(items, int32(i), int32(which), 0, -1)
				continue
			}
			for p := 0; p < panels; p += expertPanels {
				items = append(items, int32(i), int32(which), int32(p), int32(min(panels, p+expertPanels)))
			}
		}
	}
	return items
}

// panelsOf returns the number of panels of w whose products a pass may
// split by panel (k-major or pair-interleaved, and not a long product
// the AMX tiles take), or 0.
func (j *expertJob) panelsOf(w compute.Tensor) int {
	wp, how, err := packedOf(w)
	if wp == nil || err != nil || (how != kMajor && how != kPairs) || (j.long && longOnTiles(how, w.Dims[1])) {
		return 0
	}
	return (w.Dims[0] + kernel.KMajorPanel - 1) / kernel.KMajorPanel
}

// expertPasses reports whether MoEExperts runs a call as passes over its
// products' panel ranges rather than whole experts a goroutine, given the
// active experts and the pool's goroutines: where whole experts would
// leave more than an eighth of the goroutines' turns idle in their last
// round (one expert for two goroutines; a batch-1 step's top-6 on eight
// cores), since an expert's products stream its weights from memory and
// one goroutine alone reaches only part of the memory's rate. Otherwise
// (a decode batch's many experts, a batch-1 step's top-k that the
// goroutines divide) whole experts cost one dispatch and no barrier
// between an expert's products, and the passes measured no faster, or
// slower on small experts (docs/bench). A variable so that tests can
// take either schedule.
var expertPasses = func(active, goroutines int) bool {
	slots := (active + goroutines - 1) / goroutines * goroutines
	return 8*(slots-active) > slots
}

// laidOut reports whether the first active expert has a weight a pass may
// split by panels (the experts of one call share their layout).
func (j *expertJob) laidOut() bool {
	if len(j.sc.active) == 0 {
		return false
	}
	e := j.sc.active[0]
	return gateUpPair(j.a.W1[e], j.a.W3[e]) != nil || j.panelsOf(j.a.W1[e]) > 0 || j.panelsOf(j.a.W2[e]) > 0
}

// rowsOf returns expert e's first grouped row and row count.
func (j *expertJob) rowsOf(e int32) (r0, m int) {
	return int(j.sc.start[e]), int(j.sc.start[e+1] - j.sc.start[e])
}

// xbOf returns expert e's share of the passes' rounded-x buffer (nil
// unless the weights are pair-interleaved, where MoEExperts sizes it for
// the passes).
func (j *expertJob) xbOf(e int32) []uint16 {
	if len(j.sc.xb) == 0 {
		return nil
	}
	r0, m := j.rowsOf(e)
	wide := max(j.din, j.inter)
	return j.sc.xb[r0*wide : (r0+m)*wide]
}

func (j *expertJob) fail(err error) {
	j.errMu.Lock()
	if j.err == nil {
		j.err = err
	}
	j.errMu.Unlock()
}

// gather copies the rows routed to expert e into dst and returns them.
func (j *expertJob) gather(e int32, dst, x []float32) []float32 {
	r0, m := j.rowsOf(e)
	din := j.din
	xs := dst[:m*din]
	for i, r := range j.sc.rows[r0 : r0+m] {
		copy(xs[i*din:(i+1)*din], x[int(r)*din:(int(r)+1)*din])
	}
	return xs
}

// expertGather gathers the rows of experts [lo, hi) of active and, for
// pair-interleaved weights, rounds them to bf16 once for the gate and up
// products.
func expertGather(args *kernel.Args, lo, hi int) {
	j := args.Job.(*expertJob)
	for _, e := range j.sc.active[lo:hi] {
		r0, _ := j.rowsOf(e)
		xs := j.gather(e, j.sc.x[r0*j.din:], args.X)
		if xb := j.xbOf(e); xb != nil {
			kernel.ToBF16(xb[:len(xs)], xs)
		}
	}
}

// expertProduct runs one work item's product: dst[m, n] = x · wᵀ over
// panels [p0, p1) of w, or all of it with p1 < 0.
func (j *expertJob) expertProduct(dst, x []float32, xb []uint16, w compute.Tensor, m, p0, p1 int) error {
	if p1 < 0 {
		return serialMatMul(dst, x, xb, w, m, j.long)
	}
	wp, how, _ := packedOf(w)
	n, k := w.Dims[0], w.Dims[1]
	if how == kPairs {
		kernel.MatMulKPairsPanels(dst, xb, wp, m, n, k, p0, p1)
	} else {
		kernel.MatMulKMajorPanels(dst, x, wp, m, n, k, p0, p1)
	}
	return nil
}

// expertProducts runs the products' items [lo, hi) of the pass j.down
// names: the gate and up products (false) or the down products (true).
func expertProducts(args *kernel.Args, lo, hi int) {
	j := args.Job.(*expertJob)
	sc, a, din, inter := j.sc, j.a, j.din, j.inter
	for it := lo; it < hi; it++ {
		item := sc.items[it*expertItem : (it+1)*expertItem]
		e := sc.active[item[0]]
		r0, m := j.rowsOf(e)
		gate := sc.h[2*r0*inter : 2*r0*inter+m*inter]
		dst, x, w := gate, sc.x[r0*din:(r0+m)*din], a.W1[e]
		switch {
		case j.down:
			dst, x, w = sc.out[r0*din:(r0+m)*din], gate, a.W2[e]
		case item[1] == itemPair:
			p := gateUpPair(a.W1[e], a.W3[e])
			kernel.MatMulKMajorPanels(sc.h[2*r0*inter:2*(r0+m)*inter], x, p.packed, m, 2*inter, din, int(item[2]), int(item[3]))
			continue
		case item[1] == 1:
			dst, w = sc.h[2*r0*inter+m*inter:2*(r0+m)*inter], a.W3[e] // up
		}
		if err := j.expertProduct(dst, x, j.xbOf(e), w, m, int(item[2]), int(item[3])); err != nil {
			j.fail(err)
			return
		}
	}
}

// expertAct applies the activation to experts [lo, hi) of active, gate
// and up into gate (and rounds it to bf16 for pair-interleaved weights).
func expertAct(args *kernel.Args, lo, hi int) {
	j := args.Job.(*expertJob)
	sc, inter := j.sc, j.inter
	for _, e := range sc.active[lo:hi] {
		r0, m := j.rowsOf(e)
		gate := sc.h[2*r0*inter : 2*r0*inter+m*inter]
		if gateUpPair(j.a.W1[e], j.a.W3[e]) != nil {
			if err := j.activatePair(sc.h[2*r0*inter:2*(r0+m)*inter], m); err != nil {
				j.fail(err)
				return
			}
			continue
		}
		if err := j.activate(gate, sc.h[2*r0*inter+m*inter:2*(r0+m)*inter]); err != nil {
			j.fail(err)
			return
		}
		if xb := j.xbOf(e); xb != nil {
			kernel.ToBF16(xb[:m*inter], gate)
		}
	}
}

// activate writes act(gate)·up into gate.
func (j *expertJob) activate(gate, up []float32) error { return j.activateInto(gate, gate, up) }

// activateInto writes act(gate)·up into dst (gate itself, or apart).
func (j *expertJob) activateInto(dst, gate, up []float32) error {
	switch act := j.a.Act; act.Kind {
	case compute.SwiGLU:
		kernel.SwiGLU(dst, gate, up)
	case compute.SiTU:
		kernel.SiTU(dst, gate, up, act.Beta, act.LinearBeta)
	default:
		return fmt.Errorf("cpu: experts: activation %d: %w", act.Kind, compute.ErrUnsupported)
	}
	return nil
}

// activatePair applies the activation to the m rows of a pair's
// product h ([m, 2I]: each row gate then up) and leaves act(gate)·up
// compact in h's first m·I floats, where the down product reads it. Row
// r's result lands on floats a row before r has already consumed (row 0's
// on its own gate, element by element), so it runs in place.
func (j *expertJob) activatePair(h []float32, m int) error {
	in := j.inter
	for r := range m {
		row := h[2*r*in : 2*(r+1)*in]
		if r == 0 {
			if err := j.activate(row[:in], row[in:]); err != nil {
				return err
			}
			continue
		}
		if err := j.activateInto(h[r*in:(r+1)*in], row[:in], row[in:]); err != nil {
			return err
		}
	}
	return nil
}

// expertScratch is one goroutine's rows of the expert it runs whole
// (expertRange): the gathered x, the gate and up products and x rounded
// to bf16, reused expert after expert so that they stay in its core's
// caches. (As shares of call-wide buffers, a 512-token prefill layer of
// the 100M preset wrote 4 MB of them, the rows' copies taking 10% of the
// call's time.)
type expertScratch struct {
	x, h []float32
	xb   []uint16
}

var expertScratchPool = sync.Pool{New: func() any { return new(expertScratch) }}

// expertRange runs experts [lo, hi) of active whole: gather, gate and up
// products, activation, down product.
func expertRange(args *kernel.Args, lo, hi int) {
	j := args.Job.(*expertJob)
	sc, a, inter := j.sc, j.a, j.inter
	es := expertScratchPool.Get().(*expertScratch)
	defer expertScratchPool.Put(es)
	for _, e := range sc.active[lo:hi] {
		r0, m := j.rowsOf(e)
		es.x, es.h = grow(es.x, m*j.din), grow(es.h, 2*m*inter)
		xs := j.gather(e, es.x, args.X)
		var xb []uint16
		if j.pairs {
			es.xb = grow(es.xb, m*max(j.din, inter))
			xb = es.xb
		}
		gate, up := es.h[:m*inter], es.h[m*inter:2*m*inter]
		var err error
		if p := gateUpPair(a.W1[e], a.W3[e]); p != nil {
			h := es.h[:2*m*inter]
			kernel.MatMulKMajorSerial(h, xs, p.packed, m, 2*inter, j.din)
			err = j.activatePair(h, m)
		} else {
			err = serialMatMul(gate, xs, xb, a.W1[e], m, j.long)
			if err == nil {
				err = serialMatMul(up, xs, xb, a.W3[e], m, j.long)
			}
			if err == nil {
				err = j.activate(gate, up)
			}
		}
		if err == nil {
			err = serialMatMul(sc.out[r0*j.din:(r0+m)*j.din], gate, xb, a.W2[e], m, j.long)
		}
		if err != nil {
			j.fail(err)
			return
		}
	}
}

// serialMatMul computes dst[m, N] = x[m, K] · wᵀ on the calling goroutine.
// A product of a long call (long: amxMinRows tokens or more) of a k-major
// weight that longOnTiles admits runs on the AMX tiles, the weight
// repacked for it alone. Weights in the stored layout (narrower than
// kernel.KMajorMinN, such as the 100M preset's 64x384 experts where the
// AMX tiles run; elsewhere PrepareExperts lays those out as gate and up
// pairs) stay on the dot-form tiles: packing them for every product did
// not pay (docs/bench). A half of a gate and up pair gives its half of
// the pair's product. A pair-interleaved weight's product rounds x into
// xb.
func serialMatMul(dst, x []float32, xb []uint16, w compute.Tensor, m int, long bool) error {
	n, k := w.Dims[0], w.Dims[1]
	if p, up := gateUpOf(w); p != nil {
		if err := checkHalf(w, p); err != nil {
			return err
		}
		halfMatMul(nil, dst, x, p, up, m)
		return nil
	}
	if wp, how, err := packedOf(w); wp != nil || err != nil {
		switch {
		case err != nil:
		case how == kPairs:
			if len(xb) < m*k {
				xb = make([]uint16, m*k) // only a weight of another backend's making
			}
			kernel.MatMulKPairsSerial(dst, x, wp, xb, m, n, k)
		case how == amxTiles:
			kernel.MatMulAMXSerial(dst, x, wp, m, n, k)
		case long && longOnTiles(how, k):
			kernel.MatMulKMajorAMXSerial(dst, x, wp, m, n, k)
		default:
			kernel.MatMulKMajorSerial(dst, x, wp, m, n, k)
		}
		return err
	}
	switch w.DType {
	case compute.F32:
		kernel.MatMulSerial(dst, x, F32(w), m, n, k)
	case compute.BF16:
		kernel.MatMulBF16Serial(dst, x, U16(w), m, n, k)
	default:
		return fmt.Errorf("cpu: matmul with %v weights: %w", w.DType, compute.ErrUnsupported)
	}
	return nil
}

// matmulHost computes dst[m, N] = x[m, K] · wᵀ on host slices.
func (b *Backend) matmulHost(dst, x []float32, w compute.Tensor, m int) error {
	n, k := w.Dims[0], w.Dims[1]
	if p, up := gateUpOf(w); p != nil {
		if err := checkHalf(w, p); err != nil {
			return err
		}
		halfMatMul(b.pool, dst, x, p, up, m)
		return nil
	}
	if wp, how, err := packedOf(w); wp != nil || err != nil {
		switch {
		case err != nil:
		case how == kPairs:
			b.pool.MatMulKPairs(dst, x, wp, m, n, k)
		case how == amxTiles && b.roundsX(m):
			b.pool.MatMulAMXFast(dst, x, wp, m, n, k)
		case how == amxTiles:
			b.pool.MatMulAMX(dst, x, wp, m, n, k)
		case b.roundsX(m) && longOnTiles(how, k):
			b.pool.MatMulKMajorAMXFast(dst, x, wp, m, n, k)
		case m >= amxMinRows && longOnTiles(how, k):
			b.pool.MatMulKMajorAMX(dst, x, wp, m, n, k)
		default:
			b.pool.MatMulKMajor(dst, x, wp, m, n, k)
		}
		return err
	}
	switch w.DType {
	case compute.F32:
		b.pool.MatMul(dst, x, F32(w), m, n, k)
	case compute.BF16:
		var tiles []uint16
		if m >= amxMinRows {
			tiles = tilesFor(w)
		}
		switch {
		case tiles == nil:
			b.matMulBF16(dst, x, U16(w), m, n, k)
		case copyForm(w) == kPairs:
			b.pool.MatMulKPairs(dst, x, tiles, m, n, k)
		case copyForm(w) == kMajor:
			b.pool.MatMulKMajor(dst, x, tiles, m, n, k)
		case b.roundsX(m):
			b.pool.MatMulAMXFast(dst, x, tiles, m, n, k)
		default:
			b.pool.MatMulAMX(dst, x, tiles, m, n, k)
		}
	default:
		return fmt.Errorf("cpu: matmul with %v weights: %w", w.DType, compute.ErrUnsupported)
	}
	return nil
}
