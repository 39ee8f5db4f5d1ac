package zmtp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sub is a subscriber written from RFC 37 for the tests: it sends frames
// byte by byte as the RFC lays them out, independently of the package's
// writer.
type sub struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func frame(flags byte, body []byte) []byte {
	if len(body) > 255 {
		b := []byte{flags | 2, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(b[1:], uint64(len(body)))
		return append(b, body...)
	}
	return append([]byte{flags, byte(len(body))}, body...)
}

func ready(socketType string) []byte {
	b := []byte("\x05READY\x0bSocket-Type")
	b = binary.BigEndian.AppendUint32(b, uint32(len(socketType)))
	return frame(4, append(b, socketType...))
}

func subGreeting(minor byte) []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, minor
	copy(g[12:], "NULL")
	return g
}

func newSub(t *testing.T, nc net.Conn, socketType string, minor byte) *sub {
	t.Helper()
	s := &sub{t: t, nc: nc, r: bufio.NewReader(nc)}
	s.send(append(subGreeting(minor), ready(socketType)...))
	var g [64]byte
	_, err := io.ReadFull(s.r, g[:])
	require.NoError(t, err)
	require.Equal(t, byte(0xff), g[0])
	require.Equal(t, byte(0x7f), g[9])
	require.Equal(t, []byte{3, 1}, g[10:12], "ZMTP 3.1")
	require.Equal(t, "NULL", string(bytes.TrimRight(g[12:32], "\x00")))
	flags, body := s.frame()
	require.Equal(t, byte(4), flags, "READY is a command")
	require.Equal(t, "\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB", string(body))
	return s
}

func (s *sub) send(b []byte) {
	s.t.Helper()
	_, err := s.nc.Write(b)
	require.NoError(s.t, err)
}

func (s *sub) frame() (byte, []byte) {
	s.t.Helper()
	s.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	flags, err := s.r.ReadByte()
	require.NoError(s.t, err)
	var n uint64
	if flags&2 != 0 {
		var b [8]byte
		_, err = io.ReadFull(s.r, b[:])
		n = binary.BigEndian.Uint64(b[:])
	} else {
		var b byte
		b, err = s.r.ReadByte()
		n = uint64(b)
	}
	require.NoError(s.t, err)
	body := make([]byte, n)
	_, err = io.ReadFull(s.r, body)
	require.NoError(s.t, err)
	return flags, body
}

func (s *sub) message() [][]byte {
	s.t.Helper()
	var parts [][]byte
	for {
		flags, body := s.frame()
		require.Zero(s.t, flags&4, "a command inside the stream of messages")
		parts = append(parts, body)
		if flags&1 == 0 {
			return parts
		}
	}
}

// closed reports whether the publisher closed the connection.
func (s *sub) closed() bool {
	s.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := s.r.ReadByte()
	return err != nil
}

// recorder is a Config.Join that sends a greeting message to each joining
// connection and records joins and leaves.
type recorder struct {
	mu     sync.Mutex
	conns  []*Conn
	joins  int
	leaves chan struct{}
}

func (r *recorder) join(c *Conn) func() {
	r.mu.Lock()
	r.conns = append(r.conns, c)
	r.joins++
	r.mu.Unlock()
	c.Send([]byte("hello"))
	return func() { r.leaves <- struct{}{} }
}

func (r *recorder) sendAll(frames ...[]byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.Send(frames...)
	}
}

func listen(t *testing.T, topic string, queue int) (*Publisher, *recorder) {
	t.Helper()
	rec := &recorder{leaves: make(chan struct{}, 16)}
	p, err := Listen("127.0.0.1:0", Config{Topic: topic, Join: rec.join, Queue: queue, Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p, rec
}

func connect(t *testing.T, p *Publisher) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", p.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	return nc
}

func waitJoins(t *testing.T, rec *recorder, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.joins >= n
	}, 10*time.Second, time.Millisecond)
}

// TestSubscribeForms: a ZMTP 3.0 subscription message and a 3.1
// SUBSCRIBE command both join; messages carry the topic and frames in
// order, long frames included; a subscription that is not a prefix of
// the topic does not join; CANCEL leaves.
func TestSubscribeForms(t *testing.T) {
	p, rec := listen(t, "kv@pod@model", 0)

	a := newSub(t, connect(t, p), "SUB", 0)
	a.send(frame(0, []byte("\x01kv@other"))) // no prefix of the topic
	a.send(frame(0, []byte("\x01kv@")))
	b := newSub(t, connect(t, p), "XSUB", 1)
	b.send(frame(4, []byte("\x09SUBSCRIBE"))) // the empty prefix: everything
	waitJoins(t, rec, 2)

	long := bytes.Repeat([]byte{7}, 300)
	rec.sendAll([]byte{1, 2}, long)
	for _, s := range []*sub{a, b} {
		assert.Equal(t, [][]byte{[]byte("kv@pod@model"), []byte("hello")}, s.message())
		assert.Equal(t, [][]byte{[]byte("kv@pod@model"), {1, 2}, long}, s.message())
	}
	assert.Equal(t, 2, rec.joins, "the foreign subscription joined nobody")
	st := p.Stats()
	assert.Equal(t, int64(2), st.Subscribers)
	assert.Equal(t, uint64(4), st.Sent, "two messages to each")

	b.send(frame(4, []byte("\x06CANCEL")))
	select {
	case <-rec.leaves:
	case <-time.After(10 * time.Second):
		t.Fatal("CANCEL did not leave")
	}
	a.send(frame(0, []byte("\x00kv@"))) // 3.0's unsubscribe
	select {
	case <-rec.leaves:
	case <-time.After(10 * time.Second):
		t.Fatal("the unsubscribe message did not leave")
	}
	require.Eventually(t, func() bool { return p.Stats().Subscribers == 0 }, 10*time.Second, time.Millisecond)
	// Subscribing again joins again (and gets a fresh greeting).
	a.send(frame(0, []byte("\x01kv")))
	waitJoins(t, rec, 3)
	assert.Equal(t, [][]byte{[]byte("kv@pod@model"), []byte("hello")}, a.message())
}

// TestPing: PING is answered with PONG carrying its context.
func TestPing(t *testing.T) {
	p, _ := listen(t, "t", 0)
	s := newSub(t, connect(t, p), "SUB", 1)
	s.send(frame(4, []byte("\x04PING\x00\x0actx")))
	flags, body := s.frame()
	assert.Equal(t, byte(4), flags)
	assert.Equal(t, "\x04PONGctx", string(body))
}

// TestSlowSubscriber: a subscriber whose queue fills is disconnected,
// and leaves; Send then reports false.
func TestSlowSubscriber(t *testing.T) {
	p, rec := listen(t, "t", 4)
	s := newSub(t, connect(t, p), "SUB", 0)
	s.send(frame(0, []byte("\x01")))
	waitJoins(t, rec, 1)
	big := make([]byte, 1<<20)
	ok := true
	for i := 0; i < 1000 && ok; i++ { // the subscriber reads nothing
		rec.mu.Lock()
		ok = rec.conns[0].Send(big)
		rec.mu.Unlock()
	}
	assert.False(t, ok, "the queue never filled")
	select {
	case <-rec.leaves:
	case <-time.After(10 * time.Second):
		t.Fatal("no leave")
	}
	assert.Equal(t, uint64(1), p.Stats().Laggards)
	require.Eventually(t, func() bool { return p.Stats().Subscribers == 0 }, 10*time.Second, time.Millisecond)
}

// TestBadPeers: peers that break the protocol are closed without a join.
func TestBadPeers(t *testing.T) {
	p, rec := listen(t, "t", 0)
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"a PUB peer", append(subGreeting(1), ready("PUB")...)},
		{"no READY", append(subGreeting(1), frame(4, []byte("\x09SUBSCRIBE"))...)},
		{"ZMTP 2", append([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 1}, make([]byte, 53)...)},
		{"not ZMTP", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + string(make([]byte, 40)))},
		{"PLAIN", func() []byte { g := subGreeting(1); copy(g[12:32], "PLAIN\x00"); return g }()},
		{"reserved flags", append(subGreeting(1), 0x40, 0)},
		{"a huge frame", append(append(subGreeting(1), ready("SUB")...), 0x02, 0, 0, 0, 0, 0x7f, 0, 0, 0)},
		{"a short command", append(append(subGreeting(1), ready("SUB")...), frame(4, []byte("\x09SUB"))...)},
		{"an unknown command", append(append(subGreeting(1), ready("SUB")...), frame(4, []byte("\x03FOO"))...)},
		{"a bad property", append(subGreeting(1), frame(4, []byte("\x05READY\x0bSocket-Type\xff\xff\xff\xffSUB"))...)},
	} {
		nc := connect(t, p)
		_, err := nc.Write(tc.send)
		require.NoError(t, err, tc.name)
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = io.Copy(io.Discard, nc) // until the publisher closes
		assert.NoError(t, err, "%s: the publisher did not close the connection", tc.name)
	}
	assert.Zero(t, rec.joins)
}

// TestDial: a Dial publisher connects to a subscriber that binds, and
// connects again after the subscriber drops the connection.
func TestDial(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	rec := &recorder{leaves: make(chan struct{}, 16)}
	p := Dial(ln.Addr().String(), Config{Topic: "kv@x@y", Join: rec.join, Logf: t.Logf})
	for round := range 2 {
		nc, err := ln.Accept()
		require.NoError(t, err)
		s := newSub(t, nc, "SUB", 1)
		s.send(frame(4, []byte("\x09SUBSCRIBEkv@")))
		assert.Equal(t, [][]byte{[]byte("kv@x@y"), []byte("hello")}, s.message(), "round %d", round)
		nc.Close()
		select {
		case <-rec.leaves:
		case <-time.After(10 * time.Second):
			t.Fatal("no leave")
		}
	}
	require.NoError(t, p.Close())
}

// TestClose: Close ends every connection and runs the leaves.
func TestClose(t *testing.T) {
	p, rec := listen(t, "t", 0)
	s := newSub(t, connect(t, p), "SUB", 1)
	s.send(frame(0, []byte("\x01t")))
	waitJoins(t, rec, 1)
	s.message() // the greeting Join sent
	require.NoError(t, p.Close())
	assert.Len(t, rec.leaves, 1, "leave ran before Close returned")
	assert.True(t, s.closed())
	require.NoError(t, p.Close(), "a second Close")
}

// FuzzPeer: whatever a subscriber sends, the publisher neither panics
// nor hangs: the handshake and the subscription reader end in an error
// or at the end of the input.
func FuzzPeer(f *testing.F) {
	ok := append(subGreeting(1), ready("SUB")...)
	f.Add(ok)
	f.Add(append(ok, frame(0, []byte("\x01kv"))...))
	f.Add(append(ok, frame(4, []byte("\x09SUBSCRIBEkv"))...))
	f.Add(append(ok, frame(4, []byte("\x04PING\x00\x01ab"))...))
	f.Add(append(ok, frame(1, []byte("x"))...))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReader(bytes.NewReader(in))
		if err := handshake(r); err != nil {
			return
		}
		joins := 0
		err := readSubscriptions(r, "kv@a@b", func(j bool) {
			if j {
				joins++
			}
		}, func(ctx []byte) {
			if len(ctx) > 16 {
				t.Fatalf("a PING context of %d bytes", len(ctx))
			}
		})
		if err == nil {
			t.Fatal("the reader returned without an error")
		}
		_ = fmt.Sprint(joins)
	})
}
