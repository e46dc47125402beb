package testbed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Workspace is what a harness that starts its own stacks (kvbench live,
// kvbench overhead) sets up before its first process: the binaries, the
// Envoy template and a Group logging into a new temporary directory.
type Workspace struct {
	Bin   Binaries
	Envoy []byte // root's envoy/envoy.yaml
	Dir   string // the temporary directory, removed by Close
	Group *Group
}

// NewWorkspace finds the binaries in binDir (FindBinaries) and reads
// root's envoy/envoy.yaml, then makes a temporary directory named after
// prefix with a Group in it. Nothing is left behind on error.
func NewWorkspace(binDir, root, prefix string) (*Workspace, error) {
	bin, err := FindBinaries(binDir)
	if err != nil {
		return nil, fmt.Errorf("binaries (make build): %w", err)
	}
	tmpl, err := os.ReadFile(filepath.Join(root, "envoy", "envoy.yaml"))
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return nil, err
	}
	g, err := NewGroup(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return &Workspace{Bin: bin, Envoy: tmpl, Dir: dir, Group: g}, nil
}

// Close stops every process of the group, then removes the directory.
func (w *Workspace) Close() error {
	return errors.Join(w.Group.Stop(), os.RemoveAll(w.Dir))
}
