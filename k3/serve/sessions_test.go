package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"k3/k3"
)

func postSession(t *testing.T, url, id string, body any) (int, map[string]any) {
	t.Helper()
	b, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequest("POST", url, bytes.NewReader(b))
	require.NoError(t, err)
	if id != "" {
		req.Header.Set(SessionHeader, id)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	return resp.StatusCode, out
}

func cachedTokens(out map[string]any) float64 {
	return out["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64)
}

func text(out map[string]any) string {
	return out["choices"].([]any)[0].(map[string]any)["text"].(string)
}

// TestKeptSession: a second request on a kept session feeds only what its
// prompt adds, and answers what a cold run of the whole prompt answers.
func TestKeptSession(t *testing.T) {
	_, hs, m := newTestServer(t, Config{})
	url := hs.URL + "/v1/completions"
	p1 := "func (r *Reader) Read(p []byte) (n int, err error) {"
	code, out := postSession(t, url, "conv-1", map[string]any{"prompt": p1, "max_tokens": 10, "temperature": 0, "ignore_eos": true})
	require.Equal(t, 200, code, "%v", out)
	assert.Zero(t, cachedTokens(out))
	p2 := p1 + text(out) + "\n}\n\nfunc main() {"
	code, out = postSession(t, url, "conv-1", map[string]any{"prompt": p2, "max_tokens": 10, "temperature": 0, "ignore_eos": true})
	require.Equal(t, 200, code, "%v", out)
	held := len(m.Encode(p1)) + 10
	assert.GreaterOrEqual(t, cachedTokens(out), float64(held-2), "the second request reused the session's tokens")
	want, _ := direct(t, m, m.Encode(p2), k3.WithMaxTokens(10), k3.WithoutDefaultStops())
	assert.Equal(t, want, text(out))

	code, out = postSession(t, url, "bad/../id", map[string]any{"prompt": "x"})
	assert.Equal(t, 400, code, "%v", out)
	code, out = postSession(t, url, "conv-1", map[string]any{"prompt": "x", "n": 2})
	assert.Equal(t, 400, code, "%v", out)

	req, _ := http.NewRequest("DELETE", hs.URL+"/v1/sessions/conv-1", nil)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 404, resp.StatusCode)
}

// TestKeptSessionBusy: a second request on a session that is answering
// gets 409 at once.
func TestKeptSessionBusy(t *testing.T) {
	_, hs, _ := newTestServer(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b, _ := json.Marshal(map[string]any{"prompt": "x", "max_tokens": 2000, "ignore_eos": true, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+"/v1/completions", bytes.NewReader(b))
	req.Header.Set(SessionHeader, "busy")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
	code, out := postSession(t, hs.URL+"/v1/completions", "busy", map[string]any{"prompt": "y", "max_tokens": 2})
	assert.Equal(t, 409, code, "%v", out)
}

// TestParkedSessions: an idle session is parked on disk and comes back on
// its next request; Close parks the live ones, and another server on the
// same directory resumes them.
func TestParkedSessions(t *testing.T) {
	dir := t.TempDir()
	m, err := k3.LoadTiny(context.Background(), k3.WithMemoryBudget(testBudget))
	require.NoError(t, err)
	defer m.Close()
	s, err := New(m, Config{SessionDir: dir, SessionIdle: 30 * time.Millisecond})
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	url := hs.URL + "/v1/completions"
	p1 := "package io\n\n// Reader is the interface that wraps the basic Read method."
	code, out := postSession(t, url, "a", map[string]any{"prompt": p1, "max_tokens": 6, "temperature": 0, "ignore_eos": true})
	require.Equal(t, 200, code, "%v", out)
	file := filepath.Join(dir, "a.k3session")
	require.Eventually(t, func() bool { _, err := os.Stat(file); return err == nil }, 10*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { live, _ := s.store.counts(); return live == 0 }, 10*time.Second, 5*time.Millisecond)
	// The counter counts saves done: the file is renamed into place just
	// before the save is counted.
	require.Eventually(t, func() bool { _, parked := s.store.counts(); return parked > 0 }, 10*time.Second, 5*time.Millisecond)
	assert.Positive(t, scrape(t, hs.URL)["k3:sessions_parked_total"])

	p2 := p1 + text(out) + "\ntype Writer interface {"
	code, out = postSession(t, url, "a", map[string]any{"prompt": p2, "max_tokens": 6, "temperature": 0, "ignore_eos": true})
	require.Equal(t, 200, code, "%v", out)
	assert.GreaterOrEqual(t, cachedTokens(out), float64(len(m.Encode(p1))+6-2), "the parked session came back")
	want, _ := direct(t, m, m.Encode(p2), k3.WithMaxTokens(6), k3.WithoutDefaultStops())
	assert.Equal(t, want, text(out))

	// A restart: Close parks the live session, a new server resumes it.
	s2cfg := Config{SessionDir: dir, SessionIdle: time.Hour}
	hs.Close()
	require.NoError(t, s.Close())
	_, err = os.Stat(file)
	require.NoError(t, err, "Close parked the session")
	s2, err := New(m, s2cfg)
	require.NoError(t, err)
	defer s2.Close()
	hs2 := httptest.NewServer(s2)
	defer hs2.Close()
	p3 := p2 + text(out) + "\n}"
	code, out = postSession(t, hs2.URL+"/v1/completions", "a", map[string]any{"prompt": p3, "max_tokens": 3, "temperature": 0})
	require.Equal(t, 200, code, "%v", out)
	assert.GreaterOrEqual(t, cachedTokens(out), float64(len(m.Encode(p2))+6-2))

	// A parked file that is corrupted is an error naming the problem.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "broken.k3session"), []byte("K3SESSN\n\x01\x00garbage"), 0o600))
	code, out = postSession(t, hs2.URL+"/v1/completions", "broken", map[string]any{"prompt": "x", "max_tokens": 2})
	assert.Equal(t, 500, code)
	assert.Contains(t, out["error"].(map[string]any)["message"], "bad session file")
}

// TestCloseWhileKeptSessionRuns: closing the server while a kept session
// answers ends that answer, and the session is parked when the request
// lets go of it rather than while it runs; without a session directory
// it is dropped then, no file written (one was written to the working
// directory, found by TestRandomTraffic).
func TestCloseWhileKeptSessionRuns(t *testing.T) {
	for _, parked := range []bool{true, false} {
		dir := ""
		if parked {
			dir = t.TempDir()
		}
		m, err := k3.LoadTiny(context.Background(), k3.WithMemoryBudget(testBudget))
		require.NoError(t, err)
		defer m.Close()
		s, err := New(m, Config{SessionDir: dir})
		require.NoError(t, err)
		saved := make(chan string, 1)
		s.store.beforeSave = func(id string) { saved <- id }
		hs := httptest.NewServer(s)
		defer hs.Close()
		b, _ := json.Marshal(map[string]any{"prompt": "x", "max_tokens": 2000, "ignore_eos": true, "stream": true})
		req, _ := http.NewRequest("POST", hs.URL+"/v1/completions", bytes.NewReader(b))
		req.Header.Set(SessionHeader, "running")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		require.NoError(t, s.Close())
		io.Copy(io.Discard, resp.Body) // the stream ends (with an error event)
		if parked {
			require.Eventually(t, func() bool {
				_, err := os.Stat(filepath.Join(dir, "running.k3session"))
				return err == nil
			}, 10*time.Second, 5*time.Millisecond, "the session was parked once its request let go")
			assert.Equal(t, "running", <-saved)
		} else {
			require.Eventually(t, func() bool { live, _ := s.store.counts(); return live == 0 }, 10*time.Second, 5*time.Millisecond)
			select {
			case id := <-saved:
				t.Errorf("session %s written without a session directory", id)
			default:
			}
		}
		live, _ := s.store.counts()
		assert.Zero(t, live)
	}
}

// TestParkingOutsideLock: a session's parking write holds up no other
// session's request; a request for the session being parked waits for
// its file and resumes it whole.
func TestParkingOutsideLock(t *testing.T) {
	m, err := k3.LoadTiny(context.Background(), k3.WithMemoryBudget(testBudget))
	require.NoError(t, err)
	defer m.Close()
	st, err := newSessionStore(loneEngine{m: m}, t.TempDir(), time.Hour, 1, nil)
	require.NoError(t, err)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	st.beforeSave = func(id string) {
		if id == "a" {
			once.Do(func() { close(started) })
			<-release
		}
	}
	a, err := st.take("a")
	require.NoError(t, err)
	_, err = a.Forward(context.Background(), m.Encode("func main() {"))
	require.NoError(t, err)
	want := a.Tokens()
	st.put("a", a, true)

	// Taking b parks a (one live session at most); its write blocks, b
	// does not wait for it.
	taken := make(chan seq, 1)
	go func() {
		b, err := st.take("b")
		assert.NoError(t, err)
		taken <- b
	}()
	<-started
	var b seq
	select {
	case b = <-taken:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("taking b waited for a's parking write")
	}
	require.NotNil(t, b)
	st.put("b", b, true)
	live, _ := st.counts()
	assert.Equal(t, 1, live)

	got := make(chan seq, 1)
	go func() {
		s, err := st.take("a")
		assert.NoError(t, err)
		got <- s
	}()
	select {
	case <-got:
		t.Fatal("a was taken while its parking write had not finished")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	s := <-got
	require.NotNil(t, s)
	assert.Equal(t, want, s.Tokens(), "a came back from its file whole")
	// a was parked, then b to make room for it (written in the background).
	require.Eventually(t, func() bool { _, parked := st.counts(); return parked == 2 }, 10*time.Second, time.Millisecond)
	st.put("a", s, true)
	st.close()
}

// TestIdleSessionsYieldToStarvedRequests: while requests are starved of
// memory (the Batcher runs nothing and some wait), the store parks its
// idle sessions, least recently used first, long before their idle
// time; a session a request holds stays, and nothing leaves while no
// request is starved.
func TestIdleSessionsYieldToStarvedRequests(t *testing.T) {
	m, err := k3.LoadTiny(context.Background(), k3.WithMemoryBudget(testBudget))
	require.NoError(t, err)
	defer m.Close()
	var starved atomic.Bool
	dir := t.TempDir()
	st, err := newSessionStore(loneEngine{m: m}, dir, time.Hour, 8, starved.Load)
	require.NoError(t, err)
	defer st.close()
	for _, id := range []string{"old", "new", "busy"} {
		s, err := st.take(id)
		require.NoError(t, err)
		_, err = s.Forward(context.Background(), m.Encode("func main() {"))
		require.NoError(t, err)
		if id != "busy" {
			st.put(id, s, true)
		}
		time.Sleep(time.Millisecond) // distinct use times
	}
	time.Sleep(5 * starvedEvery)
	live, _ := st.counts()
	require.Equal(t, 3, live, "nothing leaves while no request is starved")

	starved.Store(true)
	require.Eventually(t, func() bool { _, parked := st.counts(); return parked == 1 }, 10*time.Second, time.Millisecond)
	_, err = os.Stat(st.path("old"))
	assert.NoError(t, err, "the least recently used goes first")
	require.Eventually(t, func() bool { live, parked := st.counts(); return parked == 2 && live == 1 }, 10*time.Second, time.Millisecond)
	time.Sleep(5 * starvedEvery)
	live, parked := st.counts()
	assert.Equal(t, 1, live, "the session a request holds stays")
	assert.Equal(t, 2, parked)
}

// TestKeptSessionAfterClose: a request for a kept session after the
// server has closed is refused without the store making, loading or
// writing the session. Before, it made one and wrote it when the request
// failed, and two such requests for one id wrote its file at once,
// interleaved (found by TestRandomTraffic: a later request read "bad
// session file").
func TestKeptSessionAfterClose(t *testing.T) {
	dir := t.TempDir()
	m, err := k3.LoadTiny(context.Background(), k3.WithMemoryBudget(testBudget))
	require.NoError(t, err)
	defer m.Close()
	s, err := New(m, Config{SessionDir: dir})
	require.NoError(t, err)
	hs := httptest.NewServer(s)
	defer hs.Close()
	require.NoError(t, s.Close())
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _ := json.Marshal(map[string]any{"prompt": "x", "max_tokens": 4})
			req, _ := http.NewRequest("POST", hs.URL+"/v1/completions", bytes.NewReader(b))
			req.Header.Set(SessionHeader, "late")
			resp, err := http.DefaultClient.Do(req)
			if !assert.NoError(t, err) {
				return
			}
			defer resp.Body.Close()
			out, _ := io.ReadAll(resp.Body)
			assert.Equal(t, 503, resp.StatusCode, "%s", out)
			assert.Contains(t, string(out), "shutting down")
		}()
	}
	wg.Wait()
	files, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Empty(t, files, "the store wrote sessions after it closed")
}
