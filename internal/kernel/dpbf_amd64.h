// The VDPBF16PS encoding the bf16 tiles (kpair_amd64.s, zmm_amd64.s)
// share.

// DPBF(w, b, a) is VDPBF16PS Zw, Zb, Za (Za += the pair products of Zb's
// and Zw's lanes), register numbers 0-31: Go's assembler has no mnemonic
// for it, so the macro writes the EVEX encoding (62 P0 P1 P2 52 ModRM;
// checked against GNU as).
#define DPBF(w, b, a) \
	BYTE $0x62; \
	BYTE $(0x02 | (((((a)>>3)&1)^1)<<7) | (((((w)>>4)&1)^1)<<6) | (((((w)>>3)&1)^1)<<5) | (((((a)>>4)&1)^1)<<4)); \
	BYTE $(0x06 | ((((b)&15)^15)<<3)); \
	BYTE $(0x40 | (((((b)>>4)&1)^1)<<3)); \
	BYTE $0x52; \
	BYTE $(0xc0 | (((a)&7)<<3) | ((w)&7))
