package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
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
	sf.registerWorkload(fs)
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
	api := fs.String("api", live.APICompletions, "what clients send: completions (POST /v1/completions, the whole history as one prompt) or messages (POST /v1/messages as Claude Code sends it to vLLM: streamed, a billing block and the shared system prompt as system blocks, the history as user and assistant messages, agent turns as tool results, metadata.user_id with the session for clients that carry an identity); messages needs text prompts (not -token-ids or -tokenizer ids)")
	words := fs.Bool("words", false, "render every workload token as a space and a letter (one token of a real BPE tokenizer) instead of one letter (one token of enginesim's byte tokenizer); -stack sets it for text prompts")
	var bo live.BenchOptions
	stack := fs.Bool("stack", false, "start the stack (enginesims, kvroute behind Envoy, a round-robin Envoy) on loopback and run -reps repetitions of kvroute against round robin, seeds -seed, -seed+1, ...; -url and -compare-url are ignored")
	fs.IntVar(&bo.Engines, "engines", 8, "-stack: enginesims")
	fs.Float64Var(&bo.EngineSpeed, "engine-speed", 5, "-stack: enginesim --speed")
	engineArgs := fs.String("engine-args", "--max-model-len 131072 --num-gpu-blocks 24576 --cpu-offload-blocks 131072 --prefill-tokens-per-s 16000",
		"-stack: further enginesim flags for every engine, space separated")
	fs.Func("slow-engine", "-stack: slow engines from a time on, comma-separated engine@time:speed (e.g. 1@30s:0.05: engine 1 of each arm prefills at a twentieth of its speed, its steps 20 times longer, from 30 s of its simulated time on, enginesim's --slow-after and --slow-to; -engine-speed 5 makes that 6 s after it started)", func(v string) error {
		for _, x := range splitList(v) {
			ch, err := parseSpeedChange(x)
			if err != nil {
				return err
			}
			bo.Slow = append(bo.Slow, ch)
		}
		return nil
	})
	fs.IntVar(&bo.Reps, "reps", 3, "-stack: repetitions")
	fs.StringVar(&bo.Tokenizer, "tokenizer", "", "-stack: local (kvroute's default tokenizer, kind auto, finds the model's files; the default when -tokenizer-dir has them), remote (the engines' /tokenize), render (the engines' render endpoints, engines started with --enable-scale-out) or ids (as -token-ids)")
	fs.StringVar(&bo.TokenizerDir, "tokenizer-dir", "", "-stack: the model's tokenizer.json and tokenizer_config.json, used by the engines and found by kvroute (default $KVROUTE_TOKENIZER_CACHE/qwen3 or .cache/tokenizers/qwen3)")
	fs.BoolVar(&bo.Parallel, "parallel", true, "-stack: run kvroute and round robin at the same time, each on its own enginesims, so both see the same machine load; -parallel=false runs them one after the other on the same engines, order alternating")
	fs.StringVar(&bo.KVRouteExtra, "kvroute-yaml", "", "-stack: YAML merged into kvroute's config, section by section, its values winning (e.g. 'policy: {name: leastload}')")
	fs.StringVar(&bo.Bin, "bin", "", "-stack: directory with kvroute and enginesim (default <repo>/bin)")
	fs.IntVar(&bo.Worst, "worst", 5, "-stack: slowest requests of each run to list")
	fs.BoolVar(&bo.Requests, "requests", false, "-stack -json: keep every request of every run in the report, and kvroute's decisions behind them (its decision history, GET /debug/decisions)")
	if err := parseArgs(fs, args); err != nil {
		return err
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
		MaxSessions: *sessions, MaxInFlight: *inflight, Timeout: *timeout, Seed: sf.seed, TokenIDs: *tokenIDs, Words: *words, API: *api,
	}
	switch {
	case *api != live.APICompletions && *api != live.APIMessages:
		return fmt.Errorf("%w: -api %q: want %s or %s", errUsage, *api, live.APICompletions, live.APIMessages)
	case *api == live.APIMessages && (*tokenIDs || bo.Tokenizer == live.TokenizerIDs):
		return fmt.Errorf("%w: -api messages sends text: not with -token-ids or -tokenizer ids", errUsage)
	}
	if *stack {
		if *tokenIDs {
			if bo.Tokenizer != "" && bo.Tokenizer != live.TokenizerIDs {
				return fmt.Errorf("%w: -token-ids with -tokenizer %s", errUsage, bo.Tokenizer)
			}
			bo.Tokenizer = live.TokenizerIDs
		}
		bo.EngineArgs = strings.Fields(*engineArgs)
		bo.Run = opts
		bo.Log = stderr
		base := sf.seed
		bo.Workload = func(rep int) (*bench.Workload, uint64, error) {
			f := sf
			f.seed = base + uint64(rep)
			ws, err := f.load()
			if err != nil {
				return nil, 0, err
			}
			return ws[0], f.seed, nil
		}
		rep, err := live.Bench(ctx, bo)
		if rep != nil {
			printBench(stdout, rep, *asJSON)
		}
		return err
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

// printBench prints a -stack run: every repetition, the medians, and each
// run's slowest requests.
func printBench(w io.Writer, rep *live.BenchReport, asJSON bool) {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
		return
	}
	mode := "one after the other, order alternating"
	if rep.Parallel {
		mode = "at the same time, each on its own engines"
	}
	fmt.Fprintf(w, "/v1/%s; tokenizer %s; kvroute and round robin %s\n\n", rep.API, rep.Tokenizer, mode)
	fmt.Fprintln(w, "| rep (seed, order) | requests kv / rr | kvroute TTFT mean / p50 / p99 s | round robin mean / p50 / p99 s | p99 ratio | mean ratio | hit kv / rr | preemptions kv / rr |")
	fmt.Fprintln(w, "|---|---|---|---|---:|---:|---|---|")
	for _, r := range rep.Reps {
		k, o := r.KVRoute.Summary, r.RoundRobin.Summary
		fmt.Fprintf(w, "| %d (%d, %s) | %d / %d | %.3f / %.3f / %.3f | %.3f / %.3f / %.3f | **%.2f** | %.2f | %.3f / %.3f | %.0f / %.0f |\n",
			r.Rep, r.Seed, r.Order, k.Requests-k.Errors, o.Requests-o.Errors, k.TTFTMean, k.TTFTP50, k.TTFTP99, o.TTFTMean, o.TTFTP50, o.TTFTP99,
			r.P99Ratio, r.MeanRatio, k.HitRate, o.HitRate, r.KVRoute.Preemptions, r.RoundRobin.Preemptions)
	}
	fmt.Fprintf(w, "\nmedian p99 ratio %.2f, median mean ratio %.2f\n", rep.MedianP99Ratio, rep.MedianMeanRatio)
	if rep.Demoted {
		fmt.Fprintln(w, "WARNING: kvroute's local tokenizer was demoted by its self-check; requests went to the engines' /tokenize")
	}
	for _, r := range rep.Reps {
		if rs := r.KVRoute.Router; rs != nil {
			var reasons []string
			for _, k := range slices.Sorted(maps.Keys(rs.Reasons)) {
				reasons = append(reasons, fmt.Sprintf("%s %.0f", k, rs.Reasons[k]))
			}
			fmt.Fprintf(w, "\nrep %d kvroute: %.0f decisions (%.0f degraded, %.0f tokenizer fallbacks), decision mean %.2f ms (%.0f over 100 ms), tokenization mean %.2f ms; reasons: %s\n",
				r.Rep, rs.Decisions, rs.Degraded, rs.Fallbacks, 1000*rs.DecisionMean, rs.SlowDecisions, 1000*rs.TokenizeMean, strings.Join(reasons, ", "))
		}
		for _, a := range []struct {
			name string
			arm  live.Arm
		}{{"kvroute", r.KVRoute}, {"round robin", r.RoundRobin}} {
			fmt.Fprintf(w, "rep %d %s errors %d, slowest:", r.Rep, a.name, a.arm.Summary.Errors)
			for _, q := range a.arm.Worst {
				fmt.Fprintf(w, " [s%d t%d at %.1fs: %.3f s, %d tok, %d cached, %s]", q.Session, q.Turn, q.Start.Seconds(), q.TTFT.Seconds(), q.PromptTokens, q.CachedTokens, q.Upstream)
			}
			fmt.Fprintln(w)
		}
	}
}
