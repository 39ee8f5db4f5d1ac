// The parts kdaRowsAVX2 (dot_amd64.s) and kdaRowsZMM (zmm_amd64.s) share,
// so that their reductions, and with them their bits, stay the same.

// KDA_ROWS_ARGS loads the arguments: the state row in DI, ke R8, e R9,
// k R10, q R11, v R12, o R13, u SI, beta X14, dk BX, the rows left DX.
#define KDA_ROWS_ARGS \
	MOVQ st+0(FP), DI; MOVQ ke+8(FP), R8; MOVQ e+16(FP), R9; \
	MOVQ k+24(FP), R10; MOVQ q+32(FP), R11; MOVQ v+40(FP), R12; \
	MOVQ o+48(FP), R13; MOVQ u+56(FP), SI; VMOVSS beta+64(FP), X14; \
	MOVQ dk+72(FP), BX; MOVQ dv+80(FP), DX

// KDA_U adds the four partial sums Y0-Y3 of s = row·ke in dotAVX2's order
// and stores u = beta·(v[r] - s) at (SI), leaving it in X5.
#define KDA_U \
	VADDPS Y1, Y0, Y0; VADDPS Y3, Y2, Y2; VADDPS Y2, Y0, Y0; \
	VEXTRACTF128 $1, Y0, X1; VADDPS X1, X0, X0; \
	VHADDPS X0, X0, X0; VHADDPS X0, X0, X0; \
	VMOVSS (R12), X5; VSUBSS X0, X5, X5; VMULSS X14, X5, X5; VMOVSS X5, (SI)

// KDA_O_NEXT adds the partial sums Y0 and Y1 of o[r] = row·q in
// rowUpdateDotAVX2's order, stores o[r] and steps every pointer to the
// next row.
#define KDA_O_NEXT \
	VADDPS Y1, Y0, Y0; VEXTRACTF128 $1, Y0, X1; VADDPS X1, X0, X0; \
	VHADDPS X0, X0, X0; VHADDPS X0, X0, X0; VMOVSS X0, (R13); \
	LEAQ (DI)(BX*4), DI; ADDQ $4, R12; ADDQ $4, R13; ADDQ $4, SI; DECQ DX
