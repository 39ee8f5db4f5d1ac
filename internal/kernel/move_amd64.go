//go:build !purego

package kernel

// The kernels of move_amd64.s.

//go:noescape
func packAMXTilesAVX512(dst, src *uint16, stride, blocks int, next *uint16)

//go:noescape
func transpose16AVX512(dst, src *float32, sstride, dstride int)

//go:noescape
func gatherRowsAVX512(dst, src *float32, rows, width, stride int)

//go:noescape
func prefetchFloats(p *float32, n int)
