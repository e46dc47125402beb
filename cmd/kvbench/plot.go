package main

import "github.com/kvroute/kvroute/pkg/bench"

func plotRuns(dir, workload string, runs []*bench.Run) error { return nil }
