package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	kvroutev1 "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// runDecisions is `kvroute decisions`: it lists the routing decisions a
// running kvroute made most recently (its routing.decision_history).
func runDecisions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("kvroute decisions", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var af adminFlags
	af.register(fs)
	limit := fs.Int("limit", 10, "the newest this many decisions (0: every one kept)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 || *limit < 0 {
		fs.Usage()
		return errors.New("decisions: takes no arguments, and -limit must not be negative")
	}
	var resp *kvroutev1.DecisionsResponse
	err := callAdmin(ctx, af, func(ctx context.Context, c kvroutev1.AdminClient) (err error) {
		resp, err = c.Decisions(ctx, &kvroutev1.DecisionsRequest{Limit: int64(*limit)})
		return err
	})
	if err != nil {
		return fmt.Errorf("decisions: %w", err)
	}
	if af.json {
		return printJSON(stdout, resp)
	}
	return printDecisions(stdout, resp)
}

// printDecisions writes each decision as explain prints one, under a line
// with its time, session key (marked when the router took it from the
// conversation the prompt continues) and the queue the router saw ahead
// of it.
func printDecisions(w io.Writer, r *kvroutev1.DecisionsResponse) error {
	fmt.Fprintf(w, "%d of %d decisions since start\n", len(r.GetDecisions()), r.GetTotal())
	for _, d := range r.GetDecisions() {
		dec := d.GetDecision()
		session := dec.GetSession()
		switch {
		case session == "":
			session = "(none)"
		case dec.GetSessionFromPrompt():
			session += " (from its prompt)"
		}
		fmt.Fprintf(w, "\n=== %s  session %s  queued ahead %d tokens\n",
			time.Unix(0, d.GetUnixNanos()).UTC().Format("15:04:05.000"), session, dec.GetQueuedTokens())
		if err := printExplain(w, dec); err != nil {
			return err
		}
	}
	return nil
}
