package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/policy"
	"github.com/kvroute/kvroute/pkg/route"
)

// simFlags are the flags shared by sim and tune.
type simFlags struct {
	workloads   string
	trace       string
	rate        float64
	limit       int
	traceBlock  int
	repeat      int
	windows     bool
	size        float64
	replicas    int
	seed        uint64
	delay       time.Duration
	pending     time.Duration
	loss        float64
	gpuBlocks   int
	blockSize   int
	cpuBlocks   int
	prefillTPS  float64
	speeds      []float64
	changes     []bench.SpeedChange
	noFidelity  bool
	maxTokens   int
	completions bool
}

func (f *simFlags) register(fs *flag.FlagSet) {
	f.registerWorkload(fs)
	fs.IntVar(&f.replicas, "replicas", 8, "replicas in the fleet")
	f.registerFleet(fs)
}

// registerWorkload registers the flags that choose and generate the
// workloads (load reads only these): a live run's fleet is real, and the
// simulated fleet's flags would be accepted and ignored there.
func (f *simFlags) registerWorkload(fs *flag.FlagSet) {
	fs.StringVar(&f.workloads, "workload", "trace", "workloads, comma-separated: trace, "+strings.Join(bench.Generators(), ", ")+", or all (the bar's: every one but reasoning)")
	fs.Float64Var(&f.rate, "rate", 1, "arrival-rate scale (2 = twice as fast)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed for generators, tie-breaks and event loss")
	f.registerSource(fs)
}

// registerSource registers the flags that shape the workloads' content.
func (f *simFlags) registerSource(fs *flag.FlagSet) {
	fs.StringVar(&f.trace, "trace", "", "Mooncake-format trace (default shared/traces/synthetic_trace.jsonl in the nearest directory above the repository root that has it)")
	fs.IntVar(&f.limit, "limit", 0, "use only the trace's first N requests (0 = all)")
	fs.IntVar(&f.traceBlock, "trace-block", 0, "tokens per hash id of the trace (0: Mooncake's 512 when every line fits it, otherwise the block size the lines fit)")
	fs.BoolVar(&f.windows, "trace-windows", false, "with -limit, each seed replays its own window of the trace: seed s starts at request frac((s-1)*0.618...)*(N-limit), so that seed 1 is the trace's start and seeds sample the whole trace rather than replay one piece of it (the trace has no seed of its own)")
	fs.IntVar(&f.repeat, "repeat", 1, "replay the trace this many times back to back, each copy with its own block ids (3 gives 11,979 requests)")
	fs.Float64Var(&f.size, "size", 1, "generator size scale (number of sessions)")
}

// registerFleet registers the engine and router flags (all but the
// number of replicas).
func (f *simFlags) registerFleet(fs *flag.FlagSet) {
	fs.DurationVar(&f.delay, "event-delay", 0, "delay of KV events to the router's index")
	fs.DurationVar(&f.pending, "pending-ttl", route.DefaultPendingTTL, "remember the prefixes the router just sent for this long (kvroute's routing.pending_ttl, same default; only the kvroute policy weighs them; 0: off)")
	fs.Float64Var(&f.loss, "event-loss", 0, "probability a KV-event batch is lost")
	fs.IntVar(&f.gpuBlocks, "gpu-blocks", 0, "GPU KV blocks per replica (default 24576 blocks of 16 tokens; with -block-size, the same memory in bigger blocks)")
	fs.IntVar(&f.blockSize, "block-size", 0, "KV block size in tokens of engines and router (default 16); bigger blocks keep GPU and CPU memory in tokens and cut the simulator's per-block work")
	fs.IntVar(&f.cpuBlocks, "cpu-blocks", -1, "CPU offload blocks per replica (default 131072; 0 = no CPU tier)")
	fs.Float64Var(&f.prefillTPS, "prefill-tps", 0, "prefill tokens/s per replica (default 16000)")
	fs.Func("speeds", "a mixed fleet: speed multipliers of the replicas, comma-separated, cycled over them (e.g. 2,1,1,0.5: a replica's prefill tokens/s times it, its decode steps divided by it; utilization counts the fleet's total); default every replica 1", func(v string) error {
		f.speeds = f.speeds[:0]
		for _, x := range splitList(v) {
			sp, err := strconv.ParseFloat(x, 64)
			if err != nil {
				return fmt.Errorf("%q is not a number", x)
			}
			if err := bench.CheckSpeed(sp); err != nil {
				return err
			}
			f.speeds = append(f.speeds, sp)
		}
		if len(f.speeds) == 0 {
			return errors.New("at least one speed")
		}
		return nil
	})
	fs.Func("speed-change", "change replicas' speeds during the run, comma-separated replica@time:speed (e.g. 0@20s:0.33: replica 0 runs at a third of its speed from 20 s after the first request on, as a throttled GPU would; the speed multiplies the engine's as -speeds does; utilization still counts the starting speeds)", func(v string) error {
		f.changes = f.changes[:0]
		for _, x := range splitList(v) {
			ch, err := parseSpeedChange(x)
			if err != nil {
				return err
			}
			f.changes = append(f.changes, ch)
		}
		if len(f.changes) == 0 {
			return errors.New("at least one change")
		}
		return nil
	})
	fs.IntVar(&f.maxTokens, "max-tokens", 0, "what clients send as max_tokens: 0, each request's exact output (as kvbench live's client does); N > 0, a fixed cap (N, or the output if larger; the engine still stops at the output); -1, none")
	fs.BoolVar(&f.noFidelity, "no-fidelity", false, "turn the closed-loop cache credit off")
	fs.BoolVar(&f.completions, "completions", false, "clients send /v1/completions prompts, as kvbench live does, not chat messages: no request carries a conversation key, so a session with neither a header nor a user field is keyed only by the conversation the router finds its prompt continues")
}

// parseSpeedChange parses one replica@time:speed.
func parseSpeedChange(x string) (bench.SpeedChange, error) {
	rep, rest, ok1 := strings.Cut(x, "@")
	at, sp, ok2 := strings.Cut(rest, ":")
	if !ok1 || !ok2 {
		return bench.SpeedChange{}, fmt.Errorf("%q is not replica@time:speed", x)
	}
	var ch bench.SpeedChange
	var err error
	if ch.Replica, err = strconv.Atoi(rep); err != nil || ch.Replica < 0 {
		return ch, fmt.Errorf("%q: replica %q is not a replica number", x, rep)
	}
	if ch.At, err = time.ParseDuration(at); err != nil || ch.At < 0 {
		return ch, fmt.Errorf("%q: time %q is not a non-negative duration", x, at)
	}
	if ch.Speed, err = strconv.ParseFloat(sp, 64); err != nil {
		return ch, fmt.Errorf("%q: speed %q is not a number", x, sp)
	}
	return ch, bench.CheckSpeed(ch.Speed)
}

func (f *simFlags) fleet() bench.FleetConfig {
	e := bench.DefaultEngine()
	if f.blockSize > 0 && f.blockSize != e.BlockSize {
		// Same memory in tokens, rounded down to whole blocks.
		e.NumGPUBlocks = e.NumGPUBlocks * e.BlockSize / f.blockSize
		e.NumCPUBlocks = e.NumCPUBlocks * e.BlockSize / f.blockSize
		e.BlockSize = f.blockSize
	}
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
		Replicas: f.replicas, Engine: e, EventDelay: f.delay, EventLoss: f.loss, PendingTTL: f.pending,
		Seed: f.seed, NoFidelity: f.noFidelity, Completions: f.completions, Speeds: f.speeds, SpeedChanges: f.changes,
		MaxTokens: f.maxTokens,
	}
}

// tracePath is -trace, or the shared trace above the repository root.
func (f *simFlags) tracePath() (string, error) {
	if f.trace != "" {
		return f.trace, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root := bench.RepoRoot(wd)
	if root == "" {
		return "", fmt.Errorf("%w: no repository root above %s: pass -trace", errUsage, wd)
	}
	return bench.DefaultTracePath(root), nil
}

// traceWindowed reports whether the workloads include the trace and each
// seed replays its own window of it (-trace-windows with -limit).
func (f *simFlags) traceWindowed() bool {
	return f.windows && f.limit > 0 && slices.Contains(f.workloadNames(), "trace")
}

// readTrace reads the trace at the given rate scale: its first -limit
// requests, or with -trace-windows seed's window of them
// (bench.TraceWindow). A block size found from the lines other than
// Mooncake's 512 is said on stderr, so that a trace cut at a size nobody
// meant is not replayed unnoticed.
func (f *simFlags) readTrace(rate float64, seed uint64) (*bench.Workload, error) {
	path, err := f.tracePath()
	if err != nil {
		return nil, err
	}
	opt := bench.TraceOptions{RateScale: rate, Limit: f.limit, Repeat: f.repeat, BlockTokens: f.traceBlock}
	if f.windows {
		opt.Window = seed
	}
	w, err := bench.ReadTraceFile(path, opt)
	if err != nil {
		return nil, err
	}
	if b := w.Sessions[0].Turns[0].TraceBlock; f.traceBlock == 0 && b != kvblock.TraceBlockTokens {
		fmt.Fprintf(os.Stderr, "%s: %d tokens a hash id, the block size every line fits (-trace-block sets it)\n", path, b)
	}
	return w, nil
}

// load builds the named workloads.
func (f *simFlags) load() ([]*bench.Workload, error) {
	names := f.workloadNames()
	var out []*bench.Workload
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "trace" {
			w, err := f.readTrace(f.rate, f.seed)
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
	Replicas int      `json:"replicas"`
	Seeds    []uint64 `json:"seeds"`
	// Rate is the arrival-rate scale when no -util was given (0 otherwise).
	Rate float64 `json:"rate_scale,omitempty"`
	// TraceWindows is set when each seed replayed its own window of the
	// trace (-trace-windows), not the trace's first -limit requests.
	TraceWindows bool            `json:"trace_windows,omitempty"`
	Workloads    []WorkloadTable `json:"workloads"`
}

// WorkloadTable is one workload at one rate: one aggregate per policy,
// medians and ranges over the seeds.
type WorkloadTable struct {
	Workload string `json:"workload"`
	Requests int    `json:"requests"`
	// Util is the -util target (0 when the rate came from -rate);
	// OfferedUtil the workload's offered prefill load over the fleet's
	// prefill capacity (median over the seeds' workloads).
	Util        float64           `json:"util,omitempty"`
	OfferedUtil float64           `json:"offered_util"`
	Results     []bench.Aggregate `json:"results"`
}

// gridFlags are the flags of sim and matrix that pick seeds, rates and
// parallelism.
type gridFlags struct {
	seeds      string
	utils      string
	duration   time.Duration
	parallel   int
	cpuProfile string
}

func (g *gridFlags) register(fs *flag.FlagSet, defaultUtils string, defaultDuration time.Duration) {
	fs.DurationVar(&g.duration, "duration", defaultDuration, "with -util: size each generator so that its sessions start over this much simulated time at the case's utilization (more sessions for bigger fleets and higher utilization, and as many as it takes to reach the utilization; -size is then ignored; the trace keeps its length); 0 uses -size")
	fs.StringVar(&g.seeds, "seeds", "", "seeds, e.g. 1-5 or 1,3,7: every case runs once per seed (generator, tie-breaks, event loss) and tables show medians and min-max (default: -seed)")
	fs.StringVar(&g.utils, "util", defaultUtils, "offered prefill utilizations, comma-separated (e.g. 0.5,0.8,0.95,1.1): each sets the session start rate so that the prompt tokens per second arriving in the workload's bulk (10th to 90th percentile arrival, turns timed as on a fleet that never queues) over replicas x prefill tokens/s equals it (overrides -rate); a workload too small to reach it runs at the most it reaches, which the offered column shows")
	fs.IntVar(&g.parallel, "parallel", 0, "simulations run at once (default GOMAXPROCS); results do not depend on it")
	fs.StringVar(&g.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file")
}

// profile starts the CPU profile when asked; the returned stop is never nil.
func (g *gridFlags) profile() (stop func(), err error) {
	if g.cpuProfile == "" {
		return func() {}, nil
	}
	f, err := os.Create(g.cpuProfile)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// parse returns the seeds (the -seed value when -seeds is empty) and the
// utilizations (none when -util is empty).
func (g *gridFlags) parse(seed uint64) ([]uint64, []float64, error) {
	seeds := []uint64{seed}
	if g.seeds != "" {
		var err error
		if seeds, err = bench.ParseSeeds(g.seeds); err != nil {
			return nil, nil, fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	var utils []float64
	for _, u := range splitList(g.utils) {
		v, err := strconv.ParseFloat(u, 64)
		if err != nil || !(v > 0) || v > 100 {
			return nil, nil, fmt.Errorf("%w: -util %q: %q is not a utilization in (0, 100]", errUsage, g.utils, u)
		}
		utils = append(utils, v)
	}
	return seeds, utils, nil
}

func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var sf simFlags
	sf.register(fs)
	var gf gridFlags
	gf.register(fs, "", 0)
	policies := fs.String("policies", strings.Join(bench.ComparedPolicies(), ","), "policies to compare, comma-separated")
	asJSON := fs.Bool("json", false, "print JSON instead of Markdown tables")
	out := fs.String("out", "", "directory for figures (default cmd/kvbench/out under the repository root); figures show the first seed")
	noPlots := fs.Bool("no-plots", false, "write no figures")
	quiet := fs.Bool("q", false, "no progress on stderr")
	knobs := fs.String("knobs", "", "policy knobs, comma-separated policy.knob=value (as kvbench tune names them)")
	if err := parseArgs(fs, args); err != nil {
		return err
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
	seeds, utils, err := gf.parse(sf.seed)
	if err != nil {
		return err
	}
	if len(utils) > 0 {
		sf.rate = 1
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
	fleet := sf.fleet()
	g, err := buildGrid(&sf, sf.workloadNames(), seeds, utils, gf.duration, []bench.FleetConfig{fleet}, names, pcfg, !*noPlots, nil)
	if err != nil {
		return err
	}
	results, err := g.run(ctx, &gf, *quiet, stderr)
	if err != nil {
		return err
	}
	rep := SimReport{Replicas: sf.replicas, Seeds: seeds, TraceWindows: sf.traceWindowed()}
	if len(utils) == 0 {
		rep.Rate = sf.rate
	}
	for _, cell := range g.cells {
		t := WorkloadTable{Workload: cell.workload, Requests: cell.requests, Util: cell.util}
		var offered []float64
		for _, pol := range cell.policies {
			var ss []bench.Summary
			for _, ci := range pol {
				ss = append(ss, results[ci].Summary)
			}
			a := bench.AggregateSeeds(seeds, ss)
			t.Results = append(t.Results, a)
			offered = append(offered, a.OfferedUtil.Median)
		}
		t.OfferedUtil = bench.SpreadOf(offered).Median
		rep.Workloads = append(rep.Workloads, t)
		if !*noPlots {
			var runs []*bench.Run
			for _, pol := range cell.policies {
				runs = append(runs, results[pol[0]].Run)
			}
			name := cell.workload
			if cell.util > 0 {
				name += "-u" + strconv.FormatFloat(cell.util, 'f', -1, 64)
			}
			if err := plotRuns(dir, name, runs); err != nil {
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

// writeTable prints one workload's Markdown table: medians over the seeds,
// with the range of mean and p99 TTFT when there is more than one seed.
func writeTable(w io.Writer, t WorkloadTable) {
	seeds := 0
	if len(t.Results) > 0 {
		seeds = len(t.Results[0].Seeds)
	}
	util := fmt.Sprintf("offered utilization %.2f", t.OfferedUtil)
	if t.Util > 0 {
		util = fmt.Sprintf("utilization %.2f", t.Util)
	}
	if seeds > 1 {
		fmt.Fprintf(w, "### %s (%d requests, %s; medians of %d seeds)\n\n", t.Workload, t.Requests, util, seeds)
		fmt.Fprintln(w, "| policy | TTFT mean s | mean range | p50 s | p90 s | p99 s | p99 range | E2E p99 s | tok/s | hit rate | ceiling | hit/ceiling | load CV | preemptions | queue factor | run util | makespan s |")
		fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, a := range t.Results {
			fmt.Fprintf(w, "| %s | %.3f | %.3f–%.3f | %.3f | %.3f | %.3f | %.3f–%.3f | %.2f | %.0f | %.3f | %.3f | %.3f | %.3f | %.0f | %.2f | %.2f | %.1f |\n",
				a.Policy, a.TTFTMean.Median, a.TTFTMean.Min, a.TTFTMean.Max, a.TTFTP50.Median, a.TTFTP90.Median,
				a.TTFTP99.Median, a.TTFTP99.Min, a.TTFTP99.Max, a.E2EP99.Median, a.Throughput.Median,
				a.HitRate.Median, a.Ceiling.Median, a.HitOverCeiling.Median, a.LoadCV.Median,
				a.Preemptions.Median, a.QueueFactor.Median, a.RunUtil.Median, a.Makespan.Median)
		}
		fmt.Fprintln(w)
		return
	}
	fmt.Fprintf(w, "### %s (%d requests, %s; one seed: compare policies with -seeds 1-5)\n\n", t.Workload, t.Requests, util)
	fmt.Fprintln(w, "| policy | TTFT mean s | p50 s | p90 s | p99 s | E2E p99 s | tok/s | hit rate | ceiling | hit/ceiling | load CV | preemptions | queue factor | run util | makespan s |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, a := range t.Results {
		fmt.Fprintf(w, "| %s | %.3f | %.3f | %.3f | %.3f | %.2f | %.0f | %.3f | %.3f | %.3f | %.3f | %.0f | %.2f | %.2f | %.1f |\n",
			a.Policy, a.TTFTMean.Median, a.TTFTP50.Median, a.TTFTP90.Median, a.TTFTP99.Median, a.E2EP99.Median,
			a.Throughput.Median, a.HitRate.Median, a.Ceiling.Median, a.HitOverCeiling.Median, a.LoadCV.Median,
			a.Preemptions.Median, a.QueueFactor.Median, a.RunUtil.Median, a.Makespan.Median)
	}
	fmt.Fprintln(w)
}
