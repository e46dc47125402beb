package respstore

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// engine is a replica's response store as seen over HTTP: GET
// /v1/responses/{id} is 200 for the ids it holds, 404 otherwise.
type engine struct {
	srv   *httptest.Server
	hits  atomic.Int64
	paths chan string
}

func newEngine(t *testing.T, ids ...string) *engine {
	e := &engine{paths: make(chan string, 64)}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.hits.Add(1)
		select {
		case e.paths <- r.URL.EscapedPath():
		default:
		}
		id, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/")
		if r.Method != http.MethodGet || !ok {
			http.Error(w, "no route", http.StatusMethodNotAllowed)
			return
		}
		for _, held := range ids {
			if id == held {
				_, _ = w.Write([]byte(`{"id":"` + id + `","object":"response","status":"completed","output":[]}`))
				return
			}
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"error":{"message":"Response with id '` + id + `' not found.","type":"invalid_request_error","param":"response_id","code":404}}`))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) addr() string { return strings.TrimPrefix(e.srv.URL, "http://") }

func newStore(t *testing.T, cfg Config, addrs func(string) []string) (*Store, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	s, err := New(cfg.WithDefaults(), Options{Addresses: addrs, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

func TestBook(t *testing.T) {
	s, reg := newStore(t, Config{Memory: 2, DisableLookup: true}, nil)
	s.Stored("resp_a", "10.0.0.1:8000")
	if a, src := s.Holder(t.Context(), "m", "resp_a"); a != "10.0.0.1:8000" || src != SourceBook {
		t.Fatalf("holder %q (%s)", a, src)
	}
	// A 404 from another replica does not unlearn the holder; its own does.
	s.Lost("resp_a", "10.0.0.2:8000")
	if a, _ := s.Holder(t.Context(), "m", "resp_a"); a != "10.0.0.1:8000" {
		t.Fatalf("after another's 404: %q", a)
	}
	if got := testutil.ToFloat64(s.lost); got != 0 {
		t.Errorf("another's 404 counted as a lost holder (%v)", got)
	}
	s.Lost("resp_a", "10.0.0.1:8000")
	if a, src := s.Holder(t.Context(), "m", "resp_a"); a != "" || src != SourceSkipped {
		t.Fatalf("after its holder's 404: %q (%s)", a, src)
	}
	if got := testutil.ToFloat64(s.lost); got != 1 {
		t.Errorf("lost holders counted %v, want 1", got)
	}
	// Bounded: the oldest told is forgotten first; telling again renews.
	s.Stored("resp_1", "a:1")
	s.Stored("resp_2", "a:2")
	s.Stored("resp_1", "a:3") // moved: the newest
	s.Stored("resp_3", "a:4")
	if s.Len() != 2 {
		t.Fatalf("remembered %d, want 2", s.Len())
	}
	// Only resp_2 was pushed out (resp_a's slot was freed by Lost, resp_1's
	// old one by its renewal), and it is counted.
	if got := testutil.ToFloat64(s.forgotten); got != 1 {
		t.Errorf("forgotten ids counted %v, want 1", got)
	}
	if a, _ := s.Holder(t.Context(), "", "resp_2"); a != "" {
		t.Errorf("resp_2 should be forgotten, holder %q", a)
	}
	if a, _ := s.Holder(t.Context(), "", "resp_1"); a != "a:3" {
		t.Errorf("resp_1 holder %q, want a:3", a)
	}
	if got := testutil.ToFloat64(s.holders.WithLabelValues("book")); got != 3 {
		t.Errorf("book answers %v, want 3", got)
	}
	if n, err := testutil.GatherAndCount(reg, "kvroute_responses_remembered"); err != nil || n != 1 {
		t.Errorf("remembered gauge: %d, %v", n, err)
	}
	// Empty and overlong ids are never kept.
	long := strings.Repeat("x", MaxIDBytes+1)
	s.Stored(long, "a:5")
	s.Stored("", "a:5")
	s.Stored("resp_x", "")
	if a, src := s.Holder(t.Context(), "", long); a != "" || src != SourceSkipped || s.Len() != 2 {
		t.Errorf("overlong id: %q (%s), %d remembered", a, src, s.Len())
	}
}

func TestLookup(t *testing.T) {
	e1, e2, e3 := newEngine(t), newEngine(t, "resp_b", "id/with slash"), newEngine(t)
	var asked []string
	var mu sync.Mutex
	addrs := func(model string) []string {
		mu.Lock()
		asked = append(asked, model)
		mu.Unlock()
		return []string{e1.addr(), e2.addr(), e3.addr()}
	}
	now := time.Unix(1000, 0)
	reg := prometheus.NewRegistry()
	s, err := New(Config{}.WithDefaults(), Options{Addresses: addrs, Registerer: reg, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if a, src := s.Holder(t.Context(), "m", "resp_b"); a != e2.addr() || src != SourceLookup {
		t.Fatalf("holder %q (%s), want %s by lookup", a, src, e2.addr())
	}
	// Found once, then known.
	hits := e1.hits.Load() + e2.hits.Load() + e3.hits.Load()
	if a, src := s.Holder(t.Context(), "m", "resp_b"); a != e2.addr() || src != SourceBook {
		t.Fatalf("second holder %q (%s)", a, src)
	}
	if h := e1.hits.Load() + e2.hits.Load() + e3.hits.Load(); h != hits {
		t.Errorf("a known holder was looked up again: %d requests, were %d", h, hits)
	}
	if len(asked) != 1 || asked[0] != "m" {
		t.Errorf("addresses asked for %q", asked)
	}
	// The id is one path segment, escaped.
	for len(e2.paths) > 0 {
		<-e2.paths
	}
	if a, _ := s.Holder(t.Context(), "m", "id/with slash"); a != e2.addr() {
		t.Fatalf("escaped id: holder %q", a)
	}
	if p := <-e2.paths; p != "/v1/responses/id%2Fwith%20slash" {
		t.Errorf("path %q", p)
	}
	// Found nowhere: unknown, then not asked again for MissTTL.
	if a, src := s.Holder(t.Context(), "m", "resp_none"); a != "" || src != SourceUnknown {
		t.Fatalf("unknown id: %q (%s)", a, src)
	}
	hits = e1.hits.Load() + e2.hits.Load() + e3.hits.Load()
	if _, src := s.Holder(t.Context(), "m", "resp_none"); src != SourceSkipped {
		t.Fatalf("a recent miss: %s", src)
	}
	if h := e1.hits.Load() + e2.hits.Load() + e3.hits.Load(); h != hits {
		t.Errorf("a recent miss was asked again")
	}
	now = now.Add(MissTTL)
	if _, src := s.Holder(t.Context(), "m", "resp_none"); src != SourceUnknown {
		t.Fatalf("a miss past MissTTL: %s", src)
	}
	// A holder told later replaces the miss at once.
	s.Stored("resp_none", e3.addr())
	if a, src := s.Holder(t.Context(), "m", "resp_none"); a != e3.addr() || src != SourceBook {
		t.Fatalf("told after a miss: %q (%s)", a, src)
	}
	if got := testutil.ToFloat64(s.requests.WithLabelValues("found")); got != 2 {
		t.Errorf("found answers %v, want 2", got)
	}
}

// A lookup ends at its timeout, and past LookupConcurrency requests go
// without one.
func TestLookupBounds(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(slow.Close)
	addr := strings.TrimPrefix(slow.URL, "http://")
	// Past lookup_fanout: never asked.
	past := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("the address past lookup_fanout was asked: %s", r.URL)
		w.WriteHeader(http.StatusNotFound)
	}))
	t.Cleanup(past.Close)
	s, _ := newStore(t, Config{LookupTimeout: 300 * time.Millisecond, LookupConcurrency: 1, LookupFanout: 1},
		func(string) []string { return []string{addr, strings.TrimPrefix(past.URL, "http://")} })

	done := make(chan Source)
	start := time.Now()
	go func() {
		_, src := s.Holder(context.Background(), "m", "resp_slow")
		done <- src
	}()
	// Wait for the first lookup to hold the only slot.
	for deadline := time.Now().Add(2 * time.Second); len(s.slots) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the first lookup never started")
		}
		time.Sleep(time.Millisecond)
	}
	if _, src := s.Holder(t.Context(), "m", "resp_other"); src != SourceBusy {
		t.Errorf("a lookup past the concurrency bound: %s, want busy", src)
	}
	if src := <-done; src != SourceUnanswered {
		t.Errorf("timed-out lookup: %s, want unanswered", src)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("a lookup took %v with a 300ms timeout", el)
	}
	if got := testutil.ToFloat64(s.requests.WithLabelValues("timeout")); got != 1 {
		t.Errorf("timeouts counted %v, want 1", got)
	}
	once.Do(func() { close(release) })
	// A timeout is no miss: the slow replica may hold it, so the next
	// request naming it asks again (now answered: a 404, remembered).
	if _, src := s.Holder(t.Context(), "m", "resp_slow"); src != SourceUnknown {
		t.Errorf("after a timeout, the next lookup: %s, want unknown (asked again)", src)
	}
	if _, src := s.Holder(t.Context(), "m", "resp_slow"); src != SourceSkipped {
		t.Errorf("after every replica answered 404: %s, want skipped (a remembered miss)", src)
	}
	// The fan-out bound: only the first address was asked (the second
	// server fails the test if it is).
	if got := testutil.ToFloat64(s.requests.WithLabelValues("error")); got != 0 {
		t.Errorf("errors %v", got)
	}
}

func TestConfig(t *testing.T) {
	c := Config{}.WithDefaults()
	if c.Memory != DefaultMemory || c.LookupTimeout != DefaultLookupTimeout || c.LookupConcurrency != DefaultLookupConcurrency || c.LookupFanout != DefaultLookupFanout {
		t.Fatalf("defaults %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	err := Config{Memory: -1, LookupTimeout: -time.Second, LookupConcurrency: -2, LookupFanout: -3}.Validate()
	for _, want := range []string{"memory: -1", "lookup_timeout: -1s", "lookup_concurrency: -2", "lookup_fanout: -3"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want %q", err, want)
		}
	}
	if _, err := New(Config{}, Options{}); err == nil {
		t.Error("New accepted an undefaulted config")
	}
}

// Elsewhere skips the holder it is told cannot serve, and remembers the
// replica it finds instead; when none has it the remembered holder stays.
func TestElsewhere(t *testing.T) {
	down, e2 := newEngine(t, "resp_moved", "resp_here"), newEngine(t, "resp_moved")
	s, _ := newStore(t, Config{}, func(string) []string { return []string{down.addr(), e2.addr()} })
	s.Stored("resp_moved", down.addr())
	s.Stored("resp_here", down.addr())
	if a, src := s.Elsewhere(t.Context(), "m", "resp_moved", down.addr()); a != e2.addr() || src != SourceLookup {
		t.Fatalf("elsewhere: %q (%s), want %s", a, src, e2.addr())
	}
	if down.hits.Load() != 0 {
		t.Errorf("the holder to look past was asked %d times", down.hits.Load())
	}
	if a, _ := s.Holder(t.Context(), "m", "resp_moved"); a != e2.addr() {
		t.Errorf("holder after elsewhere: %q", a)
	}
	if a, src := s.Elsewhere(t.Context(), "m", "resp_here", down.addr()); a != "" || src != SourceUnknown {
		t.Fatalf("nowhere else: %q (%s)", a, src)
	}
	if a, src := s.Holder(t.Context(), "m", "resp_here"); a != down.addr() || src != SourceBook {
		t.Errorf("the remembered holder after a miss elsewhere: %q (%s)", a, src)
	}
}

// slowHolder is a Store whose one replica, at addr, stores every response
// but answers a lookup only once release is closed; asked counts the
// lookups it received.
func slowHolder(t *testing.T) (s *Store, addr string, asked *atomic.Int64, release chan struct{}) {
	asked, release = new(atomic.Int64), make(chan struct{})
	holder := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		<-release
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(holder.Close)
	addr = strings.TrimPrefix(holder.URL, "http://")
	s, _ = newStore(t, Config{LookupTimeout: 5 * time.Second, LookupConcurrency: 1},
		func(string) []string { return []string{addr} })
	return s, addr, asked, release
}

// waitAsked waits until the replica received a lookup.
func waitAsked(t *testing.T, asked *atomic.Int64) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Second); asked.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("no lookup started")
		}
		time.Sleep(time.Millisecond)
	}
}

// Requests naming one unknown id at once share one lookup: each replica
// is asked once, every request gets the holder, and none is refused for
// lookup_concurrency (1 here).
func TestLookupShared(t *testing.T) {
	s, addr, asked, release := slowHolder(t)
	const n = 8
	got := make(chan Source, n)
	var started sync.WaitGroup
	for range n {
		started.Add(1)
		go func() {
			started.Done()
			a, src := s.Holder(context.Background(), "m", "resp_poll")
			if a != addr {
				src = "wrong holder " + Source(a)
			}
			got <- src
		}()
	}
	started.Wait()
	waitAsked(t, asked)
	time.Sleep(20 * time.Millisecond) // let the other requests reach the lookup in flight
	close(release)
	for range n {
		if src := <-got; src != SourceLookup && src != SourceBook {
			t.Errorf("a request naming the id: %s, want lookup (joined) or book (after it)", src)
		}
	}
	if a := asked.Load(); a != 1 {
		t.Errorf("the holder was asked %d times, want once", a)
	}
}

// TestLookupOutlivesFirstRequest: the request that starts a shared lookup
// going away (its context cancelled) does not end the lookup for the
// requests that joined it: they get the holder.
func TestLookupOutlivesFirstRequest(t *testing.T) {
	s, addr, asked, release := slowHolder(t)
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan string, 1)
	go func() {
		a, _ := s.Holder(ctx, "m", "resp_gone")
		first <- a
	}()
	waitAsked(t, asked)
	joined := make(chan Source, 1)
	go func() {
		a, src := s.Holder(context.Background(), "m", "resp_gone")
		if a != addr {
			src = "wrong holder " + Source(a)
		}
		joined <- src
	}()
	time.Sleep(20 * time.Millisecond) // let the second request join the lookup in flight
	cancel()
	time.Sleep(20 * time.Millisecond) // a lookup on the first request's context would end here
	close(release)
	if src := <-joined; src != SourceLookup && src != SourceBook {
		t.Errorf("the joined request: %s, want lookup (joined) or book (after it)", src)
	}
	if a := <-first; a != addr {
		t.Errorf("the first request: holder %q, want %q (the lookup is bounded by lookup_timeout, not its context)", a, addr)
	}
	if a := asked.Load(); a != 1 {
		t.Errorf("the holder was asked %d times, want once", a)
	}
}
