package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"testing"
)

func TestZZDebug(t *testing.T) {
	name := os.Getenv("DBG_WL")
	if name == "" {
		t.Skip()
	}
	w, _ := Generate(name, GenOptions{Seed: 1})
	r, err := Simulate(context.Background(), w, mustPolicy(t, os.Getenv("DBG_POL")), FleetConfig{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	rs := r.Requests
	sort.Slice(rs, func(i, j int) bool { return rs[i].TTFT > rs[j].TTFT })
	for _, q := range rs[:30] {
		fmt.Printf("s%d t%d rep%d arr %.2f ttft %.3f prompt %d cached %d pred %d %s\n", q.Session, q.Turn, q.Replica, q.Arrival.Seconds(), q.TTFT.Seconds(), q.PromptTokens, q.CachedTokens, q.PredictedTokens, q.Reason)
	}
}
