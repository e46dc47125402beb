package testbed

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWorkspaceMissingBinaries(t *testing.T) {
	_, err := NewWorkspace(t.TempDir(), filepath.Join("..", ".."), "testbed-ws")
	if err == nil || !strings.Contains(err.Error(), "make build") {
		t.Fatalf("NewWorkspace without binaries: %v, want an error naming make build", err)
	}
}

func TestWorkspaceCloseStopsAndRemoves(t *testing.T) {
	bin := t.TempDir()
	for _, name := range []string{"kvroute", "enginesim"} {
		if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("ENVOY", "/opt/envoy-for-test")
	ws, err := NewWorkspace(bin, filepath.Join("..", ".."), "testbed-ws")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("..", "..", "envoy", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ws.Envoy, want) || ws.Bin.Envoy != "/opt/envoy-for-test" || ws.Bin.KVRoute != filepath.Join(bin, "kvroute") {
		t.Errorf("workspace %+v: template %d bytes, want envoy/envoy.yaml's %d", ws.Bin, len(ws.Envoy), len(want))
	}
	if ws.Group.Dir() != ws.Dir || !strings.HasPrefix(filepath.Base(ws.Dir), "testbed-ws") {
		t.Errorf("group logs into %s, directory %s", ws.Group.Dir(), ws.Dir)
	}
	p, err := ws.Group.Start("sleeper", nil, "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Close(); err != nil {
		t.Logf("close: %v", err) // a child stopped by SIGTERM reports it
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not stop the group's process")
	}
	if _, err := os.Stat(ws.Dir); !os.IsNotExist(err) {
		t.Errorf("workspace directory after Close: %v, want gone", err)
	}
}
