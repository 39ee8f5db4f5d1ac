package serve

import "strings"

// Reasoning in the Kimi thinking models' output (docs/SERVING.md,
// "Reasoning"): the text up to </think>, after an optional <think>, is
// the reasoning; a tool calls section ends it too (its marker stays with
// the content, for the tool calls); the rest is the content.

const (
	thinkBegin = "<think>"
	thinkEnd   = "</think>"
)

// splitReasoning splits a whole answer into its reasoning and content;
// cut says max_tokens or the context ended it.
func splitReasoning(text string, cut bool) (reasoning, content string) {
	var r reasoningStream
	a, b := r.next(text)
	c, d := r.end(cut)
	return a + c, b + d
}

// reasoningStream splits streamed text the same way, holding back any
// tail that may begin a marker it has yet to see.
type reasoningStream struct {
	phase int    // 0: before a possible <think>; 1: reasoning; 2: content
	held  string // text not yet released
}

// next takes a piece of text and returns the reasoning and content that
// may be sent.
func (r *reasoningStream) next(text string) (reasoning, content string) {
	r.held += text
	if r.phase == 0 {
		t := strings.TrimLeft(r.held, " \t\r\n")
		if len(t) < len(thinkBegin) && strings.HasPrefix(thinkBegin, t) {
			return "", "" // may still become <think>
		}
		if strings.HasPrefix(t, thinkBegin) {
			r.held = t[len(thinkBegin):]
		}
		r.phase = 1
	}
	if r.phase == 1 {
		end, skip := strings.Index(r.held, thinkEnd), len(thinkEnd)
		if i := strings.Index(r.held, toolSectionBegin); i >= 0 && (end < 0 || i < end) {
			end, skip = i, 0
		}
		if end < 0 {
			keep := max(partialSuffix(r.held, thinkEnd), partialSuffix(r.held, toolSectionBegin))
			reasoning = r.held[:len(r.held)-keep]
			r.held = r.held[len(r.held)-keep:]
			return reasoning, ""
		}
		reasoning, r.held, r.phase = r.held[:end], r.held[end+skip:], 2
	}
	content, r.held = r.held, ""
	return reasoning, content
}

// end returns what is still held once the generation has ended (cut: by
// max_tokens or the context): a marker's start that never completed
// belongs to the phase it came in, but where the cut fell inside a marker
// that ends the reasoning ("</" or "<|" and on; a lone "<" is more likely
// text) it is dropped, as parseToolCalls drops the tool section's.
func (r *reasoningStream) end(cut bool) (reasoning, content string) {
	held := r.held
	r.held = ""
	if r.phase == 2 {
		return "", held
	}
	if cut && len(strings.TrimLeft(held, " \t\r\n")) >= 2 {
		return "", ""
	}
	return held, ""
}

// partialSuffix is the length of the longest tail of s that begins
// marker (shorter than marker itself).
func partialSuffix(s, marker string) int {
	for n := min(len(s), len(marker)-1); n > 0; n-- {
		if strings.HasSuffix(s, marker[:n]) {
			return n
		}
	}
	return 0
}
