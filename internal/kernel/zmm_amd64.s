//go:build !purego

#include "textflag.h"
#include "kdarows_amd64.h"
#include "dpbf_amd64.h"

// 512-bit (zmm) kernels, used where the CPU runs a 512-bit FMA at about
// twice the rate of a 256-bit one (see wideFMA). Each lane keeps the FMA
// chain its 256-bit twin's lane has, so they give the same bits.

// The decode tiles' shared pieces. X_ROWS loads x and its stride and
// points R12 and R13 at x rows 3 and 6 (rows are SI, SI+R11, SI+2·R11, R12,
// SI+4·R11, R12+2·R11, R13, R13+R11).
#define X_ROWS \
	MOVQ x+0(FP), SI; MOVQ xstride+8(FP), R11; SHLQ $2, R11; \
	LEAQ (SI)(R11*2), R12; ADDQ R11, R12; \
	LEAQ (R12)(R11*2), R13; ADDQ R11, R13

#define ZERO_Z16_23 \
	VPXORD Z16, Z16, Z16; VPXORD Z17, Z17, Z17; VPXORD Z18, Z18, Z18; VPXORD Z19, Z19, Z19; \
	VPXORD Z20, Z20, Z20; VPXORD Z21, Z21, Z21; VPXORD Z22, Z22, Z22; VPXORD Z23, Z23, Z23

// FMA_8ROWS adds the current 8-float chunk of the eight x rows, broadcast
// to both halves, times the weight pair in Z8 to Z16-Z23, and advances the
// x pointers.
#define FMA_8ROWS \
	VBROADCASTF64X4 (SI), Z10; VBROADCASTF64X4 (SI)(R11*1), Z11; \
	VBROADCASTF64X4 (SI)(R11*2), Z12; VBROADCASTF64X4 (R12), Z13; \
	VFMADD231PS Z10, Z8, Z16; VFMADD231PS Z11, Z8, Z17; VFMADD231PS Z12, Z8, Z18; VFMADD231PS Z13, Z8, Z19; \
	VBROADCASTF64X4 (SI)(R11*4), Z10; VBROADCASTF64X4 (R12)(R11*2), Z11; \
	VBROADCASTF64X4 (R13), Z12; VBROADCASTF64X4 (R13)(R11*1), Z13; \
	VFMADD231PS Z10, Z8, Z20; VFMADD231PS Z11, Z8, Z21; VFMADD231PS Z12, Z8, Z22; VFMADD231PS Z13, Z8, Z23; \
	ADDQ $32, SI; ADDQ $32, R12; ADDQ $32, R13

// FMA_8ROWS_2W is FMA_8ROWS with a second weight pair in Z9 into Z24-Z31,
// each broadcast chunk serving both pairs.
#define FMA_8ROWS_2W \
	VBROADCASTF64X4 (SI), Z10; VBROADCASTF64X4 (SI)(R11*1), Z11; \
	VBROADCASTF64X4 (SI)(R11*2), Z12; VBROADCASTF64X4 (R12), Z13; \
	VFMADD231PS Z10, Z8, Z16; VFMADD231PS Z10, Z9, Z24; VFMADD231PS Z11, Z8, Z17; VFMADD231PS Z11, Z9, Z25; \
	VFMADD231PS Z12, Z8, Z18; VFMADD231PS Z12, Z9, Z26; VFMADD231PS Z13, Z8, Z19; VFMADD231PS Z13, Z9, Z27; \
	VBROADCASTF64X4 (SI)(R11*4), Z10; VBROADCASTF64X4 (R12)(R11*2), Z11; \
	VBROADCASTF64X4 (R13), Z12; VBROADCASTF64X4 (R13)(R11*1), Z13; \
	VFMADD231PS Z10, Z8, Z20; VFMADD231PS Z10, Z9, Z28; VFMADD231PS Z11, Z8, Z21; VFMADD231PS Z11, Z9, Z29; \
	VFMADD231PS Z12, Z8, Z22; VFMADD231PS Z12, Z9, Z30; VFMADD231PS Z13, Z8, Z23; VFMADD231PS Z13, Z9, Z31; \
	ADDQ $32, SI; ADDQ $32, R12; ADDQ $32, R13

// WIDEN_BF16_QUAD loads eight bf16 weights from each of the rows at DI,
// R8, R14 and R15 and widens them to float32: rows 0|1 into Z8, rows 2|3
// into Z9 (Y14 and Y15 are clobbered).
#define WIDEN_BF16_QUAD \
	VPMOVZXWD (DI), Y8; VPMOVZXWD (R8), Y14; VINSERTI64X4 $1, Y14, Z8, Z8; VPSLLD $16, Z8, Z8; \
	VPMOVZXWD (R14), Y9; VPMOVZXWD (R15), Y15; VINSERTI64X4 $1, Y15, Z9, Z9; VPSLLD $16, Z9, Z9

// BF16_QUAD_ARGS loads the quad tiles' weight and output arguments (w,
// wstride, k, out, ostride of the 7-argument bf16 tiles): weight rows 0-3
// at DI, R8, R14 and R15, the k counter in CX, R9 at the quad after this
// one (rows of k), prefetched into L1 as the loop goes, out at DX with the
// stride in bytes in R10.
#define BF16_QUAD_ARGS \
	MOVQ w+16(FP), DI; MOVQ wstride+24(FP), BX; SHLQ $1, BX; MOVQ k+32(FP), CX; \
	LEAQ (DI)(BX*1), R8; LEAQ (DI)(BX*2), R14; LEAQ (R8)(BX*2), R15; \
	MOVQ CX, R9; SHLQ $3, R9; ADDQ DI, R9; \
	MOVQ out+40(FP), DX; MOVQ ostride+48(FP), R10; SHLQ $2, R10

// NEXT_BF16_QUAD moves the quad's row pointers on by eight bf16 weights
// and the prefetch pointer by as many of the next quad's bytes.
#define NEXT_BF16_QUAD \
	ADDQ $16, DI; ADDQ $16, R8; ADDQ $16, R14; ADDQ $16, R15; ADDQ $64, R9

// REDUCE_4ROWS reduces and stores four x rows' accumulators (zmm a-d,
// weight row 0 in the low half and row 1 in the high half; ya-yd their
// low halves) to DX with stride R10: the halves go to Y0-Y7 in the order
// the 256-bit tiles keep them, and reduce2x4 adds and stores them as
// there. DX ends on the fourth row.
#define REDUCE_4ROWS(za, ya, zb, yb, zc, yc, zd, yd) \
	VMOVAPS ya, Y0; VEXTRACTF64X4 $1, za, Y1; VMOVAPS yb, Y2; VEXTRACTF64X4 $1, zb, Y3; \
	VMOVAPS yc, Y4; VEXTRACTF64X4 $1, zc, Y5; VMOVAPS yd, Y6; VEXTRACTF64X4 $1, zd, Y7; \
	CALL ·reduce2x4(SB)

// IR_ARGS loads the indexer's row tiles' common arguments: DI t, R14 k,
// R11 the key stride in bytes, R12 three strides, R15 qt, DX w, R10 and
// R8 hi.
#define IR_ARGS \
	MOVQ t+0(FP), DI; MOVQ k+8(FP), R14; \
	MOVQ kstride+16(FP), R11; SHLQ $2, R11; LEAQ (R11)(R11*2), R12; \
	MOVQ qt+24(FP), R15; MOVQ w+32(FP), DX; \
	MOVQ hi+40(FP), R10; MOVQ R10, R8

// IR_PASS starts a pass over the dimensions: R13 the chunk's query
// elements, R9 the dimensions, DI the next keys to prefetch, the
// accumulators cleared.
#define IR_PASS \
	MOVQ R15, R13; MOVQ di+48(FP), R9; MOVQ ahead+56(FP), DI; ZERO_Z0_15

// IR_PREFETCH prefetches a dimension step's line of the next keys.
#define IR_PREFETCH \
	PREFETCHT0 (DI); ADDQ step+64(FP), DI

// IR32_STORE stores the 32-head tiles' accumulators of 8 keys (key s's
// first chunk in Z(2s), its second in Z(2s+1)) to the scratch at CX: key
// s's first chunk at s·64 bytes, its second 1,024 bytes on.
#define IR32_STORE \
	VMOVUPS Z0, (CX); VMOVUPS Z1, 1024(CX); VMOVUPS Z2, 64(CX); VMOVUPS Z3, 1088(CX); \
	VMOVUPS Z4, 128(CX); VMOVUPS Z5, 1152(CX); VMOVUPS Z6, 192(CX); VMOVUPS Z7, 1216(CX); \
	VMOVUPS Z8, 256(CX); VMOVUPS Z9, 1280(CX); VMOVUPS Z10, 320(CX); VMOVUPS Z11, 1344(CX); \
	VMOVUPS Z12, 384(CX); VMOVUPS Z13, 1408(CX); VMOVUPS Z14, 448(CX); VMOVUPS Z15, 1472(CX)

// IR32_SUM adds to t the terms of the two chunks whose 16 keys' scratch
// is at BX (weights at DX, advanced past both), one chunk after the
// other, each through IR_EPILOGUE's head-ordered sum; clobbers CX.
#define IR32_SUM \
	MOVQ t+0(FP), DI; \
	IR32_LOAD(BX); IR_EPILOGUE; ADDQ $64, DX; \
	LEAQ 1024(BX), CX; IR32_LOAD(CX); IR_EPILOGUE; ADDQ $64, DX

// IRB_PASS and IRB_PREFETCH are IR_PASS and IR_PREFETCH for the bf16 row
// tile (R14 its pairs, two lines a pair step).
#define IRB_PASS \
	MOVQ R15, R13; MOVQ R14, R9; MOVQ ahead+64(FP), DI; ZERO_Z0_15
#define IRB_PREFETCH \
	PREFETCHT0 (DI); PREFETCHT0 64(DI); ADDQ step+72(FP), DI

// GEMM_TILE_ARGS loads the 512-bit tiles' common arguments: SI xp, DI w
// (weight row 0), R11 its stride in bytes, R12 weight row 3, CX kc, DX
// out, R13 the x stride and R14 the second panel's offset in bytes, R15
// the second panel's outputs, R8 the output stride in bytes.
#define GEMM_TILE_ARGS \
	MOVQ xp+0(FP), SI; MOVQ w+8(FP), DI; \
	MOVQ wstride+16(FP), R11; SHLQ $2, R11; \
	LEAQ (DI)(R11*2), R12; ADDQ R11, R12; \
	MOVQ kc+24(FP), CX; MOVQ out+32(FP), DX; \
	MOVQ xstride+48(FP), R13; SHLQ $2, R13; \
	MOVQ xoff+56(FP), R14; SHLQ $2, R14; \
	MOVQ ooff+64(FP), R15; SHLQ $2, R15; ADDQ DX, R15; \
	MOVQ ostride+72(FP), R8; SHLQ $2, R8

// func fmaLoopAVX512(n int)
// The 512-bit FMA peak probe: n iterations of 12 independent 16-wide FMAs,
// 384 flops each (fmaLoopAVX2's loop on zmm registers).
TEXT ·fmaLoopAVX512(SB), NOSPLIT, $0-8
	MOVQ n+0(FP), CX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13

zploop:
	VFMADD231PS Z12, Z13, Z0
	VFMADD231PS Z12, Z13, Z1
	VFMADD231PS Z12, Z13, Z2
	VFMADD231PS Z12, Z13, Z3
	VFMADD231PS Z12, Z13, Z4
	VFMADD231PS Z12, Z13, Z5
	VFMADD231PS Z12, Z13, Z6
	VFMADD231PS Z12, Z13, Z7
	VFMADD231PS Z12, Z13, Z8
	VFMADD231PS Z12, Z13, Z9
	VFMADD231PS Z12, Z13, Z10
	VFMADD231PS Z12, Z13, Z11
	DECQ CX
	JNZ  zploop
	VZEROUPPER
	RET

// func gemm32x6AVX512(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, xoff, ooff, ostride int, scale *float32)
// gemm16x6AVX2 on two x panels at once: out[r*ostride+i] (+)= sum_p
// w[r*wstride+p] * xp[p*xstride+i] and out[ooff+r*ostride+i] (+)= the same
// over xp[xoff+p*xstride+i], for six weight rows r and sixteen columns i of
// each panel (offsets and strides in floats). Each x vector is one zmm,
// each weight is broadcast once for both panels, and every output is the
// same FMA chain over p in order as in gemm16x6AVX2. With load 2 the
// chains start from out's row r multiplied by scale[r] (one rounded
// product, as Scale makes it).
TEXT ·gemm32x6AVX512(SB), NOSPLIT, $0-88
	GEMM_TILE_ARGS
	LEAQ (DX)(R8*2), R9
	ADDQ R8, R9              // output row 3
	LEAQ (R15)(R8*2), R10
	ADDQ R8, R10             // output row 3, second panel
	MOVQ load+40(FP), AX
	TESTQ AX, AX
	JZ   zzero
	VMOVUPS (DX), Z4
	VMOVUPS (R15), Z5
	VMOVUPS (DX)(R8*1), Z6
	VMOVUPS (R15)(R8*1), Z7
	VMOVUPS (DX)(R8*2), Z8
	VMOVUPS (R15)(R8*2), Z9
	VMOVUPS (R9), Z10
	VMOVUPS (R10), Z11
	VMOVUPS (R9)(R8*1), Z12
	VMOVUPS (R10)(R8*1), Z13
	VMOVUPS (R9)(R8*2), Z14
	VMOVUPS (R10)(R8*2), Z15
	CMPQ AX, $2
	JNE  zloop
	MOVQ scale+80(FP), BX
	VBROADCASTSS (BX), Z2
	VMULPS Z2, Z4, Z4
	VMULPS Z2, Z5, Z5
	VBROADCASTSS 4(BX), Z3
	VMULPS Z3, Z6, Z6
	VMULPS Z3, Z7, Z7
	VBROADCASTSS 8(BX), Z2
	VMULPS Z2, Z8, Z8
	VMULPS Z2, Z9, Z9
	VBROADCASTSS 12(BX), Z3
	VMULPS Z3, Z10, Z10
	VMULPS Z3, Z11, Z11
	VBROADCASTSS 16(BX), Z2
	VMULPS Z2, Z12, Z12
	VMULPS Z2, Z13, Z13
	VBROADCASTSS 20(BX), Z3
	VMULPS Z3, Z14, Z14
	VMULPS Z3, Z15, Z15
	JMP  zloop

zzero:
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15

zloop:
	TESTQ CX, CX
	JZ    zdone
	VMOVUPS (SI), Z0
	VMOVUPS (SI)(R14*1), Z1
	VBROADCASTSS (DI), Z2
	VFMADD231PS Z2, Z0, Z4
	VFMADD231PS Z2, Z1, Z5
	VBROADCASTSS (DI)(R11*1), Z3
	VFMADD231PS Z3, Z0, Z6
	VFMADD231PS Z3, Z1, Z7
	VBROADCASTSS (DI)(R11*2), Z2
	VFMADD231PS Z2, Z0, Z8
	VFMADD231PS Z2, Z1, Z9
	VBROADCASTSS (R12), Z3
	VFMADD231PS Z3, Z0, Z10
	VFMADD231PS Z3, Z1, Z11
	VBROADCASTSS (R12)(R11*1), Z2
	VFMADD231PS Z2, Z0, Z12
	VFMADD231PS Z2, Z1, Z13
	VBROADCASTSS (R12)(R11*2), Z3
	VFMADD231PS Z3, Z0, Z14
	VFMADD231PS Z3, Z1, Z15
	ADDQ R13, SI
	ADDQ $4, DI
	ADDQ $4, R12
	DECQ CX
	JMP  zloop

zdone:
	VMOVUPS Z4, (DX)
	VMOVUPS Z5, (R15)
	VMOVUPS Z6, (DX)(R8*1)
	VMOVUPS Z7, (R15)(R8*1)
	VMOVUPS Z8, (DX)(R8*2)
	VMOVUPS Z9, (R15)(R8*2)
	VMOVUPS Z10, (R9)
	VMOVUPS Z11, (R10)
	VMOVUPS Z12, (R9)(R8*1)
	VMOVUPS Z13, (R10)(R8*1)
	VMOVUPS Z14, (R9)(R8*2)
	VMOVUPS Z15, (R10)(R8*2)
	VZEROUPPER
	RET

// func gemm32x12AVX512(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, xoff, ooff, ostride int, scale *float32)
// gemm32x6AVX512 on twelve weight rows: 24 accumulators (Z8-Z31, row r's
// panels in Z(8+2r) and Z(9+2r)), so that each x vector loaded serves
// twelve FMAs and the FMA ports' latency is covered three times over.
// Every output is the same FMA chain as in gemm32x6AVX512. Weight rows
// 0-2 at DI, 3-5 at R12, 6-8 at BX, 9-11 at R9 (each +0, +R11, +2·R11).

// G12LOAD and G12STORE move one output row's two panels (DX and R15 at
// that row) and step both a row on; G12SCALE multiplies a row's two by its
// scale (AX the scales); G12FMA adds a weight row's element times both x
// vectors (Z0, Z1).
#define G12LOAD(a0, a1) VMOVUPS (DX), a0; VMOVUPS (R15), a1; ADDQ R8, DX; ADDQ R8, R15
#define G12SCALE(off, a0, a1) VBROADCASTSS off(AX), Z2; VMULPS Z2, a0, a0; VMULPS Z2, a1, a1
#define G12STORE(a0, a1) VMOVUPS a0, (DX); VMOVUPS a1, (R15); ADDQ R8, DX; ADDQ R8, R15
#define G12ZERO(a0, a1) VPXORD a0, a0, a0; VPXORD a1, a1, a1
#define G12FMA(row, b, a0, a1) VBROADCASTSS row, b; VFMADD231PS b, Z0, a0; VFMADD231PS b, Z1, a1

// The first eight rows' accumulators (Z8-Z23), which the twelve- and the
// eight-row tiles share: loaded, scaled, zeroed, stored, and the FMAs of
// one step (weight rows 0-2 at DI, 3-5 at R12, 6-7 at BX).
#define G8LOADS \
	G12LOAD(Z8, Z9); G12LOAD(Z10, Z11); G12LOAD(Z12, Z13); G12LOAD(Z14, Z15); \
	G12LOAD(Z16, Z17); G12LOAD(Z18, Z19); G12LOAD(Z20, Z21); G12LOAD(Z22, Z23)
#define G8SCALES \
	G12SCALE(0, Z8, Z9); G12SCALE(4, Z10, Z11); G12SCALE(8, Z12, Z13); G12SCALE(12, Z14, Z15); \
	G12SCALE(16, Z16, Z17); G12SCALE(20, Z18, Z19); G12SCALE(24, Z20, Z21); G12SCALE(28, Z22, Z23)
#define G8ZEROS \
	G12ZERO(Z8, Z9); G12ZERO(Z10, Z11); G12ZERO(Z12, Z13); G12ZERO(Z14, Z15); \
	G12ZERO(Z16, Z17); G12ZERO(Z18, Z19); G12ZERO(Z20, Z21); G12ZERO(Z22, Z23)
#define G8STORES \
	G12STORE(Z8, Z9); G12STORE(Z10, Z11); G12STORE(Z12, Z13); G12STORE(Z14, Z15); \
	G12STORE(Z16, Z17); G12STORE(Z18, Z19); G12STORE(Z20, Z21); G12STORE(Z22, Z23)
#define G8FMAS \
	G12FMA((DI), Z2, Z8, Z9); G12FMA((DI)(R11*1), Z3, Z10, Z11); G12FMA((DI)(R11*2), Z4, Z12, Z13); \
	G12FMA((R12), Z5, Z14, Z15); G12FMA((R12)(R11*1), Z6, Z16, Z17); G12FMA((R12)(R11*2), Z7, Z18, Z19); \
	G12FMA((BX), Z2, Z20, Z21); G12FMA((BX)(R11*1), Z3, Z22, Z23)

TEXT ·gemm32x12AVX512(SB), NOSPLIT, $0-88
	GEMM_TILE_ARGS
	LEAQ (R12)(R11*2), BX
	ADDQ R11, BX             // weight row 6
	LEAQ (BX)(R11*2), R9
	ADDQ R11, R9             // weight row 9
	MOVQ load+40(FP), AX
	TESTQ AX, AX
	JZ   g12zero
	MOVQ DX, R10
	G8LOADS
	G12LOAD(Z24, Z25)
	G12LOAD(Z26, Z27)
	G12LOAD(Z28, Z29)
	G12LOAD(Z30, Z31)
	MOVQ R10, DX
	MOVQ ooff+64(FP), R15
	SHLQ $2, R15
	ADDQ DX, R15
	CMPQ AX, $2
	JNE  g12loop
	MOVQ scale+80(FP), AX
	G8SCALES
	G12SCALE(32, Z24, Z25)
	G12SCALE(36, Z26, Z27)
	G12SCALE(40, Z28, Z29)
	G12SCALE(44, Z30, Z31)
	JMP  g12loop

g12zero:
	G8ZEROS
	G12ZERO(Z24, Z25)
	G12ZERO(Z26, Z27)
	G12ZERO(Z28, Z29)
	G12ZERO(Z30, Z31)

g12loop:
	TESTQ CX, CX
	JZ    g12done
	VMOVUPS (SI), Z0
	VMOVUPS (SI)(R14*1), Z1
	G8FMAS
	G12FMA((BX)(R11*2), Z4, Z24, Z25)
	G12FMA((R9), Z5, Z26, Z27)
	G12FMA((R9)(R11*1), Z6, Z28, Z29)
	G12FMA((R9)(R11*2), Z7, Z30, Z31)
	ADDQ R13, SI
	ADDQ $4, DI
	ADDQ $4, R12
	ADDQ $4, BX
	ADDQ $4, R9
	DECQ CX
	JMP  g12loop

g12done:
	G8STORES
	G12STORE(Z24, Z25)
	G12STORE(Z26, Z27)
	G12STORE(Z28, Z29)
	G12STORE(Z30, Z31)
	VZEROUPPER
	RET

// func gemm32x8AVX512(xp *float32, w *float32, wstride, kc int, out *float32, load, xstride, xoff, ooff, ostride int, scale *float32)
// gemm32x12AVX512 on eight weight rows (16 accumulators, Z8-Z23): a
// product whose rows leave eight after its twelve-row groups (KDA's
// chunk of 16 keys and queries against the state, 32 rows) runs them
// here instead of as a six-row group and a padded one. Every output is
// the same FMA chain as in gemm32x6AVX512. Weight rows 0-2 at DI, 3-5 at
// R12, 6-7 at BX (each +0, +R11, +2·R11).
TEXT ·gemm32x8AVX512(SB), NOSPLIT, $0-88
	GEMM_TILE_ARGS
	LEAQ (R12)(R11*2), BX
	ADDQ R11, BX             // weight row 6
	MOVQ load+40(FP), AX
	TESTQ AX, AX
	JZ   g8zero
	MOVQ DX, R10
	G8LOADS
	MOVQ R10, DX
	MOVQ ooff+64(FP), R15
	SHLQ $2, R15
	ADDQ DX, R15
	CMPQ AX, $2
	JNE  g8loop
	MOVQ scale+80(FP), AX
	G8SCALES
	JMP  g8loop

g8zero:
	G8ZEROS

g8loop:
	TESTQ CX, CX
	JZ    g8done
	VMOVUPS (SI), Z0
	VMOVUPS (SI)(R14*1), Z1
	G8FMAS
	ADDQ R13, SI
	ADDQ $4, DI
	ADDQ $4, R12
	ADDQ $4, BX
	DECQ CX
	JMP  g8loop

g8done:
	G8STORES
	VZEROUPPER
	RET

// func dot2x8BF16ZMM(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)
// dot2x8BF16AVX512 with both weight rows in one zmm register (lanes 0-7 row 0,
// 8-15 row 1) against each x chunk broadcast to both halves: every lane is
// the same FMA chain as in dot2x8BF16AVX512's 256-bit accumulators, and the halves
// are reduced by the same code, so the outputs are bit-identical to it
// with half the FMA instructions.
TEXT ·dot2x8BF16ZMM(SB), NOSPLIT, $0-56
	X_ROWS
	MOVQ w+16(FP), DI
	MOVQ wstride+24(FP), BX
	SHLQ $1, BX
	MOVQ k+32(FP), CX
	LEAQ (DI)(BX*1), R8      // weight row 1 (row 0 again when wstride is 0)
	MOVQ CX, R9
	SHLQ $3, R9
	ADDQ DI, R9              // the pair after next, prefetched into L1 (docs/bench, design measurements)
	MOVQ out+40(FP), DX
	MOVQ ostride+48(FP), R10
	SHLQ $2, R10
	ZERO_Z16_23

zb8loop:
	CMPQ CX, $8
	JL   zb8done
	PREFETCHT0 (R9)
	VPMOVZXWD (DI), Y8
	VPMOVZXWD (R8), Y9
	VINSERTI64X4 $1, Y9, Z8, Z8
	VPSLLD $16, Z8, Z8
	FMA_8ROWS
	ADDQ $16, DI
	ADDQ $16, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JMP  zb8loop

zb8done:
	CALL ·store2x8ZMM(SB)
	VZEROUPPER
	RET

// func dot2x8F32ZMM(x *float32, xstride int, w *float32, wstride, k int, out *float32, ostride int)
// dot2x8F32AVX512 with both weight rows in one zmm register (lanes 0-7 row 0,
// 8-15 row 1) against each x chunk broadcast to both halves: every lane is
// the same FMA chain as in dot2x8F32AVX512's 256-bit accumulators, and the halves
// are reduced by the same code, so the outputs are bit-identical to it
// with half the FMA instructions.
TEXT ·dot2x8F32ZMM(SB), NOSPLIT, $0-56
	X_ROWS
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
	ZERO_Z16_23

zf8loop:
	CMPQ CX, $8
	JL   zf8done
	PREFETCHT1 (R9)
	VMOVUPS (DI), Y8
	VINSERTF64X4 $1, (R8), Z8, Z8
	FMA_8ROWS
	ADDQ $32, DI
	ADDQ $32, R8
	ADDQ $32, R9
	SUBQ $8, CX
	JMP  zf8loop

zf8done:
	CALL ·store2x8ZMM(SB)
	VZEROUPPER
	RET

// store2x8ZMM reduces and stores the zmm 2x8 tiles' accumulators Z16-Z23
// (row q's lanes against weight row 0 in the low half, row 1 in the high
// half) to out (DX) with stride R10: the halves go to Y0-Y7 in the order
// dot2x8BF16AVX512 keeps its accumulators, and reduce2x4 adds and stores
// them as it does there (own register convention; not callable from Go).
TEXT ·store2x8ZMM(SB), NOSPLIT|NOFRAME, $0-0
	REDUCE_4ROWS(Z16, Y16, Z17, Y17, Z18, Y18, Z19, Y19)
	ADDQ R10, DX
	REDUCE_4ROWS(Z20, Y20, Z21, Y21, Z22, Y22, Z23, Y23)
	RET

// func dot4x8BF16ZMM(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)
// dot2x8BF16ZMM on four weight rows (w, w+wstride, ...): two zmm
// registers hold rows 0|1 and 2|3, so each broadcast x chunk serves two
// FMAs. The outputs are dot2x8BF16ZMM's for rows 0-1 and 2-3, bit for bit.
TEXT ·dot4x8BF16ZMM(SB), NOSPLIT, $0-56
	X_ROWS
	BF16_QUAD_ARGS
	ZERO_Z16_23
	VPXORD Z24, Z24, Z24; VPXORD Z25, Z25, Z25; VPXORD Z26, Z26, Z26; VPXORD Z27, Z27, Z27
	VPXORD Z28, Z28, Z28; VPXORD Z29, Z29, Z29; VPXORD Z30, Z30, Z30; VPXORD Z31, Z31, Z31

zq8loop:
	CMPQ CX, $8
	JL   zq8done
	PREFETCHT0 (R9)
	WIDEN_BF16_QUAD
	FMA_8ROWS_2W
	NEXT_BF16_QUAD
	SUBQ $8, CX
	JMP  zq8loop

zq8done:
	CALL ·store4x8ZMM(SB)
	VZEROUPPER
	RET

// func dot4x4BF16ZMM(x *float32, xstride int, w *uint16, wstride, k int, out *float32, ostride int)
// dot4x8BF16ZMM on four x rows: the remainder of a decode batch beside its
// groups of eight, each weight quad widened once for the four rows. The
// outputs are dot2x4BF16AVX2's (and so the 2x8 tiles') for rows 0-1 and
// 2-3, bit for bit: each lane keeps its FMA chain, and reduce2x4 adds the
// lanes as there.
TEXT ·dot4x4BF16ZMM(SB), NOSPLIT, $0-56
	MOVQ x+0(FP), SI
	MOVQ xstride+8(FP), R11
	SHLQ $2, R11
	LEAQ (SI)(R11*2), R12
	ADDQ R11, R12            // x row 3
	BF16_QUAD_ARGS
	VPXORD Z16, Z16, Z16; VPXORD Z17, Z17, Z17; VPXORD Z18, Z18, Z18; VPXORD Z19, Z19, Z19
	VPXORD Z24, Z24, Z24; VPXORD Z25, Z25, Z25; VPXORD Z26, Z26, Z26; VPXORD Z27, Z27, Z27

zq4loop:
	CMPQ CX, $8
	JL   zq4done
	PREFETCHT0 (R9)
	WIDEN_BF16_QUAD
	VBROADCASTF64X4 (SI), Z10
	VBROADCASTF64X4 (SI)(R11*1), Z11
	VBROADCASTF64X4 (SI)(R11*2), Z12
	VBROADCASTF64X4 (R12), Z13
	VFMADD231PS Z10, Z8, Z16
	VFMADD231PS Z10, Z9, Z24
	VFMADD231PS Z11, Z8, Z17
	VFMADD231PS Z11, Z9, Z25
	VFMADD231PS Z12, Z8, Z18
	VFMADD231PS Z12, Z9, Z26
	VFMADD231PS Z13, Z8, Z19
	VFMADD231PS Z13, Z9, Z27
	ADDQ $32, SI
	ADDQ $32, R12
	NEXT_BF16_QUAD
	SUBQ $8, CX
	JMP  zq4loop

zq4done:
	MOVQ DX, R14
	REDUCE_4ROWS(Z16, Y16, Z17, Y17, Z18, Y18, Z19, Y19)
	LEAQ 8(R14), DX
	REDUCE_4ROWS(Z24, Y24, Z25, Y25, Z26, Y26, Z27, Y27)
	VZEROUPPER
	RET

// func dot4x8F32ZMM(x *float32, xstride int, w *float32, wstride, k int, out *float32, ostride int)
// dot4x8BF16ZMM for float32 weights: the outputs are dot2x8F32ZMM's for
// rows 0-1 and 2-3, bit for bit.
TEXT ·dot4x8F32ZMM(SB), NOSPLIT, $0-56
	X_ROWS
	MOVQ w+16(FP), DI
	MOVQ wstride+24(FP), BX
	SHLQ $2, BX
	MOVQ k+32(FP), CX
	LEAQ (DI)(BX*1), R8      // weight row 1
	LEAQ (DI)(BX*2), R14     // weight row 2
	LEAQ (R8)(BX*2), R15     // weight row 3
	MOVQ CX, R9
	SHLQ $4, R9
	ADDQ DI, R9              // the quad after this one (rows of k), prefetched
	MOVQ out+40(FP), DX
	MOVQ ostride+48(FP), R10
	SHLQ $2, R10
	ZERO_Z16_23
	VPXORD Z24, Z24, Z24; VPXORD Z25, Z25, Z25; VPXORD Z26, Z26, Z26; VPXORD Z27, Z27, Z27
	VPXORD Z28, Z28, Z28; VPXORD Z29, Z29, Z29; VPXORD Z30, Z30, Z30; VPXORD Z31, Z31, Z31

zqf8loop:
	CMPQ CX, $8
	JL   zqf8done
	PREFETCHT1 (R9)
	PREFETCHT1 64(R9)
	VMOVUPS (DI), Y8
	VINSERTF64X4 $1, (R8), Z8, Z8
	VMOVUPS (R14), Y9
	VINSERTF64X4 $1, (R15), Z9, Z9
	FMA_8ROWS_2W
	ADDQ $32, DI
	ADDQ $32, R8
	ADDQ $32, R14
	ADDQ $32, R15
	ADDQ $128, R9
	SUBQ $8, CX
	JMP  zqf8loop

zqf8done:
	CALL ·store4x8ZMM(SB)
	VZEROUPPER
	RET

// store4x8ZMM is store2x8ZMM for the four-row tiles: weight rows 0 and 1
// from Z16-Z23 to out, then rows 2 and 3 from Z24-Z31 to out+2 floats
// (own register convention; not callable from Go).
TEXT ·store4x8ZMM(SB), NOSPLIT|NOFRAME, $0-0
	MOVQ DX, R14
	CALL ·store2x8ZMM(SB)
	VMOVAPS Z24, Z16
	VMOVAPS Z25, Z17
	VMOVAPS Z26, Z18
	VMOVAPS Z27, Z19
	VMOVAPS Z28, Z20
	VMOVAPS Z29, Z21
	VMOVAPS Z30, Z22
	VMOVAPS Z31, Z23
	LEAQ 8(R14), DX
	CALL ·store2x8ZMM(SB)
	RET

// IB_EPILOGUE adds w·max(acc, 0), the product rounded before the sum, for
// the head whose weight DX points at, to the 64 scores at DI, from the
// accumulators a0-a3 (Z15 holds zeros; Z14 is clobbered).
#define IB_EPILOGUE(a0, a1, a2, a3) \
	VBROADCASTSS (DX), Z14; \
	VMAXPS a0, Z15, a0; VMAXPS a1, Z15, a1; VMAXPS a2, Z15, a2; VMAXPS a3, Z15, a3; \
	VMULPS Z14, a0, a0; VMULPS Z14, a1, a1; VMULPS Z14, a2, a2; VMULPS Z14, a3, a3; \
	VADDPS (DI), a0, a0; VADDPS 64(DI), a1, a1; VADDPS 128(DI), a2, a2; VADDPS 192(DI), a3, a3; \
	VMOVUPS a0, (DI); VMOVUPS a1, 64(DI); VMOVUPS a2, 128(DI); VMOVUPS a3, 192(DI)

// IB_ZERO4 clears a head's four accumulators; IB_KEYS loads one dimension
// of the 64 transposed keys at BX into Z10-Z13; IB_FMA4 adds them times
// the head's broadcast query element b to its accumulators.
#define IB_ZERO4(a0, a1, a2, a3) \
	VPXORD a0, a0, a0; VPXORD a1, a1, a1; VPXORD a2, a2, a2; VPXORD a3, a3, a3
#define IB_KEYS \
	VMOVUPS (BX), Z10; VMOVUPS 64(BX), Z11; VMOVUPS 128(BX), Z12; VMOVUPS 192(BX), Z13
#define IB_FMA4(b, a0, a1, a2, a3) \
	VFMADD231PS Z10, b, a0; VFMADD231PS Z11, b, a1; VFMADD231PS Z12, b, a2; VFMADD231PS Z13, b, a3

// func indexerBlockZMM(t, kt, q, w *float32, hi, di int)
// indexerBlockAVX2 on zmm registers, four heads at a time so that
// sixteen FMA chains are in flight (two, then one, for the last heads):
// each key's score gets the same FMA chain and the same head-ordered sum,
// so the bits are the AVX2 tile's.
TEXT ·indexerBlockZMM(SB), NOSPLIT, $0-48
	MOVQ t+0(FP), DI
	MOVQ q+16(FP), SI
	MOVQ w+24(FP), DX
	MOVQ hi+32(FP), R8
	MOVQ di+40(FP), R9
	LEAQ (SI)(R9*4), R10 // the second head's q
	VPXORD Z15, Z15, Z15
	VMOVUPS Z15, (DI)
	VMOVUPS Z15, 64(DI)
	VMOVUPS Z15, 128(DI)
	VMOVUPS Z15, 192(DI)

izquad:
	CMPQ R8, $4
	JL   izpair
	MOVQ kt+8(FP), BX
	MOVQ R9, CX
	LEAQ (R10)(R9*4), R11 // the third head's q
	LEAQ (R11)(R9*4), R12 // the fourth's
	IB_ZERO4(Z16, Z17, Z18, Z19)
	IB_ZERO4(Z20, Z21, Z22, Z23)
	IB_ZERO4(Z24, Z25, Z26, Z27)
	IB_ZERO4(Z28, Z29, Z30, Z31)

izqdim:
	IB_KEYS
	VBROADCASTSS (SI), Z8
	VBROADCASTSS (R10), Z9
	VBROADCASTSS (R11), Z4
	VBROADCASTSS (R12), Z5
	IB_FMA4(Z8, Z16, Z17, Z18, Z19)
	IB_FMA4(Z9, Z20, Z21, Z22, Z23)
	IB_FMA4(Z4, Z24, Z25, Z26, Z27)
	IB_FMA4(Z5, Z28, Z29, Z30, Z31)
	ADDQ $4, SI
	ADDQ $4, R10
	ADDQ $4, R11
	ADDQ $4, R12
	ADDQ $256, BX
	DECQ CX
	JNZ  izqdim

	IB_EPILOGUE(Z16, Z17, Z18, Z19)
	ADDQ $4, DX
	IB_EPILOGUE(Z20, Z21, Z22, Z23)
	ADDQ $4, DX
	IB_EPILOGUE(Z24, Z25, Z26, Z27)
	ADDQ $4, DX
	IB_EPILOGUE(Z28, Z29, Z30, Z31)
	ADDQ $4, DX
	MOVQ R12, SI // past the fourth head's q: the next group's first
	LEAQ (SI)(R9*4), R10
	SUBQ $4, R8
	JMP  izquad

izpair:
	CMPQ R8, $2
	JL   izone
	MOVQ kt+8(FP), BX
	MOVQ R9, CX
	IB_ZERO4(Z0, Z1, Z2, Z3)
	IB_ZERO4(Z4, Z5, Z6, Z7)

izpdim:
	IB_KEYS
	VBROADCASTSS (SI), Z8
	VBROADCASTSS (R10), Z9
	IB_FMA4(Z8, Z0, Z1, Z2, Z3)
	IB_FMA4(Z9, Z4, Z5, Z6, Z7)
	ADDQ $4, SI
	ADDQ $4, R10
	ADDQ $256, BX
	DECQ CX
	JNZ  izpdim

	IB_EPILOGUE(Z0, Z1, Z2, Z3)
	ADDQ $4, DX
	IB_EPILOGUE(Z4, Z5, Z6, Z7)
	ADDQ $4, DX
	MOVQ R10, SI // past the second head's q: the next pair's first
	LEAQ (SI)(R9*4), R10
	SUBQ $2, R8
	JMP  izpair

izone:
	CMPQ R8, $1
	JL   izdone
	MOVQ kt+8(FP), BX
	MOVQ R9, CX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3

izodim:
	VBROADCASTSS (SI), Z8
	VFMADD231PS (BX), Z8, Z0
	VFMADD231PS 64(BX), Z8, Z1
	VFMADD231PS 128(BX), Z8, Z2
	VFMADD231PS 192(BX), Z8, Z3
	ADDQ $4, SI
	ADDQ $256, BX
	DECQ CX
	JNZ  izodim
	IB_EPILOGUE(Z0, Z1, Z2, Z3)

izdone:
	VZEROUPPER
	RET

// The vector exponential on zmm registers: expBody's arithmetic (the same
// operations in the same order, no FMA), sixteen lanes at a time with the
// constants held in registers. EXP_CONSTS loads them from the table at R8
// (its layout is expBody's): Z16 low, Z17 high, Z18 log2e, Z19 ln2hi,
// Z20 ln2lo, Z21-Z28 c7..c0, Z29 +Inf, Z30 2 (SiTU's tanh reads it).
#define EXP_CONSTS \
	VBROADCASTSS 0(R8), Z16; VBROADCASTSS 4(R8), Z17; VBROADCASTSS 8(R8), Z18; \
	VBROADCASTSS 12(R8), Z19; VBROADCASTSS 16(R8), Z20; VBROADCASTSS 20(R8), Z21; \
	VBROADCASTSS 24(R8), Z22; VBROADCASTSS 28(R8), Z23; VBROADCASTSS 32(R8), Z24; \
	VBROADCASTSS 36(R8), Z25; VBROADCASTSS 40(R8), Z26; VBROADCASTSS 44(R8), Z27; \
	VBROADCASTSS 48(R8), Z28; VBROADCASTSS 52(R8), Z29; VBROADCASTSS 56(R8), Z30

// EXP_Z0 replaces Z0 by Exp(Z0) lane-wise; clobbers Z1-Z4, Z7, Z8 and
// K1-K3. The last step, p·2^n, is one VSCALEFPS: Exp's two forms of
// 2^n (2·p·2^127 where n = 128, whose power is not a float32) multiply
// by a power of two, and on [-87.3, 88.72] every result is a normal
// float32, so the product and the scaling are both exact.
#define EXP_Z0 \
	VCMPPS $0x11, Z16, Z0, K1; \
	VCMPPS $0x1e, Z17, Z0, K2; \
	VCMPPS $0x03, Z0, Z0, K3; \
	VMOVAPS Z0, Z7; \
	VMAXPS Z16, Z0, Z0; VMINPS Z17, Z0, Z0; \
	VMULPS Z18, Z0, Z1; \
	VRNDSCALEPS $0, Z1, Z1; \
	VMULPS Z1, Z19, Z2; VSUBPS Z2, Z0, Z3; \
	VMULPS Z1, Z20, Z2; VSUBPS Z2, Z3, Z3; \
	VMULPS Z3, Z21, Z4; \
	VADDPS Z22, Z4, Z4; VMULPS Z3, Z4, Z4; \
	VADDPS Z23, Z4, Z4; VMULPS Z3, Z4, Z4; \
	VADDPS Z24, Z4, Z4; VMULPS Z3, Z4, Z4; \
	VADDPS Z25, Z4, Z4; VMULPS Z3, Z4, Z4; \
	VADDPS Z26, Z4, Z4; VMULPS Z3, Z4, Z4; \
	VADDPS Z27, Z4, Z4; VMULPS Z3, Z4, Z4; \
	VADDPS Z28, Z4, Z4; \
	VSCALEFPS Z1, Z4, Z0; \
	VPXORD Z8, Z8, Z8; \
	VMOVAPS Z8, K1, Z0; \
	VMOVAPS Z29, K2, Z0; \
	VMOVAPS Z7, K3, Z0

// SIGMOID_Z13 sets Z0 to the logistic function of Z13 lane-wise, as
// 1/(1+e) for x >= 0 and e/(1+e) below, e = Exp(-|x|); Z14 must hold
// zeros. Clobbers Z1-Z8, K1-K5.
#define SIGMOID_Z13 \
	VCMPPS $0x0d, Z14, Z13, K5; \
	VSUBPS Z13, Z14, Z0; \
	VMINPS Z13, Z0, Z0; \
	EXP_Z0; \
	VADDPS Z28, Z0, Z2; \
	VMOVAPS Z0, Z3; \
	VMOVAPS Z28, K5, Z3; \
	VDIVPS Z2, Z3, Z0

// func expZMM(x *float32, n int, k *[16]float32)
// expAVX2 sixteen lanes at a time (n % 16 == 0): the same bits.
TEXT ·expZMM(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ k+16(FP), R8
	EXP_CONSTS

ezloop:
	CMPQ CX, $16
	JL   ezdone
	VMOVUPS (DI), Z0
	EXP_Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  ezloop

ezdone:
	VZEROUPPER
	RET

// func expScaleZMM(d1, d2, x1, x2, a *float32, as int, b *float32, bs, rows, n int, k *[16]float32)
// ExpScale sixteen lanes at a time (n % 16 == 0): for each of rows rows,
// e = Exp(a - b) with expZMM's constants k (b nil: Exp(a)), d1 = x1·e and,
// where d2 is not nil, d2 = x2·e. a's and b's rows are as and bs floats
// apart (0: one row for all); the others' n. The subtraction, the
// exponential and the products are subAVX2's, expZMM's and mulAVX2's, so
// the bits are theirs.
TEXT ·expScaleZMM(SB), NOSPLIT, $0-88
	MOVQ k+80(FP), R8
	EXP_CONSTS
	MOVQ d1+0(FP), DI
	MOVQ d2+8(FP), SI
	MOVQ x1+16(FP), R8
	MOVQ x2+24(FP), R9
	MOVQ a+32(FP), R10
	MOVQ as+40(FP), R11
	SHLQ $2, R11
	MOVQ b+48(FP), R12
	MOVQ bs+56(FP), R13
	SHLQ $2, R13
	MOVQ rows+64(FP), CX
	MOVQ n+72(FP), DX
	SHLQ $2, DX

esrow:
	TESTQ CX, CX
	JZ    esdone
	XORQ BX, BX

escol:
	CMPQ BX, DX
	JGE  esnext
	VMOVUPS (R10)(BX*1), Z0
	TESTQ R12, R12
	JZ    esexp
	VSUBPS (R12)(BX*1), Z0, Z0

esexp:
	EXP_Z0
	VMULPS (R8)(BX*1), Z0, Z9
	VMOVUPS Z9, (DI)(BX*1)
	TESTQ SI, SI
	JZ    esstep
	VMULPS (R9)(BX*1), Z0, Z10
	VMOVUPS Z10, (SI)(BX*1)

esstep:
	ADDQ $64, BX
	JMP  escol

esnext:
	ADDQ DX, DI
	ADDQ DX, R8
	ADDQ DX, R9
	ADDQ R11, R10
	ADDQ R13, R12
	TESTQ SI, SI
	JZ    esrowend
	ADDQ DX, SI

esrowend:
	DECQ CX
	JMP  esrow

esdone:
	VZEROUPPER
	RET

// func sigmoidZMM(x *float32, n int, k *[16]float32)
// sigmoidAVX2 sixteen lanes at a time (n % 16 == 0): the same bits.
TEXT ·sigmoidZMM(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), DI
	MOVQ n+8(FP), CX
	MOVQ k+16(FP), R8
	EXP_CONSTS

gzloop:
	CMPQ CX, $16
	JL   gzdone
	VMOVUPS (DI), Z13
	VPXORD Z14, Z14, Z14
	SIGMOID_Z13
	VMOVUPS Z0, (DI)
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  gzloop

gzdone:
	VZEROUPPER
	RET

// func sigmoidMulZMM(dst, gate, up *float32, n int, k *[16]float32)
// dst = sigmoid(gate)·up sixteen lanes at a time (n % 16 == 0):
// sigmoidZMM's sigmoid kept in registers, then mulAVX2's product (one
// rounding, and a product's bits do not depend on its operands' order),
// so the bits are those of SigmoidSlice, then Mul. dst may be up.
TEXT ·sigmoidMulZMM(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), R9
	MOVQ n+24(FP), CX
	MOVQ k+32(FP), R8
	EXP_CONSTS
	VPXORD Z14, Z14, Z14
	XORQ AX, AX

smloop:
	CMPQ AX, CX
	JGE  smdone
	VMOVUPS (SI)(AX*4), Z13
	SIGMOID_Z13
	VMULPS (R9)(AX*4), Z0, Z0
	VMOVUPS Z0, (DI)(AX*4)
	ADDQ $16, AX
	JMP  smloop

smdone:
	VZEROUPPER
	RET

// func mulScaleZMM(dst, x, w *float32, s float32, n int)
// dst = (x·w)·s, each product rounded (Mul, then Scale), or x·s where w
// is nil, for n % 16 == 0, 32 floats a round while they last.
TEXT ·mulScaleZMM(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	VBROADCASTSS s+24(FP), Z4
	MOVQ n+32(FP), CX
	TESTQ DX, DX
	JZ    msnow

msloop32:
	CMPQ CX, $32
	JL   msloop16
	VMOVUPS (SI), Z0
	VMOVUPS 64(SI), Z1
	VMULPS (DX), Z0, Z0
	VMULPS 64(DX), Z1, Z1
	VMULPS Z4, Z0, Z0
	VMULPS Z4, Z1, Z1
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  msloop32

msloop16:
	CMPQ CX, $16
	JL   msdone
	VMOVUPS (SI), Z0
	VMULPS (DX), Z0, Z0
	VMULPS Z4, Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  msloop16

msnow:
	CMPQ CX, $32
	JL   msnow16
	VMULPS (SI), Z4, Z0
	VMULPS 64(SI), Z4, Z1
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $32, CX
	JMP  msnow

msnow16:
	CMPQ CX, $16
	JL   msdone
	VMULPS (SI), Z4, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JMP  msnow16

msdone:
	VZEROUPPER
	RET

// TANH_Z10 sets Z6 to tanhExp(Z10, Z0) lane-wise (Z0 = exp(2|x|)), with
// tanhBody's operations in its order: 1 - 2/(e2+1) negated for x < 0, the
// Taylor polynomial below |x| 0.3. The polynomial's coefficients and 0.3
// come from situ's constants at DX; 1 and 2 from EXP_CONSTS (Z28, Z30);
// Z14 holds zeros and Z15 the sign bit. Clobbers Z5, Z7, Z8, K6, K7.
#define TANH_Z10 \
	VADDPS Z28, Z0, Z5; \
	VDIVPS Z5, Z30, Z6; \
	VSUBPS Z6, Z28, Z6; \
	VCMPPS $1, Z14, Z10, K6; \
	VXORPS Z15, Z6, K6, Z6; \
	VMULPS Z10, Z10, Z7; \
	VMULPS.BCST 20(DX), Z7, Z8; \
	VADDPS.BCST 24(DX), Z8, Z8; \
	VMULPS Z8, Z7, Z8; \
	VADDPS.BCST 28(DX), Z8, Z8; \
	VMULPS Z8, Z7, Z8; \
	VADDPS.BCST 32(DX), Z8, Z8; \
	VMULPS Z8, Z7, Z8; \
	VADDPS Z8, Z28, Z8; \
	VMULPS Z8, Z10, Z8; \
	VANDNPS Z10, Z15, Z7; \
	VCMPPS.BCST $1, 8(DX), Z7, K7; \
	VMOVAPS Z8, K7, Z6

// TWICE_ABS_Z10 sets Z0 = 2·|Z10| (|x| + |x|, exact), as
// twiceAbsQuotient doubles its quotient.
#define TWICE_ABS_Z10 \
	VANDNPS Z10, Z15, Z0; \
	VADDPS Z0, Z0, Z0

// func situZMM(dst, gate, up *float32, n int, k, c *[16]float32)
// SiTU sixteen lanes at a time (n % 16 == 0) in one pass: sigmoidZMM's
// sigmoid of the gate, the quotients by beta and linBeta and their
// doubled magnitudes as twiceAbsQuotientAVX2 forms them, expZMM's
// exponentials and situAVX2's last step, so the bits are those of SiTU's
// passes through its buffers. k is expConsts, c situConsts' table.
TEXT ·situZMM(SB), NOSPLIT, $0-48
	MOVQ k+32(FP), R8
	EXP_CONSTS
	MOVQ dst+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), R9
	MOVQ n+24(FP), CX
	MOVQ c+40(FP), DX
	MOVL 4(DX), BX           // linBeta's bits: 0 leaves u as it is
	VPXORD Z14, Z14, Z14
	VPTERNLOGD $0xff, Z15, Z15, Z15
	VPSLLD $31, Z15, Z15     // the sign bit
	XORQ AX, AX

suloop:
	CMPQ AX, CX
	JGE  sudone
	VMOVUPS (SI)(AX*4), Z13
	SIGMOID_Z13
	VMOVAPS Z0, Z9           // sigmoid(g)
	VDIVPS.BCST 0(DX), Z13, Z10 // x = g/beta
	TWICE_ABS_Z10
	EXP_Z0
	TANH_Z10
	VMULPS.BCST 0(DX), Z6, Z12 // beta·tanh
	VMULPS Z9, Z12, Z12        // ·sigmoid(g)
	VMOVUPS (R9)(AX*4), Z11    // w = u
	TESTL BX, BX
	JZ    sunolin
	VDIVPS.BCST 4(DX), Z11, Z10 // x = u/linBeta
	TWICE_ABS_Z10
	EXP_Z0
	TANH_Z10
	VMULPS.BCST 4(DX), Z6, Z11 // linBeta·tanh

sunolin:
	VMULPS Z11, Z12, Z12
	VMOVUPS Z12, (DI)(AX*4)
	ADDQ $16, AX
	JMP  suloop

sudone:
	VZEROUPPER
	RET

// func convSiLU4ZMM(out, x, w *float32, stride, rows, cols int, k *[16]float32)
//
// KDA's short conv of width four with SiLU, cols channels (a multiple of
// 16) of rows output rows, row by row: out row r = SiLU(((0 + w0·x_r) +
// w1·x_{r+1}) + w2·x_{r+2}) + w3·x_{r+3}), rows and taps stride floats
// apart. Each product is rounded before its sum and every operation has
// the operand order of MulAdd's (mulAddAVX2), sigmoidZMM's and Mul's
// (mulAVX2), so the bits are those of clearing a row, four MulAdds and
// SiLUInPlace. Each block prefetches its columns of the x row five rows
// on: the rows lie a whole row of q|k|v apart (9 KB at 2,304 channels),
// a stride the hardware prefetchers did not follow in a prefill, where x
// comes from the projection just written by both cores (docs/bench).
TEXT ·convSiLU4ZMM(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ stride+24(FP), R9
	SHLQ $2, R9
	MOVQ rows+32(FP), CX
	MOVQ cols+40(FP), BX
	SHLQ $2, BX
	MOVQ k+48(FP), R8
	EXP_CONSTS
	LEAQ (R9)(R9*2), R11
	VPXORD Z14, Z14, Z14

cvrow:
	TESTQ CX, CX
	JZ    cvdone
	XORQ R12, R12

cvblock:
	CMPQ R12, BX
	JGE  cvnext
	LEAQ (DX)(R12*1), R13
	LEAQ (SI)(R12*1), R10
	PREFETCHT0 (R10)(R9*8)
	VMOVUPS (R13), Z9
	VMULPS (R10), Z9, Z15
	VADDPS Z14, Z15, Z13
	VMOVUPS (R13)(R9*1), Z10
	VMULPS (R10)(R9*1), Z10, Z15
	VADDPS Z13, Z15, Z13
	VMOVUPS (R13)(R9*2), Z11
	VMULPS (R10)(R9*2), Z11, Z15
	VADDPS Z13, Z15, Z13
	VMOVUPS (R13)(R11*1), Z12
	VMULPS (R10)(R11*1), Z12, Z15
	VADDPS Z13, Z15, Z13
	SIGMOID_Z13                  // sigmoid(x)
	VMULPS Z0, Z13, Z0           // x · sigmoid(x)
	VMOVUPS Z0, (DI)(R12*1)
	ADDQ $64, R12
	JMP  cvblock

cvnext:
	ADDQ R9, SI
	ADDQ R9, DI
	DECQ CX
	JMP  cvrow

cvdone:
	VZEROUPPER
	RET

// func replayRowsZMM(row, a, k, u *float32, n, stride, ustride, vecs int)
// replayRowsAVX2 on zmm registers, vecs (8 or 1) of sixteen floats: for
// record i, row = row ⊙ a_i + u_i·k_i, a product then one FMA per element,
// so the same bits. Eight registers give the record chain's latency eight
// independent vectors to hide behind.
TEXT ·replayRowsZMM(SB), NOSPLIT, $0-64
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
	CMPQ R10, $8
	JNE  zrone
	VMOVUPS (DI), Z0
	VMOVUPS 64(DI), Z1
	VMOVUPS 128(DI), Z2
	VMOVUPS 192(DI), Z3
	VMOVUPS 256(DI), Z4
	VMOVUPS 320(DI), Z5
	VMOVUPS 384(DI), Z6
	VMOVUPS 448(DI), Z7

zreight:
	TESTQ CX, CX
	JZ    zreightdone
	VBROADCASTSS (R8), Z15
	VMULPS (SI), Z0, Z0
	VMULPS 64(SI), Z1, Z1
	VMULPS 128(SI), Z2, Z2
	VMULPS 192(SI), Z3, Z3
	VMULPS 256(SI), Z4, Z4
	VMULPS 320(SI), Z5, Z5
	VMULPS 384(SI), Z6, Z6
	VMULPS 448(SI), Z7, Z7
	VFMADD231PS (DX), Z15, Z0
	VFMADD231PS 64(DX), Z15, Z1
	VFMADD231PS 128(DX), Z15, Z2
	VFMADD231PS 192(DX), Z15, Z3
	VFMADD231PS 256(DX), Z15, Z4
	VFMADD231PS 320(DX), Z15, Z5
	VFMADD231PS 384(DX), Z15, Z6
	VFMADD231PS 448(DX), Z15, Z7
	ADDQ R9, SI
	ADDQ R9, DX
	ADDQ R11, R8
	DECQ CX
	JMP  zreight

zreightdone:
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	VMOVUPS Z4, 256(DI)
	VMOVUPS Z5, 320(DI)
	VMOVUPS Z6, 384(DI)
	VMOVUPS Z7, 448(DI)
	VZEROUPPER
	RET

zrone:
	VMOVUPS (DI), Z0

zroneloop:
	TESTQ CX, CX
	JZ    zronedone
	VBROADCASTSS (R8), Z15
	VMULPS (SI), Z0, Z0
	VFMADD231PS (DX), Z15, Z0
	ADDQ R9, SI
	ADDQ R9, DX
	ADDQ R11, R8
	DECQ CX
	JMP  zroneloop

zronedone:
	VMOVUPS Z0, (DI)
	VZEROUPPER
	RET

// func kdaRowsZMM(st, ke, e, k, q, v, o, u *float32, beta float32, dk, dv int)
// kdaRowsAVX2 on zmm registers for dk a multiple of 32: each zmm holds two
// of its ymm accumulators side by side (elements 0-15 of a 32-block in Z0,
// 16-31 in Z2; 0-15 of a 16-block in the update's Z0), every lane keeps
// its FMA chain, and the halves are added in kdaRowsAVX2's order, so the
// bits are the same with half the vector instructions.
TEXT ·kdaRowsZMM(SB), NOSPLIT, $0-88
	KDA_ROWS_ARGS

zkrow:
	TESTQ DX, DX
	JZ    zkend
	// s = row·ke: Z0 = [Y0 | Y1], Z2 = [Y2 | Y3] of dotAVX2
	XORQ AX, AX
	MOVQ BX, CX
	VPXORD Z0, Z0, Z0
	VPXORD Z2, Z2, Z2

zkdot32:
	CMPQ CX, $32
	JL   zkdotdone
	VMOVUPS (DI)(AX*1), Z4
	VMOVUPS 64(DI)(AX*1), Z6
	VFMADD231PS (R8)(AX*1), Z4, Z0
	VFMADD231PS 64(R8)(AX*1), Z6, Z2
	ADDQ $128, AX
	SUBQ $32, CX
	JMP  zkdot32

zkdotdone:
	VEXTRACTF64X4 $1, Z0, Y1
	VEXTRACTF64X4 $1, Z2, Y3
	// u = beta·(v[r] - s)
	KDA_U
	VBROADCASTSS X5, Z15
	// row = row ⊙ e + u·k, o[r] = row·q: Z0 = [Y0 | Y1] of rowUpdateDotAVX2
	XORQ AX, AX
	MOVQ BX, CX
	VPXORD Z0, Z0, Z0

zkupd16:
	CMPQ CX, $16
	JL   zkupddone
	VMOVUPS (DI)(AX*1), Z2
	VMULPS (R9)(AX*1), Z2, Z2
	VFMADD231PS (R10)(AX*1), Z15, Z2
	VMOVUPS Z2, (DI)(AX*1)
	VFMADD231PS (R11)(AX*1), Z2, Z0
	ADDQ $64, AX
	SUBQ $16, CX
	JMP  zkupd16

zkupddone:
	VEXTRACTF64X4 $1, Z0, Y1
	KDA_O_NEXT
	JMP  zkrow

zkend:
	VZEROUPPER
	RET

// IR_FMA4 adds q·k for four keys at base (0, one, two and three strides
// on), the key element broadcast into the FMA, to accumulators a0-a3.
// ZERO_Z0_15 clears the accumulators Z0-Z15.
#define ZERO_Z0_15 \
	VPXORD Z0, Z0, Z0; VPXORD Z1, Z1, Z1; VPXORD Z2, Z2, Z2; VPXORD Z3, Z3, Z3; \
	VPXORD Z4, Z4, Z4; VPXORD Z5, Z5, Z5; VPXORD Z6, Z6, Z6; VPXORD Z7, Z7, Z7; \
	VPXORD Z8, Z8, Z8; VPXORD Z9, Z9, Z9; VPXORD Z10, Z10, Z10; VPXORD Z11, Z11, Z11; \
	VPXORD Z12, Z12, Z12; VPXORD Z13, Z13, Z13; VPXORD Z14, Z14, Z14; VPXORD Z15, Z15, Z15

#define IR_FMA4(base, a0, a1, a2, a3) \
	VFMADD231PS.BCST (base), Z16, a0; \
	VFMADD231PS.BCST (base)(R11*1), Z16, a1; \
	VFMADD231PS.BCST (base)(R11*2), Z16, a2; \
	VFMADD231PS.BCST (base)(R12*1), Z16, a3

// IR_HEAD adds to Z31 the transposed tile's row for one head: lane L of
// c (selected by imm from the two halves x and y).
#define IR_HEAD(imm, x, y) \
	VSHUFF32X4 imm, y, x, Z30; \
	VADDPS Z30, Z31, Z31

// IR_EPILOGUE adds to t (DI) the terms w·max(acc, 0) of the 16 keys'
// accumulators Z0-Z15 (heads of the chunk in the lanes, w's 16 at DX),
// each rounded: a 16x16 transpose (pairs of keys interleaved, then four
// keys' head j of each 128-bit lane, then lanes gathered: head 4L+j is
// lane L of every quarter) lets each key add its heads one after another.
// It uses Z16-Z31.
#define IR_EPILOGUE \
	VPXORD Z16, Z16, Z16; \
	VMOVUPS (DX), Z17; \
	VMAXPS Z0, Z16, Z0; \
	VMAXPS Z1, Z16, Z1; \
	VMAXPS Z2, Z16, Z2; \
	VMAXPS Z3, Z16, Z3; \
	VMAXPS Z4, Z16, Z4; \
	VMAXPS Z5, Z16, Z5; \
	VMAXPS Z6, Z16, Z6; \
	VMAXPS Z7, Z16, Z7; \
	VMAXPS Z8, Z16, Z8; \
	VMAXPS Z9, Z16, Z9; \
	VMAXPS Z10, Z16, Z10; \
	VMAXPS Z11, Z16, Z11; \
	VMAXPS Z12, Z16, Z12; \
	VMAXPS Z13, Z16, Z13; \
	VMAXPS Z14, Z16, Z14; \
	VMAXPS Z15, Z16, Z15; \
	VMULPS Z17, Z0, Z0; \
	VMULPS Z17, Z1, Z1; \
	VMULPS Z17, Z2, Z2; \
	VMULPS Z17, Z3, Z3; \
	VMULPS Z17, Z4, Z4; \
	VMULPS Z17, Z5, Z5; \
	VMULPS Z17, Z6, Z6; \
	VMULPS Z17, Z7, Z7; \
	VMULPS Z17, Z8, Z8; \
	VMULPS Z17, Z9, Z9; \
	VMULPS Z17, Z10, Z10; \
	VMULPS Z17, Z11, Z11; \
	VMULPS Z17, Z12, Z12; \
	VMULPS Z17, Z13, Z13; \
	VMULPS Z17, Z14, Z14; \
	VMULPS Z17, Z15, Z15; \
	VUNPCKLPS Z1, Z0, Z16; \
	VUNPCKHPS Z1, Z0, Z17; \
	VUNPCKLPS Z3, Z2, Z18; \
	VUNPCKHPS Z3, Z2, Z19; \
	VUNPCKLPS Z5, Z4, Z20; \
	VUNPCKHPS Z5, Z4, Z21; \
	VUNPCKLPS Z7, Z6, Z22; \
	VUNPCKHPS Z7, Z6, Z23; \
	VUNPCKLPS Z9, Z8, Z24; \
	VUNPCKHPS Z9, Z8, Z25; \
	VUNPCKLPS Z11, Z10, Z26; \
	VUNPCKHPS Z11, Z10, Z27; \
	VUNPCKLPS Z13, Z12, Z28; \
	VUNPCKHPS Z13, Z12, Z29; \
	VUNPCKLPS Z15, Z14, Z30; \
	VUNPCKHPS Z15, Z14, Z31; \
	VSHUFPS $0x44, Z18, Z16, Z0; \
	VSHUFPS $0xEE, Z18, Z16, Z1; \
	VSHUFPS $0x44, Z19, Z17, Z2; \
	VSHUFPS $0xEE, Z19, Z17, Z3; \
	VSHUFPS $0x44, Z22, Z20, Z4; \
	VSHUFPS $0xEE, Z22, Z20, Z5; \
	VSHUFPS $0x44, Z23, Z21, Z6; \
	VSHUFPS $0xEE, Z23, Z21, Z7; \
	VSHUFPS $0x44, Z26, Z24, Z8; \
	VSHUFPS $0xEE, Z26, Z24, Z9; \
	VSHUFPS $0x44, Z27, Z25, Z10; \
	VSHUFPS $0xEE, Z27, Z25, Z11; \
	VSHUFPS $0x44, Z30, Z28, Z12; \
	VSHUFPS $0xEE, Z30, Z28, Z13; \
	VSHUFPS $0x44, Z31, Z29, Z14; \
	VSHUFPS $0xEE, Z31, Z29, Z15; \
	VSHUFF32X4 $0x88, Z4, Z0, Z16; \
	VSHUFF32X4 $0x88, Z5, Z1, Z17; \
	VSHUFF32X4 $0x88, Z6, Z2, Z18; \
	VSHUFF32X4 $0x88, Z7, Z3, Z19; \
	VSHUFF32X4 $0xDD, Z4, Z0, Z20; \
	VSHUFF32X4 $0xDD, Z5, Z1, Z21; \
	VSHUFF32X4 $0xDD, Z6, Z2, Z22; \
	VSHUFF32X4 $0xDD, Z7, Z3, Z23; \
	VSHUFF32X4 $0x88, Z12, Z8, Z24; \
	VSHUFF32X4 $0x88, Z13, Z9, Z25; \
	VSHUFF32X4 $0x88, Z14, Z10, Z26; \
	VSHUFF32X4 $0x88, Z15, Z11, Z27; \
	VSHUFF32X4 $0xDD, Z12, Z8, Z28; \
	VSHUFF32X4 $0xDD, Z13, Z9, Z29; \
	VSHUFF32X4 $0xDD, Z14, Z10, Z0; \
	VSHUFF32X4 $0xDD, Z15, Z11, Z1; \
	VMOVUPS (DI), Z31; \
	IR_HEAD($0x88, Z16, Z24); \
	IR_HEAD($0x88, Z17, Z25); \
	IR_HEAD($0x88, Z18, Z26); \
	IR_HEAD($0x88, Z19, Z27); \
	IR_HEAD($0x88, Z20, Z28); \
	IR_HEAD($0x88, Z21, Z29); \
	IR_HEAD($0x88, Z22, Z0); \
	IR_HEAD($0x88, Z23, Z1); \
	IR_HEAD($0xDD, Z16, Z24); \
	IR_HEAD($0xDD, Z17, Z25); \
	IR_HEAD($0xDD, Z18, Z26); \
	IR_HEAD($0xDD, Z19, Z27); \
	IR_HEAD($0xDD, Z20, Z28); \
	IR_HEAD($0xDD, Z21, Z29); \
	IR_HEAD($0xDD, Z22, Z0); \
	IR_HEAD($0xDD, Z23, Z1); \
	VMOVUPS Z31, (DI)

// func indexerRowsZMM(t, k *float32, kstride int, qt, w *float32, hi, di int, ahead *float32, step int)
// The Lightning Indexer's scores of 16 keys in their stored layout (key s
// at k + s·kstride floats) for one query row given transposed (qt[d·hi+h]),
// hi a multiple of 16: per 16 heads, the 16 keys' dot products as 16
// accumulators with heads in the lanes, each an FMA chain over the
// dimensions in order; then w·max(acc, 0), rounded, and a 16x16 transpose
// so that t[s] += the heads' terms one head after another, as
// indexerBlockZMM sums them: a key's score has that tile's bits. Each
// dimension's step prefetches one line of the next keys (ahead, step
// bytes apart), which come from memory while these are scored.
TEXT ·indexerRowsZMM(SB), NOSPLIT, $0-72
	IR_ARGS
	SHRQ $4, R8               // head chunks of 16
	SHLQ $2, R10              // one dimension's row of qt in bytes
	VPXORD Z31, Z31, Z31
	VMOVUPS Z31, (DI)

irchunk:
	MOVQ R14, SI
	LEAQ (SI)(R11*4), AX      // key 4
	LEAQ (AX)(R11*4), BX      // key 8
	LEAQ (BX)(R11*4), CX      // key 12
	IR_PASS

irdim:
	IR_PREFETCH
	VMOVUPS (R13), Z16
	IR_FMA4(SI, Z0, Z1, Z2, Z3)
	IR_FMA4(AX, Z4, Z5, Z6, Z7)
	IR_FMA4(BX, Z8, Z9, Z10, Z11)
	IR_FMA4(CX, Z12, Z13, Z14, Z15)
	ADDQ $4, SI
	ADDQ $4, AX
	ADDQ $4, BX
	ADDQ $4, CX
	ADDQ R10, R13
	DECQ R9
	JNZ  irdim

	// w·max(acc, 0), operands as in IB_EPILOGUE.
	MOVQ t+0(FP), DI
	IR_EPILOGUE

	ADDQ $64, DX
	ADDQ $64, R15
	DECQ R8
	JNZ  irchunk
	VZEROUPPER
	RET

// AL_KEY broadcasts dimension d of the key at addr into tmp and adds its
// products with the 32 heads' queries (Z16, Z17) to a0 and a1.
#define AL_KEY(addr, tmp, a0, a1) \
	VBROADCASTSS addr, tmp; \
	VFMADD231PS Z16, tmp, a0; \
	VFMADD231PS Z17, tmp, a1

// KEYS8_BY32 runs one dimension of 8 keys (SI: keys 0-3, AX: keys 4-7,
// R11 the key stride, R12 three strides) against 32 heads' queries (Z16,
// Z17): key s's accumulators are Z(2s) and Z(2s+1); Z18-Z25 hold the
// broadcasts.
#define KEYS8_BY32 \
	AL_KEY((SI), Z18, Z0, Z1); \
	AL_KEY((SI)(R11*1), Z19, Z2, Z3); \
	AL_KEY((SI)(R11*2), Z20, Z4, Z5); \
	AL_KEY((SI)(R12*1), Z21, Z6, Z7); \
	AL_KEY((AX), Z22, Z8, Z9); \
	AL_KEY((AX)(R11*1), Z23, Z10, Z11); \
	AL_KEY((AX)(R11*2), Z24, Z12, Z13); \
	AL_KEY((AX)(R12*1), Z25, Z14, Z15)

// STEP8_BY32 is one dimension's step of KEYS8_BY32: the 32 heads' query
// elements loaded from R13, then the keys' and the queries' pointers
// advanced (R10 bytes a query row).
#define STEP8_BY32 \
	VMOVUPS (R13), Z16; VMOVUPS 64(R13), Z17; \
	KEYS8_BY32; \
	ADDQ $4, SI; ADDQ $4, AX; ADDQ R10, R13

// IR32_LOAD loads the accumulators of the 16 keys of one chunk (heads in
// the lanes) from the scratch at base into Z0-Z15.
#define IR32_LOAD(base) \
	VMOVUPS 0(base), Z0; VMOVUPS 64(base), Z1; VMOVUPS 128(base), Z2; VMOVUPS 192(base), Z3; \
	VMOVUPS 256(base), Z4; VMOVUPS 320(base), Z5; VMOVUPS 384(base), Z6; VMOVUPS 448(base), Z7; \
	VMOVUPS 512(base), Z8; VMOVUPS 576(base), Z9; VMOVUPS 640(base), Z10; VMOVUPS 704(base), Z11; \
	VMOVUPS 768(base), Z12; VMOVUPS 832(base), Z13; VMOVUPS 896(base), Z14; VMOVUPS 960(base), Z15

// func indexerRows32ZMM(t, k *float32, kstride int, qt, w *float32, hi, di int, ahead *float32, step int, acc *float32)
// indexerRowsZMM for hi a multiple of 32: per pair of 16-head chunks, the
// keys in two halves of 8, each key's element broadcast once against both
// chunks' query elements (two loads and eight broadcasts for 16 FMAs,
// where the 16-key loop makes 17 loads); each accumulator is the same FMA
// chain over the dimensions in order. The halves' accumulators are stored
// in acc ([2 chunks][16 keys][16 heads]) and reloaded, one chunk at a
// time, for IR_EPILOGUE, which adds the chunk's heads in order as
// indexerRowsZMM does: a key's score has that tile's bits.
TEXT ·indexerRows32ZMM(SB), NOSPLIT, $0-80
	IR_ARGS
	SHRQ $5, R8               // pairs of head chunks
	SHLQ $2, R10              // one dimension's row of qt in bytes
	MOVQ acc+72(FP), BX
	VPXORD Z31, Z31, Z31
	VMOVUPS Z31, (DI)

ir32pair:
	MOVQ BX, CX               // the first half's scratch rows
	MOVQ R14, SI

ir32half:
	LEAQ (SI)(R11*4), AX      // key 4 of the half
	IR_PASS

ir32dim:
	IR_PREFETCH
	STEP8_BY32
	DECQ R9
	JNZ  ir32dim

	// Key s of the half: its first chunk's heads at s·64 from CX, its
	// second chunk's 1,024 bytes on.
	IR32_STORE
	CMPQ CX, BX
	JNE  ir32sum
	LEAQ 512(BX), CX          // the second half: keys 8-15
	LEAQ (R14)(R11*8), SI
	JMP  ir32half

ir32sum:
	// w·max(acc, 0) of each chunk in turn, its heads in order.
	IR32_SUM
	ADDQ $128, R15
	DECQ R8
	JNZ  ir32pair
	VZEROUPPER
	RET

// IRB_DP4 adds to the accumulators a0-a3 (register numbers) the pair
// products of the 16 heads' query pair (Z16) with the current pair of the
// four rounded keys at base, base+R11, base+2·R11 and base+R12.
#define IRB_DP4(base, a0, a1, a2, a3) \
	VPBROADCASTD (base), Z17; DPBF(16, 17, a0); \
	VPBROADCASTD (base)(R11*1), Z18; DPBF(16, 18, a1); \
	VPBROADCASTD (base)(R11*2), Z19; DPBF(16, 19, a2); \
	VPBROADCASTD (base)(R12*1), Z20; DPBF(16, 20, a3)

// ALB_KEY broadcasts the current pair of the rounded key at addr into tz
// (register number tn) and adds its pair products with the 32 heads'
// query pairs (Z16, Z17) to a0 and a1 (register numbers).
#define ALB_KEY(addr, tz, tn, a0, a1) \
	VPBROADCASTD addr, tz; \
	DPBF(16, tn, a0); \
	DPBF(17, tn, a1)

// STEP8_BY32_BF16 is STEP8_BY32 over rounded keys' pairs: one pair step
// of 8 keys (SI, AX) against 32 heads' query pairs loaded from R13.
#define STEP8_BY32_BF16 \
	VMOVDQU32 (R13), Z16; VMOVDQU32 64(R13), Z17; \
	ALB_KEY((SI), Z18, 18, 0, 1); \
	ALB_KEY((SI)(R11*1), Z19, 19, 2, 3); \
	ALB_KEY((SI)(R11*2), Z20, 20, 4, 5); \
	ALB_KEY((SI)(R12*1), Z21, 21, 6, 7); \
	ALB_KEY((AX), Z22, 22, 8, 9); \
	ALB_KEY((AX)(R11*1), Z23, 23, 10, 11); \
	ALB_KEY((AX)(R11*2), Z24, 24, 12, 13); \
	ALB_KEY((AX)(R12*1), Z25, 25, 14, 15); \
	ADDQ $4, SI; ADDQ $4, AX; ADDQ R10, R13

// func indexerRowsBF16ZMM(t, k *float32, kstride int, kb *uint16, qp *uint32, w *float32, hi, di int, ahead *float32, step int, acc *float32)
// indexerRowsZMM in bf16: the 16 keys (key s at k + s·kstride floats)
// are first rounded into kb ([16][di] bf16; di a multiple of 16) by
// VCVTNEPS2BF16; then per 16 heads (hi a multiple of 16), 16 accumulators
// with the heads in the lanes, each one VDPBF16PS chain over the
// dimensions' pairs in order (qp[p·hi+h] is head h's pair p), and
// indexerRowsZMM's epilogue. Each pair's step prefetches two lines of the
// next keys (ahead, step bytes apart): a burst of prefetches while the
// keys are rounded stalled on the misses in flight. With acc (hi a
// multiple of 32) the heads go 32 at a time against 8 keys, as
// indexerRows32ZMM takes them, through acc's scratch: the same bits.
TEXT ·indexerRowsBF16ZMM(SB), NOSPLIT, $0-88
	MOVQ k+8(FP), SI
	MOVQ kstride+16(FP), R11
	SHLQ $2, R11              // a key's stride in bytes
	MOVQ kb+24(FP), DI
	MOVQ di+56(FP), R9
	MOVQ $16, CX

irbkey:
	XORQ AX, AX
	MOVQ DI, BX
	MOVQ R9, R10
	SHRQ $4, R10

irbconv:
	VMOVUPS (SI)(AX*1), Z0
	BYTE $0x62; BYTE $0xF2; BYTE $0x7E; BYTE $0x48; BYTE $0x72; BYTE $0xC8 // VCVTNEPS2BF16 Z0, Y1
	VMOVDQU Y1, (BX)
	ADDQ $64, AX
	ADDQ $32, BX
	DECQ R10
	JNZ  irbconv
	ADDQ R11, SI
	LEAQ (DI)(R9*2), DI
	DECQ CX
	JNZ  irbkey

	MOVQ t+0(FP), DI
	VPXORD Z31, Z31, Z31
	VMOVUPS Z31, (DI)
	MOVQ qp+32(FP), R15
	MOVQ w+40(FP), DX
	MOVQ hi+48(FP), R10
	MOVQ R10, R8
	SHRQ $4, R8               // head chunks of 16
	SHLQ $2, R10              // a pair's row of qp in bytes
	MOVQ R9, R11
	SHLQ $1, R11              // a rounded key in bytes
	LEAQ (R11)(R11*2), R12
	MOVQ R9, R14
	SHRQ $1, R14              // pairs
	MOVQ acc+80(FP), BX
	TESTQ BX, BX
	JNZ  irb32

irbchunk:
	MOVQ kb+24(FP), SI
	LEAQ (SI)(R11*4), AX      // key 4
	LEAQ (AX)(R11*4), BX      // key 8
	LEAQ (BX)(R11*4), CX      // key 12
	IRB_PASS

irbpair:
	IRB_PREFETCH
	VMOVDQU32 (R13), Z16
	IRB_DP4(SI, 0, 1, 2, 3)
	IRB_DP4(AX, 4, 5, 6, 7)
	IRB_DP4(BX, 8, 9, 10, 11)
	IRB_DP4(CX, 12, 13, 14, 15)
	ADDQ $4, SI
	ADDQ $4, AX
	ADDQ $4, BX
	ADDQ $4, CX
	ADDQ R10, R13
	DECQ R9
	JNZ  irbpair

	MOVQ t+0(FP), DI
	IR_EPILOGUE
	ADDQ $64, DX
	ADDQ $64, R15
	DECQ R8
	JNZ  irbchunk
	VZEROUPPER
	RET

irb32:
	SHRQ $1, R8               // pairs of head chunks

irb32pair:
	MOVQ BX, CX               // the first half's scratch rows
	MOVQ kb+24(FP), SI

irb32half:
	LEAQ (SI)(R11*4), AX      // key 4 of the half
	IRB_PASS

irb32dim:
	IRB_PREFETCH
	STEP8_BY32_BF16
	DECQ R9
	JNZ  irb32dim

	IR32_STORE
	CMPQ CX, BX
	JNE  irb32sum
	LEAQ 512(BX), CX          // the second half: keys 8-15
	MOVQ kb+24(FP), SI
	LEAQ (SI)(R11*8), SI
	JMP  irb32half

irb32sum:
	IR32_SUM
	ADDQ $128, R15
	DECQ R8
	JNZ  irb32pair
	VZEROUPPER
	RET

// IBB_TERM adds one head's terms w·max(acc, 0) (acc a0-a3, the block's
// 64 keys; w at addr), each rounded, to the scores Z24-Z27 (Z28 zero).
#define IBB_TERM(addr, a0, a1, a2, a3) \
	VBROADCASTSS addr, Z29; \
	VMAXPS a0, Z28, a0; VMAXPS a1, Z28, a1; VMAXPS a2, Z28, a2; VMAXPS a3, Z28, a3; \
	VMULPS Z29, a0, a0; VMULPS Z29, a1, a1; VMULPS Z29, a2, a2; VMULPS Z29, a3, a3; \
	VADDPS a0, Z24, Z24; VADDPS a1, Z25, Z25; VADDPS a2, Z26, Z26; VADDPS a3, Z27, Z27

// IBB_DP4 adds to a0-a3 (register numbers) the pair products of the
// block's current pair row (Z16-Z19) with the head pair broadcast in bz.
#define IBB_DP4(bz, a0, a1, a2, a3) \
	DPBF(16, bz, a0); DPBF(17, bz, a1); DPBF(18, bz, a2); DPBF(19, bz, a3)

// IBB_PAIRS loads the block's current pair row (64 keys' pairs at BX)
// into Z16-Z19.
#define IBB_PAIRS \
	VMOVDQU32 (BX), Z16; VMOVDQU32 64(BX), Z17; VMOVDQU32 128(BX), Z18; VMOVDQU32 192(BX), Z19

// func indexerBlockBF16ZMM(t *float32, kt *uint32, qb *uint16, w *float32, hi, di int)
// The bf16 scores of a block of 64 keys given as pairs transposed
// (kt[p·64+s]: key s's dimensions 2p and 2p+1) for one query row (qb, its
// hi heads of di bf16, di even): per head, 4 accumulators (16 keys each)
// that are each one VDPBF16PS chain over the pairs in order, four heads at
// a time, then the heads' terms added to the scores one head after
// another: each key's score has indexerRowsBF16ZMM's bits.
TEXT ·indexerBlockBF16ZMM(SB), NOSPLIT, $0-48
	MOVQ qb+16(FP), SI
	MOVQ w+24(FP), DX
	MOVQ hi+32(FP), R8
	MOVQ di+40(FP), R11
	MOVQ R11, R14
	SHRQ $1, R14              // pairs
	SHLQ $1, R11              // a head's bytes in qb
	LEAQ (R11)(R11*2), R12
	VPXORD Z24, Z24, Z24
	VPXORD Z25, Z25, Z25
	VPXORD Z26, Z26, Z26
	VPXORD Z27, Z27, Z27
	VPXORD Z28, Z28, Z28
	CMPQ R8, $4
	JLT  ibbone

ibbfour:
	MOVQ kt+8(FP), BX
	MOVQ SI, AX
	MOVQ R14, R9
	ZERO_Z0_15

ibbpair4:
	IBB_PAIRS
	VPBROADCASTD (AX), Z20
	IBB_DP4(20, 0, 1, 2, 3)
	VPBROADCASTD (AX)(R11*1), Z21
	IBB_DP4(21, 4, 5, 6, 7)
	VPBROADCASTD (AX)(R11*2), Z22
	IBB_DP4(22, 8, 9, 10, 11)
	VPBROADCASTD (AX)(R12*1), Z23
	IBB_DP4(23, 12, 13, 14, 15)
	ADDQ $256, BX
	ADDQ $4, AX
	DECQ R9
	JNZ  ibbpair4

	IBB_TERM((DX), Z0, Z1, Z2, Z3)
	IBB_TERM(4(DX), Z4, Z5, Z6, Z7)
	IBB_TERM(8(DX), Z8, Z9, Z10, Z11)
	IBB_TERM(12(DX), Z12, Z13, Z14, Z15)
	LEAQ (SI)(R11*4), SI
	ADDQ $16, DX
	SUBQ $4, R8
	CMPQ R8, $4
	JGE  ibbfour

ibbone:
	TESTQ R8, R8
	JZ    ibbdone
	MOVQ  kt+8(FP), BX
	MOVQ  SI, AX
	MOVQ  R14, R9
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3

ibbpair1:
	IBB_PAIRS
	VPBROADCASTD (AX), Z20
	IBB_DP4(20, 0, 1, 2, 3)
	ADDQ $256, BX
	ADDQ $4, AX
	DECQ R9
	JNZ  ibbpair1

	IBB_TERM((DX), Z0, Z1, Z2, Z3)
	ADDQ R11, SI
	ADDQ $4, DX
	DECQ R8
	JMP  ibbone

ibbdone:
	MOVQ t+0(FP), DI
	VMOVUPS Z24, (DI)
	VMOVUPS Z25, 64(DI)
	VMOVUPS Z26, 128(DI)
	VMOVUPS Z27, 192(DI)
	VZEROUPPER
	RET

// AL_LOAD16 and AL_STORE16 move the logits tiles' 16 accumulators
// Z0-Z15 from and to zt (DX).
#define AL_LOAD16 \
	VMOVUPS (DX), Z0; \
	VMOVUPS 64(DX), Z1; \
	VMOVUPS 128(DX), Z2; \
	VMOVUPS 192(DX), Z3; \
	VMOVUPS 256(DX), Z4; \
	VMOVUPS 320(DX), Z5; \
	VMOVUPS 384(DX), Z6; \
	VMOVUPS 448(DX), Z7; \
	VMOVUPS 512(DX), Z8; \
	VMOVUPS 576(DX), Z9; \
	VMOVUPS 640(DX), Z10; \
	VMOVUPS 704(DX), Z11; \
	VMOVUPS 768(DX), Z12; \
	VMOVUPS 832(DX), Z13; \
	VMOVUPS 896(DX), Z14; \
	VMOVUPS 960(DX), Z15

#define AL_STORE16 \
	VMOVUPS Z0, (DX); \
	VMOVUPS Z1, 64(DX); \
	VMOVUPS Z2, 128(DX); \
	VMOVUPS Z3, 192(DX); \
	VMOVUPS Z4, 256(DX); \
	VMOVUPS Z5, 320(DX); \
	VMOVUPS Z6, 384(DX); \
	VMOVUPS Z7, 448(DX); \
	VMOVUPS Z8, 512(DX); \
	VMOVUPS Z9, 576(DX); \
	VMOVUPS Z10, 640(DX); \
	VMOVUPS Z11, 704(DX); \
	VMOVUPS Z12, 768(DX); \
	VMOVUPS Z13, 832(DX); \
	VMOVUPS Z14, 896(DX); \
	VMOVUPS Z15, 960(DX)


// func attnLogitsZMM(zt, k *float32, kstride int, qt *float32, hg, d, acc int)
// Attention logits of 8 keys (key s at k + s·kstride floats, d dims) for
// hg query heads (a multiple of 32) given transposed (qt[i·hg+h]): per 32
// heads, 16 accumulators (8 keys, heads in the lanes), each an FMA chain
// over the dimensions in order, from zero or (acc) from zt. zt holds,
// per 32 heads, the 8 keys' 32 logits: zt[(c·8+s)·32+h].
TEXT ·attnLogitsZMM(SB), NOSPLIT, $0-56
	MOVQ zt+0(FP), DX
	MOVQ k+8(FP), R14
	MOVQ kstride+16(FP), R11
	SHLQ $2, R11
	LEAQ (R11)(R11*2), R12
	MOVQ qt+24(FP), R15
	MOVQ hg+32(FP), R10
	MOVQ R10, R8
	SHRQ $5, R8
	SHLQ $2, R10
	MOVQ acc+48(FP), BX

alchunk:
	MOVQ R14, SI
	LEAQ (SI)(R11*4), AX
	MOVQ R15, R13
	MOVQ d+40(FP), R9
	CMPQ BX, $0
	JNE  alload
	ZERO_Z0_15
	JMP  aldim

alload:
	AL_LOAD16

aldim:
	STEP8_BY32
	DECQ R9
	JNZ  aldim

	AL_STORE16
	ADDQ $1024, DX
	ADDQ $128, R15
	DECQ R8
	JNZ  alchunk
	VZEROUPPER
	RET


// func attnLogitsBF16ZMM(zt *float32, k *uint16, kstride int, qp *uint32, hg, d, acc int)
// attnLogitsZMM in bf16: 8 keys rounded to bf16 (key s at k + s·kstride
// elements, d even) against hg query heads (a multiple of 32) given as
// pairs transposed (qp[p·hg+h]), each logit one VDPBF16PS chain over the
// pairs in order, from zero or (acc) from zt, laid out as attnLogitsZMM's.
TEXT ·attnLogitsBF16ZMM(SB), NOSPLIT, $0-56
	MOVQ zt+0(FP), DX
	MOVQ k+8(FP), R14
	MOVQ kstride+16(FP), R11
	SHLQ $1, R11
	LEAQ (R11)(R11*2), R12
	MOVQ qp+24(FP), R15
	MOVQ hg+32(FP), R10
	MOVQ R10, R8
	SHRQ $5, R8
	SHLQ $2, R10
	MOVQ acc+48(FP), BX

albchunk:
	MOVQ R14, SI
	LEAQ (SI)(R11*4), AX
	MOVQ R15, R13
	MOVQ d+40(FP), R9
	SHRQ $1, R9
	CMPQ BX, $0
	JNE  albload
	ZERO_Z0_15
	JMP  albpair

albload:
	AL_LOAD16

albpair:
	STEP8_BY32_BF16
	DECQ R9
	JNZ  albpair

	AL_STORE16
	ADDQ $1024, DX
	ADDQ $128, R15
	DECQ R8
	JNZ  albchunk
	VZEROUPPER
	RET

// MAP_ROW broadcasts row r's current pair of a (at addr) into tz
// (register number tn) and adds its pair products with the 32 columns'
// pairs of b (Z12, Z13) to row r's accumulators a0 and a1.
#define MAP_ROW(addr, tz, tn, a0, a1) \
	VPBROADCASTD addr, tz; \
	DPBF(12, tn, a0); \
	DPBF(13, tn, a1)

// func matAccPairs6x32ZMM(c *float32, ldc int, a *uint16, lda int, b *uint32, ldb, kp int)
// Six rows of c by 32 columns (rows ldc floats apart) accumulate a·b over
// kp pairs: a's rows in bf16 (lda elements apart), b's rows of pairs
// ldb dwords apart. Each output continues from its value with one
// VDPBF16PS chain over the pairs in order.
TEXT ·matAccPairs6x32ZMM(SB), NOSPLIT, $0-56
	MOVQ c+0(FP), DI
	MOVQ ldc+8(FP), R10
	SHLQ $2, R10
	LEAQ (R10)(R10*2), R11
	LEAQ (DI)(R10*4), BX
	MOVQ a+16(FP), SI
	MOVQ lda+24(FP), R8
	SHLQ $1, R8
	LEAQ (R8)(R8*2), R9
	LEAQ (SI)(R8*4), AX
	MOVQ b+32(FP), DX
	MOVQ ldb+40(FP), R12
	SHLQ $2, R12
	MOVQ kp+48(FP), CX
	VMOVUPS (DI), Z0
	VMOVUPS 64(DI), Z1
	VMOVUPS (DI)(R10*1), Z2
	VMOVUPS 64(DI)(R10*1), Z3
	VMOVUPS (DI)(R10*2), Z4
	VMOVUPS 64(DI)(R10*2), Z5
	VMOVUPS (DI)(R11*1), Z6
	VMOVUPS 64(DI)(R11*1), Z7
	VMOVUPS (BX), Z8
	VMOVUPS 64(BX), Z9
	VMOVUPS (BX)(R10*1), Z10
	VMOVUPS 64(BX)(R10*1), Z11
	TESTQ CX, CX
	JZ    mapstore

maploop:
	VMOVDQU32 (DX), Z12
	VMOVDQU32 64(DX), Z13
	MAP_ROW((SI), Z14, 14, 0, 1)
	MAP_ROW((SI)(R8*1), Z15, 15, 2, 3)
	MAP_ROW((SI)(R8*2), Z16, 16, 4, 5)
	MAP_ROW((SI)(R9*1), Z17, 17, 6, 7)
	MAP_ROW((AX), Z18, 18, 8, 9)
	MAP_ROW((AX)(R8*1), Z19, 19, 10, 11)
	ADDQ $4, SI
	ADDQ $4, AX
	ADDQ R12, DX
	DECQ CX
	JNZ  maploop

mapstore:
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, (DI)(R10*1)
	VMOVUPS Z3, 64(DI)(R10*1)
	VMOVUPS Z4, (DI)(R10*2)
	VMOVUPS Z5, 64(DI)(R10*2)
	VMOVUPS Z6, (DI)(R11*1)
	VMOVUPS Z7, 64(DI)(R11*1)
	VMOVUPS Z8, (BX)
	VMOVUPS Z9, 64(BX)
	VMOVUPS Z10, (BX)(R10*1)
	VMOVUPS Z11, 64(BX)(R10*1)
	VZEROUPPER
	RET

// func pairRowsBF16ZMM(dst *uint32, lo, hi *float32, n int)
// dst[x] = bf16(lo[x]) | bf16(hi[x])<<16 for n (a multiple of 16)
// columns, rounded by VCVTNEPS2BF16 (bytes: VCVTNEPS2BF16 Z0, Y1 and
// Z2, Y3, checked against GNU as).
TEXT ·pairRowsBF16ZMM(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ lo+8(FP), SI
	MOVQ hi+16(FP), DX
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	JZ   prdone

prloop:
	VMOVUPS (SI), Z0
	VMOVUPS (DX), Z2
	BYTE $0x62; BYTE $0xF2; BYTE $0x7E; BYTE $0x48; BYTE $0x72; BYTE $0xC8 // VCVTNEPS2BF16 Z0, Y1
	BYTE $0x62; BYTE $0xF2; BYTE $0x7E; BYTE $0x48; BYTE $0x72; BYTE $0xDA // VCVTNEPS2BF16 Z2, Y3
	VPMOVZXWD Y1, Z4
	VPMOVZXWD Y3, Z5
	VPSLLD    $16, Z5, Z5
	VPORD     Z4, Z5, Z5
	VMOVDQU32 Z5, (DI)
	ADDQ $64, SI
	ADDQ $64, DX
	ADDQ $64, DI
	DECQ CX
	JNZ  prloop

prdone:
	VZEROUPPER
	RET

// func matAccPairs1x64ZMM(c *float32, a *uint16, b *uint32, ldb, kp int)
// One row of c by 64 columns accumulates a·b over kp pairs, as
// matAccPairs6x32ZMM does each of its rows: the rows past the last whole
// six.
TEXT ·matAccPairs1x64ZMM(SB), NOSPLIT, $0-40
	MOVQ c+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), DX
	MOVQ ldb+24(FP), R12
	SHLQ $2, R12
	MOVQ kp+32(FP), CX
	VMOVUPS (DI), Z0
	VMOVUPS 64(DI), Z1
	VMOVUPS 128(DI), Z2
	VMOVUPS 192(DI), Z3
	TESTQ CX, CX
	JZ    map1store

map1loop:
	VMOVDQU32 (DX), Z12
	VMOVDQU32 64(DX), Z13
	VMOVDQU32 128(DX), Z8
	VMOVDQU32 192(DX), Z9
	VPBROADCASTD (SI), Z14
	DPBF(12, 14, 0)
	DPBF(13, 14, 1)
	DPBF(8, 14, 2)
	DPBF(9, 14, 3)
	ADDQ $4, SI
	ADDQ R12, DX
	DECQ CX
	JNZ  map1loop

map1store:
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	VZEROUPPER
	RET
