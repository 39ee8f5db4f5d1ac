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
		a := 0
		if acc {
			a = 1
		}
		attnLogitsZMM(&zt[0], &k[0], stride, &qt[0], hg, d, a)
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
