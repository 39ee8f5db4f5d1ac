package serve

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"k3/internal/zmtp"
	"k3/k3"
)

// startKVEvents publishes m's KV-cache events at endpoint as vLLM's ZMQ
// publisher does (docs/SERVING.md): each subscribing connection gets its
// own stream, opening with the cache's full view.
func startKVEvents(m *k3.Model, endpoint, topic, name string, logf func(string, ...any)) (*zmtp.Publisher, error) {
	addr, bind, err := KVEventsEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	stop, err := m.WatchPrefixCache(func([]k3.KVEvent) {})
	if err != nil {
		return nil, fmt.Errorf("serve: KV events: %w (load it with k3.WithPrefixCache)", err)
	}
	stop()
	salt := fnv.New64a()
	salt.Write([]byte(name))
	cfg := zmtp.Config{Topic: topic, Logf: logf, Join: func(c *zmtp.Conn) func() {
		var seq uint64 // the watcher's calls are serialized by the cache's lock
		var enc kvEncoder
		enc.salt = salt.Sum64()
		stop, err := m.WatchPrefixCache(func(evs []k3.KVEvent) {
			payload := enc.batch(evs, time.Now())
			c.Send(binary.BigEndian.AppendUint64(nil, seq), payload)
			seq++
		})
		if err != nil {
			logf("serve: KV events for %v: %v", c.RemoteAddr(), err)
			return nil
		}
		logf("serve: KV events: %v subscribed", c.RemoteAddr())
		return stop
	}}
	if !bind {
		return zmtp.Dial(addr, cfg), nil
	}
	p, err := zmtp.Listen(addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("serve: KV events endpoint %q: %w", endpoint, err)
	}
	logf("serve: KV events published on tcp://%v, topic %q", p.Addr(), topic)
	return p, nil
}

// KVEventsEndpoint reads a ZeroMQ TCP endpoint (Config.KVEvents) the way
// vLLM's publisher does: one with "*" or "::" in it is listened on, any
// other is connected to. It returns the address for the net package.
func KVEventsEndpoint(endpoint string) (addr string, listen bool, err error) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return "", false, fmt.Errorf("serve: KV events endpoint %q: only tcp://HOST:PORT is supported", endpoint)
	}
	listen = strings.Contains(rest, "*") || strings.Contains(rest, "::")
	if listen {
		rest = strings.Replace(rest, "*", "", 1)
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		return "", false, fmt.Errorf("serve: KV events endpoint %q: %w", endpoint, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", false, fmt.Errorf("serve: KV events endpoint %q: invalid port %q", endpoint, port)
	}
	if !listen && host == "" {
		return "", false, fmt.Errorf("serve: KV events endpoint %q: no host to connect to (tcp://*:PORT listens)", endpoint)
	}
	return net.JoinHostPort(host, port), listen, nil
}

// kvEncoder writes vLLM's KVEventBatch in msgpack, as msgspec encodes its
// array-like structs and tagged unions with trailing defaults omitted:
// [ts, [event...], data-parallel rank], an event being ["BlockStored",
// [hash...], parent|nil, [token...], block size, lora_id, medium,
// lora_name], ["BlockRemoved", [hash...], medium] or ["AllBlocksCleared"],
// with nil for the LoRA fields and the medium. The field counts are
// vLLM's: llm-d's decoder (vmihailenco/msgpack's array-encoded structs)
// refuses any other.
type kvEncoder struct {
	salt uint64
	b    []byte
}

func (e *kvEncoder) batch(evs []k3.KVEvent, now time.Time) []byte {
	e.b = e.b[:0]
	e.array(3)
	e.b = append(e.b, 0xcb)
	e.b = binary.BigEndian.AppendUint64(e.b, math.Float64bits(float64(now.UnixNano())/1e9))
	e.array(len(evs))
	for _, ev := range evs {
		switch ev.Kind {
		case k3.BlockStored:
			e.array(8)
			e.str("BlockStored")
			e.hashes(ev.Hashes)
			if ev.Parent == 0 {
				e.b = append(e.b, 0xc0)
			} else {
				e.hash(ev.Parent)
			}
			e.array(len(ev.Tokens))
			for _, t := range ev.Tokens {
				e.uint(uint32(t))
			}
			e.uint(k3.PrefixBlock)
			e.b = append(e.b, 0xc0, 0xc0, 0xc0) // lora_id, medium, lora_name
		case k3.BlockRemoved:
			e.array(3)
			e.str("BlockRemoved")
			e.hashes(ev.Hashes)
			e.b = append(e.b, 0xc0) // medium
		default:
			e.array(1)
			e.str("AllBlocksCleared")
		}
	}
	e.uint(0) // the data-parallel rank: k3 serves one
	return append([]byte(nil), e.b...)
}

func (e *kvEncoder) array(n int) {
	switch {
	case n < 16:
		e.b = append(e.b, 0x90|byte(n))
	case n < 1<<16:
		e.b = append(e.b, 0xdc)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(n))
	default:
		e.b = append(e.b, 0xdd)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(n))
	}
}

func (e *kvEncoder) str(s string) { // the tags only: under 32 bytes
	e.b = append(e.b, 0xa0|byte(len(s)))
	e.b = append(e.b, s...)
}

func (e *kvEncoder) uint(v uint32) {
	switch {
	case v < 128:
		e.b = append(e.b, byte(v))
	case v < 1<<8:
		e.b = append(e.b, 0xcc, byte(v))
	case v < 1<<16:
		e.b = append(e.b, 0xcd)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(v))
	default:
		e.b = append(e.b, 0xce)
		e.b = binary.BigEndian.AppendUint32(e.b, v)
	}
}

func (e *kvEncoder) hashes(hs []uint64) {
	e.array(len(hs))
	for _, h := range hs {
		e.hash(h)
	}
}

// hash writes a block's hash mixed with the model's name, always as a
// msgpack uint64: llm-d reads hashes into interface values and takes
// only 64-bit integers (or bytes). The model's hashes are never 0, so
// mapping the one that mixes to 0 onto the salt keeps them apart.
func (e *kvEncoder) hash(h uint64) {
	h ^= e.salt
	if h == 0 {
		h = e.salt
	}
	e.b = append(e.b, 0xcf)
	e.b = binary.BigEndian.AppendUint64(e.b, h)
}
