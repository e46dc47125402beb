package testbed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
)

// Readiness timeouts.
const (
	engineReadyTimeout  = 30 * time.Second
	kvrouteReadyTimeout = 30 * time.Second
)

// RepoRoot returns the directory holding go.mod, searching up from the
// working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("go.mod not found above the working directory")
		}
		dir = up
	}
}

// BuildTags are the build tags Build compiles with, the Makefile's: the
// vtprotobuf tag compiles in go-control-plane's generated encoders, which
// kvroute's ext_proc codec uses.
const BuildTags = "vtprotobuf"

// Build builds the named commands (./cmd/<name>) of the module at root
// into dir.
func Build(ctx context.Context, root, dir string, names ...string) error {
	for _, n := range names {
		b := exec.CommandContext(ctx, "go", "build", "-tags", BuildTags, "-o", filepath.Join(dir, n), "./cmd/"+n)
		b.Dir = root
		if out, err := b.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %w\n%s", n, err, out)
		}
	}
	return nil
}

// SocketDir creates a short directory for ipc:// endpoints (a socket path
// must fit in about 107 bytes) and removes it when g stops.
func SocketDir(g *Group) (string, error) {
	dir, err := os.MkdirTemp("", "kvr")
	if err != nil {
		return "", err
	}
	g.OnStop(func() { _ = os.RemoveAll(dir) })
	return dir, nil
}

// Engine is one enginesim replica on loopback.
type Engine struct {
	Name   string   // process and log name
	Port   int      // HTTP port; 0 = a free port, chosen by Start
	Events string   // KV-event PUB endpoint the engine binds (ipc:// or tcp://)
	Replay string   // replay ROUTER endpoint the engine binds
	Args   []string // further enginesim flags
	Proc   *Proc
}

// Addr is the engine's ip:port.
func (e *Engine) Addr() string { return "127.0.0.1:" + strconv.Itoa(e.Port) }

// URL is the engine's base URL.
func (e *Engine) URL() string { return "http://" + e.Addr() }

// ResetPrefixCache empties the engine's prefix cache (POST
// /reset_prefix_cache, as on vLLM); any answer but 200 is an error.
func (e *Engine) ResetPrefixCache(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL()+"/reset_prefix_cache", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: reset_prefix_cache: %s", e.Name, resp.Status)
	}
	return nil
}

// Start starts the engine (again, if it ran before, on the same port and
// endpoints) and waits until /health answers 200.
func (e *Engine) Start(ctx context.Context, g *Group, bin string) error {
	if e.Port == 0 {
		var err error
		if e.Port, err = FreePort(); err != nil {
			return err
		}
	}
	args := []string{"--host", "127.0.0.1", "--port", strconv.Itoa(e.Port)}
	if e.Events != "" {
		args = append(args, "--kv-events-endpoint", e.Events)
	}
	if e.Replay != "" {
		args = append(args, "--kv-events-replay-endpoint", e.Replay)
	}
	p, err := g.Start(e.Name, nil, bin, append(args, e.Args...)...)
	if err != nil {
		return err
	}
	e.Proc = p
	return waitReady(ctx, p, engineReadyTimeout, e.Name+" healthy", e.URL()+"/health")
}

// KVRoute is one kvroute process.
type KVRoute struct {
	Name                    string // process and log name; default "kvroute"
	ExtProc, Admin, Metrics int    // listener ports; 0 = a free port, chosen by WriteConfig
	// Engines are the static replicas, all serving Model.
	Engines []*Engine
	Model   string
	// Extra is YAML appended to the config after listeners and replicas
	// (tokenizer, policy, load, readiness, telemetry sections).
	Extra      string
	Env        []string // added to the environment (OTEL_*)
	Args       []string // further serve flags
	ConfigPath string   // written by WriteConfig
	Proc       *Proc
}

// AdminURL is path on the admin HTTP listener.
func (k *KVRoute) AdminURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(k.Admin) + path
}

// MetricsURL is path on the metrics listener (/metrics, /readyz).
func (k *KVRoute) MetricsURL(path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(k.Metrics) + path
}

// YAML is kvroute's config: loopback listeners, the engines as static
// replicas with their event endpoints (none for an engine without), then
// Extra.
func (k *KVRoute) YAML() string {
	var b strings.Builder
	fmt.Fprintf(&b, "listeners:\n  extproc: \"127.0.0.1:%d\"\n  admin: \"127.0.0.1:%d\"\n  metrics: \"127.0.0.1:%d\"\n  drain_timeout: 3s\n",
		k.ExtProc, k.Admin, k.Metrics)
	b.WriteString("replicas:\n  static:\n")
	for _, e := range k.Engines {
		if e.Events == "" {
			fmt.Fprintf(&b, "  - {address: %q, model: %s}\n", e.Addr(), k.Model)
			continue
		}
		fmt.Fprintf(&b, "  - {address: %q, model: %s, events_endpoint: %q, replay_endpoint: %q}\n", e.Addr(), k.Model, e.Events, e.Replay)
	}
	b.WriteString(k.Extra)
	return b.String()
}

// WriteConfig picks free ports for unset listeners and writes YAML into
// the group's directory.
func (k *KVRoute) WriteConfig(g *Group) error {
	if k.Name == "" {
		k.Name = "kvroute"
	}
	for _, p := range []*int{&k.ExtProc, &k.Admin, &k.Metrics} {
		if *p == 0 {
			var err error
			if *p, err = FreePort(); err != nil {
				return err
			}
		}
	}
	k.ConfigPath = filepath.Join(g.Dir(), k.Name+".yaml")
	return os.WriteFile(k.ConfigPath, []byte(k.YAML()), 0o644)
}

// Launch writes the config if it is not written yet and starts kvroute
// serve without waiting for readiness (Ready waits).
func (k *KVRoute) Launch(g *Group, bin string) error {
	if k.ConfigPath == "" {
		if err := k.WriteConfig(g); err != nil {
			return err
		}
	}
	p, err := g.Start(k.Name, k.Env, bin, append([]string{"serve", "--config", k.ConfigPath}, k.Args...)...)
	if err != nil {
		return err
	}
	k.Proc = p
	return nil
}

// Ready waits until kvroute's /readyz answers 200.
func (k *KVRoute) Ready(ctx context.Context) error {
	return waitReady(ctx, k.Proc, kvrouteReadyTimeout, k.Name+" ready", k.MetricsURL("/readyz"))
}

// Start is Launch then Ready.
func (k *KVRoute) Start(ctx context.Context, g *Group, bin string) error {
	if err := k.Launch(g, bin); err != nil {
		return err
	}
	return k.Ready(ctx)
}

// Binaries are the programs a stack runs.
type Binaries struct {
	KVRoute, EngineSim, Envoy string
}

// FindBinaries returns bin/kvroute and bin/enginesim under dir and the
// installed Envoy, checking that each exists.
func FindBinaries(dir string) (Binaries, error) {
	b := Binaries{KVRoute: filepath.Join(dir, "kvroute"), EngineSim: filepath.Join(dir, "enginesim")}
	for _, p := range []string{b.KVRoute, b.EngineSim} {
		if _, err := os.Stat(p); err != nil {
			return b, err
		}
	}
	var err error
	b.Envoy, err = EnvoyPath()
	return b, err
}

// StackOptions describe a Stack.
type StackOptions struct {
	Bin     Binaries
	Envoy   []byte // the Envoy template (envoy/envoy.yaml)
	Engines int    // default 4
	Model   string // default "sim-model"
	// EngineArgs returns engine i's enginesim flags beyond address and
	// event endpoints.
	EngineArgs func(i int) []string
	// KVRouteExtra is appended to kvroute's config (see KVRoute.Extra).
	KVRouteExtra string
	KVRouteEnv   []string
	KVRouteArgs  []string
	// UpstreamHeader and EnvoyConcurrency are passed to the Envoy.
	UpstreamHeader   string
	EnvoyConcurrency int
	// NoEvents starts the engines without KV event endpoints and lists
	// them in kvroute's config without any: a fleet without events, which
	// kvroute routes on its dispatch-learned (approximate) index.
	NoEvents bool
}

// Stack is engines, one kvroute subscribed to all of them, and one Envoy
// in front routing by kvroute, all on loopback and owned by one Group.
type Stack struct {
	Engines []*Engine
	KV      *KVRoute
	Envoy   *Envoy
}

// StartStack starts the engines (together), then kvroute, then Envoy,
// each once the previous ones are ready. On error, what was started is
// left to g.Stop.
func StartStack(ctx context.Context, g *Group, o StackOptions) (*Stack, error) {
	if o.Engines == 0 {
		o.Engines = 4
	}
	if o.Model == "" {
		o.Model = "sim-model"
	}
	sock, err := SocketDir(g)
	if err != nil {
		return nil, err
	}
	s := &Stack{}
	for i := range o.Engines {
		e := &Engine{Name: fmt.Sprintf("enginesim-%d", i)}
		if !o.NoEvents {
			e.Events = fmt.Sprintf("ipc://%s/ev%d", sock, i)
			e.Replay = fmt.Sprintf("ipc://%s/rp%d", sock, i)
		}
		if o.EngineArgs != nil {
			e.Args = o.EngineArgs(i)
		}
		s.Engines = append(s.Engines, e)
	}
	eg, ectx := errgroup.WithContext(ctx)
	for _, e := range s.Engines {
		eg.Go(func() error { return e.Start(ectx, g, o.Bin.EngineSim) })
	}
	if err := eg.Wait(); err != nil {
		return nil, err
	}
	s.KV = &KVRoute{Engines: s.Engines, Model: o.Model, Extra: o.KVRouteExtra, Env: o.KVRouteEnv, Args: o.KVRouteArgs}
	if err := s.KV.Start(ctx, g, o.Bin.KVRoute); err != nil {
		return nil, err
	}
	s.Envoy = &Envoy{
		Config:      EnvoyConfig{ExtProc: []int{s.KV.ExtProc}, Engines: s.EnginePorts(), UpstreamHeader: o.UpstreamHeader},
		Concurrency: o.EnvoyConcurrency,
	}
	if err := s.Envoy.Start(ctx, g, o.Bin.Envoy, o.Envoy); err != nil {
		return nil, err
	}
	return s, nil
}

// EnginePorts are the engines' HTTP ports, in order.
func (s *Stack) EnginePorts() []int {
	ps := make([]int, len(s.Engines))
	for i, e := range s.Engines {
		ps[i] = e.Port
	}
	return ps
}

// StartPlainEnvoy starts a second Envoy from the same template in front of
// the same engines without the ext_proc filter: the round-robin baseline.
func (s *Stack) StartPlainEnvoy(ctx context.Context, g *Group, o StackOptions) (*Envoy, error) {
	e := &Envoy{
		Name:        "envoy-plain",
		Config:      EnvoyConfig{Engines: s.EnginePorts(), UpstreamHeader: o.UpstreamHeader},
		Concurrency: o.EnvoyConcurrency,
	}
	return e, e.Start(ctx, g, o.Bin.Envoy, o.Envoy)
}
