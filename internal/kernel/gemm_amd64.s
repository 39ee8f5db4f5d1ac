//go:build !purego

#include "textflag.h"

// func gemm16x6AVX2(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, ostride int)
// The packed GEMM's register tile: out[r*ostride+i] (+)= sum_p w[r*wstride+p] *
// xp[p*xstride+i] for six weight rows r and sixteen x columns i, one FMA
// chain per output in p order. xp is a packed x panel (sixteen rows
// interleaved, xstride 16) or any rows of sixteen contiguous values, so x
// comes in as two vectors per p and each weight is broadcast; load != 0
// continues the chains from out (exact: the partial sums are float32).
TEXT ·gemm16x6AVX2(SB), NOSPLIT, $0-64
	MOVQ xp+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ wstride+16(FP), R11
	SHLQ $2, R11
	LEAQ (DI)(R11*2), R12
	ADDQ R11, R12            // weight row 3
	MOVQ kc+24(FP), CX
	MOVQ out+32(FP), DX
	MOVQ xstride+48(FP), R13
	SHLQ $2, R13
	MOVQ ostride+56(FP), R8
	SHLQ $2, R8
	LEAQ (DX)(R8*2), R9
	ADDQ R8, R9              // output row 3
	MOVQ load+40(FP), AX
	TESTQ AX, AX
	JZ   gzero
	VMOVUPS (DX), Y4
	VMOVUPS 32(DX), Y5
	VMOVUPS (DX)(R8*1), Y6
	VMOVUPS 32(DX)(R8*1), Y7
	VMOVUPS (DX)(R8*2), Y8
	VMOVUPS 32(DX)(R8*2), Y9
	VMOVUPS (R9), Y10
	VMOVUPS 32(R9), Y11
	VMOVUPS (R9)(R8*1), Y12
	VMOVUPS 32(R9)(R8*1), Y13
	VMOVUPS (R9)(R8*2), Y14
	VMOVUPS 32(R9)(R8*2), Y15
	JMP  gloop

gzero:
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15

gloop:
	TESTQ CX, CX
	JZ    gdone
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VBROADCASTSS (DI), Y2
	VFMADD231PS Y2, Y0, Y4
	VFMADD231PS Y2, Y1, Y5
	VBROADCASTSS (DI)(R11*1), Y3
	VFMADD231PS Y3, Y0, Y6
	VFMADD231PS Y3, Y1, Y7
	VBROADCASTSS (DI)(R11*2), Y2
	VFMADD231PS Y2, Y0, Y8
	VFMADD231PS Y2, Y1, Y9
	VBROADCASTSS (R12), Y3
	VFMADD231PS Y3, Y0, Y10
	VFMADD231PS Y3, Y1, Y11
	VBROADCASTSS (R12)(R11*1), Y2
	VFMADD231PS Y2, Y0, Y12
	VFMADD231PS Y2, Y1, Y13
	VBROADCASTSS (R12)(R11*2), Y3
	VFMADD231PS Y3, Y0, Y14
	VFMADD231PS Y3, Y1, Y15
	ADDQ R13, SI
	ADDQ $4, DI
	ADDQ $4, R12
	DECQ CX
	JMP  gloop

gdone:
	VMOVUPS Y4, (DX)
	VMOVUPS Y5, 32(DX)
	VMOVUPS Y6, (DX)(R8*1)
	VMOVUPS Y7, 32(DX)(R8*1)
	VMOVUPS Y8, (DX)(R8*2)
	VMOVUPS Y9, 32(DX)(R8*2)
	VMOVUPS Y10, (R9)
	VMOVUPS Y11, 32(R9)
	VMOVUPS Y12, (R9)(R8*1)
	VMOVUPS Y13, 32(R9)(R8*1)
	VMOVUPS Y14, (R9)(R8*2)
	VMOVUPS Y15, 32(R9)(R8*2)
	VZEROUPPER
	RET
