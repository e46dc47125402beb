// Command kvroute is the KV-cache-aware request router: an Envoy ext_proc
// service (serve), a client of its admin API (explain, decisions) and its
// version.
//
// serve is the composition root: it loads the config, wires every package,
// runs them under one errgroup and owns shutdown (see wiring.serve).
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

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = runServe(ctx, args[1:], stderr)
	case "explain":
		err = runExplain(ctx, args[1:], stdout, stderr)
	case "decisions":
		err = runDecisions(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintln(stdout, "kvroute", version)
		return 0
	case "help", "-h", "--help":
		usage(stdout)
		return 0
	default:
		fmt.Fprintf(stderr, "kvroute: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintln(stderr, "kvroute:", err)
	return 1
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: kvroute <command> [flags]

commands:
  serve    --config kvroute.yaml   run the router (flags override the file)
  explain  -f request.json         explain a routing decision (admin API of a running kvroute)
  decisions [-limit N]             the routing decisions a running kvroute made last (routing.decision_history)
  version                          print the version

Run "kvroute <command> -h" for a command's flags.
`)
}
