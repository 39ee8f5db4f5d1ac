package kernel

// The Lightning Indexer in bf16 (the fast backend's opt-in): queries and
// keys rounded by RoundBF16DAZ, each key's dot product with a head one
// chain over the dimensions' pairs in order from zero, VDPBF16PS's
// (per pair the odd element's product and then the even one's added to
// a float32), then IndexerBlock's epilogue: w·max(dot, 0) rounded and the
// heads summed one after another. IndexerRowsBF16 and IndexerBlockBF16
// give a key the same bits, as IndexerRows and IndexerBlock do. Their
// assembly needs VDPBF16PS; elsewhere their Go twins serve, correct but
// slow.

// RoundBF16DAZ rounds src to bfloat16 into dst as VCVTNEPS2BF16 does: to
// nearest, ties to even, a value below float32's normal range read as a
// zero of its sign, a NaN quieted.
func RoundBF16DAZ(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	i := 0
	if hasBF16Dot {
		i = len(src) &^ 15
		if i > 0 {
			roundBF16AVX512(&dst[0], &src[0], i)
		}
	}
	for ; i < len(src); i++ {
		dst[i] = roundBF16DAZ(src[i])
	}
}

// TransposeQueryBF16 writes a query row's hi head vectors (q [hi][di], di
// even) rounded by RoundBF16DAZ into qp as pairs transposed, as
// IndexerRowsBF16 reads them: qp[p·hi+h] holds head h's dimension 2p in
// its low half and 2p+1 in its high half.
func TransposeQueryBF16(qp []uint32, q []float32, hi, di int) {
	qp, q = qp[:hi*di/2], q[:hi*di]
	for h := range hi {
		for p := range di / 2 {
			lo, hv := roundBF16DAZ(q[h*di+2*p]), roundBF16DAZ(q[h*di+2*p+1])
			qp[p*hi+h] = uint32(lo) | uint32(hv)<<16
		}
	}
}

// KeyPairsBF16 writes key (di floats, di even) rounded by RoundBF16DAZ
// into column s of kt, a block laid out as IndexerBlockBF16 reads it:
// kt[p·IndexerKeys+s] holds dimension 2p in its low half and 2p+1 in its
// high half. kb is scratch of at least di.
func KeyPairsBF16(kt []uint32, s int, key []float32, kb []uint16) {
	di := len(key)
	kb = kb[:di]
	_ = kt[(di/2-1)*IndexerKeys+s]
	RoundBF16DAZ(kb, key)
	for p := range di / 2 {
		kt[p*IndexerKeys+s] = uint32(kb[2*p]) | uint32(kb[2*p+1])<<16
	}
}

// IndexerRowsBF16Fast reports whether IndexerRowsBF16 runs its assembly
// tile for hi heads of di dimensions: where the CPU has VDPBF16PS, hi is
// a multiple of 16 (the heads fill the lanes) and di of 16.
func IndexerRowsBF16Fast(hi, di int) bool {
	return hasBF16Dot && hi > 0 && hi%16 == 0 && di > 0 && di%16 == 0
}

// IndexerRowsBF16 writes to t the bf16 scores of IndexerRowKeys keys in
// their stored layout, key s being k[s·stride:][:di] (di even), for one
// query row given by TransposeQueryBF16 (qp) and its head weights w. kb is
// scratch of at least IndexerRowKeys·di. ahead, when not empty, is the
// next keys the caller will score (laid out as k): the tile prefetches
// them while it rounds these.
func IndexerRowsBF16(t, k []float32, stride int, qp []uint32, w []float32, hi, di int, ahead []float32, kb []uint16) {
	checkEvenDim(di)
	t, qp, w, kb = t[:IndexerRowKeys], qp[:hi*di/2], w[:hi], kb[:IndexerRowKeys*di]
	_ = k[(IndexerRowKeys-1)*stride+di-1]
	if IndexerRowsBF16Fast(hi, di) {
		if len(ahead) == 0 {
			ahead = k
		}
		// Two lines a pair, over the next keys' rows as stored.
		step := IndexerRowKeys * stride * 4 / (di / 2)
		if hi%32 == 0 && indexerPairs {
			var acc [2 * IndexerRowKeys * 16]float32 // [chunk][key][head]
			indexerRowsBF16ZMM(&t[0], &k[0], stride, &kb[0], &qp[0], &w[0], hi, di, &ahead[0], step, &acc[0])
			return
		}
		indexerRowsBF16ZMM(&t[0], &k[0], stride, &kb[0], &qp[0], &w[0], hi, di, &ahead[0], step, nil)
		return
	}
	indexerRowsBF16Go(t, k, stride, qp, w, hi, di, kb)
}

// indexerRowsBF16Go is IndexerRowsBF16 in Go: the tiles' specification.
func indexerRowsBF16Go(t, k []float32, stride int, qp []uint32, w []float32, hi, di int, kb []uint16) {
	for s := range IndexerRowKeys {
		key := kb[s*di : (s+1)*di]
		for d, v := range k[s*stride : s*stride+di] {
			key[d] = roundBF16DAZ(v)
		}
		var sum float32
		for h := range hi {
			var acc float32
			for p := range di / 2 {
				qv := qp[p*hi+h]
				acc += bf16(key[2*p+1]) * bf16(uint16(qv>>16))
				acc += bf16(key[2*p]) * bf16(uint16(qv))
			}
			if acc > 0 {
				sum += float32(w[h] * acc) // the conversion forbids fusing into an FMA
			}
		}
		t[s] = sum
	}
}

// IndexerBlockBF16 writes to t the bf16 scores of a block of IndexerKeys
// keys given as pairs (KeyPairsBF16; zero columns score zero) for one
// query row: qb its hi head vectors of di bf16 each (di even, RoundBF16DAZ
// of [hi][di]), w its head weights. A key's score has IndexerRowsBF16's
// bits.
func IndexerBlockBF16(t []float32, kt []uint32, qb []uint16, w []float32, hi, di int) {
	checkEvenDim(di)
	t, kt, qb, w = t[:IndexerKeys], kt[:di/2*IndexerKeys], qb[:hi*di], w[:hi]
	if hasBF16Dot && hi > 0 && di >= 2 {
		indexerBlockBF16ZMM(&t[0], &kt[0], &qb[0], &w[0], hi, di)
		return
	}
	indexerBlockBF16Go(t, kt, qb, w, hi, di)
}

// indexerBlockBF16Go is IndexerBlockBF16 in Go.
func indexerBlockBF16Go(t []float32, kt []uint32, qb []uint16, w []float32, hi, di int) {
	for s := range IndexerKeys {
		var sum float32
		for h := range hi {
			qh := qb[h*di : (h+1)*di]
			var acc float32
			for p := range di / 2 {
				kv := kt[p*IndexerKeys+s]
				acc += bf16(uint16(kv>>16)) * bf16(qh[2*p+1])
				acc += bf16(uint16(kv)) * bf16(qh[2*p])
			}
			if acc > 0 {
				sum += float32(w[h] * acc)
			}
		}
		t[s] = sum
	}
}

func checkEvenDim(di int) {
	if di%2 != 0 {
		panic("kernel: a bf16 indexer of an odd dimension")
	}
}
