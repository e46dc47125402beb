package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/policy"
)

// simFlags are the flags shared by sim and tune.
type simFlags struct {
	workloads  string
	trace      string
	rate       float64
	limit      int
	size       float64
	replicas   int
	seed       uint64
	delay      time.Duration
	loss       float64
	gpuBlocks  int
	cpuBlocks  int
	prefillTPS float64
	noFidelity bool
}

func (f *simFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.workloads, "workload", "trace", "workloads, comma-separated: trace, "+strings.Join(bench.Generators(), ", ")+", or all")
	fs.StringVar(&f.trace, "trace", "", "Mooncake-format trace (default ../shared/traces/synthetic_trace.jsonl from the repository root)")
	fs.Float64Var(&f.rate, "rate", 1, "arrival-rate scale (2 = twice as fast)")
	fs.IntVar(&f.limit, "limit", 0, "use only the trace's first N requests (0 = all)")
	fs.Float64Var(&f.size, "size", 1, "generator size scale (number of sessions)")
	fs.IntVar(&f.replicas, "replicas", 8, "replicas in the fleet")
	fs.Uint64Var(&f.seed, "seed", 1, "seed for generators, tie-breaks and event loss")
	fs.DurationVar(&f.delay, "event-delay", 0, "delay of KV events to the router's index")
	fs.Float64Var(&f.loss, "event-loss", 0, "probability a KV-event batch is lost")
	fs.IntVar(&f.gpuBlocks, "gpu-blocks", 0, "GPU KV blocks per replica (default 24576)")
	fs.IntVar(&f.cpuBlocks, "cpu-blocks", -1, "CPU offload blocks per replica (default 131072; 0 = no CPU tier)")
	fs.Float64Var(&f.prefillTPS, "prefill-tps", 0, "prefill tokens/s per replica (default 16000)")
	fs.BoolVar(&f.noFidelity, "no-fidelity", false, "turn the closed-loop cache credit off")
}

func (f *simFlags) fleet() bench.FleetConfig {
	e := bench.DefaultEngine()
	if f.gpuBlocks > 0 {
		e.NumGPUBlocks = f.gpuBlocks
		// A smaller cache also bounds the context: one request must fit.
		e.MaxModelLen = min(e.MaxModelLen, e.NumGPUBlocks*e.BlockSize)
	}
	if f.cpuBlocks >= 0 {
		e.NumCPUBlocks = f.cpuBlocks
	}
	if f.prefillTPS > 0 {
		e.PrefillTokensPerSec = f.prefillTPS
	}
	return bench.FleetConfig{
		Replicas: f.replicas, Engine: e, EventDelay: f.delay, EventLoss: f.loss,
		Seed: f.seed, NoFidelity: f.noFidelity,
	}
}

// load builds the named workloads.
func (f *simFlags) load() ([]*bench.Workload, error) {
	names := strings.Split(f.workloads, ",")
	if f.workloads == "all" {
		names = append([]string{"trace"}, bench.Generators()...)
	}
	var out []*bench.Workload
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "trace" {
			path := f.trace
			if path == "" {
				wd, err := os.Getwd()
				if err != nil {
					return nil, err
				}
				root := bench.RepoRoot(wd)
				if root == "" {
					return nil, fmt.Errorf("%w: no repository root above %s: pass --trace", errUsage, wd)
				}
				path = bench.DefaultTracePath(root)
			}
			w, err := bench.ReadTraceFile(path, bench.TraceOptions{RateScale: f.rate, Limit: f.limit})
			if err != nil {
				return nil, err
			}
			out = append(out, w)
			continue
		}
		w, err := bench.Generate(n, bench.GenOptions{Seed: f.seed, RateScale: f.rate, SizeScale: f.size})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
		out = append(out, w)
	}
	return out, nil
}

// SimReport is `kvbench sim --json`.
type SimReport struct {
	Replicas  int             `json:"replicas"`
	Seed      uint64          `json:"seed"`
	Rate      float64         `json:"rate_scale"`
	Workloads []WorkloadTable `json:"workloads"`
}

// WorkloadTable is one workload's results, one summary per policy.
type WorkloadTable struct {
	Workload string          `json:"workload"`
	Requests int             `json:"requests"`
	Results  []bench.Summary `json:"results"`
}

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf simFlags
	sf.register(fs)
	policies := fs.String("policies", strings.Join(bench.ComparedPolicies(), ","), "policies to compare, comma-separated")
	asJSON := fs.Bool("json", false, "print JSON instead of Markdown tables")
	out := fs.String("out", "", "directory for figures (default cmd/kvbench/out under the repository root)")
	noPlots := fs.Bool("no-plots", false, "write no figures")
	quiet := fs.Bool("q", false, "no progress on stderr")
	knobs := fs.String("knobs", "", "policy knobs, comma-separated policy.knob=value (as kvbench tune names them)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	names := splitList(*policies)
	pcfg, err := parseKnobs(*knobs)
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, err := policy.New(n, pcfg); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	ws, err := sf.load()
	if err != nil {
		return err
	}
	dir := *out
	if dir == "" && !*noPlots {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		root := bench.RepoRoot(wd)
		if root == "" {
			root = wd
		}
		dir = root + "/cmd/kvbench/out"
	}
	rep := SimReport{Replicas: sf.replicas, Seed: sf.seed, Rate: sf.rate}
	for _, w := range ws {
		started := time.Now()
		runs, err := bench.Compare(ctx, w, names, pcfg, sf.fleet(), func(r *bench.Run) {
			if !*quiet {
				s := bench.Summarize(r)
				fmt.Fprintf(stderr, "%s/%s: ttft mean %.3fs p99 %.3fs hit %.3f/%.3f cv %.3f (%.1fs)\n",
					r.Workload, r.Policy, s.TTFTMean, s.TTFTP99, s.HitRate, s.Ceiling, s.LoadCV, time.Since(started).Seconds())
				started = time.Now()
			}
		})
		if err != nil {
			return err
		}
		t := WorkloadTable{Workload: w.Name, Requests: w.Requests()}
		for _, r := range runs {
			t.Results = append(t.Results, bench.Summarize(r))
		}
		rep.Workloads = append(rep.Workloads, t)
		if !*noPlots {
			if err := plotRuns(dir, w.Name, runs); err != nil {
				return err
			}
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	for _, t := range rep.Workloads {
		writeTable(stdout, t)
	}
	return nil
}

// parseKnobs reads "policy.knob=value,..." into a policy config.
func parseKnobs(s string) (policy.Config, error) {
	var cfg policy.Config
	for _, kv := range splitList(s) {
		name, val, ok := strings.Cut(kv, "=")
		pol, knob, ok2 := strings.Cut(name, ".")
		if !ok || !ok2 {
			return cfg, fmt.Errorf("%w: knob %q: want policy.knob=value", errUsage, kv)
		}
		v, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return cfg, fmt.Errorf("%w: knob %q: %w", errUsage, kv, err)
		}
		found := false
		for _, k := range bench.Knobs(pol) {
			if k.Name == knob {
				k.Set(&cfg, v)
				found = true
			}
		}
		if !found {
			return cfg, fmt.Errorf("%w: knob %q: policy %q has no knob %q", errUsage, kv, pol, knob)
		}
	}
	return cfg, cfg.Validate()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// writeTable prints one workload's Markdown table.
func writeTable(w io.Writer, t WorkloadTable) {
	fmt.Fprintf(w, "### %s (%d requests)\n\n", t.Workload, t.Requests)
	fmt.Fprintln(w, "| policy | TTFT mean s | p50 s | p90 s | p99 s | E2E p99 s | tok/s | hit rate | ceiling | hit/ceiling | load CV | makespan s |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, s := range t.Results {
		fmt.Fprintf(w, "| %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.0f | %.3f | %.3f | %.3f | %.3f | %.1f |\n",
			s.Policy, s.TTFTMean, s.TTFTP50, s.TTFTP90, s.TTFTP99, s.E2EP99, s.Throughput,
			s.HitRate, s.Ceiling, s.HitOverCeiling, s.LoadCV, s.Makespan)
	}
	fmt.Fprintln(w)
}
