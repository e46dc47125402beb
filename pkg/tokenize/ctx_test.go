package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/route"
)

// endingCtx is alive for its first n Err calls, then past its deadline.
// Goroutines encoding parts of one text share it.
type endingCtx struct {
	context.Context
	n     int64
	calls atomic.Int64
}

func (c *endingCtx) Err() error {
	if c.calls.Add(1) > c.n {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *endingCtx) Done() <-chan struct{} { return make(chan struct{}) }

// TestLocalStopsWhenContextEnds: a context that ends while a long prompt
// is being encoded stops the encoding at the next chunk with the context's
// error; one that stays alive gets the same ids as plain encoding, with or
// without the chunk cache.
func TestLocalStopsWhenContextEnds(t *testing.T) {
	enc := loadEncoder(t, "qwen3")
	var sb strings.Builder
	for _, f := range loadFixtures(t, "qwen3").Plain {
		sb.WriteString(f.Text)
		sb.WriteString("\nNext: ")
	}
	text := sb.String()
	want, err := enc.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	// One goroutine stops at the first failing check; several (the text
	// is long enough to be split) each stop at their next one.
	seq := *enc
	seq.maxWorkers = 1
	par := *enc
	par.maxWorkers = 3
	if par.workers(len(text)) != 3 {
		t.Fatalf("%d bytes: %d workers, want 3", len(text), par.workers(len(text)))
	}
	for _, e := range []*Encoder{&seq, &par} {
		for _, cacheBytes := range []int{0, 1 << 20} {
			l := NewLocal(e, loadTemplate(t, "qwen3"), 0, cacheBytes)
			in := route.TokenizeInput{Prompt: text}
			w := int64(e.workers(len(text)))

			ctx := &endingCtx{Context: context.Background(), n: 3}
			if _, err := l.TokenizeContext(ctx, in); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("workers %d, cache %d: err = %v, want deadline exceeded", w, cacheBytes, err)
			}
			if calls := ctx.calls.Load(); calls < ctx.n+1 || calls > ctx.n+w {
				t.Errorf("workers %d, cache %d: ctx checked %d times, want each goroutine to stop at its first failing check (%d to %d)", w, cacheBytes, calls, ctx.n+1, ctx.n+w)
			}

			alive := &endingCtx{Context: context.Background(), n: 1 << 30}
			got, err := l.TokenizeContext(alive, in)
			if err != nil || !slices.Equal(got.IDs, want) {
				t.Fatalf("workers %d, cache %d: alive context: err %v, ids equal %v", w, cacheBytes, err, slices.Equal(got.IDs, want))
			}
			if calls := alive.calls.Load(); calls < 10 {
				t.Errorf("workers %d, cache %d: ctx checked %d times over %d bytes, want at least one check per chunk", w, cacheBytes, calls, len(text))
			}

			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			chat := route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`)}
			if _, err := l.TokenizeContext(cancelled, chat); !errors.Is(err, context.Canceled) {
				t.Errorf("cache %d: cancelled chat: err = %v, want canceled", cacheBytes, err)
			}
		}
	}
}

// TestTokenizerNoFallbackForDeadRequest: a request whose deadline passed
// gets the context's error, not approximate tokens (the router then routes
// it on load), and no fallback is counted.
func TestTokenizerNoFallbackForDeadRequest(t *testing.T) {
	reg := prometheus.NewRegistry()
	tok, err := New(Config{Models: map[string]ModelConfig{"qwen": localConfig(t, "qwen3")}}, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	got, err := tok.Tokenize(ctx, "qwen", route.TokenizeInput{Prompt: strings.Repeat("hello world\n", 1000)})
	if !errors.Is(err, context.DeadlineExceeded) || len(got.IDs) != 0 {
		t.Fatalf("got %d ids, err %v; want deadline exceeded", len(got.IDs), err)
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_requests_total", "local", "timeout"); n != 1 {
		t.Errorf("requests{local,timeout} = %v, want 1", n)
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_fallbacks_total", "qwen", "local", "timeout"); n != 0 {
		t.Errorf("fallbacks{timeout} = %v, want 0", n)
	}
	// The same request alive is tokenized locally.
	if got, err := tok.Tokenize(context.Background(), "qwen", route.TokenizeInput{Prompt: "hello world"}); err != nil || got.Source != SourceLocal {
		t.Fatalf("alive: %v %v", got, err)
	}
}
