//go:build e2e

package overhead

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// TestBodySizeLimits runs the real stack (Envoy with envoy/envoy.yaml,
// kvroute, enginesim): bodies between gRPC's old 4 MiB default and the
// 16 MiB limit are routed by kvroute (a decision is counted, nothing fails
// open), and a body over the limit is answered 413, never sent upstream
// round robin.
//
//	go test -tags e2e -run TestBodySizeLimits ./pkg/overhead/
func TestBodySizeLimits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	if err := testbed.Build(ctx, root, bin, "kvroute", "enginesim"); err != nil {
		t.Fatal(err)
	}
	bins, err := testbed.FindBinaries(bin)
	if err != nil {
		t.Fatalf("binaries or Envoy missing (make deps): %v", err)
	}
	tmpl, err := os.ReadFile(filepath.Join(root, "envoy", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := testbed.NewGroup(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := g.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	st, err := testbed.StartStack(ctx, g, testbed.StackOptions{
		Bin: bins, Envoy: tmpl, Engines: 2, Model: model,
		EngineArgs: func(int) []string {
			return []string{"--speed", "100", "--prefill-tokens-per-s", "1e10", "--max-model-len", "40000000",
				"--max-num-batched-tokens", "40000000", "--num-gpu-blocks", "3000000", "--kv-events-disable", "--log-level", "warn"}
		},
		// Approximate tokens keep a 15 MiB prompt's decision fast; the
		// limits are what is tested here.
		KVRouteExtra: "tokenizer: {default: {kind: approximate}}\n",
		KVRouteArgs:  []string{"--warm-timeout", "1s"},
	})
	if err != nil {
		t.Fatal(err)
	}
	post := func(size int) (int, http.Header, string) {
		head := fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"user","content":"`, model)
		tail := `"}]}`
		body := head + strings.Repeat("abcdefgh ", (size-len(head)-len(tail))/9+1)[:size-len(head)-len(tail)] + tail
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, st.Envoy.URL()+"/v1/chat/completions", bytes.NewReader([]byte(body)))
		req.Header.Set("content-type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("POST %d bytes: %v", size, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	for _, size := range []int{5 << 20, 15 << 20} {
		before, err := decisions(ctx, st.KV)
		if err != nil {
			t.Fatal(err)
		}
		code, _, body := post(size)
		if code != http.StatusOK {
			t.Fatalf("%d-byte body: status %d: %.300s\nkvroute log:\n%s", size, code, body, st.KV.Proc.Tail(2000))
		}
		after, _ := decisions(ctx, st.KV)
		if after != before+1 {
			t.Errorf("%d-byte body answered but kvroute made %v decisions for it, want 1 (failed open?)\nkvroute log:\n%s", size, after-before, st.KV.Proc.Tail(2000))
		}
	}
	before, _ := decisions(ctx, st.KV)
	code, hdr, body := post(16<<20 + 1)
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("body over the limit: status %d (%.200s), want 413", code, body)
	}
	t.Logf("over the limit: 413 (x-kvroute-reason %q): %.120s", hdr.Get("x-kvroute-reason"), body)
	if after, _ := decisions(ctx, st.KV); after != before {
		t.Errorf("a body over the limit was routed (%v decisions)", after-before)
	}
	if lines := st.KV.Proc.Lines("larger than max"); len(lines) > 0 {
		t.Errorf("gRPC refused a message: %v", lines)
	}
}
