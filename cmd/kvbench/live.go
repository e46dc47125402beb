package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/kvroute/kvroute/pkg/bench/live"
)

// LiveReport is `kvbench live --json`.
type LiveReport struct {
	Primary live.Summary  `json:"primary"`
	Compare *live.Summary `json:"compare,omitempty"`
	// Added is primary minus compare (the router's added latency when the
	// compare URL is the same stack without it).
	Added *LiveDelta `json:"added,omitempty"`
}

// LiveDelta is the difference of two summaries' latencies (seconds).
type LiveDelta struct {
	TTFTP50 float64 `json:"ttft_p50_s"`
	TTFTP99 float64 `json:"ttft_p99_s"`
	E2EP50  float64 `json:"e2e_p50_s"`
	E2EP99  float64 `json:"e2e_p99_s"`
}

func runLive(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("live", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf simFlags
	sf.register(fs)
	url := fs.String("url", "http://127.0.0.1:10000", "base URL of the stack (Envoy with kvroute)")
	compare := fs.String("compare-url", "", "base URL of the same stack without kvroute (plain round robin): the same load is sent there after the first run, and the difference reported")
	model := fs.String("model", "sim-model", "model name")
	rate := fs.Float64("session-rate", 0, "start sessions as a Poisson process at this rate per second (0 = the workload's own start times)")
	speed := fs.Float64("speed", 1, "divide workload start and think times by this")
	sessions := fs.Int("sessions", 0, "send only the first N sessions (0 = all)")
	inflight := fs.Int("max-inflight", 256, "bound on concurrent requests")
	timeout := fs.Duration("timeout", 5*time.Minute, "per-request timeout")
	asJSON := fs.Bool("json", false, "print JSON")
	tokenIDs := fs.Bool("token-ids", false, "send prompts as the simulator's token ids (BOS, then one token per byte) instead of text: the router never tokenizes")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	ws, err := sf.load()
	if err != nil {
		return err
	}
	if len(ws) != 1 {
		return fmt.Errorf("%w: live sends one workload at a time", errUsage)
	}
	opts := live.Options{
		URL: *url, Model: *model, Workload: ws[0], Rate: *rate, Speed: *speed,
		MaxSessions: *sessions, MaxInFlight: *inflight, Timeout: *timeout, Seed: sf.seed, TokenIDs: *tokenIDs,
	}
	rep, err := live.Run(ctx, opts)
	if err != nil {
		return err
	}
	out := LiveReport{Primary: live.Summarize(rep)}
	if *compare != "" {
		opts.URL, opts.Salt = *compare, 1
		crep, err := live.Run(ctx, opts)
		if err != nil {
			return err
		}
		c := live.Summarize(crep)
		out.Compare = &c
		out.Added = &LiveDelta{
			TTFTP50: out.Primary.TTFTP50 - c.TTFTP50, TTFTP99: out.Primary.TTFTP99 - c.TTFTP99,
			E2EP50: out.Primary.E2EP50 - c.E2EP50, E2EP99: out.Primary.E2EP99 - c.E2EP99,
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintln(stdout, "| target | requests | errors | TTFT mean ms | p50 ms | p90 ms | p99 ms | ITL p50 ms | ITL p99 ms | E2E p50 s | E2E p99 s | tok/s | hit rate |")
	fmt.Fprintln(stdout, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, s := range []*live.Summary{&out.Primary, out.Compare} {
		if s == nil {
			continue
		}
		fmt.Fprintf(stdout, "| %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f | %.3f | %.3f | %.0f | %.3f |\n",
			s.URL, s.Requests, s.Errors, 1000*s.TTFTMean, 1000*s.TTFTP50, 1000*s.TTFTP90, 1000*s.TTFTP99,
			1000*s.ITLP50, 1000*s.ITLP99, s.E2EP50, s.E2EP99, s.Throughput, s.HitRate)
	}
	if out.Added != nil {
		fmt.Fprintf(stdout, "\nadded by the first target: TTFT p50 %+.2f ms, p99 %+.2f ms; E2E p50 %+.2f ms, p99 %+.2f ms\n",
			1000*out.Added.TTFTP50, 1000*out.Added.TTFTP99, 1000*out.Added.E2EP50, 1000*out.Added.E2EP99)
	}
	return nil
}
