package extproc

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/route"
)

// TestUnknownModelEchoTruncated: a 1 MiB model name is quoted back cut to
// maxEchoBytes with its length, not whole.
func TestUnknownModelEchoTruncated(t *testing.T) {
	h := newHarness(t, Config{Decider: &fakeDecider{err: route.ErrUnknownModel}})
	model := strings.Repeat("é", 1<<19) // 1 MiB of two-byte runes
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": "x"})
	got := h.exchange(reqHeaders(false, ":path", "/v1/completions"), reqBody(string(body), true))
	if len(got) != 1 || got[0].GetImmediateResponse() == nil {
		t.Fatalf("want one immediate response, got %v", len(got))
	}
	b := got[0].GetImmediateResponse().GetBody()
	var e errorJSON
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("body %q: %v", b[:min(len(b), 200)], err)
	}
	if len(b) > 512 || !strings.Contains(e.Error.Message, "(1048576 bytes)") || !strings.Contains(e.Error.Message, strings.Repeat("é", 10)) {
		t.Fatalf("error body of %d bytes: %q", len(b), e.Error.Message)
	}
	if q := quoteTruncated("short"); q != `"short"` {
		t.Errorf("short value quoted as %s", q)
	}
}
