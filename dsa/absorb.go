package dsa

import (
	"fmt"
	"math"
)

// SplitKVB splits kv_b_proj [H·(dn+dv), Dc] into the absorbed-query matrix
// W_UKᵀ [H, Dc, dn] (q_lat = q_nope·W_UK, computed as a per-head product
// with its transpose) and the lift W_UV [H, dv, Dc] (out = W_UV·o_latent).
// It is a load-time transform on host memory.
func SplitKVB(wkvb []float32, h, dn, dv, dc int) (ukT, uv []float32, err error) {
	if len(wkvb) != h*(dn+dv)*dc {
		return nil, nil, fmt.Errorf("dsa: kv_b_proj has %d values, want %d×(%d+%d)×%d", len(wkvb), h, dn, dv, dc)
	}
	ukT = make([]float32, h*dc*dn)
	uv = make([]float32, h*dv*dc)
	for hh := 0; hh < h; hh++ {
		base := hh * (dn + dv) * dc
		for i := 0; i < dn; i++ {
			row := wkvb[base+i*dc : base+(i+1)*dc]
			for c, v := range row {
				ukT[(hh*dc+c)*dn+i] = v
			}
		}
		copy(uv[hh*dv*dc:(hh+1)*dv*dc], wkvb[base+dn*dc:base+(dn+dv)*dc])
	}
	return ukT, uv, nil
}

// RopeInterleaved rotates x (length dr, pairs (2i, 2i+1)) for position pos
// with angle pos·θ^(-2i/dr): MLA's layout.
func RopeInterleaved(x []float32, pos int, theta float64) {
	dr := len(x)
	for i := 0; i < dr/2; i++ {
		ang := float64(pos) * math.Pow(theta, -2*float64(i)/float64(dr))
		sin, cos := math.Sincos(ang)
		a, b := float64(x[2*i]), float64(x[2*i+1])
		x[2*i], x[2*i+1] = float32(a*cos-b*sin), float32(a*sin+b*cos)
	}
}

// RopeHalves rotates x (length dr, pairs (i, i+dr/2)), the non-interleaved
// ("neox") layout the Lightning Indexer uses on its first dr dims.
func RopeHalves(x []float32, pos int, theta float64) {
	dr := len(x)
	half := dr / 2
	for i := 0; i < half; i++ {
		ang := float64(pos) * math.Pow(theta, -2*float64(i)/float64(dr))
		sin, cos := math.Sincos(ang)
		a, b := float64(x[i]), float64(x[i+half])
		x[i], x[i+half] = float32(a*cos-b*sin), float32(a*sin+b*cos)
	}
}
