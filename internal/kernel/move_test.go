package kernel

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTranspose checks Transpose element by element, with whole blocks in
// vector registers where the CPU has them and without.
func TestTranspose(t *testing.T) {
	saved := hasAVX512BW
	defer func() { hasAVX512BW = saved }()
	r := rand.New(rand.NewPCG(7, 8))
	for _, vec := range []bool{true, false} {
		hasAVX512BW = vec && saved
		for _, sh := range [][2]int{{1, 1}, {16, 16}, {128, 128}, {32, 128}, {128, 16}, {17, 33}, {15, 48}, {48, 15}, {130, 70}} {
			rows, cols := sh[0], sh[1]
			t.Run(fmt.Sprintf("vector=%v/%dx%d", hasAVX512BW, rows, cols), func(t *testing.T) {
				src := make([]float32, rows*cols)
				for i := range src {
					src[i] = r.Float32()
				}
				dst := make([]float32, rows*cols+1)
				dst[rows*cols] = 7
				Transpose(dst[:rows*cols], src, rows, cols)
				for i := range rows {
					for j := range cols {
						require.Equal(t, src[i*cols+j], dst[j*rows+i], "row %d col %d", i, j)
					}
				}
				require.Equal(t, float32(7), dst[rows*cols], "wrote past dst")
				// The same rows stride apart, inside a wider matrix whose
				// last row ends at the matrix's end.
				const off = 3
				stride := cols + 5
				wide := make([]float32, off+(rows-1)*stride+cols)
				for i := range rows {
					copy(wide[off+i*stride:], src[i*cols:(i+1)*cols])
				}
				from := make([]float32, rows*cols)
				TransposeFrom(from, wide[off:], rows, cols, stride)
				require.Equal(t, dst[:rows*cols], from, "stride %d", stride)
			})
		}
	}
}

// TestGatherRows checks GatherRows row by row, vector and plain, widths a
// multiple of 16 and not.
func TestGatherRows(t *testing.T) {
	saved := hasAVX512BW
	defer func() { hasAVX512BW = saved }()
	r := rand.New(rand.NewPCG(9, 10))
	for _, vec := range []bool{true, false} {
		hasAVX512BW = vec && saved
		for _, sh := range [][3]int{{1, 16, 16}, {9, 128, 2048}, {20, 48, 96}, {5, 20, 33}, {3, 128, 128}} {
			rows, width, stride := sh[0], sh[1], sh[2]
			src := make([]float32, (rows-1)*stride+width)
			for i := range src {
				src[i] = r.Float32()
			}
			dst := make([]float32, rows*width+1)
			dst[rows*width] = 7
			GatherRows(dst[:rows*width], src, rows, width, stride)
			for i := range rows {
				require.Equal(t, src[i*stride:i*stride+width], dst[i*width:(i+1)*width], "vector=%v %v row %d", hasAVX512BW, sh, i)
			}
			require.Equal(t, float32(7), dst[rows*width], "wrote past dst")
		}
	}
}

// TestPrefetch calls Prefetch on slices of every length up to a few lines
// at every offset within a line, the last one ending at the end of its
// backing array: a hint must return and leave the memory as it was.
func TestPrefetch(t *testing.T) {
	buf := make([]float32, 256)
	for i := range buf {
		buf[i] = float32(i)
	}
	Prefetch(nil)
	for off := range 16 {
		for n := 1; off+n <= len(buf); n += 1 + n/8 {
			Prefetch(buf[off : off+n])
		}
		Prefetch(buf[len(buf)-1-off:])
	}
	for i, v := range buf {
		require.Equal(t, float32(i), v, "element %d", i)
	}
}
