//go:build !purego

#include "textflag.h"
#include "dpbf_amd64.h"

// The fast (one bf16 part) products over pair-interleaved bf16 weights
// (PackKPairs: panels of 48 weight rows stored [k/2][48][2]) and x rows
// rounded to bf16. Each step broadcasts one pair of an x row (x[2q],
// x[2q+1], a dword) and VDPBF16PS adds its products with the 48 columns'
// pairs into 48 float32 lanes: each output is one chain over k's pairs in
// order, so the tile shape never changes a result's bits. The tiles are
// kmajor_amd64.s's with the widening loads replaced by plain loads and
// each FMA by a VDPBF16PS; a step reads 192 weight bytes (three lines).
//
// Registers: Z0-Z2 the weight pairs of one step, Z3-Z7 broadcasts, Z8-Z31
// accumulators (three per x row). With acc != 0 the chains continue from
// the values in out, else they start at zero.

#define WLOAD3 \
	VMOVDQU32 (DI), Z0; VMOVDQU32 64(DI), Z1; VMOVDQU32 128(DI), Z2

#define WLOAD3AT(base) \
	VMOVDQU32 (base), Z0; VMOVDQU32 64(base), Z1; VMOVDQU32 128(base), Z2

#define DP3(b, a0, a1, a2) \
	DPBF(0, b, a0); DPBF(1, b, a1); DPBF(2, b, a2)

#define ZERO3(a0, a1, a2) \
	VPXORD a0, a0, a0; VPXORD a1, a1, a1; VPXORD a2, a2, a2

#define LOAD3(a0, a1, a2) \
	VMOVUPS (DX), a0; VMOVUPS 64(DX), a1; VMOVUPS 128(DX), a2; ADDQ R10, DX

#define STORE3(a0, a1, a2) \
	VMOVUPS a0, (DX); VMOVUPS a1, 64(DX); VMOVUPS a2, 128(DX); ADDQ R10, DX

// PF3 prefetches the three lines R14 bytes past base (a step's weights).
#define PF3(base) PREFETCHT0 (base)(R14*1); PREFETCHT0 64(base)(R14*1); PREFETCHT0 128(base)(R14*1)

// ARGS loads the common arguments: SI x, R11 x stride in bytes, DI w,
// CX the pair steps, DX out, R10 out stride in bytes, AX acc.
#define ARGS \
	MOVQ x+0(FP), SI; MOVQ xstride+8(FP), R11; SHLQ $1, R11; \
	MOVQ w+16(FP), DI; MOVQ kp+24(FP), CX; \
	MOVQ out+32(FP), DX; MOVQ ostride+40(FP), R10; SHLQ $2, R10; \
	MOVQ acc+48(FP), AX; \
	MOVQ $1536, R14

// The multi-stream tiles run R x rows against one panel in each of S
// streams, R·S = 8, as kmajor_amd64.s's do.
//
// MARGS loads: SI x, R11 x stride (bytes), BX the panel pointers, CX the
// pair steps, DX the output pointers, R10 out stride (bytes), AX acc.
#define MARGS \
	MOVQ x+0(FP), SI; MOVQ xstride+8(FP), R11; SHLQ $1, R11; \
	MOVQ w+16(FP), BX; MOVQ kp+24(FP), CX; \
	MOVQ out+32(FP), DX; MOVQ ostride+40(FP), R10; SHLQ $2, R10; \
	MOVQ acc+48(FP), AX; \
	MOVQ ahead+56(FP), R14

// func kpair8(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride, acc, ahead int)
TEXT ·kpair8(SB), NOSPLIT, $0-64
	ARGS
	MOVQ ahead+56(FP), R14 // the caller's prefetch distance (kpair8Ahead)
	LEAQ (SI)(R11*2), R12
	ADDQ R11, R12         // row 3
	LEAQ (R12)(R11*2), R13
	ADDQ R11, R13         // row 6
	MOVQ DX, R9
	TESTQ AX, AX
	JZ    zero8
	LOAD3(Z8, Z9, Z10)
	LOAD3(Z11, Z12, Z13)
	LOAD3(Z14, Z15, Z16)
	LOAD3(Z17, Z18, Z19)
	LOAD3(Z20, Z21, Z22)
	LOAD3(Z23, Z24, Z25)
	LOAD3(Z26, Z27, Z28)
	LOAD3(Z29, Z30, Z31)
	MOVQ R9, DX
	JMP  loop8

zero8:
	ZERO3(Z8, Z9, Z10)
	ZERO3(Z11, Z12, Z13)
	ZERO3(Z14, Z15, Z16)
	ZERO3(Z17, Z18, Z19)
	ZERO3(Z20, Z21, Z22)
	ZERO3(Z23, Z24, Z25)
	ZERO3(Z26, Z27, Z28)
	ZERO3(Z29, Z30, Z31)

loop8:
	TESTQ CX, CX
	JZ    done8
	PF3(DI)
	WLOAD3
	VPBROADCASTD (SI), Z3
	DP3(3, 8, 9, 10)
	VPBROADCASTD (SI)(R11*1), Z4
	DP3(4, 11, 12, 13)
	VPBROADCASTD (SI)(R11*2), Z5
	DP3(5, 14, 15, 16)
	VPBROADCASTD (R12), Z6
	DP3(6, 17, 18, 19)
	VPBROADCASTD (SI)(R11*4), Z7
	DP3(7, 20, 21, 22)
	VPBROADCASTD (R12)(R11*2), Z3
	DP3(3, 23, 24, 25)
	VPBROADCASTD (R13), Z4
	DP3(4, 26, 27, 28)
	VPBROADCASTD (R13)(R11*1), Z5
	DP3(5, 29, 30, 31)
	ADDQ $192, DI
	ADDQ $4, SI
	ADDQ $4, R12
	ADDQ $4, R13
	DECQ CX
	JMP  loop8

done8:
	STORE3(Z8, Z9, Z10)
	STORE3(Z11, Z12, Z13)
	STORE3(Z14, Z15, Z16)
	STORE3(Z17, Z18, Z19)
	STORE3(Z20, Z21, Z22)
	STORE3(Z23, Z24, Z25)
	STORE3(Z26, Z27, Z28)
	STORE3(Z29, Z30, Z31)
	VZEROUPPER
	RET

// func kpair4(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride int, acc int)
TEXT ·kpair4(SB), NOSPLIT, $0-56
	ARGS
	LEAQ (SI)(R11*2), R12
	ADDQ R11, R12         // row 3
	MOVQ DX, R9
	TESTQ AX, AX
	JZ    zero4
	LOAD3(Z8, Z9, Z10)
	LOAD3(Z11, Z12, Z13)
	LOAD3(Z14, Z15, Z16)
	LOAD3(Z17, Z18, Z19)
	MOVQ R9, DX
	JMP  loop4

zero4:
	ZERO3(Z8, Z9, Z10)
	ZERO3(Z11, Z12, Z13)
	ZERO3(Z14, Z15, Z16)
	ZERO3(Z17, Z18, Z19)

loop4:
	TESTQ CX, CX
	JZ    done4
	PF3(DI)
	WLOAD3
	VPBROADCASTD (SI), Z3
	DP3(3, 8, 9, 10)
	VPBROADCASTD (SI)(R11*1), Z4
	DP3(4, 11, 12, 13)
	VPBROADCASTD (SI)(R11*2), Z5
	DP3(5, 14, 15, 16)
	VPBROADCASTD (R12), Z6
	DP3(6, 17, 18, 19)
	ADDQ $192, DI
	ADDQ $4, SI
	ADDQ $4, R12
	DECQ CX
	JMP  loop4

done4:
	STORE3(Z8, Z9, Z10)
	STORE3(Z11, Z12, Z13)
	STORE3(Z14, Z15, Z16)
	STORE3(Z17, Z18, Z19)
	VZEROUPPER
	RET

// func kpair2(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride int, acc int)
TEXT ·kpair2(SB), NOSPLIT, $0-56
	ARGS
	MOVQ DX, R9
	TESTQ AX, AX
	JZ    zero2
	LOAD3(Z8, Z9, Z10)
	LOAD3(Z11, Z12, Z13)
	MOVQ R9, DX
	JMP  loop2

zero2:
	ZERO3(Z8, Z9, Z10)
	ZERO3(Z11, Z12, Z13)

loop2:
	TESTQ CX, CX
	JZ    done2
	PF3(DI)
	WLOAD3
	VPBROADCASTD (SI), Z3
	DP3(3, 8, 9, 10)
	VPBROADCASTD (SI)(R11*1), Z4
	DP3(4, 11, 12, 13)
	ADDQ $192, DI
	ADDQ $4, SI
	DECQ CX
	JMP  loop2

done2:
	STORE3(Z8, Z9, Z10)
	STORE3(Z11, Z12, Z13)
	VZEROUPPER
	RET

// func kpair1(x *uint16, xstride int, w *uint16, kp int, out *float32, ostride int, acc int)
TEXT ·kpair1(SB), NOSPLIT, $0-56
	ARGS
	MOVQ DX, R9
	TESTQ AX, AX
	JZ    zero1
	LOAD3(Z8, Z9, Z10)
	MOVQ R9, DX
	JMP  loop1

zero1:
	ZERO3(Z8, Z9, Z10)

loop1:
	TESTQ CX, CX
	JZ    done1
	PF3(DI)
	WLOAD3
	VPBROADCASTD (SI), Z3
	DP3(3, 8, 9, 10)
	ADDQ $192, DI
	ADDQ $4, SI
	DECQ CX
	JMP  loop1

done1:
	STORE3(Z8, Z9, Z10)
	VZEROUPPER
	RET


// INIT3/FLUSH3 load or zero, and store, three accumulators of one row at
// (R15), stepping R15 by the out stride.
#define INIT3(a0, a1, a2) \
	VMOVUPS (R15), a0; VMOVUPS 64(R15), a1; VMOVUPS 128(R15), a2; ADDQ R10, R15
#define FLUSH3(a0, a1, a2) \
	VMOVUPS a0, (R15); VMOVUPS a1, 64(R15); VMOVUPS a2, 128(R15); ADDQ R10, R15

// func kpair4x2(x *uint16, xstride int, w *[2]*uint16, kp int, out *[2]*float32, ostride, acc, ahead int)
TEXT ·kpair4x2(SB), NOSPLIT, $0-64
	MARGS
	LEAQ (SI)(R11*2), R12
	ADDQ R11, R12          // row 3
	MOVQ 0(BX), DI
	MOVQ 8(BX), R8
	TESTQ AX, AX
	JZ    zero42
	MOVQ 0(DX), R15
	INIT3(Z8, Z9, Z10)
	INIT3(Z11, Z12, Z13)
	INIT3(Z14, Z15, Z16)
	INIT3(Z17, Z18, Z19)
	MOVQ 8(DX), R15
	INIT3(Z20, Z21, Z22)
	INIT3(Z23, Z24, Z25)
	INIT3(Z26, Z27, Z28)
	INIT3(Z29, Z30, Z31)
	JMP  loop42

zero42:
	ZERO3(Z8, Z9, Z10)
	ZERO3(Z11, Z12, Z13)
	ZERO3(Z14, Z15, Z16)
	ZERO3(Z17, Z18, Z19)
	ZERO3(Z20, Z21, Z22)
	ZERO3(Z23, Z24, Z25)
	ZERO3(Z26, Z27, Z28)
	ZERO3(Z29, Z30, Z31)

loop42:
	TESTQ CX, CX
	JZ    done42
	PF3(DI)
	PF3(R8)
	VPBROADCASTD (SI), Z3
	VPBROADCASTD (SI)(R11*1), Z4
	VPBROADCASTD (SI)(R11*2), Z5
	VPBROADCASTD (R12), Z6
	WLOAD3AT(DI)
	DP3(3, 8, 9, 10)
	DP3(4, 11, 12, 13)
	DP3(5, 14, 15, 16)
	DP3(6, 17, 18, 19)
	WLOAD3AT(R8)
	DP3(3, 20, 21, 22)
	DP3(4, 23, 24, 25)
	DP3(5, 26, 27, 28)
	DP3(6, 29, 30, 31)
	ADDQ $192, DI
	ADDQ $192, R8
	ADDQ $4, SI
	ADDQ $4, R12
	DECQ CX
	JMP  loop42

done42:
	MOVQ 0(DX), R15
	FLUSH3(Z8, Z9, Z10)
	FLUSH3(Z11, Z12, Z13)
	FLUSH3(Z14, Z15, Z16)
	FLUSH3(Z17, Z18, Z19)
	MOVQ 8(DX), R15
	FLUSH3(Z20, Z21, Z22)
	FLUSH3(Z23, Z24, Z25)
	FLUSH3(Z26, Z27, Z28)
	FLUSH3(Z29, Z30, Z31)
	VZEROUPPER
	RET

// func kpair2x4(x *uint16, xstride int, w *[4]*uint16, kp int, out *[4]*float32, ostride, acc, ahead int)
TEXT ·kpair2x4(SB), NOSPLIT, $0-64
	MARGS
	MOVQ 0(BX), DI
	MOVQ 8(BX), R8
	MOVQ 16(BX), R9
	MOVQ 24(BX), R13
	TESTQ AX, AX
	JZ    zero24
	MOVQ 0(DX), R15
	INIT3(Z8, Z9, Z10)
	INIT3(Z11, Z12, Z13)
	MOVQ 8(DX), R15
	INIT3(Z14, Z15, Z16)
	INIT3(Z17, Z18, Z19)
	MOVQ 16(DX), R15
	INIT3(Z20, Z21, Z22)
	INIT3(Z23, Z24, Z25)
	MOVQ 24(DX), R15
	INIT3(Z26, Z27, Z28)
	INIT3(Z29, Z30, Z31)
	JMP  loop24

zero24:
	ZERO3(Z8, Z9, Z10)
	ZERO3(Z11, Z12, Z13)
	ZERO3(Z14, Z15, Z16)
	ZERO3(Z17, Z18, Z19)
	ZERO3(Z20, Z21, Z22)
	ZERO3(Z23, Z24, Z25)
	ZERO3(Z26, Z27, Z28)
	ZERO3(Z29, Z30, Z31)

loop24:
	TESTQ CX, CX
	JZ    done24
	PF3(DI)
	PF3(R8)
	PF3(R9)
	PF3(R13)
	VPBROADCASTD (SI), Z3
	VPBROADCASTD (SI)(R11*1), Z4
	WLOAD3AT(DI)
	DP3(3, 8, 9, 10)
	DP3(4, 11, 12, 13)
	WLOAD3AT(R8)
	DP3(3, 14, 15, 16)
	DP3(4, 17, 18, 19)
	WLOAD3AT(R9)
	DP3(3, 20, 21, 22)
	DP3(4, 23, 24, 25)
	WLOAD3AT(R13)
	DP3(3, 26, 27, 28)
	DP3(4, 29, 30, 31)
	ADDQ $192, DI
	ADDQ $192, R8
	ADDQ $192, R9
	ADDQ $192, R13
	ADDQ $4, SI
	DECQ CX
	JMP  loop24

done24:
	MOVQ 0(DX), R15
	FLUSH3(Z8, Z9, Z10)
	FLUSH3(Z11, Z12, Z13)
	MOVQ 8(DX), R15
	FLUSH3(Z14, Z15, Z16)
	FLUSH3(Z17, Z18, Z19)
	MOVQ 16(DX), R15
	FLUSH3(Z20, Z21, Z22)
	FLUSH3(Z23, Z24, Z25)
	MOVQ 24(DX), R15
	FLUSH3(Z26, Z27, Z28)
	FLUSH3(Z29, Z30, Z31)
	VZEROUPPER
	RET

// func kpair1x4(x *uint16, xstride int, w *[4]*uint16, kp int, out *[4]*float32, ostride, acc, ahead int)
TEXT ·kpair1x4(SB), NOSPLIT, $0-64
	MARGS
	MOVQ 0(BX), DI
	MOVQ 8(BX), R8
	MOVQ 16(BX), R9
	MOVQ 24(BX), R13
	TESTQ AX, AX
	JZ    zero14
	MOVQ 0(DX), R15
	INIT3(Z20, Z21, Z22)
	MOVQ 8(DX), R15
	INIT3(Z23, Z24, Z25)
	MOVQ 16(DX), R15
	INIT3(Z26, Z27, Z28)
	MOVQ 24(DX), R15
	INIT3(Z29, Z30, Z31)
	JMP  loop14

zero14:
	ZERO3(Z20, Z21, Z22)
	ZERO3(Z23, Z24, Z25)
	ZERO3(Z26, Z27, Z28)
	ZERO3(Z29, Z30, Z31)

loop14:
	TESTQ CX, CX
	JZ    done14
	PF3(DI)
	PF3(R8)
	PF3(R9)
	PF3(R13)
	VPBROADCASTD (SI), Z3
	VMOVDQU32 (DI), Z8
	VMOVDQU32 64(DI), Z9
	VMOVDQU32 128(DI), Z10
	VMOVDQU32 (R8), Z11
	VMOVDQU32 64(R8), Z12
	VMOVDQU32 128(R8), Z13
	VMOVDQU32 (R9), Z14
	VMOVDQU32 64(R9), Z15
	VMOVDQU32 128(R9), Z16
	VMOVDQU32 (R13), Z17
	VMOVDQU32 64(R13), Z18
	VMOVDQU32 128(R13), Z19
	DPBF(8, 3, 20)
	DPBF(9, 3, 21)
	DPBF(10, 3, 22)
	DPBF(11, 3, 23)
	DPBF(12, 3, 24)
	DPBF(13, 3, 25)
	DPBF(14, 3, 26)
	DPBF(15, 3, 27)
	DPBF(16, 3, 28)
	DPBF(17, 3, 29)
	DPBF(18, 3, 30)
	DPBF(19, 3, 31)
	ADDQ $192, DI
	ADDQ $192, R8
	ADDQ $192, R9
	ADDQ $192, R13
	ADDQ $4, SI
	DECQ CX
	JMP  loop14

done14:
	MOVQ 0(DX), R15
	FLUSH3(Z20, Z21, Z22)
	MOVQ 8(DX), R15
	FLUSH3(Z23, Z24, Z25)
	MOVQ 16(DX), R15
	FLUSH3(Z26, Z27, Z28)
	MOVQ 24(DX), R15
	FLUSH3(Z29, Z30, Z31)
	VZEROUPPER
	RET
