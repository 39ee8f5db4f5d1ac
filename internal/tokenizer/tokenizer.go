// Package tokenizer implements the tokenizers of the Kimi models: the
// tiktoken byte-pair encoder the released checkpoints ship (a tiktoken.model
// rank file plus special tokens from tokenizer_config.json), a byte-level
// tokenizer for tiny test models, streaming decoding that never splits a
// UTF-8 sequence, and the Kimi chat template.
package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// ErrFormat is wrapped by errors about malformed tokenizer files.
var ErrFormat = errors.New("malformed tokenizer file")

// ErrVocabMismatch is wrapped when the tokenizer's ids do not fit the
// model's vocabulary (vocab_size in config.json).
var ErrVocabMismatch = errors.New("tokenizer does not fit the vocabulary")

// Tokenizer maps text to token ids and back.
type Tokenizer interface {
	// Encode tokenizes text. With allowSpecial, special-token strings in
	// the text ("<|im_end|>") become their ids; otherwise they are plain text.
	Encode(text string, allowSpecial bool) []int32
	// TokenBytes returns the bytes a token stands for (special tokens: their
	// name); nil for an unknown id.
	TokenBytes(id int32) []byte
	// Special returns the id of a special token by name.
	Special(name string) (int32, bool)
	// IsSpecial reports whether id is a special token.
	IsSpecial(id int32) bool
	// VocabSize is one past the largest id.
	VocabSize() int
}

// Decode concatenates the bytes of ids; bytes that are not valid UTF-8
// become U+FFFD (see ToValid).
func Decode(t Tokenizer, ids []int32) string {
	var b []byte
	for _, id := range ids {
		b = append(b, t.TokenBytes(id)...)
	}
	return ToValid(b)
}

// specials holds the special tokens of a vocabulary.
type specials struct {
	byName map[string]int32
	byID   map[int32]string
	trie   *specialNode
	first  [256]bool // the names' first bytes
}

// specialNode is a node of the names' trie: name is set where a name ends.
type specialNode struct {
	next map[byte]*specialNode
	name string
}

func newSpecials(m map[string]int32) specials {
	s := specials{byName: m, byID: map[int32]string{}, trie: &specialNode{}}
	for name, id := range m {
		s.byID[id] = name
		if name == "" {
			continue // it would match everywhere; constructors reject it
		}
		s.first[name[0]] = true
		n := s.trie
		for i := 0; i < len(name); i++ {
			c := n.next[name[i]]
			if c == nil {
				if n.next == nil {
					n.next = map[byte]*specialNode{}
				}
				c = &specialNode{}
				n.next[name[i]] = c
			}
			n = c
		}
		n.name = name
	}
	return s
}

// match returns the longest name that text starts with, or "".
func (s *specials) match(text string) string {
	best := ""
	n := s.trie
	for i := 0; i < len(text); i++ {
		if n = n.next[text[i]]; n == nil {
			break
		}
		if n.name != "" {
			best = n.name
		}
	}
	return best
}

// split calls plain for the text between special tokens and special for
// each special token found (leftmost, longest).
//
// Each byte is looked at once, and a special token's first byte walks the
// names' trie from there: a text of many special tokens, or of many
// bytes that begin one, costs in proportion to its length and the longest
// name, not to its length times the number of tokens found.
func (s *specials) split(text string, plain func(string), special func(int32)) {
	from := 0 // the first byte not yet handed on
	for i := 0; i < len(text); i++ {
		if !s.first[text[i]] {
			continue
		}
		name := s.match(text[i:])
		if name == "" {
			continue
		}
		if i > from {
			plain(text[from:i])
		}
		special(s.byName[name])
		from = i + len(name)
		i = from - 1
	}
	if from < len(text) {
		plain(text[from:])
	}
}

// BPE is a tiktoken byte-pair encoder.
type BPE struct {
	ranks        map[string]int32
	decoder      [][]byte         // by rank
	specialBytes map[int32][]byte // special tokens' text by id
	sp           specials
	vocab        int
}

// NewBPE builds an encoder from mergeable ranks (token bytes → id) and
// special tokens.
func NewBPE(ranks map[string]int32, special map[string]int32) (*BPE, error) {
	if err := checkSpecialNames(special); err != nil {
		return nil, err
	}
	t := &BPE{ranks: ranks, sp: newSpecials(special), specialBytes: map[int32][]byte{}}
	nRanks := 0
	for _, id := range ranks {
		if id < 0 {
			return nil, fmt.Errorf("%w: rank %d is negative", ErrFormat, id)
		}
		nRanks = max(nRanks, int(id)+1)
	}
	// Ranks index the decoder table: a stray huge rank must be an error, not
	// a multi-gigabyte allocation. Tiktoken ranks are dense; special tokens
	// may sit anywhere above them and are kept in a map.
	if nRanks > 2*len(ranks)+1024 {
		return nil, fmt.Errorf("%w: ranks reach %d for %d tokens; ranks must be dense", ErrFormat, nRanks-1, len(ranks))
	}
	t.vocab = nRanks
	t.decoder = make([][]byte, nRanks)
	for tok, id := range ranks {
		if t.decoder[id] != nil {
			return nil, fmt.Errorf("%w: rank %d used twice", ErrFormat, id)
		}
		t.decoder[id] = []byte(tok)
	}
	for name, id := range special {
		if id < 0 {
			return nil, fmt.Errorf("%w: special token id %d is negative", ErrFormat, id)
		}
		if int(id) < nRanks && t.decoder[id] != nil || t.specialBytes[id] != nil {
			return nil, fmt.Errorf("%w: special token %q reuses id %d", ErrFormat, name, id)
		}
		t.specialBytes[id] = []byte(name)
		t.vocab = max(t.vocab, int(id)+1)
	}
	for b := 0; b < 256; b++ {
		if _, ok := ranks[string([]byte{byte(b)})]; !ok {
			return nil, fmt.Errorf("%w: byte %#02x has no rank, so some text could not be encoded", ErrFormat, b)
		}
	}
	return t, nil
}

// ReadRanks parses a tiktoken rank file: one "base64-token rank" per line.
func ReadRanks(r io.Reader, name string) (map[string]int32, error) {
	ranks := map[string]int32{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("%w: %s line %d: want \"base64-token rank\"", ErrFormat, name, line)
		}
		tok, err := base64.StdEncoding.DecodeString(string(f[0]))
		if err != nil {
			return nil, fmt.Errorf("%w: %s line %d: %v", ErrFormat, name, line, err)
		}
		rank, err := strconv.ParseInt(string(f[1]), 10, 32)
		if err != nil || rank < 0 {
			return nil, fmt.Errorf("%w: %s line %d: rank %q", ErrFormat, name, line, f[1])
		}
		if _, dup := ranks[string(tok)]; dup {
			return nil, fmt.Errorf("%w: %s line %d: token listed twice", ErrFormat, name, line)
		}
		ranks[string(tok)] = int32(rank)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return ranks, nil
}

// Encode implements Tokenizer.
func (t *BPE) Encode(text string, allowSpecial bool) []int32 {
	var out []int32
	plain := func(s string) {
		SplitKimi(s, func(piece string) { out = t.encodePiece(out, piece) })
	}
	if !allowSpecial {
		plain(text)
		return out
	}
	t.sp.split(text, plain, func(id int32) { out = append(out, id) })
	return out
}

// encodePiece appends the tokens of one pre-tokenized piece: the piece
// itself where it is a token, else its bytes merged pair by pair, the
// lowest rank first (mergeScan, mergeHeap).
func (t *BPE) encodePiece(out []int32, piece string) []int32 {
	if id, ok := t.ranks[piece]; ok {
		return append(out, id)
	}
	if len(piece) <= scanMax {
		return t.mergeScan(out, piece)
	}
	return t.mergeHeap(out, piece)
}

// TokenBytes implements Tokenizer.
func (t *BPE) TokenBytes(id int32) []byte {
	if id >= 0 && int(id) < len(t.decoder) && t.decoder[id] != nil {
		return t.decoder[id]
	}
	return t.specialBytes[id]
}

// Special implements Tokenizer.
func (t *BPE) Special(name string) (int32, bool) { id, ok := t.sp.byName[name]; return id, ok }

// IsSpecial implements Tokenizer.
func (t *BPE) IsSpecial(id int32) bool { _, ok := t.sp.byID[id]; return ok }

// VocabSize implements Tokenizer.
func (t *BPE) VocabSize() int { return t.vocab }

// ByteLevel maps every byte b to id Offset+b, with special tokens at ids of
// their own: the tokenizer of k3's tiny random-weight models.
type ByteLevel struct {
	Offset int32
	sp     specials
	vocab  int
}

// NewByteLevel makes a byte tokenizer; specials must not overlap the 256
// byte ids.
func NewByteLevel(offset int32, special map[string]int32, vocab int) (*ByteLevel, error) {
	if err := checkSpecialNames(special); err != nil {
		return nil, err
	}
	if offset < 0 || int(offset)+256 > vocab {
		return nil, fmt.Errorf("%w: byte offset %d does not fit a vocabulary of %d", ErrVocabMismatch, offset, vocab)
	}
	for name, id := range special {
		if id >= offset && id < offset+256 || id < 0 {
			return nil, fmt.Errorf("%w: special token %q at id %d collides with the bytes", ErrFormat, name, id)
		}
		if int(id) >= vocab {
			return nil, fmt.Errorf("%w: special token %q at id %d is outside a vocabulary of %d", ErrVocabMismatch, name, id, vocab)
		}
	}
	return &ByteLevel{Offset: offset, sp: newSpecials(special), vocab: vocab}, nil
}

// Encode implements Tokenizer.
func (t *ByteLevel) Encode(text string, allowSpecial bool) []int32 {
	out := make([]int32, 0, len(text))
	plain := func(s string) {
		for i := 0; i < len(s); i++ {
			out = append(out, t.Offset+int32(s[i]))
		}
	}
	if !allowSpecial {
		plain(text)
		return out
	}
	t.sp.split(text, plain, func(id int32) { out = append(out, id) })
	return out
}

// TokenBytes implements Tokenizer.
func (t *ByteLevel) TokenBytes(id int32) []byte {
	if id >= t.Offset && id < t.Offset+256 {
		return []byte{byte(id - t.Offset)}
	}
	if name, ok := t.sp.byID[id]; ok {
		return []byte(name)
	}
	return nil
}

// Special implements Tokenizer.
func (t *ByteLevel) Special(name string) (int32, bool) { id, ok := t.sp.byName[name]; return id, ok }

// IsSpecial implements Tokenizer.
func (t *ByteLevel) IsSpecial(id int32) bool { _, ok := t.sp.byID[id]; return ok }

// VocabSize implements Tokenizer.
func (t *ByteLevel) VocabSize() int { return t.vocab }

// Config is the part of tokenizer_config.json k3 reads.
type Config struct {
	TokenizerClass string `json:"tokenizer_class"`
	// ByteOffset is k3's own field for byte-level tokenizers.
	ByteOffset  *int32 `json:"byte_offset"`
	AddedTokens map[string]struct {
		Content string `json:"content"`
		Special bool   `json:"special"`
	} `json:"added_tokens_decoder"`
	ChatTemplate any `json:"chat_template"`
}

// ByteLevelClass is the tokenizer_class k3 writes for byte-level models.
const ByteLevelClass = "K3ByteLevelTokenizer"

// Load reads the tokenizer of a checkpoint directory: tiktoken.model with
// tokenizer_config.json, or a byte-level tokenizer_config.json. A directory
// with neither (nor a Hugging Face tokenizer.json, which is an error) gets
// a byte-level tokenizer with bytes at ids 3..258 (ids 0-2 left to pad, bos
// and eos), so the tiny test checkpoints can take text.
func Load(dir string, vocab int) (Tokenizer, error) { return LoadFS(os.DirFS(dir), dir, vocab) }

// LoadFS is Load reading from fsys; name is used in error messages.
func LoadFS(fsys fs.FS, name string, vocab int) (Tokenizer, error) {
	var cfg Config
	cfgPath := filepath.Join(name, "tokenizer_config.json")
	if b, err := fs.ReadFile(fsys, "tokenizer_config.json"); err == nil {
		if err := json.Unmarshal(b, &cfg); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrFormat, cfgPath, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	special := map[string]int32{}
	for idStr, tok := range cfg.AddedTokens {
		id, err := strconv.ParseInt(idStr, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: added token id %q", ErrFormat, cfgPath, idStr)
		}
		special[tok.Content] = int32(id)
	}
	rankPath := filepath.Join(name, "tiktoken.model")
	if f, err := fsys.Open("tiktoken.model"); err == nil {
		defer f.Close()
		ranks, err := ReadRanks(f, rankPath)
		if err != nil {
			return nil, err
		}
		t, err := NewBPE(ranks, special)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rankPath, err)
		}
		if t.VocabSize() > vocab {
			return nil, fmt.Errorf("%w: %s has ids up to %d, beyond the model's vocabulary of %d", ErrVocabMismatch, rankPath, t.VocabSize()-1, vocab)
		}
		return t, nil
	}
	if cfg.TokenizerClass != ByteLevelClass {
		// A Hugging Face tokenizer.json with no tiktoken.model beside it
		// would otherwise load as the byte-level fallback (ids that mean
		// other text than the checkpoint's, silently) or fail naming the
		// missing tiktoken.model alone.
		if _, err := fs.Stat(fsys, "tokenizer.json"); err == nil {
			return nil, fmt.Errorf("%w: %s: k3 reads tiktoken.model (with tokenizer_config.json), not a Hugging Face tokenizer.json, and tiktoken.model is missing", ErrFormat, filepath.Join(name, "tokenizer.json"))
		}
	}
	offset := int32(3)
	if cfg.ByteOffset != nil {
		offset = *cfg.ByteOffset
	}
	if cfg.TokenizerClass != "" && cfg.TokenizerClass != ByteLevelClass {
		return nil, fmt.Errorf("%w: %s: tokenizer_class %q needs tiktoken.model, which is missing", ErrFormat, cfgPath, cfg.TokenizerClass)
	}
	t, err := NewByteLevel(offset, special, vocab)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfgPath, err)
	}
	return t, nil
}

// checkSpecialNames rejects a special token with empty content: it would
// match at every position of every text.
func checkSpecialNames(special map[string]int32) error {
	if id, ok := special[""]; ok {
		return fmt.Errorf("%w: special token id %d has empty content", ErrFormat, id)
	}
	return nil
}
