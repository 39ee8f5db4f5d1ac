//go:build !purego

#include "textflag.h"
#include "kdarows_amd64.h"

// The rows8 kernels' shared parts. ROWS8_ARGS loads their arguments: the
// eight x rows in SI, BX, R8, R9, R11-R14, the weights in DI, the row count
// in R15, k in CX, out in DX and its row stride in bytes in R10.
// ROWS8_ZERO clears the accumulators Y0-Y7 and the element index AX;
// ROWS8_FMA adds the widened weights in Y8 times each x row's eight
// elements at AX into its accumulator.
#define ROWS8_ARGS \
	MOVQ x+0(FP), SI; MOVQ xstride+8(FP), AX; SHLQ $2, AX; \
	LEAQ (SI)(AX*1), BX; LEAQ (BX)(AX*1), R8; LEAQ (R8)(AX*1), R9; \
	LEAQ (R9)(AX*1), R11; LEAQ (R11)(AX*1), R12; LEAQ (R12)(AX*1), R13; \
	LEAQ (R13)(AX*1), R14; \
	MOVQ w+16(FP), DI; MOVQ rows+24(FP), R15; MOVQ k+32(FP), CX; \
	MOVQ out+40(FP), DX; MOVQ ostride+48(FP), R10; SHLQ $2, R10

#define ROWS8_ZERO \
	VXORPS Y0, Y0, Y0; VXORPS Y1, Y1, Y1; VXORPS Y2, Y2, Y2; VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; VXORPS Y5, Y5, Y5; VXORPS Y6, Y6, Y6; VXORPS Y7, Y7, Y7; \
	XORQ AX, AX

#define ROWS8_FMA \
	VFMADD231PS (SI)(AX*4), Y8, Y0; VFMADD231PS (BX)(AX*4), Y8, Y1; \
	VFMADD231PS (R8)(AX*4), Y8, Y2; VFMADD231PS (R9)(AX*4), Y8, Y3; \
	VFMADD231PS (R11)(AX*4), Y8, Y4; VFMADD231PS (R12)(AX*4), Y8, Y5; \
	VFMADD231PS (R13)(AX*4), Y8, Y6; VFMADD231PS (R14)(AX*4), Y8, Y7

// HSUM8 reduces each of Y0-Y7 to one float with the reduction every
// dot-form tile shares (lanes i and i+4, then ((0+1)+(2+3))): the sums of
// Y0-Y3 land in X0's lanes, those of Y4-Y7 in X4's. Clobbers X1-X3, X5-X8.
#define HSUM8 \
	VEXTRACTF128 $1, Y0, X8; VADDPS X8, X0, X0; \
	VEXTRACTF128 $1, Y1, X8; VADDPS X8, X1, X1; \
	VEXTRACTF128 $1, Y2, X8; VADDPS X8, X2, X2; \
	VEXTRACTF128 $1, Y3, X8; VADDPS X8, X3, X3; \
	VEXTRACTF128 $1, Y4, X8; VADDPS X8, X4, X4; \
	VEXTRACTF128 $1, Y5, X8; VADDPS X8, X5, X5; \
	VEXTRACTF128 $1, Y6, X8; VADDPS X8, X6, X6; \
	VEXTRACTF128 $1, Y7, X8; VADDPS X8, X7, X7; \
	VHADDPS X1, X0, X0; VHADDPS X3, X2, X2; VHADDPS X2, X0, X0; \
	VHADDPS X5, X4, X4; VHADDPS X7, X6, X6; VHADDPS X6, X4, X4




// func sumAVX2(x *float32, n int) float32
// The STREAM-style read probe: sums n floats (n % 32 == 0) with enough
// independent accumulators that memory, not the adder, is the limit.
TEXT ·sumAVX2(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

sloop:
	CMPQ CX, $32
	JL   sdone
	// Prefetch as the kernels do, so that the probe is a true upper bound.
	PREFETCHT1 2048(SI)
	PREFETCHT1 2112(SI)
	VADDPS (SI), Y0, Y0
	VADDPS 32(SI), Y1, Y1
	VADDPS 64(SI), Y2, Y2
	VADDPS 96(SI), Y3, Y3
	ADDQ $128, SI
	SUBQ $32, CX
	JMP  sloop

sdone:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func fmaLoopAVX2(n int)
// The FLOP-peak probe: n iterations of 12 independent 8-wide FMAs (enough
// accumulators to cover the FMA latency on both ports), 192 flops each.
TEXT ·fmaLoopAVX2(SB), NOSPLIT, $0-8
	MOVQ n+0(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
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

ploop:
	VFMADD231PS Y12, Y13, Y0
	VFMADD231PS Y12, Y13, Y1
	VFMADD231PS Y12, Y13, Y2
	VFMADD231PS Y12, Y13, Y3
	VFMADD231PS Y12, Y13, Y4
	VFMADD231PS Y12, Y13, Y5
	VFMADD231PS Y12, Y13, Y6
	VFMADD231PS Y12, Y13, Y7
	VFMADD231PS Y12, Y13, Y8
	VFMADD231PS Y12, Y13, Y9
	VFMADD231PS Y12, Y13, Y10
	VFMADD231PS Y12, Y13, Y11
	DECQ CX
	JNZ  ploop
	VZEROUPPER
	RET

// func axpyAVX2(y *float32, a float32, x *float32, n int)
// y[i] += a*x[i] for n % 8 == 0.
TEXT ·axpyAVX2(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	VBROADCASTSS a+8(FP), Y0
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX

aloop32:
	CMPQ CX, $32
	JL   aloop8
	VMOVUPS (DI), Y1
	VMOVUPS 32(DI), Y2
	VMOVUPS 64(DI), Y3
	VMOVUPS 96(DI), Y4
	VFMADD231PS (SI), Y0, Y1
	VFMADD231PS 32(SI), Y0, Y2
	VFMADD231PS 64(SI), Y0, Y3
	VFMADD231PS 96(SI), Y0, Y4
	VMOVUPS Y1, (DI)
	VMOVUPS Y2, 32(DI)
	VMOVUPS Y3, 64(DI)
	VMOVUPS Y4, 96(DI)
	ADDQ $128, DI
	ADDQ $128, SI
	SUBQ $32, CX
	JMP  aloop32

aloop8:
	CMPQ CX, $8
	JL   adone
	VMOVUPS (DI), Y1
	VFMADD231PS (SI), Y0, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  aloop8

adone:
	VZEROUPPER
	RET

// func dotAVX2(x, y *float32, n int) float32
// sum x[i]*y[i] for n % 8 == 0.
TEXT ·dotAVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

dloop32:
	CMPQ CX, $32
	JL   dloop8
	VMOVUPS (SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VFMADD231PS (DI), Y4, Y0
	VFMADD231PS 32(DI), Y5, Y1
	VFMADD231PS 64(DI), Y6, Y2
	VFMADD231PS 96(DI), Y7, Y3
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  dloop32

dloop8:
	CMPQ CX, $8
	JL   ddone
	VMOVUPS (SI), Y4
	VFMADD231PS (DI), Y4, Y0
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  dloop8

ddone:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func scaleAVX2(x *float32, a float32, n int)
// x[i] *= a for n % 8 == 0.
TEXT ·scaleAVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), DI
	VBROADCASTSS a+8(FP), Y0
	MOVQ n+16(FP), CX

sloop8:
	CMPQ CX, $8
	JL   sdone8
	VMULPS (DI), Y0, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  sloop8

sdone8:
	VZEROUPPER
	RET

// func dot4x2BF16AVX2(x *float32, xstride int, w *uint16, stride, n int, out *[8]float32)
// out[r*4+c] = sum_{i<n} x[r*xstride+i] * bf16(w[c*stride+i]) for two rows
// r of x and four weight rows c; n % 8 == 0. Each weight is widened once
// for both rows, so a batch pays the widening half as often.
TEXT ·dot4x2BF16AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ xstride+8(FP), R11
	SHLQ $2, R11
	LEAQ (SI)(R11*1), R11
	MOVQ w+16(FP), DI
	MOVQ stride+24(FP), BX
	SHLQ $1, BX
	MOVQ n+32(FP), CX
	MOVQ out+40(FP), DX
	LEAQ (DI)(BX*1), R8
	LEAQ (R8)(BX*1), R9
	LEAQ (R9)(BX*1), R10
	LEAQ (R10)(BX*1), R13
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ AX, AX

x2loop:
	CMPQ CX, $8
	JL   x2done
	PREFETCHT1 (R13)(AX*8)
	VMOVUPS (SI)(AX*4), Y12
	VMOVUPS (R11)(AX*4), Y13
	VPMOVZXWD (DI)(AX*2), Y8
	VPMOVZXWD (R8)(AX*2), Y9
	VPMOVZXWD (R9)(AX*2), Y10
	VPMOVZXWD (R10)(AX*2), Y11
	VPSLLD $16, Y8, Y8
	VPSLLD $16, Y9, Y9
	VPSLLD $16, Y10, Y10
	VPSLLD $16, Y11, Y11
	VFMADD231PS Y12, Y8, Y0
	VFMADD231PS Y12, Y9, Y1
	VFMADD231PS Y12, Y10, Y2
	VFMADD231PS Y12, Y11, Y3
	VFMADD231PS Y13, Y8, Y4
	VFMADD231PS Y13, Y9, Y5
	VFMADD231PS Y13, Y10, Y6
	VFMADD231PS Y13, Y11, Y7
	ADDQ $8, AX
	SUBQ $8, CX
	JMP  x2loop

x2done:
	// Row 0: Y0..Y3 -> out[0..3]; row 1: Y4..Y7 -> out[4..7].
	VEXTRACTF128 $1, Y0, X8
	VADDPS X8, X0, X0
	VEXTRACTF128 $1, Y1, X9
	VADDPS X9, X1, X1
	VEXTRACTF128 $1, Y2, X10
	VADDPS X10, X2, X2
	VEXTRACTF128 $1, Y3, X11
	VADDPS X11, X3, X3
	VHADDPS X1, X0, X0
	VHADDPS X3, X2, X2
	VHADDPS X2, X0, X0
	VMOVUPS X0, (DX)
	VEXTRACTF128 $1, Y4, X8
	VADDPS X8, X4, X4
	VEXTRACTF128 $1, Y5, X9
	VADDPS X9, X5, X5
	VEXTRACTF128 $1, Y6, X10
	VADDPS X10, X6, X6
	VEXTRACTF128 $1, Y7, X11
	VADDPS X11, X7, X7
	VHADDPS X5, X4, X4
	VHADDPS X7, X6, X6
	VHADDPS X6, X4, X4
	VMOVUPS X4, 16(DX)
	VZEROUPPER
	RET

// func dot4x1BF16AVX2(x *float32, w *uint16, stride, n int, out *[4]float32)
// Row 0 of dot4x2BF16AVX2 alone, with the same arithmetic (one 8-wide
// accumulator per weight row, reduced the same way), for a lone x row.
TEXT ·dot4x1BF16AVX2(SB), NOSPLIT, $0-40
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ stride+16(FP), BX
	SHLQ $1, BX
	MOVQ n+24(FP), CX
	MOVQ out+32(FP), DX
	LEAQ (DI)(BX*1), R8
	LEAQ (R8)(BX*1), R9
	LEAQ (R9)(BX*1), R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX

x1loop:
	CMPQ CX, $8
	JL   x1done
	VMOVUPS (SI)(AX*4), Y12
	VPMOVZXWD (DI)(AX*2), Y8
	VPMOVZXWD (R8)(AX*2), Y9
	VPMOVZXWD (R9)(AX*2), Y10
	VPMOVZXWD (R10)(AX*2), Y11
	VPSLLD $16, Y8, Y8
	VPSLLD $16, Y9, Y9
	VPSLLD $16, Y10, Y10
	VPSLLD $16, Y11, Y11
	VFMADD231PS Y12, Y8, Y0
	VFMADD231PS Y12, Y9, Y1
	VFMADD231PS Y12, Y10, Y2
	VFMADD231PS Y12, Y11, Y3
	ADDQ $8, AX
	SUBQ $8, CX
	JMP  x1loop

x1done:
	VEXTRACTF128 $1, Y0, X8
	VADDPS X8, X0, X0
	VEXTRACTF128 $1, Y1, X9
	VADDPS X9, X1, X1
	VEXTRACTF128 $1, Y2, X10
	VADDPS X10, X2, X2
	VEXTRACTF128 $1, Y3, X11
	VADDPS X11, X3, X3
	VHADDPS X1, X0, X0
	VHADDPS X3, X2, X2
	VHADDPS X2, X0, X0
	VMOVUPS X0, (DX)
	VZEROUPPER
	RET

// func widenBF16AVX2(dst *float32, src *uint16, n int)
// dst[i] = float32 of bf16 src[i], for n % 8 == 0.
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

wloop:
	CMPQ CX, $16
	JL   wloop8
	VPMOVZXWD (SI), Y0
	VPMOVZXWD 16(SI), Y1
	VPSLLD $16, Y0, Y0
	VPSLLD $16, Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  wloop

wloop8:
	CMPQ CX, $8
	JL   wdone
	VPMOVZXWD (SI), Y0
	VPSLLD $16, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  wloop8

wdone:
	VZEROUPPER
	RET

// func rowUpdateAVX2(row, u, o *float32, a, b, c float32, n int)
// row = a*row + b*u; o += c*row, for n % 8 == 0: one pass over a KDA state
// row for the decay, the delta-rule write and the output read.
TEXT ·rowUpdateAVX2(SB), NOSPLIT, $0-48
	MOVQ row+0(FP), DI
	MOVQ u+8(FP), SI
	MOVQ o+16(FP), DX
	VBROADCASTSS a+24(FP), Y13
	VBROADCASTSS b+28(FP), Y14
	VBROADCASTSS c+32(FP), Y15
	MOVQ n+40(FP), CX

rloop:
	CMPQ CX, $8
	JL   rdone
	VMULPS (SI), Y14, Y1
	VFMADD231PS (DI), Y13, Y1
	VMOVUPS Y1, (DI)
	VMOVUPS (DX), Y2
	VFMADD231PS Y1, Y15, Y2
	VMOVUPS Y2, (DX)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, DX
	SUBQ $8, CX
	JMP  rloop

rdone:
	VZEROUPPER
	RET

// Register use of the vector exponential (expBody):
//   Y0 x in, result out; Y1-Y7 temporaries; Y8-Y15 constants.
// Constants table (func args k): 0 low, 4 high, 8 log2e, 12 ln2hi,
// 16 ln2lo, 20 c7, 24 c6, 28 c5, 32 c4, 36 c3, 40 c2, 44 c1, 48 c0, 52 +Inf, 56 2.

// func expAVX2(x *float32, n int, k *[16]float32)
// x[i] = Exp(x[i]) for n % 8 == 0, bit for bit as the Go function.
TEXT ·expAVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ k+16(FP), R8

eloop:
	CMPQ CX, $8
	JL   edone
	VMOVUPS (DI), Y0
	CALL ·expBody(SB)
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  eloop

edone:
	VZEROUPPER
	RET

// func sigmoidAVX2(x *float32, n int, k *[16]float32)
// x[i] = Sigmoid(x[i]): e = Exp(-|x|), then 1/(1+e) for x >= 0 and
// e/(1+e) below, as the Go function computes it.
TEXT ·sigmoidAVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ k+16(FP), R8

gloop:
	CMPQ CX, $8
	JL   gdone
	VMOVUPS (DI), Y13            // x
	VXORPS Y14, Y14, Y14
	VCMPPS $0x0d, Y14, Y13, Y15  // x >= 0 (GE_OS)
	VSUBPS Y13, Y14, Y0          // -x
	VMINPS Y13, Y0, Y0           // -|x| = min(x, -x)
	CALL ·expBody(SB)            // Y0 = e
	VBROADCASTSS 48(R8), Y1      // 1
	VADDPS Y1, Y0, Y2            // 1 + e
	VBLENDVPS Y15, Y1, Y0, Y3    // x >= 0 ? 1 : e
	VDIVPS Y2, Y3, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  gloop

gdone:
	VZEROUPPER
	RET

// expBody computes Y0 = Exp(Y0) lane-wise with the constants at (R8);
// clobbers Y1-Y12.
TEXT ·expBody(SB), NOSPLIT|NOFRAME, $0-0
	VBROADCASTSS 0(R8), Y8
	VBROADCASTSS 4(R8), Y9
	VCMPPS $0x11, Y8, Y0, Y10    // x < low (LT_OQ): result 0
	VCMPPS $0x1e, Y9, Y0, Y11    // x > high (GT_OQ): result +Inf
	VCMPPS $0x03, Y0, Y0, Y12    // NaN lanes (UNORD_Q)
	VMOVAPS Y0, Y7               // keep x for NaN lanes
	VMAXPS Y8, Y0, Y0            // clamp, so the rest stays finite
	VMINPS Y9, Y0, Y0
	VBROADCASTSS 8(R8), Y1
	VMULPS Y1, Y0, Y1            // x·log2e
	VROUNDPS $0, Y1, Y1          // n, to nearest even
	VBROADCASTSS 12(R8), Y2
	VMULPS Y1, Y2, Y2
	VSUBPS Y2, Y0, Y3            // r = x - n·ln2hi
	VBROADCASTSS 16(R8), Y2
	VMULPS Y1, Y2, Y2
	VSUBPS Y2, Y3, Y3            // r -= n·ln2lo
	VBROADCASTSS 20(R8), Y4      // c7
	VMULPS Y3, Y4, Y4
	VBROADCASTSS 24(R8), Y2
	VADDPS Y2, Y4, Y4            // c6 + r·c7
	VMULPS Y3, Y4, Y4
	VBROADCASTSS 28(R8), Y2
	VADDPS Y2, Y4, Y4
	VMULPS Y3, Y4, Y4
	VBROADCASTSS 32(R8), Y2
	VADDPS Y2, Y4, Y4
	VMULPS Y3, Y4, Y4
	VBROADCASTSS 36(R8), Y2
	VADDPS Y2, Y4, Y4
	VMULPS Y3, Y4, Y4
	VBROADCASTSS 40(R8), Y2
	VADDPS Y2, Y4, Y4
	VMULPS Y3, Y4, Y4
	VBROADCASTSS 44(R8), Y2
	VADDPS Y2, Y4, Y4
	VMULPS Y3, Y4, Y4
	VBROADCASTSS 48(R8), Y2
	VADDPS Y2, Y4, Y4            // p
	// 2^n: lanes with n > 127 use 2·2^(n-1).
	VCVTPS2DQ Y1, Y5             // n as int32 (exact: n is integral)
	MOVL $127, AX
	VMOVD AX, X6
	VPBROADCASTD X6, Y6
	VPCMPGTD Y6, Y5, Y6          // n > 127: all ones (-1) there
	MOVL $127, AX
	VMOVD AX, X2
	VPBROADCASTD X2, Y2
	VPADDD Y6, Y2, Y2            // exponent bias: 127, or 126 where n > 127
	VPADDD Y2, Y5, Y5
	VPSLLD $23, Y5, Y5           // 2^n (or 2^(n-1))
	VBROADCASTSS 56(R8), Y2      // 2
	VMULPS Y2, Y4, Y2            // p·2
	VBLENDVPS Y6, Y2, Y4, Y4     // p, or p·2 where n > 127
	VMULPS Y5, Y4, Y0
	// Special lanes: 0 below low, +Inf above high, NaN stays.
	VANDNPS Y0, Y10, Y0
	VBROADCASTSS 52(R8), Y2
	VBLENDVPS Y11, Y2, Y0, Y0
	VBLENDVPS Y12, Y7, Y0, Y0
	RET

// func dot2x4BF16AVX2(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)
// Two consecutive bf16 weight rows (k long, k % 8 == 0) against four rows
// of x (xstride floats apart): out[r*ostride+c] = x_r · w_c. Each weight is
// widened once for four rows; each accumulator sums exactly as
// dot4x1BF16AVX2's do, so results do not depend on the batch.
TEXT ·dot2x4BF16AVX2(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ xstride+8(FP), R11
	SHLQ $2, R11
	LEAQ (SI)(R11*1), R12
	LEAQ (R12)(R11*1), R13
	LEAQ (R13)(R11*1), R14
	MOVQ w+16(FP), DI
	MOVQ wstride+24(FP), BX
	SHLQ $1, BX
	MOVQ k+32(FP), CX
	LEAQ (DI)(BX*1), R8      // weight row 1 (row 0 again when wstride is 0)
	MOVQ CX, R9
	SHLQ $2, R9
	LEAQ (DI)(R9*1), R9      // the next pair, prefetched
	MOVQ out+40(FP), DX
	MOVQ ostride+48(FP), R10
	SHLQ $2, R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ AX, AX

x4loop:
	CMPQ CX, $8
	JL   x4done
	PREFETCHT1 (R9)(AX*4)
	VPMOVZXWD (DI)(AX*2), Y8
	VPMOVZXWD (R8)(AX*2), Y9
	VPSLLD $16, Y8, Y8
	VPSLLD $16, Y9, Y9
	VMOVUPS (SI)(AX*4), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y1
	VMOVUPS (R12)(AX*4), Y11
	VFMADD231PS Y11, Y8, Y2
	VFMADD231PS Y11, Y9, Y3
	VMOVUPS (R13)(AX*4), Y10
	VFMADD231PS Y10, Y8, Y4
	VFMADD231PS Y10, Y9, Y5
	VMOVUPS (R14)(AX*4), Y11
	VFMADD231PS Y11, Y8, Y6
	VFMADD231PS Y11, Y9, Y7
	ADDQ $8, AX
	SUBQ $8, CX
	JMP  x4loop

x4done:
	HSUM8
	VMOVLPS X0, (DX)
	ADDQ R10, DX
	VMOVHPS X0, (DX)
	ADDQ R10, DX
	VMOVLPS X4, (DX)
	ADDQ R10, DX
	VMOVHPS X4, (DX)
	VZEROUPPER
	RET

// func triadAVX2(a, b, c *float32, s float32, n int)
// a[i] = b[i] + s*c[i] for n % 8 == 0, with non-temporal stores: the STREAM
// triad, moving 12 bytes per element.
TEXT ·triadAVX2(SB), NOSPLIT, $0-40
	MOVQ a+0(FP), DI
	MOVQ b+8(FP), SI
	MOVQ c+16(FP), DX
	VBROADCASTSS s+24(FP), Y0
	MOVQ n+32(FP), CX

tloop:
	CMPQ CX, $8
	JL   tdone
	PREFETCHT1 2048(SI)
	PREFETCHT1 2048(DX)
	VMOVUPS (SI), Y1
	VFMADD231PS (DX), Y0, Y1
	VMOVNTPS Y1, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, DX
	SUBQ $8, CX
	JMP  tloop

tdone:
	SFENCE
	VZEROUPPER
	RET

// func dot4x2F32AVX2(x *float32, xstride int, w *float32, stride, n int, out *[8]float32)
// The float32-weight twin of dot4x2BF16AVX2, with the same arithmetic.
TEXT ·dot4x2F32AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ xstride+8(FP), R11
	SHLQ $2, R11
	LEAQ (SI)(R11*1), R11
	MOVQ w+16(FP), DI
	MOVQ stride+24(FP), BX
	SHLQ $2, BX
	MOVQ n+32(FP), CX
	MOVQ out+40(FP), DX
	LEAQ (DI)(BX*1), R8
	LEAQ (R8)(BX*1), R9
	LEAQ (R9)(BX*1), R10
	LEAQ (R10)(BX*1), R13
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ AX, AX

f2loop:
	CMPQ CX, $8
	JL   f2done
	PREFETCHT1 (R13)
	PREFETCHT1 64(R13)
	ADDQ $128, R13
	VMOVUPS (SI)(AX*4), Y12
	VMOVUPS (R11)(AX*4), Y13
	VMOVUPS (DI)(AX*4), Y8
	VMOVUPS (R8)(AX*4), Y9
	VMOVUPS (R9)(AX*4), Y10
	VMOVUPS (R10)(AX*4), Y11
	VFMADD231PS Y12, Y8, Y0
	VFMADD231PS Y12, Y9, Y1
	VFMADD231PS Y12, Y10, Y2
	VFMADD231PS Y12, Y11, Y3
	VFMADD231PS Y13, Y8, Y4
	VFMADD231PS Y13, Y9, Y5
	VFMADD231PS Y13, Y10, Y6
	VFMADD231PS Y13, Y11, Y7
	ADDQ $8, AX
	SUBQ $8, CX
	JMP  f2loop

f2done:
	// Row 0: Y0..Y3 -> out[0..3]; row 1: Y4..Y7 -> out[4..7].
	VEXTRACTF128 $1, Y0, X8
	VADDPS X8, X0, X0
	VEXTRACTF128 $1, Y1, X9
	VADDPS X9, X1, X1
	VEXTRACTF128 $1, Y2, X10
	VADDPS X10, X2, X2
	VEXTRACTF128 $1, Y3, X11
	VADDPS X11, X3, X3
	VHADDPS X1, X0, X0
	VHADDPS X3, X2, X2
	VHADDPS X2, X0, X0
	VMOVUPS X0, (DX)
	VEXTRACTF128 $1, Y4, X8
	VADDPS X8, X4, X4
	VEXTRACTF128 $1, Y5, X9
	VADDPS X9, X5, X5
	VEXTRACTF128 $1, Y6, X10
	VADDPS X10, X6, X6
	VEXTRACTF128 $1, Y7, X11
	VADDPS X11, X7, X7
	VHADDPS X5, X4, X4
	VHADDPS X7, X6, X6
	VHADDPS X6, X4, X4
	VMOVUPS X4, 16(DX)
	VZEROUPPER
	RET



// func rowUpdateDotAVX2(row, e, k, q *float32, a float32, n int) float32
// row = row ⊙ e + a·k, returning row · q, for n % 8 == 0: one pass over a
// V-first KDA state row for the decay, the delta-rule write and the output.
TEXT ·rowUpdateDotAVX2(SB), NOSPLIT, $0-52
	MOVQ row+0(FP), DI
	MOVQ e+8(FP), SI
	MOVQ k+16(FP), DX
	MOVQ q+24(FP), R8
	VBROADCASTSS a+32(FP), Y15
	MOVQ n+40(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1

vloop:
	CMPQ CX, $16
	JL   vtail
	VMOVUPS (DI), Y2
	VMOVUPS 32(DI), Y3
	VMULPS (SI), Y2, Y2
	VMULPS 32(SI), Y3, Y3
	VFMADD231PS (DX), Y15, Y2
	VFMADD231PS 32(DX), Y15, Y3
	VMOVUPS Y2, (DI)
	VMOVUPS Y3, 32(DI)
	VFMADD231PS (R8), Y2, Y0
	VFMADD231PS 32(R8), Y3, Y1
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, R8
	SUBQ $16, CX
	JMP  vloop

vtail:
	CMPQ CX, $8
	JL   vdone
	VMOVUPS (DI), Y2
	VMULPS (SI), Y2, Y2
	VFMADD231PS (DX), Y15, Y2
	VMOVUPS Y2, (DI)
	VFMADD231PS (R8), Y2, Y0

vdone:
	VADDPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VMOVSS X0, ret+48(FP)
	VZEROUPPER
	RET

// func reluAxpyAVX2(y *float32, a float32, x *float32, n int)
// y[i] += a*max(x[i], 0) for n % 8 == 0: one index head's contribution to
// the Lightning Indexer's scores. Multiply and add stay separate (no FMA) so
// every lane rounds exactly like the scalar tail: keys that are exact copies
// must keep exactly tied scores wherever they fall.
TEXT ·reluAxpyAVX2(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	VBROADCASTSS a+8(FP), Y0
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	VXORPS Y5, Y5, Y5

raloop:
	CMPQ CX, $16
	JL   ratail
	VMAXPS (SI), Y5, Y1
	VMAXPS 32(SI), Y5, Y2
	VMOVUPS (DI), Y3
	VMOVUPS 32(DI), Y4
	VMULPS Y0, Y1, Y1
	VMULPS Y0, Y2, Y2
	VADDPS Y1, Y3, Y3
	VADDPS Y2, Y4, Y4
	VMOVUPS Y3, (DI)
	VMOVUPS Y4, 32(DI)
	ADDQ $64, DI
	ADDQ $64, SI
	SUBQ $16, CX
	JMP  raloop

ratail:
	CMPQ CX, $8
	JL   radone
	VMAXPS (SI), Y5, Y1
	VMOVUPS (DI), Y3
	VMULPS Y0, Y1, Y1
	VADDPS Y1, Y3, Y3
	VMOVUPS Y3, (DI)

radone:
	VZEROUPPER
	RET

// func dot2x8BF16AVX512(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)
// dot2x4BF16AVX2 for eight rows of x: the same 256-bit lanes and the same
// reduction, so every output is bit-identical to it, but AVX-512VL's extra
// registers (Y16-Y23 hold rows 4-7) let each widened weight serve eight
// rows, halving the widening work per product.
TEXT ·dot2x8BF16AVX512(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ xstride+8(FP), R11
	SHLQ $2, R11
	LEAQ (SI)(R11*2), R12
	ADDQ R11, R12            // row 3
	LEAQ (R12)(R11*2), R13
	ADDQ R11, R13            // row 6
	MOVQ w+16(FP), DI
	MOVQ wstride+24(FP), BX
	SHLQ $1, BX
	MOVQ k+32(FP), CX
	LEAQ (DI)(BX*1), R8      // weight row 1 (row 0 again when wstride is 0)
	MOVQ CX, R9
	SHLQ $3, R9
	ADDQ DI, R9              // the pair after next, prefetched
	MOVQ out+40(FP), DX
	MOVQ ostride+48(FP), R10
	SHLQ $2, R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VPXORD Y16, Y16, Y16
	VPXORD Y17, Y17, Y17
	VPXORD Y18, Y18, Y18
	VPXORD Y19, Y19, Y19
	VPXORD Y20, Y20, Y20
	VPXORD Y21, Y21, Y21
	VPXORD Y22, Y22, Y22
	VPXORD Y23, Y23, Y23

x8loop:
	CMPQ CX, $8
	JL   x8done
	PREFETCHT1 (R9)
	VPMOVZXWD (DI), Y8
	VPMOVZXWD (R8), Y9
	VPSLLD $16, Y8, Y8
	VPSLLD $16, Y9, Y9
	VMOVUPS (SI), Y10
	VMOVUPS (SI)(R11*1), Y11
	VMOVUPS (SI)(R11*2), Y12
	VMOVUPS (R12), Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y1
	VFMADD231PS Y11, Y8, Y2
	VFMADD231PS Y11, Y9, Y3
	VFMADD231PS Y12, Y8, Y4
	VFMADD231PS Y12, Y9, Y5
	VFMADD231PS Y13, Y8, Y6
	VFMADD231PS Y13, Y9, Y7
	VMOVUPS (SI)(R11*4), Y10
	VMOVUPS (R12)(R11*2), Y11
	VMOVUPS (R13), Y12
	VMOVUPS (R13)(R11*1), Y13
	VFMADD231PS Y10, Y8, Y16
	VFMADD231PS Y10, Y9, Y17
	VFMADD231PS Y11, Y8, Y18
	VFMADD231PS Y11, Y9, Y19
	VFMADD231PS Y12, Y8, Y20
	VFMADD231PS Y12, Y9, Y21
	VFMADD231PS Y13, Y8, Y22
	VFMADD231PS Y13, Y9, Y23
	ADDQ $32, SI
	ADDQ $32, R12
	ADDQ $32, R13
	ADDQ $16, DI
	ADDQ $16, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JMP  x8loop

x8done:
	CALL ·reduce2x4(SB)
	ADDQ R10, DX
	VMOVAPS Y16, Y0
	VMOVAPS Y17, Y1
	VMOVAPS Y18, Y2
	VMOVAPS Y19, Y3
	VMOVAPS Y20, Y4
	VMOVAPS Y21, Y5
	VMOVAPS Y22, Y6
	VMOVAPS Y23, Y7
	CALL ·reduce2x4(SB)
	VZEROUPPER
	RET

// func dot2x8F32AVX512(x *float32, xstride int, w *float32, wstride, k int, out *float32, ostride int)
// dot2x8BF16AVX512 for float32 weights: per output the lanes and the
// reduction of dot4x2F32AVX2, so results do not depend on the tile.
TEXT ·dot2x8F32AVX512(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ xstride+8(FP), R11
	SHLQ $2, R11
	LEAQ (SI)(R11*2), R12
	ADDQ R11, R12            // row 3
	LEAQ (R12)(R11*2), R13
	ADDQ R11, R13            // row 6
	MOVQ w+16(FP), DI
	MOVQ wstride+24(FP), BX
	SHLQ $2, BX
	MOVQ k+32(FP), CX
	LEAQ (DI)(BX*1), R8      // weight row 1 (row 0 again when wstride is 0)
	MOVQ CX, R9
	SHLQ $4, R9
	ADDQ DI, R9              // the pair after next, prefetched
	MOVQ out+40(FP), DX
	MOVQ ostride+48(FP), R10
	SHLQ $2, R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VPXORD Y16, Y16, Y16
	VPXORD Y17, Y17, Y17
	VPXORD Y18, Y18, Y18
	VPXORD Y19, Y19, Y19
	VPXORD Y20, Y20, Y20
	VPXORD Y21, Y21, Y21
	VPXORD Y22, Y22, Y22
	VPXORD Y23, Y23, Y23

xf8loop:
	CMPQ CX, $8
	JL   xf8done
	PREFETCHT1 (R9)
	VMOVUPS (DI), Y8
	VMOVUPS (R8), Y9
	VMOVUPS (SI), Y10
	VMOVUPS (SI)(R11*1), Y11
	VMOVUPS (SI)(R11*2), Y12
	VMOVUPS (R12), Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y1
	VFMADD231PS Y11, Y8, Y2
	VFMADD231PS Y11, Y9, Y3
	VFMADD231PS Y12, Y8, Y4
	VFMADD231PS Y12, Y9, Y5
	VFMADD231PS Y13, Y8, Y6
	VFMADD231PS Y13, Y9, Y7
	VMOVUPS (SI)(R11*4), Y10
	VMOVUPS (R12)(R11*2), Y11
	VMOVUPS (R13), Y12
	VMOVUPS (R13)(R11*1), Y13
	VFMADD231PS Y10, Y8, Y16
	VFMADD231PS Y10, Y9, Y17
	VFMADD231PS Y11, Y8, Y18
	VFMADD231PS Y11, Y9, Y19
	VFMADD231PS Y12, Y8, Y20
	VFMADD231PS Y12, Y9, Y21
	VFMADD231PS Y13, Y8, Y22
	VFMADD231PS Y13, Y9, Y23
	ADDQ $32, SI
	ADDQ $32, R12
	ADDQ $32, R13
	ADDQ $32, DI
	ADDQ $32, R8
	PREFETCHT1 32(R9)
	ADDQ $64, R9
	SUBQ $8, CX
	JMP  xf8loop

xf8done:
	CALL ·reduce2x4(SB)
	ADDQ R10, DX
	VMOVAPS Y16, Y0
	VMOVAPS Y17, Y1
	VMOVAPS Y18, Y2
	VMOVAPS Y19, Y3
	VMOVAPS Y20, Y4
	VMOVAPS Y21, Y5
	VMOVAPS Y22, Y6
	VMOVAPS Y23, Y7
	CALL ·reduce2x4(SB)
	VZEROUPPER
	RET

// reduce2x4 reduces accumulators Y0-Y7 (x row r against weight row c in
// Y(2r+c)) exactly as dot2x4BF16AVX2 does and stores the four output rows
// from DX, R10 bytes apart; DX is left at the last row.
TEXT ·reduce2x4(SB), NOSPLIT|NOFRAME, $0-0
	HSUM8
	VMOVLPS X0, (DX)
	ADDQ R10, DX
	VMOVHPS X0, (DX)
	ADDQ R10, DX
	VMOVLPS X4, (DX)
	ADDQ R10, DX
	VMOVHPS X4, (DX)
	RET

// func mulAddAVX2(y, a, b *float32, n int)
// y[i] += a[i]*b[i] for n % 8 == 0, multiply and add rounded separately
// (no FMA) so every lane matches the scalar loop bit for bit.
TEXT ·mulAddAVX2(SB), NOSPLIT, $0-32
	MOVQ y+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX

maloop:
	CMPQ CX, $16
	JL   matail
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMULPS (DX), Y0, Y0
	VMULPS 32(DX), Y1, Y1
	VADDPS (DI), Y0, Y0
	VADDPS 32(DI), Y1, Y1
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, DX
	SUBQ $16, CX
	JMP  maloop

matail:
	CMPQ CX, $8
	JL   madone
	VMOVUPS (SI), Y0
	VMULPS (DX), Y0, Y0
	VADDPS (DI), Y0, Y0
	VMOVUPS Y0, (DI)

madone:
	VZEROUPPER
	RET

// func rankUpdateAVX2(row, e, a, b *float32, ldb, c, n int)
// row[x] = row[x]*e[x] + Σ_{i<c} a[i]*b[i*ldb+x] for x < n, n % 64 == 0:
// a KDA chunk's state update, one state row at a time, the row held in
// eight registers while the chunk's c keys stream past.
TEXT ·rankUpdateAVX2(SB), NOSPLIT, $0-56
	MOVQ row+0(FP), DI
	MOVQ e+8(FP), SI
	MOVQ a+16(FP), R8
	MOVQ b+24(FP), R9
	MOVQ ldb+32(FP), R10
	SHLQ $2, R10
	MOVQ c+40(FP), R11
	MOVQ n+48(FP), CX

rublock:
	CMPQ CX, $64
	JL   rudone
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVUPS 128(DI), Y5
	VMOVUPS 160(DI), Y6
	VMOVUPS 192(DI), Y7
	VMOVUPS 224(DI), Y8
	VMULPS (SI), Y0, Y0
	VMULPS 32(SI), Y1, Y1
	VMULPS 64(SI), Y2, Y2
	VMULPS 96(SI), Y3, Y3
	VMULPS 128(SI), Y5, Y5
	VMULPS 160(SI), Y6, Y6
	VMULPS 192(SI), Y7, Y7
	VMULPS 224(SI), Y8, Y8
	MOVQ R9, BX
	MOVQ R8, DX
	MOVQ R11, R12

ruterm:
	TESTQ R12, R12
	JZ    rustore
	VBROADCASTSS (DX), Y4
	VFMADD231PS (BX), Y4, Y0
	VFMADD231PS 32(BX), Y4, Y1
	VFMADD231PS 64(BX), Y4, Y2
	VFMADD231PS 96(BX), Y4, Y3
	VFMADD231PS 128(BX), Y4, Y5
	VFMADD231PS 160(BX), Y4, Y6
	VFMADD231PS 192(BX), Y4, Y7
	VFMADD231PS 224(BX), Y4, Y8
	ADDQ $4, DX
	ADDQ R10, BX
	DECQ R12
	JMP  ruterm

rustore:
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y5, 128(DI)
	VMOVUPS Y6, 160(DI)
	VMOVUPS Y7, 192(DI)
	VMOVUPS Y8, 224(DI)
	ADDQ $256, DI
	ADDQ $256, SI
	ADDQ $256, R9
	SUBQ $64, CX
	JMP  rublock

rudone:
	VZEROUPPER
	RET

// func addAVX2(dst, a, b *float32, n int)
// dst[i] = a[i] + b[i] for n % 8 == 0; dst may be a or b.
TEXT ·addAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX

valoop:
	CMPQ CX, $32
	JL   vatail
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS (DX), Y0, Y0
	VADDPS 32(DX), Y1, Y1
	VADDPS 64(DX), Y2, Y2
	VADDPS 96(DX), Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ $128, DI
	ADDQ $128, SI
	ADDQ $128, DX
	SUBQ $32, CX
	JMP  valoop

vatail:
	CMPQ CX, $8
	JL   vadone
	VMOVUPS (SI), Y0
	VADDPS (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, DX
	SUBQ $8, CX
	JMP  vatail

vadone:
	VZEROUPPER
	RET

// func mulAVX2(dst, a, b *float32, n int)
// dst[i] = a[i] * b[i] for n % 8 == 0; dst may be a or b.
TEXT ·mulAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX

vmloop:
	CMPQ CX, $32
	JL   vmtail
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VMULPS (DX), Y0, Y0
	VMULPS 32(DX), Y1, Y1
	VMULPS 64(DX), Y2, Y2
	VMULPS 96(DX), Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ $128, DI
	ADDQ $128, SI
	ADDQ $128, DX
	SUBQ $32, CX
	JMP  vmloop

vmtail:
	CMPQ CX, $8
	JL   vmdone
	VMOVUPS (SI), Y0
	VMULPS (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, DX
	SUBQ $8, CX
	JMP  vmtail

vmdone:
	VZEROUPPER
	RET

// func subAVX2(dst, a, b *float32, n int)
// dst[i] = a[i] - b[i] for n % 8 == 0; dst may be a or b.
TEXT ·subAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ n+24(FP), CX

vsloop:
	CMPQ CX, $32
	JL   vstail
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VSUBPS (DX), Y0, Y0
	VSUBPS 32(DX), Y1, Y1
	VSUBPS 64(DX), Y2, Y2
	VSUBPS 96(DX), Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ $128, DI
	ADDQ $128, SI
	ADDQ $128, DX
	SUBQ $32, CX
	JMP  vsloop

vstail:
	CMPQ CX, $8
	JL   vsdone
	VMOVUPS (SI), Y0
	VSUBPS (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, DX
	SUBQ $8, CX
	JMP  vstail

vsdone:
	VZEROUPPER
	RET

// func mixAVX2(out, x, y *float32, a, b, c float32, n int)
// out[i] = (x[i]*a + y[i]*b) * c for n % 8 == 0, every product and sum
// rounded on its own (no FMA), as the scalar loop computes it.
TEXT ·mixAVX2(SB), NOSPLIT, $0-48
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ y+16(FP), DX
	VBROADCASTSS a+24(FP), Y5
	VBROADCASTSS b+28(FP), Y6
	VBROADCASTSS c+32(FP), Y7
	MOVQ n+40(FP), CX

mxloop:
	CMPQ CX, $8
	JL   mxdone
	VMULPS (SI), Y5, Y0
	VMULPS (DX), Y6, Y1
	VADDPS Y1, Y0, Y0
	VMULPS Y7, Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, DX
	SUBQ $8, CX
	JMP  mxloop

mxdone:
	VZEROUPPER
	RET

// func read4AVX2(x *float32, n int) float32
// The read-bandwidth probe: n floats (n % 128 == 0) read as four streams a
// quarter apart, each prefetched 1.5 KB ahead of itself, the access pattern
// of the matrix-vector kernels (four weight rows at a time), which one
// stream alone does not reach on this kind of host.
TEXT ·read4AVX2(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ CX, BX
	SHRQ $2, BX              // quarter, in floats
	LEAQ (SI)(BX*4), R8
	LEAQ (R8)(BX*4), R9
	LEAQ (R9)(BX*4), R10
	XORQ AX, AX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

r4loop:
	CMPQ AX, BX
	JGE  r4done
	PREFETCHT1 1536(SI)(AX*4)
	PREFETCHT1 1536(R8)(AX*4)
	PREFETCHT1 1536(R9)(AX*4)
	PREFETCHT1 1536(R10)(AX*4)
	VADDPS (SI)(AX*4), Y0, Y0
	VADDPS (R8)(AX*4), Y1, Y1
	VADDPS (R9)(AX*4), Y2, Y2
	VADDPS (R10)(AX*4), Y3, Y3
	ADDQ $8, AX
	JMP  r4loop

r4done:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func triadPlainAVX2(a, b, c *float32, s float32, n int)
// The STREAM triad with ordinary stores, as STREAM's own code does: the
// stores allocate their lines, so the bus moves 16 bytes per element while
// STREAM counts 12.
TEXT ·triadPlainAVX2(SB), NOSPLIT, $0-40
	MOVQ a+0(FP), DI
	MOVQ b+8(FP), SI
	MOVQ c+16(FP), DX
	VBROADCASTSS s+24(FP), Y0
	MOVQ n+32(FP), CX

tploop:
	CMPQ CX, $8
	JL   tpdone
	PREFETCHT1 2048(SI)
	PREFETCHT1 2048(DX)
	VMOVUPS (SI), Y1
	VFMADD231PS (DX), Y0, Y1
	VMOVUPS Y1, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, DX
	SUBQ $8, CX
	JMP  tploop

tpdone:
	VZEROUPPER
	RET

// func streams4x1BF16AVX2(x *float32, w *uint16, k, rows, gap int, out *float32)
// The single-row product over four streams: for i < rows, weight rows
// w[i], w[gap+i], w[2gap+i], w[3gap+i] (each k long, k % 8 == 0) against x,
// written to out[i], out[gap+i], ... . Each output gets the arithmetic of
// dot4x1BF16AVX2; the rows a tile takes are a quarter of the range apart,
// so memory is read as four long sequential streams, each row prefetched
// 1.5 KB ahead of itself.
TEXT ·streams4x1BF16AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ k+16(FP), BX
	SHLQ $1, BX              // row bytes
	MOVQ rows+24(FP), R12
	MOVQ gap+32(FP), R11
	MOVQ R11, R13
	IMULQ BX, R13            // bytes between streams
	MOVQ out+40(FP), DX
	SHLQ $2, R11             // bytes between outputs of one tile

s4row:
	TESTQ R12, R12
	JZ    s4end
	LEAQ (DI)(R13*1), R8
	LEAQ (R8)(R13*1), R9
	LEAQ (R9)(R13*1), R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX
	MOVQ k+16(FP), CX

s4loop:
	CMPQ CX, $8
	JL   s4red
	PREFETCHT1 1536(DI)(AX*2)
	PREFETCHT1 1536(R8)(AX*2)
	PREFETCHT1 1536(R9)(AX*2)
	PREFETCHT1 1536(R10)(AX*2)
	VMOVUPS (SI)(AX*4), Y12
	VPMOVZXWD (DI)(AX*2), Y8
	VPMOVZXWD (R8)(AX*2), Y9
	VPMOVZXWD (R9)(AX*2), Y10
	VPMOVZXWD (R10)(AX*2), Y11
	VPSLLD $16, Y8, Y8
	VPSLLD $16, Y9, Y9
	VPSLLD $16, Y10, Y10
	VPSLLD $16, Y11, Y11
	VFMADD231PS Y12, Y8, Y0
	VFMADD231PS Y12, Y9, Y1
	VFMADD231PS Y12, Y10, Y2
	VFMADD231PS Y12, Y11, Y3
	ADDQ $8, AX
	SUBQ $8, CX
	JMP  s4loop

s4red:
	CALL ·store4x1(SB)
	ADDQ BX, DI
	DECQ R12
	JMP  s4row

s4end:
	VZEROUPPER
	RET

// func streams4x1F32AVX2(x *float32, w *float32, k, rows, gap int, out *float32)
// streams4x1BF16AVX2 for float32 weights (each output with the arithmetic of the
// four-by-two f32 tiles for a lone row).
TEXT ·streams4x1F32AVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ w+8(FP), DI
	MOVQ k+16(FP), BX
	SHLQ $2, BX              // row bytes
	MOVQ rows+24(FP), R12
	MOVQ gap+32(FP), R11
	MOVQ R11, R13
	IMULQ BX, R13            // bytes between streams
	MOVQ out+40(FP), DX
	SHLQ $2, R11             // bytes between outputs of one tile

f4row:
	TESTQ R12, R12
	JZ    f4end
	LEAQ (DI)(R13*1), R8
	LEAQ (R8)(R13*1), R9
	LEAQ (R9)(R13*1), R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX
	MOVQ k+16(FP), CX

f4loop:
	CMPQ CX, $8
	JL   f4red
	PREFETCHT1 1536(DI)(AX*4)
	PREFETCHT1 1536(R8)(AX*4)
	PREFETCHT1 1536(R9)(AX*4)
	PREFETCHT1 1536(R10)(AX*4)
	VMOVUPS (SI)(AX*4), Y12
	VMOVUPS (DI)(AX*4), Y8
	VMOVUPS (R8)(AX*4), Y9
	VMOVUPS (R9)(AX*4), Y10
	VMOVUPS (R10)(AX*4), Y11
	VFMADD231PS Y12, Y8, Y0
	VFMADD231PS Y12, Y9, Y1
	VFMADD231PS Y12, Y10, Y2
	VFMADD231PS Y12, Y11, Y3
	ADDQ $8, AX
	SUBQ $8, CX
	JMP  f4loop

f4red:
	CALL ·store4x1(SB)
	ADDQ BX, DI
	DECQ R12
	JMP  f4row

f4end:
	VZEROUPPER
	RET

// func dpbf16LoopAVX512(n int)
// The bf16 dot-product peak probe (AVX512_BF16): n iterations of 12
// independent VDPBF16PS on zmm registers, as the fast product's tile runs
// them, 64 flops each (16 lanes, two products and two sums a lane). Go's assembler has no mnemonic for the
// instruction; the bytes are GNU as's encoding of the register form.
TEXT ·dpbf16LoopAVX512(SB), NOSPLIT, $0-8
	MOVQ n+0(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15

dploop:
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xc6 // VDPBF16PS Z14, Z15, Z0
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xce // VDPBF16PS Z14, Z15, Z1
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xd6 // VDPBF16PS Z14, Z15, Z2
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xde // VDPBF16PS Z14, Z15, Z3
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xe6 // VDPBF16PS Z14, Z15, Z4
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xee // VDPBF16PS Z14, Z15, Z5
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xf6 // VDPBF16PS Z14, Z15, Z6
	BYTE $0x62; BYTE $0xd2; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xfe // VDPBF16PS Z14, Z15, Z7
	BYTE $0x62; BYTE $0x52; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xc6 // VDPBF16PS Z14, Z15, Z8
	BYTE $0x62; BYTE $0x52; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xce // VDPBF16PS Z14, Z15, Z9
	BYTE $0x62; BYTE $0x52; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xd6 // VDPBF16PS Z14, Z15, Z10
	BYTE $0x62; BYTE $0x52; BYTE $0x06; BYTE $0x48; BYTE $0x52; BYTE $0xde // VDPBF16PS Z14, Z15, Z11
	DECQ CX
	JNZ  dploop
	VZEROUPPER
	RET

// func kdaRowsAVX2(st, ke, e, k, q, v, o, u *float32, beta float32, dk, dv int)
// KDA's decode pass over one head's state, every row in one call: for each
// of dv rows of dk (dk % 8 == 0), s = row·ke with dotAVX2's arithmetic,
// u[r] = beta·(v[r] - s), then row = row ⊙ e + u·k and o[r] = row·q with
// rowUpdateDotAVX2's. The same results as the two calls per row it
// replaces, whose overhead was much of a short row's cost.
TEXT ·kdaRowsAVX2(SB), NOSPLIT, $0-88
	KDA_ROWS_ARGS

krow:
	TESTQ DX, DX
	JZ    kend
	// s = row·ke (dotAVX2)
	XORQ AX, AX
	MOVQ BX, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

kdot32:
	CMPQ CX, $32
	JL   kdot8
	VMOVUPS (DI)(AX*1), Y4
	VMOVUPS 32(DI)(AX*1), Y5
	VMOVUPS 64(DI)(AX*1), Y6
	VMOVUPS 96(DI)(AX*1), Y7
	VFMADD231PS (R8)(AX*1), Y4, Y0
	VFMADD231PS 32(R8)(AX*1), Y5, Y1
	VFMADD231PS 64(R8)(AX*1), Y6, Y2
	VFMADD231PS 96(R8)(AX*1), Y7, Y3
	ADDQ $128, AX
	SUBQ $32, CX
	JMP  kdot32

kdot8:
	CMPQ CX, $8
	JL   kdotdone
	VMOVUPS (DI)(AX*1), Y4
	VFMADD231PS (R8)(AX*1), Y4, Y0
	ADDQ $32, AX
	SUBQ $8, CX
	JMP  kdot8

kdotdone:
	// u = beta·(v[r] - s)
	KDA_U
	VBROADCASTSS X5, Y15
	// row = row ⊙ e + u·k, o[r] = row·q (rowUpdateDotAVX2)
	XORQ AX, AX
	MOVQ BX, CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1

kupd16:
	CMPQ CX, $16
	JL   kupd8
	VMOVUPS (DI)(AX*1), Y2
	VMOVUPS 32(DI)(AX*1), Y3
	VMULPS (R9)(AX*1), Y2, Y2
	VMULPS 32(R9)(AX*1), Y3, Y3
	VFMADD231PS (R10)(AX*1), Y15, Y2
	VFMADD231PS 32(R10)(AX*1), Y15, Y3
	VMOVUPS Y2, (DI)(AX*1)
	VMOVUPS Y3, 32(DI)(AX*1)
	VFMADD231PS (R11)(AX*1), Y2, Y0
	VFMADD231PS 32(R11)(AX*1), Y3, Y1
	ADDQ $64, AX
	SUBQ $16, CX
	JMP  kupd16

kupd8:
	CMPQ CX, $8
	JL   kupddone
	VMOVUPS (DI)(AX*1), Y2
	VMULPS (R9)(AX*1), Y2, Y2
	VFMADD231PS (R10)(AX*1), Y15, Y2
	VMOVUPS Y2, (DI)(AX*1)
	VFMADD231PS (R11)(AX*1), Y2, Y0

kupddone:
	KDA_O_NEXT
	JMP  krow

kend:
	VZEROUPPER
	RET

// store4x1 reduces the stream kernels' accumulators Y0-Y3 (one output each,
// with the reduction of dot4x1BF16AVX2) and stores them at DX, DX+R11,
// DX+2·R11 and DX+3·R11; DX advances by one float. Clobbers X8-X11, CX.
TEXT ·store4x1(SB), NOSPLIT|NOFRAME, $0-0
	VEXTRACTF128 $1, Y0, X8
	VADDPS X8, X0, X0
	VEXTRACTF128 $1, Y1, X9
	VADDPS X9, X1, X1
	VEXTRACTF128 $1, Y2, X10
	VADDPS X10, X2, X2
	VEXTRACTF128 $1, Y3, X11
	VADDPS X11, X3, X3
	VHADDPS X1, X0, X0
	VHADDPS X3, X2, X2
	VHADDPS X2, X0, X0
	VMOVSS X0, (DX)
	VPSRLDQ $4, X0, X0
	VMOVSS X0, (DX)(R11*1)
	VPSRLDQ $4, X0, X0
	LEAQ (DX)(R11*2), CX
	VMOVSS X0, (CX)
	VPSRLDQ $4, X0, X0
	ADDQ R11, CX
	VMOVSS X0, (CX)
	ADDQ $4, DX
	RET

// func rows8BF16AVX2(x *float32, xstride int, w *uint16, rows, k int, out *float32, ostride int)
// Eight rows of x against `rows` consecutive bf16 weight rows, for CPUs
// without AVX-512's extra registers: each widened weight vector serves all
// eight x rows (read as memory operands of the FMAs), so a weight row is
// read and widened once per group of eight. Per output the lanes and the
// reduction of dot2x4BF16AVX2 (reduce2x4), so results do not depend on
// the tile. Output of x row q and weight row j goes to out[q*ostride+j].
TEXT ·rows8BF16AVX2(SB), NOSPLIT, $0-56
	ROWS8_ARGS

r8row:
	TESTQ R15, R15
	JZ    r8end
	ROWS8_ZERO

r8loop:
	CMPQ AX, CX
	JGE  r8red
	// The weights are one stream (rows are consecutive): prefetch it 4 KB
	// ahead, past the row at hand.
	PREFETCHT0 4096(DI)(AX*2)
	VPMOVZXWD (DI)(AX*2), Y8
	VPSLLD $16, Y8, Y8
	ROWS8_FMA
	ADDQ $8, AX
	JMP  r8loop

r8red:
	CALL ·reduce8x1(SB)
	ADDQ $4, DX
	LEAQ (DI)(CX*2), DI
	DECQ R15
	JMP  r8row

r8end:
	VZEROUPPER
	RET

// func rows8F32AVX2(x *float32, xstride int, w *float32, rows, k int, out *float32, ostride int)
// rows8BF16AVX2 for float32 weights (per output the arithmetic of
// dot4x2F32AVX2).
TEXT ·rows8F32AVX2(SB), NOSPLIT, $0-56
	ROWS8_ARGS

rf8row:
	TESTQ R15, R15
	JZ    rf8end
	ROWS8_ZERO

rf8loop:
	CMPQ AX, CX
	JGE  rf8red
	PREFETCHT0 4096(DI)(AX*4)
	VMOVUPS (DI)(AX*4), Y8
	ROWS8_FMA
	ADDQ $8, AX
	JMP  rf8loop

rf8red:
	CALL ·reduce8x1(SB)
	ADDQ $4, DX
	LEAQ (DI)(CX*4), DI
	DECQ R15
	JMP  rf8row

rf8end:
	VZEROUPPER
	RET

// reduce8x1 reduces accumulators Y0-Y7 (x row q in Yq, one weight row)
// with reduce2x4's per-accumulator arithmetic and stores output q at
// DX + q*R10. Clobbers AX and X8.
TEXT ·reduce8x1(SB), NOSPLIT|NOFRAME, $0-0
	HSUM8
	MOVQ DX, AX
	VMOVSS X0, (AX)
	ADDQ R10, AX
	VEXTRACTPS $1, X0, (AX)
	ADDQ R10, AX
	VEXTRACTPS $2, X0, (AX)
	ADDQ R10, AX
	VEXTRACTPS $3, X0, (AX)
	ADDQ R10, AX
	VMOVSS X4, (AX)
	ADDQ R10, AX
	VEXTRACTPS $1, X4, (AX)
	ADDQ R10, AX
	VEXTRACTPS $2, X4, (AX)
	ADDQ R10, AX
	VEXTRACTPS $3, X4, (AX)
	RET

// func maxAVX2(x *float32, n int) float32
// The largest of n floats (n % 8 == 0, n >= 8; no NaNs), eight lanes in
// each of two accumulators. A max rounds nothing, so the value is the
// running max's (the sign of a zero may differ, which no caller sees).
TEXT ·maxAVX2(SB), NOSPLIT, $0-20
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VMOVUPS (SI), Y0
	VMOVAPS Y0, Y1
	ADDQ $32, SI
	SUBQ $8, CX

mx16:
	CMPQ CX, $16
	JL   mx8
	VMAXPS (SI), Y0, Y0
	VMAXPS 32(SI), Y1, Y1
	ADDQ $64, SI
	SUBQ $16, CX
	JMP  mx16

mx8:
	CMPQ CX, $8
	JL   mxdone
	VMAXPS (SI), Y0, Y0

mxdone:
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VMOVSS X0, ret+16(FP)
	VZEROUPPER
	RET

// func situAVX2(dst, gate, up, sg, eg, eu *float32, n int, c *[16]float32)
// SiTU's last step for n elements (n % 8 == 0), eight at a time, with the
// operations of the scalar loop in SiTU in the same order and rounding
// (no FMA): a = (beta·tanh(g/beta))·sg, w = linBeta·tanh(u/linBeta) (or u
// when linBeta is 0), dst = a·w, where tanh(x) given e2 = exp(2|x|) is the
// Taylor polynomial below |x| 0.3 and ±(1 - 2/(e2+1)) above (tanhExp).
// c holds beta, linBeta (0: none), 0.3, 1, 2 and the four polynomial
// coefficients 62/2835, -17/315, 2/15, -1/3.
TEXT ·situAVX2(SB), NOSPLIT, $0-64
	MOVQ dst+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), R8
	MOVQ sg+24(FP), R9
	MOVQ eg+32(FP), R10
	MOVQ eu+40(FP), R11
	MOVQ n+48(FP), CX
	MOVQ c+56(FP), DX
	VBROADCASTSS 0(DX), Y15  // beta
	VBROADCASTSS 4(DX), Y14  // linBeta
	MOVL 4(DX), BX           // linBeta's bits: 0 leaves u as it is
	XORQ AX, AX

stloop:
	CMPQ AX, CX
	JGE  stdone
	VMOVUPS (SI)(AX*4), Y0
	VDIVPS Y15, Y0, Y0       // x = g/beta
	VMOVUPS (R10)(AX*4), Y1  // e2
	CALL ·tanhBody(SB)       // Y2 = tanh(x)
	VMULPS Y2, Y15, Y2       // beta·tanh
	VMULPS (R9)(AX*4), Y2, Y3 // ·sigmoid(g)
	VMOVUPS (R8)(AX*4), Y4   // w = u
	TESTL BX, BX
	JZ    stnolin
	VDIVPS Y14, Y4, Y0       // x = u/linBeta
	VMOVUPS (R11)(AX*4), Y1
	CALL ·tanhBody(SB)
	VMULPS Y2, Y14, Y4       // linBeta·tanh

stnolin:
	VMULPS Y4, Y3, Y3
	VMOVUPS Y3, (DI)(AX*4)
	ADDQ $8, AX
	JMP  stloop

stdone:
	VZEROUPPER
	RET

// func twiceAbsQuotientAVX2(dst, x *float32, n int, c float32)
//
// dst[i] = 2·|x[i]/c| for n (a multiple of 8) floats: the quotient
// rounded once, its sign cleared, doubled exactly (x + x), as the scalar
// expression 2 * abs32(x/c) computes it.
TEXT ·twiceAbsQuotientAVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c+24(FP), Y15
	VPCMPEQD Y14, Y14, Y14
	VPSRLD $1, Y14, Y14      // every bit but the sign
	XORQ AX, AX

taloop:
	CMPQ AX, CX
	JGE  tadone
	VMOVUPS (SI)(AX*4), Y0
	VDIVPS Y15, Y0, Y0
	VANDPS Y14, Y0, Y0
	VADDPS Y0, Y0, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP  taloop

tadone:
	VZEROUPPER
	RET

// tanhBody sets Y2 = tanh(Y0) given Y1 = exp(2|Y0|) as tanhExp does, with
// the constants at DX (situAVX2's c). Clobbers Y5-Y9; own register
// convention, not callable from Go.
TEXT ·tanhBody(SB), NOSPLIT|NOFRAME, $0-0
	// Above 0.3: t = 1 - 2/(e2+1), negated for x < 0.
	VBROADCASTSS 12(DX), Y5  // 1
	VADDPS Y5, Y1, Y6        // e2+1
	VBROADCASTSS 16(DX), Y7  // 2
	VDIVPS Y6, Y7, Y6        // 2/(e2+1)
	VSUBPS Y6, Y5, Y6        // t
	VXORPS Y7, Y7, Y7
	VCMPPS $1, Y7, Y0, Y8    // x < 0
	VPCMPEQD Y9, Y9, Y9
	VPSLLD $31, Y9, Y9       // sign bit
	VXORPS Y9, Y6, Y9        // -t
	VBLENDVPS Y8, Y9, Y6, Y6
	// Below 0.3: x·(1 + x²(-1/3 + x²(2/15 + x²(-17/315 + x²·62/2835)))).
	VMULPS Y0, Y0, Y7        // x²
	VBROADCASTSS 20(DX), Y8
	VMULPS Y8, Y7, Y8        // x²·62/2835
	VBROADCASTSS 24(DX), Y9
	VADDPS Y8, Y9, Y8        // -17/315 + ...
	VMULPS Y8, Y7, Y8
	VBROADCASTSS 28(DX), Y9
	VADDPS Y8, Y9, Y8        // 2/15 + ...
	VMULPS Y8, Y7, Y8
	VBROADCASTSS 32(DX), Y9
	VADDPS Y8, Y9, Y8        // -1/3 + ...
	VMULPS Y8, Y7, Y8
	VADDPS Y8, Y5, Y8        // 1 + ...
	VMULPS Y8, Y0, Y8        // x·(...)
	// |x| < 0.3 picks the polynomial.
	VBROADCASTSS 8(DX), Y9   // 0.3
	VPCMPEQD Y7, Y7, Y7
	VPSRLD $1, Y7, Y7        // abs mask
	VANDPS Y7, Y0, Y7        // |x|
	VCMPPS $1, Y9, Y7, Y7    // |x| < 0.3
	VBLENDVPS Y7, Y8, Y6, Y2
	RET

// func replayRowsAVX2(row, a, k, u *float32, n, stride, ustride, vecs int)
// Applies n replay records to one V-first KDA state row part of vecs
// vectors (vecs is 4 or 1): for record i, row = row ⊙ a_i + u_i·k_i with
// a_i = a + i·stride floats, k_i likewise and the scalar u_i at u +
// i·ustride floats. Each element gets rowUpdateDotAVX2's arithmetic (a
// product, then one FMA), and the part stays in registers across records.
TEXT ·replayRowsAVX2(SB), NOSPLIT, $0-64
	MOVQ row+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ k+16(FP), DX
	MOVQ u+24(FP), R8
	MOVQ n+32(FP), CX
	MOVQ stride+40(FP), R9
	SHLQ $2, R9
	MOVQ ustride+48(FP), R11
	SHLQ $2, R11
	MOVQ vecs+56(FP), R10
	CMPQ R10, $4
	JNE  rone
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3

rfour:
	TESTQ CX, CX
	JZ    rfourdone
	VBROADCASTSS (R8), Y15
	VMULPS (SI), Y0, Y0
	VMULPS 32(SI), Y1, Y1
	VMULPS 64(SI), Y2, Y2
	VMULPS 96(SI), Y3, Y3
	VFMADD231PS (DX), Y15, Y0
	VFMADD231PS 32(DX), Y15, Y1
	VFMADD231PS 64(DX), Y15, Y2
	VFMADD231PS 96(DX), Y15, Y3
	ADDQ R9, SI
	ADDQ R9, DX
	ADDQ R11, R8
	DECQ CX
	JMP  rfour

rfourdone:
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VZEROUPPER
	RET

rone:
	VMOVUPS (DI), Y0

roneloop:
	TESTQ CX, CX
	JZ    ronedone
	VBROADCASTSS (R8), Y15
	VMULPS (SI), Y0, Y0
	VFMADD231PS (DX), Y15, Y0
	ADDQ R9, SI
	ADDQ R9, DX
	ADDQ R11, R8
	DECQ CX
	JMP  roneloop

ronedone:
	VMOVUPS Y0, (DI)
	VZEROUPPER
	RET
