package admin

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestPprofOnAdminHandler(t *testing.T) {
	srv := httptest.NewServer(newServer(t, &fakeExplainer{d: decision()}).Handler())
	defer srv.Close()
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/heap?debug=1", "/debug/pprof/cmdline"} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || len(b) == 0 {
			t.Errorf("GET %s: %d, %d bytes", path, resp.StatusCode, len(b))
		}
	}
}

func TestErrorMessageTruncated(t *testing.T) {
	srv := httptest.NewServer(newServer(t, &fakeExplainer{err: errors.New("the model \"" + strings.Repeat("x", 1<<20) + "\" does not exist")}).Handler())
	defer srv.Close()
	resp, err := srv.Client().Post(srv.URL+"/debug/explain", "application/json", strings.NewReader(`{"model":"m","prompt":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK || len(b) > 1024 || !strings.Contains(string(b), "bytes)") {
		t.Fatalf("status %d, body of %d bytes: %.200s", resp.StatusCode, len(b), b)
	}
}
