// Command kvbench drives kvroute's routing core offline: it reproduces the
// seed document's executed experiments with the real packages and compares
// policies side by side.
//
// Usage:
//
//	kvbench <command> [flags]
//
// Each subcommand lives in its own file and is registered in the commands
// table below; `kvbench help` lists them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one kvbench subcommand.
type command struct {
	name    string
	summary string
	// run executes the subcommand with its own arguments (after the name).
	// A flag.ErrHelp return prints nothing more and exits 0; any other
	// error exits 1 (2 for usage errors wrapped in errUsage).
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is the subcommand table: add an entry per subcommand file.
var commands = []command{
	{name: "seed", summary: "re-run the seed document's executed experiments with the real kvblock/index/policy packages", run: runSeed},
	{name: "sim", summary: "simulate a fleet in simulated time and compare routing policies on traces and synthetic workloads", run: runSim},
	{name: "matrix", summary: "run issue 17's grid (fleet sizes x workloads x utilizations x seeds x policies) and judge the default policy in every case", run: runMatrix},
	{name: "bar", summary: "issue 17's bar exactly: matrix -bar (every policy at utilization <= 0.95, the default and round robin above it)", run: runBar},
	{name: "live", summary: "drive a running Envoy + kvroute + engines stack over HTTP (streaming TTFT, ITL, E2E), optionally side by side with plain round robin", run: runLive},
	{name: "overhead", summary: "start Envoy + kvroute and plain Envoy round robin over fast simulated engines; added latency, throughput and kvroute CPU per request, side by side", run: runOverhead},
	{name: "extproc-floor", summary: "serve the floor ext_proc processor (round robin, no decision; what overhead -floor compares kvroute with) until interrupted", run: runFloor},
	{name: "tune", summary: "search a policy's knobs on a simulated workload for an objective, with per-knob sensitivity", run: runTune},
}

// errUsage marks a command-line error (exit status 2).
var errUsage = errors.New("usage")

// parseArgs parses a subcommand's flags, which take no positional
// arguments: -h is returned as flag.ErrHelp, anything else wrong as a usage
// error.
func parseArgs(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	return nil
}

func main() {
	tuneGC()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches args to a subcommand and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "kvbench %s: %v\n", c.name, err)
			return 2
		default:
			fmt.Fprintf(stderr, "kvbench %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "kvbench: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: kvbench <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `kvbench <command> -h` for a command's flags.")
}
