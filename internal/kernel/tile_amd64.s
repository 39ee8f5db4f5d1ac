//go:build !purego

#include "textflag.h"

// The four-by-three tiles: four rows of x against three weight rows, one
// accumulator per output (Y0-Y11, x row r and weight row c in Y(3r+c)),
// the widened weights in Y12-Y14 and each x vector in Y15 for its three
// FMAs. Per 8 elements: 12 FMAs against 7 loads and 3 widenings, which is
// what lets a 16-register CPU keep both FMA pipes busy; the 2x4 tile
// (8 FMAs, 6 loads) and rows8 (8 FMAs, 9 loads) are bound by their loads
// and by their loop overhead. Per output the lanes and the reduction of
// the other dot-form tiles (HSUM8's), so results do not depend on the tile.

#define T43_ZERO \
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7; \
	VXORPS Y8, Y8, Y8; VXORPS Y9, Y9, Y9; VXORPS Y10, Y10, Y10; VXORPS Y11, Y11, Y11; \
	XORQ AX, AX

// T43_FMA multiplies the x rows at R11-R14 (element AX) by Y12-Y14.
#define T43_FMA \
	VMOVUPS (R11)(AX*4), Y15; \
	VFMADD231PS Y15, Y12, Y0; VFMADD231PS Y15, Y13, Y1; VFMADD231PS Y15, Y14, Y2; \
	VMOVUPS (R12)(AX*4), Y15; \
	VFMADD231PS Y15, Y12, Y3; VFMADD231PS Y15, Y13, Y4; VFMADD231PS Y15, Y14, Y5; \
	VMOVUPS (R13)(AX*4), Y15; \
	VFMADD231PS Y15, Y12, Y6; VFMADD231PS Y15, Y13, Y7; VFMADD231PS Y15, Y14, Y8; \
	VMOVUPS (R14)(AX*4), Y15; \
	VFMADD231PS Y15, Y12, Y9; VFMADD231PS Y15, Y13, Y10; VFMADD231PS Y15, Y14, Y11

// T43_FMA2 is T43_FMA for the eight elements after AX.
#define T43_FMA2 \
	VMOVUPS 32(R11)(AX*4), Y15; \
	VFMADD231PS Y15, Y12, Y0; VFMADD231PS Y15, Y13, Y1; VFMADD231PS Y15, Y14, Y2; \
	VMOVUPS 32(R12)(AX*4), Y15; \
	VFMADD231PS Y15, Y12, Y3; VFMADD231PS Y15, Y13, Y4; VFMADD231PS Y15, Y14, Y5; \
	VMOVUPS 32(R13)(AX*4), Y15; \
	VFMADD231PS Y15, Y12, Y6; VFMADD231PS Y15, Y13, Y7; VFMADD231PS Y15, Y14, Y8; \
	VMOVUPS 32(R14)(AX*4), Y15; \
	VFMADD231PS Y15, Y12, Y9; VFMADD231PS Y15, Y13, Y10; VFMADD231PS Y15, Y14, Y11

// HSUM4 reduces YA-YD as HSUM8 does each accumulator, leaving their sums
// in XA's lanes 0-3 (each Y register is named with its low half X).
// Clobbers X12.
#define HSUM4(YA, XA, YB, XB, YC, XC, YD, XD) \
	VEXTRACTF128 $1, YA, X12; VADDPS X12, XA, XA; \
	VEXTRACTF128 $1, YB, X12; VADDPS X12, XB, XB; \
	VEXTRACTF128 $1, YC, X12; VADDPS X12, XC, XC; \
	VEXTRACTF128 $1, YD, X12; VADDPS X12, XD, XD; \
	VHADDPS XB, XA, XA; VHADDPS XD, XC, XC; VHADDPS XC, XA, XA

// T43_ARGS loads the arguments common to both kernels.
#define T43_ARGS \
	MOVQ w+24(FP), DI; MOVQ k+40(FP), CX; \
	MOVQ xstride+8(FP), BX; SHLQ $2, BX; \
	MOVQ ostride+56(FP), R10; SHLQ $2, R10

// T43_GROUP points R12-R14 at the three x rows after R11 and clears the
// accumulators.
#define T43_GROUP \
	LEAQ (R11)(BX*1), R12; LEAQ (R12)(BX*1), R13; LEAQ (R13)(BX*1), R14; \
	T43_ZERO

// T43_NEXT moves to the next group of four x rows (R11, DX, R15: rows
// left) and jumps to group, or to next when none is left. With fewer than
// four rows left the last group ends at the last row, recomputing (to the
// same values) some rows of the one before.
#define T43_NEXT(group, next) \
	SUBQ $4, R15; JLE next; \
	LEAQ (R14)(BX*1), R11; \
	CMPQ R15, $4; JGE group; \
	MOVQ $4, AX; SUBQ R15, AX; \
	MOVQ AX, R12; IMULQ BX, R12; SUBQ R12, R11; \
	IMULQ R10, AX; SUBQ AX, DX; \
	MOVQ $4, R15; JMP group

// func tile4x3BF16AVX2(x *float32, xstride, rows int, w *uint16, triples, k int, out *float32, ostride int)
// rows rows of x (rows >= 4, xstride floats apart) against triples·3
// consecutive bf16 weight rows (k long, k % 8 == 0): out[r*ostride+j] =
// x_r · w_j. Each weight triple meets every group of four x rows while it
// is in L1, so the weights stream from memory once; when rows is not a
// multiple of four the last group overlaps the one before.
TEXT ·tile4x3BF16AVX2(SB), NOSPLIT, $0-64
	T43_ARGS

b43triple:
	CMPQ triples+32(FP), $0
	JLE  b43end
	LEAQ (DI)(CX*2), R8
	LEAQ (R8)(CX*2), R9
	MOVQ x+0(FP), R11
	MOVQ out+48(FP), DX
	MOVQ rows+16(FP), R15

b43group:
	T43_GROUP

	TESTQ $8, CX
	JZ    b43loop
	VPMOVZXWD (DI)(AX*2), Y12
	VPMOVZXWD (R8)(AX*2), Y13
	VPMOVZXWD (R9)(AX*2), Y14
	VPSLLD $16, Y12, Y12
	VPSLLD $16, Y13, Y13
	VPSLLD $16, Y14, Y14
	T43_FMA
	ADDQ $8, AX
	CMPQ AX, CX
	JGE  b43red

b43loop:
	// The weights are one stream: prefetch it 4 KB ahead (the three rows'
	// points together cover the next 4 KB region as the loop runs).
	PREFETCHT0 4096(DI)(AX*2)
	PREFETCHT0 4096(R8)(AX*2)
	PREFETCHT0 4096(R9)(AX*2)
	VPMOVZXWD (DI)(AX*2), Y12
	VPMOVZXWD (R8)(AX*2), Y13
	VPMOVZXWD (R9)(AX*2), Y14
	VPSLLD $16, Y12, Y12
	VPSLLD $16, Y13, Y13
	VPSLLD $16, Y14, Y14
	T43_FMA
	VPMOVZXWD 16(DI)(AX*2), Y12
	VPMOVZXWD 16(R8)(AX*2), Y13
	VPMOVZXWD 16(R9)(AX*2), Y14
	VPSLLD $16, Y12, Y12
	VPSLLD $16, Y13, Y13
	VPSLLD $16, Y14, Y14
	T43_FMA2
	ADDQ $16, AX
	CMPQ AX, CX
	JL   b43loop

b43red:

	CALL ·store4x3(SB)
	T43_NEXT(b43group, b43next)

b43next:
	LEAQ (R9)(CX*2), DI
	ADDQ $12, out+48(FP)
	DECQ triples+32(FP)
	JMP  b43triple

b43end:
	VZEROUPPER
	RET

// func tile4x3F32AVX2(x *float32, xstride, rows int, w *float32, triples, k int, out *float32, ostride int)
// tile4x3BF16AVX2 for float32 weights.
TEXT ·tile4x3F32AVX2(SB), NOSPLIT, $0-64
	T43_ARGS

f43triple:
	CMPQ triples+32(FP), $0
	JLE  f43end
	LEAQ (DI)(CX*4), R8
	LEAQ (R8)(CX*4), R9
	MOVQ x+0(FP), R11
	MOVQ out+48(FP), DX
	MOVQ rows+16(FP), R15

f43group:
	T43_GROUP

f43loop:
	PREFETCHT0 4096(DI)(AX*4)
	PREFETCHT0 4096(R8)(AX*4)
	PREFETCHT0 4096(R9)(AX*4)
	VMOVUPS (DI)(AX*4), Y12
	VMOVUPS (R8)(AX*4), Y13
	VMOVUPS (R9)(AX*4), Y14
	T43_FMA
	ADDQ $8, AX
	CMPQ AX, CX
	JL   f43loop

	CALL ·store4x3(SB)
	T43_NEXT(f43group, f43next)

f43next:
	LEAQ (R9)(CX*4), DI
	ADDQ $12, out+48(FP)
	DECQ triples+32(FP)
	JMP  f43triple

f43end:
	VZEROUPPER
	RET

// store4x3 reduces Y0-Y11 and stores the tile's four output rows of three
// from DX, R10 bytes apart, leaving DX one row past the last.
TEXT ·store4x3(SB), NOSPLIT|NOFRAME, $0-0
	HSUM4(Y0, X0, Y1, X1, Y2, X2, Y3, X3)
	HSUM4(Y4, X4, Y5, X5, Y6, X6, Y7, X7)
	HSUM4(Y8, X8, Y9, X9, Y10, X10, Y11, X11)
	// X0 = r0c0 r0c1 r0c2 r1c0, X4 = r1c1 r1c2 r2c0 r2c1, X8 = r2c2 r3c0 r3c1 r3c2
	VMOVSS X0, (DX)
	VEXTRACTPS $1, X0, 4(DX)
	VEXTRACTPS $2, X0, 8(DX)
	ADDQ R10, DX
	VEXTRACTPS $3, X0, (DX)
	VMOVSS X4, 4(DX)
	VEXTRACTPS $1, X4, 8(DX)
	ADDQ R10, DX
	VEXTRACTPS $2, X4, (DX)
	VEXTRACTPS $3, X4, 4(DX)
	VMOVSS X8, 8(DX)
	ADDQ R10, DX
	VEXTRACTPS $1, X8, (DX)
	VEXTRACTPS $2, X8, 4(DX)
	VEXTRACTPS $3, X8, 8(DX)
	ADDQ R10, DX
	RET
