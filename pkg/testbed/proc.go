package testbed

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
const StopGrace = 15 * time.Second

// ports handed out by FreePort in this process.
var (
	portMu sync.Mutex
	given  = map[int]bool{}
)

// FreePort returns a loopback TCP port that was free when asked and that
// FreePort has not returned before in this process.
func FreePort() (int, error) {
	portMu.Lock()
	defer portMu.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		if !given[p] {
			given[p] = true
			return p, nil
		}
	}
	return 0, errors.New("free port: every port offered was already handed out")
}

// FreePorts returns n ports from FreePort.
func FreePorts(n int) ([]int, error) {
	ps := make([]int, n)
	for i := range ps {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ps[i] = p
	}
	return ps, nil
}

// Group owns child processes: it starts them, and Stop stops and joins
// them all. Its methods are safe for concurrent use.
type Group struct {
	dir string

	mu       sync.Mutex
	procs    []*Proc
	cleanups []func()
}

// NewGroup returns a group whose children log into dir (created if
// missing).
func NewGroup(dir string) (*Group, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("log directory: %w", err)
	}
	return &Group{dir: dir}, nil
}

// Dir is the directory holding the children's logs.
func (g *Group) Dir() string { return g.dir }

// OnStop registers f to run at the end of Stop, after every child has
// exited (last registered runs first).
func (g *Group) OnStop(f func()) {
	g.mu.Lock()
	g.cleanups = append(g.cleanups, f)
	g.mu.Unlock()
}

// Start starts bin with args as a child named name (its log is
// <dir>/<name>.log); env is added to this process's environment.
func (g *Group) Start(name string, env []string, bin string, args ...string) (*Proc, error) {
	logPath := filepath.Join(g.dir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	// Own process group (signalled as a group); SIGKILLed by the kernel
	// if the thread that started it dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
	return p, nil
}

// Stop stops every child still running in reverse start order (SIGTERM,
// SIGKILL after StopGrace), waits for all, then runs the OnStop functions.
// It returns the children that needed SIGKILL, as an error.
func (g *Group) Stop() error {
	g.mu.Lock()
	procs := g.procs
	cleanups := g.cleanups
	g.procs, g.cleanups = nil, nil
	g.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		errs = append(errs, procs[i].Stop(StopGrace))
	}
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	return errors.Join(errs...)
}

// Kill SIGKILLs every child still running, waits for all, then runs the
// OnStop functions.
func (g *Group) Kill() {
	g.mu.Lock()
	procs := g.procs
	cleanups := g.cleanups
	g.procs, g.cleanups = nil, nil
	g.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Kill()
	}
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
}

// Procs returns the children started so far (running or not), in start
// order.
func (g *Group) Procs() []*Proc {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Proc(nil), g.procs...)
}

// Proc is one child process.
type Proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
}

// Name is the name given to Start.
func (p *Proc) Name() string { return p.name }

// LogPath is the file holding the child's stdout and stderr.
func (p *Proc) LogPath() string { return p.log }

// Pid is the child's process id (also its process group id).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the child has exited and its log is closed.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Running reports whether the child has not exited yet.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Err is the child's exit error (nil for a zero exit status); it is
// valid once Done is closed, and nil before.
func (p *Proc) Err() error {
	select {
	case <-p.done:
		return p.err
	default:
		return nil
	}
}

// Stop sends SIGTERM to the child's process group and waits for it to
// exit; after grace it sends SIGKILL, waits, and returns an error saying
// so. A child that has already exited is left as it is.
func (p *Proc) Stop(grace time.Duration) error {
	if !p.Running() {
		return nil
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		p.Kill()
		return fmt.Errorf("%s did not stop within %v of SIGTERM; killed", p.name, grace)
	}
}

// Kill SIGKILLs the child's process group and waits for the child.
func (p *Proc) Kill() {
	if p.Running() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
}

// Tail returns at most the last max bytes of the child's log.
func (p *Proc) Tail(max int) string {
	b, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(%s: %v)", p.log, err)
	}
	if len(b) > max {
		b = append([]byte("...\n"), b[len(b)-max:]...)
	}
	return string(b)
}

// Lines returns the lines of the child's log that contain substr.
func (p *Proc) Lines(substr string) []string {
	f, err := os.Open(p.log)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), substr) {
			out = append(out, sc.Text())
		}
	}
	return out
}
