package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// lockedBuffer is a strings.Builder safe for the server's goroutine to
// write while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServeDrains: k3 serve answers on the port it printed, and an
// interrupt lets a running stream finish before the command exits 0.
func TestServeDrains(t *testing.T) {
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	var stderr lockedBuffer
	exited := make(chan int, 1)
	go func() { exited <- run(ctx, []string{"serve", "-addr", "127.0.0.1:0"}, io.Discard, &stderr) }()
	addr := regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+`)
	var url string
	require.Eventually(t, func() bool {
		url = addr.FindString(stderr.String())
		return url != "" && strings.Contains(stderr.String(), "ready")
	}, 30*time.Second, 10*time.Millisecond, "stderr: %s", stderr.String())
	resp, err := http.Get(url + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)

	resp, err = http.Post(url+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt":"func","max_tokens":300,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	_, err = br.ReadString('\n')
	require.NoError(t, err)
	interrupt() // SIGINT, as far as the command can tell
	rest, err := io.ReadAll(br)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(string(rest), "data: [DONE]\n\n"), "the running stream was cut: %q", tail(string(rest)))
	assert.Contains(t, string(rest), `"completion_tokens":300`, "every token came")
	select {
	case code := <-exited:
		assert.Equal(t, 0, code, "stderr: %s", stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatal("k3 serve did not exit after the interrupt")
	}
	assert.Contains(t, stderr.String(), "shutting down")
	_, err = http.Get(url + "/health")
	assert.Error(t, err, "still listening after exit")
}

func tail(s string) string {
	if len(s) > 200 {
		return s[len(s)-200:]
	}
	return s
}

// TestServeFlags: bad flags are usage errors; a bad model directory fails
// with its name.
func TestServeFlags(t *testing.T) {
	code, _, errOut := runCLI("serve", "-nope")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "usage")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-memory-mb", "10", "-prefix-cache-mb", "20")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "-prefix-cache-mb")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-model", "/no/such/dir")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "/no/such/dir")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-speculate", "magic")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "-speculate")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-speculate", "ngram", "-draft-depth", "99")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "-draft-depth")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-speculate", "model:../../testdata/model/tiny_k3")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "k3 serve speculates with ngram")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-speculate", "self:0")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "self:0")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-speculate", "dspark", "-draft-depth", "2", "-model", "../../testdata/model/tiny_k31pro")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no DSpark draft module", "a checkpoint without one fails at start")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-kv-events", "tcp://*:5557", "-prefix-cache-mb", "0")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "-kv-events needs a prefix cache")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-kv-events", "ipc:///tmp/kv")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `"ipc:///tmp/kv"`)
	for _, bad := range [][]string{{"-sequences", "0"}, {"-sequences", "-3"}, {"-queue", "-1"}, {"-max-tokens", "0"},
		{"-max-body-kb", "0"}, {"-drain", "-1s"}, {"-session-idle", "0s"}} {
		code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", bad[0], bad[1])
		assert.Equal(t, 1, code, "%v", bad)
		assert.Contains(t, errOut, bad[0]+" "+bad[1]+": want", "%v", bad)
	}
	code, out, _ := runCLI("serve", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "-api-key")
}
