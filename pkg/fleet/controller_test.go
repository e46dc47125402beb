package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/pkg/discovery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeLoads is the load view: the replicas listed true are healthy.
type fakeLoads map[string]bool

func (f fakeLoads) Load(id string) load.Load { return load.Load{Healthy: f[id]} }

// fakeStreams is the events manager.
type fakeStreams struct {
	mu     sync.Mutex
	calls  [][]events.Source
	warm   bool
	err    error
	credit map[index.ReplicaID]float64
	set    chan struct{} // receives after each successful SetSources, if not nil
	// lookahead is each stream's reported lookahead.
	lookahead map[index.ReplicaID]int
}

func (f *fakeStreams) SetSources(srcs []events.Source) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.calls = append(f.calls, srcs)
	if f.set != nil {
		select {
		case f.set <- struct{}{}:
		default:
		}
	}
	return nil
}

func (f *fakeStreams) Warm() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.warm
}

func (f *fakeStreams) Credit(id index.ReplicaID) float64 { return f.credit[id] }

func (f *fakeStreams) Readiness() events.Readiness {
	f.mu.Lock()
	defer f.mu.Unlock()
	rd := events.Readiness{Warm: f.warm}
	if len(f.calls) == 0 {
		return rd
	}
	for _, s := range f.calls[len(f.calls)-1] {
		rd.Sources++
		if f.warm {
			rd.CaughtUp++
		} else {
			rd.Degraded = append(rd.Degraded, events.Degraded{ID: s.ID, Reason: "warming"})
		}
	}
	return rd
}

func (f *fakeStreams) Status(id index.ReplicaID) events.ReplicaStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return events.ReplicaStatus{}
	}
	for _, s := range f.calls[len(f.calls)-1] {
		if s.ID == id {
			return events.ReplicaStatus{Known: true, CaughtUp: true, Endpoint: s.Endpoint, Lookahead: f.lookahead[id]}
		}
	}
	return events.ReplicaStatus{}
}

// subscribed is the IDs of the last SetSources call ("-" before any).
func (f *fakeStreams) subscribed() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return "-"
	}
	var ids []string
	for _, s := range f.calls[len(f.calls)-1] {
		ids = append(ids, string(s.ID))
	}
	return strings.Join(ids, ",")
}

// fakeIndex records the streams whose blocks were dropped.
type fakeIndex struct{ cleared []string }

func (f *fakeIndex) Cleared(id index.ReplicaID) { f.cleared = append(f.cleared, string(id)) }

// take returns the distinct cleared IDs since the last take, sorted.
func (f *fakeIndex) take() string {
	c := slices.Clone(f.cleared)
	f.cleared = nil
	slices.Sort(c)
	return strings.Join(slices.Compact(c), ",")
}

// fakeProber is the scraper: targets set, and which were probed.
type fakeProber struct {
	mu      sync.Mutex
	targets []load.Target
	probed  map[string]bool
}

func (f *fakeProber) SetTargets(t []load.Target) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = t
}

func (f *fakeProber) Get(id string) (load.Scraped, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.probed[id] {
		return load.Scraped{}, false
	}
	return load.Scraped{ProbedAt: time.Unix(1, 0)}, true
}

type fakeReadiness struct{ calls []bool }

func (f *fakeReadiness) SetReady(r bool) { f.calls = append(f.calls, r) }

// fakeClock is a settable clock.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

func replicas(t *testing.T, specs ...discovery.ReplicaSpec) []discovery.Replica {
	t.Helper()
	rs, err := discovery.BuildReplicas("test", specs)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

type rig struct {
	ctl     *Controller
	set     *Set
	loads   fakeLoads
	streams *fakeStreams
	idx     *fakeIndex
	probes  *fakeProber
	ready   *fakeReadiness
	fid     *load.Fidelity
	clock   *fakeClock
}

func newRig(t *testing.T, warmTimeout time.Duration) *rig {
	t.Helper()
	fid, err := load.NewFidelity(load.FidelityConfig{MinSamples: 1, Alpha: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{
		loads: fakeLoads{}, streams: &fakeStreams{}, idx: &fakeIndex{},
		probes: &fakeProber{probed: map[string]bool{}}, ready: &fakeReadiness{}, fid: fid,
		clock: &fakeClock{t: time.Unix(1000, 0)},
	}
	r.set = NewSet(SetConfig{Loads: r.loads, Events: r.streams, Fidelity: fid, BlockSize: 16})
	if r.ctl, err = NewController(ControllerConfig{
		Set: r.set, Streams: r.streams, Index: r.idx, Probes: r.probes, Readiness: r.ready,
		WarmTimeout: warmTimeout, Now: r.clock.Now,
	}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) routable() string {
	var ids []string
	for _, rep := range r.set.Replicas() {
		ids = append(ids, string(rep.ID))
	}
	return strings.Join(ids, ",")
}

var (
	specA  = discovery.ReplicaSpec{ID: "a", Address: "10.0.0.1:80", Model: "m", EventsEndpoint: "tcp://10.0.0.1:5557"}
	specB  = discovery.ReplicaSpec{ID: "b", Address: "10.0.0.2:80", Model: "m"} // no events endpoint
	specC  = discovery.ReplicaSpec{ID: "c", Address: "10.0.0.3:80", Model: "m", EventsEndpoint: "tcp://10.0.0.3:5557", DPRanks: 2}
	specA2 = discovery.ReplicaSpec{ID: "a", Address: "10.0.0.1:80", Model: "m", EventsEndpoint: "tcp://10.0.0.1:6000"}
	notRdy = discovery.ReplicaSpec{ID: "a", Address: "10.0.0.1:80", Model: "m", EventsEndpoint: "tcp://10.0.0.1:5557", Ready: new(bool)}
)

// TestControllerSnapshotsAndHealth drives the controller through a
// sequence of snapshots and health changes and checks, after each step,
// what is subscribed, whose blocks were dropped, and what is routable.
func TestControllerSnapshotsAndHealth(t *testing.T) {
	type step struct {
		name       string
		snap       []discovery.ReplicaSpec // nil: no new snapshot, only a tick
		healthy    []string                // the healthy replicas from this step on
		subscribed string
		cleared    string
		routable   string
	}
	steps := []step{
		{name: "first snapshot, nothing probed yet: no stream",
			snap: []discovery.ReplicaSpec{specA, specB, specC}, subscribed: "-", routable: "a,b,c,c#dp1"},
		{name: "probed healthy: every rank with an events endpoint subscribed",
			healthy: []string{"a", "b", "c"}, subscribed: "a,c,c#dp1", routable: "a,b,c,c#dp1"},
		{name: "c removed: its ranks closed and cleared",
			snap: []discovery.ReplicaSpec{specA, specB}, healthy: []string{"a", "b"}, subscribed: "a", cleared: "c,c#dp1", routable: "a,b"},
		{name: "a unhealthy: closed and cleared, still listed",
			healthy: []string{"b"}, subscribed: "", cleared: "a", routable: "a,b"},
		{name: "a healthy again: resubscribed, nothing cleared",
			healthy: []string{"a", "b"}, subscribed: "a", routable: "a,b"},
		{name: "a not ready: leaves the routable set, keeps its stream and blocks",
			snap: []discovery.ReplicaSpec{notRdy, specB}, healthy: []string{"a", "b"}, subscribed: "a", routable: "b"},
		{name: "a's endpoint changes: resubscribed",
			snap: []discovery.ReplicaSpec{specA2, specB}, healthy: []string{"a", "b"}, subscribed: "a", routable: "a,b"},
		{name: "empty set: everything dropped",
			snap: []discovery.ReplicaSpec{}, subscribed: "", cleared: "a,b", routable: ""},
	}
	r := newRig(t, time.Minute)
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clear(r.loads)
			for _, id := range st.healthy {
				r.loads[id] = true
			}
			if st.snap != nil {
				r.ctl.apply(discovery.Snapshot{Source: "test", Replicas: replicas(t, st.snap...)})
			}
			r.ctl.syncSources()
			if got := r.streams.subscribed(); got != st.subscribed {
				t.Errorf("subscribed %q, want %q", got, st.subscribed)
			}
			if got := r.idx.take(); got != st.cleared {
				t.Errorf("cleared %q, want %q", got, st.cleared)
			}
			if got := r.routable(); got != st.routable {
				t.Errorf("routable %q, want %q", got, st.routable)
			}
			for _, rep := range r.set.All() {
				if want := r.loads[rep.ID]; r.set.Load(index.ReplicaID(rep.ID)).Healthy != want {
					t.Errorf("%s: Healthy = %v, want %v (unhealthy replicas are never picked)", rep.ID, !want, want)
				}
			}
		})
	}
	if got := r.streams.subscribed(); got != "" {
		t.Fatalf("after the empty set: subscribed %q", got)
	}
}

func TestControllerScrapeTargetsFollowSnapshot(t *testing.T) {
	r := newRig(t, time.Minute)
	r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, specA, specB)})
	if got := len(r.probes.targets); got != 2 {
		t.Fatalf("targets %v, want a and b", r.probes.targets)
	}
	r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, specB)})
	if len(r.probes.targets) != 1 || r.probes.targets[0].ID != "b" {
		t.Fatalf("targets %v, want b alone", r.probes.targets)
	}
}

// TestControllerRemovalResetsFidelity: a removed replica's served-vs-
// predicted history is forgotten for every data-parallel rank, so that a
// replica coming back under the same ID starts with full trust.
func TestControllerRemovalResetsFidelity(t *testing.T) {
	r := newRig(t, time.Minute)
	r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, specA, specC)})
	streams := []string{"a", "c", "c#dp1"}
	for _, id := range streams {
		r.fid.Observe(id, 100, 10)
		if c := r.fid.Credit(id); c >= 1 {
			t.Fatalf("%s: fidelity credit %v after a bad observation: the test proves nothing", id, c)
		}
	}
	r.ctl.apply(discovery.Snapshot{Replicas: nil})
	for _, id := range streams {
		if c := r.fid.Credit(id); c != 1 {
			t.Errorf("%s: fidelity credit %v after removal, want 1 (forgotten)", id, c)
		}
	}
}

func TestControllerSetSourcesFailureRetries(t *testing.T) {
	r := newRig(t, time.Minute)
	r.loads["a"] = true
	r.streams.err = errors.New("boom")
	r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, specA)})
	r.ctl.syncSources()
	if got := r.streams.subscribed(); got != "-" {
		t.Fatalf("subscribed %q although SetSources failed", got)
	}
	r.streams.err = nil
	r.ctl.syncSources()
	if got := r.streams.subscribed(); got != "a" {
		t.Fatalf("subscribed %q after the retry, want a", got)
	}
}

func TestControllerReadiness(t *testing.T) {
	const timeout = 30 * time.Second
	tests := []struct {
		name     string
		applied  bool
		probed   bool
		warm     bool
		elapsed  time.Duration
		shutdown bool
		want     bool
	}{
		{name: "nothing applied, even after the timeout", elapsed: time.Hour},
		{name: "applied, probed and warm", applied: true, probed: true, warm: true, want: true},
		{name: "warm streams but a replica not yet probed", applied: true, warm: true},
		{name: "probed but cold streams", applied: true, probed: true},
		{name: "cold streams, warm timeout passed", applied: true, probed: true, elapsed: timeout, want: true},
		{name: "never probed, warm timeout passed", applied: true, elapsed: timeout, want: true},
		{name: "shutting down", applied: true, probed: true, warm: true, shutdown: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, timeout)
			start := r.clock.t
			if tt.applied {
				r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, specA, specB)})
			}
			r.probes.probed["a"], r.probes.probed["b"] = tt.probed, tt.probed
			r.streams.warm = tt.warm
			r.clock.t = start.Add(tt.elapsed)
			if tt.shutdown {
				r.ctl.Shutdown()
			}
			r.ctl.checkReady(start)
			if r.ctl.Ready() != tt.want {
				t.Errorf("Ready = %v, want %v", r.ctl.Ready(), tt.want)
			}
			if want := tt.want; (len(r.ready.calls) == 1 && r.ready.calls[0]) != want {
				t.Errorf("readiness sink calls %v, want ready told: %v", r.ready.calls, want)
			}
		})
	}
}

func TestControllerStaysReadyUntilShutdown(t *testing.T) {
	r := newRig(t, time.Second)
	start := r.clock.t
	r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, specB)})
	r.probes.probed["b"] = true
	r.streams.warm = true
	r.ctl.checkReady(start)
	r.streams.warm = false // a new stream joins: readiness does not flap
	r.ctl.checkReady(start)
	if !r.ctl.Ready() || len(r.ready.calls) != 1 {
		t.Fatalf("Ready %v, sink calls %v: want ready once", r.ctl.Ready(), r.ready.calls)
	}
	r.ctl.Shutdown()
	r.clock.t = start.Add(time.Hour)
	r.ctl.checkReady(start)
	if r.ctl.Ready() {
		t.Fatal("ready again after Shutdown")
	}
}

func TestNewControllerRequiresDeps(t *testing.T) {
	_, err := NewController(ControllerConfig{WarmTimeout: -1})
	if err == nil {
		t.Fatal("no error for an empty config")
	}
	for _, want := range []string{"Set", "Streams", "Index", "Probes", "WarmTimeout"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// TestControllerRun: the Run goroutine applies snapshots from the channel,
// rechecks health on its tick, and returns when its context ends.
func TestControllerRun(t *testing.T) {
	r := newRig(t, time.Minute)
	r.streams.set = make(chan struct{}, 1)
	r.loads["a"] = true
	ctl, err := NewController(ControllerConfig{
		Set: r.set, Streams: r.streams, Index: r.idx, Probes: r.probes, WarmTimeout: time.Minute, Tick: time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	updates := make(chan discovery.Snapshot)
	done := make(chan error, 1)
	go func() { done <- ctl.Run(ctx, updates) }()
	updates <- discovery.Snapshot{Replicas: replicas(t, specA)}
	select {
	case <-r.streams.set:
	case <-time.After(10 * time.Second):
		t.Fatal("no subscription after a snapshot")
	}
	if got := r.streams.subscribed(); got != "a" {
		t.Errorf("subscribed %q, want a", got)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestMembers(t *testing.T) {
	r := newRig(t, time.Minute)
	r.loads["a"], r.loads["c"] = true, true
	r.streams.credit = map[index.ReplicaID]float64{"a": 1, "c": 1, "c#dp1": 0}
	r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, specA, specB, specC)})
	r.ctl.syncSources()
	r.fid.Observe("c#dp1", 10, 4)
	type row struct {
		id      string
		healthy bool
		credit  float64
		known   bool
		cache   load.CacheTotals
	}
	var got []row
	for _, m := range r.ctl.Members() {
		got = append(got, row{string(m.ID), m.Load.Healthy, m.Trust, m.Stream.Known, m.Cache})
	}
	want := []row{
		{"a", true, 1, true, load.CacheTotals{}},
		{"b", false, 0, false, load.CacheTotals{}},
		{"c", true, 1, true, load.CacheTotals{}},
		{"c#dp1", true, 0, true, load.CacheTotals{Predicted: 10, Served: 4, Observations: 1}},
	}
	if !slices.Equal(got, want) {
		t.Errorf("Members = %+v, want %+v", got, want)
	}
}

// TestReadyStatus: the detail /readyz shows, before and after turning
// ready, and the cold streams named in the log when the warm timeout
// releases readiness.
func TestReadyStatus(t *testing.T) {
	var logs strings.Builder
	r := newRig(t, time.Second)
	r.ctl.log = slog.New(slog.NewTextHandler(&logs, nil))
	start := r.clock.t
	if got := r.ctl.ReadyStatus().String(); got != "not ready\nreplicas: no discovery snapshot yet\nevent streams: 0 (0 caught up, warm: false)\n" {
		t.Errorf("before any snapshot:\n%s", got)
	}
	r.loads["a"], r.loads["c"] = true, true
	r.probes.probed["a"] = true
	r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, specA, specC)})
	r.ctl.syncSources()
	want := "not ready\nreplicas: 2 (1 probed)\nevent streams: 3 (0 caught up, warm: false)\n" +
		"degraded: a warming\ndegraded: c warming\ndegraded: c#dp1 warming\n"
	if got := r.ctl.ReadyStatus().String(); got != want {
		t.Errorf("cold:\n%s\nwant:\n%s", got, want)
	}
	r.clock.t = start.Add(time.Second)
	r.ctl.checkReady(start)
	st := r.ctl.ReadyStatus()
	if !st.Ready || !strings.HasPrefix(st.String(), "ready\n") {
		t.Errorf("after the warm timeout:\n%s", st)
	}
	if !strings.Contains(logs.String(), `events_warm=false`) || !strings.Contains(logs.String(), `degraded="[a warming c warming c#dp1 warming]"`) {
		t.Errorf("ready log does not name the cold streams:\n%s", logs.String())
	}
}

// TestLookaheadFollowsTheStreams: the lookahead a stream's events report
// reaches its routable entries (every DP rank its own), and leaves them
// when the stream stops reporting it.
func TestLookaheadFollowsTheStreams(t *testing.T) {
	r := newRig(t, 0)
	r.loads["a"], r.loads["c"] = true, true
	r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, specA, specC)})
	r.ctl.syncSources()
	lookaheads := func() string {
		var out []string
		for _, rep := range r.set.Replicas() {
			out = append(out, fmt.Sprintf("%s=%d", rep.ID, rep.Lookahead))
		}
		return strings.Join(out, ",")
	}
	r.ctl.syncLookahead()
	if got := lookaheads(); got != "a=0,c=0,c#dp1=0" {
		t.Fatalf("before any report: %s", got)
	}
	r.streams.mu.Lock()
	r.streams.lookahead = map[index.ReplicaID]int{"a": 2, "c#dp1": 1}
	r.streams.mu.Unlock()
	r.ctl.syncLookahead()
	if got := lookaheads(); got != "a=2,c=0,c#dp1=1" {
		t.Fatalf("after reports: %s", got)
	}
	r.streams.mu.Lock()
	r.streams.lookahead = nil
	r.streams.mu.Unlock()
	r.ctl.syncLookahead()
	if got := lookaheads(); got != "a=0,c=0,c#dp1=0" {
		t.Fatalf("after the reports stop: %s", got)
	}
}

// TestGroupKindsReachTheEventSource: a replica's group_kinds label its
// event streams' KV-cache groups (events.Source.GroupKinds), every rank.
func TestGroupKindsReachTheEventSource(t *testing.T) {
	r := newRig(t, 0)
	r.loads["c"] = true
	spec := specC
	spec.GroupKinds = []string{"full_attention", "sliding_window"}
	r.ctl.apply(discovery.Snapshot{Replicas: replicas(t, spec)})
	r.ctl.syncSources()
	r.streams.mu.Lock()
	defer r.streams.mu.Unlock()
	srcs := r.streams.calls[len(r.streams.calls)-1]
	if len(srcs) != 2 {
		t.Fatalf("sources %+v, want two ranks", srcs)
	}
	for _, s := range srcs {
		if s.GroupKinds != "full_attention,sliding_window" {
			t.Errorf("%s: GroupKinds %q", s.ID, s.GroupKinds)
		}
	}
}
