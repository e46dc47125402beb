package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/extproc"
	"github.com/kvroute/kvroute/pkg/overhead"
)

// runOverhead measures kvroute's added latency and CPU against plain
// Envoy round robin on loopback (package overhead).
func runOverhead(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("overhead", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "", "directory with the kvroute and enginesim binaries (default <repo>/bin; make build)")
	loads := fs.String("workloads", "small@200,small@500,229KB@c32,229KB@c150,533KB@c1", "SIZE@RATE (open loop) or SIZE@cN (closed loop, N clients), comma-separated")
	dur := fs.Duration("duration", 10*time.Second, "length of one phase (one target, one workload)")
	runs := fs.Int("runs", 3, "alternating runs per workload (kvroute, round robin, kvroute, ...); medians are reported")
	tok := fs.String("tokenizer", "", "kvroute tokenizer: local (default when the Qwen3 files are fetched: make fixtures) or remote")
	events := fs.Bool("events", false, "keep the engines' KV event streams on")
	asJSON := fs.Bool("json", false, "print JSON")
	kvYAML := fs.String("kvroute-yaml", "", "YAML appended to kvroute's config (e.g. 'routing: {usage_sample_every: 8}')")
	kvEnv := fs.String("kvroute-env", "", "NAME=VALUE variables, comma-separated, for kvroute's environment alone (e.g. GOMAXPROCS=1)")
	floor := fs.Bool("floor", false, "also measure a third Envoy with kvroute's envoy.yaml whose ext_proc is the floor processor (kvbench extproc-floor: round robin with no decision), so kvroute's CPU and latency can be read above the protocol's own")
	prof := fs.String("profile", "", "directory to write CPU, allocation, mutex and block profiles of kvroute per kvroute phase into (<workload>-run<N>.<kind>.pprof)")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	ws, err := overhead.ParseWorkloads(*loads)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	var env []string
	if *kvEnv != "" {
		env = strings.Split(*kvEnv, ",")
		for _, kv := range env {
			if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
				return fmt.Errorf("%w: -kvroute-env %q: want NAME=VALUE", errUsage, kv)
			}
		}
	}
	rep, err := overhead.Run(ctx, overhead.Options{
		Bin: *bin, Workloads: ws, Duration: *dur, Runs: *runs, Tokenizer: *tok, Events: *events, ProfileDir: *prof,
		KVRouteYAML: *kvYAML, KVRouteEnv: env, Floor: *floor, Log: stderr,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.Print(stdout)
	return nil
}

// runFloor serves extproc.FloorProcessor (the harness's -floor target
// starts it as a process of its own, so its CPU is measured apart).
func runFloor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("extproc-floor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:0", "gRPC listen address")
	endpoints := fs.String("endpoints", "", "engine addresses ip:port, comma-separated, picked in turn")
	if err := parseArgs(fs, args); err != nil {
		return err
	}
	if *endpoints == "" {
		return fmt.Errorf("%w: -endpoints is required", errUsage)
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "extproc-floor listening on %s\n", lis.Addr())
	return extproc.ServeFloor(ctx, lis, strings.Split(*endpoints, ","))
}
