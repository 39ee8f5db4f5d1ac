// Package zmtp is the publishing end of ZeroMQ's wire protocol (ZMTP 3.1,
// RFC 37, with the NULL security mechanism) over TCP: a PUB socket that
// libzmq SUB and XSUB sockets subscribe to, either by connecting to it
// (Listen) or by binding where it connects (Dial).
//
// Unlike libzmq's PUB, which drops messages for a subscriber that falls
// behind, a Publisher closes that subscriber's connection, and each
// connection is handed to the caller when it subscribes (Config.Join), so
// the caller can start it from a full view of whatever state the messages
// describe.
package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MaxFrame bounds a frame a subscriber may send (its subscriptions and
// commands are short); a larger one closes the connection.
const MaxFrame = 1 << 20

// ErrPeer reports a peer that broke the protocol.
var ErrPeer = errors.New("zmtp: peer broke the protocol")

// Config says what a Publisher publishes.
type Config struct {
	// Topic is the first frame of every message. A connection joins
	// when one of its subscriptions is a prefix of it.
	Topic string
	// Join is called when a connection joins; the messages it is sent
	// with Conn.Send from then on reach the subscriber in order. leave
	// is called once when the connection stops matching or closes
	// (leave may be nil). Both are called from the connection's own
	// goroutine.
	Join func(c *Conn) (leave func())
	// Queue is the number of messages a connection may have waiting
	// (default 1024); past it the connection is closed.
	Queue int
	// Logf, when set, reports connections and their errors.
	Logf func(format string, args ...any)
}

// A Publisher is a PUB socket: its subscribers' connections.
type Publisher struct {
	cfg    Config
	topic  []byte       // cfg.Topic, every message's first frame
	ln     net.Listener // Listen's; nil for Dial
	mu     sync.Mutex
	conns  map[*Conn]bool
	closed bool
	done   chan struct{}
	wg     sync.WaitGroup

	joined         atomic.Int64 // connections that joined and have not left
	sent, laggards atomic.Uint64
}

// Stats are a Publisher's counters.
type Stats struct {
	Subscribers int64  // connections joined now
	Sent        uint64 // messages written
	Laggards    uint64 // connections closed for falling Config.Queue messages behind
}

// Stats returns the Publisher's counters.
func (p *Publisher) Stats() Stats {
	return Stats{Subscribers: p.joined.Load(), Sent: p.sent.Load(), Laggards: p.laggards.Load()}
}

// maxConns bounds a listening Publisher's subscribers.
const maxConns = 64

// Listen binds addr (host:port) and publishes to the subscribers that
// connect.
func Listen(addr string, cfg Config) (*Publisher, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: %w", err)
	}
	p := newPublisher(cfg)
	p.ln = ln
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Dial publishes to a subscriber that binds addr (host:port), connecting
// in the background and again, after a pause, whenever the connection
// ends, until Close.
func Dial(addr string, cfg Config) *Publisher {
	p := newPublisher(cfg)
	p.wg.Add(1)
	go p.dial(addr)
	return p
}

func newPublisher(cfg Config) *Publisher {
	if cfg.Queue <= 0 {
		cfg.Queue = 1024
	}
	return &Publisher{cfg: cfg, topic: []byte(cfg.Topic), conns: map[*Conn]bool{}, done: make(chan struct{})}
}

// Addr is the address a listening Publisher accepts on (nil for Dial).
func (p *Publisher) Addr() net.Addr {
	if p.ln == nil {
		return nil
	}
	return p.ln.Addr()
}

// Close closes every connection and stops listening or dialling; the
// connections' leave functions have run when it returns.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	for c := range p.conns {
		c.nc.Close()
	}
	p.mu.Unlock()
	var err error
	if p.ln != nil {
		err = p.ln.Close()
	}
	p.wg.Wait()
	return err
}

func (p *Publisher) logf(format string, args ...any) {
	if p.cfg.Logf != nil {
		p.cfg.Logf(format, args...)
	}
}

func (p *Publisher) accept() {
	defer p.wg.Done()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			select {
			case <-p.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: the subscribers come back.
			p.logf("zmtp: accept: %v", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		p.mu.Lock()
		full := len(p.conns) >= maxConns
		p.mu.Unlock()
		if full {
			p.logf("zmtp: %v refused: %d subscribers already", nc.RemoteAddr(), maxConns)
			nc.Close()
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(nc)
		}()
	}
}

func (p *Publisher) dial(addr string) {
	defer p.wg.Done()
	pause := 100 * time.Millisecond
	for {
		d := net.Dialer{Timeout: 5 * time.Second}
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-p.done: // Close does not wait out a dial
				cancel()
			case <-ctx.Done():
			}
		}()
		nc, err := d.DialContext(ctx, "tcp", addr)
		cancel()
		if err == nil {
			start := time.Now()
			p.serve(nc)
			if time.Since(start) > 10*time.Second {
				pause = 100 * time.Millisecond
			}
		} else {
			p.logf("zmtp: dial %s: %v", addr, err)
		}
		select {
		case <-p.done:
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
}

// A Conn is one subscriber's connection.
type Conn struct {
	p     *Publisher
	nc    net.Conn
	queue chan [][]byte
	pong  chan []byte
	once  sync.Once
	gone  chan struct{}
}

// Send queues a message of the topic frame and frames for the subscriber
// without waiting. When the queue is full the connection is closed (the
// subscriber would otherwise miss messages) and Send reports false; so
// it does once the connection has closed.
func (c *Conn) Send(frames ...[]byte) bool {
	select {
	case <-c.gone:
		return false
	default:
	}
	select {
	case c.queue <- frames:
		return true
	default:
		c.p.logf("zmtp: %v fell %d messages behind; closing it", c.nc.RemoteAddr(), cap(c.queue))
		c.p.laggards.Add(1)
		c.close()
		return false
	}
}

// RemoteAddr is the subscriber's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

func (c *Conn) close() {
	c.once.Do(func() {
		close(c.gone)
		c.nc.Close()
	})
}

// serve runs one connection: the handshake, then a writer goroutine for
// the queue while this one reads subscriptions and pings.
func (p *Publisher) serve(nc net.Conn) {
	c := &Conn{p: p, nc: nc, queue: make(chan [][]byte, p.cfg.Queue), pong: make(chan []byte, 4), gone: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		nc.Close()
		return
	}
	p.conns[c] = true
	p.mu.Unlock()
	defer func() {
		c.close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()

	nc.SetDeadline(time.Now().Add(10 * time.Second))
	w := bufio.NewWriter(nc)
	w.Write(greeting())
	writeFrame(w, 4, readyCommand())
	if err := w.Flush(); err != nil {
		p.logf("zmtp: %v: %v", nc.RemoteAddr(), err)
		return
	}
	r := bufio.NewReader(nc)
	if err := handshake(r); err != nil {
		p.logf("zmtp: %v: %v", nc.RemoteAddr(), err)
		return
	}
	nc.SetDeadline(time.Time{})

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.write(w)
	}()
	var leave func()
	matching := false
	err := readSubscriptions(r, p.cfg.Topic, func(joined bool) {
		matching = joined
		if joined {
			p.joined.Add(1)
		} else {
			p.joined.Add(-1)
		}
		switch {
		case joined && p.cfg.Join != nil:
			leave = p.cfg.Join(c)
		case !joined && leave != nil:
			leave()
			leave = nil
		}
	}, func(ctx []byte) {
		select {
		case c.pong <- ctx:
		default: // pings beyond a few unanswered ones are dropped
		}
	})
	if matching {
		p.joined.Add(-1)
	}
	if leave != nil {
		leave()
	}
	c.close()
	wg.Wait()
	if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
		p.logf("zmtp: %v: %v", nc.RemoteAddr(), err)
	}
}

func (c *Conn) write(w *bufio.Writer) {
	for {
		select {
		case <-c.gone:
			return
		case msg := <-c.queue:
			writeMessage(w, c.p.topic, msg)
			n := uint64(1)
			// More queued messages go out in the same flush.
			for len(c.queue) > 0 {
				writeMessage(w, c.p.topic, <-c.queue)
				n++
			}
			c.p.sent.Add(n)
		case ctx := <-c.pong:
			writeFrame(w, 4, append([]byte("\x04PONG"), ctx...))
		}
		// The writer's errors are sticky: Flush reports any.
		if err := w.Flush(); err != nil {
			c.close()
			return
		}
	}
}

// greeting is ZMTP 3.1's: signature, version 3.1, mechanism NULL, not
// as-server, filler.
func greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 1
	copy(g[12:32], "NULL")
	return g
}

func readyCommand() []byte {
	var b bytes.Buffer
	b.WriteString("\x05READY")
	b.WriteByte(byte(len("Socket-Type")))
	b.WriteString("Socket-Type")
	binary.Write(&b, binary.BigEndian, uint32(len("PUB")))
	b.WriteString("PUB")
	return b.Bytes()
}

// handshake reads the subscriber's greeting and READY command.
func handshake(r *bufio.Reader) error {
	var g [64]byte
	if _, err := io.ReadFull(r, g[:]); err != nil {
		return fmt.Errorf("greeting: %w", err)
	}
	if g[0] != 0xff || g[9]&1 == 0 {
		return fmt.Errorf("%w: not a ZMTP greeting (% x)", ErrPeer, g[:10])
	}
	if g[10] < 3 {
		return fmt.Errorf("%w: ZMTP version %d.%d (3 or later needed)", ErrPeer, g[10], g[11])
	}
	if mech := string(bytes.TrimRight(g[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("%w: security mechanism %q (NULL only)", ErrPeer, mech)
	}
	flags, body, err := readFrame(r)
	if err != nil {
		return fmt.Errorf("READY: %w", err)
	}
	name, data, err := command(flags, body)
	if err != nil {
		return err
	}
	if name == "ERROR" {
		return fmt.Errorf("%w: ERROR %q", ErrPeer, data)
	}
	if name != "READY" {
		return fmt.Errorf("%w: command %q before READY", ErrPeer, name)
	}
	props, err := properties(data)
	if err != nil {
		return err
	}
	if st := props["socket-type"]; st != "SUB" && st != "XSUB" {
		return fmt.Errorf("%w: socket type %q cannot subscribe to PUB", ErrPeer, st)
	}
	return nil
}

// readFrame reads one frame: flags (MORE 1, LONG 2, COMMAND 4), size,
// body.
func readFrame(r *bufio.Reader) (flags byte, body []byte, err error) {
	flags, err = r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	if flags&^7 != 0 {
		return 0, nil, fmt.Errorf("%w: frame flags %#x", ErrPeer, flags)
	}
	var size uint64
	if flags&2 != 0 {
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, unexpected(err)
		}
		size = binary.BigEndian.Uint64(b[:])
	} else {
		b, err := r.ReadByte()
		if err != nil {
			return 0, nil, unexpected(err)
		}
		size = uint64(b)
	}
	if size > MaxFrame {
		return 0, nil, fmt.Errorf("%w: a frame of %d bytes (at most %d)", ErrPeer, size, MaxFrame)
	}
	body = make([]byte, size)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, unexpected(err)
	}
	return flags, body, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// command splits a command frame into its name and data.
func command(flags byte, body []byte) (name string, data []byte, err error) {
	if flags&4 == 0 || flags&1 != 0 {
		return "", nil, fmt.Errorf("%w: a message where a command was due", ErrPeer)
	}
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, fmt.Errorf("%w: command name runs past its frame", ErrPeer)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// properties parses READY's metadata; names are case-insensitive.
func properties(b []byte) (map[string]string, error) {
	props := map[string]string{}
	for len(b) > 0 {
		n := int(b[0])
		if 1+n+4 > len(b) {
			return nil, fmt.Errorf("%w: READY property runs past its frame", ErrPeer)
		}
		name := strings.ToLower(string(b[1 : 1+n]))
		v := binary.BigEndian.Uint32(b[1+n:])
		b = b[1+n+4:]
		if uint64(v) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: READY property %q runs past its frame", ErrPeer, name)
		}
		props[name] = string(b[:v])
		b = b[v:]
	}
	return props, nil
}

// readSubscriptions reads the subscriber's frames until an error,
// calling match when whether any subscription is a prefix of topic
// changes, and ping with each PING's context.
func readSubscriptions(r *bufio.Reader, topic string, match func(bool), ping func([]byte)) error {
	var subs []string
	matching := false
	more := false // inside a multipart message, whose frames are not subscriptions
	for {
		flags, body, err := readFrame(r)
		if err != nil {
			return err
		}
		if flags&4 != 0 {
			if more {
				return fmt.Errorf("%w: a command inside a message", ErrPeer)
			}
			name, data, err := command(flags, body)
			if err != nil {
				return err
			}
			switch name {
			case "SUBSCRIBE":
				subs = append(subs, string(data))
			case "CANCEL":
				if i := indexOf(subs, string(data)); i >= 0 {
					subs = append(subs[:i], subs[i+1:]...)
				}
			case "PING":
				if len(data) < 2 || len(data) > 2+16 {
					return fmt.Errorf("%w: PING of %d bytes", ErrPeer, len(data))
				}
				ping(bytes.Clone(data[2:]))
			case "PONG":
			case "ERROR":
				return fmt.Errorf("%w: ERROR %q", ErrPeer, data)
			default:
				return fmt.Errorf("%w: command %q", ErrPeer, name)
			}
		} else {
			// ZMTP 3.0's subscriptions: a one-frame message, 1 or 0 then
			// the prefix. Other messages are ignored, as libzmq's PUB does.
			if !more && flags&1 == 0 && len(body) > 0 {
				switch body[0] {
				case 1:
					subs = append(subs, string(body[1:]))
				case 0:
					if i := indexOf(subs, string(body[1:])); i >= 0 {
						subs = append(subs[:i], subs[i+1:]...)
					}
				}
			}
			more = flags&1 != 0
		}
		now := false
		for _, s := range subs {
			if strings.HasPrefix(topic, s) {
				now = true
				break
			}
		}
		if now != matching {
			matching = now
			match(now)
		}
	}
}

func indexOf(subs []string, s string) int {
	for i, x := range subs {
		if x == s {
			return i
		}
	}
	return -1
}

// writeMessage writes the topic and frames as one message.
func writeMessage(w *bufio.Writer, topic []byte, frames [][]byte) {
	flags := byte(0)
	if len(frames) > 0 {
		flags = 1
	}
	writeFrame(w, flags, topic)
	for i, f := range frames {
		flags = 0
		if i < len(frames)-1 {
			flags = 1
		}
		writeFrame(w, flags, f)
	}
}

func writeFrame(w *bufio.Writer, flags byte, body []byte) {
	if len(body) > 255 {
		w.WriteByte(flags | 2)
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(len(body)))
		w.Write(b[:])
	} else {
		w.WriteByte(flags)
		w.WriteByte(byte(len(body)))
	}
	w.Write(body)
}
