//go:build !purego

#include "textflag.h"

// Data movement in the AVX-512 registers: transposes of 16x16 blocks of
// 32-bit elements, and rows gathered with the next ones prefetched.

// LOAD16 loads sixteen rows of 64 bytes into Z0-Z15: rows 0-3 from SI,
// 4-7 from R9, 8-11 from R10 and 12-15 from R11, DX bytes apart (R8 =
// 3*DX).
#define LOAD16 \
	VMOVDQU32 (SI), Z0; \
	VMOVDQU32 (SI)(DX*1), Z1; \
	VMOVDQU32 (SI)(DX*2), Z2; \
	VMOVDQU32 (SI)(R8*1), Z3; \
	VMOVDQU32 (R9), Z4; \
	VMOVDQU32 (R9)(DX*1), Z5; \
	VMOVDQU32 (R9)(DX*2), Z6; \
	VMOVDQU32 (R9)(R8*1), Z7; \
	VMOVDQU32 (R10), Z8; \
	VMOVDQU32 (R10)(DX*1), Z9; \
	VMOVDQU32 (R10)(DX*2), Z10; \
	VMOVDQU32 (R10)(R8*1), Z11; \
	VMOVDQU32 (R11), Z12; \
	VMOVDQU32 (R11)(DX*1), Z13; \
	VMOVDQU32 (R11)(DX*2), Z14; \
	VMOVDQU32 (R11)(R8*1), Z15

// TRANSPOSE16 transposes the 16x16 matrix of 32-bit elements whose rows
// are Z0-Z15 into Z0-Z15 (row i of the result in Zi), through Z16-Z31:
// pairs of rows interleaved by dwords, then by qwords, then 128-bit lanes
// gathered in two steps.
#define TRANSPOSE16 \
	VPUNPCKLDQ Z1, Z0, Z16; \
	VPUNPCKHDQ Z1, Z0, Z17; \
	VPUNPCKLDQ Z3, Z2, Z18; \
	VPUNPCKHDQ Z3, Z2, Z19; \
	VPUNPCKLDQ Z5, Z4, Z20; \
	VPUNPCKHDQ Z5, Z4, Z21; \
	VPUNPCKLDQ Z7, Z6, Z22; \
	VPUNPCKHDQ Z7, Z6, Z23; \
	VPUNPCKLDQ Z9, Z8, Z24; \
	VPUNPCKHDQ Z9, Z8, Z25; \
	VPUNPCKLDQ Z11, Z10, Z26; \
	VPUNPCKHDQ Z11, Z10, Z27; \
	VPUNPCKLDQ Z13, Z12, Z28; \
	VPUNPCKHDQ Z13, Z12, Z29; \
	VPUNPCKLDQ Z15, Z14, Z30; \
	VPUNPCKHDQ Z15, Z14, Z31; \
	VPUNPCKLQDQ Z18, Z16, Z0; \
	VPUNPCKHQDQ Z18, Z16, Z1; \
	VPUNPCKLQDQ Z19, Z17, Z2; \
	VPUNPCKHQDQ Z19, Z17, Z3; \
	VPUNPCKLQDQ Z22, Z20, Z4; \
	VPUNPCKHQDQ Z22, Z20, Z5; \
	VPUNPCKLQDQ Z23, Z21, Z6; \
	VPUNPCKHQDQ Z23, Z21, Z7; \
	VPUNPCKLQDQ Z26, Z24, Z8; \
	VPUNPCKHQDQ Z26, Z24, Z9; \
	VPUNPCKLQDQ Z27, Z25, Z10; \
	VPUNPCKHQDQ Z27, Z25, Z11; \
	VPUNPCKLQDQ Z30, Z28, Z12; \
	VPUNPCKHQDQ Z30, Z28, Z13; \
	VPUNPCKLQDQ Z31, Z29, Z14; \
	VPUNPCKHQDQ Z31, Z29, Z15; \
	VSHUFI32X4 $0x44, Z4, Z0, Z16; \
	VSHUFI32X4 $0xEE, Z4, Z0, Z17; \
	VSHUFI32X4 $0x44, Z12, Z8, Z18; \
	VSHUFI32X4 $0xEE, Z12, Z8, Z19; \
	VSHUFI32X4 $0x44, Z5, Z1, Z20; \
	VSHUFI32X4 $0xEE, Z5, Z1, Z21; \
	VSHUFI32X4 $0x44, Z13, Z9, Z22; \
	VSHUFI32X4 $0xEE, Z13, Z9, Z23; \
	VSHUFI32X4 $0x44, Z6, Z2, Z24; \
	VSHUFI32X4 $0xEE, Z6, Z2, Z25; \
	VSHUFI32X4 $0x44, Z14, Z10, Z26; \
	VSHUFI32X4 $0xEE, Z14, Z10, Z27; \
	VSHUFI32X4 $0x44, Z7, Z3, Z28; \
	VSHUFI32X4 $0xEE, Z7, Z3, Z29; \
	VSHUFI32X4 $0x44, Z15, Z11, Z30; \
	VSHUFI32X4 $0xEE, Z15, Z11, Z31; \
	VSHUFI32X4 $0x88, Z18, Z16, Z0; \
	VSHUFI32X4 $0xDD, Z18, Z16, Z4; \
	VSHUFI32X4 $0x88, Z19, Z17, Z8; \
	VSHUFI32X4 $0xDD, Z19, Z17, Z12; \
	VSHUFI32X4 $0x88, Z22, Z20, Z1; \
	VSHUFI32X4 $0xDD, Z22, Z20, Z5; \
	VSHUFI32X4 $0x88, Z23, Z21, Z9; \
	VSHUFI32X4 $0xDD, Z23, Z21, Z13; \
	VSHUFI32X4 $0x88, Z26, Z24, Z2; \
	VSHUFI32X4 $0xDD, Z26, Z24, Z6; \
	VSHUFI32X4 $0x88, Z27, Z25, Z10; \
	VSHUFI32X4 $0xDD, Z27, Z25, Z14; \
	VSHUFI32X4 $0x88, Z30, Z28, Z3; \
	VSHUFI32X4 $0xDD, Z30, Z28, Z7; \
	VSHUFI32X4 $0x88, Z31, Z29, Z11; \
	VSHUFI32X4 $0xDD, Z31, Z29, Z15

// func packAMXTilesAVX512(dst, src *uint16, stride, blocks int, next *uint16)
//
// Writes blocks k-blocks of one 16-column panel of a row-major bf16
// weight (src: the panel's first row, rows stride bytes apart) as AMX
// tiles (dst, 1 KB each): tile row i holds the sixteen rows' i-th pair of
// the block, so a tile is the 16x16 transpose of the block's 32-bit pairs
// (TRANSPOSE16). Each block also prefetches
// 1 KB of next (the next panel, as long as this one when stride is two
// blocks' k): sixteen rows read a block at a time are sixteen short
// streams that the hardware prefetchers barely follow.
TEXT ·packAMXTilesAVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ stride+16(FP), DX
	MOVQ blocks+24(FP), CX
	MOVQ next+32(FP), BX
	TESTQ CX, CX
	JZ packdone
	LEAQ (DX)(DX*2), R8 // 3 rows
	LEAQ (SI)(DX*4), R9 // row 4
	LEAQ (R9)(DX*4), R10 // row 8
	LEAQ (R10)(DX*4), R11 // row 12
packloop:
	PREFETCHT0 (BX)
	PREFETCHT0 64(BX)
	PREFETCHT0 128(BX)
	PREFETCHT0 192(BX)
	PREFETCHT0 256(BX)
	PREFETCHT0 320(BX)
	PREFETCHT0 384(BX)
	PREFETCHT0 448(BX)
	PREFETCHT0 512(BX)
	PREFETCHT0 576(BX)
	PREFETCHT0 640(BX)
	PREFETCHT0 704(BX)
	PREFETCHT0 768(BX)
	PREFETCHT0 832(BX)
	PREFETCHT0 896(BX)
	PREFETCHT0 960(BX)
	ADDQ $1024, BX
	LOAD16
	TRANSPOSE16
	VMOVDQU32 Z0, (DI)
	VMOVDQU32 Z1, 64(DI)
	VMOVDQU32 Z2, 128(DI)
	VMOVDQU32 Z3, 192(DI)
	VMOVDQU32 Z4, 256(DI)
	VMOVDQU32 Z5, 320(DI)
	VMOVDQU32 Z6, 384(DI)
	VMOVDQU32 Z7, 448(DI)
	VMOVDQU32 Z8, 512(DI)
	VMOVDQU32 Z9, 576(DI)
	VMOVDQU32 Z10, 640(DI)
	VMOVDQU32 Z11, 704(DI)
	VMOVDQU32 Z12, 768(DI)
	VMOVDQU32 Z13, 832(DI)
	VMOVDQU32 Z14, 896(DI)
	VMOVDQU32 Z15, 960(DI)
	ADDQ $64, SI
	ADDQ $64, R9
	ADDQ $64, R10
	ADDQ $64, R11
	ADDQ $1024, DI
	DECQ CX
	JNZ packloop
packdone:
	VZEROUPPER
	RET

// func transpose16AVX512(dst, src *float32, sstride, dstride int)
//
// Writes the transpose of the 16x16 float32 block at src (rows sstride
// bytes apart) to dst (rows dstride bytes apart).
TEXT ·transpose16AVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ sstride+16(FP), DX
	MOVQ dstride+24(FP), BX
	LEAQ (DX)(DX*2), R8 // 3 rows
	LEAQ (SI)(DX*4), R9 // row 4
	LEAQ (R9)(DX*4), R10 // row 8
	LEAQ (R10)(DX*4), R11 // row 12
	LOAD16
	TRANSPOSE16
	LEAQ (BX)(BX*2), R8
	LEAQ (DI)(BX*4), R9
	LEAQ (R9)(BX*4), R10
	LEAQ (R10)(BX*4), R11
	VMOVDQU32 Z0, (DI)
	VMOVDQU32 Z1, (DI)(BX*1)
	VMOVDQU32 Z2, (DI)(BX*2)
	VMOVDQU32 Z3, (DI)(R8*1)
	VMOVDQU32 Z4, (R9)
	VMOVDQU32 Z5, (R9)(BX*1)
	VMOVDQU32 Z6, (R9)(BX*2)
	VMOVDQU32 Z7, (R9)(R8*1)
	VMOVDQU32 Z8, (R10)
	VMOVDQU32 Z9, (R10)(BX*1)
	VMOVDQU32 Z10, (R10)(BX*2)
	VMOVDQU32 Z11, (R10)(R8*1)
	VMOVDQU32 Z12, (R11)
	VMOVDQU32 Z13, (R11)(BX*1)
	VMOVDQU32 Z14, (R11)(BX*2)
	VMOVDQU32 Z15, (R11)(R8*1)
	VZEROUPPER
	RET

// func gatherRowsAVX512(dst, src *float32, rows, width, stride int)
//
// Copies rows rows of width float32 (a multiple of 16) from src, rows
// stride bytes apart, to dst, rows side by side, prefetching the row
// eight ahead (a prefetch past src does not fault): rows a page or more
// apart are streams the hardware prefetchers do not follow.
TEXT ·gatherRowsAVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ rows+16(FP), CX
	MOVQ width+24(FP), R8
	MOVQ stride+32(FP), DX
	SHRQ $4, R8 // 64-byte lines a row
	TESTQ CX, CX
	JZ gatherdone
	TESTQ R8, R8
	JZ gatherdone
	LEAQ (DX)(DX*1), R9
	LEAQ (R9)(R9*1), R9
	LEAQ (R9)(R9*1), R9 // 8 rows
gatherrow:
	LEAQ (SI)(R9*1), R10
	MOVQ SI, R11
	MOVQ R8, BX
gatherline:
	PREFETCHT0 (R10)
	VMOVDQU32 (R11), Z0
	VMOVDQU32 Z0, (DI)
	ADDQ $64, R10
	ADDQ $64, R11
	ADDQ $64, DI
	DECQ BX
	JNZ gatherline
	ADDQ DX, SI
	DECQ CX
	JNZ gatherrow
gatherdone:
	VZEROUPPER
	RET

// func prefetchFloats(p *float32, n int)
//
// Prefetches into every cache level (PREFETCHT0) each 64-byte line that
// holds one of the n float32 from p; a prefetch never faults.
TEXT ·prefetchFloats(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	LEAQ (SI)(CX*4), CX // end
	ANDQ $-64, SI
prefetchline:
	CMPQ SI, CX
	JAE prefetchdone
	PREFETCHT0 (SI)
	ADDQ $64, SI
	JMP prefetchline
prefetchdone:
	RET
