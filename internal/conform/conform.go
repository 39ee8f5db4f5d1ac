// Package conform runs k3's golden-vector conformance suite against any
// compute backend. A case is a safetensors file whose __metadata__ has an
// "op" key, or a model directory (config.json plus expected.safetensors).
// Each op has a handler that feeds the case's inputs to the backend through
// the compute seam and compares the outputs with explicit tolerances; the
// runner is independent of the Go tests so that it can prove a device
// backend too.
package conform

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k3/compute"
	"k3/internal/safetensors"
	"k3/k3"
)

// Case is one conformance case.
type Case struct {
	Path string // the file, or the model directory
	Op   string
	// Err is set when the case could not be read; it then fails with it.
	Err error
}

// Result is the outcome of one case.
type Result struct {
	Case
	Pass bool
	// Skipped is set on a model case that a parallel layout cannot split
	// (k3.ErrLayoutMismatch: expert ranks beyond its routed experts): it
	// neither passes nor fails.
	Skipped   bool
	MaxAbsErr float64 // NaN where nothing was compared (the case failed first)
	Tol       float64
	Reason    string // why it failed or was skipped
}

// String formats the result as the runner's report line.
func (r Result) String() string {
	status := "PASS"
	switch {
	case r.Skipped:
		status = "SKIP"
	case !r.Pass:
		status = "FAIL"
	}
	op := r.Op
	if op == "" {
		op = "?"
	}
	if r.Skipped {
		return fmt.Sprintf("%s %s %s (%s)", status, r.Path, op, r.Reason)
	}
	s := fmt.Sprintf("%s %s %s", status, r.Path, op)
	if !math.IsNaN(r.MaxAbsErr) {
		s += fmt.Sprintf(" max_abs_err=%.3g tol=%.3g", r.MaxAbsErr, r.Tol)
	}
	if r.Reason != "" {
		s += " (" + r.Reason + ")"
	}
	return s
}

// Discover walks roots (files or directories) and returns the cases found,
// sorted by path. Files that are not safetensors, and safetensors files
// without an "op" (checkpoint weights), are not cases; a safetensors file
// that cannot be parsed is a case that fails.
func Discover(roots ...string) ([]Case, error) {
	var cases []Case
	seen := map[string]bool{}
	add := func(c Case) {
		if !seen[c.Path] {
			seen[c.Path] = true
			cases = append(cases, c)
		}
	}
	for _, root := range roots {
		st, err := os.Stat(root)
		if err != nil {
			return nil, fmt.Errorf("conform: %w", err)
		}
		if !st.IsDir() {
			if filepath.Base(root) == "expected.safetensors" {
				add(Case{Path: filepath.Dir(root), Op: "model.forward"})
			} else {
				add(fileCase(root))
			}
			continue
		}
		err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if isModelDir(path) {
					c := Case{Path: path, Op: "model.forward"}
					if f, err := safetensors.Open(filepath.Join(path, "expected.safetensors")); err != nil {
						c.Err = err
					} else {
						if op := f.Metadata()["op"]; op != "" {
							c.Op = op
						}
						f.Close()
					}
					add(c)
					return filepath.SkipDir
				}
				return nil
			}
			if strings.HasSuffix(path, ".safetensors") {
				if c := fileCase(path); c.Op != "" || c.Err != nil {
					add(c)
				}
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("conform: %w", err)
		}
	}
	sort.Slice(cases, func(i, j int) bool { return cases[i].Path < cases[j].Path })
	return cases, nil
}

func isModelDir(dir string) bool {
	_, e1 := os.Stat(filepath.Join(dir, "config.json"))
	_, e2 := os.Stat(filepath.Join(dir, "expected.safetensors"))
	return e1 == nil && e2 == nil
}

func fileCase(path string) Case {
	f, err := safetensors.Open(path)
	if err != nil {
		return Case{Path: path, Err: err}
	}
	defer f.Close()
	return Case{Path: path, Op: f.Metadata()["op"]}
}

// Ops returns the ops that have a handler, sorted.
func Ops() []string {
	ops := make([]string, 0, len(handlers))
	for op := range handlers {
		ops = append(ops, op)
	}
	sort.Strings(ops)
	return ops
}

// Run runs every case on b and yields the results in order. It stops early
// when ctx is cancelled (the remaining cases are not yielded).
func Run(ctx context.Context, b compute.Backend, cases []Case) iter.Seq[Result] {
	return RunLayout(ctx, b, cases, k3.Layout{})
}

// RunLayout is Run with the model cases split over ranks by layout
// (k3.LoadGroup); the other cases run on b as in Run.
func RunLayout(ctx context.Context, b compute.Backend, cases []Case, layout k3.Layout) iter.Seq[Result] {
	ctx = context.WithValue(ctx, layoutKey{}, layout)
	return func(yield func(Result) bool) {
		for _, c := range cases {
			if ctx.Err() != nil {
				return
			}
			if !yield(runCase(ctx, b, c)) {
				return
			}
		}
	}
}

func runCase(ctx context.Context, b compute.Backend, c Case) (res Result) {
	res = Result{Case: c, MaxAbsErr: math.NaN(), Tol: math.NaN()}
	if c.Err != nil {
		res.Reason = "unreadable case: " + c.Err.Error()
		return res
	}
	h, ok := handlers[c.Op]
	if !ok {
		res.Reason = "unsupported op: no conformance handler for " + c.Op
		return res
	}
	defer func() {
		// A backend bug must not take the whole suite down; report it.
		if p := recover(); p != nil {
			res.Pass = false
			res.Reason = fmt.Sprintf("panic: %v", p)
		}
	}()
	chk := &checker{maxErr: 0}
	err := h(ctx, b, c.Path, chk)
	if chk.compared > 0 {
		res.MaxAbsErr, res.Tol = chk.maxErr, chk.tol
	}
	switch {
	case errors.Is(err, compute.ErrUnsupported):
		res.Reason = "unsupported op: " + err.Error()
	case errors.Is(err, k3.ErrLayoutMismatch):
		res.Skipped, res.Reason = true, err.Error()
	case err != nil:
		res.Reason = err.Error()
	case len(chk.fails) > 0:
		res.Reason = strings.Join(chk.fails, "; ")
	case chk.compared == 0:
		res.Reason = "nothing compared"
	default:
		res.Pass = true
	}
	return res
}

// A handler runs one case on b and records comparisons in chk.
type handler func(ctx context.Context, b compute.Backend, path string, chk *checker) error

var handlers = map[string]handler{}

// checker accumulates comparisons of one case.
type checker struct {
	maxErr   float64
	tol      float64
	compared int
	fails    []string
	// route labels the failures of a second route (" (composed)").
	route string
}

// close compares got with want elementwise: |got-want| <= atol + rtol·|want|.
// Infinities must match exactly (the -Inf of an empty softmax row).
func (c *checker) close(name string, got, want []float32, atol, rtol float64) {
	c.compared++
	c.tol = max(c.tol, atol)
	if len(got) != len(want) {
		c.fails = append(c.fails, fmt.Sprintf("%s: %d values, want %d", name, len(got), len(want)))
		return
	}
	worst, at := 0.0, -1
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if math.IsInf(w, 0) || math.IsInf(g, 0) || math.IsNaN(g) || math.IsNaN(w) {
			if g != w && !(math.IsNaN(g) && math.IsNaN(w)) {
				c.fails = append(c.fails, fmt.Sprintf("%s%s[%d] = %g, want %g", name, c.route, i, g, w))
				return
			}
			continue
		}
		d := math.Abs(g - w)
		c.maxErr = max(c.maxErr, d)
		if excess := d - (atol + rtol*math.Abs(w)); excess > 0 && (at < 0 || excess > worst) {
			worst, at = excess, i
		}
	}
	if at >= 0 {
		c.fails = append(c.fails, fmt.Sprintf("%s%s[%d] = %g, want %g", name, c.route, at, got[at], want[at]))
	}
}

// exact compares integer tensors (index lists) for equality, order included.
func (c *checker) exact(name string, got, want []int32) {
	c.compared++
	if len(got) != len(want) {
		c.fails = append(c.fails, fmt.Sprintf("%s: %d values, want %d", name, len(got), len(want)))
		return
	}
	for i := range want {
		if got[i] != want[i] {
			c.fails = append(c.fails, fmt.Sprintf("%s[%d] = %d, want %d", name, i, got[i], want[i]))
			return
		}
	}
}
