package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

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
		KVRouteYAML: *kvYAML, KVRouteEnv: env, Log: stderr,
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
