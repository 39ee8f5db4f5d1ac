package goroutines

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func parked(stop chan struct{}) { <-stop }

func TestRunning(t *testing.T) {
	others := Running(nil, "goroutines.TestRunning")
	stop := make(chan struct{})
	go parked(stop)
	// Polled: the goroutine is listed once it has started.
	deadline := time.Now().Add(10 * time.Second)
	got := Running(others, "goroutines.TestRunning")
	for len(got) == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		got = Running(others, "goroutines.TestRunning")
	}
	require.Len(t, got, 1)
	require.Contains(t, got[0], "goroutines.parked")
	require.Empty(t, Running(append(others, got...), "goroutines.TestRunning"), "listed before")
	require.Empty(t, Running(others, "goroutines.TestRunning", "goroutines.parked"), "its own")
	close(stop)
	for len(got) > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		got = Running(others, "goroutines.TestRunning")
	}
	require.Empty(t, got, "ended")
}
