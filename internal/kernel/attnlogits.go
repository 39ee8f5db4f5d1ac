package kernel

// AttnLogitsKeys is the number of keys one AttnLogits call scores.
const AttnLogitsKeys = 8

// AttnLogitsFast reports whether AttnLogits runs its assembly tile for hg
// query heads: where the CPU has the 512-bit kernels and hg is a multiple
// of 32.
func AttnLogitsFast(hg int) bool { return hasZMM && hg > 0 && hg%32 == 0 }

// AttnLogitsAt is where AttnLogits puts key s's logit for head h of hg.
func AttnLogitsAt(s, h int) int { return ((h/32)*AttnLogitsKeys+s)*32 + h%32 }

// AttnLogits writes the dot products of AttnLogitsKeys keys (key s being
// k[s·stride:][:d]) with hg query heads given transposed (qt[i·hg+h]) to
// zt at AttnLogitsAt(s, h) (hg heads, rounded up to 32, times
// AttnLogitsKeys floats). Each is one FMA chain over the dimensions in
// order, starting from zero, or with acc from the value zt holds, so that
// a second call over more dimensions (a rope part) continues the chain.
// It reads the keys as stored, one element at a time broadcast to the
// heads in the lanes: every key is loaded once for all the heads.
func AttnLogits(zt, k []float32, stride int, qt []float32, hg, d int, acc bool) {
	zt = zt[:(hg+31)/32*32*AttnLogitsKeys]
	qt = qt[:d*hg]
	_ = k[(AttnLogitsKeys-1)*stride+d-1]
	if AttnLogitsFast(hg) && d > 0 {
		attnLogitsZMM(&zt[0], &k[0], stride, &qt[0], hg, d, boolInt(acc))
		return
	}
	attnLogitsGo(zt, k, stride, qt, hg, d, acc)
}

func attnLogitsGo(zt, k []float32, stride int, qt []float32, hg, d int, acc bool) {
	for s := range AttnLogitsKeys {
		key := k[s*stride : s*stride+d]
		for h := range hg {
			var z float32
			if acc {
				z = zt[AttnLogitsAt(s, h)]
			}
			for i, kv := range key {
				z += qt[i*hg+h] * kv
			}
			zt[AttnLogitsAt(s, h)] = z
		}
	}
}

// AttnLogitsBF16Fast reports whether AttnLogitsBF16 runs its assembly
// tile for hg query heads: where the CPU has VDPBF16PS and hg is a
// multiple of 32.
func AttnLogitsBF16Fast(hg int) bool { return hasBF16Dot && hg > 0 && hg%32 == 0 }

// AttnLogitsBF16 is AttnLogits in bf16 (the fast backend's opt-in): the
// keys rounded (RoundBF16DAZ; key s being k[s·stride:][:d], d even) and
// the queries given as pairs transposed (TransposeQueryBF16: qp[p·hg+h]
// holds head h's dimensions 2p and 2p+1). Each logit is one chain over
// the pairs in order, VDPBF16PS's (the odd element's product, then the
// even one's, added to a float32), from zero or with acc from the value
// zt holds, laid out as AttnLogits lays it out.
func AttnLogitsBF16(zt []float32, k []uint16, stride int, qp []uint32, hg, d int, acc bool) {
	checkEvenDim(d)
	zt = zt[:(hg+31)/32*32*AttnLogitsKeys]
	qp = qp[:d/2*hg]
	_ = k[(AttnLogitsKeys-1)*stride+d-1]
	if AttnLogitsBF16Fast(hg) && d > 0 {
		attnLogitsBF16ZMM(&zt[0], &k[0], stride, &qp[0], hg, d, boolInt(acc))
		return
	}
	attnLogitsBF16Go(zt, k, stride, qp, hg, d, acc)
}

func attnLogitsBF16Go(zt []float32, k []uint16, stride int, qp []uint32, hg, d int, acc bool) {
	for s := range AttnLogitsKeys {
		key := k[s*stride : s*stride+d]
		for h := range hg {
			var z float32
			if acc {
				z = zt[AttnLogitsAt(s, h)]
			}
			for p := range d / 2 {
				qv := qp[p*hg+h]
				z += bf16(key[2*p+1]) * bf16(uint16(qv>>16))
				z += bf16(key[2*p]) * bf16(uint16(qv))
			}
			zt[AttnLogitsAt(s, h)] = z
		}
	}
}

// boolInt is 1 for true, for an assembly argument.
func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
