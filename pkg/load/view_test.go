package load

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// started is one request started on the tracker before the view is read.
type started struct {
	replica         string
	prefill, decode int
	firstToken      bool // moved to decode
	done            bool // already finished (still counts for the mean size)
}

func TestViewCombines(t *testing.T) {
	now := time.Unix(1000, 0)
	fresh, stale := now.Add(-time.Second), now.Add(-3*time.Second)
	tests := []struct {
		name          string
		started       []started
		scraped       *Scraped // nil: not a scrape target
		requestBlocks float64
		want          Load
	}{
		{"local only", []started{{"r", 4, 8, false, false}, {"r", 0, 0, false, false}}, nil,
			0, Load{ActivePrefillBlocks: 4, ActiveDecodeBlocks: 8, ActiveRequests: 2, Healthy: true}},
		{"stale figures ignored, health kept", []started{{"r", 2, 3, false, false}},
			&Scraped{Healthy: false, Running: 9, Waiting: 9, KVUsage: 0.9, MetricsAt: stale},
			0, Load{ActivePrefillBlocks: 2, ActiveDecodeBlocks: 3, ActiveRequests: 1}},
		{"target not yet probed is unhealthy", nil, &Scraped{}, 0, Load{}},
		{"healthy without metrics", []started{{"r", 0, 0, false, false}, {"r", 0, 0, false, false}}, &Scraped{Healthy: true},
			0, Load{ActiveRequests: 2, Healthy: true}},

		// Without a sampled baseline: counts are max(L, R+W), as before.
		{"unsampled: we routed more than the engine reported yet", []started{{"r", 0, 0, false, false}, {"r", 0, 0, false, false}, {"r", 0, 0, false, false}},
			&Scraped{Healthy: true, Running: 1, Waiting: 1, KVUsage: 0.1, MetricsAt: fresh},
			0, Load{ActiveRequests: 2, WaitingRequests: 1, KVUsage: 0.1, Healthy: true}},
		// L=1 (1, 2); R+W=8 -> U=7, 3/8 waiting: prefill 1+7*3/8*1, decode 2+7*5/8*2.
		{"unsampled: engine reports more than we routed", []started{{"r", 1, 2, false, false}},
			&Scraped{Healthy: true, Running: 5, Waiting: 3, KVUsage: 0.6, MetricsAt: fresh},
			0, Load{ActivePrefillBlocks: 3.625, ActiveDecodeBlocks: 10.75, ActiveRequests: 5, WaitingRequests: 3, KVUsage: 0.6, Healthy: true}},

		// With the baseline sampled at the scrape.
		{"own finished requests still on the engine's figure are not counted", []started{{"r", 6, 10, true, true}, {"r", 6, 10, true, true}},
			&Scraped{Healthy: true, Running: 2, MetricsAt: fresh, LocalRequests: 2, LocalKnown: true},
			0, Load{Healthy: true}},
		{"own waiting requests that finished do not leave negative active", []started{{"r", 4, 4, false, true}},
			&Scraped{Healthy: true, Waiting: 3, MetricsAt: fresh, LocalRequests: 3, LocalKnown: true},
			0, Load{Healthy: true}},
		{"own requests the engine has not reported yet", []started{{"r", 4, 8, false, false}, {"r", 4, 8, false, false}},
			&Scraped{Healthy: true, MetricsAt: fresh, LocalRequests: 0, LocalKnown: true},
			0, Load{ActivePrefillBlocks: 8, ActiveDecodeBlocks: 16, ActiveRequests: 2, Healthy: true}},
		// L=1 (4, 10), B=1, R+W=4 -> U=3; waiting share 1/4: prefill 4+3/4*4, decode 10+9/4*10.
		{"others' requests sized by our mean request there", []started{{"r", 4, 10, false, false}},
			&Scraped{Healthy: true, Running: 3, Waiting: 1, MetricsAt: fresh, LocalRequests: 1, LocalKnown: true},
			0, Load{ActivePrefillBlocks: 7, ActiveDecodeBlocks: 32.5, ActiveRequests: 3, WaitingRequests: 1, Healthy: true}},
		// Nothing started on r: the other replicas' mean (q's request), all running.
		{"no sample on the replica: other replicas' mean", []started{{"q", 6, 12, true, true}},
			&Scraped{Healthy: true, Running: 2, MetricsAt: fresh, LocalKnown: true},
			0, Load{ActiveDecodeBlocks: 24, ActiveRequests: 2, Healthy: true}},
		{"no sample at all: default size", nil,
			&Scraped{Healthy: true, Running: 2, Waiting: 2, MetricsAt: fresh, LocalKnown: true},
			0, Load{ActivePrefillBlocks: 2 * DefaultRequestBlocks, ActiveDecodeBlocks: 2 * DefaultRequestBlocks, ActiveRequests: 2, WaitingRequests: 2, Healthy: true}},
		{"no sample at all: configured size", nil,
			&Scraped{Healthy: true, Running: 2, Waiting: 2, MetricsAt: fresh, LocalKnown: true},
			10, Load{ActivePrefillBlocks: 20, ActiveDecodeBlocks: 20, ActiveRequests: 2, WaitingRequests: 2, Healthy: true}},
		{"fully cached requests have a zero prefill mean", []started{{"r", 0, 9, true, false}},
			&Scraped{Healthy: true, Running: 1, Waiting: 2, MetricsAt: fresh, LocalRequests: 1, LocalKnown: true},
			// U=2, 2/3 of them waiting (0 prefill blocks each), 1/3 running: decode 9+2/3*9.
			0, Load{ActiveDecodeBlocks: 15, ActiveRequests: 1, WaitingRequests: 2, Healthy: true}},
		{"negative engine figures are taken as 0", []started{{"r", 1, 1, false, false}},
			&Scraped{Healthy: true, Running: -5, Waiting: -5, MetricsAt: fresh, LocalRequests: 1, LocalKnown: true},
			0, Load{ActivePrefillBlocks: 1, ActiveDecodeBlocks: 1, ActiveRequests: 1, Healthy: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr, _ := NewTracker(nil)
			for _, s := range tc.started {
				h := tr.Start(s.replica, s.prefill, s.decode)
				if s.firstToken {
					h.FirstToken()
				}
				if s.done {
					h.Done()
				} else {
					defer h.Done()
				}
			}
			sc, err := NewScraper(ScraperConfig{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.scraped != nil {
				injectState(sc, "r", *tc.scraped)
			}
			v := &View{Tracker: tr, Scraper: sc, RequestBlocks: tc.requestBlocks, Now: func() time.Time { return now }}
			if d := cmp.Diff(tc.want, v.Load("r"), cmpopts.EquateApprox(0, 1e-9)); d != "" {
				t.Errorf("Load mismatch (-want +got):\n%s", d)
			}
		})
	}
	var empty View
	if got := empty.Load("x"); got != (Load{Healthy: true}) {
		t.Errorf("empty view Load = %+v", got)
	}
	if empty.Credit("x") != 1 {
		t.Error("empty view credit != 1")
	}
}

// TestViewTwoRouters models two routers, A and B, sending equal-sized
// requests to one engine, where B's requests wait and run in the same
// proportion as the engine's whole queue (the estimate's assumption). A's
// view, from its own tracker and the engine's figures with the baseline
// sampled at the scrape, then equals the engine's whole load: A's exact
// figures plus B's waiting requests as prefill and running ones as decode.
func TestViewTwoRouters(t *testing.T) {
	const prefill, decode = 5, 9
	now := time.Unix(1000, 0)
	tests := []struct {
		name                   string
		aPrefilling, aDecoding int
		bWaiting, bRunning     int
	}{
		{"only A", 2, 3, 0, 0},
		{"A idle, B busy", 0, 0, 2, 4},
		{"both", 1, 2, 2, 4},
		{"both, all running", 0, 3, 0, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := NewTracker(nil)
			for range tc.aPrefilling {
				defer a.Start("r", prefill, decode).Done()
			}
			for range tc.aDecoding {
				h := a.Start("r", prefill, decode)
				h.FirstToken()
				defer h.Done()
			}
			if tc.aPrefilling+tc.aDecoding == 0 {
				a.Start("r", prefill, decode).Done() // A's mean request, as B's are
			}
			// The engine: A's prefilling requests wait, decoding ones run.
			sc, _ := NewScraper(ScraperConfig{})
			injectState(sc, "r", Scraped{
				Healthy: true, MetricsAt: now,
				Running:       tc.aDecoding + tc.bRunning,
				Waiting:       tc.aPrefilling + tc.bWaiting,
				LocalRequests: tc.aPrefilling + tc.aDecoding, LocalKnown: true,
			})
			v := &View{Tracker: a, Scraper: sc, Now: func() time.Time { return now }}
			got := v.Load("r")
			// A's tracker charges its prefilling requests' footprint to
			// decode too; B's waiting requests hold no KV yet.
			want := Load{
				ActivePrefillBlocks: float64((tc.aPrefilling + tc.bWaiting) * prefill),
				ActiveDecodeBlocks:  float64((tc.aPrefilling + tc.aDecoding + tc.bRunning) * decode),
				ActiveRequests:      tc.aDecoding + tc.bRunning,
				WaitingRequests:     tc.aPrefilling + tc.bWaiting,
				Healthy:             true,
			}
			if d := cmp.Diff(want, got, cmpopts.EquateApprox(0, 1e-9)); d != "" {
				t.Errorf("A's view mismatch (-want +got):\n%s", d)
			}
			// Without the sampled baseline, A would compare the engine's
			// figure with its current count: the same here, since nothing
			// moved between the scrape and the read.
			injectState(sc, "r", Scraped{Healthy: true, MetricsAt: now,
				Running: tc.aDecoding + tc.bRunning, Waiting: tc.aPrefilling + tc.bWaiting})
			if d := cmp.Diff(want, v.Load("r"), cmpopts.EquateApprox(0, 1e-9)); d != "" {
				t.Errorf("A's view without baseline mismatch (-want +got):\n%s", d)
			}
		})
	}
}

// TestViewSingleRouterNeverDoubleCounts runs random request lifecycles
// through one tracker while a fake engine reports exactly this router's
// requests, scraped through the Scraper's own sampling: whether the
// requests started or finished since the last scrape (the engine's figure
// lags), the view adds nothing to the router's own figures. Without the
// sampled baseline it would: the check fails if View ignores it.
func TestViewSingleRouterNeverDoubleCounts(t *testing.T) {
	tr, _ := NewTracker(nil)
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "vllm:num_requests_running %d\nvllm:num_requests_waiting 0\n", tr.Get("r").Requests)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	sc, err := NewScraper(ScraperConfig{Tracker: tr, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer sc.cfg.Client.CloseIdleConnections()
	scrape := func() {
		m, err := sc.metrics(t.Context(), Target{ID: "r", URL: srv.URL}, nil)
		if err != nil {
			t.Fatal(err)
		}
		injectState(sc, "r", Scraped{Healthy: true, Running: m.running, Waiting: m.waiting,
			MetricsAt: time.Now(), LocalRequests: m.local, LocalKnown: m.localKnown})
	}
	v := &View{Tracker: tr, Scraper: sc, StaleAfter: time.Hour}

	rng := rand.New(rand.NewPCG(1, 2))
	var open []*Handle
	for i := range 400 {
		for range rng.IntN(4) { // 0..3 lifecycle steps since the last scrape
			if len(open) > 0 && rng.IntN(2) == 0 {
				j := rng.IntN(len(open))
				open[j].Done()
				open = append(open[:j], open[j+1:]...)
			} else {
				h := tr.Start("r", 1+rng.IntN(8), 8+rng.IntN(8))
				if rng.IntN(2) == 0 {
					h.FirstToken()
				}
				open = append(open, h)
			}
		}
		local := tr.Get("r")
		got := v.Load("r")
		if got.ActivePrefillBlocks != float64(local.PrefillBlocks) || got.ActiveDecodeBlocks != float64(local.DecodeBlocks) ||
			got.Requests() != local.Requests {
			t.Fatalf("step %d: view %+v, tracker %+v: own load counted twice", i, got, local)
		}
		if rng.IntN(2) == 0 {
			scrape()
		}
	}
	for _, h := range open {
		h.Done()
	}
}

func TestScraperSamplesTracker(t *testing.T) {
	tr, _ := NewTracker(nil)
	e := newEngine(t)
	e.running.Store(4)
	h1, h2 := tr.Start("r", 1, 1), tr.Start("r", 1, 1)
	defer h1.Done()
	defer h2.Done()
	tests := []struct {
		name      string
		tracker   *Tracker
		wantLocal int
		wantKnown bool
	}{
		{"with tracker", tr, 2, true},
		{"without tracker", nil, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sc := runScraper(t, ScraperConfig{Tracker: tc.tracker})
			sc.SetTargets([]Target{{ID: "r", URL: e.url()}})
			eventually(t, "metrics scraped", func() bool {
				s, _ := sc.Get("r")
				return !s.MetricsAt.IsZero()
			})
			s, _ := sc.Get("r")
			if s.LocalRequests != tc.wantLocal || s.LocalKnown != tc.wantKnown || s.Running != 4 {
				t.Errorf("scraped %+v, want local %d known %v running 4", s, tc.wantLocal, tc.wantKnown)
			}
		})
	}
}

func TestTrackerMeanRequest(t *testing.T) {
	tr, _ := NewTracker(nil)
	if _, ok := tr.MeanRequest("r"); ok {
		t.Fatal("MeanRequest on an empty tracker reports a sample")
	}
	steps := []struct {
		name            string
		replica         string
		prefill, decode int
		ask             string
		want            RequestSize
	}{
		{"first sample is the mean", "r", 8, 16, "r", RequestSize{8, 16}},
		{"weighted 1/32", "r", 40, 48, "r", RequestSize{9, 17}},
		{"unknown replica takes the average of the replicas' means", "q", 0, 0, "z", RequestSize{4.5, 8.5}},
		{"a zero mean is a sample", "q", 0, 0, "q", RequestSize{0, 0}},
		{"negative blocks count as 0", "p", -4, -4, "p", RequestSize{0, 0}},
	}
	for _, s := range steps {
		tr.Start(s.replica, s.prefill, s.decode).Done()
		got, ok := tr.MeanRequest(s.ask)
		if !ok || math.Abs(got.PrefillBlocks-s.want.PrefillBlocks) > 1e-9 || math.Abs(got.DecodeBlocks-s.want.DecodeBlocks) > 1e-9 {
			t.Errorf("%s: MeanRequest(%s) = %+v, %v; want %+v", s.name, s.ask, got, ok, s.want)
		}
	}
}

func TestTrackerMeanRequestConcurrent(t *testing.T) {
	tr, _ := NewTracker(nil)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 500 {
				tr.Start(fmt.Sprint("r", g%2), 10, 20).Done()
				_, _ = tr.MeanRequest("r0")
			}
		})
	}
	wg.Wait()
	for _, r := range []string{"r0", "r1", "none"} {
		if got, ok := tr.MeanRequest(r); !ok || got != (RequestSize{10, 20}) {
			t.Errorf("MeanRequest(%s) = %+v, %v; want exactly {10 20}", r, got, ok)
		}
	}
}

// BenchmarkViewLoadOthers is Load with fresh engine figures that include
// other routers' requests (the estimate's path).
func BenchmarkViewLoadOthers(b *testing.B) {
	tr, _ := NewTracker(nil)
	defer tr.Start("r1", 4, 8).Done()
	sc, _ := NewScraper(ScraperConfig{})
	injectState(sc, "r1", Scraped{Healthy: true, Running: 3, Waiting: 2, MetricsAt: time.Now(), LocalRequests: 1, LocalKnown: true})
	v := &View{Tracker: tr, Scraper: sc, StaleAfter: time.Hour}
	b.ReportAllocs()
	for b.Loop() {
		if v.Load("r1").Requests() != 5 {
			b.Fatal("wrong load")
		}
	}
}
