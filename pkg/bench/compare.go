package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvroute/kvroute/pkg/policy"
)

// ComparedPolicies is the default line-up of a comparison, in table order.
func ComparedPolicies() []string {
	return []string{
		policy.NameRoundRobin, policy.NameRandom, policy.NameLeastLoad, policy.NameSession,
		policy.NamePureAffinity, policy.NameHardSwitch, policy.NamePrefixAffinity,
		policy.NameWeighted, policy.NameBlended, policy.NameKVRoute,
	}
}

// Compare simulates w once per named policy (each built fresh from cfg)
// and returns the runs in order. progress, when not nil, is called after
// each run.
func Compare(ctx context.Context, w *Workload, names []string, cfg policy.Config, fleet FleetConfig, progress func(*Run)) ([]*Run, error) {
	runs := make([]*Run, 0, len(names))
	for _, n := range names {
		p, err := policy.New(n, cfg)
		if err != nil {
			return nil, err
		}
		r, err := Simulate(ctx, w, p, fleet)
		if err != nil {
			return nil, fmt.Errorf("%s on %s: %w", n, w.Name, err)
		}
		if progress != nil {
			progress(r)
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// RepoRoot returns the nearest directory at or above dir holding a go.mod,
// or "" when there is none.
func RepoRoot(dir string) string {
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// DefaultTracePath is where the Mooncake synthetic trace lives relative to
// the repository root: shared/traces/synthetic_trace.jsonl in the nearest
// directory above root that has it (../shared for the main checkout,
// ../../shared for a worktree beside it); ../shared/... when none has it.
func DefaultTracePath(root string) string {
	rel := filepath.Join("shared", "traces", "synthetic_trace.jsonl")
	for dir := filepath.Dir(root); ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, rel)); err == nil {
			return filepath.Join(dir, rel)
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	return filepath.Join(root, "..", rel)
}
