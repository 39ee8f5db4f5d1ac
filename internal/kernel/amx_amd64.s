//go:build !purego

#include "textflag.h"

// AMX (Advanced Matrix Extensions) tile kernels. Go's assembler has no
// mnemonics for the tile instructions, so each is written as the bytes GNU
// as assembles for it (register and SIB forms); the kernels are tested
// against their plain-Go twin.
//
// A is the activations' part rows (row 3r+q is part q of x row r, bf16,
// 32 k to a tile row); a tile of A holds five x rows' fifteen part rows
// (or fewer). B is one k-block of a 16-column weight panel in
// pair-interleaved form (16 x 64 bytes); C is fifteen part rows of 16
// float32 outputs. Strides are in bytes.
#define TILEZERO_0 BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x49; BYTE $0xC0
#define TILEZERO_1 BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x49; BYTE $0xC8
#define TILEZERO_2 BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x49; BYTE $0xD0
#define TILEZERO_3 BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x49; BYTE $0xD8
#define TILEZERO_4 BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x49; BYTE $0xE0
#define TILEZERO_5 BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x49; BYTE $0xE8
#define TILEZERO_6 BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x49; BYTE $0xF0
#define TILEZERO_7 BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x49; BYTE $0xF8
#define TILERELEASE BYTE $0xC4; BYTE $0xE2; BYTE $0x78; BYTE $0x49; BYTE $0xC0
#define LDTILECFG_DI BYTE $0xC4; BYTE $0xE2; BYTE $0x78; BYTE $0x49; BYTE $0x07
#define TILELOADD_4_SI_DX BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x4B; BYTE $0x24; BYTE $0x16
#define TILELOADD_5_SI_DX BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x4B; BYTE $0x2C; BYTE $0x16
#define TILELOADD_5_R11_DX BYTE $0xC4; BYTE $0xC2; BYTE $0x7B; BYTE $0x4B; BYTE $0x2C; BYTE $0x13
#define TILELOADD_6_BX_AX BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x4B; BYTE $0x34; BYTE $0x03
#define TILELOADD_7_R14_AX BYTE $0xC4; BYTE $0xC2; BYTE $0x7B; BYTE $0x4B; BYTE $0x3C; BYTE $0x06
#define TILELOADD_2_BX_AX BYTE $0xC4; BYTE $0xE2; BYTE $0x7B; BYTE $0x4B; BYTE $0x14; BYTE $0x03
#define TILELOADD_3_R14_AX BYTE $0xC4; BYTE $0xC2; BYTE $0x7B; BYTE $0x4B; BYTE $0x1C; BYTE $0x06
#define TILESTORED_0_DI_R10 BYTE $0xC4; BYTE $0xA2; BYTE $0x7A; BYTE $0x4B; BYTE $0x04; BYTE $0x17
#define TILESTORED_1_R11_R10 BYTE $0xC4; BYTE $0x82; BYTE $0x7A; BYTE $0x4B; BYTE $0x0C; BYTE $0x13
#define TILESTORED_2_R14_R10 BYTE $0xC4; BYTE $0x82; BYTE $0x7A; BYTE $0x4B; BYTE $0x14; BYTE $0x16
#define TILESTORED_3_R11_R10 BYTE $0xC4; BYTE $0x82; BYTE $0x7A; BYTE $0x4B; BYTE $0x1C; BYTE $0x13
#define TDPBF16PS_0_4_6 BYTE $0xC4; BYTE $0xE2; BYTE $0x4A; BYTE $0x5C; BYTE $0xC4
#define TDPBF16PS_1_4_7 BYTE $0xC4; BYTE $0xE2; BYTE $0x42; BYTE $0x5C; BYTE $0xCC
#define TDPBF16PS_2_5_6 BYTE $0xC4; BYTE $0xE2; BYTE $0x4A; BYTE $0x5C; BYTE $0xD5
#define TDPBF16PS_3_5_7 BYTE $0xC4; BYTE $0xE2; BYTE $0x42; BYTE $0x5C; BYTE $0xDD
#define TDPBF16PS_0_5_2 BYTE $0xC4; BYTE $0xE2; BYTE $0x6A; BYTE $0x5C; BYTE $0xC5
#define TDPBF16PS_1_5_3 BYTE $0xC4; BYTE $0xE2; BYTE $0x62; BYTE $0x5C; BYTE $0xCD


#define TILELOADD_0_DI_R10 BYTE $0xC4; BYTE $0xA2; BYTE $0x7B; BYTE $0x4B; BYTE $0x04; BYTE $0x17
#define TILELOADD_1_R11_R10 BYTE $0xC4; BYTE $0x82; BYTE $0x7B; BYTE $0x4B; BYTE $0x0C; BYTE $0x13

// PREFETCH_NEXT_TILES fetches the 1 KB weight tiles 8 KB ahead of both
// streams (BX and R14), one 64-byte line at a time.
#define PREFETCH_NEXT_TILES \
	PREFETCHT0 8192(BX); PREFETCHT0 8192(R14); \
	PREFETCHT0 8256(BX); PREFETCHT0 8256(R14); \
	PREFETCHT0 8320(BX); PREFETCHT0 8320(R14); \
	PREFETCHT0 8384(BX); PREFETCHT0 8384(R14); \
	PREFETCHT0 8448(BX); PREFETCHT0 8448(R14); \
	PREFETCHT0 8512(BX); PREFETCHT0 8512(R14); \
	PREFETCHT0 8576(BX); PREFETCHT0 8576(R14); \
	PREFETCHT0 8640(BX); PREFETCHT0 8640(R14); \
	PREFETCHT0 8704(BX); PREFETCHT0 8704(R14); \
	PREFETCHT0 8768(BX); PREFETCHT0 8768(R14); \
	PREFETCHT0 8832(BX); PREFETCHT0 8832(R14); \
	PREFETCHT0 8896(BX); PREFETCHT0 8896(R14); \
	PREFETCHT0 8960(BX); PREFETCHT0 8960(R14); \
	PREFETCHT0 9024(BX); PREFETCHT0 9024(R14); \
	PREFETCHT0 9088(BX); PREFETCHT0 9088(R14); \
	PREFETCHT0 9152(BX); PREFETCHT0 9152(R14)

#define TILELOADD_2_R14_R10 BYTE $0xC4; BYTE $0x82; BYTE $0x7B; BYTE $0x4B; BYTE $0x14; BYTE $0x16
#define TILELOADD_3_R11_R10 BYTE $0xC4; BYTE $0x82; BYTE $0x7B; BYTE $0x4B; BYTE $0x1C; BYTE $0x13

// PREFETCH_STREAM fetches into L2 the 1 KB weight tiles 4 KB ahead of both
// streams (BX and R14), one 64-byte line at a time.
#define PREFETCH_STREAM \
	PREFETCHT1 4096(BX); PREFETCHT1 4096(R14); \
	PREFETCHT1 4160(BX); PREFETCHT1 4160(R14); \
	PREFETCHT1 4224(BX); PREFETCHT1 4224(R14); \
	PREFETCHT1 4288(BX); PREFETCHT1 4288(R14); \
	PREFETCHT1 4352(BX); PREFETCHT1 4352(R14); \
	PREFETCHT1 4416(BX); PREFETCHT1 4416(R14); \
	PREFETCHT1 4480(BX); PREFETCHT1 4480(R14); \
	PREFETCHT1 4544(BX); PREFETCHT1 4544(R14); \
	PREFETCHT1 4608(BX); PREFETCHT1 4608(R14); \
	PREFETCHT1 4672(BX); PREFETCHT1 4672(R14); \
	PREFETCHT1 4736(BX); PREFETCHT1 4736(R14); \
	PREFETCHT1 4800(BX); PREFETCHT1 4800(R14); \
	PREFETCHT1 4864(BX); PREFETCHT1 4864(R14); \
	PREFETCHT1 4928(BX); PREFETCHT1 4928(R14); \
	PREFETCHT1 4992(BX); PREFETCHT1 4992(R14); \
	PREFETCHT1 5056(BX); PREFETCHT1 5056(R14)

// KSTEP2_REST is the rest of amxTiles2's k-step after the first two tile
// products: the next block's tiles each loaded as soon as the last product
// reading it is issued, the other two products between, and the count.
#define KSTEP2_REST \
	ADDQ $1024, BX; ADDQ $1024, R14; \
	TILELOADD_6_BX_AX; \
	TDPBF16PS_1_4_7; \
	ADDQ $64, SI; ADDQ $64, R11; \
	TILELOADD_4_SI_DX; \
	TDPBF16PS_3_5_7; \
	TILELOADD_5_R11_DX; \
	TILELOADD_7_R14_AX; \
	DECQ R13

// func amxTiles2(cfg *amxConfig, a *uint16, astride int, b *uint16, kb int, c *float32, cstride, groups, pstride, acc, stream int)
//
// Two blocks of part rows (at a and a+15*astride; the second may be
// short, as cfg says: tmm0, tmm1, tmm4 the first, tmm2, tmm3, tmm5 the
// second) against groups of two weight panels (tmm6, tmm7), over kb
// k-blocks: for each group C (+)= sum over the k-blocks of A · B, stored
// to c (the second block's rows 15 rows further). With acc set C starts
// from what c holds (a later k-range of the same product), else from
// zero. Panels are pstride bytes apart; the next group's panels follow,
// and its columns are 32 floats further in c. With stream set (the
// weights come from memory, each pair of panels read over the whole k)
// the k-loop also prefetches both panels 4 KB ahead into L2.
TEXT ·amxTiles2(SB), NOSPLIT, $0-88
	MOVQ cfg+0(FP), DI
	LDTILECFG_DI
	MOVQ $64, AX
	MOVQ astride+16(FP), DX
	IMUL3Q $15, DX, R9
	MOVQ cstride+48(FP), R10
	MOVQ pstride+64(FP), R12
	MOVQ b+24(FP), BX
	MOVQ c+40(FP), DI
group2:
	CMPQ acc+72(FP), $0
	JNE cload2
	TILEZERO_0
	TILEZERO_1
	TILEZERO_2
	TILEZERO_3
	JMP cready2
cload2:
	TILELOADD_0_DI_R10
	LEAQ 64(DI), R11
	TILELOADD_1_R11_R10
	IMUL3Q $15, R10, R13
	LEAQ (DI)(R13*1), R14
	TILELOADD_2_R14_R10
	LEAQ 64(R14), R11
	TILELOADD_3_R11_R10
cready2:
	MOVQ a+8(FP), SI
	MOVQ kb+32(FP), R13
	LEAQ (BX)(R12*1), R14
	LEAQ (SI)(R9*1), R11
	TILELOADD_6_BX_AX
	TILELOADD_7_R14_AX
	TILELOADD_4_SI_DX
	TILELOADD_5_R11_DX
	DECQ R13
	JZ klast2
	CMPQ stream+80(FP), $0
	JNE kloop2s
	// Software-pipelined: each tile is reloaded for the next k-block as
	// soon as the last product reading it is issued (tiles are not
	// renamed, so a load waits for the products before it that read its
	// tile).
kloop2:
	TDPBF16PS_0_4_6
	TDPBF16PS_2_5_6
	KSTEP2_REST
	JNZ kloop2
	JMP klast2
kloop2s:
	TDPBF16PS_0_4_6
	TDPBF16PS_2_5_6
	PREFETCH_STREAM
	KSTEP2_REST
	JNZ kloop2s
klast2:
	TDPBF16PS_0_4_6
	TDPBF16PS_2_5_6
	TDPBF16PS_1_4_7
	TDPBF16PS_3_5_7
	// The next group's first panel is two panels on from this group's.
	MOVQ kb+32(FP), R13
	SHLQ $10, R13
	SUBQ R13, BX
	ADDQ $1024, BX
	ADDQ R12, BX
	ADDQ R12, BX
	TILESTORED_0_DI_R10
	LEAQ 64(DI), R11
	TILESTORED_1_R11_R10
	IMUL3Q $15, R10, R13
	LEAQ (DI)(R13*1), R14
	TILESTORED_2_R14_R10
	LEAQ 64(R14), R11
	TILESTORED_3_R11_R10
	ADDQ $128, DI
	DECQ groups+56(FP)
	JNZ group2
	TILERELEASE
	RET

// func amxTiles1(cfg *amxConfig, a *uint16, astride int, b *uint16, kb int, c *float32, cstride, groups int)
//
// amxTiles2 with one block of part rows (tmm0, tmm1 accumulate). Its
// k-blocks alternate between two sets of tiles (A tmm4, B tmm6 and tmm7;
// A tmm5, B tmm2 and tmm3), so that the loads of one block need not wait
// for the products of the one before to free their tiles; the weight
// streams are prefetched eight k-blocks ahead.
TEXT ·amxTiles1(SB), NOSPLIT, $0-64
	MOVQ cfg+0(FP), DI
	LDTILECFG_DI
	MOVQ $64, AX
	MOVQ astride+16(FP), DX
	MOVQ cstride+48(FP), R10
	MOVQ kb+32(FP), R12
	SHLQ $10, R12
	MOVQ b+24(FP), BX
	MOVQ c+40(FP), DI
group1:
	TILEZERO_0
	TILEZERO_1
	MOVQ a+8(FP), SI
	MOVQ kb+32(FP), R13
	LEAQ (BX)(R12*1), R14
	CMPQ R13, $2
	JLT kone1
kpair1:
	TILELOADD_4_SI_DX
	TILELOADD_6_BX_AX
	TILELOADD_7_R14_AX
	TDPBF16PS_0_4_6
	TDPBF16PS_1_4_7
	PREFETCH_NEXT_TILES
	ADDQ $64, SI
	ADDQ $1024, BX
	ADDQ $1024, R14
	TILELOADD_5_SI_DX
	TILELOADD_2_BX_AX
	TILELOADD_3_R14_AX
	TDPBF16PS_0_5_2
	TDPBF16PS_1_5_3
	PREFETCH_NEXT_TILES
	ADDQ $64, SI
	ADDQ $1024, BX
	ADDQ $1024, R14
	SUBQ $2, R13
	CMPQ R13, $2
	JGE kpair1
kone1:
	TESTQ R13, R13
	JZ kdone1
	TILELOADD_4_SI_DX
	TILELOADD_6_BX_AX
	TILELOADD_7_R14_AX
	TDPBF16PS_0_4_6
	TDPBF16PS_1_4_7
	ADDQ $1024, BX
kdone1:
	ADDQ R12, BX
	TILESTORED_0_DI_R10
	LEAQ 64(DI), R11
	TILESTORED_1_R11_R10
	ADDQ $128, DI
	DECQ groups+56(FP)
	JNZ group1
	TILERELEASE
	RET

// func amxPeakLoop(cfg *amxConfig, n int)
//
// n rounds of four independent TDPBF16PS on zeroed full tiles (16 x 16 x
// 32 each, 16,384 FLOPs): the tile unit's peak, with no memory traffic.
TEXT ·amxPeakLoop(SB), NOSPLIT, $0-16
	MOVQ cfg+0(FP), DI
	LDTILECFG_DI
	MOVQ n+8(FP), CX
	TILEZERO_0
	TILEZERO_1
	TILEZERO_2
	TILEZERO_3
	TILEZERO_4
	TILEZERO_5
	TILEZERO_6
	TILEZERO_7
peakloop:
	TDPBF16PS_0_4_6
	TDPBF16PS_1_4_7
	TDPBF16PS_2_5_6
	TDPBF16PS_3_5_7
	DECQ CX
	JNZ peakloop
	TILERELEASE
	RET

// func amxStepLoop(cfg *amxConfig, n int, a, b *uint16, c *float32, mode int)
//
// n rounds of amxTiles2's k-step on tiles loaded from memory (A tmm4,
// tmm5 from a and a+1 KB, B tmm6, tmm7 from b and b+1 KB, 64-byte rows):
// mode 0 multiplies the loaded tiles over and over, mode 1 also reloads
// the four tiles each round as amxTiles2 does (from the same addresses,
// so from L1), mode 2 also stores the accumulators to c (16 KB) and loads
// them back every eight rounds, as amxTiles2 does between groups. With
// amxPeakLoop's zeroed tiles beside it: how far the tile unit's rate falls
// with data in the tiles, with the step's loads and with the drains
// (BenchmarkAMXStep).
TEXT ·amxStepLoop(SB), NOSPLIT, $0-48
	MOVQ cfg+0(FP), DI
	LDTILECFG_DI
	MOVQ n+8(FP), CX
	MOVQ a+16(FP), SI
	MOVQ b+24(FP), BX
	MOVQ c+32(FP), DI
	MOVQ mode+40(FP), R12
	MOVQ $64, AX
	MOVQ $64, DX
	MOVQ $256, R10
	LEAQ 1024(SI), R11
	LEAQ 1024(BX), R14
	MOVQ R11, R8
	MOVQ R14, R9
	TILEZERO_0
	TILEZERO_1
	TILEZERO_2
	TILEZERO_3
	TILELOADD_4_SI_DX
	TILELOADD_5_R11_DX
	TILELOADD_6_BX_AX
	TILELOADD_7_R14_AX
	XORQ R13, R13
	CMPQ R12, $0
	JNE steploads
steponly:
	TDPBF16PS_0_4_6
	TDPBF16PS_2_5_6
	TDPBF16PS_1_4_7
	TDPBF16PS_3_5_7
	DECQ CX
	JNZ steponly
	JMP stepdone
steploads:
	TDPBF16PS_0_4_6
	TDPBF16PS_2_5_6
	TILELOADD_6_BX_AX
	TDPBF16PS_1_4_7
	TILELOADD_4_SI_DX
	TDPBF16PS_3_5_7
	TILELOADD_5_R11_DX
	TILELOADD_7_R14_AX
	CMPQ R12, $2
	JNE stepnext
	INCQ R13
	TESTQ $7, R13
	JNZ stepnext
	LEAQ 64(DI), R11
	LEAQ 4096(DI), R14
	TILESTORED_0_DI_R10
	TILESTORED_1_R11_R10
	TILESTORED_2_R14_R10
	LEAQ 4160(DI), R11
	TILESTORED_3_R11_R10
	TILELOADD_3_R11_R10
	LEAQ 64(DI), R11
	TILELOADD_0_DI_R10
	TILELOADD_1_R11_R10
	TILELOADD_2_R14_R10
	MOVQ R8, R11
	MOVQ R9, R14
stepnext:
	DECQ CX
	JNZ steploads
stepdone:
	TILERELEASE
	RET

// func splitBF16AVX512(hi, mid, lo *uint16, x *float32, n int)
//
// SplitBF16 over n floats (a multiple of 16), sixteen at a time:
// VCVTNEPS2BF16 rounds to bf16 (to nearest even, inputs below the normal
// range read as zero), the part widened back is subtracted exactly, and
// the remainder rounded again. The bytes are GNU as's encoding of
// VCVTNEPS2BF16 Z0, Y1.
TEXT ·splitBF16AVX512(SB), NOSPLIT, $0-40
	MOVQ hi+0(FP), DI
	MOVQ mid+8(FP), R8
	MOVQ lo+16(FP), R9
	MOVQ x+24(FP), SI
	MOVQ n+32(FP), CX
	SHRQ $4, CX
	JZ splitdone
splitloop:
	VMOVUPS (SI), Z0
	BYTE $0x62; BYTE $0xF2; BYTE $0x7E; BYTE $0x48; BYTE $0x72; BYTE $0xC8
	VMOVDQU Y1, (DI)
	VPMOVZXWD Y1, Z2
	VPSLLD $16, Z2, Z2
	VSUBPS Z2, Z0, Z0
	BYTE $0x62; BYTE $0xF2; BYTE $0x7E; BYTE $0x48; BYTE $0x72; BYTE $0xC8
	VMOVDQU Y1, (R8)
	VPMOVZXWD Y1, Z2
	VPSLLD $16, Z2, Z2
	VSUBPS Z2, Z0, Z0
	BYTE $0x62; BYTE $0xF2; BYTE $0x7E; BYTE $0x48; BYTE $0x72; BYTE $0xC8
	VMOVDQU Y1, (R9)
	ADDQ $64, SI
	ADDQ $32, DI
	ADDQ $32, R8
	ADDQ $32, R9
	DECQ CX
	JNZ splitloop
splitdone:
	VZEROUPPER
	RET


// func sum3AVX512(dst, a, b, c *float32, n int)
//
// dst[i] = (a[i] + b[i]) + c[i] for n (a multiple of 16) floats: the
// three part rows' sums of the AMX product.
TEXT ·sum3AVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), R8
	MOVQ c+24(FP), R9
	MOVQ n+32(FP), CX
	SHRQ $4, CX
	JZ sum3done
sum3loop:
	VMOVUPS (SI), Z0
	VADDPS (R8), Z0, Z0
	VADDPS (R9), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, R8
	ADDQ $64, R9
	ADDQ $64, DI
	DECQ CX
	JNZ sum3loop
sum3done:
	VZEROUPPER
	RET

// func roundBF16AVX512(dst *uint16, x *float32, n int)
//
// x rounded to bf16 (VCVTNEPS2BF16: to nearest even, inputs below the
// normal range read as zero) for n (a multiple of 16) floats: the fast
// AMX product's one part.
TEXT ·roundBF16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $4, CX
	JZ rounddone
roundloop:
	VMOVUPS (SI), Z0
	BYTE $0x62; BYTE $0xF2; BYTE $0x7E; BYTE $0x48; BYTE $0x72; BYTE $0xC8
	VMOVDQU Y1, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	DECQ CX
	JNZ roundloop
rounddone:
	VZEROUPPER
	RET

// func repackKMajorAMXAVX512(dst, src *uint16, pairs, pstride int, idx *[32]uint16)
//
// Writes pairs k-pairs of one k-major panel (src: rows of 48 bf16, 96
// bytes) as tile rows of its three 16-column AMX panels (dst, dst+pstride,
// dst+2*pstride bytes): pair t's row of each is 64 bytes at t*64, the 16
// columns' (2t, 2t+1) weights side by side, interleaved by VPERMT2W with
// idx ([0, 32, 1, 33, ...]).
TEXT ·repackKMajorAMXAVX512(SB), NOSPLIT, $0-40
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ pairs+16(FP), CX
	MOVQ pstride+24(FP), DX
	MOVQ idx+32(FP), AX
	VMOVDQU64 (AX), Z7
	LEAQ (DI)(DX*1), R8
	LEAQ (R8)(DX*1), R9
	TESTQ CX, CX
	JZ repackdone
repackloop:
	VMOVDQU (SI), Y0
	VMOVDQU 96(SI), Y1
	VPERMT2W Z1, Z7, Z0
	VMOVDQU64 Z0, (DI)
	VMOVDQU 32(SI), Y2
	VMOVDQU 128(SI), Y3
	VPERMT2W Z3, Z7, Z2
	VMOVDQU64 Z2, (R8)
	VMOVDQU 64(SI), Y4
	VMOVDQU 160(SI), Y5
	VPERMT2W Z5, Z7, Z4
	VMOVDQU64 Z4, (R9)
	ADDQ $192, SI
	ADDQ $64, DI
	ADDQ $64, R8
	ADDQ $64, R9
	DECQ CX
	JNZ repackloop
repackdone:
	VZEROUPPER
	RET
