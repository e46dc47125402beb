package tokenize

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/route"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

// writeFiles creates dir with (empty) tokenizer files; only names matter
// to the finder.
func writeFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFindTokenizerFiles(t *testing.T) {
	root := t.TempDir()
	hub := filepath.Join(root, "hub")
	t.Setenv("HF_HUB_CACHE", hub)
	search := filepath.Join(root, "models")
	both := tokenizerFileNames[:]
	writeFiles(t, filepath.Join(search, "Org", "Full"), both...)
	writeFiles(t, filepath.Join(search, "Base"), both...)
	writeFiles(t, filepath.Join(search, "Half"), "tokenizer.json")
	// Hub cache: refs/main names a revision; snapshot files are symlinks
	// into blobs, as huggingface_hub writes them.
	repo := filepath.Join(hub, "models--Org--Hub")
	writeFiles(t, filepath.Join(repo, "blobs"), "a1", "b2")
	for _, rev := range []string{"rev1", "rev2"} {
		snap := filepath.Join(repo, "snapshots", rev)
		if err := os.MkdirAll(snap, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, f := range tokenizerFileNames {
			if err := os.Symlink(filepath.Join("..", "..", "blobs", []string{"a1", "b2"}[i]), filepath.Join(snap, f)); err != nil {
				t.Fatal(err)
			}
		}
	}
	writeFiles(t, filepath.Join(repo, "refs"))
	if err := os.WriteFile(filepath.Join(repo, "refs", "main"), []byte("rev1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// No refs/main: the newest snapshot.
	repo2 := filepath.Join(hub, "models--Org--NoRef")
	writeFiles(t, filepath.Join(repo2, "snapshots", "old"), both...)
	writeFiles(t, filepath.Join(repo2, "snapshots", "new"), both...)
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(repo2, "snapshots", "old"), old, old); err != nil {
		t.Fatal(err)
	}

	dirs := []string{filepath.Join(root, "missing"), search}
	for _, c := range []struct{ model, want string }{
		{"Org/Full", filepath.Join(search, "Org", "Full")},
		{"Other/Base", filepath.Join(search, "Base")},
		{"Base", filepath.Join(search, "Base")},
		{"Half", ""}, // tokenizer_config.json missing
		{"Org/Hub", filepath.Join(repo, "snapshots", "rev1")},
		{"Org/NoRef", filepath.Join(repo2, "snapshots", "new")},
		{"Org/Nothing", ""},
		{"../models/Base", ""},
		{"/etc", ""},
		{"Org//Full", ""},
		{"Org/./Full", ""},
		{"", ""},
	} {
		if got := FindTokenizerFiles(c.model, dirs); got != c.want {
			t.Errorf("FindTokenizerFiles(%q) = %q, want %q", c.model, got, c.want)
		}
	}
	t.Setenv("HF_HUB_CACHE", "")
	t.Setenv("HF_HOME", root)
	if got := FindTokenizerFiles("Org/Hub", nil); got != filepath.Join(repo, "snapshots", "rev1") {
		t.Errorf("via HF_HOME: %q", got)
	}
}

// TestAutoKind: the default kind auto serves a model whose files it finds
// with the local tokenizer (remote until they are loaded), a model without
// files with the remote one, and one whose files do not load stays remote;
// Explain says which and why.
func TestAutoKind(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	qwenJSON, qwenCfg := tokenizerFiles(t, "qwen3")
	root := t.TempDir()
	t.Setenv("HF_HUB_CACHE", filepath.Join(root, "hub"))
	dir := filepath.Join(root, "Qwen", "Qwen3-8B")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for src, name := range map[string]string{qwenJSON: "tokenizer.json", qwenCfg: "tokenizer_config.json"} {
		if err := os.Symlink(src, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	writeFiles(t, filepath.Join(root, "Broken"), tokenizerFileNames[:]...)
	fake := &fakeVLLM{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	for _, checked := range []bool{false, true} {
		sc := SelfCheckConfig{Disabled: true}
		if checked {
			sc = SelfCheckConfig{SampleRate: 1e-9}
		}
		tok, err := New(Config{Default: &ModelConfig{Kind: KindAuto}, SearchDirs: []string{root}, SelfCheck: sc},
			Options{Replicas: func(string) []string { return []string{srv.URL} }})
		if err != nil {
			t.Fatal(err)
		}
		in := route.TokenizeInput{Prompt: "Hello world"}
		for _, model := range []string{"Qwen/Qwen3-8B", "Org/Broken", "Org/None"} {
			if _, err := tok.Tokenize(context.Background(), model, in); err != nil {
				t.Fatal(err)
			}
		}
		tok.loads.Wait()
		want, err := loadEncoder(t, "qwen3").Encode("Hello world", false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tok.Tokenize(context.Background(), "Qwen/Qwen3-8B", in)
		if err != nil || got.Source != SourceLocal || !got.Exact || !slices.Equal(got.IDs, want) {
			t.Fatalf("found files: %+v, %v; want local %v", got, err, want)
		}
		for _, model := range []string{"Org/Broken", "Org/None"} {
			got, err := tok.Tokenize(context.Background(), model, in)
			if err != nil || got.Source != SourceRemote {
				t.Fatalf("%s: %+v, %v; want remote", model, got, err)
			}
		}
		for model, want := range map[string]string{
			"Qwen/Qwen3-8B": "local tokenizer (kind auto: files found in " + dir,
			"Org/Broken":    "did not load",
			"Org/None":      "no tokenizer files found",
		} {
			if ex := tok.Explain(model); !strings.Contains(ex, want) {
				t.Errorf("explain %s: %q, want %q in it", model, ex, want)
			}
		}
		debug := tok.Debug()
		tok.Close()
		if len(debug) != 3 || debug[2].Model != "Qwen/Qwen3-8B" {
			t.Fatalf("debug lists %+v, want the three models seen", debug)
		}
		if got := debug[2].SelfCheck != nil; got != checked {
			t.Errorf("self-check of the found tokenizer reported %v, want %v", got, checked)
		}
	}
}

// TestChunkCacheMetrics: a conversation's second turn is served from the
// chunk cache, and the per-model hit, miss and byte figures say so.
func TestChunkCacheMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	tok, err := New(Config{Models: map[string]ModelConfig{"q": localConfig(t, "qwen3")}}, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	var history strings.Builder
	for i := 0; history.Len() < 20_000; i++ {
		fmt.Fprintf(&history, "Line %d of a long shared history.\n", i)
	}
	for turn, msgs := range []string{
		fmt.Sprintf(`[{"role":"user","content":%q}]`, history.String()),
		fmt.Sprintf(`[{"role":"user","content":%q},{"role":"assistant","content":"ok"},{"role":"user","content":"next"}]`, history.String()),
	} {
		// Template arguments that differ by turn keep the conversation
		// memo from finding the first turn: the chunk cache serves.
		kw := json.RawMessage(fmt.Sprintf(`{"turn": %d}`, turn))
		if _, err := tok.Tokenize(context.Background(), "q", route.TokenizeInput{Chat: true, Messages: json.RawMessage(msgs), ChatTemplateKwargs: kw, AddGenerationPrompt: true}); err != nil {
			t.Fatalf("turn %d: %v", turn, err)
		}
	}
	hits := counterValue(t, reg, "kvroute_tokenizer_chunk_cache_hits_total", "q")
	misses := counterValue(t, reg, "kvroute_tokenizer_chunk_cache_misses_total", "q")
	bytes := gaugeValue(t, reg, "kvroute_tokenizer_chunk_cache_bytes", "q")
	t.Logf("%v hits, %v misses, %v bytes", hits, misses, bytes)
	if hits < 5 || misses < 5 || hits < misses-2 || bytes <= 0 {
		t.Fatalf("chunk cache: %v hits, %v misses, %v bytes; want the second turn's history from the cache", hits, misses, bytes)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name, model string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "model" && l.GetValue() == model {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return -1
}
