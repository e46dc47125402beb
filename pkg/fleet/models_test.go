package fleet

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/discovery"
)

func TestParseAdapters(t *testing.T) {
	// vLLM's answer: the base model has parent null, adapters name it.
	doc := `{"object":"list","data":[
		{"id":"llama","object":"model","root":"/models/llama","parent":null},
		{"id":"sql-lora","object":"model","root":"/loras/sql","parent":"llama"},
		{"id":"chat-lora","object":"model","root":"/loras/chat","parent":"llama"},
		{"id":"sql-lora","object":"model","parent":"llama"},
		{"id":"odd","object":"model","parent":""}]}`
	got, err := parseAdapters(strings.NewReader(doc))
	if err != nil || !slices.Equal(got, []string{"chat-lora", "sql-lora"}) {
		t.Fatalf("parseAdapters = %v, %v", got, err)
	}
	if got, err := parseAdapters(strings.NewReader(`{"data":[{"id":"m"}]}`)); err != nil || got != nil {
		t.Fatalf("no adapters: %v, %v", got, err)
	}
	if _, err := parseAdapters(strings.NewReader(`<html>`)); err == nil {
		t.Fatal("bad JSON: no error")
	}
}

// engineModels is a fake engine's /v1/models.
type engineModels struct {
	mu       sync.Mutex
	adapters []string
	fail     bool
}

func (e *engineModels) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fail {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	var b strings.Builder
	b.WriteString(`{"object":"list","data":[{"id":"m","parent":null}`)
	for _, a := range e.adapters {
		b.WriteString(`,{"id":"` + a + `","parent":"m"}`)
	}
	b.WriteString(`]}`)
	_, _ = w.Write([]byte(b.String()))
}

func (e *engineModels) set(fail bool, adapters ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fail, e.adapters = fail, adapters
}

// TestSetLearnsAdaptersFromModels runs a Controller with a Models prober
// against a fake engine: the routable replica carries the spec's adapters
// plus the engine's, follows the engine's changes, and keeps the last list
// while the engine fails.
func TestSetLearnsAdaptersFromModels(t *testing.T) {
	eng := &engineModels{adapters: []string{"sql-lora"}}
	srv := httptest.NewServer(eng)
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	models, err := NewModels(ModelsConfig{Interval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, 0)
	r.set.cfg.Models = models
	r.ctl.cfg.Tick = 5 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	updates := make(chan discovery.Snapshot, 1)
	wg.Go(func() { _ = models.Run(ctx) })
	wg.Go(func() { _ = r.ctl.Run(ctx, updates) })
	updates <- discovery.Snapshot{Source: "test", Replicas: replicas(t,
		discovery.ReplicaSpec{Address: addr, Model: "m", LoRAAdapters: []string{"static-lora"}})}

	waitAdapters := func(want ...string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		var got []string
		for time.Now().Before(deadline) {
			if reps := r.set.Replicas(); len(reps) == 1 {
				if got = reps[0].Adapters; slices.Equal(got, want) {
					return
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("adapters %v, want %v", got, want)
	}
	waitAdapters("sql-lora", "static-lora")
	eng.set(false, "chat-lora")
	waitAdapters("chat-lora", "static-lora")
	v := models.Version()
	eng.set(true)
	time.Sleep(50 * time.Millisecond) // several failed rounds
	if models.Version() != v {
		t.Error("a failing engine changed the learned adapters")
	}
	waitAdapters("chat-lora", "static-lora")
	eng.set(false)
	waitAdapters("static-lora")

	// A replica leaving the set is forgotten.
	updates <- discovery.Snapshot{Source: "test"}
	deadline := time.Now().Add(5 * time.Second)
	for models.Adapters(addr) != nil || len(r.set.Replicas()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("removed replica still known")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
