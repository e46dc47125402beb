//go:build e2e

package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// Set up once by TestMain.
var (
	bins      testbed.Binaries // kvroute and enginesim built once, the installed Envoy
	envoyTmpl []byte           // envoy/envoy.yaml
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	root, err := testbed.RepoRoot()
	if err != nil {
		return fail(err)
	}
	binDir, err := os.MkdirTemp("", "kvroute-e2e-bin")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(binDir)
	if err := testbed.Build(context.Background(), root, binDir, "kvroute", "enginesim"); err != nil {
		return fail(err)
	}
	if bins, err = testbed.FindBinaries(binDir); err != nil {
		return fail(err)
	}
	if envoyTmpl, err = os.ReadFile(filepath.Join(root, "envoy", "envoy.yaml")); err != nil {
		return fail(err)
	}
	return m.Run()
}

// newGroup returns a process group for one test: its children are killed
// when the test ends, and their logs are printed if it failed.
func newGroup(t testing.TB) *testbed.Group {
	t.Helper()
	g, err := testbed.NewGroup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.Kill()
		if t.Failed() {
			for _, p := range g.Procs() {
				t.Logf("---- %s log (%s) ----\n%s", p.Name(), p.LogPath(), p.Tail(6000))
			}
		}
	})
	return g
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := testbed.WaitFor(context.Background(), timeout, what, cond); err != nil {
		t.Fatal(err)
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

// engine is one enginesim replica; start (re)starts it with its seed.
type engine struct {
	*testbed.Engine
	id   int
	seed int
	g    *testbed.Group
}

func (e *engine) addr() string { return e.Addr() }

func (e *engine) start(t testing.TB) {
	t.Helper()
	e.Name = fmt.Sprintf("enginesim-%d-seed%d", e.id, e.seed)
	e.Args = engineArgs(e.seed)
	if err := e.Start(context.Background(), e.g, bins.EngineSim); err != nil {
		t.Fatal(err)
	}
}

func engineArgs(seed int) []string {
	return []string{"--enable-prompt-tokens-details", "--speed", "10", "--seed", strconv.Itoa(seed), "--log-level", "warn"}
}

// kvrouteConfig is the e2e kvroute config after listeners and replicas,
// with tokenizer (a YAML flow mapping) as every model's tokenizer; "" is
// the engines' own /tokenize.
func kvrouteConfig(tokenizer string) string {
	return fmt.Sprintf(kvrouteExtra, cmp.Or(tokenizer, "{kind: remote, timeout: 2s}"))
}

const kvrouteExtra = `tokenizer:
  default: %s
load:
  scrape_interval: 100ms
  scrape_timeout: 250ms
readiness:
  warm_timeout: 10s
telemetry:
  log_level: info
`

// cluster is Envoy + kvroute + engines on loopback (testbed.Stack), or,
// in the active-active test, one of its parts.
type cluster struct {
	t       testing.TB
	g       *testbed.Group
	engines []*engine
	kv      *testbed.KVRoute
	envoy   *testbed.Envoy
	// Ports of kv and envoy.
	extprocPort, adminPort, metricsPort int
	listenPort, envoyAdminPort          int
}

type clusterOpts struct {
	engines int
	// seed: engine i's enginesim seed is seed+i (default 100).
	seed int
	// engineArgs returns engine i's flags after engineArgs(seed+i); may
	// be nil.
	engineArgs func(i int) []string
	envoy      []byte   // Envoy's config template; default envoyTmpl
	kvEnv      []string // extra environment for kvroute (OTEL_*)
	kvArgs     []string // further kvroute serve flags
	kvExtra    string   // YAML appended to kvrouteExtra
	tokenizer  string   // kvrouteConfig's tokenizer
}

func newCluster(t testing.TB, o clusterOpts) *cluster {
	t.Helper()
	if o.seed == 0 {
		o.seed = 100
	}
	if o.envoy == nil {
		o.envoy = envoyTmpl
	}
	g := newGroup(t)
	s, err := testbed.StartStack(context.Background(), g, testbed.StackOptions{
		Bin: bins, Envoy: o.envoy, Engines: o.engines,
		EngineArgs: func(i int) []string {
			args := engineArgs(o.seed + i)
			if o.engineArgs != nil {
				args = append(args, o.engineArgs(i)...)
			}
			return args
		},
		KVRouteExtra:   kvrouteConfig(o.tokenizer) + o.kvExtra,
		KVRouteEnv:     o.kvEnv,
		KVRouteArgs:    o.kvArgs,
		UpstreamHeader: "x-e2e-upstream",
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, g: g, kv: s.KV, envoy: s.Envoy}
	for i, e := range s.Engines {
		c.engines = append(c.engines, &engine{Engine: e, id: i, seed: o.seed + i, g: g})
	}
	c.setPorts()
	return c
}

func (c *cluster) setPorts() {
	if c.kv != nil {
		c.extprocPort, c.adminPort, c.metricsPort = c.kv.ExtProc, c.kv.Admin, c.kv.Metrics
	}
	if c.envoy != nil {
		c.listenPort, c.envoyAdminPort = c.envoy.Config.Listen, c.envoy.Config.Admin
	}
}

// startKVRoute starts kvroute again with its config and waits until it is
// ready.
func (c *cluster) startKVRoute() {
	c.t.Helper()
	if err := c.kv.Start(context.Background(), c.g, bins.KVRoute); err != nil {
		c.t.Fatal(err)
	}
}

// waitExtProcHealthy waits until Envoy's health checker sees kvroute as
// healthy (or not).
func (c *cluster) waitExtProcHealthy(healthy bool) {
	c.t.Helper()
	if err := c.envoy.WaitHealthy(context.Background(), testbed.ExtProcCluster, c.extprocPort, healthy, 30*time.Second); err != nil {
		c.t.Fatal(err)
	}
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

func (c *cluster) enginePorts() []int {
	ps := make([]int, len(c.engines))
	for i, e := range c.engines {
		ps[i] = e.Port
	}
	return ps
}
