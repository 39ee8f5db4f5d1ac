package k3

import (
	"context"

	"k3/internal/tinymodel"
	"k3/internal/tokenizer"
)

// Tokenizer maps text to token ids and back: the tiktoken encoder of the
// released Kimi models (tiktoken.model with the Kimi pre-tokenizer), or the
// byte-level one of tiny test models.
type Tokenizer interface {
	// Encode tokenizes text. With allowSpecial, special-token strings in
	// the text ("<|im_end|>") become their ids; otherwise they are plain text.
	Encode(text string, allowSpecial bool) []int32
	// TokenBytes returns the bytes a token stands for (special tokens: their
	// name); nil for an unknown id. A token may end inside a UTF-8 character.
	TokenBytes(id int32) []byte
	// Special returns the id of a special token by name ("<|im_end|>").
	Special(name string) (int32, bool)
	// IsSpecial reports whether id is a special token.
	IsSpecial(id int32) bool
	// VocabSize is one past the largest id the tokenizer produces.
	VocabSize() int
}

// Message is one turn of a conversation.
type Message struct {
	Role    string // "system", "user", "assistant" or "tool"
	Content string
}

// Tokenizer returns the model's tokenizer.
func (m *Model) Tokenizer() Tokenizer { return m.tok }

// Encode tokenizes text; special-token strings ("<|im_end|>") become their ids.
func (m *Model) Encode(text string) []int32 { return m.tok.Encode(text, true) }

// Decode turns ids into text (invalid UTF-8 becomes U+FFFD).
func (m *Model) Decode(ids []int32) string { return tokenizer.Decode(m.tok, ids) }

// ChatPrompt renders a conversation in the Kimi chat format, ending with an
// open assistant turn for the model to complete. Encode (or Generate) then
// reads special-token strings anywhere in it as those tokens, including
// inside a message's content; ChatTokens does not.
func (m *Model) ChatPrompt(msgs []Message) string {
	turns := make([]tokenizer.Message, len(msgs))
	for i, msg := range msgs {
		turns[i] = tokenizer.Message(msg)
	}
	return tokenizer.Chat(turns, true)
}

// ChatTokens is the conversation ChatPrompt renders, tokenized with the
// roles and content as text: a special-token string in a message
// ("<|im_end|>") stays text and cannot end its turn or open another. For
// content without such strings it equals Encode(ChatPrompt(msgs)).
func (m *Model) ChatTokens(msgs []Message) []int32 {
	turns := make([]tokenizer.ChatTurn, len(msgs))
	for i, msg := range msgs {
		turns[i] = tokenizer.ChatTurn{Role: msg.Role, Parts: []tokenizer.ChatPart{{Text: msg.Content}}}
	}
	return tokenizer.EncodeChat(m.tok, turns, true)
}

// LoadTiny loads the model embedded in the SDK: a tiny K3.1 Pro-shaped
// model (KDA and DSA layers, Block AttnRes, latent MoE; 5M parameters,
// bf16) trained on the Go standard library source, with a 4,096-token BPE
// tokenizer. It completes Go code; it knows nothing else.
func LoadTiny(ctx context.Context, opts ...Option) (*Model, error) {
	return LoadFS(ctx, tinymodel.Default(), "embedded:k3-tiny-go", opts...)
}

// TinyLabel describes the embedded model for user-facing output.
const TinyLabel = "embedded tiny K3.1 Pro-shaped model trained on Go source (it completes Go code)"

// WeightBytes returns the size of the checkpoint's tensors as stored.
func (m *Model) WeightBytes() int64 {
	var n int64
	for _, name := range m.ck.Names() {
		t, _, _ := m.ck.Tensor(name)
		n += t.Size
	}
	return n
}

// ContextLength returns the most tokens a session can hold
// (max_position_embeddings).
func (m *Model) ContextLength() int { return m.Config.MaxPositionEmbeddings }

// VocabSize returns the number of token ids the model scores.
func (m *Model) VocabSize() int { return m.Config.VocabSize }
