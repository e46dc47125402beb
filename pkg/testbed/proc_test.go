package testbed

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newGroup(t *testing.T) *Group {
	t.Helper()
	g, err := NewGroup(filepath.Join(t.TempDir(), "logs"))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestFreePortNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}

func TestGroupStopsInReverseOrderAndLogs(t *testing.T) {
	g := newGroup(t)
	order := filepath.Join(t.TempDir(), "order")
	// Each child appends its name to order on SIGTERM, then exits.
	for _, n := range []string{"first", "second", "third"} {
		script := "trap 'echo " + n + " >> " + order + "; exit 0' TERM; echo hello from " + n + "; while :; do sleep 0.05; done"
		if _, err := g.Start(n, []string{"X=1"}, "/bin/sh", "-c", script); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range g.Procs() {
		if err := WaitFor(t.Context(), 5*time.Second, p.Name()+" log", func() bool { return len(p.Lines("hello from")) == 1 }); err != nil {
			t.Fatal(err)
		}
	}
	cleaned := false
	g.OnStop(func() { cleaned = true })
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	if !cleaned {
		t.Error("OnStop function not run")
	}
	b, err := os.ReadFile(order)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(b)); strings.Join(got, " ") != "third second first" {
		t.Errorf("stop order %v, want third second first", got)
	}
	for _, p := range g.Procs() {
		t.Errorf("%s still listed after Stop", p.Name())
	}
}

func TestProcStopEscalatesToKill(t *testing.T) {
	g := newGroup(t)
	p, err := g.Start("stubborn", nil, "/bin/sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.05; done")
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitFor(t.Context(), 5*time.Second, "up", func() bool { return len(p.Lines("up")) == 1 }); err != nil {
		t.Fatal(err)
	}
	err = p.Stop(200 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Stop of a child ignoring SIGTERM: %v", err)
	}
	if p.Running() || p.Err() == nil {
		t.Errorf("after kill: running=%v err=%v", p.Running(), p.Err())
	}
	g.Kill()
}

func TestProcExitStatusAndTail(t *testing.T) {
	g := newGroup(t)
	defer g.Kill()
	p, err := g.Start("fails", nil, "/bin/sh", "-c", "echo something went wrong; exit 3")
	if err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	if p.Err() == nil || !strings.Contains(p.Err().Error(), "exit status 3") {
		t.Errorf("exit error %v", p.Err())
	}
	if !strings.Contains(p.Tail(100), "something went wrong") {
		t.Errorf("tail %q", p.Tail(100))
	}
	if _, err := g.Start("missing", nil, filepath.Join(t.TempDir(), "no-such-binary")); err == nil {
		t.Error("starting a missing binary succeeded")
	}
}

func TestWaitReadyReportsExitedChild(t *testing.T) {
	g := newGroup(t)
	defer g.Kill()
	p, err := g.Start("crasher", nil, "/bin/sh", "-c", "echo bad config; exit 1")
	if err != nil {
		t.Fatal(err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	err = waitReady(t.Context(), p, 10*time.Second, "crasher ready", "http://127.0.0.1:"+strconv.Itoa(port)+"/")
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "bad config") {
		t.Errorf("waitReady on an exited child: %v", err)
	}
}

func TestWaitForTimeoutAndCancel(t *testing.T) {
	err := WaitFor(t.Context(), 100*time.Millisecond, "never", func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "timed out") || !strings.Contains(err.Error(), "never") {
		t.Errorf("timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = WaitFor(ctx, time.Minute, "cancelled", func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "canceled") {
		t.Errorf("cancel: %v", err)
	}
	n := 0
	if err := WaitFor(t.Context(), time.Second, "third try", func() bool { n++; return n == 3 }); err != nil || n != 3 {
		t.Errorf("n=%d err=%v", n, err)
	}
}
