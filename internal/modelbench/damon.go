package modelbench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DamonNote describes the kernel's DAMON monitors that are on, or says
// nothing. A DAMON context over physical memory (kdamond) samples page
// access bits across the machine every sample interval; on a 2-core guest
// each sampling round takes a core for tens of milliseconds, which shows
// as whole-pass stalls at that period in the scheduler's tail latencies.
func DamonNote() string {
	states, _ := filepath.Glob("/sys/kernel/mm/damon/admin/kdamonds/*/state")
	var on []string
	for _, st := range states {
		b, err := os.ReadFile(st)
		if err != nil || strings.TrimSpace(string(b)) != "on" {
			continue
		}
		dir := filepath.Dir(st)
		read := func(rel string) string {
			b, _ := os.ReadFile(filepath.Join(dir, rel))
			return strings.TrimSpace(string(b))
		}
		on = append(on, fmt.Sprintf("kdamond %s (%s, sampling every %s µs, scheme %s)", filepath.Base(dir),
			read("contexts/0/operations"), read("contexts/0/monitoring_attrs/intervals/sample_us"), read("contexts/0/schemes/0/action")))
	}
	if len(on) == 0 {
		return ""
	}
	return fmt.Sprintf("  note: DAMON is on: %s; its sampling rounds stall passes periodically (docs/bench: the scheduler's tail latencies and k3 bench spec's shares)\n", strings.Join(on, "; "))
}
