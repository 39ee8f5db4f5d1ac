// Package specdec implements DSpark speculative decoding: a drafter
// proposes several tokens, the target model verifies them in one pass,
// acceptance is exact (the output distribution equals plain decoding), and
// the draft depth adapts to the measured acceptance and cost.
//
// Status: not implemented yet; this package only reserves the name.
package specdec
