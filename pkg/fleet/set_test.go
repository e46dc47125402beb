package fleet

import (
	"math"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/discovery"
	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

type fakeCredit map[index.ReplicaID]float64

func (f fakeCredit) Credit(id index.ReplicaID) float64 { return f[id] }

func TestSet(t *testing.T) {
	fid, err := load.NewFidelity(load.FidelityConfig{MinSamples: 1, Alpha: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := fakeCredit{"a": 1, "b": 1, "c": 0, "d": 1, "d#dp1": 1}
	s := NewSet(SetConfig{Loads: &load.View{}, Events: ev, Fidelity: fid, BlockSize: 16})
	rs, err := discovery.BuildReplicas("r", []discovery.ReplicaSpec{
		{ID: "a", Address: "10.0.0.1:80", Model: "m", EventsEndpoint: "tcp://10.0.0.1:5557"},
		{ID: "b", Address: "10.0.0.2:80", Model: "m"},
		{ID: "c", Address: "10.0.0.3:80", Model: "m", EventsEndpoint: "tcp://10.0.0.3:5557", BlockSize: 32},
		{ID: "d", Address: "10.0.0.4:80", Model: "m", EventsEndpoint: "tcp://10.0.0.4:5557", DPRanks: 2},
		{ID: "e", Address: "10.0.0.5:80", Model: "m", Ready: new(bool)},
		{ID: "f", Address: "10.0.0.6:80", Model: "m2", LoRAAdapters: []string{"ad"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.set(rs)
	fid.Observe("d", 100, 50) // served half of what was predicted

	var ids []string
	for _, r := range s.Replicas() {
		ids = append(ids, string(r.ID))
	}
	if got, want := strings.Join(ids, ","), "a,b,c,d,d#dp1,f"; got != want {
		t.Errorf("routable = %s, want %s (not-ready e excluded, d expanded per rank)", got, want)
	}
	credits := []struct {
		id   index.ReplicaID
		want float64
	}{
		{"a", 1},     // events caught up, fidelity full
		{"b", 0},     // no events endpoint: no cache view
		{"c", 0},     // resyncing
		{"d", 0.5},   // min(events 1, fidelity 0.5)
		{"d#dp1", 1}, // rank 1 has its own fidelity
		{"zz", 0},    // unknown
	}
	for _, c := range credits {
		if got := s.Trust(c.id); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("Trust(%s) = %v, want %v", c.id, got, c.want)
		}
	}
	for id, want := range map[index.ReplicaID]bool{"a": true, "b": false, "c": true, "d#dp1": true, "zz": false} {
		if got := s.EventFed(id); got != want {
			t.Errorf("EventFed(%s) = %v, want %v", id, got, want)
		}
	}
	if s.BlockSize("c") != 32 || s.BlockSize("a") != 16 || s.BlockSize("zz") != 0 {
		t.Errorf("block sizes: c %d a %d zz %d", s.BlockSize("c"), s.BlockSize("a"), s.BlockSize("zz"))
	}
	if got := s.TokenizerURLs("m"); len(got) != 4 {
		t.Errorf("TokenizerURLs = %v, want the 4 ready replicas", got)
	}
	// Where a stored response is looked for: each ready replica of the
	// model (or serving it as an adapter) once, ranks sharing an address.
	for model, want := range map[string]string{
		"m": "10.0.0.1:80,10.0.0.2:80,10.0.0.3:80,10.0.0.4:80", "ad": "10.0.0.6:80", "m2": "10.0.0.6:80", "zz": "",
		"": "10.0.0.1:80,10.0.0.2:80,10.0.0.3:80,10.0.0.4:80,10.0.0.6:80",
	} {
		if got := strings.Join(s.Addresses(model), ","); got != want {
			t.Errorf("Addresses(%q) = %s, want %s", model, got, want)
		}
	}
	srcs, errs := eventSources(rs, s.blockSizeOf)
	if len(errs) != 0 || len(srcs) != 4 {
		t.Fatalf("eventSources = %v %v, want a, c, d, d#dp1", srcs, errs)
	}
	if srcs[3].ID != "d#dp1" || srcs[3].Endpoint != "tcp://10.0.0.4:5558" {
		t.Errorf("rank 1 source = %+v", srcs[3])
	}
}

func TestSetTokenizerURLsPreferHealthy(t *testing.T) {
	rs := replicas(t,
		discovery.ReplicaSpec{ID: "a", Address: "10.0.0.1:80", Model: "m"},
		discovery.ReplicaSpec{ID: "b", Address: "10.0.0.2:80", Model: "m"},
		discovery.ReplicaSpec{ID: "c", Address: "10.0.0.3:80", Model: "other"},
	)
	tests := []struct {
		name    string
		healthy fakeLoads
		want    string
	}{
		{"healthy ones only", fakeLoads{"b": true, "c": true}, "http://10.0.0.2:80"},
		{"every ready one when none is healthy", fakeLoads{}, "http://10.0.0.1:80,http://10.0.0.2:80"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSet(SetConfig{Loads: tt.healthy, Events: fakeCredit{}})
			s.set(rs)
			if got := strings.Join(s.TokenizerURLs("m"), ","); got != tt.want {
				t.Errorf("TokenizerURLs = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestSetRankShareHealth(t *testing.T) {
	s := NewSet(SetConfig{Loads: fakeLoads{"d": true}, Events: fakeCredit{}})
	s.set(replicas(t, discovery.ReplicaSpec{ID: "d", Address: "10.0.0.4:80", Model: "m", EventsEndpoint: "tcp://10.0.0.4:5557", DPRanks: 2}))
	if !s.Load("d#dp1").Healthy {
		t.Error("rank 1 is not healthy while its replica is: ranks share the engine's probe")
	}
}

func TestScrapeTarget(t *testing.T) {
	tests := []struct {
		metrics, want string
	}{
		{"http://10.0.0.1:8000/metrics", "http://10.0.0.1:8000"},
		{"http://10.0.0.1:9100/metrics/", "http://10.0.0.1:9100"},
		{"http://10.0.0.1:9100/custom", "http://10.0.0.1:8000"},
	}
	for _, tt := range tests {
		got := scrapeTarget(discovery.Replica{ID: "x", Address: "10.0.0.1:8000", MetricsURL: tt.metrics})
		if got.URL != tt.want || got.ID != "x" {
			t.Errorf("scrapeTarget(%s) = %+v, want %s", tt.metrics, got, tt.want)
		}
	}
}

// gapCredit is a Creditor that also reports view gaps (events.Manager).
type gapCredit struct {
	fakeCredit
	gaps map[index.ReplicaID]bool
}

func (g gapCredit) ViewGaps(id index.ReplicaID) bool { return g.gaps[id] }

// The Set passes the events side's view gaps through to the router, and
// reports none when the events side does not tell them.
func TestSetViewGaps(t *testing.T) {
	s := NewSet(SetConfig{Loads: &load.View{}, Events: gapCredit{fakeCredit{"a": 1, "b": 1}, map[index.ReplicaID]bool{"a": true}}})
	if !s.ViewGaps("a") || s.ViewGaps("b") {
		t.Fatalf("gaps a %v b %v, want a only", s.ViewGaps("a"), s.ViewGaps("b"))
	}
	if NewSet(SetConfig{Loads: &load.View{}, Events: fakeCredit{"a": 1}}).ViewGaps("a") {
		t.Fatal("gaps from an events side that reports none")
	}
}
