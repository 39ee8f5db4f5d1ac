package kernel

// Transpose writes the transpose of src, a row-major [rows, cols] matrix,
// to dst as a row-major [cols, rows] one: dst[c*rows+r] = src[r*cols+c].
// Whole 16x16 blocks are transposed in vector registers where the CPU has
// AVX-512 (the flag the repacking kernels share); the edges go element by
// element.
func Transpose(dst, src []float32, rows, cols int) {
	TransposeFrom(dst, src, rows, cols, cols)
}

// TransposeFrom is Transpose of a [rows, cols] matrix whose rows lie
// stride elements apart in src (stride >= cols): dst[c*rows+r] =
// src[r*stride+c]. One head's keys of a cache whose heads interleave are
// transposed so without a gathered copy.
func TransposeFrom(dst, src []float32, rows, cols, stride int) {
	if rows == 0 || cols == 0 {
		return
	}
	if stride < cols {
		panic("kernel: TransposeFrom's rows overlap (stride below cols)")
	}
	_, _ = src[(rows-1)*stride+cols-1], dst[rows*cols-1]
	rv, cv := 0, 0
	if hasAVX512BW {
		rv, cv = rows&^15, cols&^15
		for r0 := 0; r0 < rv; r0 += 16 {
			for c0 := 0; c0 < cv; c0 += 16 {
				transpose16AVX512(&dst[c0*rows+r0], &src[r0*stride+c0], 4*stride, 4*rows)
			}
		}
	}
	for r := range rows {
		c0 := 0
		if r < rv {
			c0 = cv
		}
		for c := c0; c < cols; c++ {
			dst[c*rows+r] = src[r*stride+c]
		}
	}
}

// GatherRows copies rows rows of width elements of src, stride apart
// (src[r*stride : r*stride+width]), to dst side by side: one head's rows
// of a [T, H, D] tensor. Where the CPU has AVX-512 and width is a multiple
// of 16 each row is copied with the row eight ahead prefetched, since
// rows a page or more apart are streams the hardware prefetchers do not
// follow.
func GatherRows(dst, src []float32, rows, width, stride int) {
	if rows == 0 || width == 0 {
		return
	}
	_, _ = dst[rows*width-1], src[(rows-1)*stride+width-1]
	if hasAVX512BW && width%16 == 0 {
		gatherRowsAVX512(&dst[0], &src[0], rows, width, 4*stride)
		return
	}
	for r := range rows {
		copy(dst[r*width:(r+1)*width], src[r*stride:r*stride+width])
	}
}

// Prefetch asks the CPU to bring x into its caches without waiting for
// it: a gather of rows from scattered addresses (a sparse attention's
// selected keys) prefetches the rows it copies a few rows later, so that
// their misses overlap instead of each starting when the copy reaches it.
// It does nothing where the kernels have no assembly.
func Prefetch(x []float32) {
	if len(x) == 0 {
		return
	}
	prefetchFloats(&x[0], len(x))
}
