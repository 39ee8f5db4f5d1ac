//go:build !purego

#include "textflag.h"

// Products over k-major bf16 weights (PackKMajor: panels of 48 weight rows
// stored [k][48]). Each output is one FMA chain over k in order: the lanes
// hold 48 outputs of one x row, every step broadcasts x[k] and multiplies it
// by the 48 weights of that k. The tile shape (how many x rows share a
// widened weight vector) therefore never changes a result's bits.
//
// Registers: Z0-Z2 the widened weights of one k, Z3-Z7 broadcasts, Z8-Z31
// accumulators (three per x row). With acc != 0 the chains continue from
// the values in out (a product blocked over k), else they start at zero.

#define WIDEN3 \
	VPMOVZXWD (DI), Z0; VPSLLD $16, Z0, Z0; \
	VPMOVZXWD 32(DI), Z1; VPSLLD $16, Z1, Z1; \
	VPMOVZXWD 64(DI), Z2; VPSLLD $16, Z2, Z2

#define FMA3(b, a0, a1, a2) \
	VFMADD231PS b, Z0, a0; VFMADD231PS b, Z1, a1; VFMADD231PS b, Z2, a2

#define ZERO3(a0, a1, a2) \
	VPXORD a0, a0, a0; VPXORD a1, a1, a1; VPXORD a2, a2, a2

#define LOAD3(a0, a1, a2) \
	VMOVUPS (DX), a0; VMOVUPS 64(DX), a1; VMOVUPS 128(DX), a2; ADDQ R10, DX

#define STORE3(a0, a1, a2) \
	VMOVUPS a0, (DX); VMOVUPS a1, 64(DX); VMOVUPS a2, 128(DX); ADDQ R10, DX

// PF2 prefetches the two lines R14 bytes past base: 1536 in the
// single-panel tiles but kmaj8, the caller's choice in kmaj8 and the
// multi-stream ones.
#define PF2(base) PREFETCHT0 (base)(R14*1); PREFETCHT0 64(base)(R14*1)

// ARGS loads the common arguments: SI x, R11 x stride in bytes, DI w,
// CX k, DX out, R10 out stride in bytes, AX acc.
#define ARGS \
	MOVQ x+0(FP), SI; MOVQ xstride+8(FP), R11; SHLQ $2, R11; \
	MOVQ w+16(FP), DI; MOVQ k+24(FP), CX; \
	MOVQ out+32(FP), DX; MOVQ ostride+40(FP), R10; SHLQ $2, R10; \
	MOVQ acc+48(FP), AX; \
	MOVQ $1536, R14

// The multi-stream tiles run R x rows against one panel in each of S
// streams, R·S = 8: w and out point to S panel pointers and S output
// pointers (each output row ostride floats after the last). A decode
// batch's few rows then read the weights as several streams, which memory
// serves at its full rate (one stream per core reaches about two thirds
// of it).
//
// MARGS loads: SI x, R11 x stride (bytes), BX the panel pointers, CX k,
// DX the output pointers, R10 out stride (bytes), AX acc.
#define MARGS \
	MOVQ x+0(FP), SI; MOVQ xstride+8(FP), R11; SHLQ $2, R11; \
	MOVQ w+16(FP), BX; MOVQ k+24(FP), CX; \
	MOVQ out+32(FP), DX; MOVQ ostride+40(FP), R10; SHLQ $2, R10; \
	MOVQ acc+48(FP), AX; \
	MOVQ ahead+56(FP), R14

// kmaj8 widens a step's first 32 weights without a shuffle (VPMOVZXWD
// is one, and in the prefill's products, where the tile runs from cache,
// shuffles take issue slots its FMAs need: docs/bench): one 64-byte
// load holds them as 16 dwords of two bf16 each; shifting each dword left
// by 16 gives the even columns as float32, masking its low half off the
// odd ones (the last 16 weights take VPMOVZXWD as the other tiles do).
// Each x row's first two accumulators therefore hold its even and odd
// columns of 0-31; they are formed from out (acc) and written back
// through VPERMI2PS, once per call. Each output is still one FMA chain
// over k in order, the same bits.
DATA kmajEven<>+0(SB)/4, $0
DATA kmajEven<>+4(SB)/4, $2
DATA kmajEven<>+8(SB)/4, $4
DATA kmajEven<>+12(SB)/4, $6
DATA kmajEven<>+16(SB)/4, $8
DATA kmajEven<>+20(SB)/4, $10
DATA kmajEven<>+24(SB)/4, $12
DATA kmajEven<>+28(SB)/4, $14
DATA kmajEven<>+32(SB)/4, $16
DATA kmajEven<>+36(SB)/4, $18
DATA kmajEven<>+40(SB)/4, $20
DATA kmajEven<>+44(SB)/4, $22
DATA kmajEven<>+48(SB)/4, $24
DATA kmajEven<>+52(SB)/4, $26
DATA kmajEven<>+56(SB)/4, $28
DATA kmajEven<>+60(SB)/4, $30
GLOBL kmajEven<>(SB), RODATA|NOPTR, $64
DATA kmajOdd<>+0(SB)/4, $1
DATA kmajOdd<>+4(SB)/4, $3
DATA kmajOdd<>+8(SB)/4, $5
DATA kmajOdd<>+12(SB)/4, $7
DATA kmajOdd<>+16(SB)/4, $9
DATA kmajOdd<>+20(SB)/4, $11
DATA kmajOdd<>+24(SB)/4, $13
DATA kmajOdd<>+28(SB)/4, $15
DATA kmajOdd<>+32(SB)/4, $17
DATA kmajOdd<>+36(SB)/4, $19
DATA kmajOdd<>+40(SB)/4, $21
DATA kmajOdd<>+44(SB)/4, $23
DATA kmajOdd<>+48(SB)/4, $25
DATA kmajOdd<>+52(SB)/4, $27
DATA kmajOdd<>+56(SB)/4, $29
DATA kmajOdd<>+60(SB)/4, $31
GLOBL kmajOdd<>(SB), RODATA|NOPTR, $64
DATA kmajLow<>+0(SB)/4, $0
DATA kmajLow<>+4(SB)/4, $16
DATA kmajLow<>+8(SB)/4, $1
DATA kmajLow<>+12(SB)/4, $17
DATA kmajLow<>+16(SB)/4, $2
DATA kmajLow<>+20(SB)/4, $18
DATA kmajLow<>+24(SB)/4, $3
DATA kmajLow<>+28(SB)/4, $19
DATA kmajLow<>+32(SB)/4, $4
DATA kmajLow<>+36(SB)/4, $20
DATA kmajLow<>+40(SB)/4, $5
DATA kmajLow<>+44(SB)/4, $21
DATA kmajLow<>+48(SB)/4, $6
DATA kmajLow<>+52(SB)/4, $22
DATA kmajLow<>+56(SB)/4, $7
DATA kmajLow<>+60(SB)/4, $23
GLOBL kmajLow<>(SB), RODATA|NOPTR, $64
DATA kmajHigh<>+0(SB)/4, $8
DATA kmajHigh<>+4(SB)/4, $24
DATA kmajHigh<>+8(SB)/4, $9
DATA kmajHigh<>+12(SB)/4, $25
DATA kmajHigh<>+16(SB)/4, $10
DATA kmajHigh<>+20(SB)/4, $26
DATA kmajHigh<>+24(SB)/4, $11
DATA kmajHigh<>+28(SB)/4, $27
DATA kmajHigh<>+32(SB)/4, $12
DATA kmajHigh<>+36(SB)/4, $28
DATA kmajHigh<>+40(SB)/4, $13
DATA kmajHigh<>+44(SB)/4, $29
DATA kmajHigh<>+48(SB)/4, $14
DATA kmajHigh<>+52(SB)/4, $30
DATA kmajHigh<>+56(SB)/4, $15
DATA kmajHigh<>+60(SB)/4, $31
GLOBL kmajHigh<>(SB), RODATA|NOPTR, $64

// WIDEN_EO widens a step's 48 weights into Z0 (even columns of 0-31), Z1
// (odd columns of 0-31) and Z2 (columns 32-47); Z7 holds 0xffff0000.
#define WIDEN_EO \
	VMOVDQU32 (DI), Z0; VPANDD Z7, Z0, Z1; VPSLLD $16, Z0, Z0; \
	VPMOVZXWD 64(DI), Z2; VPSLLD $16, Z2, Z2

// LOAD_EO loads a row's 48 outputs at DX into accumulators a0 (even
// columns of 0-31), a1 (odd) and a2 (32-47), Z4 and Z5 holding kmajEven
// and kmajOdd; clobbers Z2, Z3.
#define LOAD_EO(a0, a1, a2) \
	VMOVUPS (DX), Z2; VMOVUPS 64(DX), Z3; \
	VMOVAPS Z4, a0; VPERMI2PS Z3, Z2, a0; \
	VMOVAPS Z5, a1; VPERMI2PS Z3, Z2, a1; \
	VMOVUPS 128(DX), a2; ADDQ R10, DX

// STORE_EO writes a row's accumulators back in column order, Z4 and Z5
// holding kmajLow and kmajHigh; clobbers Z2.
#define STORE_EO(a0, a1, a2) \
	VMOVAPS Z4, Z2; VPERMI2PS a1, a0, Z2; VMOVUPS Z2, (DX); \
	VMOVAPS Z5, Z2; VPERMI2PS a1, a0, Z2; VMOVUPS Z2, 64(DX); \
	VMOVUPS a2, 128(DX); ADDQ R10, DX

// func kmaj8(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int, ahead int)
TEXT ·kmaj8(SB), NOSPLIT, $0-64
	ARGS
	MOVQ ahead+56(FP), R14
	LEAQ (SI)(R11*2), R12
	ADDQ R11, R12         // row 3
	LEAQ (R12)(R11*2), R13
	ADDQ R11, R13         // row 6
	MOVQ DX, R9
	TESTQ AX, AX
	JZ    zero8
	VMOVDQU32 kmajEven<>(SB), Z4
	VMOVDQU32 kmajOdd<>(SB), Z5
	LOAD_EO(Z8, Z9, Z10)
	LOAD_EO(Z11, Z12, Z13)
	LOAD_EO(Z14, Z15, Z16)
	LOAD_EO(Z17, Z18, Z19)
	LOAD_EO(Z20, Z21, Z22)
	LOAD_EO(Z23, Z24, Z25)
	LOAD_EO(Z26, Z27, Z28)
	LOAD_EO(Z29, Z30, Z31)
	MOVQ R9, DX
	JMP  mask8

zero8:
	ZERO3(Z8, Z9, Z10)
	ZERO3(Z11, Z12, Z13)
	ZERO3(Z14, Z15, Z16)
	ZERO3(Z17, Z18, Z19)
	ZERO3(Z20, Z21, Z22)
	ZERO3(Z23, Z24, Z25)
	ZERO3(Z26, Z27, Z28)
	ZERO3(Z29, Z30, Z31)

mask8:
	MOVL $0xffff0000, AX
	VPBROADCASTD AX, Z7

loop8:
	TESTQ CX, CX
	JZ    done8
	PF2(DI)
	WIDEN_EO
	VBROADCASTSS (SI), Z3
	FMA3(Z3, Z8, Z9, Z10)
	VBROADCASTSS (SI)(R11*1), Z4
	FMA3(Z4, Z11, Z12, Z13)
	VBROADCASTSS (SI)(R11*2), Z5
	FMA3(Z5, Z14, Z15, Z16)
	VBROADCASTSS (R12), Z6
	FMA3(Z6, Z17, Z18, Z19)
	VBROADCASTSS (SI)(R11*4), Z3
	FMA3(Z3, Z20, Z21, Z22)
	VBROADCASTSS (R12)(R11*2), Z4
	FMA3(Z4, Z23, Z24, Z25)
	VBROADCASTSS (R13), Z5
	FMA3(Z5, Z26, Z27, Z28)
	VBROADCASTSS (R13)(R11*1), Z6
	FMA3(Z6, Z29, Z30, Z31)
	ADDQ $96, DI
	ADDQ $4, SI
	ADDQ $4, R12
	ADDQ $4, R13
	DECQ CX
	JMP  loop8

done8:
	VMOVDQU32 kmajLow<>(SB), Z4
	VMOVDQU32 kmajHigh<>(SB), Z5
	STORE_EO(Z8, Z9, Z10)
	STORE_EO(Z11, Z12, Z13)
	STORE_EO(Z14, Z15, Z16)
	STORE_EO(Z17, Z18, Z19)
	STORE_EO(Z20, Z21, Z22)
	STORE_EO(Z23, Z24, Z25)
	STORE_EO(Z26, Z27, Z28)
	STORE_EO(Z29, Z30, Z31)
	VZEROUPPER
	RET

// func kmaj4(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)
TEXT ·kmaj4(SB), NOSPLIT, $0-56
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
	PF2(DI)
	WIDEN3
	VBROADCASTSS (SI), Z3
	FMA3(Z3, Z8, Z9, Z10)
	VBROADCASTSS (SI)(R11*1), Z4
	FMA3(Z4, Z11, Z12, Z13)
	VBROADCASTSS (SI)(R11*2), Z5
	FMA3(Z5, Z14, Z15, Z16)
	VBROADCASTSS (R12), Z6
	FMA3(Z6, Z17, Z18, Z19)
	ADDQ $96, DI
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

// func kmaj2(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)
TEXT ·kmaj2(SB), NOSPLIT, $0-56
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
	PF2(DI)
	WIDEN3
	VBROADCASTSS (SI), Z3
	FMA3(Z3, Z8, Z9, Z10)
	VBROADCASTSS (SI)(R11*1), Z4
	FMA3(Z4, Z11, Z12, Z13)
	ADDQ $96, DI
	ADDQ $4, SI
	DECQ CX
	JMP  loop2

done2:
	STORE3(Z8, Z9, Z10)
	STORE3(Z11, Z12, Z13)
	VZEROUPPER
	RET

// func kmaj1(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)
TEXT ·kmaj1(SB), NOSPLIT, $0-56
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
	PF2(DI)
	WIDEN3
	VBROADCASTSS (SI), Z3
	FMA3(Z3, Z8, Z9, Z10)
	ADDQ $96, DI
	ADDQ $4, SI
	DECQ CX
	JMP  loop1

done1:
	STORE3(Z8, Z9, Z10)
	VZEROUPPER
	RET

// The edge tiles run eight x rows against the first 16 (kmaj8e1) or 32
// (kmaj8e2) columns of a panel, the last panel of a weight whose row
// count leaves that many: the same chains as the 48-column tiles, without
// the padding's FMAs or a buffer. X rows 0-7 at SI, SI+R11, SI+2·R11,
// R12, SI+4·R11, R12+2·R11, R13, R13+R11.
#define XROWS \
	LEAQ (SI)(R11*2), R12; ADDQ R11, R12; \
	LEAQ (R12)(R11*2), R13; ADDQ R11, R13

#define ROWS1(op) \
	op(Z16); op(Z17); op(Z18); op(Z19); op(Z20); op(Z21); op(Z22); op(Z23)

// ROWS1HI applies op to the accumulators of rows 8-15 (kmaj16e1) or of
// the second column group (kmaj8e2); ROWS2 to both of a row's groups.
#define ROWS1HI(op) \
	op(Z24); op(Z25); op(Z26); op(Z27); op(Z28); op(Z29); op(Z30); op(Z31)
#define ROWS2(op) \
	op(Z16, Z24); op(Z17, Z25); op(Z18, Z26); op(Z19, Z27); \
	op(Z20, Z28); op(Z21, Z29); op(Z22, Z30); op(Z23, Z31)

#define LD1(a) VMOVUPS (DX), a; ADDQ R10, DX
#define ST1(a) VMOVUPS a, (DX); ADDQ R10, DX
#define ZR1(a) VPXORD a, a, a

// FMAE(w, a0..a7) adds the eight rows' x[k] times the widened weights w.
#define FMAE(w, a0, a1, a2, a3, a4, a5, a6, a7) \
	VFMADD231PS.BCST (SI), w, a0; \
	VFMADD231PS.BCST (SI)(R11*1), w, a1; \
	VFMADD231PS.BCST (SI)(R11*2), w, a2; \
	VFMADD231PS.BCST (R12), w, a3; \
	VFMADD231PS.BCST (SI)(R11*4), w, a4; \
	VFMADD231PS.BCST (R12)(R11*2), w, a5; \
	VFMADD231PS.BCST (R13), w, a6; \
	VFMADD231PS.BCST (R13)(R11*1), w, a7

// func kmaj8e1(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)
TEXT ·kmaj8e1(SB), NOSPLIT, $0-56
	ARGS
	XROWS
	MOVQ DX, R9
	TESTQ AX, AX
	JZ    zeroe1
	ROWS1(LD1)
	MOVQ R9, DX
	JMP  loope1

zeroe1:
	ROWS1(ZR1)

loope1:
	TESTQ CX, CX
	JZ    donee1
	PREFETCHT0 (DI)(R14*1)
	VPMOVZXWD (DI), Z0
	VPSLLD $16, Z0, Z0
	FMAE(Z0, Z16, Z17, Z18, Z19, Z20, Z21, Z22, Z23)
	ADDQ $96, DI
	ADDQ $4, SI
	ADDQ $4, R12
	ADDQ $4, R13
	DECQ CX
	JMP  loope1

donee1:
	ROWS1(ST1)
	VZEROUPPER
	RET

// func kmaj16e1(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)
//
// Sixteen rows against 16 columns: eight chains in flight are too few
// to cover the FMA latency. X rows 0-15 from five bases: SI row 0, R12
// row 3, R13 row 6, R8 row 7, R15 row 12.
TEXT ·kmaj16e1(SB), NOSPLIT, $0-56
	ARGS
	XROWS
	LEAQ (R13)(R11*1), R8
	LEAQ (R13)(R11*4), R15
	LEAQ (R15)(R11*2), R15
	MOVQ DX, R9
	TESTQ AX, AX
	JZ    zero16e1
	ROWS1(LD1)
	ROWS1HI(LD1)
	MOVQ R9, DX
	JMP  loop16e1

zero16e1:
	ROWS1(ZR1)
	ROWS1HI(ZR1)

loop16e1:
	TESTQ CX, CX
	JZ    done16e1
	PREFETCHT0 (DI)(R14*1)
	VPMOVZXWD (DI), Z0
	VPSLLD $16, Z0, Z0
	FMAE(Z0, Z16, Z17, Z18, Z19, Z20, Z21, Z22, Z23)
	VFMADD231PS.BCST (SI)(R11*8), Z0, Z24
	VFMADD231PS.BCST (R8)(R11*2), Z0, Z25
	VFMADD231PS.BCST (R13)(R11*4), Z0, Z26
	VFMADD231PS.BCST (R12)(R11*8), Z0, Z27
	VFMADD231PS.BCST (R15), Z0, Z28
	VFMADD231PS.BCST (R15)(R11*1), Z0, Z29
	VFMADD231PS.BCST (R13)(R11*8), Z0, Z30
	VFMADD231PS.BCST (R8)(R11*8), Z0, Z31
	ADDQ $96, DI
	ADDQ $4, SI
	ADDQ $4, R12
	ADDQ $4, R13
	ADDQ $4, R8
	ADDQ $4, R15
	DECQ CX
	JMP  loop16e1

done16e1:
	ROWS1(ST1)
	ROWS1HI(ST1)
	VZEROUPPER
	RET

#define LDE2(a, b) VMOVUPS (DX), a; VMOVUPS 64(DX), b; ADDQ R10, DX
#define STE2(a, b) VMOVUPS a, (DX); VMOVUPS b, 64(DX); ADDQ R10, DX

// func kmaj8e2(x *float32, xstride int, w *uint16, k int, out *float32, ostride int, acc int)
TEXT ·kmaj8e2(SB), NOSPLIT, $0-56
	ARGS
	XROWS
	MOVQ DX, R9
	TESTQ AX, AX
	JZ    zeroe2
	ROWS2(LDE2)
	MOVQ R9, DX
	JMP  loope2

zeroe2:
	ROWS1(ZR1)
	ROWS1HI(ZR1)

loope2:
	TESTQ CX, CX
	JZ    donee2
	PREFETCHT0 (DI)(R14*1)
	VPMOVZXWD (DI), Z0
	VPSLLD $16, Z0, Z0
	VPMOVZXWD 32(DI), Z1
	VPSLLD $16, Z1, Z1
	VBROADCASTSS (SI), Z2
	VFMADD231PS Z2, Z0, Z16; VFMADD231PS Z2, Z1, Z24
	VBROADCASTSS (SI)(R11*1), Z3
	VFMADD231PS Z3, Z0, Z17; VFMADD231PS Z3, Z1, Z25
	VBROADCASTSS (SI)(R11*2), Z4
	VFMADD231PS Z4, Z0, Z18; VFMADD231PS Z4, Z1, Z26
	VBROADCASTSS (R12), Z5
	VFMADD231PS Z5, Z0, Z19; VFMADD231PS Z5, Z1, Z27
	VBROADCASTSS (SI)(R11*4), Z6
	VFMADD231PS Z6, Z0, Z20; VFMADD231PS Z6, Z1, Z28
	VBROADCASTSS (R12)(R11*2), Z7
	VFMADD231PS Z7, Z0, Z21; VFMADD231PS Z7, Z1, Z29
	VBROADCASTSS (R13), Z8
	VFMADD231PS Z8, Z0, Z22; VFMADD231PS Z8, Z1, Z30
	VBROADCASTSS (R13)(R11*1), Z9
	VFMADD231PS Z9, Z0, Z23; VFMADD231PS Z9, Z1, Z31
	ADDQ $96, DI
	ADDQ $4, SI
	ADDQ $4, R12
	ADDQ $4, R13
	DECQ CX
	JMP  loope2

donee2:
	ROWS2(STE2)
	VZEROUPPER
	RET

#define WIDEN3AT(base) \
	VPMOVZXWD (base), Z0; VPSLLD $16, Z0, Z0; \
	VPMOVZXWD 32(base), Z1; VPSLLD $16, Z1, Z1; \
	VPMOVZXWD 64(base), Z2; VPSLLD $16, Z2, Z2

// INIT3/FLUSH3 load or zero, and store, three accumulators of one row at
// (R15), stepping R15 by the out stride.
#define INIT3(a0, a1, a2) \
	VMOVUPS (R15), a0; VMOVUPS 64(R15), a1; VMOVUPS 128(R15), a2; ADDQ R10, R15
#define FLUSH3(a0, a1, a2) \
	VMOVUPS a0, (R15); VMOVUPS a1, 64(R15); VMOVUPS a2, 128(R15); ADDQ R10, R15

// func kmaj4x2(x *float32, xstride int, w *[2]*uint16, k int, out *[2]*float32, ostride, acc, ahead int)
TEXT ·kmaj4x2(SB), NOSPLIT, $0-64
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
	PF2(DI)
	PF2(R8)
	VBROADCASTSS (SI), Z3
	VBROADCASTSS (SI)(R11*1), Z4
	VBROADCASTSS (SI)(R11*2), Z5
	VBROADCASTSS (R12), Z6
	WIDEN3AT(DI)
	FMA3(Z3, Z8, Z9, Z10)
	FMA3(Z4, Z11, Z12, Z13)
	FMA3(Z5, Z14, Z15, Z16)
	FMA3(Z6, Z17, Z18, Z19)
	WIDEN3AT(R8)
	FMA3(Z3, Z20, Z21, Z22)
	FMA3(Z4, Z23, Z24, Z25)
	FMA3(Z5, Z26, Z27, Z28)
	FMA3(Z6, Z29, Z30, Z31)
	ADDQ $96, DI
	ADDQ $96, R8
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

// func kmaj2x4(x *float32, xstride int, w *[4]*uint16, k int, out *[4]*float32, ostride, acc, ahead int)
TEXT ·kmaj2x4(SB), NOSPLIT, $0-64
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
	PF2(DI)
	PF2(R8)
	PF2(R9)
	PF2(R13)
	VBROADCASTSS (SI), Z3
	VBROADCASTSS (SI)(R11*1), Z4
	WIDEN3AT(DI)
	FMA3(Z3, Z8, Z9, Z10)
	FMA3(Z4, Z11, Z12, Z13)
	WIDEN3AT(R8)
	FMA3(Z3, Z14, Z15, Z16)
	FMA3(Z4, Z17, Z18, Z19)
	WIDEN3AT(R9)
	FMA3(Z3, Z20, Z21, Z22)
	FMA3(Z4, Z23, Z24, Z25)
	WIDEN3AT(R13)
	FMA3(Z3, Z26, Z27, Z28)
	FMA3(Z4, Z29, Z30, Z31)
	ADDQ $96, DI
	ADDQ $96, R8
	ADDQ $96, R9
	ADDQ $96, R13
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

// func kmaj1x4(x *float32, xstride int, w *[4]*uint16, k int, out *[4]*float32, ostride, acc, ahead int)
TEXT ·kmaj1x4(SB), NOSPLIT, $0-64
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
	PF2(DI)
	PF2(R8)
	PF2(R9)
	PF2(R13)
	VBROADCASTSS (SI), Z3
	VPMOVZXWD (DI), Z8; VPSLLD $16, Z8, Z8
	VPMOVZXWD 32(DI), Z9; VPSLLD $16, Z9, Z9
	VPMOVZXWD 64(DI), Z10; VPSLLD $16, Z10, Z10
	VPMOVZXWD (R8), Z11; VPSLLD $16, Z11, Z11
	VPMOVZXWD 32(R8), Z12; VPSLLD $16, Z12, Z12
	VPMOVZXWD 64(R8), Z13; VPSLLD $16, Z13, Z13
	VPMOVZXWD (R9), Z14; VPSLLD $16, Z14, Z14
	VPMOVZXWD 32(R9), Z15; VPSLLD $16, Z15, Z15
	VPMOVZXWD 64(R9), Z16; VPSLLD $16, Z16, Z16
	VPMOVZXWD (R13), Z17; VPSLLD $16, Z17, Z17
	VPMOVZXWD 32(R13), Z18; VPSLLD $16, Z18, Z18
	VPMOVZXWD 64(R13), Z19; VPSLLD $16, Z19, Z19
	VFMADD231PS Z3, Z8, Z20
	VFMADD231PS Z3, Z9, Z21
	VFMADD231PS Z3, Z10, Z22
	VFMADD231PS Z3, Z11, Z23
	VFMADD231PS Z3, Z12, Z24
	VFMADD231PS Z3, Z13, Z25
	VFMADD231PS Z3, Z14, Z26
	VFMADD231PS Z3, Z15, Z27
	VFMADD231PS Z3, Z16, Z28
	VFMADD231PS Z3, Z17, Z29
	VFMADD231PS Z3, Z18, Z30
	VFMADD231PS Z3, Z19, Z31
	ADDQ $96, DI
	ADDQ $96, R8
	ADDQ $96, R9
	ADDQ $96, R13
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
