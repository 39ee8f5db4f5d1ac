package kernel

import "math"

// RMSNorm writes dst[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for each row
// of width d; w may be nil (no weight). dst may alias x.
func RMSNorm(dst, x, w []float32, d int, eps float32) {
	for r := 0; r+d <= len(x); r += d {
		row, out := x[r:r+d], dst[r:r+d]
		ss := float64(Dot(row, row))
		inv := float32(1 / math.Sqrt(ss/float64(d)+float64(eps)))
		MulScale(out, row, w, inv)
	}
}

// MulScale writes dst[i] = (x[i]·w[i])·s, each product rounded as Mul and
// then Scale round them, or x[i]·s where w is nil; dst may be x. Where
// the 512-bit kernels run it is one pass (mulScaleZMM), so a row is read
// and written once.
func MulScale(dst, x, w []float32, s float32) {
	dst = dst[:len(x)]
	if w != nil {
		w = w[:len(x)]
	}
	i := 0
	if len(x) >= 16 && wideElementwise() {
		i = len(x) &^ 15
		var wp *float32
		if w != nil {
			wp = &w[0]
		}
		mulScaleZMM(&dst[0], &x[0], wp, s, i)
	}
	if i == len(x) {
		return
	}
	if w != nil {
		Mul(dst[i:], x[i:], w[i:])
	} else {
		copy(dst[i:], x[i:])
	}
	Scale(dst[i:], s)
}

// LayerNorm writes dst[r] = (x[r] - mean) / sqrt(var + eps) * w + b for each
// row of width d (biased variance). dst may alias x.
func LayerNorm(dst, x, w, b []float32, d int, eps float32) {
	for r := 0; r+d <= len(x); r += d {
		row, out := x[r:r+d], dst[r:r+d]
		var sum float64
		for _, v := range row {
			sum += float64(v)
		}
		mean := sum / float64(d)
		var ss float64
		for _, v := range row {
			dv := float64(v) - mean
			ss += dv * dv
		}
		inv := 1 / math.Sqrt(ss/float64(d)+float64(eps))
		for i, v := range row {
			out[i] = float32((float64(v)-mean)*inv)*w[i] + b[i]
		}
	}
}

// Sigmoid returns 1/(1+e^-x), without overflow for large |x|.
func Sigmoid(x float32) float32 {
	if x >= 0 {
		return 1 / (1 + Exp(-x))
	}
	e := Exp(x)
	return e / (1 + e)
}

// SiLU returns x * sigmoid(x).
func SiLU(x float32) float32 { return x * Sigmoid(x) }

// Softplus returns log(1 + e^x), the identity above 20 as in PyTorch.
func Softplus(x float32) float32 {
	return max(x, 0) + log1pUnit(Exp(-abs32(x)))
}

// SoftplusSlice applies Softplus to every element, the exponentials eight
// at a time; the results equal Softplus's bit for bit.
func SoftplusSlice(x []float32) {
	var e [64]float32
	for i0 := 0; i0 < len(x); i0 += len(e) {
		c := min(len(e), len(x)-i0)
		v := x[i0 : i0+c]
		for i, xv := range v {
			e[i] = -abs32(xv)
		}
		ExpSlice(e[:c])
		for i, xv := range v {
			v[i] = max(xv, 0) + log1pUnit(e[i])
		}
	}
}

// log1pUnit returns log(1+y) for y in [0, 1] as 2·atanh(y/(2+y)) by its
// odd series; with s <= 1/3 the first omitted term is below 2e-8 relative.
// Softplus needs no more: log(1+e^x) = max(x, 0) + log(1+e^-|x|).
func log1pUnit(y float32) float32 {
	s := y / (2 + y)
	s2 := s * s
	p := float32(1.0 / 13)
	p = 1.0/11 + s2*p
	p = 1.0/9 + s2*p
	p = 1.0/7 + s2*p
	p = 1.0/5 + s2*p
	p = 1.0/3 + s2*p
	p = 1 + s2*p
	return 2 * s * p
}

// SiLUInPlace applies SiLU to every element (vectorised; the same values
// as SiLU).
func SiLUInPlace(x []float32) { SigmoidMul(x, x, x) }

// ConvSiLU4 runs KDA's short conv of width four with SiLU over the first
// cols channels (a multiple of 16) of rows output rows: out row r, channel
// c = SiLU of (((0 + w[c]·x_r[c]) + w[s+c]·x_{r+1}[c]) + w[2s+c]·x_{r+2}[c])
// + w[3s+c]·x_{r+3}[c], rows of out and x and the four taps of w all s
// floats apart. The bits are those of clearing an output row, MulAdd for
// each tap oldest first, and SiLUInPlace. It reports false, computing
// nothing, where no vector kernel serves (the caller then takes that
// general path).
func ConvSiLU4(out, x, w []float32, s, rows, cols int) bool {
	if !expWide() || !hasZMM || cols%16 != 0 || rows < 1 || cols < 16 || cols > s {
		return false
	}
	if len(out) < (rows-1)*s+cols || len(x) < (rows+2)*s+cols || len(w) < 3*s+cols {
		panic("kernel: ConvSiLU4 operand too short")
	}
	convSiLU4ZMM(&out[0], &x[0], &w[0], s, rows, cols, &expConsts)
	return true
}

// SigmoidInPlace applies the logistic function to every element.
func SigmoidInPlace(x []float32) { SigmoidSlice(x) }

// SwiGLU writes dst[i] = gate[i]·sigmoid(gate[i])·up[i], the products
// rounded in that order; dst may be gate. Both products run as vector
// multiplies (Mul): an expert's rows are 64 wide, and a scalar loop over
// them cost more than their sigmoid.
func SwiGLU(dst, gate, up []float32) {
	up, dst = up[:len(gate)], dst[:len(gate)]
	var buf [256]float32
	for off := 0; off < len(gate); off += len(buf) {
		n := min(len(gate)-off, len(buf))
		s, g := buf[:n], gate[off:off+n]
		copy(s, g)
		SigmoidSlice(s)
		Mul(s, g, s)
		Mul(dst[off:off+n], s, up[off:off+n])
	}
}

// SigmoidMul writes dst[i] = Sigmoid(gate[i]) * up[i], the output gate of
// KDA and of gated attention; dst may be up. The bits are those of
// SigmoidSlice then Mul on every path; where the 512-bit exponential runs
// the sigmoid stays in registers (sigmoidMulZMM), one pass over memory.
func SigmoidMul(dst, gate, up []float32) {
	up, dst = up[:len(gate)], dst[:len(gate)]
	i := 0
	if len(gate) >= 16 && expWide() {
		i = len(gate) &^ 15
		sigmoidMulZMM(&dst[0], &gate[0], &up[0], i, &expConsts)
	}
	var buf [256]float32
	for off := i; off < len(gate); off += len(buf) {
		n := min(len(gate)-off, len(buf))
		s := buf[:n]
		copy(s, gate[off:off+n])
		SigmoidSlice(s)
		Mul(dst[off:off+n], s, up[off:off+n])
	}
}

// SiTU writes dst[i] = beta*tanh(g/beta)*sigmoid(g) * linBeta*tanh(u/linBeta),
// Kimi K3's gated activation; linBeta 0 leaves the up branch unclipped.
// Where the 512-bit exponential runs, sixteen lanes at a time go through
// the whole activation in registers (situZMM: three exponentials, two
// tanh and the products, with no pass through memory between them).
// Elsewhere, and for the last few elements, the exponentials run eight at
// a time (ExpSlice, SigmoidSlice), 64 elements per round in stack buffers,
// and so does the last step where there is assembly (situAVX2). Every
// path gives the scalar loop's bits.
func SiTU(dst, gate, up []float32, beta, linBeta float32) {
	up, dst = up[:len(gate)], dst[:len(gate)]
	var sg, eg, eu [64]float32
	k := situConsts(beta, linBeta)
	i := 0
	if len(gate) >= 16 && expWide() {
		i = len(gate) &^ 15
		situZMM(&dst[0], &gate[0], &up[0], i, &expConsts, &k)
		if i == len(gate) {
			return
		}
		dst, gate, up = dst[i:], gate[i:], up[i:]
	}
	for i0 := 0; i0 < len(gate); i0 += len(sg) {
		c := min(len(sg), len(gate)-i0)
		g, u := gate[i0:i0+c], up[i0:i0+c]
		copy(sg[:c], g)
		twiceAbsQuotient(eg[:c], g, beta)
		SigmoidSlice(sg[:c])
		ExpSlice(eg[:c])
		if linBeta != 0 {
			twiceAbsQuotient(eu[:c], u, linBeta)
			ExpSlice(eu[:c])
		}
		done := 0
		if useAVX2 && c >= 8 {
			done = c &^ 7
			situAVX2(&dst[i0], &g[0], &u[0], &sg[0], &eg[0], &eu[0], done, &k)
		}
		for i := done; i < c; i++ {
			v := g[i]
			a := beta * tanhExp(v/beta, eg[i]) * sg[i]
			w := u[i]
			if linBeta != 0 {
				w = linBeta * tanhExp(w/linBeta, eu[i])
			}
			dst[i0+i] = a * w
		}
	}
}

// twiceAbsQuotient sets dst[i] = 2·|x[i]/c|, eight at a time where AVX2
// runs (the same bits: one rounded quotient, exact after it).
func twiceAbsQuotient(dst, x []float32, c float32) {
	dst = dst[:len(x)]
	i := 0
	if useAVX2 && len(x) >= 8 {
		i = len(x) &^ 7
		twiceAbsQuotientAVX2(&dst[0], &x[0], i, c)
	}
	for ; i < len(x); i++ {
		dst[i] = 2 * abs32(x[i]/c)
	}
}

// situConsts lays out situAVX2's constants: beta, linBeta, then those of
// tanhExp, each rounded to float32 as the scalar expressions round them.
func situConsts(beta, linBeta float32) [16]float32 {
	return [16]float32{beta, linBeta, 0.3, 1, 2, 62.0 / 2835, -17.0 / 315, 2.0 / 15, -1.0 / 3}
}

// tanhExp returns tanh(x) given e2 = exp(2|x|): 1 - 2/(e2+1) with the sign
// of x, and near zero, where that form cancels, the Taylor series (its
// first omitted term is below 2e-8 relative for |x| < 0.3).
func tanhExp(x, e2 float32) float32 {
	ax := abs32(x)
	if ax < 0.3 {
		x2 := x * x
		return x * (1 + x2*(-1.0/3+x2*(2.0/15+x2*(-17.0/315+x2*(62.0/2835)))))
	}
	t := 1 - 2/(e2+1) // e2 = +Inf gives 1
	if x < 0 {
		return -t
	}
	return t
}

func abs32(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// LogSumExp returns log Σ exp(x): the exponentials in float32 after the
// largest is taken out, summed in float64 (the log-probabilities a
// generation reports are computed so). scratch holds at least len(x)
// floats.
func LogSumExp(x, scratch []float32) float64 {
	m := Max(x)
	e := scratch[:len(x)]
	for i, v := range x {
		e[i] = v - m
	}
	ExpSlice(e)
	var z float64
	for _, v := range e {
		z += float64(v)
	}
	return float64(m) + math.Log(z)
}

// Softmax replaces x by softmax(x), subtracting the maximum first. A row of
// all -Inf becomes all zeros.
func Softmax(x []float32) {
	m := float32(math.Inf(-1))
	for _, v := range x {
		m = max(m, v)
	}
	if math.IsInf(float64(m), -1) {
		clear(x)
		return
	}
	var s float64
	for i, v := range x {
		e := Exp(v - m)
		x[i] = e
		s += float64(e)
	}
	inv := float32(1 / s)
	for i := range x {
		x[i] *= inv
	}
}

// Add writes dst[i] = a[i] + b[i]; dst may be a or b.
func Add(dst, a, b []float32) {
	b, dst = b[:len(a)], dst[:len(a)]
	i := 0
	if useAVX2 && len(a) >= 8 {
		i = len(a) &^ 7
		addAVX2(&dst[0], &a[0], &b[0], i)
	}
	for ; i < len(a); i++ {
		dst[i] = a[i] + b[i]
	}
}

// Mul writes dst[i] = a[i] * b[i]; dst may be a or b.
func Mul(dst, a, b []float32) {
	b, dst = b[:len(a)], dst[:len(a)]
	i := 0
	if useAVX2 && len(a) >= 8 {
		i = len(a) &^ 7
		mulAVX2(&dst[0], &a[0], &b[0], i)
	}
	for ; i < len(a); i++ {
		dst[i] = a[i] * b[i]
	}
}

// Scale multiplies every element of x by s.
func Scale(x []float32, s float32) {
	i := 0
	if len(x) >= 16 && wideElementwise() {
		i = len(x) &^ 15
		mulScaleZMM(&x[0], &x[0], nil, s, i)
	}
	if useAVX2 && len(x)-i >= 8 {
		n := (len(x) - i) &^ 7
		scaleAVX2(&x[i], s, n)
		i += n
	}
	for ; i < len(x); i++ {
		x[i] *= s
	}
}

// Axpy adds a*x to y.
func Axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	i := 0
	if useAVX2 && len(y) >= 8 {
		i = len(y) &^ 7
		axpyAVX2(&y[0], a, &x[0], i)
	}
	for ; i < len(y); i++ {
		y[i] += a * x[i]
	}
}

// RowUpdate sets row = a*row + b*u and adds c*row (the new row) to o, in
// one pass: a KDA state row's decay, delta-rule write and output read.
func RowUpdate(row, u, o []float32, a, b, c float32) {
	u, o = u[:len(row)], o[:len(row)]
	i := 0
	if useAVX2 && len(row) >= 8 {
		i = len(row) &^ 7
		rowUpdateAVX2(&row[0], &u[0], &o[0], a, b, c, i)
	}
	for ; i < len(row); i++ {
		r := a*row[i] + b*u[i]
		row[i] = r
		o[i] += c * r
	}
}

// RowUpdateDot sets row = row ⊙ e + a·k and returns the new row · q, in one
// pass: a V-first KDA state row's decay, delta-rule write and output.
func RowUpdateDot(row, e, k, q []float32, a float32) float32 {
	e, k, q = e[:len(row)], k[:len(row)], q[:len(row)]
	var s float32
	i := 0
	if useAVX2 && len(row) >= 8 {
		i = len(row) &^ 7
		s = rowUpdateDotAVX2(&row[0], &e[0], &k[0], &q[0], a, i)
	}
	for ; i < len(row); i++ {
		r := row[i]*e[i] + a*k[i]
		row[i] = r
		s += r * q[i]
	}
	return s
}

// Sub writes dst[i] = a[i] - b[i]; dst may be a or b.
func Sub(dst, a, b []float32) {
	b, dst = b[:len(a)], dst[:len(a)]
	i := 0
	if useAVX2 && len(a) >= 8 {
		i = len(a) &^ 7
		subAVX2(&dst[0], &a[0], &b[0], i)
	}
	for ; i < len(a); i++ {
		dst[i] = a[i] - b[i]
	}
}

// ReLUAxpy adds a·max(x, 0) to y: one index head's term of the Lightning
// Indexer's score. Results are bit-identical to the scalar loop whatever the
// length, so exactly tied keys stay tied.
func ReLUAxpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	i := 0
	if useAVX2 && len(y) >= 8 {
		i = len(y) &^ 7
		reluAxpyAVX2(&y[0], a, &x[0], i)
	}
	for ; i < len(y); i++ {
		if v := x[i]; v > 0 {
			y[i] += float32(a * v) // the conversion forbids fusing into an FMA
		}
	}
}

// MulAdd adds a[i]·b[i] to y[i], rounding the product before the sum (no
// fused multiply-add), so results are the same on every path and length.
func MulAdd(y, a, b []float32) {
	a, b = a[:len(y)], b[:len(y)]
	i := 0
	if useAVX2 && len(y) >= 8 {
		i = len(y) &^ 7
		mulAddAVX2(&y[0], &a[0], &b[0], i)
	}
	for ; i < len(y); i++ {
		y[i] += float32(a[i] * b[i])
	}
}

// RankUpdate sets row = row ⊙ e + Σ_i a[i]·b[i·ldb : i·ldb+len(row)]: one
// state row's decay and its chunk of delta-rule writes (KDA's chunked
// form), with the row kept in registers while the len(a) rows of b pass.
func RankUpdate(row, e, a, b []float32, ldb int) {
	n, c := len(row), len(a)
	e = e[:n]
	if c > 0 {
		_ = b[(c-1)*ldb+n-1]
	}
	x0 := 0
	if useAVX2 && n >= 64 && c > 0 {
		x0 = n &^ 63
		rankUpdateAVX2(&row[0], &e[0], &a[0], &b[0], ldb, c, x0)
	}
	for x := x0; x < n; x++ {
		acc := row[x] * e[x]
		for i, ai := range a {
			acc += ai * b[i*ldb+x]
		}
		row[x] = acc
	}
}

// Mix writes out[i] = (x[i]·a + y[i]·b)·c, each product and sum rounded on
// its own (no fused multiply-add) on every path: the merge of an AttnRes
// partial into its running softmax.
func Mix(out, x, y []float32, a, b, c float32) {
	x, y = x[:len(out)], y[:len(out)]
	i := 0
	if useAVX2 && len(out) >= 8 {
		i = len(out) &^ 7
		mixAVX2(&out[0], &x[0], &y[0], a, b, c, i)
	}
	for ; i < len(out); i++ {
		out[i] = float32(float32(float32(x[i]*a)+float32(y[i]*b)) * c)
	}
}

// KDARows runs KDA's decode pass over one head's V-first state st
// ([dv][dk]): for each row r, u[r] = beta·(v[r] - row·ke), then
// row = row ⊙ e + u[r]·k and o[r] = row·q. Each row gets exactly the
// arithmetic of Dot followed by RowUpdateDot; the rows go in one call.
// u receives the corrected values, the records ReplaySSM replays from.
func KDARows(st, ke, e, k, q, v, o, u []float32, beta float32) {
	dk, dv := len(ke), len(o)
	st, e, k, q, v, u = st[:dv*dk], e[:dk], k[:dk], q[:dk], v[:dv], u[:dv]
	if stateWide() && dk%32 == 0 && dk > 0 && dv > 0 {
		kdaRowsZMM(&st[0], &ke[0], &e[0], &k[0], &q[0], &v[0], &o[0], &u[0], beta, dk, dv)
		return
	}
	if useAVX2 && dk >= 8 && dk%8 == 0 && dv > 0 {
		kdaRowsAVX2(&st[0], &ke[0], &e[0], &k[0], &q[0], &v[0], &o[0], &u[0], beta, dk, dv)
		return
	}
	for r := range dv {
		row := st[r*dk : (r+1)*dk]
		u[r] = beta * (v[r] - Dot(row, ke))
		o[r] = RowUpdateDot(row, e, k, q, u[r])
	}
}

// ReplayRows applies n ReplaySSM records to one V-first KDA state row:
// for record i, row = row ⊙ a_i + u_i·k_i, where a_i and k_i are the dk
// floats at a[i·stride:] and k[i·stride:] and u_i is u[i·ustride]. Every
// element gets RowUpdateDot's arithmetic, so the row ends bitwise as n
// RowUpdateDot calls (and so n decode steps, KDARows) leave it; the row
// stays in registers across the records.
func ReplayRows(row, a, k []float32, stride int, u []float32, ustride, n int) {
	dk := len(row)
	if n == 0 || dk == 0 {
		return
	}
	_ = a[(n-1)*stride+dk-1]
	_ = k[(n-1)*stride+dk-1]
	_ = u[(n-1)*ustride]
	// Each element's records form one dependent chain (a product, then an
	// FMA, per record); lane width changes no bit.
	i := 0
	if stateWide() {
		for ; i+128 <= dk; i += 128 {
			replayRowsZMM(&row[i], &a[i], &k[i], &u[0], n, stride, ustride, 8)
		}
		for ; i+16 <= dk; i += 16 {
			replayRowsZMM(&row[i], &a[i], &k[i], &u[0], n, stride, ustride, 1)
		}
	}
	if useAVX2 {
		for ; i+32 <= dk; i += 32 {
			replayRowsAVX2(&row[i], &a[i], &k[i], &u[0], n, stride, ustride, 4)
		}
		for ; i+8 <= dk; i += 8 {
			replayRowsAVX2(&row[i], &a[i], &k[i], &u[0], n, stride, ustride, 1)
		}
	}
	if i == dk {
		return
	}
	// The rest, as RowUpdateDot does it: its vector part where it has one,
	// the scalar loop after.
	q := zeros[:]
	if dk-i > len(q) {
		q = make([]float32, dk-i)
	}
	for r := range n {
		RowUpdateDot(row[i:], a[r*stride+i:r*stride+dk], k[r*stride+i:r*stride+dk], q[:dk-i], u[r*ustride])
	}
}

// stateTileBits forces the register width of ReplayRows and KDARows
// for tests and benchmarks: 0 follows wideFMA, 256 and 512 force that
// many bits (512 needs hasZMM).
var stateTileBits int

func stateWide() bool {
	switch stateTileBits {
	case 256:
		return false
	case 512:
		return hasZMM
	}
	return wideFMA()
}

// zeros is ReplayRows' q for RowUpdateDot (the dot is not wanted).
var zeros [1024]float32

// Max returns the largest element of x (at least one; no NaNs): the value
// a running max gives, since a max rounds nothing (a zero's sign may
// differ).
func Max(x []float32) float32 {
	m := x[0]
	i := 0
	if useAVX2 && len(x) >= 8 {
		i = len(x) &^ 7
		m = maxAVX2(&x[0], i)
	}
	for ; i < len(x); i++ {
		if x[i] > m {
			m = x[i]
		}
	}
	return m
}
