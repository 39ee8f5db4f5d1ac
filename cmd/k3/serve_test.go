package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
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
	assert.Contains(t, errOut, "-speculate model:../../testdata/model/tiny_k3: the draft model scores 512 tokens, the target 4096")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-speculate", "model:/no/such/dir")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "-speculate model:/no/such/dir")
	code, _, errOut = runCLI("serve", "-addr", "127.0.0.1:0", "-speculate", "model:")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `-speculate "model:"`)
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
	const split = "../../testdata/model/tiny_k31pro"
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-tp", "2"}, "give -model DIR"},
		{[]string{"-model", split, "-tp", "2", "-prefix-cache-mb", "64"}, "keeps no prefix cache"},
		{[]string{"-model", split, "-ep", "2", "-speculate", "ngram"}, "give a fixed -draft-depth K"},
		{[]string{"-model", split, "-ep", "2", "-speculate", "dspark", "-draft-depth", "2"}, "ngram or model:DIR only"},
		{[]string{"-model", split, "-tp", "2", "-kv-events", "tcp://*:5557"}, "-kv-events with -tp"},
		{[]string{"-model", split, "-tp", "2", "-ep", "3"}, "layout tp2 ep3: 2 does not divide 3"},
	} {
		code, _, errOut = runCLI(append([]string{"serve", "-addr", "127.0.0.1:0"}, c.args...)...)
		assert.Equal(t, 1, code, "%v", c.args)
		assert.Contains(t, errOut, c.want, "%v", c.args)
	}
	code, out, _ := runCLI("serve", "-h")
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "-api-key")
}

// TestServeGroup: k3 serve -tp 2 -ep 2 serves the model split over four
// ranks, answering what k3 run -tp 2 -ep 2 generates.
func TestServeGroup(t *testing.T) {
	const model = "../../testdata/model/tiny_k31pro"
	code, want, errOut := runCLI("run", "-model", model, "-tp", "2", "-ep", "2", "-prompt", "the cat", "-max-tokens", "12", "-temperature", "0", "-no-default-stops")
	require.Equal(t, 0, code, errOut)
	url := startServe(t, "-model", model, "-tp", "2", "-ep", "2", "-sequences", "2")
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"the cat","max_tokens":12,"temperature":0,"ignore_eos":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, "%s", out)
	var c struct{ Choices []struct{ Text string } }
	require.NoError(t, json.Unmarshal(out, &c))
	require.Len(t, c.Choices, 1)
	assert.Equal(t, strings.TrimSuffix(want, "\n"), c.Choices[0].Text)

	// Speculating with a draft model (the same checkpoint, loaded whole):
	// the same answer, every draft accepted.
	url = startServe(t, "-model", model, "-tp", "2", "-sequences", "2", "-speculate", "model:"+model, "-draft-depth", "3")
	resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"the cat","max_tokens":12,"temperature":0,"ignore_eos":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, "%s", out)
	require.NoError(t, json.Unmarshal(out, &c))
	assert.Equal(t, strings.TrimSuffix(want, "\n"), c.Choices[0].Text, "speculating")
	drafts := metric(t, url, "vllm:spec_decode_num_draft_tokens_total")
	assert.GreaterOrEqual(t, drafts, 6.0, "the draft model drafted")
	assert.Equal(t, drafts, metric(t, url, "vllm:spec_decode_num_accepted_tokens_total"))
}

// startServe runs k3 serve with args on a free loopback port until the
// test ends, and returns its URL once it is ready.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	var stderr lockedBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, append([]string{"serve", "-addr", "127.0.0.1:0"}, args...), io.Discard, &stderr)
	}()
	t.Cleanup(func() {
		stop()
		select {
		case code := <-exited:
			assert.Equal(t, 0, code, "stderr: %s", stderr.String())
		case <-time.After(30 * time.Second):
			t.Error("k3 serve did not exit")
		}
	})
	addr := regexp.MustCompile(`http://127\.0\.0\.1:[0-9]+`)
	var url string
	require.Eventually(t, func() bool {
		url = addr.FindString(stderr.String())
		return url != "" && strings.Contains(stderr.String(), "ready")
	}, 30*time.Second, 10*time.Millisecond, "stderr: %s", stderr.String())
	return url
}

// metric reads one counter from the server's /metrics.
func metric(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			f, err := strconv.ParseFloat(rest[strings.LastIndexByte(rest, ' ')+1:], 64)
			require.NoError(t, err, line)
			return f
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// TestServeDraftModel: k3 serve -speculate model:DIR drafts with a second
// checkpoint (here the target's own, whose greedy drafts are all
// accepted) and answers what plain decoding answers.
func TestServeDraftModel(t *testing.T) {
	const target = "../../testdata/model/tiny_k31pro"
	body := `{"prompt":[5,9,14,200,3],"max_tokens":40,"ignore_eos":true,"temperature":0}`
	complete := func(url string) string {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		out, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, 200, resp.StatusCode, "%s", out)
		var c struct {
			Choices []struct{ Text string }
			Usage   struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		require.NoError(t, json.Unmarshal(out, &c))
		require.Len(t, c.Choices, 1)
		require.Equal(t, 40, c.Usage.CompletionTokens)
		return c.Choices[0].Text
	}
	plain := complete(startServe(t, "-model", target, "-sequences", "2"))
	url := startServe(t, "-model", target, "-sequences", "2", "-speculate", "model:"+target, "-draft-depth", "4")
	assert.Equal(t, plain, complete(url), "speculation changed the answer")
	drafts := metric(t, url, "vllm:spec_decode_num_draft_tokens_total")
	assert.GreaterOrEqual(t, drafts, 30.0, "the draft model drafted")
	assert.Equal(t, drafts, metric(t, url, "vllm:spec_decode_num_accepted_tokens_total"), "a model's own greedy drafts are all accepted")
	assert.Equal(t, plain, complete(url), "a drafter given back and lent again")
}
