// Command demo runs kvroute on loopback in front of four simulated engines
// and Envoy (package testbed), drives a multi-turn agent workload through
// Envoy twice, once routed by kvroute and once round robin (kvroute
// stopped: Envoy's fail-open fallback route), and prints placement, prefix
// hit rate and time to first token side by side. Everything it starts, it
// stops.
//
//	go run ./hack/demo --bin bin     (make demo)
//
// With -serve it starts the same stack plus a second, plain round-robin
// Envoy in front of the same engines, prints their URLs (for kvbench live
// -url ... -compare-url ...) and runs until interrupted. (`kvbench live
// -stack` starts a stack of its own for the repeated kvroute-against-round-
// robin comparison.)
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvroute/kvroute/pkg/testbed"
)

type options struct {
	bin         string
	sessions    int
	turns       int
	concurrency int
	speed       float64
	policy      string
	tokTimeout  time.Duration
	keep        bool
	serve       bool
	replicas    int
	engineArgs  string
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory holding the kvroute and enginesim binaries")
	flag.IntVar(&o.sessions, "sessions", 16, "agent sessions")
	flag.IntVar(&o.turns, "turns", 6, "turns per session")
	flag.IntVar(&o.concurrency, "concurrency", 8, "sessions running at once")
	flag.Float64Var(&o.speed, "speed", 1, "engine simulation speed (1 = real time)")
	flag.StringVar(&o.policy, "policy", "kvroute", "kvroute policy (policy.name)")
	flag.DurationVar(&o.tokTimeout, "tokenizer-timeout", 50*time.Millisecond, "remote tokenizer deadline (tokenizer.default.timeout), fixed; 0 leaves kvroute's default, a deadline adapted to recent tokenization times")
	flag.BoolVar(&o.keep, "keep-logs", false, "keep the processes' logs and configs")
	flag.IntVar(&o.replicas, "engines", 4, "enginesim replicas")
	flag.StringVar(&o.engineArgs, "engine-args", "", "further enginesim flags for every replica, space separated (later flags win: e.g. \"--max-model-len 131072 --num-gpu-blocks 24576\")")
	flag.BoolVar(&o.serve, "serve", false, "start the stack and a plain round-robin Envoy, print their URLs and run until interrupted")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// kvrouteConfig is the demo's kvroute config after listeners and replicas:
// written out in full, so what the demo measures is what the file says.
func kvrouteConfig(o options) string {
	timeout := ""
	if o.tokTimeout > 0 {
		timeout = ", timeout: " + o.tokTimeout.String()
	}
	return fmt.Sprintf(`policy: {name: %s}
tokenizer:
  default: {kind: remote%s, fallback: approximate}
telemetry: {log_level: warn}
`, o.policy, timeout)
}

func run(ctx context.Context, o options) error {
	bins, err := testbed.FindBinaries(o.bin)
	if err != nil {
		return fmt.Errorf("%w (build with: make build; install Envoy with: hack/install-deps.sh)", err)
	}
	tmpl, err := os.ReadFile(filepath.Join("envoy", "envoy.yaml"))
	if err != nil {
		return fmt.Errorf("%w (run from the repository root)", err)
	}
	dir, err := os.MkdirTemp("", "kvdemo")
	if err != nil {
		return err
	}
	if o.keep || o.serve {
		fmt.Println("logs and configs in", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	g, err := testbed.NewGroup(dir)
	if err != nil {
		return err
	}
	defer func() {
		if err := g.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
		}
	}()

	fmt.Printf("starting %d enginesim replicas, kvroute and Envoy on 127.0.0.1 ...\n", o.replicas)
	// The demo's prompts stay under 8k tokens; kvbench's generators
	// (herding: up to 8k prompt plus output) need more.
	maxLen := "8192"
	if o.serve {
		maxLen = "16384"
	}
	so := testbed.StackOptions{
		Bin: bins, Envoy: tmpl, Engines: o.replicas,
		EngineArgs: func(i int) []string {
			return append([]string{"--enable-prompt-tokens-details", "--speed", strconv.FormatFloat(o.speed, 'f', -1, 64),
				"--max-model-len", maxLen, "--seed", strconv.Itoa(i + 1), "--log-level", "warn"}, strings.Fields(o.engineArgs)...)
		},
		KVRouteExtra:     kvrouteConfig(o),
		UpstreamHeader:   "x-upstream",
		EnvoyConcurrency: 2,
	}
	s, err := testbed.StartStack(ctx, g, so)
	if err != nil {
		return err
	}
	deadline := "an adaptive deadline"
	if o.tokTimeout > 0 {
		deadline = "a " + o.tokTimeout.String() + " deadline"
	}
	fmt.Printf("kvroute: policy %s, remote tokenizer (the engines' /tokenize) with %s\n", o.policy, deadline)
	if o.serve {
		plain, err := s.StartPlainEnvoy(ctx, g, so)
		if err != nil {
			return err
		}
		fmt.Printf("Envoy with kvroute:    %s\nplain Envoy (round robin): %s\nkvroute admin: %s  metrics: %s\n",
			s.Envoy.URL(), plain.URL(), s.KV.AdminURL("/debug/replicas"), s.KV.MetricsURL("/metrics"))
		fmt.Printf("\n  bin/kvbench live -url %s -compare-url %s -workload herding -size 0.1 -session-rate 2.5\n\nCtrl-C stops everything.\n",
			s.Envoy.URL(), plain.URL())
		<-ctx.Done()
		return nil
	}
	listen := s.Envoy.Config.Listen
	engines := s.EnginePorts()

	fmt.Printf("workload: %d agent sessions x %d turns, %d at a time, streamed, through Envoy\n", o.sessions, o.turns, o.concurrency)
	label := "kvroute"
	if o.policy != "kvroute" {
		label += " (" + o.policy + ")"
	}
	fmt.Printf("run 1: routed by %s ...\n", label)
	routed, err := drive(ctx, listen, o)
	if err != nil {
		return err
	}
	fallbacks := tokenizerFallbacks(ctx, s.KV)

	fmt.Println("run 2: round robin (kvroute stopped; Envoy fails open to its fallback route) ...")
	if err := s.KV.Proc.Stop(testbed.StopGrace); err != nil {
		return err
	}
	if err := resetCaches(ctx, s.Engines); err != nil {
		return err
	}
	rr, err := drive(ctx, listen, o)
	if err != nil {
		return err
	}
	report(os.Stdout, engines, []string{label, "round robin"}, []*stats{routed, rr})
	fmt.Printf("tokenizer fallbacks during run 1 (remote /tokenize, %s): %s\n", deadline, fallbacks)
	return nil
}

// tokenizerFallbacks sums kvroute_tokenizer_fallbacks_total from kvroute's
// /metrics (requests routed on approximate tokens).
func tokenizerFallbacks(ctx context.Context, kv *testbed.KVRoute) string {
	code, b, err := testbed.Get(ctx, kv.MetricsURL("/metrics"))
	if err != nil || code != http.StatusOK {
		return fmt.Sprintf("unknown (%d %v)", code, err)
	}
	var n float64
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(l, "kvroute_tokenizer_fallbacks_total") {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			n += v
		}
	}
	return strconv.FormatFloat(n, 'f', -1, 64)
}

// resetCaches empties every engine's prefix cache, so that both runs start
// cold.
func resetCaches(ctx context.Context, engines []*testbed.Engine) error {
	for _, e := range engines {
		if err := e.ResetPrefixCache(ctx); err != nil {
			return err
		}
	}
	return nil
}

// stats is one run's measurements.
type stats struct {
	mu           sync.Mutex
	requests     int
	failed       int
	promptTokens int
	cachedTokens int
	ttft         []time.Duration
	placement    map[string]int
	elapsed      time.Duration
	firstErr     string
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// words returns deterministic filler text.
func words(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s%d ", tag, (i*7)%101)
	}
	return b.String()
}

// drive runs the agent workload: every session keeps its history (a long
// system prompt with tool descriptions, then user turns carrying tool
// output, and the assistant's replies) and sends it whole each turn.
func drive(ctx context.Context, port int, o options) (*stats, error) {
	st := &stats{placement: map[string]int{}}
	client := &http.Client{Timeout: 120 * time.Second}
	start := time.Now()
	sem := make(chan struct{}, o.concurrency)
	var wg sync.WaitGroup
	for s := range o.sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			hist := []message{{Role: "system", Content: "You are agent " + strconv.Itoa(s) + ". Tools: " + words(fmt.Sprintf("tool%d-", s%4), 120)}}
			for turn := range o.turns {
				if ctx.Err() != nil {
					return
				}
				hist = append(hist, message{Role: "user", Content: words(fmt.Sprintf("s%dt%d-obs", s, turn), 40)})
				text := one(ctx, client, port, hist, st)
				hist = append(hist, message{Role: "assistant", Content: text})
			}
		}()
	}
	wg.Wait()
	st.elapsed = time.Since(start)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return st, nil
}

// one sends a streamed chat request and records TTFT, usage and placement.
func one(ctx context.Context, client *http.Client, port int, hist []message, st *stats) string {
	body, _ := json.Marshal(map[string]any{
		"model": "sim-model", "messages": hist, "max_tokens": 32, "stream": true,
		"stream_options": map[string]any{"include_usage": true},
	})
	req, _ := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := client.Do(req)
	fail := func(why string) string {
		st.mu.Lock()
		st.requests++
		st.failed++
		if st.firstErr == "" {
			st.firstErr = why
		}
		st.mu.Unlock()
		return ""
	}
	if err != nil {
		return fail(err.Error())
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return fail(fmt.Sprintf("HTTP %d: %s", resp.StatusCode, b))
	}
	var ttft time.Duration
	var text strings.Builder
	var prompt, cached int
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(data), &ch) != nil {
			continue
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != "" && ttft == 0 {
				ttft = time.Since(start)
			}
			text.WriteString(c.Delta.Content)
		}
		if ch.Usage != nil {
			prompt = ch.Usage.PromptTokens
			if d := ch.Usage.PromptTokensDetails; d != nil {
				cached = d.CachedTokens
			}
		}
	}
	if sc.Err() != nil || ttft == 0 {
		return fail(fmt.Sprintf("stream ended without content (%v)", sc.Err()))
	}
	st.mu.Lock()
	st.requests++
	st.promptTokens += prompt
	st.cachedTokens += cached
	st.ttft = append(st.ttft, ttft)
	st.placement[resp.Header.Get("x-upstream")]++
	st.mu.Unlock()
	return text.String()
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func report(w io.Writer, engines []int, names []string, runs []*stats) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintf(tw, "\t%s\t\n", strings.Join(names, "\t"))
	row := func(label string, f func(*stats) string) {
		cells := make([]string, len(runs))
		for i, r := range runs {
			cells[i] = f(r)
		}
		fmt.Fprintf(tw, "%s\t%s\t\n", label, strings.Join(cells, "\t"))
	}
	row("requests (failed)", func(s *stats) string { return fmt.Sprintf("%d (%d)", s.requests, s.failed) })
	row("prefix hit rate", func(s *stats) string {
		if s.promptTokens == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(s.cachedTokens)/float64(s.promptTokens))
	})
	row("TTFT p50", func(s *stats) string { return pct(s.ttft, 0.5).Round(100 * time.Microsecond).String() })
	row("TTFT p99", func(s *stats) string { return pct(s.ttft, 0.99).Round(100 * time.Microsecond).String() })
	row("wall time", func(s *stats) string { return s.elapsed.Round(10 * time.Millisecond).String() })
	for i, p := range engines {
		addr := "127.0.0.1:" + strconv.Itoa(p)
		row(fmt.Sprintf("requests on replica %d", i), func(s *stats) string {
			return fmt.Sprintf("%d (%.0f%%)", s.placement[addr], 100*float64(s.placement[addr])/float64(max(s.requests, 1)))
		})
	}
	_ = tw.Flush()
	for i, r := range runs {
		if r.firstErr != "" {
			fmt.Fprintf(w, "%s: first failure: %s\n", names[i], r.firstErr)
		}
	}
}
