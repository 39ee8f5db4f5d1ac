package ascend

import (
	"fmt"

	"k3/ascend/internal/acl"
	"k3/compute"
)

// MoERoute implements compute.Backend with aclnnMoeGatingTopK: sigmoid
// scores, selection by score plus bias, groups ranked by the sum of their
// two best, the top experts' unbiased scores (renormalised when asked)
// times the scale. Which expert wins an exact tie on the device is the
// operator's; the host driver and the fake keep the lower index, as the
// pure-Go backend does.
func (b *Backend) MoERoute(a *compute.RouteArgs) error {
	if a.Logits.Rank != 2 || a.Logits.DType != compute.F32 {
		return fmt.Errorf("%w: router logits %v, want f32 [T, E]", compute.ErrShape, a.Logits)
	}
	T, E := a.Logits.Dims[0], a.Logits.Dims[1]
	k := a.TopK
	g, kg, err := a.CheckGroups(E)
	if err != nil {
		return fmt.Errorf("ascend: %w", err)
	}
	switch {
	case !a.Bias.IsZero() && (a.Bias.DType != compute.F32 || a.Bias.Len() != E):
		return fmt.Errorf("%w: router bias %v for %d experts", compute.ErrShape, a.Bias, E)
	case a.Indices.DType != compute.I32 || a.Indices.Len() != T*k || a.Weights.DType != compute.F32 || a.Weights.Len() != T*k:
		return fmt.Errorf("%w: router outputs indices %v weights %v, want [%d, %d]", compute.ErrShape, a.Indices, a.Weights, T, k)
	}
	b.lock()
	defer b.mu.Unlock()
	ops := []operand{flat(a.Logits, E), {t: a.Weights, view: i64(T, k)}, {t: a.Indices, view: i64(T, k)}}
	hasBias := !a.Bias.IsZero()
	if hasBias {
		ops = append(ops, operand{t: a.Bias, view: i64(E)})
	}
	scale := float64(a.Scale)
	return b.run(func(ts []tensorDesc) (prepared, error) {
		var bias tensorDesc
		if hasBias {
			bias = ts[3]
		}
		return b.drv.moeGating(ts[0], bias, k, kg, g, a.Renormalize, scale, ts[1], ts[2])
	}, ops...)
}

// MoEExperts implements compute.Backend. On experts stacked at load
// (PrepareExperts) it runs groupedExperts, all on the device. Otherwise it
// is a composition: the routing is
// read to the host (one synchronisation) to group the (token, slot) pairs
// by expert; then per active expert its tokens are gathered
// (aclnnIndexSelect), run through W1 and W3 (MatMul), the gated
// activation and W2, scaled by their routing weights (gathered the same
// way) and added into Out at their tokens (aclnnIndexAdd). A slot of -1 (an
// expert another rank holds) adds nothing. aclnnGroupedMatmul, which runs
// every expert in one call without the host round trip, is the device's
// better route once bound.
func (b *Backend) MoEExperts(a *compute.ExpertArgs) error {
	if a.X.Rank != 2 || a.X.DType != compute.F32 || a.Out.DType != compute.F32 || a.Weights.DType != compute.F32 ||
		a.Indices.DType != compute.I32 || a.Indices.Rank != 2 || a.Indices.Dims[0] != a.X.Dims[0] ||
		a.Weights.Len() != a.Indices.Len() || a.Out.Len() != a.X.Len() {
		return fmt.Errorf("%w: experts: x %v indices %v weights %v out %v", compute.ErrShape, a.X, a.Indices, a.Weights, a.Out)
	}
	T, Din, K := a.X.Dims[0], a.X.Dims[1], a.Indices.Dims[1]
	E := len(a.W1)
	if E == 0 || len(a.W3) != E || len(a.W2) != E {
		return fmt.Errorf("%w: experts: %d w1, %d w3, %d w2 tensors", compute.ErrShape, len(a.W1), len(a.W3), len(a.W2))
	}
	I := a.W1[0].Dim(0)
	for e := range E {
		if a.W1[e].Rank != 2 || a.W3[e].Rank != 2 || a.W2[e].Rank != 2 || a.W1[e].Dims != a.W3[e].Dims ||
			a.W1[e].Dims[0] != I || a.W1[e].Dims[1] != Din || a.W2[e].Dims[0] != Din || a.W2[e].Dims[1] != I {
			return fmt.Errorf("%w: expert %d: w1 %v, w3 %v, w2 %v for width %d", compute.ErrShape, e, a.W1[e], a.W3[e], a.W2[e], Din)
		}
	}
	b.lock()
	defer b.mu.Unlock()
	if stackOf(a.W1) != nil && stackOf(a.W3) != nil && stackOf(a.W2) != nil {
		return b.groupedExperts(a, T, Din, K, I, E)
	}
	idx := make([]int32, T*K)
	if err := b.get(idx, a.Indices); err != nil {
		return err
	}
	// Group the pairs by expert: each expert's tokens, then the pairs'
	// positions in Weights, packed for one upload.
	start := make([]int, E+1)
	for _, e := range idx {
		if e == -1 {
			continue
		}
		if e < 0 || int(e) >= E {
			return fmt.Errorf("ascend: experts: expert index %d outside 0..%d", e, E-1)
		}
		start[e+1]++
	}
	for e := range E {
		start[e+1] += start[e]
	}
	n := start[E]
	if err := b.fillZero(a.Out); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	groups := make([]int32, 2*n) // tokens, then positions
	next := append([]int(nil), start[:E]...)
	for i, e := range idx {
		if e == -1 {
			continue
		}
		groups[next[e]], groups[n+next[e]] = int32(i/K), int32(i)
		next[e]++
	}
	ints, err := b.allocTensor(compute.I32, 2*n)
	if err != nil {
		return err
	}
	defer b.freeBuf(ints.Mem.(*devBuf))
	if err := b.putAsync(ints, groups); err != nil {
		return err
	}
	most := 0
	for e := range E {
		most = max(most, start[e+1]-start[e])
	}
	// Scratch per expert call: x rows, two hidden blocks, the output rows
	// and the weights.
	sc, err := b.allocTensor(compute.F32, most*(2*Din+2*I+1))
	if err != nil {
		return err
	}
	defer b.freeBuf(sc.Mem.(*devBuf))
	one, err := b.scalar(1)
	if err != nil {
		return err
	}
	for e := range E {
		lo, hi := start[e], start[e+1]
		m := hi - lo
		if m == 0 {
			continue
		}
		shape := func(t compute.Tensor, dims ...int) compute.Tensor {
			t.Rank = len(dims)
			copy(t.Dims[:], dims)
			return t
		}
		xe := shape(part(sc, 0, m*Din), m, Din)
		h1 := shape(part(sc, m*Din, m*I), m, I)
		h3 := shape(part(sc, m*Din+m*I, m*I), m, I)
		ye := shape(part(sc, m*Din+2*m*I, m*Din), m, Din)
		we := part(sc, 2*m*Din+2*m*I, m)
		tokens := operand{t: part(ints, lo, m), view: i64(m)}
		pos := operand{t: part(ints, n+lo, m), view: i64(m)}
		sel := func(x, out operand, index operand) error {
			return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.indexSelect(ts[0], 0, ts[1], ts[2]) }, x, index, out)
		}
		for _, f := range []func() error{
			func() error { return sel(flat(a.X, Din), flat(xe, Din), tokens) },
			func() error { return b.matmul(h1, xe, a.W1[e]) },
			func() error { return b.matmul(h3, xe, a.W3[e]) },
			func() error { return b.gatedAct(a.Act, h1, h1, h3) },
			func() error { return b.matmul(ye, h1, a.W2[e]) },
			func() error { return sel(operand{t: a.Weights, view: i64(T * K)}, operand{t: we, view: i64(m)}, pos) },
			func() error {
				return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) },
					flat(ye, Din), operand{t: we, view: i64(m, 1)}, flat(ye, Din))
			},
			func() error {
				return b.run(func(ts []tensorDesc) (prepared, error) { return b.drv.indexAdd(ts[0], 0, ts[1], ts[2], one, ts[3]) },
					flat(a.Out, Din), tokens, flat(ye, Din), flat(a.Out, Din))
			},
		} {
			if err := f(); err != nil {
				return fmt.Errorf("ascend: expert %d: %w", e, err)
			}
		}
	}
	return nil
}

// fillZero zeroes t on the stream; b.mu is held.
func (b *Backend) fillZero(t compute.Tensor) error {
	p, err := b.addr(t)
	if err != nil {
		return err
	}
	return b.s.Memset(p, 0, dims(t)*t.DType.Size())
}

// groupedExperts is MoEExperts over stacked weights with no host round
// trip, so a decode step that runs it can be captured; b.mu is held.
// aclnnGroupedMatmulV4's groups must cover every row, so a slot of -1 (an
// expert another rank holds) is routed to the last expert with a routing
// weight of 0: with m = ReLU(i+1) − ReLU(i) (1 for an expert, 0 for -1),
// i' = i + E·(1 − m) and w' = w·m. aclnnMoeInitRoutingV2 sorts the T·K
// (token, slot) pairs by expert and counts them; three grouped products
// with the gated activation between them run every expert over its rows;
// each pair's output row is gathered back to pair order (aclnnIndexSelect),
// scaled by w', and a token's K slots are summed in slot order.
func (b *Backend) groupedExperts(a *compute.ExpertArgs, T, Din, K, I, E int) error {
	M := T * K
	var scratch []compute.Tensor
	defer func() {
		for _, t := range scratch {
			b.freeBuf(t.Mem.(*devBuf))
		}
	}()
	alloc := func(dt compute.DType, dims ...int) (compute.Tensor, error) {
		t, err := b.allocTensor(dt, dims...)
		if err == nil {
			scratch = append(scratch, t)
		}
		return t, err
	}
	type spec struct {
		t  *compute.Tensor
		dt compute.DType
		d  []int
	}
	var ones, f, r, m, wm, ex, h1, h3, y, z, idx, rows, cs32, cs64 compute.Tensor
	for _, sp := range []spec{
		{&ones, compute.F32, []int{M}}, {&f, compute.F32, []int{M}}, {&r, compute.F32, []int{M}}, {&m, compute.F32, []int{M}}, {&wm, compute.F32, []int{M}},
		{&ex, compute.F32, []int{M, Din}}, {&h1, compute.F32, []int{M, I}}, {&h3, compute.F32, []int{M, I}},
		{&y, compute.F32, []int{M, Din}}, {&z, compute.F32, []int{M, Din}},
		{&idx, compute.I32, []int{T, K}}, {&rows, compute.I32, []int{M}}, {&cs32, compute.I32, []int{E}},
		{&cs64, compute.I32, []int{2 * E}}, // int64 counts, read through desc64
	} {
		var err error
		if *sp.t, err = alloc(sp.dt, sp.d...); err != nil {
			return err
		}
	}
	var al [3]scalar
	var err error
	for i, v := range []float32{1, -1, float32(E)} {
		if al[i], err = b.scalar(v); err != nil {
			return err
		}
	}
	plus, minus, byE := al[0], al[1], al[2]
	vec := func(t compute.Tensor) operand { return operand{t: t, view: i64(M)} }
	// Every operator keeps a repeatable executor (runAs): at a fixed
	// token count the scratch lands at the same arena offsets, so a decode
	// step launches them again instead of preparing them.
	alphas := map[scalar]float32{plus: 1, minus: -1, byE: float32(E)}
	add := func(x, y operand, alpha scalar, out operand) func() error {
		return func() error {
			return b.runAs("aclnnAdd "+attr(alphas[alpha]), func(ts []tensorDesc) (prepared, error) { return b.drv.add(ts[0], ts[1], alpha, ts[2]) }, x, y, out)
		}
	}
	unary := func(name string, x, out operand) func() error {
		return func() error {
			return b.runAs(name, func(ts []tensorDesc) (prepared, error) { return b.drv.unary(name, ts[0], ts[1]) }, x, out)
		}
	}
	cast := func(x compute.Tensor, xv []int64, dt acl.DataType, out operand) func() error {
		return func() error {
			return b.runAs(fmt.Sprint("aclnnCast ", dt), func(ts []tensorDesc) (prepared, error) { return b.drv.cast(ts[0], dt, ts[1]) }, operand{t: x, view: xv}, out)
		}
	}
	gmm := func(x compute.Tensor, w []compute.Tensor, out compute.Tensor) func() error {
		return func() error {
			return b.runAs("aclnnGroupedMatmulV4", func(ts []tensorDesc) (prepared, error) { return b.drv.groupedMatmul(ts[0], ts[1], ts[2], ts[3]) },
				flat(x, x.Dims[1]), operand{t: w[0], stack: true}, operand{t: cs64, view: i64(E), i64: true}, flat(out, out.Dims[1]))
		}
	}
	steps := []func() error{
		func() error { // filled on the stream: a cached constant would be uploaded with a wait
			return b.runAs("aclnnInplaceFillScalar 1", func(ts []tensorDesc) (prepared, error) { return b.drv.fill(ts[0], plus) }, vec(ones))
		},
		cast(a.Indices, i64(M), acl.Float, vec(f)),
		add(vec(f), vec(ones), plus, vec(r)),
		unary("aclnnRelu", vec(r), vec(r)),
		unary("aclnnRelu", vec(f), vec(m)),
		add(vec(r), vec(m), minus, vec(m)),
		func() error {
			return b.runAs("aclnnMul", func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) },
				operand{t: a.Weights, view: i64(M)}, vec(m), vec(wm))
		},
		add(vec(ones), vec(m), minus, vec(r)),
		add(vec(f), vec(r), byE, vec(f)),
		cast(f, i64(M), acl.Int32, operand{t: idx, view: i64(M)}),
		func() error {
			return b.runAs(fmt.Sprint("aclnnMoeInitRoutingV2 ", E), func(ts []tensorDesc) (prepared, error) {
				return b.drv.moeInitRouting(ts[0], ts[1], E, ts[2], ts[3], ts[4])
			}, flat(a.X, Din), operand{t: idx, view: i64(T, K)}, flat(ex, Din), vec(rows), operand{t: cs32, view: i64(E)})
		},
		cast(cs32, i64(E), acl.Int64, operand{t: cs64, view: i64(E), i64: true}),
		gmm(ex, a.W1, h1),
		gmm(ex, a.W3, h3),
		func() error { return b.gatedAct(a.Act, h1, h1, h3) },
		gmm(h1, a.W2, y),
		func() error {
			return b.runAs("aclnnIndexSelect", func(ts []tensorDesc) (prepared, error) { return b.drv.indexSelect(ts[0], 0, ts[1], ts[2]) },
				flat(y, Din), vec(rows), flat(z, Din))
		},
		func() error {
			return b.runAs("aclnnMul", func(ts []tensorDesc) (prepared, error) { return b.drv.binary("aclnnMul", ts[0], ts[1], ts[2]) },
				flat(z, Din), operand{t: wm, view: i64(M, 1)}, flat(z, Din))
		},
		func() error {
			return b.runAs("aclnnInplaceCopy", func(ts []tensorDesc) (prepared, error) { return b.drv.inplaceCopy(ts[0], ts[1]) },
				flat(a.Out, Din), operand{t: z, view: i64(T, Din), strides: i64(K*Din, 1)})
		},
	}
	for j := 1; j < K; j++ {
		steps = append(steps, add(flat(a.Out, Din), operand{t: part(z, j*Din, (M-j)*Din), view: i64(T, Din), strides: i64(K*Din, 1)}, plus, flat(a.Out, Din)))
	}
	for i, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("ascend: grouped experts, step %d: %w", i, err)
		}
	}
	return nil
}
