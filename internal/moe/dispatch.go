package moe

import (
	"fmt"

	"k3/compute"
)

// Dispatch makes a split layer move tokens to experts instead of
// reducing: the ranks holding the same token rows share them out (holder
// h of m takes rows [h·T/m, (h+1)·T/m)), each sends its rows' routed
// slots to the ranks holding their experts (all-to-all-v over every
// rank), those compute them and send the weighted results back
// (all-to-all-v), and each rank adds its rows' results, runs the shared
// experts on them, and the holders all-gather the rows.
// This is expert parallelism for ranks that hold different tokens (data-
// parallel or context-parallel attention); with every token on every
// rank it moves more bytes than the all-reduce (docs/ARCHITECTURE.md),
// which stays the default there.
type Dispatch struct {
	Rank, Ranks int
	// Bounds[r] is the first expert rank r holds; Bounds[Ranks] = E.
	Bounds    []int
	AllToAllV func(dst compute.Tensor, recv []int, src compute.Tensor, send []int) error
	AllGather func(dst, src compute.Tensor) error
	// Holders, when set, are the ranks holding this rank's rows, when
	// they are not all of them (a context-parallel slice, whose rows no
	// other slice holds); nil means every rank holds every row. Passes
	// may change it between calls; every rank's slots still travel in one
	// all-to-all-v over all Ranks.
	Holders *Holders
}

// Holders is a group of ranks holding the same token rows.
type Holders struct {
	Rank, Ranks int
	AllGather   func(dst, src compute.Tensor) error // over the holders, in their order
}

// share says which ranks hold this rank's rows: its place among them,
// their count, and their all-gather.
func (d *Dispatch) share() (rank, ranks int, gather func(dst, src compute.Tensor) error) {
	if h := d.Holders; h != nil {
		return h.Rank, h.Ranks, h.AllGather
	}
	return d.Rank, d.Ranks, d.AllGather
}

// dispatchState is the host and backend scratch of dispatch passes.
type dispatchState struct {
	idx, lidx      []int32
	wts, in, send  []float32
	back, res, acc []float32
	counts, all    []float32
	recv, slotW    []float32
	routed         []float32
	sendN, recvN   []int
	pairs          []int // per destination rank: pairs sent
	from           []int // per source rank: pairs received
	at, cur        []int // per destination rank: where its pairs start, the next one
	sendT, recvT   compute.Tensor
	countT, allT   compute.Tensor
	xT, outT       compute.Tensor
	lidxT, wT      compute.Tensor
	rowsOutT       compute.Tensor
	gatherT        compute.Tensor
}

func growf(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// growi returns b resized to n, zeroed.
func growi(b []int, n int) []int {
	if cap(b) < n {
		return make([]int, n)
	}
	b = b[:n]
	clear(b)
	return b
}

func growi32(b []int32, n int) []int32 {
	if cap(b) < n {
		return make([]int32, n)
	}
	return b[:n]
}

// room returns a tensor of at least n elements viewed as dims, reusing t.
func room(b compute.Backend, t *compute.Tensor, dt compute.DType, dims ...int) (compute.Tensor, error) {
	n := 1
	for _, d := range dims {
		n *= d
	}
	if t.IsZero() || t.Len() < n {
		if !t.IsZero() {
			b.Free(*t)
		}
		var err error
		if *t, err = b.Alloc(dt, max(n, 2*t.Len(), 1)); err != nil {
			return compute.Tensor{}, err
		}
	}
	v := t.Reshape(t.Len()).Rows(0, n)
	if len(dims) > 0 {
		v = v.Reshape(dims...)
	}
	return v, nil
}

func (l *Layer) forwardDispatch(x, out compute.Tensor, t int) error {
	dp, b, ds := l.split.Dispatch, l.b, &l.disp
	n, me, k := dp.Ranks, dp.Rank, l.r.TopK
	din, d := l.routed.Dims[1], l.sh.Dims[1]
	hr, hn, gatherRows := dp.share()
	r0, r1 := hr*t/hn, (hr+1)*t/hn
	own := r1 - r0
	owner := func(e int32) int {
		for r := range n {
			if int(e) < dp.Bounds[r+1] {
				return r
			}
		}
		return n - 1
	}
	// This rank's rows at the experts' width, and their routing.
	ds.idx = growi32(ds.idx, own*k)
	ds.wts, ds.in = growf(ds.wts, own*k), growf(ds.in, own*din)
	if own > 0 {
		in := x.Rows(r0, r1)
		if !l.lat.IsZero() {
			in = l.lat.Rows(0, own)
			if err := b.MatMul(in, x.Rows(r0, r1), l.w.LatentDown); err != nil {
				return fmt.Errorf("moe: routed_expert_down_proj: %w", err)
			}
		}
		if err := b.Read(&ds.idx, l.idx.Rows(r0, r1)); err != nil {
			return err
		}
		if err := b.Read(&ds.wts, l.wts.Rows(r0, r1)); err != nil {
			return err
		}
		if err := b.Read(&ds.in, in); err != nil {
			return err
		}
	}
	// Pack each slot for its expert's rank: the row, the local expert,
	// the routing weight.
	w := din + 2
	ds.pairs = growi(ds.pairs, n)
	for _, e := range ds.idx {
		ds.pairs[owner(e)]++
	}
	ds.send = growf(ds.send, own*k*w)
	ds.at, ds.cur = growi(ds.at, n+1), growi(ds.cur, n)
	at, cur := ds.at, ds.cur
	for r := range n {
		at[r+1] = at[r] + ds.pairs[r]
	}
	copy(cur, at[:n])
	for i, e := range ds.idx {
		o := owner(e)
		p := ds.send[cur[o]*w : (cur[o]+1)*w]
		cur[o]++
		copy(p, ds.in[i/k*din:(i/k+1)*din])
		p[din], p[din+1] = float32(int(e)-dp.Bounds[o]), ds.wts[i]
	}
	// Every rank's pair counts, so each knows what it receives.
	ds.counts = growf(ds.counts, n)
	for r := range n {
		ds.counts[r] = float32(ds.pairs[r])
	}
	countT, err := room(b, &ds.countT, compute.F32, n)
	if err != nil {
		return err
	}
	if err := b.Write(countT, &ds.counts); err != nil {
		return err
	}
	allT, err := room(b, &ds.allT, compute.F32, n*n)
	if err != nil {
		return err
	}
	if err := dp.AllGather(allT, countT); err != nil {
		return fmt.Errorf("moe: dispatch counts: %w", err)
	}
	ds.all = growf(ds.all, n*n)
	all := ds.all
	if err := b.Read(&ds.all, allT); err != nil {
		return err
	}
	ds.from = growi(ds.from, n)
	got := 0
	for r := range n {
		ds.from[r] = int(all[r*n+me])
		got += ds.from[r]
	}
	ds.sendN, ds.recvN = ds.sendN[:0], ds.recvN[:0]
	for r := range n {
		ds.sendN, ds.recvN = append(ds.sendN, ds.pairs[r]*w), append(ds.recvN, ds.from[r]*w)
	}
	sendT, err := room(b, &ds.sendT, compute.F32, own*k*w)
	if err != nil {
		return err
	}
	if own > 0 {
		if err := b.Write(sendT, &ds.send); err != nil {
			return err
		}
	}
	recvT, err := room(b, &ds.recvT, compute.F32, got*w)
	if err != nil {
		return err
	}
	if err := dp.AllToAllV(recvT, ds.recvN, sendT, ds.sendN); err != nil {
		return fmt.Errorf("moe: dispatch: %w", err)
	}
	// The slots that came here, one row each through its expert.
	ds.res = growf(ds.res, got*din)
	if got > 0 {
		ds.recv = growf(ds.recv, got*w)
		recv := ds.recv
		if err := b.Read(&ds.recv, recvT); err != nil {
			return err
		}
		ds.acc, ds.lidx, ds.slotW = growf(ds.acc, got*din), growi32(ds.lidx, got), growf(ds.slotW, got)
		xs, lidx, wts := ds.acc, ds.lidx, ds.slotW
		for p := range got {
			copy(xs[p*din:(p+1)*din], recv[p*w:p*w+din])
			lidx[p], wts[p] = int32(recv[p*w+din]), recv[p*w+din+1]
		}
		xT, err := room(b, &ds.xT, compute.F32, got, din)
		if err != nil {
			return err
		}
		lT, err := room(b, &ds.lidxT, compute.I32, got, 1)
		if err != nil {
			return err
		}
		wT, err := room(b, &ds.wT, compute.F32, got, 1)
		if err != nil {
			return err
		}
		oT, err := room(b, &ds.outT, compute.F32, got, din)
		if err != nil {
			return err
		}
		if err := b.Write(xT, &ds.acc); err != nil {
			return err
		}
		if err := b.Write(lT, &ds.lidx); err != nil {
			return err
		}
		if err := b.Write(wT, &ds.slotW); err != nil {
			return err
		}
		l.exp = compute.ExpertArgs{X: xT, Indices: lT, Weights: wT, W1: l.w.W1, W3: l.w.W3, W2: l.w.W2, Act: l.w.Act, Out: oT}
		if err := b.MoEExperts(&l.exp); err != nil {
			return fmt.Errorf("moe: experts: %w", err)
		}
		if err := b.Read(&ds.res, oT); err != nil {
			return err
		}
	}
	// Results back to the slots' ranks.
	for r := range n {
		ds.sendN[r], ds.recvN[r] = ds.from[r]*din, ds.pairs[r]*din
	}
	resT, err := room(b, &ds.sendT, compute.F32, got*din)
	if err != nil {
		return err
	}
	if got > 0 {
		if err := b.Write(resT, &ds.res); err != nil {
			return err
		}
	}
	backT, err := room(b, &ds.recvT, compute.F32, own*k*din)
	if err != nil {
		return err
	}
	if err := dp.AllToAllV(backT, ds.recvN, resT, ds.sendN); err != nil {
		return fmt.Errorf("moe: combine: %w", err)
	}
	// Each row's slots, added in slot order.
	ds.back = growf(ds.back, own*k*din)
	if own > 0 {
		if err := b.Read(&ds.back, backT); err != nil {
			return err
		}
	}
	ds.routed = growf(ds.routed, own*din)
	routed := ds.routed
	clear(routed)
	copy(cur, at[:n])
	for i, e := range ds.idx {
		o := owner(e)
		src := ds.back[cur[o]*din : (cur[o]+1)*din]
		cur[o]++
		dst := routed[i/k*din : (i/k+1)*din]
		for j, v := range src {
			dst[j] += v
		}
	}
	// This rank's output rows, then every holder's.
	per := (t + hn - 1) / hn
	rowsOut, err := room(b, &ds.rowsOutT, compute.F32, per, d)
	if err != nil {
		return err
	}
	if own > 0 {
		rt := l.routed.Rows(0, own)
		if err := b.Write(rt, &ds.routed); err != nil {
			return err
		}
		o := rowsOut.Rows(0, own)
		if hn == 1 {
			o = out.Rows(0, own) // no other holder: the rows are the output
		}
		if !l.lat.IsZero() {
			if !l.w.LatentNorm.IsZero() {
				if err := b.RMSNorm(rt, rt, l.w.LatentNorm, l.w.Eps); err != nil {
					return fmt.Errorf("moe: routed_expert_norm: %w", err)
				}
			}
			if err := b.MatMul(o, rt, l.w.LatentUp); err != nil {
				return fmt.Errorf("moe: routed_expert_up_proj: %w", err)
			}
		} else if err := b.Copy(o, rt); err != nil {
			return err
		}
		if l.shared != nil {
			sh := l.sh.Rows(0, own)
			if err := l.shared.Forward(x.Rows(r0, r1), sh); err != nil {
				return fmt.Errorf("moe: shared experts: %w", err)
			}
			if err := b.Binary(compute.Add, o, o, sh); err != nil {
				return err
			}
		}
	}
	if hn == 1 {
		return nil
	}
	gather, err := room(b, &ds.gatherT, compute.F32, hn*per, d)
	if err != nil {
		return err
	}
	if err := gatherRows(gather, rowsOut); err != nil {
		return fmt.Errorf("moe: gather rows: %w", err)
	}
	for r := range hn {
		q0, q1 := r*t/hn, (r+1)*t/hn
		if q1 > q0 {
			if err := b.Copy(out.Rows(q0, q1), gather.Rows(r*per, r*per+q1-q0)); err != nil {
				return err
			}
		}
	}
	return nil
}
