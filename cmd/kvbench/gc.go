package main

import (
	"os"
	"runtime/debug"
)

// The garbage collector's settings when GOGC and GOMEMLIMIT are not set. A
// simulation allocates fast and keeps a live heap of a few hundred MB (its
// engines' cache metadata and the router's index): collecting at 4x the
// live heap instead of 2x cut the collector's share of CPU from about 10 %
// to about 2 % on the trace, and the soft limit makes it collect harder
// before parallel simulations take more than 3 GiB of the shared
// machine.
const (
	simGCPercent   = 300
	simMemoryLimit = 3 << 30
)

func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(simGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(simMemoryLimit)
	}
}
