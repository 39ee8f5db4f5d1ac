package kernel

// PairRowsBF16 writes rows 2p and 2p+1 of v (rows of n floats, ldv apart;
// rows of them, an odd last one paired with zeros) rounded by
// RoundBF16DAZ into dst as pairs, as MatAccumulatePairs reads its b:
// dst[p·n+x] holds row 2p's column x in its low half and row 2p+1's in its
// high half. dst holds at least (rows+1)/2·n.
func PairRowsBF16(dst []uint32, v []float32, ldv, rows, n int) {
	if rows == 0 || n == 0 {
		return
	}
	_ = v[(rows-1)*ldv+n-1]
	dst = dst[:(rows+1)/2*n]
	for p := range (rows + 1) / 2 {
		d, lo := dst[p*n:(p+1)*n], v[2*p*ldv:2*p*ldv+n]
		var hi []float32
		if 2*p+1 < rows {
			hi = v[(2*p+1)*ldv : (2*p+1)*ldv+n]
		}
		x := 0
		if hasBF16Dot && hi != nil {
			x = n &^ 15
			if x > 0 {
				pairRowsBF16ZMM(&d[0], &lo[0], &hi[0], x)
			}
		}
		for ; x < n; x++ {
			var h uint16
			if hi != nil {
				h = roundBF16DAZ(hi[x])
			}
			d[x] = uint32(roundBF16DAZ(lo[x])) | uint32(h)<<16
		}
	}
}

// MatAccumulatePairs is MatAccumulate in bf16: it adds a·b to m rows of c
// (ldc floats apart), a [m][2·kp] rounded (ab, RoundBF16DAZ of its rows,
// lda elements apart, lda even) and b [2·kp][n] as pairs of rows (bp,
// PairRowsBF16 with n columns). c[r·ldc+x] continues
// from its value with one chain over the pairs in order, VDPBF16PS's (the
// odd element's product, then the even one's, added to a float32), six
// rows by 32 columns (the rows past the last six one by 64 columns) on
// the CPU's bf16 dot product where it has it and the rest in Go, with the
// same bits.
func MatAccumulatePairs(c []float32, ldc int, ab []uint16, lda int, bp []uint32, m, n, kp int) {
	if m == 0 || n == 0 {
		return
	}
	checkEvenDim(lda)
	_ = c[(m-1)*ldc+n-1]
	if kp > 0 {
		_ = ab[(m-1)*lda+2*kp-1]
		_ = bp[(kp-1)*n+n-1]
	}
	rows, cols, cols1 := 0, 0, 0
	if hasBF16Dot && kp > 0 {
		rows, cols, cols1 = m/6*6, n&^31, n&^63
		for r := 0; r < rows; r += 6 {
			for x := 0; x < cols; x += 32 {
				matAccPairs6x32ZMM(&c[r*ldc+x], ldc, &ab[r*lda], lda, &bp[x], n, kp)
			}
		}
		for r := rows; r < m; r++ {
			for x := 0; x < cols1; x += 64 {
				matAccPairs1x64ZMM(&c[r*ldc+x], &ab[r*lda], &bp[x], n, kp)
			}
		}
	}
	for r := range m {
		lo := cols
		if r >= rows {
			lo = cols1
		}
		matAccPairsGo(c[r*ldc:], ab[r*lda:], bp, n, kp, lo)
	}
}

// matAccPairsGo is MatAccumulatePairs' arithmetic for row r's columns
// from lo on.
func matAccPairsGo(c []float32, ab []uint16, bp []uint32, n, kp, lo int) {
	for x := lo; x < n; x++ {
		acc := c[x]
		for p := range kp {
			bv := bp[p*n+x]
			acc += bf16(ab[2*p+1]) * bf16(uint16(bv>>16))
			acc += bf16(ab[2*p]) * bf16(uint16(bv))
		}
		c[x] = acc
	}
}
