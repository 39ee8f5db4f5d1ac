// Command k3 is the command line of the k3 SDK: it proves backends against
// the golden vectors (conform), inspects checkpoints and golden files
// (inspect) and runs benchmarks.
//
// Usage:
//
//	k3 run [-model DIR] [-prompt TEXT] [-max-tokens N] [-temperature T] [-tp N -ep N -cp N] ...
//	k3 chat [-model DIR] [-system TEXT] [-tp N -ep N -cp N]
//	k3 eval [-model DIR] [-window N] FILE...
//	k3 new-tiny -preset k31pro|k3|kimi_linear|k31pro-100m|k31pro-1b -out DIR [-set JSON]
//	k3 serve [-model DIR] [-addr 127.0.0.1:8080] [-api-key KEY] [-tp N -ep N]
//	k3 conform [-backend go] [-tp N] [-ep N] [-cp N] DIR|FILE...
//	k3 inspect PATH
//	k3 bench dsa [-contexts 4096,16384,65536,131072] [-iters 3] [-out dsa_decode]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
)

type command struct {
	name, usage string
	run         func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{
	{"run", "run [-model DIR] [-prompt TEXT] [-chat] ...\tgenerate from a prompt, streaming, then speed and memory", runRun},
	{"chat", "chat [-model DIR] [-system TEXT] ...\tinteractive multi-turn chat", runChat},
	{"eval", "eval [-model DIR] FILE...\tscore files: bits per token and per byte", runEval},
	{"new-tiny", "new-tiny -preset NAME -out DIR\twrite a random-weight checkpoint", runNewTiny},
	{"serve", "serve [-model DIR] [-addr 127.0.0.1:8080] ...\tthe OpenAI-compatible HTTP server (docs/SERVING.md)", runServe},
	{"conform", "conform [-backend go] [-tp N] [-ep N] [-cp N] DIR|FILE...\trun the golden-vector conformance suite (model cases split over ranks with -tp/-ep/-cp)", runConform},
	{"inspect", "inspect PATH\tlist a checkpoint's or golden file's tensors and config", runInspect},
	{"plan", "plan -config FILE -cards N ...\tdeployment planner: per-card memory, communication and roofline latency per layout", runPlan},
	{"bench", "bench dsa|kernels|model\tsparse vs dense DSA decode; GEMM and matrix-vector against the machine's\n" +
		"\tlimits (and OpenBLAS, built with -tags openblas); whole-model speed", runBench},
}

// errFailed reports a command that printed its own failure.
var errFailed = errors.New("failed")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	if isHelp(args[0]) || args[0] == "help" {
		usage(stdout)
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], stdout, stderr)
			switch {
			case err == nil, errors.Is(err, errHelp):
				return 0
			case errors.Is(err, errFailed):
				return 1
			case errors.Is(err, errUsage):
				return 2
			}
			fmt.Fprintf(stderr, "k3 %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "k3: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

var (
	errUsage = errors.New("usage") // bad arguments; the usage went to stderr
	errHelp  = errors.New("help")  // help was asked for and printed on stdout
)

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// parseFlags parses a subcommand's flags. Asked for help (-h, -help or
// --help anywhere before the arguments), it prints the usage on stdout and
// returns errHelp; on a bad flag the usage goes to stderr with errUsage.
// usageLine is the synopsis printed above the flags.
func parseFlags(fs *flag.FlagSet, usageLine string, args []string, stdout, stderr io.Writer) error {
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: k3 "+usageLine)
		if hasFlags(fs) {
			fmt.Fprintln(fs.Output(), "\nflags:")
			fs.PrintDefaults()
		}
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if isHelp(a) {
			fs.SetOutput(stdout)
			fs.Usage()
			return errHelp
		}
	}
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	return nil
}

func hasFlags(fs *flag.FlagSet) bool {
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	return n > 0
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: k3 <command> [arguments]\n\ncommands:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		// Continuation lines start with a tab: they go under the help column.
		for i, line := range strings.Split(c.usage, "\n") {
			if i == 0 {
				line = "k3 " + line
			}
			fmt.Fprintln(tw, "  "+line)
		}
	}
	tw.Flush()
}
