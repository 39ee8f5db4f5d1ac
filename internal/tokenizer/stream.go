package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// StreamDecoder turns a stream of token ids into text without ever
// emitting part of a UTF-8 sequence: bytes of a character split across
// tokens are held until it is complete. Invalid sequences become U+FFFD.
type StreamDecoder struct {
	t       Tokenizer
	pending []byte
}

// NewStreamDecoder starts a stream.
func NewStreamDecoder(t Tokenizer) *StreamDecoder { return &StreamDecoder{t: t} }

// Next adds a token and returns the text it completes (possibly empty).
func (d *StreamDecoder) Next(id int32) string {
	d.pending = append(d.pending, d.t.TokenBytes(id)...)
	n := completePrefix(d.pending)
	out := ToValid(d.pending[:n])
	d.pending = append(d.pending[:0], d.pending[n:]...)
	return out
}

// Flush returns what is held back (an unfinished character becomes U+FFFD).
func (d *StreamDecoder) Flush() string {
	out := ToValid(d.pending)
	d.pending = d.pending[:0]
	return out
}

// ToValid converts b to a string, replacing every byte that does not start
// a valid UTF-8 sequence with U+FFFD (one per byte, so that streamed and
// whole decodes of the same bytes agree).
func ToValid(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var s strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			s.WriteString("\uFFFD")
		} else {
			s.Write(b[:n])
		}
		b = b[n:]
	}
	return s.String()
}

// completePrefix returns the length of b less a trailing sequence that is
// the valid start of a character still missing bytes.
func completePrefix(b []byte) int {
	for back := 1; back <= 3 && back <= len(b); back++ {
		c := b[len(b)-back]
		if c&0xc0 == 0x80 {
			continue // continuation byte: keep looking for the lead
		}
		need := 0
		switch {
		case c&0xe0 == 0xc0:
			need = 2
		case c&0xf0 == 0xe0:
			need = 3
		case c&0xf8 == 0xf0:
			need = 4
		}
		if need > back && !utf8.FullRune(b[len(b)-back:]) && validStart(b[len(b)-back:]) {
			return len(b) - back
		}
		return len(b)
	}
	return len(b)
}

// validStart reports whether b could still become a valid UTF-8 character.
func validStart(b []byte) bool {
	// Complete it with the smallest continuation bytes and check validity
	// of what is there (rejects overlong and surrogate leads).
	var buf [4]byte
	n := copy(buf[:], b)
	need := 0
	switch {
	case b[0]&0xe0 == 0xc0:
		need = 2
	case b[0]&0xf0 == 0xe0:
		need = 3
	default:
		need = 4
	}
	for i := n; i < need; i++ {
		buf[i] = 0x80
	}
	if r, size := utf8.DecodeRune(buf[:need]); r != utf8.RuneError || size == need {
		return true
	}
	// The minimal completion may be invalid (e.g. E0 80 80 is overlong)
	// while a larger one is valid; try the largest continuation too.
	for i := n; i < need; i++ {
		buf[i] = 0xbf
	}
	r, size := utf8.DecodeRune(buf[:need])
	return r != utf8.RuneError || size == need
}

// Message is one turn of a conversation.
type Message struct {
	Role    string // "system", "user", "assistant" or "tool"
	Content string
}

// Chat renders messages in the Kimi chat format:
// <|im_system|>system<|im_middle|>…<|im_end|><|im_user|>user<|im_middle|>…<|im_end|>
// and, with generation, opens an assistant turn for the model to complete.
// Roles other than user and assistant use the system marker. This is the
// rendering of the released Kimi chat templates (K2, Kimi-VL, Moonlight);
// those templates also insert a default system turn ("You are Kimi, an AI
// assistant created by Moonshot AI.") when the first message is not a
// system one, which Chat leaves to the caller.
func Chat(msgs []Message, generation bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString(chatMarker(m.Role) + m.Role + "<|im_middle|>" + m.Content + "<|im_end|>")
	}
	if generation {
		b.WriteString("<|im_assistant|>assistant<|im_middle|>")
	}
	return b.String()
}

// ChatPart is a piece of a chat turn's content: text, or markup whose
// special-token strings are those tokens (the markers of a tool calls
// section that a server writes back into an assistant turn).
type ChatPart struct {
	Text   string
	Markup bool
}

// ChatTurn is one turn of a conversation with its content in parts.
type ChatTurn struct {
	Role  string
	Parts []ChatPart
}

// EncodeChat tokenizes turns in Chat's format with the format's markers
// and the markup parts' special tokens as tokens, and the roles and text
// parts as plain text: no text can open or close a turn. Where the roles
// and text parts hold no special-token string (nor spell one where parts
// meet), the tokens are those of t.Encode(Chat(…), true) for messages
// whose content is their turn's parts joined: the plain runs between
// special tokens are the same and encode alike.
func EncodeChat(t Tokenizer, turns []ChatTurn, generation bool) []int32 {
	var out []int32
	var plain strings.Builder // the plain run since the last special token
	flush := func() {
		if plain.Len() > 0 {
			out = append(out, t.Encode(plain.String(), false)...)
			plain.Reset()
		}
	}
	sp := specialsOf(t)
	markup := func(s string) {
		if sp == nil {
			flush()
			out = append(out, t.Encode(s, true)...)
			return
		}
		sp.split(s, func(p string) { plain.WriteString(p) }, func(id int32) {
			flush()
			out = append(out, id)
		})
	}
	open := func(role string) {
		markup(chatMarker(role))
		plain.WriteString(role)
		markup("<|im_middle|>")
	}
	for _, turn := range turns {
		open(turn.Role)
		for _, p := range turn.Parts {
			if p.Markup {
				markup(p.Text)
			} else {
				plain.WriteString(p.Text)
			}
		}
		markup("<|im_end|>")
	}
	if generation {
		open("assistant")
	}
	flush()
	return out
}

// specialsOf returns the special tokens of this package's tokenizers, or
// nil for another.
func specialsOf(t Tokenizer) *specials {
	switch t := t.(type) {
	case *BPE:
		return &t.sp
	case *ByteLevel:
		return &t.sp
	}
	return nil
}

// chatMarker is the special token that opens a turn of role.
func chatMarker(role string) string {
	switch role {
	case "user":
		return "<|im_user|>"
	case "assistant":
		return "<|im_assistant|>"
	}
	return "<|im_system|>"
}

// ChatSpecials are the special tokens the chat format needs.
var ChatSpecials = []string{"<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>"}
