package kernel

// IndexerKeys is the number of keys one IndexerBlock call scores.
const IndexerKeys = 64

// IndexerBlock writes to t the Lightning Indexer's scores of IndexerKeys
// keys for one query row: t[s] = Σ_h w[h]·max(q[h]·k[s], 0), the heads
// summed in order. kt holds the keys transposed, kt[d·IndexerKeys+s] being
// dimension d of key s (di dimensions), and q the row's hi head vectors of
// di floats each. Each dot product is one FMA chain over d in order and
// each head's term is rounded before its sum (ReLUAxpy's arithmetic), the
// same for every key whatever its place, so exactly tied keys stay tied.
// A key's score does not depend on the other keys of the block nor on the
// other rows scored beside it. The 512-bit tile, where it runs
// (indexerWide), gives the same bits as the 256-bit one.
func IndexerBlock(t, kt, q, w []float32, hi, di int) {
	t, kt, q, w = t[:IndexerKeys], kt[:di*IndexerKeys], q[:hi*di], w[:hi]
	if hi > 0 && di > 0 && indexerWide() {
		indexerBlockZMM(&t[0], &kt[0], &q[0], &w[0], hi, di)
		return
	}
	if useAVX2 && hi > 0 && di > 0 {
		indexerBlockAVX2(&t[0], &kt[0], &q[0], &w[0], hi, di)
		return
	}
	indexerBlockGo(t, kt, q, w, hi, di)
}

// indexerBlockGo is IndexerBlock in Go (separate roundings where the
// assembly fuses the multiply-add).
func indexerBlockGo(t, kt, q, w []float32, hi, di int) {
	clear(t)
	var acc [IndexerKeys]float32
	for h := range hi {
		clear(acc[:])
		qh := q[h*di : (h+1)*di]
		for d, qv := range qh {
			row := kt[d*IndexerKeys : (d+1)*IndexerKeys]
			for s := range acc {
				acc[s] += qv * row[s]
			}
		}
		for s, v := range acc {
			if v > 0 {
				t[s] += float32(w[h] * v) // the conversion forbids fusing into an FMA
			}
		}
	}
}

// TransposeKeys8 writes eight keys, key s being src[s·stride:][:di], into
// a block laid out as IndexerBlock reads it: kt[d·IndexerKeys+s].
func TransposeKeys8(kt, src []float32, stride, di int) {
	_ = kt[(di-1)*IndexerKeys+7]
	_ = src[7*stride+di-1]
	if useAVX2 && di%8 == 0 {
		transpose8AVX2(&kt[0], &src[0], stride, di)
		return
	}
	for s := range 8 {
		for d, v := range src[s*stride : s*stride+di] {
			kt[d*IndexerKeys+s] = v
		}
	}
}

// indexerTileBits forces IndexerBlock's register width for tests and
// benchmarks: 0 follows hasZMM, 256 and 512 force that many bits (512
// needs hasZMM).
var indexerTileBits int

// indexerWide reports whether IndexerBlock runs its 512-bit tile: wherever
// the CPU has the 512-bit kernels (1.67x the 256-bit tile on Zen 4, whose
// 512-bit FMAs run as two halves; docs/bench).
func indexerWide() bool {
	switch indexerTileBits {
	case 256:
		return false
	case 512:
		return hasZMM
	}
	return hasZMM
}
