package main

import (
	"os"
	"runtime/debug"
)

// simGCPercent is the garbage collector's target when GOGC is not set: a
// simulation allocates fast and keeps a modest live heap (its engines'
// caches and the router's index), so collecting at 4x the live heap
// instead of 2x halves the collector's share of CPU for a few hundred MB.
const simGCPercent = 300

func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(simGCPercent)
	}
}
