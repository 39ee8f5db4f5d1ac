package floatx

import "fmt"

// WeightBlock is the side of the square weight blocks that DeepSeek-style
// fp8 checkpoints scale together (weight_block_size [128, 128]).
const WeightBlock = 128

// DequantE4M3Weight expands an fp8 e4m3fn weight of rows×cols into dst
// (rows*cols float32s), each value times the scale of its blockRows×
// blockCols tile: scale is row-major [ceil(rows/blockRows),
// ceil(cols/blockCols)]. DeepSeek's weight_scale_inv is 128×128 tiles; a
// per-row scale is 1×cols tiles, a per-tensor one rows×cols. Products are
// rounded to float32.
func DequantE4M3Weight(dst []float32, w []uint8, scale []float32, rows, cols, blockRows, blockCols int) error {
	if blockRows <= 0 || blockCols <= 0 {
		return fmt.Errorf("floatx: block %d×%d", blockRows, blockCols)
	}
	br, bc := (rows+blockRows-1)/blockRows, (cols+blockCols-1)/blockCols
	switch {
	case len(w) != rows*cols:
		return fmt.Errorf("floatx: fp8 weight has %d bytes, want %d×%d", len(w), rows, cols)
	case len(dst) != rows*cols:
		return fmt.Errorf("floatx: destination has %d elements, want %d×%d", len(dst), rows, cols)
	case len(scale) != br*bc:
		return fmt.Errorf("floatx: scale has %d entries, want %d×%d blocks of %d×%d", len(scale), br, bc, blockRows, blockCols)
	}
	for r := 0; r < rows; r++ {
		srow := scale[(r/blockRows)*bc : (r/blockRows+1)*bc]
		wrow, drow := w[r*cols:(r+1)*cols], dst[r*cols:(r+1)*cols]
		for c, b := range wrow {
			drow[c] = e4m3[b] * srow[c/blockCols]
		}
	}
	return nil
}

// QuantE4M3Act quantises activations row by row in groups of block values
// with one scale per group (amax/448, DeepSeek's per-128 activation blocks),
// writing codes to q and scales to scale ([rows, ceil(cols/block)]).
// A group of zeros gets scale 1 so that dequantisation stays exact.
func QuantE4M3Act(q []uint8, scale []float32, x []float32, rows, cols, block int) error {
	nb := (cols + block - 1) / block
	if block <= 0 || len(x) != rows*cols || len(q) != rows*cols || len(scale) != rows*nb {
		return fmt.Errorf("floatx: activation quantisation shapes: x %d, q %d, scale %d for %d×%d block %d",
			len(x), len(q), len(scale), rows, cols, block)
	}
	for r := 0; r < rows; r++ {
		for b := 0; b < nb; b++ {
			lo, hi := r*cols+b*block, min(r*cols+(b+1)*block, (r+1)*cols)
			var amax float32
			for _, v := range x[lo:hi] {
				amax = max(amax, abs32(v))
			}
			s := amax / MaxE4M3
			if s == 0 {
				s = 1
			}
			scale[r*nb+b] = s
			for i := lo; i < hi; i++ {
				q[i] = E4M3(x[i] / s)
			}
		}
	}
	return nil
}

// DequantE4M3Act reverses QuantE4M3Act.
func DequantE4M3Act(dst []float32, q []uint8, scale []float32, rows, cols, block int) error {
	nb := (cols + block - 1) / block
	if block <= 0 || len(dst) != rows*cols || len(q) != rows*cols || len(scale) != rows*nb {
		return fmt.Errorf("floatx: activation dequantisation shapes: dst %d, q %d, scale %d for %d×%d block %d",
			len(dst), len(q), len(scale), rows, cols, block)
	}
	for i := range dst {
		r, c := i/cols, i%cols
		dst[i] = e4m3[q[i]] * scale[r*nb+c/block]
	}
	return nil
}

func abs32(v float32) float32 {
	if v < 0 {
		return -v
	}
	return v
}

// BF16ToF32 widens a slice of bfloat16 values.
func BF16ToF32(dst []float32, src []uint16) {
	for i, h := range src[:len(dst)] {
		dst[i] = FromBF16(h)
	}
}

// F16ToF32 widens a slice of binary16 values.
func F16ToF32(dst []float32, src []uint16) {
	for i, h := range src[:len(dst)] {
		dst[i] = FromF16(h)
	}
}
