package live

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"gopkg.in/yaml.v3"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/testbed"
)

// Tokenizer modes of a Bench's kvroute.
const (
	// TokenizerLocal: kvroute's default tokenizer (kind auto) finds the
	// model's tokenizer files in a search directory and tokenizes in
	// process; the engines compute on the same tokenizer.
	TokenizerLocal = "local"
	// TokenizerRemote: kvroute tokenizes through the engines' /tokenize,
	// answered with the same real tokenizer.
	TokenizerRemote = "remote"
	// TokenizerRender: kvroute tokenizes through the engines' render
	// endpoints (engines started with --enable-scale-out), given each
	// request's body.
	TokenizerRender = "render"
	// TokenizerIDs: prompts go as the simulator's token ids
	// (Options.TokenIDs); nobody tokenizes.
	TokenizerIDs = "ids"
)

// BenchOptions configure Bench: a stack it starts on loopback (enginesims,
// kvroute behind Envoy, a plain round-robin Envoy) and the repetitions it
// runs through it.
type BenchOptions struct {
	// Root is the repository root (envoy/envoy.yaml); default: found
	// from the working directory. Bin holds kvroute and enginesim
	// (default <Root>/bin).
	Root, Bin string
	// Engines is the number of enginesims (default 8); EngineSpeed their
	// --speed (default 5); EngineArgs further flags for every one.
	Engines     int
	EngineSpeed float64
	EngineArgs  []string
	// Slow slows engines from a time on (enginesim's --slow-after and
	// --slow-to, in the engine's simulated time since it started): the
	// engine with the same index in each arm, a GPU that throttles. Both
	// arms' engines start a few seconds apart, the round-robin arm's
	// last, so its engine slows that much later.
	Slow []bench.SpeedChange
	// Tokenizer is TokenizerLocal (default when TokenizerDir holds the
	// files), TokenizerRemote or TokenizerIDs.
	Tokenizer string
	// TokenizerDir holds tokenizer.json and tokenizer_config.json (default
	// $KVROUTE_TOKENIZER_CACHE/qwen3, else <Root>/.cache/tokenizers/qwen3).
	TokenizerDir string
	// KVRouteExtra is YAML merged into the bench's part of kvroute's
	// config (a policy section, for example; sections present in both are
	// merged key by key, its values winning); empty runs kvroute's
	// defaults.
	KVRouteExtra string
	// Parallel runs kvroute and round robin at the same time, each on its
	// own set of Engines enginesims, so that both see the same machine
	// load; otherwise they run one after the other on the same engines,
	// the order alternating between repetitions.
	Parallel bool
	// Reps is the number of repetitions (default 3).
	Reps int
	// Workload returns repetition rep's workload (rep from 0) and its
	// seed, for the report.
	Workload func(rep int) (*bench.Workload, uint64, error)
	// Run is every run's template: URL, Workload, Salt and TokenIDs/Words
	// are set per run. Run.API APIMessages needs a real tokenizer (local
	// or remote): its prompts are text, sent as words.
	Run Options
	// Worst is how many of each run's slowest requests (by TTFT) the
	// report keeps (default 5).
	Worst int
	// Requests keeps every request of every run in the report (without
	// inter-token latencies).
	Requests bool
	// Log receives progress lines (default discarded).
	Log io.Writer
}

// Arm is one run: kvroute or round robin, in one repetition.
type Arm struct {
	Summary Summary `json:"summary"`
	// Preemptions is the growth of the engines' vllm:num_preemptions_total
	// over the run.
	Preemptions float64 `json:"preemptions"`
	// Worst are the run's slowest requests by TTFT.
	Worst []Request `json:"worst"`
	// Router is kvroute's side of a kvroute run.
	Router *RouterStats `json:"router,omitempty"`
	// Start is the run's start, from the bench's start.
	Start time.Duration `json:"start_ns"`
	// Requests are every request of the run (BenchOptions.Requests).
	Requests []Request `json:"requests,omitempty"`
	// Decisions are kvroute's routing decisions of the run, as its admin
	// API's GET /debug/decisions lists them (BenchOptions.Requests).
	Decisions []json.RawMessage `json:"decisions,omitempty"`
}

// decisionHistory is the routing.decision_history a stack keeps for
// BenchOptions.Requests: several runs' decisions.
const decisionHistory = 20000

// RouterStats are growths of kvroute's metrics over a run.
type RouterStats struct {
	Decisions float64 `json:"decisions"`
	// Degraded decisions were routed without exact tokens or prefix
	// information (a kvroute_decisions_total series with a non-empty
	// degraded label).
	Degraded float64 `json:"degraded"`
	// Fallbacks are tokenizations served by the approximate fallback.
	Fallbacks float64 `json:"tokenizer_fallbacks"`
	// DecisionMean and TokenizeMean are mean seconds per decision and
	// per tokenization.
	DecisionMean float64 `json:"decision_mean_s"`
	TokenizeMean float64 `json:"tokenize_mean_s"`
	// SlowDecisions took more than 100 ms (kvroute_decision_duration_seconds).
	SlowDecisions float64 `json:"slow_decisions"`
	// Reasons counts decisions by the policy's reason.
	Reasons map[string]float64 `json:"reasons"`
	// Unhealthy counts replicas marked unhealthy by the load scraper
	// (their blocks leave the index); ScrapeErrors its failed probes.
	Unhealthy    float64 `json:"unhealthy,omitempty"`
	ScrapeErrors float64 `json:"scrape_errors,omitempty"`
	// Gaps, Resyncs and Overflows are the event streams' sequence gaps,
	// views cleared and relearned, and worker-queue overflows.
	Gaps      float64 `json:"event_gaps,omitempty"`
	Resyncs   float64 `json:"event_resyncs,omitempty"`
	Overflows float64 `json:"event_overflows,omitempty"`
}

// Rep is one repetition: both arms on one workload.
type Rep struct {
	Rep        int    `json:"rep"`
	Seed       uint64 `json:"seed"`
	Order      string `json:"order"`
	KVRoute    Arm    `json:"kvroute"`
	RoundRobin Arm    `json:"round_robin"`
	// P99Ratio and MeanRatio are kvroute's TTFT over round robin's.
	P99Ratio  float64 `json:"p99_ratio"`
	MeanRatio float64 `json:"mean_ratio"`
}

// BenchReport is Bench's outcome.
type BenchReport struct {
	// API is the API the runs spoke (APICompletions or APIMessages).
	API       string `json:"api"`
	Tokenizer string `json:"tokenizer"`
	Parallel  bool   `json:"parallel"`
	Reps      []Rep  `json:"reps"`
	// Medians over the repetitions.
	MedianP99Ratio  float64 `json:"median_p99_ratio"`
	MedianMeanRatio float64 `json:"median_mean_ratio"`
	// Demoted: kvroute's local tokenizer was demoted by its self-check
	// (requests then went to the engines' /tokenize).
	Demoted bool `json:"demoted"`
}

const benchModel = "sim-model"

func (o *BenchOptions) defaults() error {
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
	if o.Engines <= 0 {
		o.Engines = 8
	}
	if o.EngineSpeed <= 0 {
		o.EngineSpeed = 5
	}
	if o.Reps <= 0 {
		o.Reps = 3
	}
	if o.Worst <= 0 {
		o.Worst = 5
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.TokenizerDir == "" {
		cache := os.Getenv("KVROUTE_TOKENIZER_CACHE")
		if cache == "" {
			cache = filepath.Join(o.Root, ".cache", "tokenizers")
		}
		o.TokenizerDir = filepath.Join(cache, "qwen3")
	}
	haveFiles := fileExists(filepath.Join(o.TokenizerDir, "tokenizer.json")) && fileExists(filepath.Join(o.TokenizerDir, "tokenizer_config.json"))
	if o.Tokenizer == "" {
		o.Tokenizer = TokenizerIDs
		if haveFiles {
			o.Tokenizer = TokenizerLocal
		}
	}
	switch o.Tokenizer {
	case TokenizerLocal, TokenizerRemote, TokenizerRender:
		if !haveFiles {
			return fmt.Errorf("%w: tokenizer %s needs tokenizer.json and tokenizer_config.json in %s (make fixtures)", ErrOptions, o.Tokenizer, o.TokenizerDir)
		}
	case TokenizerIDs:
	default:
		return fmt.Errorf("%w: tokenizer %q: want %s, %s, %s or %s", ErrOptions, o.Tokenizer, TokenizerLocal, TokenizerRemote, TokenizerRender, TokenizerIDs)
	}
	switch o.Run.API {
	case "":
		o.Run.API = APICompletions
	case APICompletions:
	case APIMessages:
		if o.Tokenizer == TokenizerIDs {
			return fmt.Errorf("%w: the Messages API sends text: it needs tokenizer %s, %s or %s (tokenizer.json and tokenizer_config.json in %s; make fixtures)", ErrOptions, TokenizerLocal, TokenizerRemote, TokenizerRender, o.TokenizerDir)
		}
	default:
		return fmt.Errorf("%w: API %q: want %s or %s", ErrOptions, o.Run.API, APICompletions, APIMessages)
	}
	if o.Workload == nil {
		return fmt.Errorf("%w: Workload is required", ErrOptions)
	}
	for _, c := range o.Slow {
		if c.Replica < 0 || c.Replica >= o.Engines || c.At < 0 || !(c.Speed > 0 && c.Speed <= 1) {
			return fmt.Errorf("%w: slow engine %d@%v:%v: want an engine below %d, a time from 0 and a speed in (0, 1]", ErrOptions, c.Replica, c.At, c.Speed, o.Engines)
		}
	}
	return nil
}

// engineArgs are engine i's flags (the same in each arm): its seed, the
// flags every engine gets, and its slowdown (Slow), if any.
func (o *BenchOptions) engineArgs(i int, common []string) []string {
	args := append([]string{"--seed", strconv.Itoa(i + 1)}, common...)
	for _, c := range o.Slow {
		if c.Replica == i {
			args = append(args, "--slow-after", c.At.String(), "--slow-to", strconv.FormatFloat(c.Speed, 'f', -1, 64))
		}
	}
	return args
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// kvrouteExtra is kvroute's tokenizer section: local and ids runs use
// kvroute's default (kind auto) with a search directory holding the
// model's files under its name, as a user who ships them would; remote
// pins the engines' /tokenize, render their render endpoints.
func (o *BenchOptions) kvrouteExtra(dir string) (string, error) {
	cfg := map[string]any{"telemetry": map[string]any{"log_level": "warn"}}
	switch o.Tokenizer {
	case TokenizerLocal:
		search := filepath.Join(dir, "tokenizers")
		if err := os.MkdirAll(search, 0o755); err != nil {
			return "", err
		}
		abs, err := filepath.Abs(o.TokenizerDir)
		if err != nil {
			return "", err
		}
		if err := os.Symlink(abs, filepath.Join(search, benchModel)); err != nil {
			return "", err
		}
		cfg["tokenizer"] = map[string]any{"search_dirs": []any{search}}
	case TokenizerRemote:
		cfg["tokenizer"] = map[string]any{"default": map[string]any{"kind": "remote"}}
	case TokenizerRender:
		cfg["tokenizer"] = map[string]any{"default": map[string]any{"kind": "render"}}
	}
	if o.Requests {
		// Keep the decisions, so a report with every request has the
		// decisions behind them (Arm.Decisions).
		cfg["routing"] = map[string]any{"decision_history": decisionHistory}
	}
	return mergeYAML(cfg, o.KVRouteExtra)
}

// mergeYAML merges the YAML document extra into cfg (extra's values win;
// sections present in both are merged key by key) and renders the result.
func mergeYAML(cfg map[string]any, extra string) (string, error) {
	var user map[string]any
	if err := yaml.Unmarshal([]byte(extra), &user); err != nil {
		return "", fmt.Errorf("kvroute's extra YAML: %w", err)
	}
	var merge func(dst, src map[string]any)
	merge = func(dst, src map[string]any) {
		for k, v := range src {
			sv, ok1 := v.(map[string]any)
			dv, ok2 := dst[k].(map[string]any)
			if ok1 && ok2 {
				merge(dv, sv)
				continue
			}
			dst[k] = v
		}
	}
	merge(cfg, user)
	out, err := yaml.Marshal(cfg)
	return string(out), err
}

// Bench starts the stack, runs o.Reps repetitions of kvroute against
// round robin and stops everything it started. Each run starts from empty
// engine caches on idle engines.
func Bench(ctx context.Context, o BenchOptions) (*BenchReport, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	ws, err := testbed.NewWorkspace(o.Bin, o.Root, "kvbench-live")
	if err != nil {
		return nil, err
	}
	defer func() { _ = ws.Close() }()
	bin, tmpl, dir, g := ws.Bin, ws.Envoy, ws.Dir, ws.Group
	extra, err := o.kvrouteExtra(dir)
	if err != nil {
		return nil, err
	}
	engineArgs := []string{"--enable-prompt-tokens-details", "--speed", strconv.FormatFloat(o.EngineSpeed, 'f', -1, 64), "--log-level", "warn"}
	if o.Tokenizer != TokenizerIDs {
		engineArgs = append(engineArgs, "--tokenizer-dir", o.TokenizerDir)
	}
	if o.Tokenizer == TokenizerRender {
		engineArgs = append(engineArgs, "--enable-scale-out")
	}
	engineArgs = append(engineArgs, o.EngineArgs...)
	so := testbed.StackOptions{
		Bin: bin, Envoy: tmpl, Engines: o.Engines, Model: benchModel,
		EngineArgs:   func(i int) []string { return o.engineArgs(i, engineArgs) },
		KVRouteExtra: extra, UpstreamHeader: UpstreamHeader, EnvoyConcurrency: 2,
	}
	fmt.Fprintf(o.Log, "starting %d enginesims (speed %g), kvroute (%s tokenizer) behind Envoy, and a round-robin Envoy", o.Engines, o.EngineSpeed, o.Tokenizer)
	if o.Parallel {
		fmt.Fprintf(o.Log, " on %d more enginesims", o.Engines)
	}
	fmt.Fprintf(o.Log, "; clients send /v1/%s\n", o.Run.API)
	st, err := startStack(ctx, g, so)
	if err != nil {
		return nil, err
	}
	rrEngines := st.Engines
	if o.Parallel {
		rrEngines, err = startEngines(ctx, g, so, "enginesim-rr", false)
		if err != nil {
			return nil, err
		}
	}
	plain := &testbed.Envoy{
		Name:        "envoy-plain",
		Config:      testbed.EnvoyConfig{Engines: ports(rrEngines), UpstreamHeader: UpstreamHeader},
		Concurrency: so.EnvoyConcurrency,
	}
	if err := plain.Start(ctx, g, bin.Envoy, tmpl); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Log, "kvroute pid %d; Envoy via kvroute %s, round-robin Envoy %s; logs in %s\n", st.KV.Proc.Pid(), st.Envoy.URL(), plain.URL(), dir)

	b := &benchRun{o: o, kv: st.KV, begin: time.Now(),
		arms: [2]target{{"kvroute", st.Envoy.URL(), st.Engines}, {"round robin", plain.URL(), rrEngines}}}
	if err := b.warm(ctx); err != nil {
		return nil, err
	}
	rep := &BenchReport{API: o.Run.API, Tokenizer: o.Tokenizer, Parallel: o.Parallel}
	for i := range o.Reps {
		r, err := b.rep(ctx, i)
		if err != nil {
			return rep, err
		}
		rep.Reps = append(rep.Reps, *r)
		fmt.Fprintf(o.Log, "rep %d (seed %d, %s): kvroute TTFT mean %.3f p99 %.3f s, round robin mean %.3f p99 %.3f s: p99 ratio %.2f\n",
			r.Rep, r.Seed, r.Order, r.KVRoute.Summary.TTFTMean, r.KVRoute.Summary.TTFTP99,
			r.RoundRobin.Summary.TTFTMean, r.RoundRobin.Summary.TTFTP99, r.P99Ratio)
	}
	var p99, mean []float64
	for _, r := range rep.Reps {
		p99, mean = append(p99, r.P99Ratio), append(mean, r.MeanRatio)
	}
	slices.Sort(p99)
	slices.Sort(mean)
	rep.MedianP99Ratio, rep.MedianMeanRatio = bench.Quantile(p99, 0.5), bench.Quantile(mean, 0.5)
	if !st.KV.Proc.Running() {
		return rep, errors.New("kvroute exited during the bench: " + st.KV.Proc.Tail(2000))
	}
	if o.Tokenizer == TokenizerLocal {
		if exact, err := metricSum(ctx, st.KV.MetricsURL("/metrics"), "kvroute_tokenizer_local_exact{"); err == nil && exact == 0 {
			rep.Demoted = true
		}
	}
	return rep, nil
}

// startStack is testbed.StartStack with the engines started a few at a
// time: each loads a real tokenizer, and many at once on a loaded machine
// miss the testbed's readiness deadline.
func startStack(ctx context.Context, g *testbed.Group, so testbed.StackOptions) (*testbed.Stack, error) {
	es, err := startEngines(ctx, g, so, "enginesim", true)
	if err != nil {
		return nil, err
	}
	st := &testbed.Stack{Engines: es}
	st.KV = &testbed.KVRoute{Engines: es, Model: so.Model, Extra: so.KVRouteExtra, Env: so.KVRouteEnv, Args: so.KVRouteArgs}
	if err := st.KV.Start(ctx, g, so.Bin.KVRoute); err != nil {
		return nil, err
	}
	st.Envoy = &testbed.Envoy{
		Config:      testbed.EnvoyConfig{ExtProc: []int{st.KV.ExtProc}, Engines: st.EnginePorts(), UpstreamHeader: so.UpstreamHeader},
		Concurrency: so.EnvoyConcurrency,
	}
	return st, st.Envoy.Start(ctx, g, so.Bin.Envoy, so.Envoy)
}

// startEngines starts so.Engines enginesims, engineBatch at a time; with
// events they publish KV events on ipc endpoints in the group's socket
// directory, without they publish none.
func startEngines(ctx context.Context, g *testbed.Group, so testbed.StackOptions, name string, events bool) ([]*testbed.Engine, error) {
	sock, err := testbed.SocketDir(g)
	if err != nil {
		return nil, err
	}
	es := make([]*testbed.Engine, so.Engines)
	for i := range es {
		es[i] = &testbed.Engine{Name: fmt.Sprintf("%s-%d", name, i), Args: so.EngineArgs(i)}
		if events {
			es[i].Events = fmt.Sprintf("ipc://%s/%s-ev%d", sock, name, i)
			es[i].Replay = fmt.Sprintf("ipc://%s/%s-rp%d", sock, name, i)
		} else {
			es[i].Args = append(es[i].Args, "--kv-events-disable")
		}
	}
	for lo := 0; lo < len(es); lo += engineBatch {
		eg, ectx := errgroup.WithContext(ctx)
		for _, e := range es[lo:min(lo+engineBatch, len(es))] {
			eg.Go(func() error { return e.Start(ectx, g, so.Bin.EngineSim) })
		}
		if err := eg.Wait(); err != nil {
			return nil, err
		}
	}
	return es, nil
}

// engineBatch is how many enginesims start at once.
const engineBatch = 2

func ports(es []*testbed.Engine) []int {
	ps := make([]int, len(es))
	for i, e := range es {
		ps[i] = e.Port
	}
	return ps
}

type target struct {
	name    string
	url     string
	engines []*testbed.Engine
}

type benchRun struct {
	o     BenchOptions
	kv    *testbed.KVRoute
	arms  [2]target // kvroute, round robin
	begin time.Time
}

// warm sends one short session's worth of requests through both targets
// (connections, kvroute's tokenizer loading in the background and its
// rate learner), then waits until a local tokenizer serves.
func (b *benchRun) warm(ctx context.Context) error {
	w, _, err := b.o.Workload(0)
	if err != nil {
		return err
	}
	o := b.runOptions()
	o.Workload, o.MaxSessions, o.Speed, o.Rate = w, 4, 1000, 0
	deadline := time.Now().Add(2 * time.Minute)
	for {
		for _, t := range b.arms {
			o.URL, o.Salt = t.url, 0x77a57
			if _, err := Run(ctx, o); err != nil {
				return fmt.Errorf("warm-up through %s: %w", t.name, err)
			}
		}
		if b.o.Tokenizer != TokenizerLocal {
			return nil
		}
		exact, err := metricSum(ctx, b.kv.MetricsURL("/metrics"), "kvroute_tokenizer_local_exact{")
		if err == nil && exact > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("warm-up: kvroute's local tokenizer never served (kvroute_tokenizer_local_exact stays 0): see /debug/tokenizer")
		}
	}
}

func (b *benchRun) runOptions() Options {
	o := b.o.Run
	o.TokenIDs = b.o.Tokenizer == TokenizerIDs
	o.Words = !o.TokenIDs
	return o
}

// rep runs repetition i.
func (b *benchRun) rep(ctx context.Context, i int) (*Rep, error) {
	w, seed, err := b.o.Workload(i)
	if err != nil {
		return nil, err
	}
	r := &Rep{Rep: i + 1, Seed: seed}
	arms := [2]*Arm{&r.KVRoute, &r.RoundRobin}
	run := func(k int) error {
		a, err := b.arm(ctx, b.arms[k], w, uint64(i)<<1|uint64(k))
		if err != nil {
			return err
		}
		*arms[k] = *a
		return nil
	}
	switch {
	case b.o.Parallel:
		r.Order = "parallel"
		var eg errgroup.Group
		for k := range arms {
			if err := b.prepare(ctx, b.arms[k]); err != nil {
				return nil, err
			}
		}
		for k := range arms {
			eg.Go(func() error { return run(k) })
		}
		if err := eg.Wait(); err != nil {
			return nil, err
		}
	default:
		order := []int{0, 1}
		r.Order = "kvroute first"
		if i%2 == 1 {
			order, r.Order = []int{1, 0}, "round robin first"
		}
		for _, k := range order {
			if err := b.prepare(ctx, b.arms[k]); err != nil {
				return nil, err
			}
			if err := run(k); err != nil {
				return nil, err
			}
		}
	}
	if rr := r.RoundRobin.Summary; rr.TTFTP99 > 0 && rr.TTFTMean > 0 {
		r.P99Ratio = r.KVRoute.Summary.TTFTP99 / rr.TTFTP99
		r.MeanRatio = r.KVRoute.Summary.TTFTMean / rr.TTFTMean
	}
	return r, nil
}

// prepare waits until t's engines are idle, then empties their prefix
// caches (kvroute's index follows from their cleared events).
func (b *benchRun) prepare(ctx context.Context, t target) error {
	deadline := time.Now().Add(time.Minute)
	for {
		busy := 0.0
		for _, e := range t.engines {
			text, err := fetch(ctx, e.URL()+"/metrics") // one scrape for both gauges
			if err != nil {
				return err
			}
			n, err := sumLines(strings.NewReader(text), "vllm:num_requests_running{")
			if err != nil {
				return err
			}
			m, err := sumLines(strings.NewReader(text), "vllm:num_requests_waiting{")
			if err != nil {
				return err
			}
			busy += n + m
		}
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: engines still busy (%v requests) a minute after the previous run", t.name, busy)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	for _, e := range t.engines {
		if err := e.ResetPrefixCache(ctx); err != nil {
			return err
		}
	}
	// Let kvroute apply the engines' cleared events before the run.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(200 * time.Millisecond):
	}
	return nil
}

// arm runs w through t and measures it.
func (b *benchRun) arm(ctx context.Context, t target, w *bench.Workload, salt uint64) (*Arm, error) {
	o := b.runOptions()
	o.URL, o.Workload, o.Salt = t.url, w, salt
	pre0, err := b.preemptions(ctx, t)
	if err != nil {
		return nil, err
	}
	isKV := t.url == b.arms[0].url
	var (
		kv0  map[string]float64
		dec0 int64 = -1
	)
	if isKV {
		kv0 = b.routerMetrics(ctx)
		dec0 = b.decisionsTotal(ctx)
	}
	a := &Arm{Start: time.Since(b.begin)}
	rep, err := Run(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.name, err)
	}
	a.Summary = Summarize(rep)
	pre1, err := b.preemptions(ctx, t)
	if err != nil {
		return nil, err
	}
	a.Preemptions = pre1 - pre0
	if isKV {
		kv1 := b.routerMetrics(ctx)
		d := func(k string) float64 { return kv1[k] - kv0[k] }
		a.Router = &RouterStats{Decisions: d("decisions"), Degraded: d("degraded"), Fallbacks: d("fallbacks"), Reasons: map[string]float64{}}
		for k := range kv1 {
			if r, ok := strings.CutPrefix(k, "reason:"); ok && d(k) > 0 {
				a.Router.Reasons[r] = d(k)
			}
		}
		a.Router.SlowDecisions = d("decision_count") - d("decision_fast")
		if b.o.Requests && dec0 >= 0 {
			a.Decisions = b.decisions(ctx, dec0)
		}
		a.Router.Unhealthy, a.Router.ScrapeErrors = d("unhealthy"), d("scrape_errors")
		a.Router.Gaps, a.Router.Resyncs, a.Router.Overflows = d("gaps"), d("resyncs"), d("overflows")
		if n := d("decision_count"); n > 0 {
			a.Router.DecisionMean = d("decision_sum") / n
		}
		if n := d("tokenize_count"); n > 0 {
			a.Router.TokenizeMean = d("tokenize_sum") / n
		}
	}
	ok := slices.DeleteFunc(slices.Clone(rep.Requests), func(q Request) bool { return q.Err != "" })
	slices.SortFunc(ok, func(x, y Request) int { return int(y.TTFT - x.TTFT) })
	for _, q := range ok[:min(b.o.Worst, len(ok))] {
		q.ITLs = nil
		a.Worst = append(a.Worst, q)
	}
	if b.o.Requests {
		for _, q := range rep.Requests {
			q.ITLs = nil
			a.Requests = append(a.Requests, q)
		}
	}
	return a, nil
}

func (b *benchRun) preemptions(ctx context.Context, t target) (float64, error) {
	sum := 0.0
	for _, e := range t.engines {
		n, err := metricSum(ctx, e.URL()+"/metrics", "vllm:num_preemptions_total{")
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// decisionsTotal is how many decisions kvroute has made, from its
// decision history; -1 when it keeps none.
func (b *benchRun) decisionsTotal(ctx context.Context) int64 {
	text, err := fetch(ctx, b.kv.AdminURL("/debug/decisions?limit=1"))
	if err != nil {
		return -1
	}
	var out struct {
		Total string `json:"total"` // int64 in protobuf JSON
	}
	if json.Unmarshal([]byte(text), &out) != nil {
		return -1
	}
	n, err := strconv.ParseInt(out.Total, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// decisions returns the decisions kvroute made after its total was since
// (nil when it keeps no history).
func (b *benchRun) decisions(ctx context.Context, since int64) []json.RawMessage {
	now := b.decisionsTotal(ctx)
	if now <= since {
		return nil
	}
	text, err := fetch(ctx, b.kv.AdminURL(fmt.Sprintf("/debug/decisions?limit=%d", now-since)))
	if err != nil {
		return nil
	}
	var out struct {
		Decisions []json.RawMessage `json:"decisions"`
	}
	if json.Unmarshal([]byte(text), &out) != nil {
		return nil
	}
	return out.Decisions
}

// routerMetrics reads the kvroute counters a run reports (missing ones
// read as zero; decisions by reason under "reason:<reason>").
func (b *benchRun) routerMetrics(ctx context.Context) map[string]float64 {
	m := map[string]float64{}
	text, err := fetch(ctx, b.kv.MetricsURL("/metrics"))
	if err != nil {
		return m
	}
	read := func(key, prefix string, contains ...string) {
		m[key], _ = sumLines(strings.NewReader(text), prefix, contains...)
	}
	read("decisions", "kvroute_decisions_total{")
	read("undegraded", "kvroute_decisions_total{", `degraded=""`)
	m["degraded"] = m["decisions"] - m["undegraded"]
	read("fallbacks", "kvroute_tokenizer_fallbacks_total{")
	read("decision_sum", "kvroute_decision_duration_seconds_sum")
	read("decision_count", "kvroute_decision_duration_seconds_count")
	read("decision_fast", "kvroute_decision_duration_seconds_bucket{", `le="0.1"`)
	read("tokenize_sum", "kvroute_tokenize_duration_seconds_sum")
	read("tokenize_count", "kvroute_tokenize_duration_seconds_count")
	read("unhealthy", "kvroute_replica_health_transitions_total{", `healthy="false"`)
	read("scrape_errors", "kvroute_scrape_errors_total{")
	read("gaps", "kvroute_events_gaps_total{")
	read("resyncs", "kvroute_events_resyncs_total{")
	read("overflows", "kvroute_events_queue_overflows_total{")
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, "kvroute_decisions_total{") {
			continue
		}
		_, after, ok := strings.Cut(l, `reason="`)
		reason, _, ok2 := strings.Cut(after, `"`)
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if ok && ok2 && err == nil {
			m["reason:"+reason] += v
		}
	}
	return m
}

func fetch(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := metricsClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

var metricsClient = &http.Client{Timeout: 10 * time.Second}

// metricSum sums the samples of the Prometheus text at url whose line
// starts with prefix and contains every one of contains.
func metricSum(ctx context.Context, url, prefix string, contains ...string) (float64, error) {
	text, err := fetch(ctx, url)
	if err != nil {
		return 0, err
	}
	return sumLines(strings.NewReader(text), prefix, contains...)
}

func sumLines(r io.Reader, prefix string, contains ...string) (float64, error) {
	sum := 0.0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
lines:
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		for _, c := range contains {
			if !strings.Contains(l, c) {
				continue lines
			}
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", l, err)
		}
		sum += v
	}
	return sum, sc.Err()
}
