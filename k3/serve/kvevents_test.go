package serve

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"k3/k3"
)

// unpack decodes one msgpack value: the subset an event batch uses, read
// from the format's specification (not from the encoder). Integers come
// back as int64, except uint64 (0xcf), which comes back as uint64, the
// form llm-d requires of hashes.
func unpack(b []byte) (any, []byte, error) {
	if len(b) == 0 {
		return nil, nil, io.ErrUnexpectedEOF
	}
	c, b := b[0], b[1:]
	need := func(n int) ([]byte, []byte, error) {
		if len(b) < n {
			return nil, nil, io.ErrUnexpectedEOF
		}
		return b[:n], b[n:], nil
	}
	list := func(n int, b []byte) (any, []byte, error) {
		out := make([]any, n)
		for i := range out {
			var err error
			if out[i], b, err = unpack(b); err != nil {
				return nil, nil, err
			}
		}
		return out, b, nil
	}
	switch {
	case c < 0x80:
		return int64(c), b, nil
	case c&0xf0 == 0x90:
		return list(int(c&15), b)
	case c&0xe0 == 0xa0:
		s, rest, err := need(int(c & 31))
		return string(s), rest, err
	case c == 0xc0:
		return nil, b, nil
	case c == 0xcb:
		v, rest, err := need(8)
		if err != nil {
			return nil, nil, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(v)), rest, nil
	case c == 0xcc, c == 0xcd, c == 0xce:
		n := map[byte]int{0xcc: 1, 0xcd: 2, 0xce: 4}[c]
		v, rest, err := need(n)
		if err != nil {
			return nil, nil, err
		}
		var x uint64
		for _, d := range v {
			x = x<<8 | uint64(d)
		}
		return int64(x), rest, nil
	case c == 0xcf:
		v, rest, err := need(8)
		if err != nil {
			return nil, nil, err
		}
		return binary.BigEndian.Uint64(v), rest, nil
	case c == 0xdc:
		v, rest, err := need(2)
		if err != nil {
			return nil, nil, err
		}
		return list(int(binary.BigEndian.Uint16(v)), rest)
	case c == 0xdd:
		v, rest, err := need(4)
		if err != nil {
			return nil, nil, err
		}
		return list(int(binary.BigEndian.Uint32(v)), rest)
	}
	return nil, nil, fmt.Errorf("msgpack code %#x", c)
}

// kvReplica is an index of one server's blocks built from its messages,
// as llm-d builds one.
type kvReplica struct {
	mu       sync.Mutex
	topic    string
	seq      []uint64
	parent   map[uint64]uint64
	tokens   map[uint64][]int32
	messages int
	err      error
}

func (x *kvReplica) apply(topic string, seq []byte, payload []byte) {
	x.mu.Lock()
	defer x.mu.Unlock()
	fail := func(format string, a ...any) {
		if x.err == nil {
			x.err = fmt.Errorf(format, a...)
		}
	}
	x.messages++
	x.topic = topic
	x.seq = append(x.seq, binary.BigEndian.Uint64(seq))
	v, rest, err := unpack(payload)
	if err != nil || len(rest) > 0 {
		fail("payload: %v, %d bytes left", err, len(rest))
		return
	}
	batch, ok := v.([]any)
	if !ok || len(batch) != 3 || batch[2] != int64(0) {
		fail("batch %v", v)
		return
	}
	if ts, ok := batch[0].(float64); !ok || math.Abs(ts-float64(time.Now().Unix())) > 60 {
		fail("timestamp %v", batch[0])
	}
	for _, e := range batch[1].([]any) {
		ev := e.([]any)
		switch ev[0] {
		case "AllBlocksCleared":
			if len(ev) != 1 {
				fail("AllBlocksCleared %v", ev)
			}
			x.parent, x.tokens = map[uint64]uint64{}, map[uint64][]int32{}
		case "BlockStored":
			if len(ev) != 8 || ev[4] != int64(k3.PrefixBlock) || ev[5] != nil || ev[6] != nil || ev[7] != nil {
				fail("BlockStored %v", ev)
				continue
			}
			var parent uint64
			if ev[2] != nil {
				if parent, ok = ev[2].(uint64); !ok {
					fail("parent %T", ev[2])
				}
			}
			toks := ev[3].([]any)
			for i, h := range ev[1].([]any) {
				hash, ok := h.(uint64)
				if !ok {
					fail("hash %T (uint64 needed)", h)
					continue
				}
				if _, known := x.tokens[parent]; parent != 0 && !known {
					fail("parent %x unknown", parent)
				}
				var block []int32
				for _, t := range toks[i*k3.PrefixBlock : (i+1)*k3.PrefixBlock] {
					block = append(block, int32(t.(int64)))
				}
				x.parent[hash], x.tokens[hash] = parent, block
				parent = hash
			}
		case "BlockRemoved":
			if len(ev) != 3 || ev[2] != nil {
				fail("BlockRemoved %v", ev)
				continue
			}
			for _, h := range ev[1].([]any) {
				hash := h.(uint64)
				if _, ok := x.tokens[hash]; !ok {
					fail("removed %x unknown", hash)
				}
				delete(x.parent, hash)
				delete(x.tokens, hash)
			}
		default:
			fail("event %v", ev)
		}
	}
}

func (x *kvReplica) match(prompt []int32) int {
	x.mu.Lock()
	defer x.mu.Unlock()
	parent, n := uint64(0), 0
	for p := k3.PrefixBlock; p <= len(prompt); p += k3.PrefixBlock {
		next := uint64(0)
		for h, toks := range x.tokens {
			if x.parent[h] == parent && slices.Equal(toks, prompt[p-k3.PrefixBlock:p]) {
				next = h
			}
		}
		if next == 0 {
			break
		}
		parent, n = next, p
	}
	return n
}

// subscribe plays a libzmq SUB socket that binds (llm-d's central
// indexer): it accepts the server's connection, subscribes to "kv@" with
// ZMTP 3.0's message, and feeds the messages to x until the connection
// ends.
func subscribe(t *testing.T, ln net.Listener, x *kvReplica) {
	nc, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	ready := binary.BigEndian.AppendUint32([]byte("\x05READY\x0bSocket-Type"), 3)
	ready = append(ready, "SUB"...)
	out := append(g, 4, byte(len(ready)))
	out = append(out, ready...)
	out = append(out, 0, 4, 1, 'k', 'v', '@')
	_, err = nc.Write(out)
	require.NoError(t, err)
	r := bufio.NewReader(nc)
	_, err = io.ReadFull(r, g)
	require.NoError(t, err)
	frame := func() (byte, []byte, error) {
		flags, err := r.ReadByte()
		if err != nil {
			return 0, nil, err
		}
		var n uint64
		if flags&2 != 0 {
			var b [8]byte
			_, err = io.ReadFull(r, b[:])
			n = binary.BigEndian.Uint64(b[:])
		} else {
			var b byte
			b, err = r.ReadByte()
			n = uint64(b)
		}
		if err != nil {
			return 0, nil, err
		}
		body := make([]byte, n)
		_, err = io.ReadFull(r, body)
		return flags, body, err
	}
	_, _, err = frame() // READY
	require.NoError(t, err)
	go func() {
		for {
			var parts [][]byte
			for {
				flags, body, err := frame()
				if err != nil {
					return
				}
				parts = append(parts, body)
				if flags&1 == 0 {
					break
				}
			}
			if len(parts) != 3 || len(parts[1]) != 8 {
				x.mu.Lock()
				x.err = fmt.Errorf("a message of %d parts", len(parts))
				x.mu.Unlock()
				continue
			}
			x.apply(string(parts[0]), parts[1], parts[2])
		}
	}()
}

// TestKVEvents: a subscriber of the server's KV events (connected to, as
// llm-d's central indexer is) gets the full view, then every change, in
// vLLM's frames and msgpack shapes; its index, matched against a prompt
// by tokens as llm-d does, covers what the server resumes.
func TestKVEvents(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, hs, m := newTestServer(t, Config{KVEvents: "tcp://" + ln.Addr().String(), Logf: t.Logf})
	x := &kvReplica{}
	subscribe(t, ln, x)
	require.Eventually(t, func() bool { x.mu.Lock(); defer x.mu.Unlock(); return x.messages > 0 }, 10*time.Second, time.Millisecond)

	content := words(60)
	prompt := chatPrompt(m, content)
	body := map[string]any{"messages": []map[string]any{{"role": "user", "content": content}}, "max_tokens": 4, "temperature": 0}
	code, _ := post(t, hs.URL+"/v1/chat/completions", body)
	require.Equal(t, 200, code)
	require.Eventually(t, func() bool { return x.match(prompt) > 0 }, 10*time.Second, time.Millisecond, "the prompt's blocks were announced")

	code, out := post(t, hs.URL+"/v1/chat/completions", body)
	require.Equal(t, 200, code)
	cached := int(out["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64))
	assert.Positive(t, cached)
	assert.LessOrEqual(t, cached, x.match(prompt), "the server resumed past its announced blocks")

	// A prompt that parts from the first one announces its own blocks
	// under the ones they share.
	content2 := content + words(40)[:100]
	prompt2 := chatPrompt(m, content2)
	shared := 0
	for shared < min(len(prompt), len(prompt2)) && prompt[shared] == prompt2[shared] {
		shared++
	}
	body["messages"] = []map[string]any{{"role": "user", "content": content2}}
	code, _ = post(t, hs.URL+"/v1/chat/completions", body)
	require.Equal(t, 200, code)
	require.Eventually(t, func() bool { return x.match(prompt2) > shared }, 10*time.Second, time.Millisecond,
		"the branch was announced under the shared blocks")

	met := scrape(t, hs.URL)
	assert.Equal(t, 1.0, met["k3:kv_events_subscribers"])
	x.mu.Lock()
	defer x.mu.Unlock()
	assert.GreaterOrEqual(t, met["k3:kv_events_messages_total"], float64(x.messages))
	assert.Zero(t, met["k3:kv_events_laggards_total"])
	require.NoError(t, x.err)
	host, _ := os.Hostname()
	assert.Equal(t, "kv@"+host+"@k3", x.topic)
	for i, s := range x.seq {
		require.Equal(t, uint64(i), s, "sequence numbers count from 0")
	}
}

func words(n int) string {
	s := ""
	for i := range n {
		s += fmt.Sprintf("w%d ", (i*7919)%997)
	}
	return s
}

// TestKVEventsConfig: endpoints k3 cannot publish on and models without a
// prefix cache are refused by name.
func TestKVEventsConfig(t *testing.T) {
	for _, tc := range []struct{ endpoint, want string }{
		{"ipc:///tmp/kv", "only tcp://"},
		{"tcp://:5557", "no host"},
		{"tcp://host", "missing port"},
		{"tcp://*:99999", "invalid port"},
	} {
		_, _, err := KVEventsEndpoint(tc.endpoint)
		require.Error(t, err, tc.endpoint)
		assert.ErrorContains(t, err, tc.want, tc.endpoint)
	}
	for _, tc := range []struct {
		endpoint, addr string
		bind           bool
	}{
		{"tcp://*:5557", ":5557", true},
		{"tcp://[::]:5557", "[::]:5557", true},
		{"tcp://indexer:5557", "indexer:5557", false},
		{"tcp://10.0.0.2:5557", "10.0.0.2:5557", false},
	} {
		addr, bind, err := KVEventsEndpoint(tc.endpoint)
		require.NoError(t, err, tc.endpoint)
		assert.Equal(t, tc.addr, addr, tc.endpoint)
		assert.Equal(t, tc.bind, bind, tc.endpoint)
	}
	m, err := k3.LoadTiny(context.Background())
	require.NoError(t, err)
	defer m.Close()
	_, err = New(m, Config{KVEvents: "tcp://127.0.0.1:5557"})
	require.ErrorIs(t, err, k3.ErrNoPrefixCache)
}

// The shapes llm-d's vLLM adapter decodes with vmihailenco/msgpack
// (array-encoded structs, which refuse any other field count).
type llmdBatch struct {
	_      struct{} `msgpack:",array"`
	TS     float64
	Events []msgpack.RawMessage
	Rank   *int `msgpack:",omitempty"`
}

type llmdStored struct {
	_           struct{} `msgpack:",array"`
	Tag         string
	BlockHashes []any
	Parent      any
	TokenIDs    []uint32
	BlockSize   int
	LoraID      *int    `msgpack:",omitempty"`
	Medium      *string `msgpack:",omitempty"`
	LoraName    *string `msgpack:",omitempty"`
}

type llmdRemoved struct {
	_           struct{} `msgpack:",array"`
	Tag         string
	BlockHashes []any
	Medium      *string `msgpack:",omitempty"`
}

// TestKVEncoderLLMD: a batch of each event kind decodes with the
// library and struct shapes llm-d uses, hashes as uint64, values intact.
func TestKVEncoderLLMD(t *testing.T) {
	toks := make([]int32, 2*k3.PrefixBlock)
	for i := range toks {
		toks[i] = int32(i * 4099) // past one, two and three bytes
	}
	evs := []k3.KVEvent{
		{Kind: k3.AllBlocksCleared},
		{Kind: k3.BlockStored, Hashes: []uint64{5, 1 << 63}, Tokens: toks},
		{Kind: k3.BlockStored, Hashes: []uint64{9}, Parent: 1 << 63, Tokens: toks[:k3.PrefixBlock]},
		{Kind: k3.BlockRemoved, Hashes: []uint64{9, 5}},
	}
	enc := kvEncoder{salt: 0x0123456789abcdef}
	now := time.Unix(1796471953, 500_000_000)
	var b llmdBatch
	require.NoError(t, msgpack.Unmarshal(enc.batch(evs, now), &b))
	assert.InDelta(t, 1796471953.5, b.TS, 1e-6)
	require.NotNil(t, b.Rank)
	assert.Equal(t, 0, *b.Rank)
	require.Len(t, b.Events, 4)
	mixed := func(h uint64) uint64 { return h ^ enc.salt }

	var tags []any
	require.NoError(t, msgpack.Unmarshal(b.Events[0], &tags))
	assert.Equal(t, []any{"AllBlocksCleared"}, tags)

	var s llmdStored
	require.NoError(t, msgpack.Unmarshal(b.Events[1], &s))
	assert.Equal(t, "BlockStored", s.Tag)
	assert.Equal(t, []any{mixed(5), mixed(1 << 63)}, s.BlockHashes, "uint64 hashes")
	assert.Nil(t, s.Parent)
	want := make([]uint32, len(toks))
	for i, x := range toks {
		want[i] = uint32(x)
	}
	assert.Equal(t, want, s.TokenIDs)
	assert.Equal(t, k3.PrefixBlock, s.BlockSize)
	assert.Nil(t, s.LoraID)
	assert.Nil(t, s.Medium)
	assert.Nil(t, s.LoraName)
	var s2 llmdStored // a fresh value, as llm-d decodes each event
	require.NoError(t, msgpack.Unmarshal(b.Events[2], &s2))
	assert.Equal(t, mixed(1<<63), s2.Parent)

	var r llmdRemoved
	require.NoError(t, msgpack.Unmarshal(b.Events[3], &r))
	assert.Equal(t, "BlockRemoved", r.Tag)
	assert.Equal(t, []any{mixed(9), mixed(5)}, r.BlockHashes)
	assert.Nil(t, r.Medium)

	// The hash that would mix to 0, the root's parent, takes the salt,
	// which no hash mixes to (the model's hashes are never 0).
	enc.b = enc.b[:0]
	enc.hash(enc.salt)
	assert.Equal(t, enc.salt, binary.BigEndian.Uint64(enc.b[1:]))
}
