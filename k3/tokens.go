package k3

import "k3/internal/tokenizer"

// Tokenizer maps text to token ids and back: the tiktoken encoder of the
// released Kimi models, or the byte-level one of tiny test models.
type Tokenizer = tokenizer.Tokenizer

// Message is one turn of a conversation.
type Message = tokenizer.Message

// Tokenizer returns the model's tokenizer.
func (m *Model) Tokenizer() Tokenizer { return m.tok }

// Encode tokenizes text; special-token strings ("<|im_end|>") become their ids.
func (m *Model) Encode(text string) []int32 { return m.tok.Encode(text, true) }

// Decode turns ids into text (invalid UTF-8 becomes U+FFFD).
func (m *Model) Decode(ids []int32) string { return tokenizer.Decode(m.tok, ids) }

// ChatPrompt renders a conversation in the Kimi chat format, ending with an
// open assistant turn for the model to complete.
func (m *Model) ChatPrompt(msgs []Message) string { return tokenizer.Chat(msgs, true) }
