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

// IndexerRowKeys is the number of keys one IndexerRows call scores.
const IndexerRowKeys = 16

// IndexerRowsFast reports whether IndexerRows runs its assembly tile for
// hi heads: where the CPU has the 512-bit kernels and hi is a multiple of
// 16 (the heads fill the lanes).
func IndexerRowsFast(hi int) bool { return hasZMM && hi > 0 && hi%16 == 0 }

// IndexerRows writes to t the scores of IndexerRowKeys keys in their
// stored layout, key s being k[s·stride:][:di], for one query row whose
// head vectors are given transposed (qt[d·hi+h], TransposeQuery). Each
// key's score has the bits IndexerBlock gives it (the same FMA chains and
// head-ordered sum), so a row may be scored either way. It needs no
// transposed copy of the keys: with one query row, transposing them cost
// about as much as scoring them, the keys coming from memory. ahead, when
// not empty, is the next keys the caller will score (their first, laid
// out as k's): the tile prefetches them.
func IndexerRows(t, k []float32, stride int, qt, w []float32, hi, di int, ahead []float32) {
	t, qt, w = t[:IndexerRowKeys], qt[:hi*di], w[:hi]
	_ = k[(IndexerRowKeys-1)*stride+di-1]
	if IndexerRowsFast(hi) && di > 0 {
		if len(ahead) == 0 {
			ahead = k
		}
		// One line a dimension, over the next keys' rows as stored.
		step := IndexerRowKeys * stride * 4 / di
		if hi%32 == 0 && indexerPairs {
			var acc [2 * IndexerRowKeys * 16]float32 // [chunk][key][head]
			indexerRows32ZMM(&t[0], &k[0], stride, &qt[0], &w[0], hi, di, &ahead[0], step, &acc[0])
			return
		}
		indexerRowsZMM(&t[0], &k[0], stride, &qt[0], &w[0], hi, di, &ahead[0], step)
		return
	}
	indexerRowsGo(t, k, stride, qt, w, hi, di)
}

// indexerPairs lets IndexerRows and IndexerRowsBF16 take heads 32 at a
// time where they are a multiple of 32 (the same bits); tests turn it off
// to hold the two forms to each other.
var indexerPairs = true

// indexerRowsGo is IndexerRows in Go, with indexerBlockGo's arithmetic.
func indexerRowsGo(t, k []float32, stride int, qt, w []float32, hi, di int) {
	for s := range IndexerRowKeys {
		key := k[s*stride : s*stride+di]
		var sum float32
		for h := range hi {
			var acc float32
			for d, kv := range key {
				acc += qt[d*hi+h] * kv
			}
			if acc > 0 {
				sum += float32(w[h] * acc) // the conversion forbids fusing into an FMA
			}
		}
		t[s] = sum
	}
}

// TransposeQuery writes a query row's hi head vectors of di floats (q,
// [hi][di]) transposed into qt ([di][hi]), as IndexerRows reads them.
func TransposeQuery(qt, q []float32, hi, di int) {
	Transpose(qt[:hi*di], q[:hi*di], hi, di)
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
