package overhead

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// Tokenizer modes for kvroute.
const (
	TokenizerLocal  = "local"  // Qwen3 tokenizer files, in process
	TokenizerRemote = "remote" // the engines' /tokenize (kvroute's default)
)

// Options configure Run.
type Options struct {
	// Bin holds the kvroute and enginesim binaries (make build).
	Bin string
	// Root is the repository (envoy/envoy.yaml); default found upward
	// from the working directory.
	Root string
	// Workloads to run, in order; default DefaultWorkloads.
	Workloads []Workload
	// Duration of one phase (one target, one workload); default 10s.
	Duration time.Duration
	// Runs alternate kvroute and round robin this many times; default 1.
	Runs int
	// Tokenizer is TokenizerLocal (default when TokenizerDir has the
	// files) or TokenizerRemote.
	Tokenizer string
	// TokenizerDir holds tokenizer.json and tokenizer_config.json for the
	// local tokenizer; default <Root>/.cache/tokenizers/qwen3.
	TokenizerDir string
	// Engines is the number of simulated engines; default 4.
	Engines int
	// EnvoyConcurrency is each Envoy's worker threads; default 2.
	EnvoyConcurrency int
	// Events keeps the engines' KV event streams on (kvroute then also
	// spends CPU indexing every prompt block; off by default: the
	// simulated engines count one token per byte, four times a real
	// tokenizer's blocks).
	Events bool
	// ProfileDir, when set, receives profiles of kvroute for each of its
	// phases, for go tool pprof: CPU, allocations, mutex contention and
	// blocking (<workload>-run<N>.{cpu,allocs,mutex,block}.pprof, from its admin
	// /debug/pprof/; kvroute then runs with --profile-contention).
	ProfileDir string
	// KVRouteYAML is appended to kvroute's configuration (e.g.
	// "routing: {usage_sample_every: 8}\n").
	KVRouteYAML string
	// KVRouteEnv are NAME=VALUE variables added to kvroute's environment
	// alone (e.g. GOMAXPROCS=1), not the engines' or this process's.
	KVRouteEnv []string
	// Floor adds a third target: an Envoy with kvroute's configuration
	// whose ext_proc is extproc.FloorProcessor in a process of its own (this
	// binary's extproc-floor subcommand; FloorBin), measured like kvroute:
	// what the protocol costs before kvroute decides anything.
	Floor bool
	// FloorBin is the program serving the floor, run as `FloorBin
	// extproc-floor -listen ADDR -endpoints A,B,...`; default this
	// process's own executable (kvbench).
	FloorBin string
	// Log receives progress lines; nil discards.
	Log io.Writer
}

// DefaultWorkloads are issue 11's loads: small chats at 200 and 500
// req/s, 229 KB chats at concurrency 32 and 150, 533 KB (≈100k-token)
// chats one at a time.
func DefaultWorkloads() []Workload {
	return []Workload{
		{Name: "small", BodyBytes: 1 << 10, Rate: 200},
		{Name: "small", BodyBytes: 1 << 10, Rate: 500},
		{Name: "229KB", BodyBytes: 229_000, Concurrency: 32},
		{Name: "229KB", BodyBytes: 229_000, Concurrency: 150},
		{Name: "533KB", BodyBytes: 533_000, Concurrency: 1},
	}
}

// Phase is one target's measurement of one workload in one run.
type Phase struct {
	Workload Workload
	Target   string // "kvroute", "round-robin" or "floor"
	Run      int
	Stats    Stats
}

// Row compares the targets on one workload: medians over runs.
type Row struct {
	Workload        Workload
	KVRoute, RR     Stats
	AddedTTFTp50    time.Duration
	AddedTTFTp99    time.Duration
	AddedE2Ep50     time.Duration
	AddedE2Ep99     time.Duration
	AddedITLp50     time.Duration
	ThroughputRatio float64 // kvroute / round robin
	// Floor is the floor target's medians (Options.Floor; else zero), and
	// FloorAddedE2Ep50/p99 its end-to-end latency over round robin's.
	Floor                              Stats
	FloorAddedE2Ep50, FloorAddedE2Ep99 time.Duration
}

// Report is a whole run.
type Report struct {
	Phases []Phase
	Rows   []Row
	// Demoted: kvroute's local tokenizer was demoted by its self-check
	// during the run (its requests then went to the engines' /tokenize).
	Demoted bool
}

const model = "sim-model"

func (o *Options) defaults() error {
	if o.Root == "" {
		r, err := testbed.RepoRoot()
		if err != nil {
			return err
		}
		o.Root = r
	}
	if o.Bin == "" {
		o.Bin = filepath.Join(o.Root, "bin")
	}
	if len(o.Workloads) == 0 {
		o.Workloads = DefaultWorkloads()
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.Runs <= 0 {
		o.Runs = 1
	}
	if o.Engines <= 0 {
		o.Engines = 4
	}
	if o.EnvoyConcurrency <= 0 {
		o.EnvoyConcurrency = 2
	}
	if o.TokenizerDir == "" {
		cache := os.Getenv("KVROUTE_TOKENIZER_CACHE") // as make fixtures sets it
		if cache == "" {
			cache = filepath.Join(o.Root, ".cache", "tokenizers")
		}
		o.TokenizerDir = filepath.Join(cache, "qwen3")
	}
	if o.Tokenizer == "" {
		o.Tokenizer = TokenizerLocal
		if _, err := os.Stat(filepath.Join(o.TokenizerDir, "tokenizer.json")); err != nil {
			o.Tokenizer = TokenizerRemote
		}
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.Floor && o.FloorBin == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		o.FloorBin = exe
	}
	switch o.Tokenizer {
	case TokenizerLocal, TokenizerRemote:
	default:
		return fmt.Errorf("tokenizer %q: want local or remote", o.Tokenizer)
	}
	for _, kv := range o.KVRouteEnv {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" {
			return fmt.Errorf("kvroute environment %q: want NAME=VALUE", kv)
		}
	}
	for _, w := range o.Workloads {
		if w.BodyBytes <= 0 || (w.Rate <= 0 && w.Concurrency <= 0) {
			return fmt.Errorf("workload %s: needs a body size and a rate or a concurrency", w.Name)
		}
	}
	return nil
}

func (o *Options) kvrouteExtra() string {
	var b strings.Builder
	b.WriteString("telemetry: {log_level: warn}\n")
	if o.Tokenizer == TokenizerLocal {
		fmt.Fprintf(&b, "tokenizer:\n  models:\n    %s: {kind: local, tokenizer_json: %q, tokenizer_config: %q}\n",
			model, filepath.Join(o.TokenizerDir, "tokenizer.json"), filepath.Join(o.TokenizerDir, "tokenizer_config.json"))
	} else {
		b.WriteString("tokenizer:\n  default: {kind: remote}\n")
	}
	if o.KVRouteYAML != "" {
		b.WriteString(strings.TrimSuffix(o.KVRouteYAML, "\n") + "\n")
	}
	return b.String()
}

// Run starts the stack, measures every workload on every target (kvroute,
// round robin and, with Options.Floor, the floor) and stops everything it
// started.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	ws, err := testbed.NewWorkspace(o.Bin, o.Root, "kvbench-overhead")
	if err != nil {
		return nil, err
	}
	defer func() { _ = ws.Close() }()
	bin, tmpl, g := ws.Bin, ws.Envoy, ws.Group

	engineArgs := []string{
		// One token per millisecond: fast, yet slower than one router round
		// trip per chunk, as real engines are (a faster stream would queue
		// chunks behind the router and turn per-chunk cost into delay).
		"--speed", "10", "--decode-step-ms", "10", "--decode-step-per-seq-ms", "0",
		"--prefill-tokens-per-s", "1e9", "--max-model-len", "4000000", "--max-num-batched-tokens", "4000000",
		"--num-gpu-blocks", "4000000", "--max-num-seqs", "1024", "--log-level", "warn",
	}
	if _, err := os.Stat(filepath.Join(o.TokenizerDir, "tokenizer_config.json")); err == nil {
		// The engines' /tokenize answers with the same tokenizer as
		// kvroute's local one, as a real engine would: the remote mode
		// then pays a real tokenizer's answer, and kvroute's self-check
		// agrees with the engines instead of demoting its local
		// tokenizer to their byte tokenizer on its first sample.
		engineArgs = append(engineArgs, "--tokenizer-dir", o.TokenizerDir)
	}
	kvArgs := []string{}
	if o.ProfileDir != "" {
		kvArgs = append(kvArgs, "--profile-contention")
	}
	if !o.Events {
		// A fleet without events: no endpoints in kvroute's config either,
		// so kvroute routes on its dispatch-learned index, as such a
		// deployment does (listing endpoints that never publish made every
		// replica event-fed with an empty index, and every request a
		// pending-prefix record).
		engineArgs = append(engineArgs, "--kv-events-disable")
		kvArgs = append(kvArgs, "--warm-timeout", "1s")
	}
	so := testbed.StackOptions{
		Bin: bin, Envoy: tmpl, Engines: o.Engines, Model: model,
		EngineArgs:   func(int) []string { return engineArgs },
		KVRouteExtra: o.kvrouteExtra(), KVRouteArgs: kvArgs, KVRouteEnv: o.KVRouteEnv,
		EnvoyConcurrency: o.EnvoyConcurrency, NoEvents: !o.Events,
	}
	fmt.Fprintf(o.Log, "starting %d engines, kvroute (%s tokenizer%s), Envoy via kvroute and a plain round-robin Envoy\n",
		o.Engines, o.Tokenizer, strings.Join(append([]string{""}, o.KVRouteEnv...), ", "))
	st, err := testbed.StartStack(ctx, g, so)
	if err != nil {
		return nil, err
	}
	plain, err := st.StartPlainEnvoy(ctx, g, so)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "kvroute pid %d; Envoy via kvroute %s, plain Envoy %s\n", st.KV.Proc.Pid(), st.Envoy.URL(), plain.URL())
	var floor *floorTarget
	if o.Floor {
		if floor, err = startFloor(ctx, g, o, st, so); err != nil {
			return nil, err
		}
		fmt.Fprintf(o.Log, "floor processor pid %d; Envoy via the floor %s\n", floor.proc.Pid(), floor.envoy.URL())
	}
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute, DisableCompression: true,
	}}
	defer client.CloseIdleConnections()
	type target struct {
		name  string
		url   string
		envoy int // pid
		proc  int // the ext_proc server's pid (0: none)
	}
	targets := []target{{"kvroute", st.Envoy.URL(), st.Envoy.Proc.Pid(), st.KV.Proc.Pid()}, {"round-robin", plain.URL(), plain.Proc.Pid(), 0}}
	if floor != nil {
		targets = append(targets, target{"floor", floor.envoy.URL(), floor.envoy.Proc.Pid(), floor.proc.Pid()})
	}

	rep := &Report{}
	for _, w := range o.Workloads {
		f := newBodyFactory(model, w.BodyBytes)
		// Warm both paths (connections, tokenizer, template) before timing.
		for _, t := range targets {
			for range 3 {
				send(ctx, client, t.url, f.next())
			}
		}
		for run := range o.Runs {
			for _, t := range targets {
				if ctx.Err() != nil {
					return rep, ctx.Err()
				}
				var cpu0 time.Duration
				if t.proc != 0 {
					cpu0, _ = procCPU(t.proc)
				}
				cpuAt := time.Now()
				ecpu0, eerr := procCPU(t.envoy)
				var dec0, fb0 float64
				if t.name == "kvroute" { // its metrics, read around its own phases only
					dec0, _ = decisions(ctx, st.KV)
					fb0, _ = fallbacks(ctx, st.KV)
				}
				var profs []<-chan error
				if t.name == "kvroute" && o.ProfileDir != "" {
					for _, kind := range []string{"cpu", "allocs", "mutex", "block"} {
						path := filepath.Join(o.ProfileDir, fmt.Sprintf("%s-run%d.%s.pprof", w.slug(), run+1, kind))
						profs = append(profs, profile(ctx, st.KV, kind, o.Duration, path))
					}
				}
				start := time.Now()
				rs, late := drive(ctx, client, t.url, w, f, o.Duration)
				s := summarize(rs, time.Since(start), late)
				if ecpu1, err := procCPU(t.envoy); err == nil && eerr == nil && s.Requests > 0 {
					s.EnvoyCPUPerRequest = (ecpu1 - ecpu0) / time.Duration(s.Requests)
				}
				for _, p := range profs {
					if err := <-p; err != nil {
						fmt.Fprintf(o.Log, "profile: %v\n", err)
					}
				}
				if t.proc != 0 {
					cpu1, err := procCPU(t.proc)
					if wall := time.Since(cpuAt); err == nil && wall > 0 {
						s.CPUCores = float64(cpu1-cpu0) / float64(wall)
					}
					if err == nil && s.Requests > 0 {
						s.CPUPerRequest = (cpu1 - cpu0) / time.Duration(s.Requests)
					}
				}
				if t.name == "kvroute" {
					dec1, _ := decisions(ctx, st.KV)
					fb1, _ := fallbacks(ctx, st.KV)
					s.Fallbacks = int(fb1 - fb0)
					if s.Requests > 0 {
						s.Routed = (dec1 - dec0) / float64(s.Requests)
					}
				}
				rep.Phases = append(rep.Phases, Phase{Workload: w, Target: t.name, Run: run, Stats: s})
				fmt.Fprintf(o.Log, "%-28s %-11s run %d: %d requests, %d errors, e2e p50 %v p99 %v, %.1f req/s\n",
					w, t.name, run+1, s.Requests, s.Errors, s.E2Ep50.Round(10*time.Microsecond), s.E2Ep99.Round(10*time.Microsecond), s.Throughput)
			}
		}
		rep.Rows = append(rep.Rows, row(w, rep.Phases))
	}
	if !st.KV.Proc.Running() {
		return rep, errors.New("kvroute exited during the run: " + st.KV.Proc.Tail(2000))
	}
	if o.Tokenizer == TokenizerLocal {
		// A demoted local tokenizer (the self-check found the engines
		// disagreeing) serves every request remotely: say so, the
		// figures are then the remote tokenizer's.
		if exact, err := metricSum(ctx, st.KV, "kvroute_tokenizer_local_exact{"); err == nil && exact == 0 {
			rep.Demoted = true
			fmt.Fprintln(o.Log, "WARNING: kvroute's local tokenizer was demoted by its self-check; requests went to the engines' /tokenize")
		}
	}
	return rep, nil
}

// row takes the medians of a workload's phases per target.
func row(w Workload, phases []Phase) Row {
	pick := func(target string) []Stats {
		var out []Stats
		for _, p := range phases {
			if p.Workload == w && p.Target == target {
				out = append(out, p.Stats)
			}
		}
		return out
	}
	kv, rr := medianStats(pick("kvroute")), medianStats(pick("round-robin"))
	r := Row{Workload: w, KVRoute: kv, RR: rr,
		AddedTTFTp50: kv.TTFTp50 - rr.TTFTp50, AddedTTFTp99: kv.TTFTp99 - rr.TTFTp99,
		AddedE2Ep50: kv.E2Ep50 - rr.E2Ep50, AddedE2Ep99: kv.E2Ep99 - rr.E2Ep99,
		AddedITLp50: kv.ITLp50 - rr.ITLp50,
	}
	if rr.Throughput > 0 {
		r.ThroughputRatio = kv.Throughput / rr.Throughput
	}
	if fl := pick("floor"); len(fl) > 0 {
		r.Floor = medianStats(fl)
		r.FloorAddedE2Ep50, r.FloorAddedE2Ep99 = r.Floor.E2Ep50-rr.E2Ep50, r.Floor.E2Ep99-rr.E2Ep99
	}
	return r
}

// medianStats takes each field's median over runs.
func medianStats(ss []Stats) Stats {
	if len(ss) == 0 {
		return Stats{}
	}
	md := func(get func(Stats) time.Duration) time.Duration {
		xs := make([]time.Duration, len(ss))
		for i, s := range ss {
			xs[i] = get(s)
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	mf := func(get func(Stats) float64) float64 {
		xs := make([]float64, len(ss))
		for i, s := range ss {
			xs[i] = get(s)
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	out := Stats{
		TTFTp50: md(func(s Stats) time.Duration { return s.TTFTp50 }), TTFTp99: md(func(s Stats) time.Duration { return s.TTFTp99 }),
		E2Ep50: md(func(s Stats) time.Duration { return s.E2Ep50 }), E2Ep99: md(func(s Stats) time.Duration { return s.E2Ep99 }),
		ITLp50:             md(func(s Stats) time.Duration { return s.ITLp50 }),
		CPUPerRequest:      md(func(s Stats) time.Duration { return s.CPUPerRequest }),
		EnvoyCPUPerRequest: md(func(s Stats) time.Duration { return s.EnvoyCPUPerRequest }),
		Throughput:         mf(func(s Stats) float64 { return s.Throughput }),
		CPUCores:           mf(func(s Stats) float64 { return s.CPUCores }),
		Routed:             mf(func(s Stats) float64 { return s.Routed }),
	}
	for _, s := range ss {
		out.Requests += s.Requests
		out.Errors += s.Errors
		out.Late += s.Late
		out.Fallbacks += s.Fallbacks
	}
	return out
}

// Print writes the side-by-side table.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tE2E p50 kvroute/RR\tadded p50\tE2E p99 kvroute/RR\tadded p99\tTTFT p50 added\tITL p50 added\treq/s kvroute/RR\tratio\tkvroute CPU/req\tkvroute cores\tEnvoy CPU/req kvroute/RR\trouted\ttok fallbacks\terrors kv/RR\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s / %s\t%s\t%s / %s\t%s\t%s\t%s\t%.1f / %.1f\t%.2f\t%s\t%.3f\t%s / %s\t%.2f\t%d\t%d / %d\t\n",
			row.Workload, ms(row.KVRoute.E2Ep50), ms(row.RR.E2Ep50), ms(row.AddedE2Ep50),
			ms(row.KVRoute.E2Ep99), ms(row.RR.E2Ep99), ms(row.AddedE2Ep99), ms(row.AddedTTFTp50), us(row.AddedITLp50),
			row.KVRoute.Throughput, row.RR.Throughput, row.ThroughputRatio, us(row.KVRoute.CPUPerRequest), row.KVRoute.CPUCores, us(row.KVRoute.EnvoyCPUPerRequest), us(row.RR.EnvoyCPUPerRequest), row.KVRoute.Routed,
			row.KVRoute.Fallbacks, row.KVRoute.Errors, row.RR.Errors)
	}
	_ = tw.Flush()
	if !slices.ContainsFunc(r.Rows, func(row Row) bool { return row.Floor.Requests > 0 }) {
		return
	}
	fmt.Fprintln(w, "\nThe floor (Envoy with kvroute's configuration, ext_proc answered by the floor processor: round robin, no decision):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "workload\tadded p50 kvroute/floor\tadded p99 kvroute/floor\treq/s kvroute/floor/RR\tprocessor CPU/req kvroute/floor\tEnvoy CPU/req kvroute/floor/RR\terrors floor\t")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s / %s\t%s / %s\t%.1f / %.1f / %.1f\t%s / %s\t%s / %s / %s\t%d\t\n",
			row.Workload, ms(row.AddedE2Ep50), ms(row.FloorAddedE2Ep50), ms(row.AddedE2Ep99), ms(row.FloorAddedE2Ep99),
			row.KVRoute.Throughput, row.Floor.Throughput, row.RR.Throughput, us(row.KVRoute.CPUPerRequest), us(row.Floor.CPUPerRequest),
			us(row.KVRoute.EnvoyCPUPerRequest), us(row.Floor.EnvoyCPUPerRequest), us(row.RR.EnvoyCPUPerRequest), row.Floor.Errors)
	}
	_ = tw.Flush()
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) + " ms" }
func us(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 0, 64) + " µs" }

// profile starts a profile of kvroute over the phase (kind "cpu", or a
// delta profile: "allocs", "mutex", "block"; whole seconds, at least one, from its
// admin /debug/pprof/) and writes it to path; the channel yields the
// outcome once the profile is written.
func profile(ctx context.Context, kv *testbed.KVRoute, kind string, d time.Duration, path string) <-chan error {
	done := make(chan error, 1)
	secs := max(int(d/time.Second), 1)
	endpoint := "/debug/pprof/" + kind
	if kind == "cpu" {
		endpoint = "/debug/pprof/profile"
	}
	go func() {
		done <- func() error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, kv.AdminURL(endpoint+"?seconds="+strconv.Itoa(secs)), nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s: HTTP %d", path, resp.StatusCode)
			}
			if err != nil {
				return err
			}
			return os.WriteFile(path, b, 0o644)
		}()
	}()
	return done
}

// floorTarget is the floor processor's process and the Envoy in front
// of it.
type floorTarget struct {
	proc  *testbed.Proc
	envoy *testbed.Envoy
}

// startFloor starts the floor processor over the stack's engines and an
// Envoy with kvroute's template pointing at it.
func startFloor(ctx context.Context, g *testbed.Group, o Options, st *testbed.Stack, so testbed.StackOptions) (*floorTarget, error) {
	port, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	var eps []string
	for _, p := range st.EnginePorts() {
		eps = append(eps, "127.0.0.1:"+strconv.Itoa(p))
	}
	proc, err := g.Start("extproc-floor", nil, o.FloorBin, "extproc-floor",
		"-listen", "127.0.0.1:"+strconv.Itoa(port), "-endpoints", strings.Join(eps, ","))
	if err != nil {
		return nil, err
	}
	e := &testbed.Envoy{
		Name:        "envoy-floor",
		Config:      testbed.EnvoyConfig{ExtProc: []int{port}, Engines: st.EnginePorts(), UpstreamHeader: so.UpstreamHeader},
		Concurrency: so.EnvoyConcurrency,
	}
	if err := e.Start(ctx, g, so.Bin.Envoy, so.Envoy); err != nil {
		return nil, fmt.Errorf("envoy in front of the floor: %w (floor: %s)", err, proc.Tail(500))
	}
	return &floorTarget{proc: proc, envoy: e}, nil
}

// procCPU is a process's user plus system CPU time from /proc.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the parenthesized command name; utime and stime are
	// fields 14 and 15 (1-based), in clock ticks.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc stat format")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("unexpected /proc stat format")
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / ticks, nil
}

// decisions sums kvroute_decisions_total from kvroute's metrics.
func decisions(ctx context.Context, kv *testbed.KVRoute) (float64, error) {
	return metricSum(ctx, kv, "kvroute_decisions_total{")
}

// fallbacks counts requests routed without their exact tokens so far:
// kvroute's tokenizer fallbacks (every model, kind and reason: routed on
// approximate tokens) plus decisions degraded by a failed or timed-out
// tokenization (routed on load only).
func fallbacks(ctx context.Context, kv *testbed.KVRoute) (float64, error) {
	fb, err := metricSum(ctx, kv, "kvroute_tokenizer_fallbacks_total{")
	if err != nil {
		return 0, err
	}
	blind, err := metricSum(ctx, kv, "kvroute_decisions_total{", `degraded="tokenize_`)
	return fb + blind, err
}

// metricSum adds up the samples of kvroute's metrics whose line starts
// with prefix and contains every one of also.
func metricSum(ctx context.Context, kv *testbed.KVRoute, prefix string, also ...string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, kv.MetricsURL("/metrics"), nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, prefix) || !containsAll(l, also) {
			continue
		}
		if i := strings.LastIndexByte(l, ' '); i > 0 {
			v, err := strconv.ParseFloat(l[i+1:], 64)
			if err == nil {
				total += v
			}
		}
	}
	return total, sc.Err()
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
